"""Posting a send holds the sender (gloo's ``isend`` on a CPU rank: the caller thread writes the
message into the socket before the rank can run its next F/B).

Oracles: hand-computed timelines (the sender's next compute starts ``post`` later, the arrival
does not move), the engines against each other (fast vs full, the fast engine replaying AMPNet's
realized order), a profile written and read back, an alpha-beta fit recovering the line it was
given, and the validation's measured timeline turning the runtime's records into ``post`` spans.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest

from parsim.calibrate.fit import fit_profile
from parsim.cluster.hardware import dumps_profile, load_profile
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.scenario import load_scenario
from parsim.schedule import build, lower
from parsim.schedule.ir import Op, Schedule
from parsim.sim.ampnet import simulate_ampnet
from parsim.sim.engine import OpCost, simulate_schedule
from parsim.simulate import simulate
from parsim.validate.compare import step_timeline

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "scenarios/tiny-cpu.toml")
LAT = 0.375  # link latency: arrival = issue + LAT (no bandwidth term)
POST = 0.125  # the sender's posting time per send


class Costs:
    """F 1 s, B 2.5 s, STEP 0.5 s; sends of 1000 bytes posted in ``post`` seconds."""

    def __init__(self, post: float):
        self.post = post

    def op_cost(self, stage, op):
        return OpCost({Op.F: 1.0, Op.B: 2.5, Op.STEP: 0.5}.get(op, 0.0))

    def p2p_bytes(self, stage, op):
        return 1000.0

    def link_spec(self, src, dst):
        return ("link", 0.0, LAT)

    def send_post_s(self, nbytes):
        assert nbytes == 1000.0
        return self.post


def _spans(raw, stream=None):
    return {(r, op, st, mb): (s, e) for r, strm, op, st, mb, s, e, _ in raw.spans if stream in (None, strm)}


def test_posting_delays_the_senders_next_forward_not_the_arrival():
    """GPipe, 2 stages, 2 microbatches. Rank 0: F0 [0, 1], posts [1, 1 + p], F1 [1 + p, 2 + p].
    Rank 1's F0 starts when message 0 arrives, 1 + LAT (posting does not delay the transfer,
    whose calibrated time runs from the call); its F1 when message 1 arrives, 2 + p + LAT,
    p later than without posting."""
    sched = lower(build("GPipe", 2, 2, 1))
    for post in (0.0, POST):
        raw = simulate_schedule(sched, Costs(post))
        comp, posts = _spans(raw, "compute"), _spans(raw, "post")
        assert comp[(0, "F", 0, 1)] == (1.0 + post, 2.0 + post)
        assert comp[(1, "F", 1, 0)][0] == 1.0 + LAT
        assert comp[(1, "F", 1, 1)][0] == 2.0 + post + LAT
        if post:
            assert posts[(0, "SEND_F", 0, 0)] == (1.0, 1.0 + POST)
            assert posts[(0, "SEND_F", 0, 1)] == (2.0 + POST, 2.0 + 2 * POST)
            assert all(op.startswith("SEND_") for _, op, _, _ in posts)
            n_sends = sum(a.op in (Op.SEND_F, Op.SEND_B) for row in sched.actions for a in row)
            assert len(posts) == n_sends == 4
        else:
            assert not posts


def test_a_blocking_send_waits_for_the_later_of_posting_and_arrival():
    """``[overlap] p2p = false``: the sender waits for the arrival (1 + LAT), which is later than
    its posting (1 + p): F1 starts at 1 + LAT either way."""
    sched = lower(build("GPipe", 2, 2, 1))
    costs = Costs(POST)
    costs.blocking_p2p = True
    comp = _spans(simulate_schedule(sched, costs), "compute")
    assert comp[(0, "F", 0, 1)][0] == 1.0 + max(LAT, POST)


def _profile_with_posting(tmp_path, us=150.0, gbyte_per_s=2.0) -> str:
    text = (ROOT / "parsim/cluster/profiles/cpu-gloo.toml").read_text()
    text = text.replace("[node]\n", f"[node]\nsend_post_us = {us}\nsend_post_gbyte_per_s = {gbyte_per_s}\n", 1)
    text = text.replace('name = "cpu-gloo"', 'name = "cpu-gloo-post"', 1)
    path = tmp_path / "cpu-gloo-post.toml"
    path.write_text(text)
    return str(path)


def test_profile_keys_load_write_and_read_back(tmp_path):
    prof = load_profile(_profile_with_posting(tmp_path))
    assert prof.send_post_latency_s == pytest.approx(150e-6)
    assert prof.send_post_bandwidth == pytest.approx(2e9)
    assert prof.send_post_time(1e6) == pytest.approx(150e-6 + 1e6 / 2e9)
    again = tmp_path / "again.toml"
    again.write_text(dumps_profile(prof))
    back = load_profile(str(again))
    assert (back.send_post_latency_s, back.send_post_bandwidth) == pytest.approx((150e-6, 2e9))
    bundled = load_profile("cpu-gloo")
    assert bundled.send_post_time(1e6) == 0.0 and "send_post" not in dumps_profile(bundled)


@pytest.mark.parametrize("key, value", [("send_post_us", -1.0), ("send_post_gbyte_per_s", 0.0)])
def test_bad_posting_keys_are_refused_in_one_line(tmp_path, key, value):
    text = (ROOT / "parsim/cluster/profiles/cpu-gloo.toml").read_text()
    text = text.replace("[node]\n", f"[node]\n{key} = {value}\n", 1)
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"node.{key}"):
        load_profile(str(path))


def test_fast_and_full_engines_agree_with_posting(tmp_path):
    hw = _profile_with_posting(tmp_path, us=400.0)
    over = [f"hardware={hw}"]
    fast = simulate(load_scenario(TINY, over))
    full = simulate(load_scenario(TINY, [*over, "simulation.mode=full"]))
    plain = simulate(load_scenario(TINY)).metrics["step_time_s"]
    assert full.metrics["step_time_s"] == pytest.approx(fast.metrics["step_time_s"], rel=0.01)
    assert fast.metrics["step_time_s"] > plain  # 1F1B on 2 ranks: some posts sit on the critical path
    for res in (fast, full):
        tl = res.timeline
        posts = tl[tl["stream"] == "post"]
        sends = tl[tl["stream"] == "p2p"]
        assert len(posts) == len(sends) > 0
        want = 400e-6 + posts["bytes"] / 2e9
        assert (posts["end_s"] - posts["start_s"]).to_numpy() == pytest.approx(want.to_numpy())


def test_ampnet_pays_posting_as_the_fast_engine_replaying_its_order(tmp_path):
    """Two in flight, one update per stage at the end (the replay runs no STEP)."""
    sc = load_scenario(TINY, [f"hardware={_profile_with_posting(tmp_path, us=2000.0)}", "parallel.pp=2",
                              "schedule.name=AMPNet"])
    sc = dataclasses.replace(sc, schedule=dataclasses.replace(sc.schedule, max_in_flight=2, update_every=4))
    costs = ModelCosts.from_scenario(sc)
    assert costs.send_post_s(1e6) > 2e-3
    run = simulate_ampnet(2, 4, costs, max_in_flight=2, update_every=4)
    rows = tuple(tuple(a for a in row if a.op is not Op.STEP) for row in run.schedule.actions)
    replay = simulate_schedule(lower(Schedule("replay", 2, 4, (0, 1), rows)), costs)
    key = lambda spans: sorted((r, op, st, mb, round(s, 12), round(e, 12))
                               for r, stream, op, st, mb, s, e, _ in spans if stream in ("compute", "post")
                               and op != "STEP")
    assert key(replay.spans) == key(run.raw.spans)
    assert any(stream == "post" for _, stream, *_ in run.raw.spans)


def test_the_fit_recovers_the_posting_line():
    base = load_profile("cpu-gloo")
    rows = pd.DataFrame([{"kind": "p2p_post", "name": "isend", "bytes": float(s), "seconds": 80e-6 + s / 4e9,
                          "rank": 0, "host": "h"} for s in (1024, 16384, 262144, 1 << 20, 4 << 20)])
    fit = fit_profile(base, rows, "x")
    assert fit.profile.send_post_latency_s == pytest.approx(80e-6, rel=1e-6)
    assert fit.profile.send_post_bandwidth == pytest.approx(4e9, rel=1e-6)
    assert fit.quality["p2p_post"] == pytest.approx(0.0, abs=1e-9)
    assert "node.send_post_us" in fit.sources


def _rank(pp_rank, sends):
    return {"rank": pp_rank, "pp_rank": pp_rank, "dp_rank": 0, "host": "h", "warmup": 0,
            "steps": [{"start": 0.0, "end": 1.0, "recvs": {"1:F:0": 0.5}, "sends": sends, "asyncs": [],
                       "spans": [["compute", "F", pp_rank, 0, 0.0, 0.2, 0.0]]}]}


def test_measured_posts_become_post_spans():
    """The runtime records (op, stage, mb, issued, bytes, posted); older records have no posted."""
    tl = step_timeline([_rank(0, [["SEND_F", 0, 0, 0.2, 4096.0, 0.2003]]), _rank(1, [])], 0, 2)
    post = tl[tl["stream"] == "post"]
    assert len(post) == 1 and float(post["end_s"].iloc[0] - post["start_s"].iloc[0]) == pytest.approx(3e-4)
    p2p = tl[tl["stream"] == "p2p"]
    assert float(p2p["start_s"].iloc[0]) == pytest.approx(0.2) and float(p2p["end_s"].iloc[0]) == pytest.approx(0.5)
    old = step_timeline([_rank(0, [["SEND_F", 0, 0, 0.2, 4096.0]]), _rank(1, [])], 0, 2)
    assert not len(old[old["stream"] == "post"]) and len(old[old["stream"] == "p2p"]) == 1
