"""Hybrid Mamba-2 models (Nemotron-H, Nemotron Nano 2, Nemotron 3): the spec, its counts, its costs,
its imports and its inference.

Oracles: published parameter totals (model cards and NVIDIA's reports) within 1%; the layer mix
NVIDIA states; two independent sources of the same architecture agreeing to the weight
(Megatron-Bridge's recipes, behind the presets, against Hugging Face config.json copies); sums by
hand of Megatron-Core's ``MambaMixer`` tensors, of the stash, of the FLOP formula; the SSD scan's
fit (``benchmarks/fit_ssd_scan.py``) against measurements it was not fitted on.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from parsim.cluster.hardware import load_profile
from parsim.costs.inference import cache_bytes_per_sequence, kv_bytes_per_sequence, mamba_state_bytes, pass_cost
from parsim.costs.memory import ActivationOptions, block_stash
from parsim.errors import ConfigError
from parsim.frameworks import check, import_megatron
from parsim.model import (
    ModelSpec,
    get_preset,
    layer_gemms,
    megatron_flops_per_step,
    model_from_hf_config,
    uniform_model,
)
from parsim.model.shapes import active_params, embedding_params, layer_params, mamba_mixer_params, total_params
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
HF = Path(__file__).parent / "data" / "hf"


# ---------------------------------------------------------------- counts
@pytest.mark.parametrize("preset,published", [
    ("nemotron-h-56b", 56e9),                 # HF card: "This model has 56B model parameters."
    ("nemotron-h-47b", 47e9),                 # HF card: "This model has 47B model parameters."
    ("nemotron-nano-12b-v2", 12.31e9),        # HF card: "Number of model parameters: 12.31B"
    ("nemotron-3-nano-30b-a3b", 31.6e9),      # NVIDIA: "31.6B total parameter model"
])
def test_published_totals_within_one_percent(preset, published):
    assert abs(total_params(get_preset(preset)) / published - 1) < 0.01


def test_nemotron_3_nano_active_parameters():
    # NVIDIA: "3.2B active (3.6B with embeddings)"
    m = get_preset("nemotron-3-nano-30b-a3b")
    assert abs(active_params(m) / 3.6e9 - 1) < 0.01
    assert abs((active_params(m) - embedding_params(m)) / 3.2e9 - 1) < 0.01


@pytest.mark.parametrize("preset,mamba,mlp,attention,moe", [
    ("nemotron-h-56b", 54, 54, 10, 0),        # NVIDIA: "54 Mamba-2, 54 MLP, and 10 Self-Attention layers"
    ("nemotron-nano-12b-v2", 28, 28, 6, 0),   # card: 62 layers, 28 each of MLP and Mamba-2, the rest GQA
    ("nemotron-h-8b", 24, 24, 4, 0),          # card: "just four Attention layers"
    ("nemotron-3-nano-30b-a3b", 23, 0, 6, 23),
])
def test_layer_mix(preset, mamba, mlp, attention, moe):
    p = get_preset(preset).hybrid_pattern
    assert (p.count("M"), p.count("-"), p.count("*"), p.count("E")) == (mamba, mlp, attention, moe)


def test_mamba_mixer_weights_by_hand():
    # Nemotron-H 8B's mixer, Megatron-Core MambaMixer: in_proj d x (2 d_inner + 2 G N + H), conv1d
    # (d_inner + 2 G N) x (4 taps + bias), dt_bias / A_log / D (H each), norm (d_inner), out_proj
    m = get_preset("nemotron-h-8b")
    d, inner, g, n, h = 4096, 128 * 64, 8, 128, 128
    assert mamba_mixer_params(m) == d * (2 * inner + 2 * g * n + h) + (inner + 2 * g * n) * 5 + 3 * h + inner + inner * d
    assert layer_params(m, 0) == mamba_mixer_params(m) + d  # the layer's pre-norm
    assert layer_params(m, 7) == 4096 * (4096 + 2 * 1024) + 4096 * 4096 + d  # "*": QKV and projection
    assert layer_params(m, 1) == 2 * 4096 * 21504 + d  # "-": up and down
    assert [g.name for g in layer_gemms(m, 8, 2, 0)] == ["mamba_in_proj", "mamba_out_proj"]
    in_proj, out_proj = layer_gemms(m, 8, 2, 0)
    assert (in_proj.n, in_proj.k, out_proj.n, out_proj.k) == ((2 * inner + 2 * g * n + h) // 2, d, d, inner // 2)


@pytest.mark.parametrize("preset,directory", [
    ("nemotron-h-56b", "Nemotron-H-56B-Base-8K"), ("nemotron-h-8b", "Nemotron-H-8B-Base-8K"),
    ("nemotron-3-nano-30b-a3b", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"),
])
def test_hf_config_gives_the_recipe_architecture(preset, directory):
    # the presets follow Megatron-Bridge's recipes; the configs are Hugging Face's: two sources
    spec, ref = model_from_hf_config(HF / directory / "config.json"), get_preset(preset)
    assert total_params(spec) == total_params(ref) and active_params(spec) == active_params(ref)
    assert spec.hybrid_pattern == ref.hybrid_pattern and spec.position == "none"


def test_hf_layers_block_type_list_reads_as_the_pattern(tmp_path):
    cfg = json.loads((HF / "Nemotron-H-8B-Base-8K" / "config.json").read_text())
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    cfg["layers_block_type"] = [names[c] for c in cfg.pop("hybrid_override_pattern")]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert model_from_hf_config(p).hybrid_pattern == get_preset("nemotron-h-8b").hybrid_pattern


@pytest.mark.parametrize("edit,key", [
    (lambda c: c.__setitem__("mlp_hidden_act", "swiglu"), "mlp_hidden_act"),
    (lambda c: c.__setitem__("mlp_bias", True), "mlp_bias"),
    (lambda c: c.__setitem__("num_hidden_layers", 3), "num_hidden_layers"),
    (lambda c: c.update(hybrid_override_pattern="MXM", num_hidden_layers=3), "model.hybrid_pattern"),
    (lambda c: c.__setitem__("mtp_hybrid_override_pattern", "*Q"), "model.mtp_pattern"),
])
def test_hf_refusals_name_file_and_key(tmp_path, edit, key):
    cfg = json.loads((HF / "NVIDIA-Nemotron-3-Super-120B-A12B-FP8" / "config.json").read_text())
    edit(cfg)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as e:
        model_from_hf_config(p)
    assert str(e.value).startswith(f"{p}: {key}: ") and "\n" not in str(e.value)


# ---------------------------------------------------------------- LatentMoE and hybrid MTP (Nemotron 3 Super / Ultra)
@pytest.mark.parametrize("preset,directory,total,active", [
    # the names: "120B-A12B", "550B-A55B" (active without the input embedding, as the names count)
    ("nemotron-3-super-120b-a12b", "NVIDIA-Nemotron-3-Super-120B-A12B-FP8", 120e9, 12e9),
    ("nemotron-3-ultra-550b-a55b", "NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16", 550e9, 55e9),
])
def test_latent_moe_models(preset, directory, total, active):
    spec, ref = model_from_hf_config(HF / directory / "config.json"), get_preset(preset)
    # the checkpoints carry one MTP depth ("*E"); the presets train none
    assert (spec.mtp_layers, spec.mtp_pattern) == (1, "*E")
    assert dataclasses.replace(spec, name=preset, mtp_layers=0, mtp_pattern="", max_seq_len=ref.max_seq_len) == ref
    assert abs(total_params(ref) / total - 1) < 0.01
    assert abs((active_params(ref) - embedding_params(ref)) / active - 1) < 0.02


def test_latent_moe_layer_by_hand():
    m = get_preset("nemotron-3-super-120b-a12b")
    d, lat, f, e, fs = 4096, 1024, 2688, 512, 5376
    # router, the latent down and up projections, 512 experts of latent x f (up, down), the shared
    # expert on d_model, the pre-norm
    assert layer_params(m, 1) == e * d + 2 * d * lat + e * 2 * lat * f + 2 * d * fs + d
    names = {g.name: (g.m, g.n, g.k) for g in layer_gemms(m, 100, 1, 1)}
    assert names["latent_down"] == (100, lat, d) and names["latent_up"] == (100, d, lat)
    assert names["expert_fc1"][2] == lat and names["expert_fc2"][1] == lat


def test_latent_moe_dispatch_carries_latent_rows():
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.layer import layer_cost
    from parsim.costs.model_costs import ModelCosts
    from parsim.costs.stage import block_inputs
    doc = _doc(model={"preset": "nemotron-3-super-120b-a12b"}, gpus=16,
               parallel={"dp": 16, "tp": 1, "ep": 16, "sequence_parallel": False})
    latent = layer_cost(*block_inputs(ModelCosts(cost_inputs(scenario_from_dict(doc, "t"))).layer_inputs, "E"))
    full = _doc(model=dataclasses.asdict(get_preset("nemotron-3-super-120b-a12b")) | {"moe_latent_size": 0}, gpus=16,
                parallel={"dp": 16, "tp": 1, "ep": 16, "sequence_parallel": False})
    plain = layer_cost(*block_inputs(ModelCosts(cost_inputs(scenario_from_dict(full, "t"))).layer_inputs, "E"))
    assert latent.forward_bytes.ep == pytest.approx(plain.forward_bytes.ep * 1024 / 4096)


def test_hybrid_mtp_shared_weights_count_once():
    from parsim.model.shapes import mtp_join_params, mtp_params
    base = get_preset("nemotron-3-nano-30b-a3b")
    one = dataclasses.replace(base, mtp_layers=1, mtp_pattern="*E")
    two = dataclasses.replace(base, mtp_layers=2, mtp_pattern="*E")
    shared = dataclasses.replace(two, mtp_shared=True)
    block = layer_params(base, 5) + layer_params(base, 1)  # an attention and an MoE layer
    assert mtp_params(one) == block + mtp_join_params(base)
    assert mtp_params(two) == 2 * mtp_params(one) and mtp_params(shared) == mtp_params(one)
    doc = _doc(model=dataclasses.asdict(shared), gpus=8, parallel={"dp": 8, "tp": 1, "ep": 8, "sequence_parallel": False})
    r2 = simulate(scenario_from_dict(doc, "t")).metrics
    r1 = simulate(scenario_from_dict(_doc(model=dataclasses.asdict(one), gpus=8,
                                          parallel={"dp": 8, "tp": 1, "ep": 8, "sequence_parallel": False}), "t")).metrics
    assert r2["params"] == r1["params"] and r2["step_time_s"] > r1["step_time_s"]


def test_megatron_flops_count_latent_moe_and_mtp_by_hand():
    m = ModelSpec("t", 2, 64, 4, 2, 128, 100, head_dim=16, position="none", hybrid_pattern="*E", n_experts=4, top_k=2,
                  d_ff_expert=32, n_shared_experts=1, d_ff_shared=48, moe_latent_size=16, mtp_layers=2,
                  mtp_pattern="*E", mtp_shared=True)
    t, s, h = 32, 16, 64
    attn = 4 * t * h * 1 * (h + h * 2 / 4) + 2 * t * s * h * 1
    moe = 4 * t * (16 * 32 * 2 + h * 48) + 4 * t * h * 16
    assert megatron_flops_per_step(m, 2, 16, recompute=False) == pytest.approx(
        3 * (3 * attn + 3 * moe + 2 * t * h * 100 * 3))  # the model's two layers and two MTP depths' two


@pytest.mark.parametrize("fields,key", [
    ({"hybrid_pattern": "M*"}, "model.hybrid_pattern"),              # 2 symbols for 4 layers
    ({"hybrid_pattern": "M*-X"}, "model.hybrid_pattern"),
    ({"hybrid_pattern": "M*-E"}, "model.hybrid_pattern"),            # an MoE layer, no experts
    ({"hybrid_pattern": "M*--", "mamba_heads": 0}, "model.mamba_heads"),
    ({"mamba_heads": 8}, "model.mamba_heads"),                        # Mamba sizes without a pattern
    ({"hybrid_pattern": "M*--", "mamba_groups": 3}, "model.mamba_groups"),
    ({"hybrid_pattern": "M*--", "layer_types": ["full"] * 4}, "model.layer_types"),
    ({"hybrid_pattern": "M*--", "mtp_layers": 1}, "model.mtp_pattern"),
    ({"mtp_pattern": "*E"}, "model.mtp_pattern"),
    ({"mtp_shared": True}, "model.mtp_shared"),
    ({"moe_latent_size": 64}, "model.moe_latent_size"),
])
def test_spec_refusals(fields, key):
    base = dict(name="h", n_layers=4, d_model=256, n_heads=4, n_kv_heads=4, d_ff=512, vocab_size=1000)
    if "hybrid_pattern" in fields and "mamba_heads" not in fields:
        base["mamba_heads"] = 8
    with pytest.raises(ConfigError) as e:
        ModelSpec(**base, **fields)
    assert e.value.key == key


def test_megatron_hybrid_flop_formula_by_hand():
    # training.py hybrid_flops, one layer of each kind, by hand: b=2, s=16, h=64, V=100
    m = ModelSpec("t", 4, 64, 4, 2, 128, 100, head_dim=16, position="none", hybrid_pattern="M*-E", mamba_heads=4,
                  mamba_head_dim=32, mamba_state_dim=8, mamba_groups=2, n_experts=4, top_k=2, d_ff_expert=32,
                  n_shared_experts=1, d_ff_shared=48)
    t, s, h = 32, 16, 64
    attn = 4 * t * h * 1 * (h + h * 2 / 4) + 2 * t * s * h * 1
    mlp = 4 * t * 128 * h
    mamba = 2 * t * h * (2 * 128 + 2 * 2 * 8 + 4) + 7 * t * 128 * 8 + 2 * t * 128 * h  # d_in = 2h as Megatron writes it
    moe = 4 * t * h * (32 * 2 + 48)
    assert megatron_flops_per_step(m, 2, 16, recompute=True) == pytest.approx(3 * (attn + mlp + mamba + moe + 2 * t * h * 100))


# ---------------------------------------------------------------- the SSD scan's kernel rate
def test_ssd_rate_is_the_documented_fit_and_holds_off_it():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import fit_ssd_scan
    import parsim.costs.ssd as ssd
    assert abs(fit_ssd_scan.fit() - ssd.SSD_FLOP_PER_CLOCK_PER_SM) < 0.5
    fitted = fit_ssd_scan.errors(ssd.SSD_FLOP_PER_CLOCK_PER_SM, 1)
    held = fit_ssd_scan.errors(ssd.SSD_FLOP_PER_CLOCK_PER_SM, 0)
    assert sum(map(abs, fitted)) / 5 < 0.05 and sum(map(abs, held)) / 5 < 0.12


def test_scan_backward_costs_more_than_forward():
    from parsim.costs.ssd import ScanShape, scan_times
    dev = load_profile("dgx-h100").device
    f, b, kf, kb = scan_times(dev, ScanShape(8192, 128, 64, 128, 8, 128), "bf16")
    assert (kf, kb) == (5, 14) and 2.0 < b / f < 3.5


# ---------------------------------------------------------------- costs
def _doc(**over) -> dict:
    doc = {"name": "nh", "hardware": "dgx-h100", "gpus": 16, "model": {"preset": "nemotron-h-8b"},
           "training": {"global_batch": 32, "microbatch_size": 1, "seq_len": 8192, "precision": "bf16"},
           "parallel": {"dp": 8, "tp": 2, "sequence_parallel": True, "zero": 1, "framework": "megatron"},
           "overlap": {"grad_reduce": True}}
    for k, v in over.items():
        doc[k] = {**doc.get(k, {}), **v} if isinstance(v, dict) and k != "model" else v
    return doc


def test_mamba_layer_stash_by_hand():
    m = uniform_model(get_preset("nemotron-h-8b"), "M")
    opts = ActivationOptions(flash_attention=True, sequence_parallel=False, dropout=False, bytes_per_element=2)
    got = sum(t.bytes for t in block_stash(m, 8192, opts, 0))
    h, width, conv, inner, heads = 4096, 18560, 8192 + 2048, 8192, 128
    # norm input and output, z|x|B|C|dt, conv output, fp32 dA_cumsum + y, the gated norm's output
    assert got == 2 * h + 2 * h + 2 * width + 2 * conv + (4 * heads + 2 * inner) + 2 * inner


def test_hybrid_layers_send_one_sub_layers_tp_collectives():
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.layer import layer_cost
    from parsim.costs.model_costs import ModelCosts
    from parsim.costs.stage import block_inputs
    sc = scenario_from_dict(_doc(), "t")
    inp = ModelCosts(cost_inputs(sc)).layer_inputs
    mamba = layer_cost(*block_inputs(inp, "M"))
    mlp = layer_cost(*block_inputs(inp, "-"))
    attention = layer_cost(*block_inputs(inp, "*"))
    assert mamba.forward_bytes.tp == mlp.forward_bytes.tp == attention.forward_bytes.tp > 0
    block = ModelSpec("t", 2, 4096, 32, 8, 21504, 131072, ffn="gelu", head_dim=128)
    sc_t = scenario_from_dict(_doc(model=block.__dict__ | {"not_modelled": []}), "t")
    t_block = layer_cost(ModelCosts(cost_inputs(sc_t)).layer_inputs, False)
    assert t_block.forward_bytes.tp == pytest.approx(2 * mamba.forward_bytes.tp)
    # the Mamba layer's scan stands where attention's core would; the MLP layer has neither
    assert mamba.attention_forward.total == 0 and mamba.forward.compute > mlp.forward.compute * 0.3
    assert attention.attention_forward.compute > 0


def test_hybrid_scenario_simulates_with_megatrons_flop_count():
    sc = scenario_from_dict(_doc(), "t")
    r = simulate(sc).metrics
    assert r["fits_in_memory"] and r["params"] == total_params(get_preset("nemotron-h-8b"))
    flops = megatron_flops_per_step(sc.model, 32, 8192, recompute=False)
    assert r["megatron_tflops_per_gpu"] == pytest.approx(flops / r["step_time_s"] / 16 / 1e12)
    assert 0.2 < r["mfu"] < 0.7


@pytest.mark.parametrize("over,key", [
    # 24 Mamba heads over tp 1: cp 16 does not split them (MambaContextParallel asserts it)
    ({"model": dataclasses.asdict(get_preset("nemotron-h-8b")) | {"mamba_heads": 24},
      "parallel": {"dp": 1, "tp": 1, "cp": 16, "sequence_parallel": False}}, "parallel.cp"),
    ({"hardware": "cpu-gloo", "gpus": 2, "parallel": {"dp": 1}}, "hardware"),
    ({"parallel": {"dp": 1, "tp": 16}, "gpus": 16}, "parallel.tp"),
    ({"training": {"recompute": "op"}}, "training.recompute"),
    ({"training": {"optimizer": "muon"}}, "training.optimizer"),
])
def test_scenario_refusals(over, key):
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_doc(**over), "t")
    assert e.value.key == key


def test_validate_refuses_hybrid_models():
    from parsim.validate.scale import check_supported
    with pytest.raises(ConfigError) as e:
        check_supported(scenario_from_dict(_doc(), "t"))
    assert e.value.key == "model.hybrid_pattern"


# ---------------------------------------------------------------- inference
def test_cache_is_attention_kv_plus_fixed_mamba_states():
    m = get_preset("nemotron-h-8b")
    layers = tuple(range(m.n_layers))
    got = cache_bytes_per_sequence(m, layers, 2, 4096, "bf16")
    kv = kv_bytes_per_sequence(m, 4, 2, 4096, "bf16")  # 4 attention layers
    state = 64 * 64 * 128 * 4 + (8192 + 2048) / 2 * 3 * 2  # fp32 SSM state of 64 heads, conv window of 3
    assert mamba_state_bytes(m, 2, "bf16") == state
    assert got == kv + 24 * state


def test_decode_grows_with_context_only_in_attention_layers():
    m, hw = get_preset("nemotron-h-8b"), load_profile("dgx-h100")

    def layer_s(context):
        return pass_cost(hw=hw, model=m, layers=tuple(range(m.n_layers)), last_stage=False, first_stage=False,
                         batch=8, new_tokens=1, context=context, tp=1, precision="bf16", weight_bits=16).layer_s

    short, long = layer_s(1024), layer_s(65536)
    grew = {i for i, (a, b) in enumerate(zip(short, long)) if b > a}
    assert grew == {i for i, c in enumerate(m.hybrid_pattern) if c == "*"}


def test_infer_runs_a_hybrid_model(tmp_path):
    from parsim.infer.run import load_inference, run_inference
    p = tmp_path / "nh.toml"
    p.write_text('name = "nh"\nhardware = "dgx-h100"\ngpus = 1\n[model]\npreset = "nemotron-h-8b"\n'
                 '[inference]\nbatch = 4\nprompt_tokens = 1024\ngenerate_tokens = 16\n')
    summary, _ = run_inference(load_inference(p))
    assert summary["generate_tokens_per_s"] > 0 and summary["fits_in_memory"]
    p.write_text(p.read_text() + 'engine = "deepspeed-0.7"\n')
    with pytest.raises(ConfigError) as e:
        load_inference(p)
    assert e.value.key == "inference.engine"


# ---------------------------------------------------------------- Megatron's command line
NH8 = ["--hidden-size", "4096", "--num-attention-heads", "32", "--group-query-attention", "--num-query-groups", "8",
       "--ffn-hidden-size", "21504", "--squared-relu", "--mamba-num-heads", "128", "--seq-length", "8192",
       "--position-embedding-type", "none", "--normalization", "RMSNorm", "--disable-bias-linear",
       "--untie-embeddings-and-output-weights", "--vocab-size", "131072", "--bf16"]
PATTERN = get_preset("nemotron-h-8b").hybrid_pattern


def test_megatron_hybrid_import_matches_the_preset():
    imp = import_megatron(NH8 + ["--hybrid-layer-pattern", PATTERN], gpus=8)
    sc = check(imp)
    ref = get_preset("nemotron-h-8b")
    assert total_params(sc.model) == total_params(ref) and sc.model.hybrid_pattern == PATTERN
    assert sc.model.position == "none"


def test_megatron_pattern_pipes_are_the_pipeline_layout_and_mtp_is_noted():
    cut = PATTERN[:20] + "|" + PATTERN[20:]
    imp = import_megatron(NH8 + ["--hybrid-override-pattern", cut + "/*-", "--pipeline-model-parallel-size", "2",
                                 "--num-layers", "99"], gpus=8)
    sc = check(imp)
    assert sc.layers_per_stage == (20, 32) and (sc.model.mtp_layers, sc.model.mtp_pattern) == (1, "*-")
    assert any("--num-layers 99 ignored" in n for n in imp.notes)
    with pytest.raises(ConfigError) as e:  # MTP depths must be the same block
        import_megatron(NH8 + ["--hybrid-layer-pattern", "M-M*/*-/M-"])
    assert e.value.key == "--hybrid-layer-pattern"
    with pytest.raises(ConfigError) as e:  # three segments over two pipeline ranks
        import_megatron(NH8 + ["--hybrid-layer-pattern", "M-|M-|M*", "--pipeline-model-parallel-size", "2"])
    assert e.value.key == "--hybrid-layer-pattern"
    with pytest.raises(ConfigError) as e:
        import_megatron(NH8 + ["--num-layers", "4", "--hybrid-attention-ratio", "0.1"])
    assert e.value.key == "--hybrid-attention-ratio"
    with pytest.raises(ConfigError):
        import_megatron(NH8 + ["--hybrid-layer-pattern", "M-", "--hybrid-override-pattern", "M-"])
    idle = import_megatron(NH8 + ["--num-layers", "4"])
    assert any("--mamba-num-heads 128 (ignored: no --hybrid-layer-pattern)" in x for x in idle.not_modelled)


def test_preset_scenarios_of_every_hybrid_simulate():
    for name in ("nemotron-h-4b", "nemotron-nano-9b-v2", "nemotron-3-nano-30b-a3b"):
        ep = {"parallel": {"dp": 8, "tp": 2, "ep": 8}} if "3-nano" in name else {}
        r = simulate(scenario_from_dict(_doc(model={"preset": name}, **ep), "t")).metrics
        assert r["step_time_s"] > 0, name


def test_uniform_model_is_the_same_spec_but_the_pattern():
    m = get_preset("nemotron-3-nano-30b-a3b")
    u = uniform_model(m, "E")
    assert dataclasses.replace(u, hybrid_pattern=m.hybrid_pattern) == m and set(u.hybrid_pattern) == {"E"}


def test_kernel_scan_command_reproduces_a_measured_forward():
    # TileOPs PR #1557, H200 at 1,830 MHz: H=128, P=64, N=128, G=1, Q=256, batch 4 x 32768: 19.7326 ms
    import subprocess
    out = subprocess.run([sys.executable, "-m", "parsim", "kernel", "scan", "--tokens", "131072", "--heads", "128",
                          "--groups", "1", "--chunk", "256", "--hardware", "dgx-h200", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout)
    assert abs(got["time_s"] / 19.7326e-3 - 1) < 0.05 and len(got["kernels"]) == 5
    assert {"time_s", "tflops", "efficiency"} <= set(got) and got["efficiency"] < 0.1
    bad = subprocess.run([sys.executable, "-m", "parsim", "kernel", "scan", "--tokens", "64", "--heads", "6",
                          "--hardware", "dgx-h200"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--groups" in bad.stderr


def test_plan_ranks_hybrid_layouts_within_mamba_limits_and_autoplan_refuses():
    import subprocess
    out = subprocess.run([sys.executable, "-m", "parsim", "plan", "--model", "nemotron-h-8b", "--gpus", "16",
                          "--hardware", "dgx-h100", "--global-batch", "64", "--seq-len", "8192", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    heads, groups = 128, 8
    for r in rows:  # every layout MambaMixer and MambaContextParallel accept
        tp, cp = r["parallel"]["tp"], r["parallel"]["cp"]
        g = groups // tp
        assert heads % (tp * cp) == 0 and (g % cp == 0 if g >= cp else cp % g == 0)
    bad = subprocess.run([sys.executable, "-m", "parsim", "autoplan", "--model", "nemotron-h-8b", "--gpus", "16",
                          "--hardware", "dgx-h100", "--global-batch", "64", "--seq-len", "8192"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "hybrid" in bad.stderr


def test_context_parallel_mamba_layers_exchange_heads_for_sequence():
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.layer import layer_cost, mamba_cp_exchange
    from parsim.costs.model_costs import ModelCosts
    from parsim.costs.stage import block_inputs
    one = ModelCosts(cost_inputs(scenario_from_dict(_doc(), "t"))).layer_inputs
    two = ModelCosts(cost_inputs(scenario_from_dict(_doc(parallel={"dp": 4, "cp": 2}), "t"))).layer_inputs
    m1, m2 = (layer_cost(*block_inputs(x, "M")) for x in (one, two))
    # six all-to-alls (z, x, B, C, dt; y back), blocking, both passes; nothing over cp at cp = 1
    assert m1.forward.cp_comm == 0 and m2.forward.cp_comm > 0 and m2.backward_input.cp_comm == m2.forward.cp_comm
    t, sent = mamba_cp_exchange(block_inputs(two, "M")[0])
    inner, bc, heads = 8192 / 2, 4 * 128, 64  # per TP rank: d_inner, B (or C), dt
    tokens = 8192 // 2
    assert sent == pytest.approx(tokens * 2 * (3 * inner + 2 * bc + heads) / 2)  # (cp-1)/cp of each
    # the scan: the whole sequence on half the heads -- half a rank's work without cp
    from parsim.costs.compute import mamba_scan_times
    assert mamba_scan_times(block_inputs(two, "M")[0])[0] == pytest.approx(
        mamba_scan_times(block_inputs(one, "M")[0])[0] / 2, rel=0.02)
