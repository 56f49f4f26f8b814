"""PipeDream as published (Narayanan et al., SOSP'19): no flush, 1F1B with an update per
microbatch on every worker, 1F1B-RR (replicated stages taking microbatches round robin, their
replicas synchronising gradients), the partitioner choosing boundaries and replication together,
weight stashing and vertical sync.

Oracles: brute force over every partition and replication (the partitioner), hand-computed
steady-state periods (the slowest stage's F + B over its replicas; max(compute, sync) / m), and
PipeDream's own figures for a non-replicated pipeline of p stages (stage s keeps min(p - s, m)
weight versions, its gradients p - s - 1 updates stale: Sec. 3.3).
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from parsim.costs.replicated import LayerCosts, pipedream_plan
from parsim.errors import ConfigError
from parsim.schedule.ir import Op
from parsim.schedule.pipedream_planner import brute_force_plan, noam, plan, plan_period
from parsim.sim.ampnet import simulate_async, steady_state
from parsim.sim.engine import OpCost
from parsim.simulate import simulate
from tests.helpers import scenario


class StageTimes:
    """F = t/3, B = 2t/3 per stage, free links, no optimizer time."""

    def __init__(self, t):
        self.t = t

    def op_cost(self, stage, op):
        return OpCost({Op.F: self.t[stage] / 3, Op.B: 2 * self.t[stage] / 3}.get(op, 0.0))

    def p2p_bytes(self, stage, op):
        return 0.0

    def link_spec(self, a, b):
        return ("free", 0.0, 0.0)


def _period(t, reps, sync=None, n=48):
    run = simulate_async(len(t), n, StageTimes(t), max_in_flight=noam(reps) * reps[0], replicas=reps,
                         policy="1f1b", sync_s=sync)
    return steady_state(run, 1.0, skip=n // 4, window=n // 2)[0], run


# ----------------------------------------------------------------------------- the steady state


def test_replicating_a_stage_twice_halves_its_share_of_the_period():
    """Stages of 1, 4 and 1 s per microbatch: the middle one sets the period, 4 s; replicated
    twice (round robin) it needs 4 / 2 = 2 s per microbatch, and so does the pipeline."""
    alone, _ = _period([1.0, 4.0, 1.0], (1, 1, 1))
    twice, _ = _period([1.0, 4.0, 1.0], (1, 2, 1))
    assert alone == pytest.approx(4.0)
    assert twice == pytest.approx(2.0)
    assert plan_period([1, 4, 1], [0] * 3, [0] * 3, [(0, 0), (1, 1), (2, 2)], [1, 2, 1],
                       lambda b, m, f: 0.0, lambda a: 0.0) == 2.0


def test_replica_sync_bounds_the_period_when_it_is_longer():
    """Two replicas of a 4 s stage whose gradient all-reduce takes 6 s: max(4, 6) / 2 = 3 s."""
    period, _ = _period([1.0, 4.0, 1.0], (1, 2, 1), sync=(0.0, 6.0, 0.0))
    assert period == pytest.approx(3.0)


def test_unreplicated_pipeline_has_pipedreams_versions_and_staleness():
    sc = scenario(pp=4, m=8, schedule="PipeDream", layers=8)
    rr = simulate(sc).metrics["pipedream_rr"]
    assert rr["config"] == "1-1-1-1"
    assert rr["weight_versions"] == [4, 3, 2, 1]      # min(p - s, m)
    assert rr["staleness_steps"] == [3, 2, 1, 0]      # p - s - 1
    assert rr["staleness_steps"] == simulate(sc).metrics["pipedream"]["staleness_steps"]


def test_vertical_sync_is_staler_and_consistent():
    sc = scenario(pp=4, m=8, schedule="PipeDream", layers=8)
    plain = simulate(sc).metrics["pipedream_rr"]
    vs = simulate(replace(sc, schedule=replace(sc.schedule, vertical_sync=True))).metrics["pipedream_rr"]
    assert all(a >= b for a, b in zip(vs["staleness_steps"], plain["staleness_steps"]))
    assert vs["staleness_steps"][-1] > 0 and plain["staleness_steps"][-1] == 0
    nostash = simulate(replace(sc, schedule=replace(sc.schedule, weight_stashing=False))).metrics["pipedream_rr"]
    assert nostash["weight_versions"] == [1, 1, 1, 1]


# ----------------------------------------------------------------------------- the partitioner


@pytest.mark.parametrize("seed", range(8))
def test_partitioner_equals_brute_force(seed):
    rng = random.Random(seed)
    n, workers = rng.randint(1, 6), rng.randint(1, 5)
    compute = [rng.uniform(0.5, 5.0) for _ in range(n)]
    weights = [rng.uniform(0.0, 3.0) for _ in range(n)]
    act = [rng.uniform(0.0, 2.0) for _ in range(n)]
    # ring all-reduce at unit bandwidth, 3x slower once the group crosses worker 2 (a node edge)
    sync = lambda b, m, f: 2.0 * (m - 1) / m * b * (3.0 if f < 2 < f + m else 1.0)  # noqa: E731
    comm = lambda a: 0.3 * a  # noqa: E731
    dp = plan(compute, weights, act, workers, sync, comm)
    bf = brute_force_plan(compute, weights, act, workers, sync, comm)
    assert dp.period_s == pytest.approx(bf.period_s, rel=1e-12)
    assert sum(dp.replication) == workers
    assert plan_period(compute, weights, act, dp.stages, dp.replication, sync, comm) == pytest.approx(dp.period_s)


def test_auto_on_a_small_model_equals_brute_force_on_its_layer_costs():
    sc = scenario(pp=4, m=4, schedule="PipeDream", layers=6)
    sc = replace(sc, schedule=replace(sc.schedule, stage_replication="auto"))
    p, lc = pipedream_plan(sc)
    bf = brute_force_plan(lc.compute, lc.weights, lc.act, 4, lc.sync, lc.comm)
    assert p.period_s == pytest.approx(bf.period_s, rel=1e-12)
    rr = simulate(sc).metrics["pipedream_rr"]
    assert rr["stage_replication"] == list(p.replication) and sum(rr["stage_layers"]) == 6


def test_layer_costs_sum_to_the_stage_costs():
    sc = scenario(pp=2, m=4, schedule="PipeDream", layers=4)
    lc = LayerCosts(sc)
    st = lc.base.stage_ops(0)
    assert sum(lc.f[:2]) == pytest.approx(st[Op.F].duration_s, rel=1e-9)
    assert sum(lc.b[:2]) == pytest.approx(st[Op.B].duration_s, rel=1e-9)


def test_input_is_checked():
    sc = scenario(pp=4, m=4, schedule="PipeDream", layers=8)
    with pytest.raises(ConfigError, match="sum to 3"):
        simulate(replace(sc, schedule=replace(sc.schedule, stage_replication=(1, 1, 1))))
    from parsim.scenario import scenario_from_dict
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": 2, "model": {"preset": "gpt2"},
           "training": {"global_batch": 2, "seq_len": 512}, "parallel": {"pp": 2},
           "schedule": {"name": "1F1B", "stage_replication": [1, 1]}}
    with pytest.raises(ConfigError, match="PipeDream only"):
        scenario_from_dict(doc, "x.toml")
    doc["schedule"] = {"name": "PipeDream", "stage_replication": [0, 2]}
    with pytest.raises(ConfigError, match="stage_replication"):
        scenario_from_dict(doc, "x.toml")
    doc["schedule"] = {"name": "1F1B-RR", "stage_replication": "auto", "vertical_sync": True}
    assert scenario_from_dict(doc, "x.toml").schedule.stage_replication == "auto"


def test_the_torch_runtime_refuses_what_it_does_not_build():
    from parsim.validate.scale import check_supported
    for key, value in (("stage_replication", (1, 1, 1, 1)), ("vertical_sync", True), ("weight_stashing", False)):
        sc = scenario(pp=4, m=4, schedule="PipeDream", layers=8, hardware="cpu-gloo")
        sc = replace(sc, schedule=replace(sc.schedule, **{key: value}))
        with pytest.raises(ConfigError, match=f"schedule.{key}"):
            check_supported(sc)
