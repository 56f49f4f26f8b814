"""Expert all-to-alls hidden behind compute (``overlap.ep_comm``, Megatron-Core's
``overlap_moe_expert_parallel_comm``) and the SMs the dispatch kernels hold while hidden.

Oracles: the contention closed form (hidden seconds x SMs held / SMs of the device, while the
compute outlasts the communication: ``parsim.cluster.contention``); the bound that hiding can
save no more than the exposed all-to-all time; and NVIDIA's published single-knob A/B on
Qwen3-30B-A3B, 16 H100, HybridEP (tests/data/moe_ep_overlap_published.json).
"""
from __future__ import annotations

import json

import pytest
from conftest import ROOT

from parsim import simulate
from parsim.config.moe import DISPATCHER_SMS
from parsim.errors import ConfigError
from parsim.scenario import scenario_from_dict

AB = json.loads((ROOT / "tests" / "data" / "moe_ep_overlap_published.json").read_text())["hybridep_ab"]


def qwen30b(dispatcher: str, overlap: bool, sms: int | None = None) -> dict:
    """The published A/B's configuration (16 H100, EP 16, GBS 1024, seq 4096, BF16)."""
    moe = {"routing": "balanced", "drop_tokens": False, "dispatcher": dispatcher}
    if sms is not None:
        moe["dispatcher_sms"] = sms
    doc = {"name": "q30b-ab", "hardware": AB["hardware"], "gpus": AB["gpus"], "model": {"preset": AB["model"]},
           "training": {"global_batch": AB["global_batch"], "microbatch_size": AB["microbatch_size"],
                        "seq_len": AB["seq_len"], "precision": AB["precision"], "recompute": "none",
                        "attention_kernel": "cudnn", "cross_entropy_fusion": True},
           "parallel": {"dp": AB["gpus"], "tp": AB["tp"], "pp": AB["pp"], "cp": AB["cp"], "ep": AB["ep"],
                        "zero": 1, "framework": "megatron", "grad_reduce_dtype": "bf16"},
           "schedule": {"name": "1F1B"},
           "overlap": {"grad_reduce": True, "param_gather": True, "ep_comm": overlap},
           "moe": moe}
    return simulate(scenario_from_dict(doc, "q30b-ab.toml")).metrics


@pytest.mark.parametrize("dispatcher", ["alltoall", "deepep", "hybridep"])
def test_hiding_saves_no_more_than_the_exposed_all_to_alls(dispatcher):
    off, on = qwen30b(dispatcher, False), qwen30b(dispatcher, True)
    saved = off["step_time_s"] - on["step_time_s"]
    assert 0.0 < saved <= off["breakdown_s"]["ep_comm"] + 1e-9


def test_kernels_that_hold_no_sms_hide_for_free():
    # Megatron's combined 1F1B at pp = 1: the first forward and the last backward run alone, the
    # 63 pairs between hide each other's all-to-alls; every microbatch exchanges the same bytes
    off, on = qwen30b("deepep", False, sms=0), qwen30b("deepep", True, sms=0)
    m = AB["global_batch"] // AB["gpus"]
    assert on["breakdown_s"]["ep_comm"] == pytest.approx(off["breakdown_s"]["ep_comm"] / m, rel=1e-9)
    assert on["breakdown_s"]["compute"] == pytest.approx(off["breakdown_s"]["compute"], rel=1e-9)


@pytest.mark.parametrize("sms", [20, 32])
def test_hidden_all_to_alls_slow_the_compute_by_the_sms_they_hold(sms):
    # every all-to-all second hidden in a pair takes sms/132 of an H100's SMs from the compute
    # beside it (the compute outlasts the communication here: the closed form's first branch)
    free, held = qwen30b("deepep", True, sms=0), qwen30b("deepep", True, sms=sms)
    off = qwen30b("deepep", False, sms=sms)
    m = AB["global_batch"] // AB["gpus"]
    hidden = off["breakdown_s"]["ep_comm"] * (m - 1) / m
    assert held["step_time_s"] - free["step_time_s"] == pytest.approx(hidden * sms / 132, rel=1e-9)


def test_flex_dispatchers_default_to_megatron_core_sms():
    assert DISPATCHER_SMS == {"deepep": 20, "hybridep": 24}
    # HybridEP is costed on DeepEP's node-deduplicated path: the same exposed time without overlap
    assert qwen30b("hybridep", False)["step_time_s"] == pytest.approx(qwen30b("deepep", False)["step_time_s"])
    # with overlap its 24 SMs slow the compute more than DeepEP's 20
    assert qwen30b("hybridep", True)["step_time_s"] > qwen30b("deepep", True)["step_time_s"]


def test_published_hybridep_overlap_gain_within_five_percent():
    """Plain EP overlap took the published run from 244.0 to 287.3 model TFLOP/s per GPU
    (x1.177). Without the SMs the hidden kernels hold, parsim gave x1.32 (all hidden for free)."""
    off, on = qwen30b("hybridep", False, AB["dispatcher_sms"]), qwen30b("hybridep", True, AB["dispatcher_sms"])
    gain = off["step_time_s"] / on["step_time_s"]
    published = AB["overlap_off"]["step_time_s"] / AB["overlap_on"]["step_time_s"]
    assert gain == pytest.approx(published, rel=0.05)


@pytest.mark.xfail(strict=True, reason="measured: parsim 18.08 s per step against 24.71 s published (-27%) with "
                                       "overlap off; the published Nsight profile shows 3.1 s of HybridEP metadata "
                                       "preprocessing and 1.9 s with the GPU idle per step, neither modelled, and "
                                       "communication of ~10 s where parsim's dispatch/combine total 4.4 s")
def test_published_hybridep_step_time_within_ten_percent():
    off = qwen30b("hybridep", False, AB["dispatcher_sms"])
    assert off["step_time_s"] == pytest.approx(AB["overlap_off"]["step_time_s"], rel=0.10)


@pytest.mark.parametrize("value", [-1, 1.5, True, "32"])
def test_bad_dispatcher_sms_names_the_key(value):
    doc = {"name": "x", "hardware": "dgx-h100", "gpus": 16, "model": {"preset": "qwen3-30b-a3b"},
           "training": {"global_batch": 16, "seq_len": 1024}, "parallel": {"dp": 16, "ep": 16},
           "moe": {"dispatcher": "hybridep", "dispatcher_sms": value}}
    with pytest.raises(ConfigError, match="moe.dispatcher_sms"):
        scenario_from_dict(doc, "x.toml")


def test_json_names_the_dispatcher_and_the_sms_it_holds():
    from parsim.cluster.hardware import load_profile
    kf = load_profile("dgx-h100").device.kernels
    assert (qwen30b("deepep", False)["moe"]["dispatcher"], qwen30b("deepep", False)["moe"]["dispatcher_sms"]) == \
        ("deepep", 20)
    assert qwen30b("hybridep", False, sms=32)["moe"]["dispatcher_sms"] == 32
    # NCCL's all-to-all over two nodes holds the profile's network CTA count
    assert qwen30b("alltoall", False)["moe"]["dispatcher_sms"] == (kf.collective_ctas_net or kf.collective_ctas) > 0


def test_validation_predicts_the_all_to_all_its_runtime_runs():
    # the torch runtime exchanges tokens with the backend's all-to-all: a scenario that states a
    # flex dispatcher is validated (predicted and run) with the all-to-all
    from parsim.validate.scale import prepare
    sc = prepare(str(ROOT / "scenarios" / "tiny-moe-cpu.toml"), ["moe.dispatcher=hybridep", "moe.dispatcher_sms=8"],
                 "gloo")
    assert (sc.moe.dispatcher, sc.moe.dispatcher_sms) == ("alltoall", None)
    assert sc.overlap.ep_comm is False


# ---------------------------------------------------------------- Megatron's combined 1F1B
def _texts(sched):
    return [[str(a) for a in row] for row in sched.actions]


def test_pairs_at_pp1_are_megatrons_phases():
    # combined_1f1b_schedule_for_no_pipelining: the first forward alone, then (forward of i+1,
    # backward of i), then the last backward alone
    from parsim.schedule import build
    from parsim.schedule.passes import pair_forward_with_backward
    got = _texts(pair_forward_with_backward(build("1F1B", 1, 4, 1)))
    assert got == [["0F0", "(0F1;0B0)OVERLAP_F_B", "(0F2;0B1)OVERLAP_F_B", "(0F3;0B2)OVERLAP_F_B", "0B3"]]


@pytest.mark.parametrize("pp, m, vpp", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (2, 2, 4)])
def test_interleaved_pairs_warm_up_one_more_microbatch(pp, m, vpp):
    # schedules.py get_pp_rank_microbatches: (pp - r - 1) * 2 + (vpp - 1) * pp warm-up forwards
    # (group size pp), plus one with overlap_moe_expert_parallel_comm, capped at m * vpp
    from parsim.schedule import build, validate
    from parsim.schedule.passes import pair_forward_with_backward
    plain = build("Interleaved1F1B", pp, m, vpp)
    paired = pair_forward_with_backward(plain)
    total = m * vpp
    for r, row in enumerate(paired.actions):
        warm = min((pp - r - 1) * 2 + (vpp - 1) * pp + 1, total)
        assert all(a.op.value == "F" for a in row[:warm]) and (warm == total or row[warm].op.value == "OVERLAP_F_B")
        pairs = [a for a in row if a.op.value == "OVERLAP_F_B"]
        assert len(pairs) == total - warm
        # every forward and backward of the plain row, each once, in the plain row's order per kind
        flat = [x for a in row for x in (a.sub if a.sub else (a,))]
        for kind in ("F", "B"):
            assert [a for a in flat if a.op.value == kind] == [a for a in plain.actions[r] if a.op.value == kind]
    validate(paired)  # dependencies satisfiable: no rank waits forever


def test_combined_1f1b_applies_where_megatron_runs_it():
    from parsim.costs.inputs import pairs_forward_with_backward
    base = {"name": "x", "hardware": "dgx-h100", "gpus": 16, "model": {"preset": "qwen3-30b-a3b"},
            "training": {"global_batch": 64, "seq_len": 1024},
            "parallel": {"dp": 16, "ep": 16, "framework": "megatron"}, "overlap": {"ep_comm": True},
            "schedule": {}}

    def sc(**kw):
        doc = json.loads(json.dumps(base))
        for k, v in kw.items():
            doc[k].update(v)
        return scenario_from_dict(doc, "x.toml")
    assert pairs_forward_with_backward(sc())
    assert not pairs_forward_with_backward(sc(parallel={"framework": "zero"}))  # DualPipe-style per pass
    assert not pairs_forward_with_backward(sc(overlap={"ep_comm": False}))
    # DualPipe's composites hide their own way; pp > 1 without vpp is refused (test below)
    assert not pairs_forward_with_backward(sc(parallel={"dp": 8, "pp": 2, "ep": 8, "framework": "zero"}))
    assert pairs_forward_with_backward(sc(parallel={"dp": 8, "pp": 2, "vpp": 2, "ep": 8},
                                          schedule={"name": "Interleaved1F1B"}))


def test_paired_step_keeps_one_microbatch_of_activations():
    # the backward frees block by block while the forward stashes: the published run (overlap on)
    # peaked at 62.166 GiB allocated on rank 0
    off, on = qwen30b("hybridep", False, AB["dispatcher_sms"]), qwen30b("hybridep", True, AB["dispatcher_sms"])
    assert on["peak_memory_bytes"] == pytest.approx(off["peak_memory_bytes"], rel=1e-12)
    assert on["peak_memory_bytes"] / 2**30 == pytest.approx(62.166, rel=0.02)


@pytest.mark.parametrize("change, says", [
    ({"parallel": {"dp": 8, "pp": 2, "ep": 8}}, "needs a virtual pipeline"),
    ({"training": {"recompute": "full"}}, "refuses full recomputation"),
    ({"training": {"recompute": "selective", "recompute_modules": ["moe"]}}, "refuses recomputing the whole MoE"),
])
def test_what_megatron_refuses_with_ep_overlap_is_refused(change, says):
    # transformer_config.py asserts these with overlap_moe_expert_parallel_comm
    doc = {"name": "x", "hardware": "dgx-h100", "gpus": 16, "model": {"preset": "qwen3-30b-a3b"},
           "training": {"global_batch": 64, "seq_len": 1024},
           "parallel": {"dp": 16, "ep": 16, "framework": "megatron"}, "overlap": {"ep_comm": True}}
    for k, v in change.items():
        doc[k].update(v)
    with pytest.raises(ConfigError, match=f"overlap.ep_comm: Megatron-Core's EP overlap {says}"):
        scenario_from_dict(doc, "x.toml")
    doc["parallel"]["framework"] = "zero"  # elsewhere the per-pass (DualPipe-style) hiding runs
    scenario_from_dict(doc, "x.toml")


@pytest.mark.parametrize("dispatcher", ["alltoall", "hybridep"])
def test_paired_breakdown_adds_up_to_the_step(dispatcher):
    # NCCL's exchange outlasts the compute it pairs with (partly hidden), HybridEP's does not
    on = qwen30b(dispatcher, True)
    assert sum(on["breakdown_s"].values()) == pytest.approx(on["step_time_s"], rel=1e-9)
    assert on["breakdown_s"]["ep_comm"] > 0


def test_each_all_to_all_hides_only_under_its_paired_piece():
    # Megatron's combined 1F1B pairs segments, not passes (model_chunk_schedule_plan.py's diagram):
    # B.combine | F.attention, F.dispatch + B.dispatch | B.experts + F.experts, F.combine | B.attention.
    # With SMs free, the saving is the three mins by hand.
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.layer import moe_phase
    from parsim.costs.model_costs import ModelCosts
    from parsim.costs.parts import Parts
    from parsim.schedule.ir import Op
    doc = {"name": "q", "hardware": AB["hardware"], "gpus": AB["gpus"], "model": {"preset": AB["model"]},
           "training": {"global_batch": AB["global_batch"], "microbatch_size": 1, "seq_len": AB["seq_len"],
                        "precision": "bf16", "recompute": "none"},
           "parallel": {"dp": AB["gpus"], "ep": AB["ep"], "zero": 1, "framework": "megatron"},
           "overlap": {"ep_comm": True}, "moe": {"routing": "balanced", "dispatcher": "deepep", "dispatcher_sms": 0}}
    mc = ModelCosts(cost_inputs(scenario_from_dict(doc, "q.toml")))
    assert mc.inputs.ep_pairs
    ph = moe_phase(mc.layer_inputs)
    n = mc.stage_costs[0].moe_layers
    fe, be = n * ph.forward_s, n * (ph.backward_input_s + ph.backward_weight_s)
    f = Parts(compute=fe + 0.010, ep_comm=0.040)  # 10 ms of attention beside 20 ms a2a pieces
    b = Parts(compute=be + 0.030, ep_comm=0.040)
    want = min(0.020, 0.010) + min(0.040, fe + be) + min(0.020, 0.030)
    assert mc._ep_pair_saving(f, b, 0, 0, Op.B) == pytest.approx(want, rel=1e-9)
    assert want < min(0.040, b.compute) + min(0.040, f.compute)  # less than whole passes would hide
