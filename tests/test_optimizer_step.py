"""The optimizer step's bytes per parameter, counted by hand from the frameworks' code.

Megatron's mixed-precision optimizer (megatron/core/optimizer/optimizer.py, core_r0.8.0:
``MixedPrecisionOptimizer.step``) runs, over every local parameter: ``main_grad.float()``
(a copy of a 16-bit gradient buffer), unscale + inf check (fp16's grad scaler only), the
clip-grad norm, Adam (read fp32 master, gradient, m, v; write master, m, v) and the copy of the
master back to the 16-bit weights:

* fp16, 16-bit gradient buffer: (2 + 4) + 8 + 4 + 28 + (4 + 2) = 52 bytes;
* bf16 with its default fp32 gradient buffer: 0 + 0 + 4 + 28 + (4 + 2) = 38 bytes;
* the ZeRO paper's convention (``framework = "zero"``): Adam's 24 + gradient 2 + weight 2 = 28.

Then the step zeroes the gradient buffer (a write of every local gradient, in place).
"""
import pytest

from parsim.costs.dp import megatron_step_extra_bytes
from parsim.costs.model_costs import ModelCosts
from parsim.scenario import scenario_from_dict
from parsim.schedule.ir import Op


def _step(framework: str, precision: str, dp: int = 1):
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": 8 * dp,
           "model": {"preset": "megatron-1.7b"},
           "training": {"global_batch": 8 * dp, "microbatch_size": 1, "seq_len": 2048, "precision": precision},
           "parallel": {"dp": dp, "tp": 8, "pp": 1, "zero": 0, "framework": framework}}
    mc = ModelCosts.from_scenario(scenario_from_dict(doc, "t.toml"))
    params = mc.stage_costs[0].params
    return mc.op_cost(0, Op.STEP).duration_s, params, mc.inputs.hardware.device


@pytest.mark.parametrize("framework,precision,step_bytes,grad_bytes", [
    ("megatron", "fp16", 52, 2), ("megatron", "bf16", 38, 4), ("zero", "fp16", 28, 2), ("zero", "bf16", 28, 2)])
def test_step_bytes_per_parameter(framework, precision, step_bytes, grad_bytes):
    t, params, dev = _step(framework, precision)
    assert t == pytest.approx(dev.optimizer_time(params * step_bytes) + dev.update_time(params * grad_bytes), rel=1e-9)


def test_megatron_extra_passes():
    # beside the base count (Adam 24 + the gradient it reads at the buffer's width + the 16-bit
    # weight it writes): the copy (read 2, write 4) and Adam reading 4 bytes, not 2, of gradient;
    # unscale (read + write 4); the norm (read 4); the copy-back reading the master (4)
    assert megatron_step_extra_bytes("fp16", 2) == (2 + 4) + (4 - 2) + 8 + 4 + 4
    assert megatron_step_extra_bytes("bf16", 2) == (2 + 4) + (4 - 2) + 4 + 4  # --grad-reduce-in-bf16: no scaler
    assert megatron_step_extra_bytes("bf16", 4) == 4 + 4                      # fp32 buffer: the copy is a view


@pytest.mark.parametrize("framework,precision,grad_bytes", [("megatron", "fp16", 2), ("megatron", "bf16", 4),
                                                             ("zero", "bf16", 0)])
def test_megatron_scales_the_gradient_buffer_before_reducing(framework, precision, grad_bytes):
    """With data parallelism Megatron scales its whole gradient buffer by 1/dp in place before
    the collective sums it (core_r0.8.0 start_grad_sync: grad_data *= gradient_scaling_factor;
    v2.5: buffer_.data /= dp): a read and a write of every local gradient per step, at the
    buffer's width. Without ZeRO nothing else in the step depends on dp, so dp = 4 against dp = 1
    is exactly that pass; ZeRO's generic layout (the ZeRO paper's) has none."""
    one, params, dev = _step(framework, precision, dp=1)
    four, params4, _ = _step(framework, precision, dp=4)
    assert params4 == params
    assert four - one == pytest.approx(dev.update_time(2 * grad_bytes * params) if grad_bytes else 0.0,
                                       rel=1e-9, abs=1e-15)
