"""Mixture of experts: presets, routing imbalance, all-to-all bytes, expert phase, EP memory.

Oracles: published parameter counts; closed forms (all-to-all bytes per rank, capacity
and dropped fractions by hand, ZeRO formulas over the expert-data-parallel group); the
cost model's own GEMM function for the "twice the load, twice the time" check.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import ROOT

from parsim import simulate
from parsim.cluster.collectives import collective_time
from parsim.config.moe import MoEConfig
from parsim.costs.memory import model_state_bytes
from parsim.costs.moe import ep_group_ranks, expert_dp_ranks, expert_shares, route
from parsim.errors import ConfigError
from parsim.model import active_params, get_preset, total_params
from parsim.scenario import load_scenario, scenario_from_dict

TINY_MOE = {"name": "tiny-moe", "n_layers": 4, "d_model": 1024, "n_heads": 8, "d_ff": 4096,
            "vocab_size": 32000, "ffn": "swiglu", "n_experts": 8, "top_k": 2, "capacity_factor": 1.25}
SEQ = 2048


def moe_doc(moe=None, parallel=None, model=None, dp=8, pp=1, tp=1, m=2, training=None):
    doc = {"name": "moe-test", "hardware": "dgx-h100", "gpus": dp * pp * tp,
           "model": {**TINY_MOE, **(model or {})},
           "training": {"global_batch": dp * m, "seq_len": SEQ, "microbatch_size": 1, **(training or {})},
           "parallel": {"dp": dp, "pp": pp, "tp": tp, "ep": 8, **(parallel or {})},
           "schedule": {"name": "1F1B"}}
    if moe is not None:
        doc["moe"] = moe
    return doc


def run(**kw):
    return simulate(scenario_from_dict(moe_doc(**kw), "moe-test.toml")).metrics


def rel(a, b):
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------- presets
# (name, published total, tolerance): Switch-Base-128 7.4B (Fedus et al. 2021 Table 9);
# GShard MoE(2048E,36L) "600B" (Lepikhin et al. 2020 Table 3, a rounded label; the decoder
# stack counts 619B); GLaM 64B/64E 1.162T and 8B/64E 143B (Du et al. 2022 Table 4).
CLASSIC = [("switch-base-128", 7.4e9, 0.01), ("gshard-600b", 600e9, 0.04),
           ("glam-64e", 1162e9, 0.01), ("glam-8b-64e", 143e9, 0.01)]


@pytest.mark.parametrize("name,total,tol", CLASSIC)
def test_classic_moe_totals_match_published(name, total, tol):
    spec = get_preset(name)
    assert spec.is_moe and rel(total_params(spec), total) < tol


def test_classic_moe_routing_shapes():
    assert get_preset("switch-base-128").top_k == 1
    assert get_preset("gshard-600b").top_k == 2 and get_preset("gshard-600b").n_experts == 2048
    glam = get_preset("glam-64e")
    assert glam.top_k == 2 and glam.n_experts == 64 and glam.n_moe_layers == 32


@pytest.mark.parametrize("name,active", [("glam-64e", 96.6e9), ("glam-8b-64e", 8.7e9)])
def test_glam_active_params_within_documented_gap(name, active):
    # GLaM's activated counts are not reproducible together with its totals from Table 4
    # (one is 9% under, the other 11% over with the same counting); the gap is documented.
    assert rel(active_params(get_preset(name)), active) < 0.12


# ---------------------------------------------------------------- routing
def test_balanced_all_to_all_bytes_equal_closed_form():
    mx = run(moe={"routing": "balanced"})
    ep, k, d = 8, TINY_MOE["top_k"], TINY_MOE["d_model"]
    expected = SEQ * k * d * 2 * (ep - 1) / ep
    moe = mx["moe"]
    assert moe["all_to_all_bytes_per_rank"]["send"] == pytest.approx(expected, rel=1e-12)
    assert moe["all_to_all_bytes_per_rank"]["recv_max"] == pytest.approx(expected, rel=1e-12)
    assert moe["routed_tokens_per_rank"] == [SEQ * k] * ep  # one expert per rank, T*top_k each
    assert moe["dropped_fraction"] == 0.0 and moe["imbalance"] == pytest.approx(1.0)


def test_all_to_all_time_is_the_collective_on_the_ep_group():
    sc = scenario_from_dict(moe_doc(), "x.toml")
    group = ep_group_ranks(sc.parallel, 1)
    assert group == list(range(8))  # dp innermost with tp=1: one node
    res = simulate(sc)
    one = collective_time(sc.hardware, "all_to_all", SEQ * 2 * 1024 * 2, group)
    assert res.metrics["moe"]["layer_all_to_all_s"] == pytest.approx(one)
    # 2 all-to-alls in forward, 2 in backward, per MoE layer; the forward first all-gathers
    # every rank's int64 tokens-per-expert counts (the backward reuses them)
    counts = collective_time(sc.hardware, "all_gather", len(group) * sc.model.n_experts * 8, group)
    tables = res.tables
    assert tables.op(0, "F").parts.ep_comm == pytest.approx(4 * (2 * one + counts))
    assert tables.op(0, "I").parts.ep_comm == pytest.approx(4 * 2 * one)


def test_hot_expert_with_twice_the_load_doubles_the_expert_phase(tmp_path):
    hist = [2.0] + [6.0 / 7.0] * 7  # expert 0 gets twice the mean (8 experts, mean 1)
    # the work doubles; the kernels' fixed launch-to-drain time (gemm_latency_us) does not, so
    # the doubling is checked on the H100 without it, and with it the ratio stays below 2
    prof = (ROOT / "parsim" / "cluster" / "profiles" / "dgx-h100.toml").read_text()
    no_latency = tmp_path / "h100-no-latency.toml"
    no_latency.write_text(prof.replace("gemm_latency_us = 4.0", "gemm_latency_us = 0.0"))
    for hw, lo, hi in ((str(no_latency), 1.9, 2.1), ("dgx-h100", 1.5, 2.0)):
        def go(moe):
            doc = moe_doc(moe=moe)
            doc["hardware"] = hw
            return simulate(scenario_from_dict(doc, "moe-test.toml")).metrics["moe"]
        base = go({"routing": "balanced", "drop_tokens": False})
        hot = go({"routing": "histogram", "histogram": hist, "drop_tokens": False})
        assert hot["routed_tokens_per_rank"][0] == pytest.approx(2 * SEQ * 2)
        for part in ("forward", "backward_input", "backward_weight"):
            ratio = hot["layer_expert_compute_s"][part] / base["layer_expert_compute_s"][part]
            assert lo < ratio < hi, (hw, part, ratio)
        assert hot["imbalance"] == pytest.approx(2.0)


def test_capacity_drops_overflow_by_hand():
    spec = scenario_from_dict(moe_doc(), "x.toml").model
    hist = [4.0, 2.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]  # shares 1/2, 1/4, 1/8, 1/8
    cfg = MoEConfig(routing="histogram", histogram=tuple(hist), drop_tokens=True)
    r = route(spec, cfg, tokens_per_rank=100, group_size=8)
    total = 8 * 100 * 2
    cap = math.ceil(1.25 * total / 8)  # 250
    assert r.capacity == cap
    kept = [min(total * h / 8, cap) for h in hist]
    assert list(r.kept) == pytest.approx(kept)
    assert r.dropped_fraction == pytest.approx(1 - sum(kept) / total)
    assert r.sent == pytest.approx(sum(kept) / 8)


def test_skewed_routings_are_deterministic_and_slow_the_step():
    for kind, extra in (("zipf", {"zipf_s": 1.0}), ("lognormal", {"lognormal_sigma": 0.8})):
        a = expert_shares(MoEConfig(routing=kind, seed=3, **extra), 64)
        b = expert_shares(MoEConfig(routing=kind, seed=3, **extra), 64)
        c = expert_shares(MoEConfig(routing=kind, seed=4, **extra), 64)
        assert np.array_equal(a, b) and not np.array_equal(a, c)
        assert a.sum() == pytest.approx(1.0) and a.max() > 1.5 / 64
    base = run(moe={"routing": "balanced", "drop_tokens": False})
    skew = run(moe={"routing": "zipf", "zipf_s": 1.0, "drop_tokens": False})
    assert skew["moe"]["imbalance"] > 1.5
    assert skew["step_time_s"] > base["step_time_s"]
    assert skew["peak_memory_bytes"] > base["peak_memory_bytes"]  # the busiest rank stashes more rows


def test_folded_expert_parallel_group_and_expert_tp():
    sc = scenario_from_dict(moe_doc(dp=4, tp=2, parallel={"ep": 4}, moe={"expert_tp": 1}), "x.toml")
    assert ep_group_ranks(sc.parallel, 1) == list(range(8))  # 4 dp ranks x 2 folded tp ranks
    mx = simulate(sc).metrics["moe"]
    assert mx["ep_group_size"] == 8 and mx["tokens_per_rank"] == SEQ / 2
    sc2 = scenario_from_dict(moe_doc(dp=4, tp=2, parallel={"ep": 4}), "x.toml")  # expert_tp = tp
    assert simulate(sc2).metrics["moe"]["ep_group_size"] == 4


# ---------------------------------------------------------------- memory
def test_expert_states_shard_over_expert_data_parallel():
    sc = scenario_from_dict(moe_doc(dp=8, parallel={"ep": 4, "zero": 1}), "x.toml")
    assert expert_dp_ranks(sc.parallel) == [0, 4]
    res = simulate(sc)
    st = res.tables.stages[0]
    spec = sc.model
    per_expert = 3 * spec.d_model * spec.d_ff_expert_
    assert st.expert_params == pytest.approx(4 * 8 * per_expert / 4)
    dense = model_state_bytes(st.params - st.expert_params, 8, 1)
    expert = model_state_bytes(st.expert_params, 2, 1)  # dp*cp/ep = 2 ranks share each expert
    mem = res.metrics["stages"][0]["memory"]
    assert mem["optimizer"] == pytest.approx(dense.optimizer + expert.optimizer)
    assert mem["params"] == pytest.approx(dense.params + expert.params)


# ---------------------------------------------------------------- scenario input
@pytest.mark.parametrize("moe,key", [
    ({"routing": "uniform"}, "moe.routing"),
    ({"nope": 1}, "moe.nope"),
    ({"routing": "histogram"}, "moe.histogram"),
    ({"routing": "histogram", "histogram": [1, 2, 3]}, "moe.histogram"),
    ({"expert_tp": 3}, "moe.expert_tp"),
    ({"drop_tokens": "yes"}, "moe.drop_tokens"),
])
def test_bad_moe_table_names_the_key(moe, key):
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(moe_doc(moe=moe), "bad.toml")
    assert e.value.key == key and e.value.file == "bad.toml"


def test_moe_table_on_dense_model_is_an_error():
    doc = moe_doc(moe={"routing": "balanced"}, model={"n_experts": 0}, parallel={"ep": 1})
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(doc, "bad.toml")
    assert e.value.key == "moe"


def test_json_moe_object_fields():
    mx = run(moe={"routing": "zipf"})
    for key in ("routed_tokens_per_rank", "expert_compute_s", "all_to_all_s", "dropped_fraction",
                "worst_rank_peak_memory_bytes", "layer_expert_compute_s", "imbalance"):
        assert key in mx["moe"]
    assert len(mx["moe"]["routed_tokens_per_rank"]) == 8
    assert mx["comm_bytes_by_axis"]["ep"] > 0 and mx["breakdown_s"]["ep_comm"] > 0


@pytest.mark.parametrize("name", ["mixtral-8x7b-h100", "glam-64e-h100"])
def test_shipped_moe_scenarios_run(name):
    sc = load_scenario(ROOT / "scenarios" / f"{name}.toml")
    mx = simulate(sc).metrics
    assert mx["fits_in_memory"] and mx["moe"]["ep_group_size"] >= 8
    assert 0.05 < mx["mfu"] < 0.8
