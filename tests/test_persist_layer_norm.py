"""``training.persist_layer_norm``: Megatron-LM's norms before the persistent kernel (a2fdcdf061,
2021-10-08) and with ``--no-persist-layer-norm`` after -- Apex's ``FusedLayerNorm``, which apex #1037
timed at 0.0751 / 0.0535 ms (forward) and 0.1762 / 0.0866 ms (backward) against ``FastLayerNorm`` on the
same GA100 tensor. The extra work by hand from the block's norm bytes; the strict key; the importer."""
import tomllib

import pytest
from conftest import ROOT

from parsim.costs import compute, layer
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.memory_ops import LEGACY_LAYER_NORM_TIME
from parsim.errors import ConfigError
from parsim.scenario import scenario_from_dict

GPT3 = ROOT / "scenarios" / "gpt3-175b-1f1b.toml"


def _doc(**training):
    doc = tomllib.loads(GPT3.read_text())
    doc["training"].update(training)
    return doc


def _inputs(**training):
    return layer_inputs(cost_inputs(scenario_from_dict(_doc(**training), str(GPT3))))


def test_the_ratios_are_apex_1037s_measured_times():
    assert LEGACY_LAYER_NORM_TIME == pytest.approx((0.0751 / 0.0535, 0.1762 / 0.0866))
    assert LEGACY_LAYER_NORM_TIME[0] == pytest.approx(1.404, abs=1e-3)
    assert LEGACY_LAYER_NORM_TIME[1] == pytest.approx(2.035, abs=1e-3)


def test_the_earlier_kernels_add_their_extra_passes_over_the_block_norms():
    """gpt3-175b (LayerNorm, two per block) under tp = 8 with sequence parallelism: each norm reads
    and writes the rank's 1/8 of the tokens' hidden vectors; the earlier kernels take 1.404x that
    forward and 2.035x the backward's twice-as-many bytes."""
    new, old = _inputs(), _inputs(persist_layer_norm=False)
    assert new.options.persist_layer_norm and not old.options.persist_layer_norm
    sh, m = new.shard, new.model
    assert m.norm == "layernorm" and m.block_norms == 2 and sh.sequence_parallel
    a = 2  # bf16
    norm_fwd = 2 * sh.tokens * m.d_model / sh.tp * a * 2  # read x, write y; two norms
    (f0, b0), (f1, b1) = compute.memory_work(new, False), compute.memory_work(old, False)
    assert f1.bytes - f0.bytes == pytest.approx(norm_fwd * (LEGACY_LAYER_NORM_TIME[0] - 1))
    assert b1.bytes - b0.bytes == pytest.approx(2 * norm_fwd * (LEGACY_LAYER_NORM_TIME[1] - 1))
    assert (f1.kernels, b1.kernels) == (f0.kernels, b0.kernels)  # the same launches, more passes
    layer.clear_caches()
    assert layer.layer_cost(old, False).forward.compute > layer.layer_cost(new, False).forward.compute


def test_the_key_is_strict_and_needs_a_fused_layernorm():
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_doc(persist_layer_norm="no"), "bad.toml")
    assert "training.persist_layer_norm" in str(e.value)
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_doc(persist_layer_norm=False, fused_kernels=False), "bad.toml")
    assert "training.persist_layer_norm" in str(e.value) and "nn.LayerNorm" in str(e.value)
    llama = tomllib.loads((ROOT / "scenarios" / "llama3-70b-h100.toml").read_text())
    llama["training"]["persist_layer_norm"] = False
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(llama, "bad.toml")
    assert "training.persist_layer_norm" in str(e.value) and "rmsnorm" in str(e.value)


def test_megatron_importer_reads_the_flag():
    from parsim.frameworks import import_megatron
    small = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "4", "--seq-length", "128",
             "--micro-batch-size", "1", "--global-batch-size", "8", "--tensor-model-parallel-size", "2", "--fp16",
             "--vocab-size", "32000", "--normalization", "LayerNorm"]
    assert "persist_layer_norm" not in import_megatron(small, gpus=8).doc["training"]  # the default: persistent
    doc = import_megatron(small + ["--no-persist-layer-norm"], gpus=8).doc
    assert doc["training"]["persist_layer_norm"] is False
    assert scenario_from_dict(doc, "import.toml").training.persist_layer_norm is False
