"""Host time of the torch runtime's eager block passes (``Device.eager_op_*``): the op count the
cost model uses is the runtime's own (counted, not assumed), the fit is seconds over ops, and the
cost model charges count x per-op time where a profile states it (launch gaps elsewhere)."""
from __future__ import annotations

import dataclasses
import itertools
import tomllib

import pandas as pd
import pytest

from parsim.calibrate.fit import fit_profile
from parsim.cluster.hardware import dumps_profile, load_profile, parse_profile
from parsim.costs.layer import eager_block_ops, launch_gaps
from parsim.model import ModelSpec

VARIANTS = list(itertools.product(("gelu", "swiglu"), ("layernorm", "rmsnorm"), ("bias", "qkv_bias", "none"),
                                  (False, True), (4, 2)))


def _spec(ffn, norm, bias, kv):
    return ModelSpec("t", 1, 16, 4, kv, 32, 16, ffn=ffn, norm=norm, bias=bias == "bias",
                     qkv_bias=bias == "qkv_bias", position="learned", max_seq_len=8)


@pytest.mark.parametrize("ffn,norm,bias,flash,kv", VARIANTS)
def test_op_count_is_the_runtime_block_s_own(ffn, norm, bias, flash, kv):
    """Oracle: every aten op the validation runtime's Block dispatches in one forward and one
    backward, counted by a TorchDispatchMode (views included; calibration's ``op_counter``), for
    each norm / FFN / bias / attention kernel / GQA combination."""
    torch = pytest.importorskip("torch")
    from parsim.validate.bench import op_counter
    from parsim.validate.model import Block
    spec = _spec(ffn, norm, bias, kv)
    blk = Block(spec, flash, torch.float32)
    x = torch.randn(1, 4, 16, requires_grad=True)
    mask = torch.full((4, 4), float("-inf")).triu(1)
    blk(x, mask).sum().backward()  # first-call work (lazy init) out of the count
    with op_counter() as f:
        y = blk(x, mask)
    with op_counter() as b:
        y.backward(torch.ones_like(y))
    assert eager_block_ops(spec, flash) == (f.n, b.n)


def _eager_rows(fwd_us: dict, bwd_us: dict) -> pd.DataFrame:
    rows = []
    for flavour, (sec, ops) in fwd_us.items():
        rows.append({"kind": "eager", "name": f"block_forward_{flavour}", "seconds": sec * 1e-6, "ops": ops})
    for flavour, (sec, ops) in bwd_us.items():
        rows.append({"kind": "eager", "name": f"block_backward_{flavour}", "seconds": sec * 1e-6, "ops": ops})
    return pd.DataFrame(rows)


def test_fit_takes_pass_time_over_ops_median_over_flavours_and_round_trips():
    """Hand-computed: forwards 212 us / 53 ops = 4.0 us and 188 us / 47 = 4.0 us -> 4.0 us;
    backwards 252 us / 84 = 3.0 us and 348 us / 87 = 4.0 us -> median 3.5 us. Each row is then
    predicted at its ops x the fitted per-op time."""
    base = load_profile("cpu-gloo")
    fit = fit_profile(base, _eager_rows({"gpt": (212.0, 53), "llama": (188.0, 47)},
                                        {"gpt": (252.0, 84), "llama": (348.0, 87)}), name="x")
    dev = fit.profile.device
    assert dev.eager_op_forward_s == pytest.approx(4.0e-6)
    assert dev.eager_op_backward_s == pytest.approx(3.5e-6)
    pred = fit.predictions.set_index("name")["predicted_s"]
    assert pred["block_backward_gpt"] == pytest.approx(84 * 3.5e-6)
    again = parse_profile(tomllib.loads(dumps_profile(fit.profile)))
    assert again.device.eager_op_forward_s == pytest.approx(4.0e-6)
    assert again.device.eager_op_backward_s == pytest.approx(3.5e-6)
    assert "eager_op_forward" not in dumps_profile(base)  # profiles without it stay without it


def test_cost_model_charges_the_runtime_s_ops_where_the_profile_states_them():
    """The tiny GPT (LayerNorm, GELU, biases, explicit attention: 53 / 84 ops) at 4 us / 3 us an
    op: 212 us forward, 252 us backward per block; without the keys, 15 launch gaps per pass at
    ``kernel_launch_s`` (x2 backward)."""
    from parsim.costs.inputs import Cluster, cost_inputs, layer_inputs
    from parsim.scenario import load_scenario
    sc = load_scenario("scenarios/tiny-cpu.toml")
    inp = layer_inputs(cost_inputs(sc))
    dev = inp.hardware.device
    assert dev.eager_op_forward_s is None
    assert launch_gaps(inp, 1) == pytest.approx(15 * dev.kernel_launch_s)
    assert launch_gaps(inp, 2) == pytest.approx(30 * dev.kernel_launch_s)
    hw = dataclasses.replace(inp.hardware, device=dataclasses.replace(dev, eager_op_forward_s=4e-6,
                                                                        eager_op_backward_s=3e-6))
    eager = dataclasses.replace(inp, cluster=Cluster(hw))
    assert eager_block_ops(inp.model, False) == (53, 84)
    assert launch_gaps(eager, 1) == pytest.approx(212e-6)
    assert launch_gaps(eager, 2) == pytest.approx(252e-6)
