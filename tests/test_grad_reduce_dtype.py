"""The dtype gradients are reduced in is a framework fact, and FP8 linear layers keep FP8 inputs.

Megatron-LM forces ``accumulate_allreduce_grads_in_fp32`` for bf16 ("bfloat16 requires gradient
accumulation and all-reduce to be done in fp32", megatron/training/arguments.py) unless
``--grad-reduce-in-bf16``: its data-parallel reduction moves 4 bytes per gradient and its
main-gradient buffer holds 4 (Megatron's distributed-optimizer docs: 6 + 12/d bytes per
parameter). torchtitan's FSDP2 reduces in float32 (``mixed_precision_reduce``). Before this, parsim
moved 2 bytes per gradient for every bf16 job, whatever the framework.

Transformer Engine under FP8 keeps the quantised inputs of its linear layers for the weight
gradient (``Linear``'s FP8 ``inputmat``, ``LayerNormLinear``'s FP8 ``ln_out``): 1 byte each.
"""
from __future__ import annotations

import pytest
from helpers import TINY_GPT

from parsim.cluster.collectives import grad_bucket_bytes, n_buckets, select_algorithm
from parsim.config.parallel import grad_reduce_bytes
from parsim.costs.memory import (
    ActivationOptions,
    framework_states,
    layer_activation_bytes,
)
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.model.presets import get_preset
from parsim.scenario import scenario_from_dict
from parsim.schedule.ir import Op


def test_framework_defaults_from_their_sources():
    assert grad_reduce_bytes("megatron", "bf16") == 4      # arguments.py: bf16 -> fp32 reduction
    assert grad_reduce_bytes("megatron", "fp8") == 4       # FP8 runs keep --bf16 parameters
    assert grad_reduce_bytes("megatron", "fp16") == 2      # the flag is off for fp16
    assert grad_reduce_bytes("megatron", "bf16", "bf16") == 2   # --grad-reduce-in-bf16
    assert grad_reduce_bytes("fsdp", "bf16") == 4          # torchtitan mixed_precision_reduce = float32
    assert grad_reduce_bytes("zero", "bf16") == 2          # the ZeRO paper's 16-bit gradients
    assert grad_reduce_bytes("deepspeed", "fp16") == 2
    assert grad_reduce_bytes("zero", "bf16", "fp32") == 4
    assert grad_reduce_bytes("zero", "fp32") == 4


def _job(framework, dtype=None, zero=1):
    par = {"dp": 4, "zero": zero, "framework": framework}
    if dtype:
        par["grad_reduce_dtype"] = dtype
    return scenario_from_dict({
        "name": "t", "hardware": "dgx-h100", "gpus": 4, "model": dict(TINY_GPT),
        "training": {"global_batch": 8, "microbatch_size": 1, "seq_len": 512, "precision": "bf16"},
        "parallel": par, "schedule": {"name": "1F1B"}, "overlap": {"grad_reduce": False}}, "t.toml")


def test_megatron_reduces_four_bytes_per_gradient_in_its_buckets():
    sc = _job("megatron")
    mc = ModelCosts.from_scenario(sc)
    params = mc.stage_costs[0].params
    reduce = mc.op_cost(0, Op.REDUCE_GRAD)
    assert reduce.bytes == pytest.approx(4 * params)
    # Megatron's default bucket is max(40M, 1M x dp) parameters of those 4-byte gradients
    nb = n_buckets(4 * params, grad_bucket_bytes(0, 4, 4))
    _, per = select_algorithm(sc.hardware, "reduce_scatter", 4 * params / nb, [0, 1, 2, 3])
    assert reduce.duration_s == pytest.approx(nb * per)
    # the same job under the ZeRO paper's convention moves half the bytes
    zero = ModelCosts.from_scenario(_job("zero")).op_cost(0, Op.REDUCE_GRAD)
    assert zero.bytes == pytest.approx(2 * params)
    assert zero.duration_s < reduce.duration_s
    # --grad-reduce-in-bf16 brings Megatron back to 2 bytes
    bf = ModelCosts.from_scenario(_job("megatron", "bf16")).op_cost(0, Op.REDUCE_GRAD)
    assert bf.bytes == pytest.approx(2 * params)


def test_megatron_main_gradient_buffer_follows_the_reduction_dtype():
    P, d = 1e9, 8
    # Megatron's distributed-optimizer table: bf16 params + fp32 grads = 6 + 12/d bytes per parameter
    fp32 = framework_states("megatron", P, d, 1, "adam", "bf16")
    assert fp32["params"] + fp32["grads"] + fp32["optimizer"] == pytest.approx(P * (6 + 12 / d))
    bf16 = framework_states("megatron", P, d, 1, "adam", "bf16", grad_dtype="bf16")
    assert bf16["grads"] == pytest.approx(2 * P)
    fp16 = framework_states("megatron", P, d, 1, "adam", "fp16")
    assert fp16["grads"] == pytest.approx(2 * P)


def test_fp8_keeps_linear_inputs_at_one_byte_hand_computed():
    spec = get_preset("megatron-1.7b")  # GPT: GeLU FFN, d_ff = 4h, no GQA
    h, f, q = spec.d_model, spec.d_ff, spec.n_heads * spec.head_dim_
    s, tp = 2048, 2
    bf16 = ActivationOptions("none", True, False, False)
    fp8 = ActivationOptions("none", True, False, False, fp8_linear_inputs=True)
    diff = layer_activation_bytes(spec, s, 1, tp, bf16) - layer_activation_bytes(spec, s, 1, tp, fp8)
    # QKV and FC1 inputs (h each, replicated over tp), projection and FC2 inputs (q, f; sharded):
    # one byte saved per element
    assert diff == pytest.approx(s * (2 * h + (q + f) / tp))


def test_bad_grad_reduce_dtype_is_one_line():
    with pytest.raises(ConfigError) as err:
        _job("megatron", "fp64")
    assert "parallel.grad_reduce_dtype" in err.value.line()


SMALL = ["--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "1024",
         "--vocab-size", "32000"]


def test_megatron_importer_states_the_reduction_dtype():
    from parsim.frameworks import import_megatron
    par = import_megatron(SMALL + ["--bf16", "--use-distributed-optimizer"], gpus=8).doc["parallel"]
    assert par["framework"] == "megatron" and "grad_reduce_dtype" not in par   # the fp32 default
    par = import_megatron(SMALL + ["--bf16", "--use-distributed-optimizer", "--grad-reduce-in-bf16"], gpus=8).doc
    assert par["parallel"]["grad_reduce_dtype"] == "bf16"
    par = import_megatron(SMALL + ["--bf16", "--use-torch-fsdp2"], gpus=8).doc["parallel"]
    assert par["framework"] == "fsdp" and par["grad_reduce_dtype"] == "fp32"


def test_torchtitan_importer_states_fsdp2_and_its_reduce_dtype(tmp_path):
    from pathlib import Path

    from parsim.frameworks import import_torchtitan
    src = Path(__file__).resolve().parent / "data" / "frameworks" / "torchtitan-llama3_8b.toml"
    par = import_torchtitan(src, "dgx-h100", 64).doc["parallel"]
    assert par["zero"] == 3 and par["framework"] == "fsdp" and "grad_reduce_dtype" not in par  # float32
    text = src.read_text()
    assert "\n[training]\n" in text
    job = tmp_path / "bf16-reduce.toml"
    job.write_text(text.replace("\n[training]\n", '\n[training]\nmixed_precision_reduce = "bfloat16"\n', 1))
    assert import_torchtitan(job, "dgx-h100", 64).doc["parallel"]["grad_reduce_dtype"] == "bf16"
