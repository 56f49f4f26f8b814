"""parsim.model beyond the Llama family: GPT-OSS, Kimi-K2, DeepSeek-V3.2, text_config wrappers
(Llama 4, Qwen3-VL, Qwen3.5), GPT-2, GPT-NeoX, OPT, BLOOM; per-layer attention FLOPs.

Oracles: published totals (each cited where it is used); exact counts of an independent
implementation (Hugging Face transformers); hand-computed tiny models; brute-force masks.
Where the shipped config.json files come from: tests/data/hf/SOURCES.md.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from parsim.errors import ConfigError
from parsim.model import (
    ModelSpec,
    active_params,
    attention_core_flops,
    embedding_params,
    get_preset,
    head_params,
    is_moe_layer,
    layer_flops,
    layer_params,
    model_flops_per_step,
    model_from_hf_config,
    model_from_table,
    total_params,
)
from parsim.model.presets import PRESETS
from parsim.model.shapes import causal_pairs

HF = Path(__file__).resolve().parent / "data" / "hf"


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def printed_tolerance(published: float, digits_after_point: int, unit: float) -> float:
    """Larger of 1% and half a unit of the last printed digit (a figure printed as "17B" is 16.5-17.5B)."""
    return max(0.01 * published, 0.5 * unit * 10 ** -digits_after_point)


# ---------------------------------------------------------------- an independent implementation
# Parameters of each shipped config as Hugging Face transformers 4.57.1 builds it: the model class
# (GptOssForCausalLM, DeepseekV3ForCausalLM, Llama4ForCausalLM on text_config, GPT2LMHeadModel,
# GPTNeoXForCausalLM, OPTForCausalLM; Qwen3VLMoeForConditionalGeneration minus its visual tower)
# instantiated on the meta device, sum of p.numel() over model.parameters() (tied weights once).
TRANSFORMERS_COUNTS = {
    "gpt-oss-20b": 20_914_757_184,
    "gpt-oss-120b": 116_829_156_672,
    "Kimi-K2-Instruct": 1_026_408_209_408,
    "DeepSeek-V3.2": 671_026_404_352,
    "Llama-4-Scout-17B-16E-Instruct": 107_769_861_120,
    "gpt2": 124_439_808,
    "gpt-neox-20b": 20_554_567_680,
    "opt-66b": 65_719_701_504,
    "Qwen3-VL-30B-A3B-Instruct": 30_532_122_624,
}


@pytest.mark.parametrize("directory,count", sorted(TRANSFORMERS_COUNTS.items()))
def test_hf_import_counts_what_the_weights_hold(directory, count):
    assert total_params(model_from_hf_config(HF / directory / "config.json")) == count


@pytest.mark.parametrize("directory,preset", [
    ("gpt-oss-20b", "gpt-oss-20b"), ("gpt-oss-120b", "gpt-oss-120b"), ("Kimi-K2-Instruct", "kimi-k2"),
    ("DeepSeek-V3.2", "deepseek-v3.2"), ("Llama-4-Scout-17B-16E-Instruct", "llama4-scout"),
    ("gpt2", "gpt2"), ("gpt-neox-20b", "gpt-neox-20b"), ("opt-66b", "opt-66b"),
])
def test_hf_import_reproduces_presets(directory, preset):
    spec, ref = model_from_hf_config(HF / directory / "config.json"), get_preset(preset)
    assert spec.name == directory
    # DeepSeek-V3.2's config carries its one multi-token-prediction module; presets train none
    assert spec.mtp_layers == (1 if preset == "deepseek-v3.2" else 0) and ref.mtp_layers == 0
    assert dataclasses.replace(spec, name=ref.name, max_seq_len=ref.max_seq_len, mtp_layers=0) == ref


# ---------------------------------------------------------------- published totals
def test_gpt_oss_matches_openai_model_card():
    # OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925): 116.8B total, 5.1B
    # active; 20.9B total, 3.6B active. Its active count leaves the token-embedding table out (a
    # lookup) and keeps the unembedding; that convention reproduces the card's 3.61B and 5.13B.
    for name, total, active in (("gpt-oss-20b", 20.9e9, 3.6e9), ("gpt-oss-120b", 116.8e9, 5.1e9)):
        spec = get_preset(name)
        assert rel(total_params(spec), total) < 0.01
        assert rel(active_params(spec) - spec.vocab_size * spec.d_model, active) < 0.01
        assert spec.n_experts == (32 if name == "gpt-oss-20b" else 128) and spec.top_k == 4


def test_kimi_k2_against_its_reports():
    # Kimi K2 model card (moonshotai/Kimi-K2-Instruct): "Total Parameters 1T, Activated Parameters
    # 32B"; tech report (arXiv:2507.20534): 1.04T total, 32.6B activated. The released checkpoint's
    # config holds 1,026,408,209,408 (transformers, above), 1.3% below the report's 1.04T; which
    # weights the report adds is not stated. So the total is checked against the model card's "1T"
    # at its printed precision, and the gap to 1.04T is pinned (this fails if the count moves).
    spec = get_preset("kimi-k2")
    total = total_params(spec)
    assert abs(total - 1e12) <= printed_tolerance(1e12, 0, 1e12)
    assert 0.012 < 1 - total / 1.04e12 < 0.014
    assert rel(active_params(spec), 32.6e9) < 0.01


def test_deepseek_v32_is_v3_shapes_with_the_indexer_named():
    # DeepSeek-V3.2 (deepseek-ai/DeepSeek-V3.2 model card): same 671B / 37B architecture as V3
    # (V3 report, arXiv:2412.19437, MTP module excluded), plus DeepSeek Sparse Attention.
    v32, v3 = get_preset("deepseek-v3.2"), get_preset("deepseek-v3")
    assert total_params(v32) == total_params(v3) and active_params(v32) == active_params(v3)
    assert rel(total_params(v32), 671e9) < 0.01 and rel(active_params(v32), 37e9) < 0.02
    assert len(v32.not_modelled) == 1 and "lightning indexer" in v32.not_modelled[0]
    assert "top-2048" in v32.not_modelled[0] and v3.not_modelled == ()
    imported = model_from_hf_config(HF / "DeepSeek-V3.2" / "config.json")
    assert imported.not_modelled == v32.not_modelled


def test_llama4_scout_matches_meta():
    # Meta, Llama 4 model card: Scout "17B activated, 109B total" for the multimodal checkpoint.
    # Its vision encoder + projector hold 871,932,416 parameters (transformers 4.57.1
    # Llama4ForConditionalGeneration with the release's vision_config: 34 layers, width 1408,
    # FFN 5632, patch 14, image 336, projector 4096, counted on the meta device minus the
    # language model); the text model is what parsim imports.
    spec = get_preset("llama4-scout")
    vision = 871_932_416
    assert rel(total_params(spec) + vision, 109e9) < 0.01
    assert abs(active_params(spec) - 17e9) <= printed_tolerance(17e9, 0, 1e9)
    assert spec.n_moe_layers == 48 and spec.n_shared_experts == 1 and spec.top_k == 1
    assert any("vision" in n for n in spec.not_modelled)


def test_bloom_176b_matches_model_card_exactly():
    # bigscience/bloom model card: "176,247,271,424 parameters" (70 layers, d 14336, 112 heads,
    # vocabulary 250880; BigScience 2022, arXiv:2211.05100 Table 3). 12lh^2 + 13lh + Vh + 4h:
    # blocks, the tied embedding, the embedding LayerNorm and the final LayerNorm.
    spec = get_preset("bloom-176b")
    l, h, v = 70, 14336, 250880
    assert total_params(spec) == 12 * l * h * h + 13 * l * h + v * h + 4 * h == 176_247_271_424
    assert spec.position == "alibi" and embedding_params(spec) == v * h + 2 * h


@pytest.mark.parametrize("name,published", [("opt-30b", 30e9), ("opt-66b", 66e9), ("opt-175b", 175e9)])
def test_opt_matches_paper(name, published):
    # Zhang et al. 2022, OPT (arXiv:2205.01068) Table 1: the model names are their sizes.
    assert rel(total_params(get_preset(name)), published) < 0.01


def test_gpt_neox_20b_matches_model_card_exactly():
    # EleutherAI/gpt-neox-20b model card: 20,554,567,680 parameters (paper, arXiv:2204.06745: 20.6B).
    spec = get_preset("gpt-neox-20b")
    assert total_params(spec) == 20_554_567_680 and rel(total_params(spec), 20.6e9) < 0.01
    assert spec.parallel_residual and not spec.tied_embeddings


def test_gpt2_small_is_124m():
    # Radford et al. 2019 / openai-community/gpt2 model card: "the smallest version of GPT-2, with
    # 124M parameters". Hand count: 12 blocks of 12h^2 + 13h, (V + 1024)h embeddings, final LN 2h.
    spec = get_preset("gpt2")
    h, v = 768, 50257
    assert total_params(spec) == 12 * (12 * h * h + 13 * h) + (v + 1024) * h + 2 * h
    assert rel(total_params(spec), 124e6) < 0.01


def test_new_preset_names():
    new = {"gpt-oss-20b", "gpt-oss-120b", "kimi-k2", "deepseek-v3.2", "bloom-176b", "opt-30b", "opt-66b",
           "opt-175b", "gpt2", "gpt-neox-20b", "llama4-scout"}
    assert new <= set(PRESETS)


# ---------------------------------------------------------------- hand-counted tiny models
def test_tiny_gpt_oss_style_by_hand():
    # 2 layers (sliding, full), d=8, 2 heads x 4, 1 KV head, biases, sinks, 4 experts (width 4) top-2,
    # SwiGLU, RMSNorm, vocab 10, untied:
    #   q 8*8+8=72, k 8*4+4=36, v 36, o 8*8+8=72, sinks 2            -> attention 218
    #   router 8*4 + 4 bias = 36; expert 3*8*4 + (2*4 + 8) bias = 112 -> 4 experts 448
    #   norms 2*8 = 16                                               -> layer 218 + 36 + 448 + 16 = 718
    #   embedding 80, head 8 + 80 = 88                               -> total 2*718 + 168 = 1604
    #   active layer: 218 + 36 + 2*112 + 16 = 494                    -> active 2*494 + 168 = 1156
    spec = ModelSpec("tiny-oss", 2, 8, 2, 1, 4, 10, ffn="swiglu", bias=True, n_experts=4, top_k=2,
                     attention_sinks=True, layer_types=("sliding", "full"), sliding_window=3)
    assert layer_params(spec, 0) == layer_params(spec, 1) == 718
    assert total_params(spec) == 1604 and active_params(spec) == 1156


def test_tiny_bloom_and_opt_by_hand():
    # BLOOM-style, 1 layer d=4, 2 heads, gelu 16, vocab 10, LayerNorm, biases, tied, ALiBi:
    #   qkv 4*12+12, out 4*4+4, fc1 4*16+16, fc2 16*4+4, 2 LN 16 -> 244 (as tiny GPT, no positions)
    #   embedding 40 + embedding LN 8 = 48; head: final LN 8      -> total 300
    bloom = ModelSpec("tiny-bloom", 1, 4, 2, 2, 16, 10, ffn="gelu", tied_embeddings=True, position="alibi",
                      norm="layernorm", bias=True, embedding_norm=True)
    assert layer_params(bloom) == 244 and embedding_params(bloom) == 48 and total_params(bloom) == 300
    # OPT-style: learned positions of 6 + 2 offset rows -> embedding 40 + 8*4 = 72; total 244 + 72 + 8 = 324
    opt = ModelSpec("tiny-opt", 1, 4, 2, 2, 16, 10, ffn="gelu", tied_embeddings=True, position="learned",
                    max_seq_len=6, position_offset=2, norm="layernorm", bias=True)
    assert embedding_params(opt) == 72 and total_params(opt) == 324 and head_params(opt) == 8


# ---------------------------------------------------------------- per-layer attention FLOPs
def _mask_pairs(s: int, keep) -> int:
    return sum(1 for i in range(s) for j in range(s) if keep(i, j))


@pytest.mark.parametrize("s", [1, 2, 5, 8, 13])
@pytest.mark.parametrize("w", [1, 2, 3, 8, 20])
def test_causal_pairs_brute_force(s, w):
    slide = ModelSpec("p", 2, 8, 2, 2, 8, 10, layer_types=("sliding", "chunked"), sliding_window=w,
                      attention_chunk=w)
    assert causal_pairs(slide, s, 0) == _mask_pairs(s, lambda i, j: 0 <= i - j < w)
    assert causal_pairs(slide, s, 1) == _mask_pairs(s, lambda i, j: j <= i and i // w == j // w)
    assert causal_pairs(slide, s, None) == _mask_pairs(s, lambda i, j: j <= i)
    # the count in the full layer's convention, 2P - s, is the mask made symmetric: a full layer's s^2
    entries = 2 * causal_pairs(slide, s, 0) - s
    assert entries == _mask_pairs(s, lambda i, j: abs(i - j) < w)
    assert 2 * causal_pairs(slide, s, 1) - s == _mask_pairs(s, lambda i, j: i // w == j // w)


def test_sliding_window_flops_by_hand():
    # 2 layers (sliding w=3, full), 2 heads x 4, s=5, b=1. Sliding: query i sees min(i+1, 3) keys:
    # 1+2+3+3+3 = 12 causal pairs -> 2*12 - 5 = 19 score entries (full: 25).
    # Attention core = 2 * b * entries * heads * (2 * head_dim): 2*19*2*8 = 608; full 2*25*2*8 = 800.
    spec = ModelSpec("tiny-swa", 2, 8, 2, 2, 16, 10, ffn="swiglu", layer_types=("sliding", "full"),
                     sliding_window=3)
    assert attention_core_flops(spec, 1, 5, layer_index=0) == 608
    assert attention_core_flops(spec, 1, 5, layer_index=1) == 800 == attention_core_flops(spec, 1, 5)
    assert attention_core_flops(spec, 1, 5, tp=2, layer_index=0) == 304
    # a window of s or more is a full layer; a window of one key leaves the diagonal (s entries)
    wide = dataclasses.replace(spec, sliding_window=5)
    assert attention_core_flops(wide, 1, 5, layer_index=0) == 800
    assert attention_core_flops(dataclasses.replace(spec, sliding_window=1), 1, 5, layer_index=0) == 2 * 5 * 2 * 8
    # model FLOPs: 3 x (2 * tokens * matmul weights + attention); matmul weights per layer
    # 4*8*8 (attention) + 3*8*16 (SwiGLU) = 640, LM head 80 -> 2 * 640 + 80 = 1360; tokens 5
    assert model_flops_per_step(spec, 5, 5) == 3 * (2 * 5 * 1360 + 608 + 800)
    # layer_flops uses the block's own attention: B = G + 2A with A = 608 for the sliding block
    g = layer_flops(spec, 1, 5, layer_index=0)
    assert g.backward_input - g.forward == 608 and layer_flops(spec, 1, 5, layer_index=1).forward - g.forward == 192


def test_chunked_attention_flops_by_hand():
    # Llama-4 style chunk 4 over s=10: chunks 4, 4, 2 -> squares 16 + 16 + 4 = 36 score entries.
    spec = ModelSpec("tiny-chunk", 1, 8, 2, 2, 16, 10, layer_types=("chunked",), attention_chunk=4)
    assert attention_core_flops(spec, 2, 10, layer_index=0) == 2 * 2 * 36 * 2 * 8


def test_gpt_oss_attention_is_mostly_windowed():
    # gpt-oss-20b at s=4096: 12 full layers (s^2) and 12 windowed ones (w=128: s(2w-1) - w(w-1)).
    spec, s = get_preset("gpt-oss-20b"), 4096
    per_entry = 2.0 * 64 * 2 * 64  # b=1: 2 * heads * 2 * head_dim
    total = sum(attention_core_flops(spec, 1, s, layer_index=i) for i in range(spec.n_layers))
    assert total == per_entry * (12 * s * s + 12 * (s * 255 - 128 * 127))
    full_only = spec.n_layers * attention_core_flops(spec, 1, s)
    assert model_flops_per_step(spec, s, s) == pytest.approx(
        model_flops_per_step(dataclasses.replace(spec, layer_types=None, sliding_window=0), s, s)
        - 3 * (full_only - total), rel=1e-12)


@pytest.mark.parametrize("name", ["llama3-70b", "mixtral-8x7b", "deepseek-v3", "gpt3-175b", "qwen3-30b-a3b"])
def test_existing_models_attention_unchanged(name):
    # every existing preset has layer_types None: a layer_index changes nothing, and the
    # per-step FLOPs are still n_layers x the full-layer count
    spec = get_preset(name)
    assert spec.layer_types is None and spec.not_modelled == ()
    full = attention_core_flops(spec, 2, 4096, 4)
    assert all(attention_core_flops(spec, 2, 4096, 4, layer_index=i) == full for i in (0, spec.n_layers - 1))


# ---------------------------------------------------------------- import: fallbacks, wrappers, families
def test_kimi_k2_imports_through_architectures():
    cfg = json.loads((HF / "Kimi-K2-Instruct" / "config.json").read_text())
    assert cfg["model_type"] == "kimi_k2" and cfg["architectures"] == ["DeepseekV3ForCausalLM"]
    spec = model_from_hf_config(HF / "Kimi-K2-Instruct" / "config.json")
    assert spec.is_mla and spec.n_experts == 384 and spec.n_heads == 64
    assert [is_moe_layer(spec, i) for i in range(3)] == [False, True, True]


def test_text_config_wrapper_imports_the_language_model():
    vl = model_from_hf_config(HF / "Qwen3-VL-30B-A3B-Instruct" / "config.json")
    qwen3 = model_from_hf_config(HF / "Qwen3-30B-A3B" / "config.json")
    assert dataclasses.replace(vl, name=qwen3.name, max_seq_len=qwen3.max_seq_len, not_modelled=()) == qwen3
    assert len(vl.not_modelled) == 1 and "text_config" in vl.not_modelled[0]


def test_wrapper_tie_word_embeddings_is_read_from_the_wrapper(tmp_path):
    cfg = json.loads((HF / "Qwen3-VL-30B-A3B-Instruct" / "config.json").read_text())
    assert "tie_word_embeddings" not in cfg["text_config"]
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": True}))
    tied = model_from_hf_config(tmp_path / "config.json")
    untied = model_from_hf_config(HF / "Qwen3-VL-30B-A3B-Instruct" / "config.json")
    assert tied.tied_embeddings and not untied.tied_embeddings
    assert total_params(untied) - total_params(tied) == 151936 * 2048


def test_qwen35_text_config_imports_its_gated_deltanet_layers():
    # Qwen3.5's linear_attention layers are Gated DeltaNet mixers (parsim.model.hf_gdn): 397B total
    p = HF / "Qwen3.5-397B-A17B" / "config.json"
    m = model_from_hf_config(p)
    assert m.hybrid_pattern.count("G") == 45 and abs(total_params(m) / 397e9 - 1) < 0.01
    assert len(m.not_modelled) == 1 and "text_config" in m.not_modelled[0]


def test_bloom_config_imports_to_the_preset(tmp_path):
    # the BLOOM class's key names (n_embed, n_layer, n_head) with the 176B hyperparameters above
    cfg = {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 14336, "n_layer": 70,
           "n_head": 112, "vocab_size": 250880}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = model_from_hf_config(tmp_path / "config.json")
    ref = get_preset("bloom-176b")
    assert dataclasses.replace(spec, name=ref.name, max_seq_len=ref.max_seq_len) == ref
    # older BLOOM configs say num_attention_heads / hidden_size: the same model
    old = {"model_type": "bloom", "hidden_size": 14336, "n_layer": 70, "num_attention_heads": 112,
           "vocab_size": 250880}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert total_params(model_from_hf_config(tmp_path / "config.json")) == 176_247_271_424


def _edited(tmp_path: Path, directory: str, edit) -> Path:
    cfg = json.loads((HF / directory / "config.json").read_text())
    edit(cfg)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def _set(key, value):
    return lambda c: c.__setitem__(key, value)


@pytest.mark.parametrize("directory,edit,key", [
    ("gpt-oss-20b", _set("attention_bias", False), "attention_bias"),
    ("gpt-oss-20b", _set("layer_types", ["sliding_attention"] * 3), "layer_types"),
    ("gpt-oss-20b", _set("layer_types", ["linear_attention"] * 24), "layer_types"),
    ("gpt-oss-20b", _set("sliding_window", None), "sliding_window"),
    ("opt-66b", _set("word_embed_proj_dim", 512), "word_embed_proj_dim"),
    ("opt-66b", _set("do_layer_norm_before", False), "do_layer_norm_before"),
    ("opt-66b", _set("enable_bias", False), "enable_bias"),
    ("gpt2", _set("add_cross_attention", True), "add_cross_attention"),
    ("gpt2", _set("n_layer", "12"), "n_layer"),
    ("gpt-neox-20b", _set("attention_bias", False), "attention_bias"),
    ("Llama-4-Scout-17B-16E-Instruct", lambda c: c["text_config"].__setitem__("moe_layers", [0, 1, 5]),
     "text_config.moe_layers"),
    ("Llama-4-Scout-17B-16E-Instruct", lambda c: c["text_config"].__setitem__("interleave_moe_layer_step", 2),
     "text_config.intermediate_size_mlp"),  # dense layers appear: their width must be given (it is)
    ("Llama-4-Scout-17B-16E-Instruct", lambda c: c.__setitem__("text_config", [1]), "text_config"),
    ("Qwen3-VL-30B-A3B-Instruct", lambda c: c["text_config"].__setitem__("attn_output_gate", True),
     "text_config.attn_output_gate"),
    ("Qwen3-VL-30B-A3B-Instruct", lambda c: c["text_config"].__setitem__("model_type", ["qwen3"]),
     "text_config.model_type"),
    ("Kimi-K2-Instruct", _set("architectures", "DeepseekV3ForCausalLM"), "architectures"),
    ("Llama-4-Scout-17B-16E-Instruct", lambda c: c["text_config"].__setitem__("no_rope_layer_interval", 0),
     "text_config.no_rope_layer_interval"),
])
def test_unsupported_values_name_file_and_key(tmp_path, directory, edit, key):
    p = _edited(tmp_path, directory, edit)
    if key == "text_config.intermediate_size_mlp":
        # Scout's config does give intermediate_size_mlp: every other layer dense imports fine,
        # and removing the width then is an error naming it
        spec = model_from_hf_config(p)
        assert spec.n_moe_layers == 24 and layer_params(spec, 0) < layer_params(spec, 1)
        p = _edited(tmp_path, directory, lambda c: (c["text_config"].__setitem__("interleave_moe_layer_step", 2),
                                                    c["text_config"].pop("intermediate_size_mlp")))
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert str(e.value).startswith(f"{p}: {key}: ") and "\n" not in str(e.value)


def test_llama4_dense_layers_use_intermediate_size_mlp(tmp_path):
    # Maverick-style interleaving (step 2): MoE on odd layers, dense FFN of intermediate_size_mlp on even
    p = _edited(tmp_path, "Llama-4-Scout-17B-16E-Instruct",
                lambda c: c["text_config"].__setitem__("interleave_moe_layer_step", 2))
    spec = model_from_hf_config(p)
    assert [is_moe_layer(spec, i) for i in range(4)] == [False, True, False, True]
    d, attn = 5120, 5120 * 40 * 128 * 2 + 2 * 5120 * 8 * 128
    assert layer_params(spec, 0) == attn + 3 * d * 16384 + 2 * d


def test_mistral_sliding_window_is_named_not_dropped():
    spec = model_from_hf_config(HF / "Mistral-7B-v0.1" / "config.json")
    assert spec.layer_types is None
    assert spec.not_modelled == ("sliding_window=4096: every layer counted as full attention",)


# ---------------------------------------------------------------- the spec's new fields
@pytest.mark.parametrize("fields,key", [
    ({"layer_types": ["full"]}, "model.layer_types"),
    ({"layer_types": ["full", "local"]}, "model.layer_types"),
    ({"layer_types": ["sliding", "full"]}, "model.sliding_window"),
    ({"layer_types": ["chunked", "full"]}, "model.attention_chunk"),
    ({"sliding_window": -1}, "model.sliding_window"),
    ({"attention_sinks": 1}, "model.attention_sinks"),
    ({"position": "sinusoidal"}, "model.position"),
    ({"not_modelled": "x"}, "model.not_modelled"),
])
def test_table_bad_attention_fields_name_key(fields, key):
    with pytest.raises(ConfigError) as e:
        model_from_table({"preset": "llama2-7b", "n_layers": 2, **fields}, "s.toml")
    assert e.value.key == key and str(e.value).startswith(f"s.toml: {key}: ")


def test_table_layer_types_list_becomes_tuple():
    spec = model_from_table({"preset": "llama2-7b", "n_layers": 2, "layer_types": ["sliding", "full"],
                             "sliding_window": 1024}, "s.toml")
    assert spec.layer_types == ("sliding", "full")
    hash(spec)
    assert attention_core_flops(spec, 1, 4096, layer_index=0) < attention_core_flops(spec, 1, 4096, layer_index=1)
