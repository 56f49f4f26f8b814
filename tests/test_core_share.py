"""A CPU rank's transport shares its core (``Device.transport_core_share``).

Oracles: hand-computed ends of compute beside busy intervals; a brute-force time-stepped
integration of the compute's progress; a hand-computed 1F1B step with per-microbatch
reductions through the fast engine; the calibration fit recovering a known share from
model-made rows; the profile key's strict loading and round trip.
"""
from __future__ import annotations

import pandas as pd
import pytest

from parsim.calibrate.fit import fit_core_share, fit_profile
from parsim.cluster.hardware import dumps_profile, load_profile
from parsim.errors import ConfigError
from parsim.schedule import Op, build, lower
from parsim.sim.engine import OpCost, shared_end, simulate_schedule


def test_shared_end_by_hand():
    assert shared_end(0.0, 10.0, [], 0.5) == 10.0
    assert shared_end(0.0, 10.0, [(2.0, 6.0)], 0.5) == pytest.approx(12.0)  # 4 s at half rate: 2 s lost
    assert shared_end(0.0, 10.0, [(2.0, 6.0)], 1.0) == pytest.approx(14.0)  # frozen while it runs
    assert shared_end(0.0, 1.0, [(2.0, 6.0)], 1.0) == 1.0                    # done before it starts
    assert shared_end(3.0, 1.0, [(2.0, 6.0)], 0.5) == pytest.approx(5.0)     # inside it all along
    assert shared_end(0.0, 10.0, [(1.0, 2.0), (4.0, 5.0)], 0.25) == pytest.approx(10.5)
    assert shared_end(7.0, 2.0, [(1.0, 2.0), (4.0, 5.0)], 0.25) == 9.0        # both behind it


@pytest.mark.parametrize("share", [0.1, 0.5, 0.9])
def test_shared_end_against_time_stepping(share):
    busy = [(0.3, 1.1), (1.5, 1.6), (2.0, 4.0)]
    start, work, dt = 0.2, 2.5, 1e-5
    t, done = start, 0.0
    while done < work:
        inside = any(b0 <= t < b1 for b0, b1 in busy)
        done += dt * ((1.0 - share) if inside else 1.0)
        t += dt
    assert shared_end(start, work, busy, share) == pytest.approx(t, abs=3e-5)


class _Costs:
    """One stage: F 10, B 20, each microbatch's reduction 8, STEP 2 (seconds)."""

    def __init__(self, share):
        self.dp_core_share = share

    def op_cost(self, stage, op):
        return OpCost({Op.F: 10.0, Op.B: 20.0, Op.REDUCE_GRAD: 8.0, Op.STEP: 2.0}.get(op, 0.0))

    def p2p_bytes(self, stage, op):
        return 0.0

    def link_spec(self, src, dst):
        return ("link", 1e9, 0.0)


def _step(share):
    low = lower(build("1F1B", 1, 2), grad_per_microbatch=True)
    spans = simulate_schedule(low, _Costs(share)).spans
    return max(s[6] for s in spans), {(s[2], s[4]): (s[5], s[6]) for s in spans}


def test_engine_slows_compute_beside_its_ranks_reduction_by_hand():
    # F0 0-10, B0 10-30, reduce0 30-38 on the dp stream; F1 from 30 runs at half rate until 38
    # (4 s done), then 6 s more: 44; B1 44-64; reduce1 64-72; STEP waits for it: 72-74
    end, at = _step(0.5)
    assert at[("F", 1)] == pytest.approx((30.0, 44.0))
    assert at[("STEP", -1)] == pytest.approx((72.0, 74.0)) and end == pytest.approx(74.0)
    plain_end, plain = _step(0.0)
    assert plain[("F", 1)] == (30.0, 40.0) and plain_end == 70.0


def test_fit_recovers_the_share_and_the_profile_carries_it(tmp_path):
    comm = [0.002, 0.005, 0.016]
    rows = pd.DataFrame([{"kind": "core_share", "name": "all_reduce", "seconds": 0.6 * c, "comm_s": c,
                          "bytes": float(b), "group": 2, "rank": 0, "host": "h"}
                         for c, b in zip(comm, (1 << 20, 4 << 20, 16 << 20))])
    assert fit_core_share(rows) == pytest.approx(0.6)
    assert fit_core_share(rows.assign(seconds=-0.001)) is None  # noise below zero: no sharing
    # time-weighted: the 16 MiB bucket's 0.7 outweighs the 1 MiB one's 0.1 (the median would be 0.4)
    mixed = rows.assign(seconds=[0.1 * comm[0], 0.4 * comm[1], 0.7 * comm[2]])
    assert fit_core_share(mixed) == pytest.approx((0.1 * 0.002 + 0.4 * 0.005 + 0.7 * 0.016) / 0.023)
    base = load_profile("cpu-gloo")
    assert base.device.transport_core_share is None
    fit = fit_profile(base, rows, "shared")
    assert fit.profile.device.transport_core_share == pytest.approx(0.6)
    path = tmp_path / "shared.toml"
    path.write_text(dumps_profile(fit.profile, fit.sources, {}))
    assert load_profile(str(path)).device.transport_core_share == pytest.approx(0.6)
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace("transport_core_share = 0.6", "transport_core_share = 1.5"))
    with pytest.raises(ConfigError, match="transport_core_share"):
        load_profile(str(bad))


@pytest.mark.parametrize("schedule", ["DualPipe", "Chimera", "1F1B"])
def test_full_mode_charges_the_share_as_the_fast_engine(tmp_path, schedule):
    """DualPipe and Chimera all-reduce each stage's gradients with its twin while the other
    stage still computes; both engines slow that compute alike (full mode follows the dp
    stream's collectives as they start and end). 1F1B with its reduction after the last
    backward (``overlap.grad_reduce = false``, as the torch runtime runs it): nothing
    overlaps, the share changes nothing."""
    from dataclasses import replace

    from parsim import load_scenario, simulate
    base = load_profile("cpu-gloo")
    path = tmp_path / "shared.toml"
    path.write_text(dumps_profile(replace(base, device=replace(base.device, transport_core_share=0.7)), {}, {}))
    over = [f"schedule.name={schedule}"] + (["parallel.pp=1", "parallel.dp=2", "overlap.grad_reduce=false"]
                                            if schedule == "1F1B" else [])
    steps = {}
    for hw in ("cpu-gloo", str(path)):
        sc = load_scenario("scenarios/tiny-cpu.toml", over + [f"hardware={hw}"])
        fast = simulate(sc).metrics["step_time_s"]
        full = simulate(replace(sc, simulation=replace(sc.simulation, mode="full"))).metrics["step_time_s"]
        assert full == pytest.approx(fast, rel=0.01), hw
        steps[hw] = fast
    if schedule == "1F1B":
        assert steps[str(path)] == pytest.approx(steps["cpu-gloo"], rel=1e-12)
    else:
        assert steps[str(path)] > steps["cpu-gloo"] * 1.01


def test_hidden_reduction_slows_the_backward_by_the_share():
    """Bucketed reduction under the backward (``overlap.grad_reduce``): the hidden part takes
    ``share`` of the backward's rate, charged to the exposed REDUCE_GRAD as the SMs are on a GPU
    (``shared_slowdown_s``: comm x share when the collective ends first, hand-computed here)."""
    from parsim.cluster.contention import shared_slowdown_s
    assert shared_slowdown_s(0.5, 2.0, 10.0) == 1.0
    assert shared_slowdown_s(0.5, 30.0, 10.0) == 10.0  # the compute, slowed all along, loses W s / (1 - s)
    assert shared_slowdown_s(1.0, 3.0, 1.0) == 3.0
    assert shared_slowdown_s(0.0, 3.0, 1.0) == 0.0
