"""Without sequence parallelism, a column-parallel linear's input-gradient all-reduce runs beside
its weight-gradient GEMM (``overlap.tp_grad_allreduce``: Megatron-LM's asynchronous all-reduce, on by
default since September 2021; Transformer Engine's Linear backward), or blocks (Megatron-LM before
it). The backward's exposed TP time by hand from the collective's and the GEMMs' own times."""
import tomllib

import pytest
from conftest import ROOT

from parsim.costs import layer
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.model import layer_gemms
from parsim.scenario import scenario_from_dict

GPT3 = ROOT / "scenarios" / "gpt3-175b-1f1b.toml"


def _inputs(async_ar: bool, sp: bool = False, hardware: str = "dgx-a100-80g"):
    doc = tomllib.loads(GPT3.read_text())
    doc["hardware"] = hardware
    doc["parallel"].update(sequence_parallel=sp)
    doc.setdefault("overlap", {}).update(tp_comm=False, tp_grad_allreduce=async_ar)
    return layer_inputs(cost_inputs(scenario_from_dict(doc, str(GPT3))))


def _backward_tp(inp) -> float:
    layer.clear_caches()
    return layer.layer_cost(inp, False).backward_input.tp_comm


def _forward_tp(inp) -> float:
    layer.clear_caches()
    return layer.layer_cost(inp, False).forward.tp_comm


def test_blocking_backward_all_reduces_cost_what_the_forward_ones_do():
    # the backward's two all-reduces are the forward's conjugates: same bytes, same group
    inp = _inputs(async_ar=False)
    assert inp.shard.tp > 1 and not inp.shard.sequence_parallel
    assert _backward_tp(inp) == pytest.approx(_forward_tp(inp))


def test_async_all_reduce_is_exposed_only_beyond_its_weight_gradient_gemms():
    inp = _inputs(async_ar=True)
    m, sh, dev = inp.model, inp.shard, inp.hardware.device
    act = sh.tokens * m.d_model * 2  # fp16/bf16 activation gradient, bytes
    ar = layer.tp_collective_time(inp, "all_reduce", act)
    gemms = {g.name: g for g in layer_gemms(m, sh.tokens, sh.tp, 0)}
    windows = [dev.gemm_time(g.k, g.n, g.m, inp.options.precision, g.count)
               for g in (gemms["qkv"], gemms["fc1"])]  # the weight gradients of QKV and FC1
    want = sum(max(0.0, ar - w) for w in windows)
    assert _backward_tp(inp) == pytest.approx(want, rel=1e-9)
    assert _backward_tp(inp) < _backward_tp(_inputs(async_ar=False))


def test_the_forward_does_not_change():
    assert _forward_tp(_inputs(async_ar=True)) == pytest.approx(_forward_tp(_inputs(async_ar=False)))
    assert _forward_tp(_inputs(async_ar=True, sp=True)) == pytest.approx(_forward_tp(_inputs(async_ar=False, sp=True)))


def test_under_sequence_parallelism_the_reduce_scatters_go_beside_the_weight_gradients():
    """Megatron's backward under sequence parallelism: the output-gradient all-gathers still block;
    the column-parallel input gradients' reduce-scatters (``_reduce_scatter_base(..., async_op=True)``)
    run beside the weight-gradient GEMMs: what the blocking run pays for them, less what outlasts
    the GEMMs."""
    on, off = _inputs(async_ar=True, sp=True), _inputs(async_ar=False, sp=True)
    m, sh, dev = on.model, on.shard, on.hardware.device
    act = sh.tokens * m.d_model * 2
    rs = layer.tp_collective_time(on, "reduce_scatter", act)
    gemms = {g.name: g for g in layer_gemms(m, sh.tokens, sh.tp, 0)}
    windows = [dev.gemm_time(g.k, g.n, g.m, on.options.precision, g.count) for g in (gemms["qkv"], gemms["fc1"])]
    # this GPU profile prices a blocking call at the collective's own time, whatever compute precedes it
    assert layer.in_pass_calls_time(off, "reduce_scatter", act, 2, 1e-3) == pytest.approx(2 * rs, rel=1e-12)
    assert _backward_tp(on) < _backward_tp(off)
    assert _backward_tp(off) - _backward_tp(on) == pytest.approx(2 * rs - sum(max(0.0, rs - w) for w in windows),
                                                                 rel=1e-9)


def test_the_framework_decides_when_unset():
    from parsim.costs.inputs import async_grad_reduce
    from parsim.config.scenario import OverlapConfig
    assert async_grad_reduce("megatron", OverlapConfig()) is True
    assert async_grad_reduce("fsdp", OverlapConfig()) is False   # DTensor: its own autograd node, after both GEMMs
    assert async_grad_reduce("zero", OverlapConfig()) is False
    assert async_grad_reduce("fsdp", OverlapConfig(tp_grad_allreduce=True)) is True
    assert async_grad_reduce("megatron", OverlapConfig(tp_grad_allreduce=False)) is False
    assert async_grad_reduce("megatron", OverlapConfig(tp_comm=True)) is False  # the userbuffers pipeline it instead


def test_scenario_key_is_strict():
    doc = tomllib.loads(GPT3.read_text())
    doc.setdefault("overlap", {})["tp_grad_allreduce"] = "yes"
    with pytest.raises(Exception) as e:
        scenario_from_dict(doc, "x.toml")
    assert "overlap.tp_grad_allreduce" in str(e.value)


def test_megatron_importer_reads_the_flag():
    from parsim.frameworks import import_megatron
    small = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
             "--micro-batch-size", "1", "--global-batch-size", "8", "--tensor-model-parallel-size", "2", "--bf16",
             "--vocab-size", "32000"]
    assert "tp_grad_allreduce" not in import_megatron(small, gpus=8).doc["overlap"]  # the default: asynchronous
    doc = import_megatron(small + ["--no-async-tensor-model-parallel-allreduce"], gpus=8).doc
    assert doc["overlap"]["tp_grad_allreduce"] is False
    assert scenario_from_dict(doc, "import.toml").overlap.tp_grad_allreduce is False
