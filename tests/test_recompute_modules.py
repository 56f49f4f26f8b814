"""Megatron-Core's selective recomputation by module (``training.recompute_modules``).

Oracles: the tensors each Megatron module keeps, counted by hand per token (Korthikanti et al.'s
counting, tensor by tensor, as ``transformer_layer.py``, ``multi_latent_attention.py`` and
``moe/experts.py`` keep them); the kernel model's own GEMM and HBM times for the rerun work; the
FLOPs of the rerun GEMMs in closed form; Megatron's refusals (``transformer_config.py``).
"""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from parsim import simulate
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.layer import module_recompute
from parsim.costs.memory import (
    ActivationOptions,
    layer_activation_bytes,
    moe_dispatched_activation_bytes,
)
from parsim.errors import ConfigError
from parsim.frameworks import import_megatron
from parsim.model import get_preset
from parsim.scenario import scenario_from_dict

GPT = {"n_layers": 8, "d_model": 4096, "n_heads": 32, "d_ff": 16384, "vocab_size": 51200, "ffn": "gelu",
       "norm": "layernorm", "position": "learned"}


def opts(recompute="none", modules=("core_attn",), sp=False, fp8=False, flash=True, dropout=False):
    return ActivationOptions(recompute, flash, sp, dropout, 2, fp8_linear_inputs=fp8, recompute_modules=modules)


def dense_gpt():
    return scenario_from_dict({"name": "g", "hardware": "dgx-h100", "gpus": 8, "model": GPT,
                               "training": {"global_batch": 16, "seq_len": 2048}, "parallel": {"dp": 8}},
                              "g.toml").model


@pytest.mark.parametrize("tp, sp", [(1, False), (2, False), (2, True)])
def test_mlp_recompute_keeps_only_the_checkpoint_input(tp, sp):
    """A checkpointed dense MLP keeps its input (the residual the fused norm reads) and drops the
    norm's output (FC1's input, 2h bytes, replicated unless sequence parallel) and the GeLU's input
    and output (2f + 2f bytes, FFN-sharded)."""
    m, s = dense_gpt(), 2048
    h, f = m.d_model, m.d_ff
    full = layer_activation_bytes(m, s, 1, tp, opts(sp=sp))
    mlp = layer_activation_bytes(m, s, 1, tp, opts("selective", ("core_attn", "mlp"), sp=sp))
    assert full - mlp == pytest.approx(s * (2 * h / (tp if sp else 1) + 4 * f / tp))


def test_mla_block_stash_by_hand():
    """DeepSeek-V3, dense block 0, tp 1, bf16, FlashAttention, no dropout, per token: the input
    norm's input and output (2h + 2h: MLA's norm is its own module), the Q and KV latents and
    their norms' outputs ((1536 + 512) x 2 x 2), the up-projected Q, K (128 x 192 each) and V
    (128 x 128), the attention output (128 x 128), the MLP norm's input and output (2h + 2h)
    and SwiGLU's gate, up and product (3 x 18432 x 2)."""
    m = get_preset("deepseek-v3")
    h = m.d_model
    by_hand = 4 * h + (1536 + 512) * 4 + 2 * 128 * (192 + 192 + 128) + 2 * 128 * 128 + 4 * h + 6 * 18432
    assert layer_activation_bytes(m, 4096, 1, 1, opts(), 0) == 4096 * by_hand
    up = layer_activation_bytes(m, 4096, 1, 1, opts("selective", ("mla_up_proj",)), 0)
    assert 4096 * by_hand - up == 4096 * 2 * 128 * (192 + 192 + 128)  # Q, K, V rebuilt from the latents


def test_layernorm_recompute_drops_only_norms_that_are_their_own_module():
    """Transformer Engine fuses a dense block's norms into the next linear (Megatron's
    input_layernorm / pre_mlp_layernorm are IdentityOp there): nothing to rerun. MLA's input
    norm and an MoE block's pre-MLP norm are modules of their own: their outputs (2h each) go."""
    ln = opts("selective", ("layernorm",))
    llama = get_preset("llama3-8b")
    assert layer_activation_bytes(llama, 4096, 1, 1, ln) == layer_activation_bytes(llama, 4096, 1, 1, opts())
    ds, h = get_preset("deepseek-v3"), 7168
    for li, norms in ((0, 1), (3, 2)):  # dense block: the input norm; MoE block: both
        gone = layer_activation_bytes(ds, 4096, 1, 1, opts(), li) - layer_activation_bytes(ds, 4096, 1, 1, ln, li)
        assert gone == 4096 * norms * 2 * h


@pytest.mark.parametrize("fp8, per", [(False, 2), (True, 1)])
def test_moe_act_drops_fc2_input_and_moe_drops_all_dispatched_rows(fp8, per):
    """Per dispatched row the grouped experts keep the permuted input, the output, SwiGLU's gate,
    up and product (f each); ``moe_act`` discards the product (FC2's input: 2 bytes, 1 under FP8);
    ``moe`` keeps none of them (the checkpoint keeps the layer's input)."""
    m, rows = get_preset("qwen3-30b-a3b"), 5000.0
    f = m.d_ff_expert_
    kept = moe_dispatched_activation_bytes(m, rows, 1, opts(fp8=fp8))
    act = moe_dispatched_activation_bytes(m, rows, 1, opts("selective", ("moe_act",), fp8=fp8))
    assert kept - act == rows * f * per
    assert moe_dispatched_activation_bytes(m, rows, 1, opts("selective", ("moe",), fp8=fp8)) == 0.0


def gpt_run(modules, model=GPT, hardware="dgx-h100"):
    training = {"global_batch": 16, "seq_len": 2048, "recompute": "selective" if modules is not None else "none"}
    if modules:
        training["recompute_modules"] = list(modules)
    sc = scenario_from_dict({"name": "g", "hardware": hardware, "gpus": 8, "model": model, "training": training,
                             "parallel": {"dp": 8}}, "g.toml")
    return sc, simulate(sc).metrics


def test_mlp_rerun_is_its_gemms_norm_and_activation():
    """The MLP's rerun on the kernel model: FC1 (t x f x d) and FC2 (t x d x f) through the GEMM
    model, its norm (read + write t x d) and the bias-GeLU (read t x f, write t x f) at the
    device's HBM rate, a launch each."""
    sc, _ = gpt_run(("mlp",))
    inp = layer_inputs(cost_inputs(sc))
    dev, t, d, f = inp.hardware.device, 2048, 4096, 16384  # the job's clock: its slowest of 8 chips
    by_hand = (dev.gemm_time(t, f, d, "bf16") + dev.gemm_time(t, d, f, "bf16") + dev.memory_time(2 * t * d * 2)
               + dev.memory_time(2 * t * f * 2) + 2 * dev.kernel_launch_s)
    parts, flops, _ = module_recompute(inp, False)
    assert parts.recompute == pytest.approx(by_hand, rel=1e-12)
    assert flops == 2 * t * d * f * 2


def test_core_attn_reruns_the_fused_forward_and_saves_nothing():
    """Megatron's checkpointed core attention reruns its forward in the backward even with a fused
    kernel, which keeps nothing the checkpoint could drop: NVIDIA's matched Moonlight-16B A/B on 8
    H100 measures -0.01% peak allocated memory and +3.85% step time for ``core_attn``."""
    from parsim.costs.compute import fused_attention_times
    _, none = gpt_run(None)
    sc, core = gpt_run(("core_attn",))
    assert core["peak_memory_bytes"] == none["peak_memory_bytes"]
    per_block = fused_attention_times(layer_inputs(cost_inputs(sc)))[0]
    assert core["breakdown_s"]["recompute"] == pytest.approx(GPT["n_layers"] * 2 * per_block, rel=1e-9)


def test_executed_flops_count_the_rerun_mlp():
    """HFU counts the rerun: per GPU and step, 8 blocks x 2 microbatches x FC1 + FC2 (4 t d f)."""
    sc, base = gpt_run(("core_attn",))
    _, mlp = gpt_run(("core_attn", "mlp"))
    peak = sc.hardware.device.peak("bf16")
    executed = {k: r["hfu"] * r["step_time_s"] * peak for k, r in (("base", base), ("mlp", mlp))}
    assert executed["mlp"] - executed["base"] == pytest.approx(8 * 2 * 4 * 2048 * 4096 * 16384, rel=1e-9)


def test_moe_rerun_sends_its_all_to_alls_again():
    """The whole MoE layer rerun dispatches and combines again: expert-parallel bytes go from two
    passes (forward, backward) to three; its routing and dispatched rows leave the stash."""
    doc = {"name": "q", "hardware": "dgx-h100", "gpus": 8, "model": {"preset": "qwen3-30b-a3b"},
           "training": {"global_batch": 8, "seq_len": 4096}, "parallel": {"dp": 8, "ep": 8},
           "moe": {"routing": "balanced", "drop_tokens": False}}
    base = simulate(scenario_from_dict(doc, "q.toml")).metrics
    doc["training"] |= {"recompute": "selective", "recompute_modules": ["moe"]}
    moe = simulate(scenario_from_dict(doc, "q.toml")).metrics
    assert moe["comm_bytes_by_axis"]["ep"] == pytest.approx(1.5 * base["comm_bytes_by_axis"]["ep"], rel=1e-12)
    assert moe["peak_memory_bytes"] < base["peak_memory_bytes"]
    assert moe["breakdown_s"]["recompute"] > 0 and moe["breakdown_s"]["ep_comm"] > base["breakdown_s"]["ep_comm"]


@pytest.mark.parametrize("change, says", [
    ({"recompute_modules": ["mlp"]}, "only with recompute = \"selective\""),
    ({"recompute": "selective", "recompute_modules": ["attn"]}, "'attn' is not one of"),
    ({"recompute": "selective", "recompute_modules": ["mhc"]}, "architecture parsim does not model"),
    ({"recompute": "selective", "recompute_modules": "mlp"}, "expected an array of module names"),
    ({"recompute": "selective", "recompute_modules": ["mla_up_proj"]}, "needs multi-latent attention"),
    ({"recompute": "selective", "recompute_modules": ["moe_act"], "precision": "fp8", "fp8_recipe": "delayed"},
     "delayed scaling does not support it"),
])
def test_what_megatron_refuses_is_refused_in_one_line(change, says):
    doc = {"name": "l", "hardware": "dgx-h100", "gpus": 8, "model": {"preset": "llama3-8b"},
           "training": {"global_batch": 16, "seq_len": 2048} | change, "parallel": {"dp": 8}}
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(doc, "l.toml")
    assert "training.recompute_modules" in str(e.value) and says in str(e.value)


def test_cli_refusal_is_one_line_exit_2(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text((ROOT / "scenarios" / "llama3-70b-h100.toml").read_text())
    r = subprocess.run([sys.executable, "-m", "parsim", "simulate", str(f), "--set", "training.recompute=full",
                        "--set", 'training.recompute_modules=["mlp"]'], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "training.recompute_modules" in r.stderr


SMALL = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "4096",
         "--vocab-size", "32000"]


def test_importer_reads_recompute_modules():
    imp = import_megatron(SMALL + ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp",
                                   "--micro-batch-size", "1"], gpus=8)
    assert imp.doc["training"]["recompute"] == "selective"
    assert imp.doc["training"]["recompute_modules"] == ["core_attn", "mlp"]
    full = import_megatron(SMALL + ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                    "--recompute-modules", "mlp"], gpus=8)
    assert "recompute_modules" not in full.doc["training"]
    assert any(a.startswith("--recompute-modules mlp (ignored: no --recompute-granularity selective")
               for a in full.not_modelled)


# ----------------------------------------------------------------------- full recompute: method

def full_stage(method=None, k=None, layers=8):
    from parsim.costs.stage import StageShape, stage_cost
    training = {"global_batch": 16, "seq_len": 2048, "recompute": "full"}
    if method is not None:
        training |= {"recompute_method": method, "recompute_num_layers": k}
    sc = scenario_from_dict({"name": "g", "hardware": "dgx-h100", "gpus": 8, "model": GPT | {"n_layers": layers},
                             "training": training, "parallel": {"dp": 8}}, "g.toml")
    inp = layer_inputs(cost_inputs(sc))
    return inp, stage_cost(inp, StageShape((False,) * layers, False, False, False))


@pytest.mark.parametrize("k", [1, 3, 8, 12])
def test_block_method_recomputes_the_first_k_blocks_and_keeps_the_rest(k):
    """Megatron's ``--recompute-method block --recompute-num-layers k``: the first k blocks of a
    chunk keep their input (2 t d bytes) and rerun their forward; the other 8 - k keep their whole
    stash (Korthikanti's count with GPT's dropout masks, ``layer_activation_bytes``)."""
    from parsim.schedule.ir import Op
    _, full = full_stage()
    _, st = full_stage("block", k)
    m, t = dense_gpt(), 2048
    r = min(k, 8)
    keep = layer_activation_bytes(m, t, 1, 1, opts(dropout=True))
    assert st.activation_bytes == pytest.approx(r * 2 * t * m.d_model + (8 - r) * keep, rel=1e-12)
    assert st.parts[Op.I].recompute == pytest.approx(full.parts[Op.I].recompute * r / 8, rel=1e-12)
    assert st.flops[Op.I] - full.flops[Op.I] == pytest.approx((r - 8) * full.flops[Op.F] / 8, rel=1e-12)


@pytest.mark.parametrize("k, units", [(1, 8), (3, 3), (4, 2), (8, 1)])
def test_uniform_units_keep_one_input_and_rebuild_k_blocks_together(k, units):
    """``--recompute-method uniform --recompute-num-layers k``: one input per unit of k blocks
    (ceil(8 / k) units), every block rerun, a unit's k blocks alive together in its backward."""
    from parsim.schedule.ir import Op
    _, one = full_stage()
    _, st = full_stage("uniform", k)
    assert st.activation_bytes == pytest.approx(units * 2 * 2048 * 4096, rel=1e-12)
    assert st.parts[Op.I].recompute == one.parts[Op.I].recompute
    assert st.recompute_transient_bytes == pytest.approx(k * one.recompute_transient_bytes, rel=1e-12)


@pytest.mark.parametrize("training, key, says", [
    ({"recompute": "selective", "recompute_method": "block"}, "recompute_method", "only with recompute = \"full\""),
    ({"recompute": "full", "recompute_num_layers": 2}, "recompute_num_layers", "needs training.recompute_method"),
    ({"recompute": "full", "recompute_method": "every"}, "recompute_method", "'every' is not one of uniform, block"),
    ({"recompute": "full", "recompute_method": "block", "recompute_num_layers": 0}, "recompute_num_layers",
     "must be positive"),
])
def test_recompute_method_refusals(training, key, says):
    doc = {"name": "g", "hardware": "dgx-h100", "gpus": 8, "model": GPT,
           "training": {"global_batch": 16, "seq_len": 2048} | training, "parallel": {"dp": 8}}
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(doc, "g.toml")
    assert f"training.{key}" in str(e.value) and says in str(e.value)


def test_importer_reads_recompute_method_and_layers():
    imp = import_megatron(SMALL + ["--recompute-granularity", "full", "--recompute-method", "block",
                                   "--recompute-num-layers", "5"], gpus=8)
    t = imp.doc["training"]
    assert (t["recompute"], t["recompute_method"], t["recompute_num_layers"]) == ("full", "block", 5)
    assert not any("recompute" in n for n in imp.notes)


def test_validation_predicts_the_recompute_its_runtime_runs():
    """The torch runtime checkpoints its blocks for full recomputation (uniform or block) and the
    core_attn / mlp / moe modules for selective recomputation, and builds no output-discarding
    module and no op-level recomputation: a validation run predicts and runs what it builds."""
    from parsim.validate.scale import prepare
    tiny = str(ROOT / "scenarios" / "tiny-moe-cpu.toml")
    t = prepare(tiny, ["training.recompute=full", "training.recompute_method=block", "training.recompute_num_layers=1"],
                "gloo").training
    assert (t.recompute, t.recompute_method, t.recompute_num_layers) == ("full", "block", 1)
    t = prepare(tiny, ["training.recompute=selective", 'training.recompute_modules=["moe","moe_act"]'],
                "gloo").training
    assert (t.recompute, t.recompute_modules) == ("selective", ("moe",))  # moe_act is not built
    t = prepare(tiny, ["training.recompute=op"], "gloo").training
    assert t.recompute == "none"


def test_json_and_summary_say_what_is_rerun():
    _, sel = gpt_run(("mlp", "core_attn"))
    assert sel["recompute"] == "selective" and sel["recompute_modules"] == ["mlp", "core_attn"]
    _, none = gpt_run(None)
    assert "recompute_modules" not in none and "recompute_method" not in none
    from parsim.results.summary import recompute_text
    assert recompute_text(sel) == "selective(mlp+core_attn)"
    assert recompute_text({"recompute": "full", "recompute_method": "block", "recompute_num_layers": 5}) == \
        "full(block 5)"
