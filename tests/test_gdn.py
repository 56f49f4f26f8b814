"""Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): the spec, its counts, its costs, its imports and its
inference.

Oracles: published totals ("80B total, 3B active"; "397B total, 17B activated") within 1% where the
rounding allows; sums by hand of the modules' tensors (Transformers' ``Qwen3NextGatedDeltaNet``, its
gated attention, Megatron-Core's ``GatedDeltaNet``); Megatron's ``gdn_layer_flops`` by hand; the
chunked algorithm's FLOPs counted kernel by kernel against its closed form; the delta rule's rate
fit (``benchmarks/fit_gdn_scan.py``) against rows it was not fitted on; two sources of one
architecture agreeing (the presets, the HF configs).
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from parsim.cluster.hardware import load_profile
from parsim.costs.gdn import DeltaShape, backward_kernels, delta_times, forward_kernels
from parsim.costs.inference import cache_bytes_per_sequence, gdn_state_bytes, kv_bytes_per_sequence, pass_cost
from parsim.costs.memory import ActivationOptions, block_stash
from parsim.errors import ConfigError
from parsim.model import (
    ModelSpec,
    gdn_mixer_params,
    gdn_scan_flops,
    get_preset,
    layer_gemms,
    megatron_flops_per_step,
    model_from_hf_config,
    uniform_model,
)
from parsim.model.shapes import active_params, embedding_params, layer_params, mtp_params, total_params
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
HF = Path(__file__).parent / "data" / "hf"
NEXT = "qwen3-next-80b-a3b"


# ---------------------------------------------------------------- counts
def test_gdn_mixer_weights_by_hand():
    # Qwen3-Next-80B's linear_attn tensors: in_proj_qkvz [12288, 2048], in_proj_ba [64, 2048], conv1d
    # [8192, 1, 4] (no bias), dt_bias and A_log [32], norm [128], out_proj [2048, 4096]
    m = get_preset(NEXT)
    assert gdn_mixer_params(m) == 12288 * 2048 + 64 * 2048 + 8192 * 4 + 2 * 32 + 128 + 2048 * 4096
    assert layer_params(m, 0) == gdn_mixer_params(m) + 2048  # its pre-norm


def test_gated_attention_weights_by_hand():
    # q_proj [16 x 256 x 2 (query and gate), 2048], k_proj and v_proj [512, 2048], o_proj [2048, 4096],
    # q_norm and k_norm [256]; the layer's pre-norm [2048]
    m = get_preset(NEXT)
    assert m.hybrid_pattern[6] == "*"
    assert layer_params(m, 6) == 8192 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 2 * 256 + 2048
    plain = dataclasses.replace(m, attn_output_gate=False)
    assert layer_params(m, 6) - layer_params(plain, 6) == 4096 * 2048


def test_moe_layer_by_hand():
    # router [512, 2048], 512 experts and one shared expert of three [512, 2048] matrices, pre-norm;
    # the shared expert's one-column gate is not counted (as Qwen2-MoE's)
    m = get_preset(NEXT)
    assert layer_params(m, 1) == 512 * 2048 + 513 * 3 * 512 * 2048 + 2048


@pytest.mark.parametrize("preset,total,active", [
    (NEXT, 80e9, 3.9e9),                   # "80B total parameters, only 3B active"; NVIDIA's card: 3.9B active
    ("qwen3.5-397b-a17b", 397e9, 17.35e9),  # "397B total parameters, 17B activated" (rounded: see below)
])
def test_published_totals(preset, total, active):
    m = get_preset(preset)
    assert abs(total_params(m) / total - 1) < 0.01
    assert abs(active_params(m) / active - 1) < 0.01


@pytest.mark.parametrize("directory,total", [
    # Megatron-Bridge docs/models/qwen/qwen35-vl.md: "27B parameter vision-language model", "35B total
    # parameters, 3B activated per token", "122B total parameters, 10B activated per token" (the vision
    # tower, ~0.4B, is outside text_config)
    ("Qwen3.5-27B", 27e9), ("Qwen3.5-35B-A3B", 35e9), ("Qwen3.5-122B-A10B", 122e9)])
def test_qwen35_family_totals(directory, total):
    m = model_from_hf_config(HF / directory / "config.json")
    assert abs(total_params(m) / total - 1) < 0.01 and m.mtp_layers == 1


def test_qwen35_dense_blocks_by_hand():
    m = model_from_hf_config(HF / "Qwen3.5-27B" / "config.json")
    assert set(m.hybrid_pattern[1::2]) == {"-"} and m.mtp_pattern == "*-" and not m.is_moe
    assert layer_params(m, 1) == 3 * 5120 * 17408 + 5120  # a SwiGLU MLP and its pre-norm
    # 16 key / 48 value heads of 128: in_proj 5120 x (2 x 2048 + 2 x 6144 + 96), conv 10240 x 4
    assert layer_params(m, 0) == 5120 * 16480 + 10240 * 4 + 96 + 128 + 6144 * 5120 + 5120


def test_qwen35_active_count_by_hand():
    # per block: 10 routed + 1 shared expert of 3 x 4096 x 1024, router 512 x 4096, two pre-norms; 45 GDN
    # mixers (in_proj 4096 x (2 x 2048 + 2 x 8192 + 128), conv 12288 x 4, 128 gates, norm 128, out
    # 8192 x 4096), 15 gated attentions (q 4096 x 16384, k/v 4096 x 512, o 8192 x 4096, q/k norms 256);
    # embedding and head 248320 x 4096 each, the final norm
    gdn = 4096 * 20608 + 12288 * 4 + 128 + 128 + 8192 * 4096
    attn = 4096 * 16384 + 2 * 4096 * 512 + 8192 * 4096 + 2 * 256
    moe = 11 * 3 * 4096 * 1024 + 512 * 4096
    expect = 45 * gdn + 15 * attn + 60 * (moe + 2 * 4096) + 2 * 248320 * 4096 + 4096
    assert active_params(get_preset("qwen3.5-397b-a17b")) == expect


def test_layer_mix_and_mtp():
    m = get_preset("qwen3.5-397b-a17b")
    assert m.hybrid_pattern.count("G") == 45 and m.hybrid_pattern.count("*") == 15
    assert m.hybrid_pattern.count("E") == 60 and m.mtp_layers == 1 and m.mtp_pattern == "*E"
    # one MTP depth: a gated-attention layer, an MoE layer, eh_proj 2d x d, three norms
    attn, moe = layer_params(m, 6), layer_params(m, 1)
    assert mtp_params(m) == attn + moe + 2 * 4096 * 4096 + 3 * 4096


# ---------------------------------------------------------------- HF import
@pytest.mark.parametrize("preset,directory", [(NEXT, "Qwen3-Coder-Next"), ("qwen3.5-397b-a17b", "Qwen3.5-397B-A17B")])
def test_hf_config_is_the_preset(preset, directory):
    got = model_from_hf_config(HF / directory / "config.json")
    ref = get_preset(preset)
    assert dataclasses.replace(got, name=ref.name, not_modelled=ref.not_modelled) == ref


def test_hf_without_layer_types_uses_the_full_attention_interval(tmp_path):
    cfg = json.loads((HF / "Qwen3-Coder-Next" / "config.json").read_text())
    del cfg["layer_types"]
    cfg["full_attention_interval"] = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_hf_config(tmp_path / "config.json")
    assert m.hybrid_pattern[:8] == "GE*EGE*E"


def test_hf_dense_qwen35_and_sparse_step(tmp_path):
    cfg = json.loads((HF / "Qwen3-Coder-Next" / "config.json").read_text())
    cfg["decoder_sparse_step"], cfg["mlp_only_layers"] = 2, [1]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_hf_config(tmp_path / "config.json")
    # MoE where (i + 1) % 2 == 0 and i not in mlp_only_layers: block 1 is dense, block 3 MoE
    assert m.hybrid_pattern[:8] == "G-G-G-*E"
    assert layer_params(m, 1) == 3 * 2048 * 5120 + 2048


@pytest.mark.parametrize("edit,key", [
    (lambda c: c["text_config"].__setitem__("layer_types", ["mamba"] * 60), "text_config.layer_types"),
    (lambda c: c["text_config"].__setitem__("hidden_act", "gelu"), "text_config.hidden_act"),
    (lambda c: c["text_config"].__setitem__("linear_num_key_heads", 48), "text_config.linear_num_key_heads"),
    (lambda c: c["text_config"].__setitem__("layer_types", ["full_attention"] * 59), "text_config.layer_types"),
])
def test_hf_refusals_name_file_and_key(tmp_path, edit, key):
    cfg = json.loads((HF / "Qwen3.5-397B-A17B" / "config.json").read_text())
    edit(cfg)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert str(e.value).startswith(f"{p}: {key}:") and "\n" not in str(e.value)


@pytest.mark.parametrize("fields,key", [
    ({"hybrid_pattern": "GE", "n_layers": 2, "n_experts": 8, "top_k": 2}, "gdn_key_heads"),
    ({"hybrid_pattern": "GE", "n_layers": 2, "n_experts": 8, "top_k": 2, "gdn_key_heads": 3,
      "gdn_value_heads": 8}, "gdn_key_heads"),
    ({"gdn_value_heads": 8}, "gdn_value_heads"),
    ({"attn_output_gate": True, "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
      "qk_rope_head_dim": 8, "v_head_dim": 16}, "attn_output_gate"),
])
def test_spec_refusals(fields, key):
    base = dict(name="x", n_layers=2, d_model=256, n_heads=4, n_kv_heads=4, d_ff=512, vocab_size=1000)
    with pytest.raises(ConfigError) as e:
        ModelSpec(**{**base, **fields})
    assert e.value.key == f"model.{key}"


# ---------------------------------------------------------------- FLOPs
def test_kernel_flops_sum_to_the_closed_form():
    s = DeltaShape(2, 4096, 8, 128, 128, 64)
    fwd = sum(k.flops for k in forward_kernels(s, 2))
    m = dataclasses.replace(uniform_model(get_preset(NEXT), "G"), gdn_value_heads=8, gdn_key_heads=8)
    assert fwd == pytest.approx(gdn_scan_flops(m, 2 * 4096))
    # per token and head: 6 C K + 4 C V + 6 K V + C^2 / 3
    assert fwd / (2 * 4096 * 8) == pytest.approx(6 * 64 * 128 + 4 * 64 * 128 + 6 * 128 * 128 + 64 * 64 / 3)
    assert 2.0 < sum(k.flops for k in backward_kernels(s, 2)) / fwd < 3.0


def test_megatron_gdn_flops_by_hand():
    # Megatron's gdn_layer_flops for Qwen3-Next-80B: 2 (h in_proj + K conv + 4 Hv dv^2 + h v_dim) a token
    m = get_preset(NEXT)
    per_token = 2 * (2048 * 12352 + 4 * 8192 + 4 * 32 * 128 ** 2 + 2048 * 4096)
    assert per_token == 71_630_848
    only_gdn = dataclasses.replace(m, hybrid_pattern="G" * m.n_layers, n_experts=0, top_k=1,
                                   n_shared_experts=0, d_ff_shared=None)
    head = 2 * 2048 * 151936
    assert megatron_flops_per_step(only_gdn, 1, 4096, recompute=False) == pytest.approx(
        3 * 4096 * (96 * per_token + head))


def test_megatron_gated_attention_counts_the_gate_projection():
    m = get_preset(NEXT)
    attn = dataclasses.replace(m, hybrid_pattern="*" * m.n_layers, n_experts=0, top_k=1, n_shared_experts=0,
                               d_ff_shared=None)
    plain = dataclasses.replace(attn, attn_output_gate=False)
    gap = megatron_flops_per_step(attn, 1, 4096, False) - megatron_flops_per_step(plain, 1, 4096, False)
    assert gap == pytest.approx(3 * 96 * 2 * 4096 * 2048 * 4096)  # 3 x layers x 2 t h (heads x head dim)


def test_gemms_per_tp_rank():
    m = uniform_model(get_preset(NEXT), "G")
    g = {x.name: x for x in layer_gemms(m, 4096, tp=2)}
    # this rank's 8 key heads and 16 value heads: q, k (2 x 1024), v, z (2 x 2048), beta, alpha (2 x 16)
    assert (g["gdn_in_proj"].n, g["gdn_in_proj"].k) == (2 * 1024 + 2 * 2048 + 32, 2048)
    assert (g["gdn_out_proj"].n, g["gdn_out_proj"].k) == (2048, 2048)


# ---------------------------------------------------------------- the kernels' rate
def test_delta_rate_is_the_documented_fit_and_holds_off_it():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_gdn_scan
    import parsim.costs.gdn as gdn
    assert abs(fit_gdn_scan.fit() - gdn.GDN_FLOP_PER_CLOCK_PER_SM) < 0.5
    rate = gdn.GDN_FLOP_PER_CLOCK_PER_SM
    fitted = [e for _, e in fit_gdn_scan.errors(rate, fit_gdn_scan.fitted)]
    assert len(fitted) == 160 and sum(map(abs, fitted)) / len(fitted) < 0.10
    held = [e for _, e in fit_gdn_scan.errors(rate, lambda r: r["gpu"] == "GB200")]
    assert len(held) == 812 and sum(map(abs, held)) / len(held) < 0.30  # the docstring's 26%


def test_few_heads_leave_the_state_kernels_idle():
    dev = load_profile("dgx-h100").device
    f8 = delta_times(dev, DeltaShape(1, 8192, 8, 128, 128), "bf16")[0]
    f64 = delta_times(dev, DeltaShape(1, 8192, 64, 128, 128), "bf16")[0]
    assert f64 / f8 < 8  # 16 state blocks of 132 SMs against 128: less than linear in heads
    fb = delta_times(dev, DeltaShape(1, 8192, 64, 128, 128), "bf16")
    assert fb[2:] == (6, 7) and 1.8 < fb[1] / fb[0] < 3.5


# ---------------------------------------------------------------- costs and scenarios
def _doc(**over) -> dict:
    doc = {"name": "qn", "hardware": "dgx-h100", "gpus": 32, "model": {"preset": NEXT},
           "training": {"global_batch": 64, "microbatch_size": 1, "seq_len": 4096, "precision": "bf16",
                        "recompute": "selective", "recompute_modules": ["layernorm", "moe", "moe_act"]},
           "parallel": {"dp": 8, "pp": 4, "ep": 8, "zero": 1, "framework": "megatron"}}
    for k, v in over.items():
        doc[k] = {**doc.get(k, {}), **v} if isinstance(v, dict) and k != "model" else v
    return doc


def test_gdn_layer_stash_by_hand():
    m = uniform_model(get_preset(NEXT), "G")
    opts = ActivationOptions(flash_attention=True, sequence_parallel=False, dropout=False, bytes_per_element=2)
    got = sum(t.bytes for t in block_stash(m, 4096, opts, 0))
    h, width, conv, key, value, heads = 2048, 12352, 8192, 2048, 4096, 32
    # norm input and output, q|k|v|z|b|a, conv output and normed q, k, the kernel's fp32 gates, beta
    # and 64-wide triangular factor a head, its output, the gated norm's output
    assert got == (2 * h + 2 * h + 2 * width + 2 * (conv + 2 * key) + heads * (4 + 2 + 2 * 64) + 2 * value
                   + 2 * value)


def test_qwen3_next_scenario_simulates_with_megatrons_flop_count():
    sc = scenario_from_dict(_doc(), "t")
    r = simulate(sc).metrics
    assert r["fits_in_memory"] and r["params"] == total_params(get_preset(NEXT))
    flops = megatron_flops_per_step(sc.model, 64, 4096, recompute=False)
    assert r["megatron_tflops_per_gpu"] == pytest.approx(flops / r["step_time_s"] / 32 / 1e12)


@pytest.mark.parametrize("over,key", [
    ({"parallel": {"dp": 1, "pp": 1, "ep": 1, "tp": 32}}, "parallel.tp"),      # 16 key heads over tp 32
    ({"parallel": {"dp": 1, "pp": 1, "ep": 1, "cp": 8, "tp": 4}}, "parallel.cp"),  # 16 key heads over tp x cp 32
    ({"hardware": "cpu-gloo", "gpus": 32}, "hardware"),
])
def test_scenario_refusals(over, key):
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_doc(**over), "t")
    assert e.value.key == key


def test_context_parallel_gdn_layers_exchange_heads_for_sequence():
    from parsim.costs.compute import gdn_delta_times
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.layer import gdn_cp_exchange, layer_cost
    from parsim.costs.model_costs import ModelCosts
    from parsim.costs.stage import block_inputs
    one = ModelCosts(cost_inputs(scenario_from_dict(_doc(), "t"))).layer_inputs
    two = ModelCosts(cost_inputs(scenario_from_dict(_doc(parallel={"dp": 4, "cp": 2}), "t"))).layer_inputs
    g1, g2 = (layer_cost(*block_inputs(x, "G")) for x in (one, two))
    assert g1.forward.cp_comm == 0 and g2.forward.cp_comm > 0 and g2.backward_input.cp_comm == g2.forward.cp_comm
    _, sent = gdn_cp_exchange(block_inputs(two, "G")[0])
    tokens = 4096 // 2
    assert sent == pytest.approx(tokens * 2 * (12352 + 4096) / 2)  # (cp-1)/cp of q|k|v|z|b|a and of the output
    assert gdn_delta_times(block_inputs(two, "G")[0])[0] < gdn_delta_times(block_inputs(one, "G")[0])[0]


# ---------------------------------------------------------------- inference
def test_cache_is_attention_kv_plus_fixed_delta_states():
    m = get_preset(NEXT)
    layers = tuple(range(m.n_layers))
    got = cache_bytes_per_sequence(m, layers, 2, 4096, "bf16")
    state = 16 * 128 * 128 * 4 + 8192 / 2 * 3 * 2  # fp32 states of 16 value heads, a conv window of 3
    assert gdn_state_bytes(m, 2, "bf16") == state
    assert got == kv_bytes_per_sequence(m, 12, 2, 4096, "bf16") + 36 * state


def test_decode_grows_with_context_only_in_attention_layers():
    m, hw = get_preset(NEXT), load_profile("dgx-h100")

    def layer_s(context):
        return pass_cost(hw=hw, model=m, layers=tuple(range(m.n_layers)), last_stage=False, first_stage=False,
                         batch=8, new_tokens=1, context=context, tp=1, precision="bf16", weight_bits=16).layer_s

    short, long = layer_s(1024), layer_s(65536)
    grew = {i for i, (a, b) in enumerate(zip(short, long)) if b > a}
    assert grew == {i for i, c in enumerate(m.hybrid_pattern) if c == "*"}


def test_bundled_scenario_simulates_and_plan_keeps_head_splits(tmp_path):
    from parsim.scenario import load_scenario
    sc = load_scenario(ROOT / "scenarios" / "qwen3-next-80b-h100.toml")
    r = simulate(sc).metrics
    assert r["fits_in_memory"] and r["step_time_s"] > 0 and sc.model.mtp_layers == 1


QWEN3_NEXT_ARGS = (
    "--num-layers 48 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 2 "
    "--kv-channels 256 --ffn-hidden-size 5120 --swiglu --normalization RMSNorm --disable-bias-linear "
    "--untie-embeddings-and-output-weights --position-embedding-type rope --qk-layernorm --attention-output-gate "
    "--experimental-attention-variant gated_delta_net --linear-attention-freq 4 --num-experts 512 "
    "--moe-router-topk 10 --moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 512 --vocab-size 151936 "
    "--seq-length 4096 --max-position-embeddings 262144 --pipeline-model-parallel-size 4 "
    "--expert-model-parallel-size 8 --micro-batch-size 1 --global-batch-size 256 --bf16").split()


def test_megatron_gdn_command_line_imports_to_the_preset():
    # Megatron-Bridge's Qwen3-Next provider as pretrain_gpt.py flags (its defaults: 16 key, 32 value heads)
    from parsim.frameworks import check, import_megatron
    sc = check(import_megatron(QWEN3_NEXT_ARGS, gpus=32))
    assert dataclasses.replace(sc.model, name=NEXT) == get_preset(NEXT)
    # the list spelling of the same layout, and a block split stated in blocks (doubled into layers)
    listed = [a if a != "4" or QWEN3_NEXT_ARGS[i - 1] != "--linear-attention-freq" else "([1]*3+[0]*1)*12"
              for i, a in enumerate(QWEN3_NEXT_ARGS)]
    first = check(import_megatron(listed + ["--decoder-first-pipeline-num-layers", "9"], gpus=32))
    assert first.model.hybrid_pattern == sc.model.hybrid_pattern
    assert first.schedule.first_stage_layers == 18  # 9 blocks: 18 hybrid layers, the other 78 over 3 ranks


@pytest.mark.parametrize("edit,flag", [
    (lambda a: a + ["--experimental-attention-variant", "dsa"], "--experimental-attention-variant"),
    (lambda a: [x for i, x in enumerate(a) if x != "--linear-attention-freq" and a[i - 1] != "--linear-attention-freq"],
     "--linear-attention-freq"),
    (lambda a: a + ["--linear-attention-freq", "[1]*5"], "--linear-attention-freq"),
    (lambda a: a + ["--linear-num-key-heads", "7"], "model.gdn_key_heads"),
])
def test_megatron_gdn_refusals_name_the_flag(edit, flag):
    from parsim.frameworks import check, import_megatron
    with pytest.raises(ConfigError) as e:
        check(import_megatron(edit(list(QWEN3_NEXT_ARGS)), gpus=32))
    assert e.value.key == flag and "\n" not in str(e.value)


def test_infer_runs_a_gdn_model_on_replicas(tmp_path):
    # gpus beyond tp x pp are replicas (the scenario loader's own default), each serving the batch;
    # the synthesised training table used to name a global batch the file never gave
    from parsim.infer.run import load_inference, run_inference
    p = tmp_path / "qn.toml"
    p.write_text('name = "qn"\nhardware = "dgx-h100"\ngpus = 4\n[model]\npreset = "qwen3-next-80b-a3b"\n'
                 '[inference]\nbatch = 8\nprompt_tokens = 4096\ngenerate_tokens = 16\n')
    job = load_inference(p)
    assert job.scenario.parallel.dp == 4
    summary, _ = run_inference(job)
    assert summary["generate_tokens_per_s"] > 0 and not summary["fits_in_memory"]  # 148 GiB of weights a GPU


def test_kernel_deltanet_command_reproduces_a_measured_forward():
    # aiconfigurator, H100 SXM: 16 key / 32 value heads of 128, one sequence of 32,768 tokens: 4.027 ms
    # (a row the rate was fitted on: the command prints the model, launches aside)
    import subprocess
    out = subprocess.run([sys.executable, "-m", "parsim", "kernel", "deltanet", "--tokens", "32768", "--heads", "32",
                          "--hardware", "dgx-h100", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout)
    assert abs(got["time_s"] / 4.027e-3 - 1) < 0.10 and len(got["kernels"]) == 6
    assert got["state_kernels_sm_share"] == pytest.approx(64 / 132)  # 32 heads x 2 slices of 64 over 132 SMs
    back = subprocess.run([sys.executable, "-m", "parsim", "kernel", "deltanet", "--tokens", "32768", "--heads", "32",
                           "--hardware", "dgx-h100", "--backward", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert len(json.loads(back.stdout)["kernels"]) == 7
    bad = subprocess.run([sys.executable, "-m", "parsim", "kernel", "deltanet", "--tokens", "64", "--heads", "4",
                          "--hardware", "dgx-h100", "--precision", "fp8"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--precision" in bad.stderr


def test_megatron_moe_modelzoo_command_line_imports_to_the_preset():
    # yanring/Megatron-MoE-ModelZoo e8650517, model_configs/benchmarking/Qwen3-Next-80B-A3B.yaml's model
    # flags (the dev branch's --linear-attention-type spelling) with run_next_80b.sh's layout
    from parsim.frameworks import check, import_megatron
    argv = ("--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --expert-model-parallel-size 32 "
            "--expert-tensor-parallel-size 1 --use-distributed-optimizer --sequence-parallel --disable-bias-linear "
            "--micro-batch-size 1 --global-batch-size 256 --untie-embeddings-and-output-weights "
            "--position-embedding-type rope --rotary-percent 0.25 --normalization RMSNorm --apply-layernorm-1p "
            "--swiglu --num-layers 48 --hidden-size 2048 --ffn-hidden-size 5120 --num-attention-heads 16 "
            "--group-query-attention --num-query-groups 2 --kv-channels 256 --qk-layernorm --attention-output-gate "
            "--seq-length 4096 --max-position-embeddings 262144 --make-vocab-size-divisible-by 1187 "
            "--vocab-size 151936 --linear-attention-type gated_delta_net --linear-attention-freq 4 "
            "--linear-conv-kernel-dim 4 --linear-key-head-dim 128 --linear-value-head-dim 128 "
            "--linear-num-key-heads 16 --linear-num-value-heads 32 --num-experts 512 --moe-ffn-hidden-size 512 "
            "--moe-shared-expert-intermediate-size 512 --moe-router-topk 10 --moe-grouped-gemm --mtp-num-layers 1 "
            "--bf16").split()
    sc = check(import_megatron(argv, gpus=128))
    ref = dataclasses.replace(get_preset(NEXT), mtp_layers=1, mtp_pattern="*E")
    assert dataclasses.replace(sc.model, name=NEXT) == ref
    assert (sc.parallel.pp, sc.parallel.dp) == (4, 32)


def test_causal_conv_rate_is_the_documented_fit_and_holds_off_it():
    # the convolution kernel reaches 2.4 TB/s on an H100 and 2.9 on a B200: one rate per SM-clock
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_causal_conv
    import parsim.costs.memory_ops as mo
    assert abs(fit_causal_conv.fit() - mo.CONV_BYTES_PER_CLOCK_PER_SM) < 0.02
    for gpu, bound in (("H100 SXM", 0.02), ("B200", 0.12), ("GB200", 0.04)):
        e = fit_causal_conv.errors(mo.CONV_BYTES_PER_CLOCK_PER_SM, gpu)
        assert len(e) == 82 and sum(map(abs, e)) / len(e) < bound
    # the streaming rate alone misses the B200 by half
    e = fit_causal_conv.errors(1e9, "B200")
    assert sum(map(abs, e)) / len(e) > 0.5


def test_decode_step_reads_and_writes_the_fp32_state_at_hbm_rate():
    # aiconfigurator's measured fused_recurrent_gated_delta_rule decode (benchmarks/data/gdn_decode_times.csv):
    # the state, value heads x 128 x 128 fp32 a sequence, read and written once -- what parsim's decode
    # charges a "G" layer (gdn_state_bytes without the conv window, twice, at the streaming rate)
    import csv
    devs = {"H100 SXM": "dgx-h100", "B200": "dgx-b200", "GB200": "gb200-nvl72"}
    with open(ROOT / "benchmarks" / "data" / "gdn_decode_times.csv") as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    for gpu, prof in devs.items():
        dev = load_profile(prof).device.burst()
        big = [r for r in rows if r["gpu"] == gpu and int(r["sequences"]) >= 512]
        errs = []
        for r in big:
            state = int(r["sequences"]) * int(r["value_heads"]) * 128 * 128 * 4
            errs.append(2 * state / dev.effective_memory_bandwidth / (float(r["ms"]) * 1e-3) - 1)
        assert len(errs) >= 15 and abs(sorted(errs)[len(errs) // 2]) < 0.10, gpu


@pytest.mark.parametrize("scenario", ["scenarios/nemotron-h-8b-h100.toml", "scenarios/qwen3-next-80b-h100.toml"])
def test_recurrent_mixers_cost_on_a_gpu_without_bf16(scenario):
    # a V100 has kernel facts but no BF16 peak: the scan, delta-rule and convolution rates take the
    # kernel models' clock from its FP16 peak (parsim.cluster.kernels.sm_clock_hz), as attention does
    from parsim.cluster.kernels import sm_clock_hz
    from parsim.costs.gdn import delta_rate
    from parsim.costs.memory_ops import CONV_BYTES_PER_CLOCK_PER_SM, conv_rate
    from parsim.costs.ssd import SSD_FLOP_PER_CLOCK_PER_SM, scan_rate
    from parsim.scenario import load_scenario
    import parsim.costs.gdn as gdn
    dev = load_profile("dgx2-v100").device
    clock = sm_clock_hz(dev)
    sms = dev.kernels.sm_count
    assert clock == pytest.approx(dev.peak_flops["fp16"] / (sms * dev.kernels.tensor_flop_per_clock_per_sm)
                                  * dev.clock_ratio)
    assert scan_rate(dev) == pytest.approx(SSD_FLOP_PER_CLOCK_PER_SM * sms * clock)
    assert delta_rate(dev) == pytest.approx(gdn.GDN_FLOP_PER_CLOCK_PER_SM * sms * clock)
    assert conv_rate(dev) == pytest.approx(CONV_BYTES_PER_CLOCK_PER_SM * sms * clock)
    sc = load_scenario(ROOT / scenario, overrides=["hardware=dgx2-v100", "training.precision=fp16"])
    assert simulate(sc).metrics["step_time_s"] > 0
