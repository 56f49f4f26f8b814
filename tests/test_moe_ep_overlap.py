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
    off, on = qwen30b("deepep", False, sms=0), qwen30b("deepep", True, sms=0)
    assert on["breakdown_s"]["ep_comm"] == pytest.approx(0.0, abs=1e-9)  # the compute covers it all here
    assert on["breakdown_s"]["compute"] == pytest.approx(off["breakdown_s"]["compute"], rel=1e-12)


@pytest.mark.parametrize("sms", [20, 32])
def test_hidden_all_to_alls_slow_the_compute_by_the_sms_they_hold(sms):
    # every all-to-all second hidden takes sms/132 of an H100's SMs from the compute beside it
    # (the compute outlasts the communication here, so the closed form's first branch holds)
    off, on = qwen30b("deepep", False, sms=sms), qwen30b("deepep", True, sms=sms)
    hidden = off["breakdown_s"]["ep_comm"] - on["breakdown_s"]["ep_comm"]
    grown = on["breakdown_s"]["compute"] - off["breakdown_s"]["compute"]
    assert hidden > 0
    assert grown == pytest.approx(hidden * sms / 132, rel=1e-9)


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
