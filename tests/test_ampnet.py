"""AMPNet (Gaunt et al. 2017): message-driven asynchronous model parallelism.

Oracles: synchronous naive model parallelism (the fast engine running the Naive schedule: with
one instance in flight AMPNet is exactly that), hand-computed throughput (one instance at a time:
m * sum(t_F + t_B) + the transfers; many in flight: the slowest stage), the definition of
staleness (updates a stage applies between an instance's forward and its backward: none with one
in flight, more with more), and the fast engine replaying the order AMPNet realized.
"""
from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import ROOT

from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError, ScheduleError
from parsim.schedule import lower
from parsim.schedule.ir import Op, Schedule
from parsim.sim.ampnet import simulate_ampnet
from parsim.sim.engine import simulate_schedule
from parsim.simulate import simulate
from tests.helpers import scenario

MEASURED = {"forward_s": 1.0, "backward_s": 2.0, "p2p_s": 0.25}


def _amp(k=1, every=None, pp=4, m=8, costs=MEASURED, **kw):
    sc = scenario(pp=pp, m=m, schedule="AMPNet", costs=costs, **kw)
    return replace(sc, schedule=replace(sc.schedule, max_in_flight=k, update_every=every))


def test_one_in_flight_is_synchronous_naive_model_parallelism():
    """The cost model's times (no [costs]): the same step as the fast engine's Naive schedule
    when each stage updates once per step (update_every = m)."""
    amp = simulate(_amp(1, every=8, costs=None)).metrics
    naive = simulate(scenario(pp=4, m=8, schedule="Naive")).metrics
    assert amp["step_time_s"] == pytest.approx(naive["step_time_s"], rel=1e-12)


def test_one_in_flight_throughput_is_hand_computed():
    a = simulate(_amp(1)).metrics["ampnet"]
    per_instance = 4 * (1.0 + 2.0) + 2 * 3 * 0.25  # every stage's F and B, 3 links down and back
    assert a["steady_state_step_s"] == pytest.approx(8 * per_instance)
    assert a["staleness_steps"] == [0, 0, 0, 0]


def test_staleness_grows_with_max_in_flight():
    means, steady = [], []
    for k in (1, 2, 3, 4, 6, 8):
        a = simulate(_amp(k, costs={"forward_s": 1.0, "backward_s": 2.0})).metrics["ampnet"]
        means.append(a["staleness"][0]["mean"])
        steady.append(a["steady_state_step_s"])
        assert a["staleness"][-1]["max"] <= (0 if k < 8 else 1)
    assert means == sorted(means) and len(set(means)) == len(means)  # strictly increasing at stage 0
    assert steady == sorted(steady, reverse=True)
    assert steady[-1] == pytest.approx(8 * 3.0)  # enough in flight: the slowest stage, m (t_F + t_B)


def test_pp_in_flight_has_pipedreams_staleness():
    """pp instances in flight, equal stages, an update per backward: stage s's gradient is
    p - s - 1 updates stale, as PipeDream's 1F1B (Narayanan et al. 2019, Sec. 3.3)."""
    a = simulate(_amp(4, costs={"forward_s": 1.0, "backward_s": 2.0})).metrics["ampnet"]
    assert a["staleness_steps"] == [3, 2, 1, 0]


def test_fewer_updates_with_update_every():
    a = simulate(_amp(4, every=4)).metrics["ampnet"]
    assert a["updates_per_step"] == [2.0] * 4
    assert a["staleness"][0]["mean"] < simulate(_amp(4)).metrics["ampnet"]["staleness"][0]["mean"]


def test_the_fast_engine_replays_the_realized_order():
    sc = _amp(3, pp=3, m=6)
    costs = ModelCosts.from_scenario(sc)
    run = simulate_ampnet(3, 6, costs, max_in_flight=3, update_every=1)
    rows = tuple(tuple(a for a in row if a.op is not Op.STEP) for row in run.schedule.actions)
    replay = lower(Schedule("replay", 3, 6, (0, 1, 2), rows))
    raw = simulate_schedule(replay, costs)
    key = lambda spans: sorted((r, op, st, mb, round(s, 12), round(e, 12))
                               for r, stream, op, st, mb, s, e, _ in spans if op in ("F", "B"))
    assert key(raw.spans) == key(run.raw.spans)


def test_input_is_checked():
    from parsim.scenario import scenario_from_dict
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": 2, "model": {"preset": "gpt2"},
           "training": {"global_batch": 2, "seq_len": 512}, "parallel": {"pp": 2},
           "schedule": {"name": "1F1B", "max_in_flight": 2}}
    with pytest.raises(ConfigError, match="AMPNet only"):
        scenario_from_dict(doc, "x.toml")
    doc["schedule"] = {"name": "AMPNet", "update_every": 0}
    with pytest.raises(ConfigError, match="update_every"):
        scenario_from_dict(doc, "x.toml")
    with pytest.raises(ScheduleError, match="dp=1"):
        simulate(scenario(pp=2, dp=2, m=2, schedule="AMPNet"))
    sc = _amp(2)
    with pytest.raises(ScheduleError, match="full engine does not run message-driven"):
        simulate(replace(sc, simulation=replace(sc.simulation, mode="full"), costs=None))


def test_the_json_carries_the_memory_tier_fields_as_every_engine_does(tmp_path):
    """AMPNet's result has the offload fields the other engines' results have: zeros without
    [offload]; with the optimizer on the host, the host bytes a 1F1B run of the same job reports
    (they depend on the stages' states, not on the schedule)."""
    from parsim.scenario import load_scenario
    base = (ROOT / "scenarios" / "ampnet-gpt2-a100.toml").read_text()
    plain = simulate(load_scenario(ROOT / "scenarios" / "ampnet-gpt2-a100.toml")).metrics
    assert plain["host_memory_bytes_per_node"] == 0.0 and plain["nvme_bytes_per_node"] == 0.0
    assert plain["tier_time_s"] == {} and plain["host_fits"]
    off = 'zero = 1\n\n[offload]\noptimizer = "cpu"\n'
    amp = tmp_path / "amp.toml"
    amp.write_text(base.replace("pp = 4\n", "pp = 4\n" + off))
    sync = tmp_path / "sync.toml"
    sync.write_text(base.replace("pp = 4\n", "pp = 4\n" + off).replace('"AMPNet"', '"1F1B"')
                    .replace("max_in_flight = 4\n", "").replace("update_every = 1\n", ""))
    a, s = simulate(load_scenario(amp)).metrics, simulate(load_scenario(sync)).metrics
    assert a["host_memory_bytes_per_node"] > 0
    assert a["host_memory_bytes_per_node"] == pytest.approx(s["host_memory_bytes_per_node"])
