"""Hugging Face import of the families beyond Llama/Qwen/DeepSeek/GPT-OSS and the classic GPTs
(parsim.model.hf_families, parsim.model.hf_own_keys), and the presets they back.

Oracles: exact weight totals where a checkpoint's weight index (``total_size`` in bytes over the
weights' element size) or an exact count printed beside a port of the weights exists; published
totals (model cards, papers) within 1% where only those exist; hand-written sums of each class's
modules for the families with no shipped config. Where each config copy comes from:
tests/data/hf/SOURCES.md.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from parsim.costs.memory import ActivationOptions, block_stash
from parsim.costs.memory_ops import block_forward_work, forward_pieces
from parsim.errors import ConfigError
from parsim.model import get_preset, model_from_hf_config, model_from_table
from parsim.model.shapes import active_params, layer_params, total_params

HF = Path(__file__).parent / "data" / "hf"

PRESET_FILES = {
    "llama2-13b": "Llama-2-13b-hf", "llama3.1-8b": "Llama-3.1-8B", "llama3.1-70b": "Llama-3.1-70B",
    "llama3.2-1b": "Llama-3.2-1B", "llama3.2-3b": "Llama-3.2-3B",
    "llama4-maverick": "Llama-4-Maverick-17B-128E-Instruct", "mistral-nemo-12b": "Mistral-Nemo-Base-2407",
    "mistral-small-24b": "Mistral-Small-3.1-24B-Instruct-2503", "qwen2.5-7b": "Qwen2.5-7B",
    "qwen2.5-72b": "Qwen2.5-72B-Instruct", "qwen3-8b": "Qwen3-8B", "qwen3-32b": "Qwen3-32B",
    "deepseek-v2": "DeepSeek-V2", "deepseek-v2-lite": "DeepSeek-V2-Lite", "gemma2-9b": "gemma-2-9b",
    "gemma2-27b": "gemma-2-27b", "gemma3-1b": "gemma-3-1b-it", "phi3-mini": "Phi-3-mini-4k-instruct",
    "olmo2-7b": "OLMo-2-1124-7B", "olmoe-1b-7b": "OLMoE-1B-7B-0924", "falcon-7b": "falcon-7b",
    "falcon-40b": "falcon-40b", "falcon-180b": "falcon-180B-chat", "dbrx": "dbrx-instruct",
    "glm-4.5-air": "GLM-4.5-Air", "mpt-7b": "mpt-7b-instruct", "mpt-30b": "mpt-30b-chat",
    "granite3-3b-a800m": "granite-3.1-3b-a800m-instruct", "mistral-7b": "Mistral-7B-v0.1", "qwen2-7b": "Qwen2-7B",
    "qwen1.5-moe-a2.7b": "Qwen1.5-MoE-A2.7B",
}


@pytest.mark.parametrize("preset,directory", sorted(PRESET_FILES.items()))
def test_hf_import_gives_the_preset(preset, directory):
    spec, ref = model_from_hf_config(HF / directory / "config.json"), get_preset(preset)
    assert spec.name == directory
    # GLM-4.5-Air's config carries its multi-token-prediction module; presets train none
    assert spec.mtp_layers == (1 if preset == "glm-4.5-air" else 0)
    assert dataclasses.replace(spec, name=preset, mtp_layers=0) == ref


# Exact weight totals. Weight indexes: total_size bytes / element bytes; the Falcon checkpoints store
# the head tied to the embedding a second time (lm_head.weight is in their index), so one copy
# (vocab x hidden) comes off. keras-hub's preset "params" are exact counts of its ports of the same
# weights (Gemma's and Phi-3's vocabularies as the Hub's; Magistral Small's text model is Mistral
# Small 3.1's). Weight censuses of Qwen2.5-72B-Instruct and Llama-3.2-3B-Instruct: SOURCES.md.
EXACT = {
    "OLMoE-1B-7B-0924": 13_838_323_712 // 2,           # bf16 safetensors index
    "OLMo-2-1124-7B": 29_194_469_376 // 4,             # fp32 safetensors index
    "falcon-40b": 83_671_941_120 // 2 - 65024 * 8192,  # bf16 pytorch_model.bin index
    "falcon-180B-chat": 359_045_130_240 // 2 - 65024 * 14848,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b-it": 999_885_952,
    "Phi-3-mini-4k-instruct": 3_821_079_552,
    "Mistral-Small-3.1-24B-Instruct-2503": 23_572_403_200,
    "Qwen2.5-72B-Instruct": 72_706_203_648,
    "Llama-3.2-3B": 3_212_749_824,
}


@pytest.mark.parametrize("directory,count", sorted(EXACT.items()))
def test_import_counts_the_checkpoints_weights(directory, count):
    assert total_params(model_from_hf_config(HF / directory / "config.json")) == count


def rel(a: float, b: float) -> float:
    return abs(a - b) / b


@pytest.mark.parametrize("preset,published", [
    ("dbrx", 132e9),               # Databricks model card: "132B total parameters"
    ("glm-4.5-air", 106e9),        # GLM-4.5 report / transformers docs: 106B total
    ("mpt-7b", 6.7e9),             # MosaicML: MPT-7B, 6.7B
    ("mpt-30b", 30e9),
    ("deepseek-v2", 236e9),        # DeepSeek-V2 README: 236B total
    ("deepseek-v2-lite", 15.7e9),  # DeepSeek-V2-Lite: 15.7B total
    ("llama4-maverick", 400e9),    # Meta: 400B total (language model; the vision encoder is < 1%)
    ("llama2-13b", 13e9), ("llama3.1-8b", 8.03e9), ("llama3.1-70b", 70.6e9), ("llama3.2-1b", 1.23e9),
    ("qwen2.5-7b", 7.61e9), ("qwen3-8b", 8.2e9), ("qwen3-32b", 32.8e9), ("mistral-nemo-12b", 12.2e9),
    ("mistral-7b", 7.3e9),          # Mistral AI: "Mistral 7B is a 7.3B parameter model"
    ("qwen1.5-moe-a2.7b", 14.3e9),  # Qwen: "14.3B parameters in total and 2.7B activated"
])
def test_presets_match_published_totals(preset, published):
    assert rel(total_params(get_preset(preset)), published) < 0.01


def test_nemotron4_by_hand_and_report():
    # per block: q and o (d x d), k and v (d x 8 heads x head_dim), up and down (d x 4d), two
    # LayerNorms with shift; untied embedding and head; the 340B report's "340B"
    for name, d, layers, hd in (("nemotron4-15b", 6144, 32, 128), ("nemotron4-340b", 18432, 96, 192)):
        spec = get_preset(name)
        block = 2 * d * d + 2 * d * 8 * hd + 2 * d * 4 * d + 2 * 2 * d
        assert total_params(spec) == layers * block + 2 * 256000 * d + 2 * d
    assert rel(total_params(get_preset("nemotron4-340b")), 340e9) < 0.01


def test_qwen15_moe_active_matches_the_model_card():
    assert rel(active_params(get_preset("qwen1.5-moe-a2.7b")), 2.7e9) < 0.01


def test_dbrx_active_matches_the_model_card():
    # "36B parameters are active on any input": 4 of 16 experts, attention, embedding and head
    assert rel(active_params(get_preset("dbrx")), 36e9) < 0.015


# ---------------------------------------------------------------- families by hand
def _write(tmp_path, cfg: dict) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_gemma_7b_by_hand_and_model_card(tmp_path):
    # google/gemma-7b's shapes: head_dim 256 (16 heads x 256 = 4096 > 3072), GeGLU, tied head;
    # Gemma technical report: 8.54B parameters
    p = _write(tmp_path, {"model_type": "gemma", "hidden_size": 3072, "intermediate_size": 24576,
                          "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16,
                          "head_dim": 256, "vocab_size": 256000})
    d, f = 3072, 24576
    block = 4 * d * 4096 + 3 * d * f + 2 * d
    assert total_params(model_from_hf_config(p)) == 28 * block + 256000 * d + d == 8_537_680_896


def test_gemma_head_dim_defaults_to_the_config_class(tmp_path):
    cfg = json.loads((HF / "gemma-2-27b" / "config.json").read_text())
    del cfg["head_dim"]  # 27B states 128; without it Gemma2Config's default, 256, not 4608 / 32 = 144
    assert model_from_hf_config(_write(tmp_path, cfg)).head_dim == 256


def test_cohere_command_r_by_hand_and_model_card(tmp_path):
    # c4ai-command-r-v01's shapes: one scale-only LayerNorm a block, feeding attention and MLP side by side
    cfg = {"model_type": "cohere", "hidden_size": 8192, "intermediate_size": 22528, "num_hidden_layers": 40,
           "num_attention_heads": 64, "num_key_value_heads": 64, "vocab_size": 256000}
    spec = model_from_hf_config(_write(tmp_path, cfg))
    d, f = 8192, 22528
    assert (spec.block_norms, spec.norm_shift, spec.parallel_residual, spec.tied_embeddings) == (1, False, True, True)
    assert total_params(spec) == 40 * (4 * d * d + 3 * d * f + d) + 256000 * d + d
    assert rel(total_params(spec), 35e9) < 0.01  # "a 35 billion parameter" model
    # Command R+ (use_qk_norm): per-head LayerNorms over q (96 x 128) and k (8 x 128), scale only
    plus = model_from_hf_config(_write(tmp_path, {**cfg, "hidden_size": 12288, "intermediate_size": 33792,
                                                   "num_hidden_layers": 64, "num_attention_heads": 96,
                                                   "num_key_value_heads": 8, "use_qk_norm": True}))
    d, f, kv = 12288, 33792, 8 * 128
    assert layer_params(plus) == 2 * d * d + 2 * d * kv + 3 * d * f + d + (96 + 8) * 128
    assert rel(total_params(plus), 104e9) < 0.01  # Command R+: 104B


def test_starcoder2_biases_and_gelu_by_hand(tmp_path):
    # StarCoder2-15B's shapes: biases on q, k, v, o, c_fc and c_proj; LayerNorm with shift; GeLU MLP
    cfg = {"model_type": "starcoder2", "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 40,
           "num_attention_heads": 48, "num_key_value_heads": 4, "vocab_size": 49152, "use_bias": True,
           "tie_word_embeddings": False, "sliding_window": 4096, "max_position_embeddings": 16384}
    spec = model_from_hf_config(_write(tmp_path, cfg))
    d, f, kv = 6144, 24576, 4 * 128
    attn = d * d + 2 * d * kv + d * d + (d + 2 * kv) + d
    mlp = 2 * d * f + f + d
    assert layer_params(spec) == attn + mlp + 2 * 2 * d
    assert spec.not_modelled == ("sliding_window=4096: every layer counted as full attention",)


def test_nemotron_relu2_layernorm_by_hand(tmp_path):
    # Nemotron-style: squared-ReLU up/down (two matrices), LayerNorm1P with shift, head_dim given
    cfg = {"model_type": "nemotron", "hidden_size": 3072, "intermediate_size": 9216, "num_hidden_layers": 32,
           "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 256000,
           "partial_rotary_factor": 0.5}
    spec = model_from_hf_config(_write(tmp_path, cfg))
    d, q, kv, f = 3072, 24 * 128, 8 * 128, 9216
    assert spec.ffn == "gelu" and spec.norm == "layernorm" and spec.norm_shift
    assert layer_params(spec) == 2 * d * q + 2 * d * kv + 2 * d * f + 2 * 2 * d


def test_granite_moe_shared_expert_by_hand(tmp_path):
    cfg = {"model_type": "granitemoeshared", "hidden_size": 1024, "intermediate_size": 512,
           "shared_intermediate_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16,
           "num_key_value_heads": 8, "num_local_experts": 32, "num_experts_per_tok": 8, "vocab_size": 49155,
           "tie_word_embeddings": True}
    spec = model_from_hf_config(_write(tmp_path, cfg))
    d, kv = 1024, 8 * 64
    expected = 2 * d * d + 2 * d * kv + 32 * d + 32 * 3 * d * 512 + 3 * d * 1024 + 2 * d
    assert (spec.n_experts, spec.top_k, spec.n_shared_experts) == (32, 8, 1)
    assert layer_params(spec, 0) == expected


def test_falcon_7b_one_norm_a_block_by_hand():
    # multi-query (one 64-wide K and V), one LayerNorm (scale and shift) per parallel block, GeLU 4x, tied
    spec = model_from_hf_config(HF / "falcon-7b" / "config.json")
    d, hd, f = 4544, 64, 4 * 4544
    block = d * (d + 2 * hd) + d * d + 2 * d * f + 2 * d
    assert total_params(spec) == 32 * block + 65024 * d + 2 * d
    # the Hub's "7.22B" counts the head stored beside the embedding it is tied to
    assert rel(total_params(spec) + 65024 * d, 7.22e9) < 0.001


def test_gemma3_wrapper_is_read_through_text_config(tmp_path):
    # Gemma 3's multimodal config wraps gemma3_text; the tie defaults to Gemma's (tied)
    text = json.loads((HF / "gemma-3-1b-it" / "config.json").read_text())
    text.pop("tie_word_embeddings", None)
    spec = model_from_hf_config(_write(tmp_path, {"model_type": "gemma3", "architectures": [
        "Gemma3ForConditionalGeneration"], "text_config": text, "vision_config": {"model_type": "siglip_vision_model"}}))
    assert spec.tied_embeddings and spec.qk_norm and spec.block_norms == 4
    assert spec.layer_types == get_preset("gemma3-1b").layer_types
    assert spec.not_modelled[-1].startswith("everything outside text_config")


@pytest.mark.parametrize("directory,edit,key", [
    ("falcon-40b", lambda c: c.__setitem__("parallel_attn", False), "parallel_attn"),
    ("mpt-7b-instruct", lambda c: c["attn_config"].__setitem__("alibi", False), "attn_config.alibi"),
    ("dbrx-instruct", lambda c: c.__setitem__("ffn_config", [1]), "ffn_config"),
    ("gemma-2-9b", lambda c: c.__setitem__("attention_bias", True), "attention_bias"),
    ("gemma-3-1b-it", lambda c: c.__setitem__("sliding_window_pattern", 0), "sliding_window_pattern"),
    ("OLMoE-1B-7B-0924", lambda c: c.pop("num_experts"), "num_experts"),
])
def test_unsupported_values_name_file_and_key(tmp_path, directory, edit, key):
    cfg = json.loads((HF / directory / "config.json").read_text())
    edit(cfg)
    p = _write(tmp_path, cfg)
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert str(e.value).startswith(f"{p}: {key}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("model_type,says", [("bamba", "state-space"), ("kimi_linear", "state-space"),
                                             ("jamba", "state-space"), ("t5", "encoder")])
def test_families_parsim_does_not_model_are_named(tmp_path, model_type, says):
    p = _write(tmp_path, {"model_type": model_type, "architectures": ["LlamaForCausalLM"], "hidden_size": 64})
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert str(e.value).startswith(f"{p}: model_type: '{model_type}'") and says in str(e.value)


# ---------------------------------------------------------------- the spec's new fields
@pytest.mark.parametrize("fields,key", [
    ({"block_norms": 3}, "model.block_norms"),
    ({"block_norms": 0}, "model.block_norms"),
    ({"qk_norm_width": "full"}, "model.qk_norm_width"),
    ({"norm_shift": "no"}, "model.norm_shift"),
])
def test_table_bad_norm_fields_name_key(fields, key):
    with pytest.raises(ConfigError) as e:
        model_from_table({"preset": "llama2-7b", "n_layers": 2, **fields}, "s.toml")
    assert e.value.key == key and str(e.value).startswith(f"s.toml: {key}: ")


def test_norm_fields_count_by_hand():
    base = get_preset("gpt3-175b")  # LayerNorm with shift: 2 x 2h a block
    h = base.d_model
    assert layer_params(dataclasses.replace(base, norm_shift=False)) == layer_params(base) - 2 * h
    assert layer_params(dataclasses.replace(base, block_norms=4)) == layer_params(base) + 2 * 2 * h
    assert layer_params(dataclasses.replace(base, block_norms=1)) == layer_params(base) - 2 * h
    q = get_preset("qwen3-8b")
    wide = dataclasses.replace(q, qk_norm_width="projection")
    assert layer_params(wide) - layer_params(q) == (32 + 8) * 128 - 2 * 128


def test_block_norms_move_the_memory_bound_work_and_the_stash():
    gemma = get_preset("gemma2-9b")
    two = dataclasses.replace(gemma, block_norms=2, layer_types=None, sliding_window=0)
    four = dataclasses.replace(two, block_norms=4)
    norm = forward_pieces(two, 4096, 1, False, 2.0, True, False)["norm"]
    assert block_forward_work(four, 4096, 1, False, 2.0, True, False).bytes == pytest.approx(
        block_forward_work(two, 4096, 1, False, 2.0, True, False).bytes + 2 * norm.bytes)
    opts = ActivationOptions()
    per_token = lambda s: sum(t.bytes for t in block_stash(s, 4096, opts, 0))
    e = opts.bytes_per_element
    assert per_token(four) == pytest.approx(per_token(two) + 2 * e * gemma.d_model)
    one = dataclasses.replace(two, block_norms=1)  # the FFN reads the attention norm's output
    assert per_token(one) == pytest.approx(per_token(two) - e * gemma.d_model - e * gemma.d_model)


def test_a_scenario_runs_on_an_imported_config(tmp_path, capsys):
    # end to end: [model] hf_config -> parsim simulate --json, the checkpoint's exact count in `params`
    from parsim.cli.main import main
    cfg = HF / "gemma-2-9b" / "config.json"
    scen = tmp_path / "gemma.toml"
    scen.write_text(f'name = "gemma"\nhardware = "dgx-h100"\ngpus = 8\n[model]\nhf_config = "{cfg}"\n'
                    '[training]\nglobal_batch = 16\nseq_len = 4096\nmicrobatch_size = 1\nprecision = "bf16"\n'
                    '[parallel]\ntp = 8\n')
    assert main(["simulate", str(scen), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params"] == EXACT["gemma-2-9b"] and out["step_time_s"] > 0
