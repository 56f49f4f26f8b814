"""Multi-token prediction (DeepSeek-V3's MTP modules, Megatron-Core's ``--mtp-num-layers``):
what ``model.mtp_layers`` adds to the parameters, the model FLOPs and the last pipeline stage.

Oracles: DeepSeek-V3's published MTP parameter count (README_WEIGHTS.md: "11.5B unique
parameters, excluding the shared 0.9B Embedding and 0.9B output Head"), and closed forms
worked by hand for a small dense model (a GELU GPT block: 4d^2 attention + 2*d*4d FFN weights)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.model import (
    ModelSpec,
    get_preset,
    layer_flops,
    layer_params,
    model_flops_per_step,
    model_from_hf_config,
    model_from_table,
    mtp_params,
    total_params,
    trained_params,
)
from parsim.scenario import scenario_from_dict
from parsim.schedule.ir import Op
from parsim.simulate import simulate

HF = Path(__file__).parent / "data" / "hf"

D, V, L, SEQ = 64, 1000, 4, 32
TINY = ModelSpec(name="tiny-gpt", n_layers=L, d_model=D, n_heads=4, n_kv_heads=4, d_ff=4 * D, vocab_size=V,
                 ffn="gelu", norm="layernorm", position="rope", tied_embeddings=False)


def test_deepseek_v3_mtp_module_has_its_published_unique_parameters():
    m = model_from_hf_config(HF / "DeepSeek-V3" / "config.json")
    assert m.mtp_layers == 1  # num_nextn_predict_layers
    # README_WEIGHTS.md: 11.5B unique parameters (the embedding and head are shared)
    assert mtp_params(m) == pytest.approx(11.5e9, rel=0.01)
    # the main model stays DeepSeek's 671B: MTP is counted apart
    assert total_params(m) == pytest.approx(671e9, rel=0.01)
    assert trained_params(m) == total_params(m) + mtp_params(m)


def test_hf_import_reads_the_depth_and_a_scenario_can_leave_it_out(tmp_path):
    assert model_from_hf_config(HF / "DeepSeek-V3.2" / "config.json").mtp_layers == 1
    assert model_from_hf_config(HF / "Kimi-K2-Instruct" / "config.json").mtp_layers == 0
    assert model_from_hf_config(HF / "Meta-Llama-3-8B" / "config.json").mtp_layers == 0
    cfg = str((HF / "DeepSeek-V3" / "config.json").resolve())
    assert model_from_table({"hf_config": cfg, "mtp_layers": 0}, str(tmp_path / "s.toml")).mtp_layers == 0
    assert mtp_params(get_preset("deepseek-v3")) == 0  # presets train none unless asked


def test_mtp_params_closed_form():
    # one GELU layernorm block: 4d^2 + 4d (q, k, v, o and... no biases) + 2 * d * 4d + 2 norms of 2d;
    # plus eh_proj 2d x d and three layernorms of 2d each
    block = 4 * D * D + 2 * D * 4 * D + 2 * 2 * D
    assert layer_params(TINY, L - 1) == block
    m = dataclasses.replace(TINY, mtp_layers=2)
    assert mtp_params(m) == 2 * (block + 2 * D * D + 3 * 2 * D)


def test_mtp_model_flops_closed_form():
    tokens = 2 * SEQ
    base = model_flops_per_step(TINY, tokens, SEQ)
    with_mtp = model_flops_per_step(dataclasses.replace(TINY, mtp_layers=1), tokens, SEQ)
    # one more block's matmuls (4d^2 + 8d^2), eh_proj (2d^2) and the LM head (V d), each
    # 2 FLOPs per weight per token, and one more full-square attention core
    # (2 * 2 * b * s^2 * d for QK^T and PV), all times 3 (forward + backward)
    weights = 12 * D * D + 2 * D * D + V * D
    attention = 4.0 * (tokens / SEQ) * SEQ * SEQ * D
    assert with_mtp - base == pytest.approx(3.0 * (2.0 * tokens * weights + attention), rel=1e-12)


def _costs(mtp: int, pp: int = 2, tp: int = 1) -> ModelCosts:
    model = {f.name: getattr(TINY, f.name) for f in dataclasses.fields(TINY) if f.name != "not_modelled"}
    model["mtp_layers"] = mtp
    sc = scenario_from_dict({
        "name": "mtp", "hardware": "dgx-h100", "gpus": pp * tp,
        "model": model,
        "training": {"global_batch": 8, "microbatch_size": 1, "seq_len": SEQ, "precision": "bf16"},
        "parallel": {"dp": 1, "tp": tp, "pp": pp, "sequence_parallel": tp > 1},
        "schedule": {"name": "1F1B"},
    }, "<mtp>")
    return ModelCosts.from_scenario(sc)


def test_mtp_sits_on_the_last_stage_with_its_weights():
    base, mtp = _costs(0), _costs(1)
    first0, last0 = base.stage_costs
    first1, last1 = mtp.stage_costs
    assert first1 == first0  # nothing moves to the first stage
    assert last1.n_layers == last0.n_layers  # the model's blocks; the MTP block is beside them
    # the depth's block, eh_proj and norms, and a copy of the word embeddings for its lookup
    # (the last stage does not hold them otherwise: the embeddings are untied)
    assert last1.params - last0.params == pytest.approx(mtp_params(dataclasses.replace(TINY, mtp_layers=1)) + V * D)
    # forward FLOPs: one block, eh_proj (tokens x d x 2d) and another LM head (tokens x d x V)
    tokens = SEQ
    block_f = layer_flops(TINY, 1, SEQ, 1, L - 1).forward
    added = block_f + 2.0 * tokens * D * 2 * D + 2.0 * tokens * D * V
    assert last1.flops[Op.F] - last0.flops[Op.F] == pytest.approx(added, rel=1e-9)
    # and it takes time, and memory for its activations
    assert last1.parts[Op.F].total > last0.parts[Op.F].total
    assert last1.activation_bytes > last0.activation_bytes


def test_mtp_under_tensor_parallelism_sends_its_projection_collectives():
    base, mtp = _costs(0, pp=1, tp=2), _costs(1, pp=1, tp=2)
    (st0,), (st1,) = base.stage_costs, mtp.stage_costs
    # eh_proj's input gathered along the sequence (tokens x 2d) and its output gathered over tp
    # (tokens x d), plus the block's and the extra head's own: strictly more TP bytes
    assert st1.bytes[Op.F].tp > st0.bytes[Op.F].tp
    assert st1.parts[Op.F].tp_comm > st0.parts[Op.F].tp_comm


def test_simulate_reports_the_trained_parameters_and_counts_mtp_in_mfu_flops():
    model = {f.name: getattr(TINY, f.name) for f in dataclasses.fields(TINY) if f.name != "not_modelled"}
    doc = {"name": "mtp", "hardware": "dgx-h100", "gpus": 2, "model": {**model, "mtp_layers": 1},
           "training": {"global_batch": 8, "microbatch_size": 1, "seq_len": SEQ, "precision": "bf16"},
           "parallel": {"dp": 1, "tp": 1, "pp": 2}, "schedule": {"name": "1F1B"}}
    mx = simulate(scenario_from_dict(doc, "<mtp>")).metrics
    m = dataclasses.replace(TINY, mtp_layers=1)
    assert mx["params"] == total_params(m) + mtp_params(m)
    flops = model_flops_per_step(m, 8 * SEQ, SEQ)
    assert mx["tflops_per_gpu"] == pytest.approx(flops / mx["step_time_s"] / 2 / 1e12, rel=1e-9)


@pytest.mark.parametrize("bad, why", [(-1, ">= 0"), (65, "more than parsim models"), (1.5, "integer")])
def test_bad_mtp_depth_is_refused_naming_the_key(bad, why):
    with pytest.raises(ConfigError) as e:
        dataclasses.replace(TINY, mtp_layers=bad)
    assert e.value.key == "model.mtp_layers" and why in e.value.problem
