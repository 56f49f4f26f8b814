"""parsim.model: parameter counts vs published figures, FLOP formulas, HF import, strict loading."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsim.errors import ConfigError
from parsim.model import (
    Gemm,
    ModelSpec,
    active_params,
    attention_core_flops,
    embedding_params,
    get_preset,
    head_flops,
    head_gemm,
    head_params,
    is_moe_layer,
    layer_elementwise_bytes,
    layer_flops,
    layer_gemms,
    layer_params,
    megatron_flops_per_step,
    model_flops_per_step,
    model_from_hf_config,
    model_from_table,
    total_params,
)
from parsim.model.presets import PRESETS

HERE = Path(__file__).resolve().parent
HF = HERE / "data" / "hf"
_PUB = HERE / "data" / "published.json"  # a copy of ../shared/reference (DESIGN.md 8), sources per entry
PUBLISHED = {e["id"]: e for e in json.loads(_PUB.read_text())}
needs_published = pytest.mark.skipif(not PUBLISHED, reason="tests/data/published.json is empty")


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------- published parameter counts
# Exact totals as reported for the released checkpoints (HF safetensors metadata / model
# cards); GPT-3 from Brown et al. 2020 Table 2.1 ("175.0B", 174.6B in the text of later
# papers, e.g. Narayanan et al. 2021 Table 1 uses the same 12lh^2(1+13/12h+(V+s)/12lh)).
DENSE_PUBLISHED = {
    "gpt3-175b": 174.6e9,
    "llama2-7b": 6.74e9,
    "llama2-70b": 68.98e9,
    "llama3-8b": 8.03e9,
    "llama3-70b": 70.55e9,
    "llama3-405b": 405.85e9,
}


@pytest.mark.parametrize("name,published", sorted(DENSE_PUBLISHED.items()))
def test_dense_params_match_published(name, published):
    spec = get_preset(name)
    assert rel(total_params(spec), published) < 0.005
    assert active_params(spec) == total_params(spec)


MEGATRON_ROWS = ["1.7B", "3.6B", "7.5B", "18B", "39B", "76B", "145B", "310B", "530B", "1T"]


@needs_published
@pytest.mark.parametrize("row", MEGATRON_ROWS)
def test_megatron21_table1_params(row):
    e = PUBLISHED[f"megatron21-table1-{row}"]["inputs"]
    spec = get_preset(f"megatron-{row.lower()}")
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.vocab_size) == (
        e["layers"], e["hidden"], e["attention_heads"], e["vocab"])
    got = total_params(spec) / 1e9
    # The table prints 1-2 significant digits for the small rows (1.65B -> "1.7", 3.56B -> "3.6"):
    # accept 1% or half a unit of the last printed digit, whichever is larger.
    digits = str(e["params_B"]).rstrip("0").split(".")
    half_unit = 0.5 * 10 ** -(len(digits[1]) if len(digits) > 1 and digits[1] else 0)
    assert abs(got - e["params_B"]) <= max(0.01 * e["params_B"], half_unit), got


MCORE_ROWS = ["1.7B", "7.1B", "16B", "32B", "70B", "119B", "177B", "314B", "462B"]


@needs_published
@pytest.mark.parametrize("row", MCORE_ROWS)
def test_mcore_weak_scaling_presets(row):
    e = PUBLISHED[f"megatron-core-h100-weak-{row}"]["inputs"]
    spec = get_preset(f"mcore-gpt-{row.lower()}")
    assert (spec.n_layers, spec.d_model, spec.n_heads, spec.vocab_size) == (
        e["layers"], e["hidden"], e["heads"], e["vocab"])
    # The size in the model's name is a rounded label (no exact count is published).
    assert rel(total_params(spec) / 1e9, float(row[:-1])) < 0.03


# (name, total, active): Mixtral paper (46.7B / 12.9B); Mistral AI's Mixtral 8x22B release
# (141B / 39B); DeepSeek-V3 report (671B / 37B, MTP
# module excluded); Qwen3 report Table 2 (30.5B / 3.3B, 235B / 22B). Active figures are
# printed to 2-3 significant digits, hence the 2% tolerance on them.
MOE_PUBLISHED = [
    ("mixtral-8x7b", 46.7e9, 12.9e9),
    ("mixtral-8x22b", 141e9, 39e9),
    ("deepseek-v3", 671e9, 37e9),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),
    ("qwen3-235b-a22b", 235e9, 22e9),
]


@pytest.mark.parametrize("name,total,active", MOE_PUBLISHED)
def test_moe_params_match_published(name, total, active):
    spec = get_preset(name)
    assert spec.is_moe
    assert rel(total_params(spec), total) < 0.01
    assert rel(active_params(spec), active) < 0.02


def test_deepseek_v3_layer_layout():
    spec = get_preset("deepseek-v3")
    assert [is_moe_layer(spec, i) for i in range(5)] == [False, False, False, True, True]
    assert spec.n_moe_layers == 58 and spec.n_dense_layers == 3
    assert layer_params(spec, 0) < layer_params(spec, 3) == layer_params(spec)


# ---------------------------------------------------------------- hand-counted tiny models
def test_tiny_llama_style_by_hand():
    # 2 layers, d=8, 2 heads (head_dim 4), 1 KV head, SwiGLU d_ff=16, vocab 10, untied:
    #   q 8*8=64, k 8*4=32, v 32, o 8*8=64            -> attention 192
    #   gate/up/down 3*8*16                            -> 384
    #   2 RMSNorms 2*8                                 -> 16      layer = 592
    #   embedding 10*8 = 80; head = final norm 8 + 80 = 88
    #   total = 2*592 + 80 + 88 = 1352
    spec = ModelSpec("tiny", 2, 8, 2, 1, 16, 10, ffn="swiglu")
    assert layer_params(spec) == 592
    assert embedding_params(spec) == 80
    assert head_params(spec) == 88
    assert total_params(spec) == 1352 == active_params(spec)


def test_tiny_gpt_style_by_hand():
    # 2 layers, d=4, 2 heads, gelu d_ff=16, vocab 10, learned positions (6), LayerNorm, biases, tied:
    #   qkv 4*12 + 12 bias, out 4*4 + 4 bias           -> 80
    #   fc1 4*16 + 16, fc2 16*4 + 4                    -> 148
    #   2 LayerNorms 2*(4+4)                           -> 16      layer = 244
    #   embedding 10*4 + positions 6*4 = 64; head = final LayerNorm 8 (matrix tied)
    #   total = 2*244 + 64 + 8 = 560  (= 12lh^2 + 13lh + (V+s)h + 2h)
    spec = ModelSpec("tiny-gpt", 2, 4, 2, 2, 16, 10, ffn="gelu", tied_embeddings=True,
                     position="learned", max_seq_len=6, norm="layernorm", bias=True)
    assert layer_params(spec) == 244
    assert embedding_params(spec) == 64 and head_params(spec) == 8
    assert total_params(spec) == 560


def test_tiny_moe_by_hand():
    # 2 layers (layer 0 dense, layer 1 MoE), d=8, 2 heads, MHA, SwiGLU; vocab 10, untied.
    #   attention 4*64 = 256, norms 16
    #   dense layer: 256 + 16 + 3*8*16 (384)                            = 656
    #   MoE layer: router 8*4 = 32, 4 experts * 3*8*4 (96) = 384, shared 96 -> 512; = 784
    #   total = 656 + 784 + 80 + 88 = 1608
    #   active MoE layer = 256 + 16 + 32 + 2*96 + 96 = 592 -> active = 656 + 592 + 168 = 1416
    spec = ModelSpec("tiny-moe", 2, 8, 2, 2, 16, 10, ffn="swiglu", n_experts=4, top_k=2,
                     n_shared_experts=1, d_ff_expert=4, first_dense_layers=1)
    assert [is_moe_layer(spec, i) for i in range(2)] == [False, True]
    assert layer_params(spec, 0) == 656 and layer_params(spec, 1) == 784
    assert total_params(spec) == 1608
    assert active_params(spec) == 1416


def test_tiny_mla_by_hand():
    # d=16, 2 heads, q_lora 4, kv_lora 6, nope 3, rope 2, v 5:
    #   q_down 16*4=64, q_norm 4, q_up 4*2*(3+2)=40, kv_down 16*(6+2)=128, kv_norm 6,
    #   kv_up 6*2*(3+5)=96, out 2*5*16=160                       -> 498
    #   gelu d_ff 8: 2*16*8 = 256, norms 32                      -> layer 786
    spec = ModelSpec("tiny-mla", 1, 16, 2, 2, 8, 10, q_lora_rank=4, kv_lora_rank=6,
                     qk_nope_head_dim=3, qk_rope_head_dim=2, v_head_dim=5)
    assert layer_params(spec) == 786
    assert spec.head_dim_ == 5
    # attention core: QK^T over 5 dims + AV over 5 dims: 2*b*s^2*heads*(5+5)
    assert attention_core_flops(spec, 1, 4) == 2 * 16 * 2 * 10


# ---------------------------------------------------------------- FLOPs
@needs_published
@pytest.mark.parametrize("s,b", [(1024, 1), (2048, 4), (4096, 2)])
def test_layer_flops_match_zero_bubble_formulas(s, b):
    f = PUBLISHED["zb-formulas"]["expected"]["flops_per_layer"]
    assert f == {"F": "s*b*h*(24h+4s)", "B": "s*b*h*(24h+8s)", "W": "s*b*h*24h"}
    spec = get_preset("megatron-7.5b")  # d_ff = 4h, MHA; biases do not enter GEMM FLOPs
    h = spec.d_model
    pf = layer_flops(spec, b, s)
    assert pf.forward == s * b * h * (24 * h + 4 * s)
    assert pf.backward_input == s * b * h * (24 * h + 8 * s)
    assert pf.backward_weight == s * b * h * 24 * h
    assert pf.backward == pf.backward_input + pf.backward_weight


@needs_published
@pytest.mark.parametrize("row", MEGATRON_ROWS)
def test_megatron_formula_reproduces_iteration_time(row):
    e = PUBLISHED[f"megatron21-table1-{row}"]
    inp, exp = e["inputs"], e["expected"]
    spec = get_preset(f"megatron-{row.lower()}")
    flops = megatron_flops_per_step(spec, inp["global_batch"], inp["seq_len"], recompute=True)
    t = flops / (inp["gpus"] * exp["achieved_TFLOPs_per_GPU"] * 1e12)
    assert rel(t, exp["derived_iteration_time_s"]) < 0.01


@pytest.mark.parametrize("name", ["gpt3-175b", "megatron-1t", "megatron-1.7b"])
def test_model_flops_equal_megatron_without_recompute(name):
    spec = get_preset(name)
    b, s = 8, 2048
    assert rel(model_flops_per_step(spec, b * s, s), megatron_flops_per_step(spec, b, s, False)) < 1e-12
    # and with recompute the blocks run one more forward: 4/3 of the block part
    head = 6.0 * b * s * spec.d_model * spec.vocab_size
    assert rel(megatron_flops_per_step(spec, b, s, True) - head,
               4 / 3 * (megatron_flops_per_step(spec, b, s, False) - head)) < 1e-12


def test_model_flops_are_6_active_params_plus_attention():
    for name in ("llama3-8b", "mixtral-8x7b", "qwen3-30b-a3b"):
        spec = get_preset(name)
        s, tokens = 4096, 4096 * 8
        attn = 3 * spec.n_layers * attention_core_flops(spec, tokens / s, s)
        approx = 6 * tokens * (active_params(spec) - embedding_params(spec))
        assert rel(model_flops_per_step(spec, tokens, s) - attn, approx) < 1e-3  # norms/biases only


def test_model_flops_match_forward_passes():
    # for token counts that split evenly over experts, model FLOPs == 3 x sum of per-layer forwards
    for name in ("llama2-70b", "deepseek-v3", "mixtral-8x7b"):
        spec = get_preset(name)
        b, s = 2, 4096
        fwd = sum(layer_flops(spec, b, s, layer_index=i).forward for i in range(spec.n_layers))
        fwd += head_flops(spec, b, s).forward
        assert rel(model_flops_per_step(spec, b * s, s), 3 * fwd) < 1e-12


@pytest.mark.parametrize("name,tps", [("gpt3-175b", [2, 4, 8]), ("llama3-70b", [2, 4, 8]),
                                      ("llama3-405b", [8]), ("mixtral-8x7b", [2, 8])])
def test_gemm_flops_shard_by_tp(name, tps):
    spec = get_preset(name)
    tokens = 4096
    li = spec.n_layers - 1
    def dense_part(gs):  # the router is replicated on every TP rank (as in Megatron)
        return sum(g.flops for g in gs if g.name != "router")
    full = dense_part(layer_gemms(spec, tokens, 1, li))
    for t in tps:
        assert dense_part(layer_gemms(spec, tokens, t, li)) * t == full
        assert head_gemm(spec, tokens, t).n * t >= spec.vocab_size
        if not spec.is_moe:
            assert layer_flops(spec, 2, 2048, t).forward * t == pytest.approx(layer_flops(spec, 2, 2048).forward)


@settings(max_examples=60, deadline=None)
@given(kv=st.sampled_from([1, 2, 4, 8]), group=st.sampled_from([1, 2, 4]), hd=st.sampled_from([16, 64, 128]),
       ff=st.integers(1, 64), tp=st.sampled_from([1, 2, 4, 8]), swiglu=st.booleans(),
       tokens=st.integers(1, 5000))
def test_gemm_sharding_property(kv, group, hd, ff, tp, swiglu, tokens):
    heads = kv * group
    if kv % tp and tp % kv:
        return
    spec = ModelSpec("p", 2, heads * hd, heads, kv, ff * 8 * tp, 1000, ffn="swiglu" if swiglu else "gelu")
    one = sum(g.flops for g in layer_gemms(spec, tokens))
    sharded = sum(g.flops for g in layer_gemms(spec, tokens, tp))
    if kv % tp == 0:
        assert sharded * tp == one
    else:  # fewer KV heads than TP ranks: KV heads replicated, so a bit more than 1/tp
        assert sharded * tp >= one


def test_gemm_shapes_llama():
    spec = get_preset("llama3-8b")
    g = {x.name: x for x in layer_gemms(spec, 1024, tp=8)}
    assert g["qkv"] == Gemm("qkv", 1024, (4096 + 2 * 1024) // 8, 4096)
    assert g["attn_out"] == Gemm("attn_out", 1024, 4096, 512)
    assert g["gate"].n == g["up"].n == g["down"].k == 14336 // 8
    assert Gemm("x", 2, 3, 5, count=7).flops == 2 * 2 * 3 * 5 * 7


def test_moe_gemms():
    spec = get_preset("mixtral-8x7b")
    g = {x.name: x for x in layer_gemms(spec, 4096)}
    assert g["router"] == Gemm("router", 4096, 8, 4096)
    assert g["expert_gate"] == Gemm("expert_gate", 4096 * 2 // 8, 14336, 4096, count=8)
    ds = {x.name: x for x in layer_gemms(get_preset("deepseek-v3"), 4096, tp=8, layer_index=10)}
    assert ds["shared_up"].n == 2048 // 8 and ds["expert_down"].count == 256
    assert ds["q_down"].n == 1536 and ds["kv_down"].n == 512 + 64  # replicated down-projections
    assert ds["q_up"].n == 16 * 192 and ds["attn_out"].k == 16 * 128


def test_elementwise_bytes_estimate():
    spec = get_preset("llama3-70b")
    base = layer_elementwise_bytes(spec, 4096)
    assert base > 0
    assert layer_elementwise_bytes(spec, 4096, bytes_per_el=4) == 2 * base
    assert layer_elementwise_bytes(spec, 4096, tp=1, sp=True) == base
    # sequence parallelism splits the norms and residual adds over TP ranks
    assert layer_elementwise_bytes(spec, 4096, tp=8, sp=True) < layer_elementwise_bytes(spec, 4096, tp=8)
    assert layer_elementwise_bytes(spec, 8192) == 2 * base


def test_elementwise_bytes_rotate_only_rotary_models():
    """Hand count per token (elements): norms 2 x (d + d), residual adds 2 x 3d, GeLU 2 d_ff,
    and RoPE's read + write of q and k only when positions are rotary."""
    from dataclasses import replace
    gpt = ModelSpec(name="t", n_layers=2, d_model=256, n_heads=4, n_kv_heads=4, d_ff=1024, vocab_size=1024,
                    ffn="gelu", position="learned", norm="layernorm")
    assert layer_elementwise_bytes(gpt, 10, bytes_per_el=4) == 10 * (4 * 256 + 6 * 256 + 2 * 1024) * 4
    rotary = replace(gpt, position="rope")
    assert layer_elementwise_bytes(rotary, 10, bytes_per_el=4) - layer_elementwise_bytes(gpt, 10, bytes_per_el=4) \
        == 10 * 2 * (4 + 4) * 64 * 4


# ---------------------------------------------------------------- HF import
@pytest.mark.parametrize("directory,preset", [
    ("Meta-Llama-3-8B", "llama3-8b"),
    ("Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("DeepSeek-V3", "deepseek-v3"),
    ("Qwen3-30B-A3B", "qwen3-30b-a3b"),
])
def test_hf_import_reproduces_presets(directory, preset):
    spec = model_from_hf_config(HF / directory / "config.json")
    ref = get_preset(preset)
    assert spec.name == directory
    assert total_params(spec) == total_params(ref)
    assert active_params(spec) == active_params(ref)
    # the checkpoint's multi-token-prediction modules come with the config (DeepSeek-V3: 1);
    # presets train none unless a scenario asks (tests/test_mtp.py)
    assert spec.mtp_layers == (1 if preset == "deepseek-v3" else 0) and ref.mtp_layers == 0
    assert dataclasses.replace(spec, name=ref.name, max_seq_len=ref.max_seq_len, mtp_layers=0) == ref


# HF model cards / safetensors totals: Mistral-7B-v0.1 7.24B, Qwen2-7B 7.62B (7,615,616,512),
# Qwen1.5-MoE-A2.7B 14.3B total / 2.7B activated (Qwen blog; its 1-column shared-expert gate is not counted).
@pytest.mark.parametrize("directory,total,active", [
    ("Mistral-7B-v0.1", 7.24e9, 7.24e9),
    ("Qwen2-7B", 7.62e9, 7.62e9),
    ("Qwen1.5-MoE-A2.7B", 14.3e9, 2.7e9),
])
def test_hf_import_other_key_styles(directory, total, active):
    spec = model_from_hf_config(HF / directory / "config.json")
    assert rel(total_params(spec), total) < 0.005
    assert rel(active_params(spec), active) < 0.01


def test_hf_import_errors_name_file_and_key(tmp_path):
    cfg = json.loads((HF / "Meta-Llama-3-8B" / "config.json").read_text())
    del cfg["num_hidden_layers"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert str(p) in str(e.value) and "num_hidden_layers" in str(e.value)
    # an unknown model_type with no known class in architectures (Kimi-K2's kimi_k2 has one); a
    # known family parsim does not model (mamba) is named as such (tests/test_hf_families.py)
    p.write_text(json.dumps({**cfg, "model_type": "xformerzilla", "architectures": ["XformerzillaForCausalLM"]}))
    with pytest.raises(ConfigError, match="unsupported 'xformerzilla'"):
        model_from_hf_config(p)
    p.write_text(json.dumps({**cfg, "model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(ConfigError, match="'mamba' has state-space"):
        model_from_hf_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        model_from_hf_config(tmp_path / "missing.json")


def test_hf_moe_layer_frequency_conventions(tmp_path):
    qwen = json.loads((HF / "Qwen1.5-MoE-A2.7B" / "config.json").read_text())
    (tmp_path / "q.json").write_text(json.dumps({**qwen, "decoder_sparse_step": 2}))
    spec = model_from_hf_config(tmp_path / "q.json")  # HF Qwen: MoE iff (i+1) % 2 == 0
    assert [is_moe_layer(spec, i) for i in range(4)] == [False, True, False, True]
    ds = json.loads((HF / "DeepSeek-V3" / "config.json").read_text())
    (tmp_path / "d.json").write_text(json.dumps({**ds, "moe_layer_freq": 2}))
    spec = model_from_hf_config(tmp_path / "d.json")  # HF DeepSeek: i >= 3 and i % 2 == 0
    assert [i for i in range(10) if is_moe_layer(spec, i)] == [4, 6, 8]


# ---------------------------------------------------------------- [model] table
def test_table_unknown_key_names_file_and_key():
    with pytest.raises(ConfigError) as e:
        model_from_table({"preset": "llama3-8b", "n_layer": 3}, "scenarios/x.toml")
    assert str(e.value).startswith("scenarios/x.toml: model.n_layer: unknown key")


def test_table_preset_with_overrides():
    spec = model_from_table({"preset": "llama3-8b", "n_layers": 4}, "x.toml")
    assert spec.n_layers == 4 and spec.d_model == 4096


def test_table_explicit_fields():
    spec = model_from_table({"n_layers": 2, "d_model": 8, "n_heads": 2, "d_ff": 16, "vocab_size": 10,
                             "ffn": "swiglu"}, "x.toml")
    assert spec.n_kv_heads == 2 and spec.name == "custom"
    with pytest.raises(ConfigError, match="x.toml: model.vocab_size: missing"):
        model_from_table({"n_layers": 2, "d_model": 8, "n_heads": 2, "d_ff": 16}, "x.toml")


def test_table_hf_config_relative_to_scenario():
    spec = model_from_table({"hf_config": "hf/Mixtral-8x7B-v0.1/config.json"}, str(HERE / "data" / "s.toml"))
    assert total_params(spec) == total_params(get_preset("mixtral-8x7b"))


@pytest.mark.parametrize("table,key", [
    ({"preset": "gpt-5"}, "model.preset"),
    ({"preset": "llama3-8b", "n_kv_heads": 5}, "model.n_kv_heads"),
    ({"preset": "llama3-8b", "n_heads": 24, "n_kv_heads": 8}, "model.n_heads"),  # 4096 % 24
    ({"preset": "llama3-8b", "ffn": "relu2"}, "model.ffn"),
    ({"preset": "llama3-8b", "n_layers": 0}, "model.n_layers"),
    ({"preset": "llama3-8b", "d_model": "4096"}, "model.d_model"),
    ({"preset": "llama3-8b", "tied_embeddings": 1}, "model.tied_embeddings"),
    ({"preset": "llama3-8b", "n_layers": True}, "model.n_layers"),
    ({"preset": "mixtral-8x7b", "top_k": 9}, "model.top_k"),
    ({"preset": "llama3-8b", "hf_config": "a.json"}, "model.hf_config"),
])
def test_table_bad_values_name_key(table, key):
    with pytest.raises(ConfigError) as e:
        model_from_table(table, "s.toml")
    assert e.value.file == "s.toml" and e.value.key == key
    assert str(e.value).startswith(f"s.toml: {key}: ")


def test_unknown_preset_lists_known():
    with pytest.raises(ConfigError, match="unknown preset 'nope' .*llama3-8b"):
        get_preset("nope")


def test_preset_names_are_stable():
    required = {"gpt3-175b", "llama2-7b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b",
                "mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b"}
    required |= {f"megatron-{r.lower()}" for r in MEGATRON_ROWS}
    required |= {f"mcore-gpt-{r.lower()}" for r in MCORE_ROWS}
    assert required <= set(PRESETS)
    assert all(PRESETS[n].name == n for n in PRESETS)
