"""post_recvs_early: the gloo runtime's lowering (every receive posted at the step's start, or
``ahead`` computes before its consumer).

Oracles: hand-lowered 1F1B lists; structural invariants over every schedule the runtime
runs (same actions, same order apart from RECVs, each RECV at most ``ahead`` computes ahead
of its consumer or all of them before the first compute, validate() passes); and the simulator's semantics (posting a receive is
free, so the simulated timeline is identical). Also the pooled measurement of several
validation launches (hand-computed medians).
"""
from __future__ import annotations

import statistics

import pytest

from parsim.schedule import Op, build, lower, validate
from parsim.schedule.passes import post_recvs_early
from parsim.sim.engine import OpCost, simulate_schedule

COMPUTE = {Op.F, Op.B, Op.I, Op.W}
RUNTIME_SCHEDULES = [("GPipe", 2, 4, 1), ("1F1B", 2, 4, 1), ("1F1B", 4, 8, 1), ("Interleaved1F1B", 2, 4, 2),
                     ("Interleaved1F1B", 4, 8, 2), ("ZBH1", 2, 4, 1), ("ZBH1", 4, 8, 1), ("ZBH2", 4, 8, 1)]


def test_one_f_one_b_by_hand():
    low = post_recvs_early(lower(build("1F1B", 2, 4)), ahead=1)
    assert [str(a) for a in low.actions[1]] == [
        "1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0", "1F1", "1RECV_F2", "1B1", "1SEND_B1", "1F2",
        "1RECV_F3", "1B2", "1SEND_B2", "1F3", "1B3", "1SEND_B3", "1REDUCE_GRAD", "1STEP"]
    assert [str(a) for a in low.actions[0]][:6] == ["0F0", "0SEND_F0", "0RECV_B0", "0F1", "0SEND_F1", "0B0"]
    two = post_recvs_early(lower(build("1F1B", 2, 4)), ahead=2)
    assert [str(a) for a in two.actions[1]][:8] == [
        "1RECV_F0", "1RECV_F1", "1F0", "1B0", "1SEND_B0", "1RECV_F2", "1F1", "1B1"]


def test_default_posts_every_receive_at_the_start():
    low = lower(build("1F1B", 2, 4), early_recv=True)
    assert [str(a) for a in low.actions[1]] == [
        "1RECV_F0", "1RECV_F1", "1RECV_F2", "1RECV_F3", "1F0", "1B0", "1SEND_B0", "1F1", "1B1", "1SEND_B1",
        "1F2", "1B2", "1SEND_B2", "1F3", "1B3", "1SEND_B3", "1REDUCE_GRAD", "1STEP"]
    assert [str(a) for a in low.actions[0]][:7] == [
        "0RECV_B0", "0RECV_B1", "0RECV_B2", "0RECV_B3", "0F0", "0SEND_F0", "0F1"]


def test_ahead_must_be_positive():
    with pytest.raises(ValueError, match="ahead"):
        post_recvs_early(lower(build("1F1B", 2, 4)), ahead=0)


def _consumer(row, k):
    a = row[k]
    want = (Op.F,) if a.op is Op.RECV_F else (Op.B, Op.I)
    return next(j for j in range(k + 1, len(row)) if row[j].stage == a.stage and row[j].op in want
                and row[j].microbatch == a.microbatch)


@pytest.mark.parametrize("ahead", [1, 2, None])
@pytest.mark.parametrize("name, pp, m, vpp", RUNTIME_SCHEDULES)
def test_invariants(name, pp, m, vpp, ahead):
    late = lower(build(name, pp, m, vpp))
    early = post_recvs_early(late, ahead=ahead)
    validate(early)
    recv = (Op.RECV_F, Op.RECV_B)
    for r, (a, b) in enumerate(zip(late.actions, early.actions)):
        assert sorted(map(str, a)) == sorted(map(str, b))
        assert [x for x in a if x.op not in recv] == [x for x in b if x.op not in recv]  # only RECVs move
        assert [x for x in a if x.op in recv] == [x for x in b if x.op in recv]  # and keep their order
        distance = []  # computes between each RECV and its consumer
        for k, x in enumerate(b):
            if x.op in recv:
                j = _consumer(b, k)
                distance.append(sum(1 for y in b[k:j] if y.op in COMPUTE))
                assert b.index(x) < j
        if ahead is None:  # every receive before the rank's first compute
            first = next(k for k, x in enumerate(b) if x.op in COMPUTE)
            assert all(k < first for k, x in enumerate(b) if x.op in recv)
        elif distance:  # none further than asked, and some exactly that far
            assert max(distance) == ahead


@pytest.mark.parametrize("name, pp, m, vpp", RUNTIME_SCHEDULES)
def test_simulated_timeline_does_not_depend_on_where_receives_are_posted(name, pp, m, vpp):
    s = build(name, pp, m, vpp)
    costs = _Costs()
    late = sorted(simulate_schedule(lower(s), costs).spans)
    early = sorted(simulate_schedule(post_recvs_early(lower(s)), costs).spans)
    assert late == early


class _Costs:
    """Distinct durations per (stage, op) so any reordering would show; 1 ms p2p, 100 us latency."""

    def op_cost(self, stage, op):
        base = {Op.F: 1.0, Op.B: 2.0, Op.I: 1.2, Op.W: 0.8, Op.STEP: 0.3}.get(op, 0.0)
        return OpCost(base * (1 + 0.1 * stage))

    def p2p_bytes(self, stage, op):
        return 1e6

    def link_spec(self, src, dst):
        return ("link", 1e9, 1e-4)


def _rank(rank, pp_rank, steps, warmup=1):
    return {"rank": rank, "pp_rank": pp_rank, "dp_rank": 0, "host": "h", "warmup": warmup,
            "steps": [{"start": 10.0 * k, "end": 10.0 * k + t, "recvs": {}, "sends": [], "asyncs": [],
                       "spans": [["compute", "F", pp_rank, 0, 10.0 * k, 10.0 * k + t * 0.5, 0.0]]}
                      for k, t in enumerate(steps)]}


def test_measured_summary_pools_launches():
    from parsim.validate.compare import measured_summary
    # spans end at half the step: the measured step time (makespan) is 0.5 * t
    a = [_rank(0, 0, [9.0, 1.0, 2.0, 3.0]), _rank(1, 1, [9.0, 1.0, 2.0, 3.0])]
    b = [_rank(0, 0, [9.0, 4.0, 6.0]), _rank(1, 1, [9.0, 4.0, 6.0])]
    out, _, tls = measured_summary([a, b], pp=2)
    assert len(tls) == 5  # warm-up steps dropped: 3 + 2
    assert out["step_time_s"] == pytest.approx(0.5 * statistics.median([1, 2, 3, 4, 6]))
    assert out["launch_step_time_s"] == pytest.approx([0.5 * 2.0, 0.5 * 5.0])
    single, _, _ = measured_summary(a, pp=2)  # one launch given as a plain rank list
    assert single["step_time_s"] == pytest.approx(1.0) and single["launch_step_time_s"] == pytest.approx([1.0])


def test_device_drift_against_the_calibration_probe(tmp_path):
    """The probe row of <profile>.csv (median over ranks) vs the run's probe; hand-computed."""
    import pandas as pd

    from parsim.validate.compare import calibration_probe_s, device_drift
    prof = tmp_path / "cal.toml"
    prof.write_text("")
    pd.DataFrame([
        {"kind": "gemm", "name": "forward", "m": 256, "n": 1024, "k": 1024, "seconds": 0.006, "rank": 0},
        {"kind": "gemm", "name": "forward", "m": 256, "n": 1024, "k": 1024, "seconds": 0.008, "rank": 1},
        {"kind": "gemm", "name": "input_grad", "m": 256, "n": 1024, "k": 1024, "seconds": 1.0, "rank": 0},
    ]).to_csv(tmp_path / "cal.csv", index=False)
    assert calibration_probe_s(str(prof)) == pytest.approx(0.007)
    c = {"predicted": {"step_time_s": 0.2}, "measured": {"step_time_s": 0.25, "probe_s": 0.0077}}
    d = device_drift(c, str(prof))
    assert d["run_over_calibration"] == pytest.approx(1.1)
    assert d["step_time_error_at_run_speed"] == pytest.approx(0.2 * 1.1 / 0.25 - 1)
    assert device_drift(c, str(tmp_path / "missing.toml")) is None


def test_validate_refuses_early_receives_on_nccl():
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "parsim", "validate", "scenarios/tiny-cpu.toml", "--backend", "nccl",
                        "--recv", "early"], capture_output=True, text=True,
                       cwd=__import__("pathlib").Path(__file__).resolve().parent.parent)
    if "torch is not installed" in p.stderr:
        pytest.skip("needs the validate extra")
    assert p.returncode == 2
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--recv" in lines[0] and "deadlock" in lines[0] and "Traceback" not in p.stderr
