"""Every schedule end-to-end through parsim.simulate with [costs]: closed forms, the Zero
Bubble paper's Table 5 columns, memory rules and PipeDream semantics."""
from __future__ import annotations

import pytest
from conftest import published, published_cases
from helpers import scenario

from parsim import simulate
from parsim.errors import ConfigError
from parsim.schedule import BUILDERS

F, I, W = 1.0, 1.0, 1.0
SPLIT = {"forward_s": F, "backward_input_s": I, "backward_weight_s": W, "p2p_s": 0.0}
UNIFORM = {"forward_s": 1.0, "backward_s": 2.0, "p2p_s": 0.0}


def _run(p, m, name, costs, **kw):
    return simulate(scenario(pp=p, m=m, schedule=name, costs=costs, **kw)).to_json()


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_schedule_simulates(name):
    p, m = 4, 8
    vpp = 2 if name == "Interleaved1F1B" else 1
    mx = simulate(scenario(pp=p, m=m, vpp=vpp, schedule=name, layers=16)).to_json()
    assert mx["step_time_s"] > 0 and 0 <= mx["bubble_fraction"] < 1
    assert sum(mx["breakdown_s"].values()) == pytest.approx(mx["step_time_s"], rel=1e-9)
    assert len(mx["layers_per_stage"]) == p * (2 if name in ("ZBV", "DualPipe", "DualPipeV", "Chimera") else vpp)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_closed_forms_end_to_end(p, m):
    # GPipe / 1F1B / PipeDream / 2BW / GPipeRemat (B includes the recomputed F): (p-1)/(m+p-1)
    for name in ("GPipe", "1F1B", "PipeDream", "PipeDream2BW"):
        assert _run(p, m, name, UNIFORM)["bubble_fraction"] == pytest.approx((p - 1) / (m + p - 1))
    remat = _run(p, m, "GPipeRemat", UNIFORM)
    assert remat["step_time_s"] == pytest.approx((m + p - 1) * 4.0)
    assert _run(p, m, "Naive", UNIFORM)["bubble_fraction"] == pytest.approx((p - 1) / p)
    # ZB-H1 (p-1)(T_F+T_B-T_W), ZB-H2 (p-1)(T_F+T_B-2T_W) over each rank's span (zb-formulas)
    h1 = _run(p, m, "ZBH1", {**SPLIT, "forward_s": 2.0, "backward_input_s": 2.0})
    assert h1["step_time_s"] - m * 5.0 == pytest.approx((p - 1) * (2 + 2 - 1))
    if m >= 2 * p - 1:
        h2 = _run(p, m, "ZBH2", SPLIT)
        assert h2["bubble_fraction_span"] == pytest.approx(0.0, abs=1e-12)  # (p-1)(1+1-2) = 0
        assert h2["bubble_fraction"] > 0  # makespan-based: the parallelogram's corners
    # ZB-V: zero bubble in every rank's own span with T_F = T_I = T_W
    zv = simulate(scenario(pp=p, m=m, schedule="ZBV", costs=SPLIT, layers=2 * p))
    tl = zv.timeline[zv.timeline["stream"] == "compute"]
    for _, g in tl.groupby("rank"):
        assert g["end_s"].max() - g["start_s"].min() == pytest.approx((g["end_s"] - g["start_s"]).sum())


@pytest.mark.parametrize("p", [2, 4, 8])
def test_dualpipe_and_chimera_end_to_end(p):
    m = 4 * p
    pub = published("deepseekv3-table2-pp-formulas")["expected"]["bubble"]["DualPipe"]
    assert pub == "(PP/2-1)(F&B+B-3W)"
    costs = {"forward_s": 2.0, "backward_input_s": 2.0, "backward_weight_s": 1.0, "overlap_f_b_s": 4.5}
    res = simulate(scenario(pp=p, m=m, schedule="DualPipe", costs=costs, layers=p))
    mx = res.to_json()
    T = mx["step_time_s"]
    assert max(T - s["busy_s"] for s in mx["stages"]) == pytest.approx((p / 2 - 1) * (4.5 + 3.0 - 3 * 1.0))
    # two model copies: every rank holds two pieces (2x parameters), each chain the whole model
    assert mx["layers_per_stage"] == [1] * p * 2 and all(s["layers"] == 2 for s in mx["stages"])
    chim = _run(p, m, "Chimera", {"forward_s": 1.0, "backward_s": 1.0}, layers=p)
    assert chim["bubble_fraction"] == pytest.approx((p - 2) / (2 * m + p - 2))


ZB_ROWS = published_cases("zb-table5-")


@pytest.mark.parametrize("case", ZB_ROWS, ids=[c["id"] for c in ZB_ROWS])
def test_zero_bubble_table5_columns(case):
    """1F1B-I (one chunk per layer-ish: v = round(layers / p), as the paper's maximum
    chunking), ZB-H1 and ZB-H2 within +-0.01 of Table 5 from the profiled T_F/T_B/T_W/T_comm."""
    x, exp = case["inputs"], case["expected"]["bubble_rate"]
    p, m, us = x["p"], x["m"], 1e-6
    tf, tb, tw, tc = x["T_F"] * us, x["T_B"] * us, x["T_W"] * us, x["T_comm"] * us
    v = round(x["layers"] / p)
    inter = _run(p, m, "Interleaved1F1B", {"forward_s": tf / v, "backward_s": (tb + tw) / v, "p2p_s": tc},
                 vpp=v, layers=p * v)
    assert inter["bubble_fraction"] == pytest.approx(exp["1F1B-I"], abs=0.01)
    split = {"forward_s": tf, "backward_input_s": tb, "backward_weight_s": tw, "p2p_s": tc}
    assert _run(p, m, "ZBH1", split)["bubble_fraction"] == pytest.approx(exp["ZB-H1"], abs=0.01)
    assert _run(p, m, "ZBH2", split)["bubble_fraction_span"] == pytest.approx(exp["ZB-H2"], abs=0.01)


@pytest.mark.parametrize("p,m", [(4, 8), (4, 12), (8, 16)])
def test_peak_activation_rules(p, m):
    """First stage: GPipe m microbatches, 1F1B p, ZB-H2 2p-1 (about 2p), ZB-V p full-rank
    microbatches, DualPipe p+1 chunks (DeepSeek's PP+1)."""
    def held(name, layers=None):
        res = simulate(scenario(pp=p, m=m, schedule=name, layers=layers))
        return res.to_json()["stages"][0]["memory"]["activations"] / res.tables.stages[0].activation_bytes

    assert held("GPipe") == pytest.approx(m)
    assert held("1F1B") == pytest.approx(p)
    assert held("ZBH1") == pytest.approx(p, abs=1)  # W keeps part of the stash a little longer
    assert 2 * p - 2 <= held("ZBH2") <= 2 * p
    assert held("ZBV", 2 * p) == pytest.approx(2 * p, abs=1)
    assert held("DualPipe", p) == pytest.approx(p + 1, abs=1)


def test_pipedream_weight_versions_and_staleness():
    pub = published("pipedream-2bw-memory")["expected"]
    assert pub["weight_versions_per_stage"] == 2
    p, m = 4, 8
    base = simulate(scenario(pp=p, m=m, schedule="1F1B")).to_json()
    pd = simulate(scenario(pp=p, m=m, schedule="PipeDream")).to_json()
    bw = simulate(scenario(pp=p, m=m, schedule="PipeDream2BW")).to_json()
    assert pd["pipedream"]["weight_versions"] == [p - s for s in range(p)]  # in-flight microbatches
    assert pd["pipedream"]["staleness_steps"] == [p - s - 1 for s in range(p)]
    assert bw["pipedream"]["weight_versions"] == [2] * p and bw["pipedream"]["staleness_steps"] == [1] * p
    assert "pipedream" not in base
    for s in range(p):
        w16 = base["stages"][s]["memory"]["params"]  # 16-bit weights of the rank (ZeRO-0)
        assert pd["stages"][s]["memory"]["params"] == pytest.approx(w16 * (p - s))
        assert bw["stages"][s]["memory"]["params"] == pytest.approx(w16 * 2)
    # steady state (no flush): the busiest rank's compute per step, below the flushed makespan
    steady = _run(p, m, "PipeDream", UNIFORM)["pipedream"]["steady_state_step_s"]
    assert steady == pytest.approx(m * 3.0)


def test_overlap_hides_tp_communication_and_breakdown_adds_up():
    """OVERLAP_F_B with the cost model: F + B minus the TP communication each hides under the
    other's compute; the hidden part leaves the breakdown, which still sums to the step."""
    kw = dict(pp=2, tp=2, m=8, layers=4, hardware="dgx-h100")
    dp = simulate(scenario(schedule="DualPipe", **kw))
    from parsim.costs import ModelCosts
    c = ModelCosts.from_scenario(scenario(schedule="DualPipe", **kw))
    f, b = c.stages[0].parts, c.stages[3].parts
    from parsim.schedule.ir import Op
    hidden = min(f[Op.F].tp_comm, b[Op.B].compute + b[Op.B].recompute) + min(b[Op.B].tp_comm, f[Op.F].compute)
    assert hidden > 0
    assert c.overlap_cost(0, 3, Op.B) == pytest.approx(f[Op.F].total + b[Op.B].total - hidden)
    mx = dp.to_json()
    assert sum(mx["breakdown_s"].values()) == pytest.approx(mx["step_time_s"], rel=1e-9)


def test_gpipe_remat_keeps_boundary_activations_only():
    p, m = 4, 8
    plain = simulate(scenario(pp=p, m=m, schedule="GPipe")).to_json()["stages"][0]["memory"]["activations"]
    remat = simulate(scenario(pp=p, m=m, schedule="GPipeRemat")).to_json()["stages"][0]["memory"]["activations"]
    assert remat < plain / 4


def test_vpp_rules_for_two_stage_schedules():
    assert simulate(scenario(pp=2, m=4, schedule="ZBV", layers=4)).to_json()["parallel"]["vpp"] == 2
    with pytest.raises(ConfigError, match="vpp must be 2"):
        scenario(pp=2, vpp=3, m=4, schedule="DualPipe", layers=6)
