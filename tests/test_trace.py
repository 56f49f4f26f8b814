"""The Perfetto trace: no partially overlapping slices on any track (every bundled scenario
under every schedule), ``ts`` on metadata, nanosecond timestamps, memory counters equal to
the per-rank peaks, ``--trace -`` and ``--memory-timeline``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from parsim.cli.main import main
from parsim.errors import ParsimError
from parsim.results.trace import chrome_trace, memory_timeline
from parsim.scenario import load_scenario
from parsim.schedule import BUILDERS
from parsim.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.toml") if not p.name.startswith("fl-"))  # fl-*: parsim fl


def partial_overlaps(slices: list[tuple[int, int]]) -> int:
    """Slices that start inside an open slice and end after it (Perfetto cannot draw them)."""
    bad, stack = 0, []
    for s, e in sorted(slices, key=lambda x: (x[0], -x[1])):
        while stack and stack[-1] <= s:
            stack.pop()
        if stack and e > stack[-1]:
            bad += 1
        stack.append(e)
    return bad


def tracks(events: list[dict], key=("pid", "tid")) -> dict:
    out: dict = {}
    for e in events:
        if e["ph"] == "X":
            ns = round(e["ts"] * 1000)
            out.setdefault(tuple(e[k] for k in key), []).append((ns, ns + round(e["dur"] * 1000)))
    return out


def test_partial_overlap_counter_is_a_real_check():
    assert partial_overlaps([(0, 10), (2, 5), (5, 10)]) == 0  # nested and touching
    assert partial_overlaps([(0, 10), (5, 15)]) == 1
    assert partial_overlaps([(0, 10), (2, 8), (3, 7)]) == 0 and partial_overlaps([(0, 10), (2, 8), (7, 9)]) == 1


def test_bidirectional_transfers_do_overlap_on_a_single_stream_track():
    """Why the tracks exist: DualPipe's p2p rows, put one track per (rank, stream) as before,
    overlap partially; the trace splits them."""
    res = simulate(load_scenario(ROOT / "scenarios/gpt3-175b-1f1b.toml", ["schedule.name=DualPipe"]))
    tl = res.timeline
    p2p = tl[tl["stream"] == "p2p"]
    old = sum(partial_overlaps(list(zip((g["start_s"] * 1e9).round().astype(int), (g["end_s"] * 1e9).round().astype(int))))
              for _, g in p2p.groupby("rank"))
    assert old > 0
    ev = chrome_trace(res)["traceEvents"]
    assert all(partial_overlaps(s) == 0 for s in tracks(ev).values())


def _cases():
    for path in SCENARIOS:
        for name in BUILDERS:
            yield pytest.param(path, name, id=f"{path.stem}-{name}")


@pytest.mark.parametrize("path,name", list(_cases()))
def test_no_partial_overlap_on_any_track(path, name):
    """Each scenario's degrees and costs, 2 x pp microbatches (fill, steady state and drain of
    every schedule: the full batches of the 1T scenario take minutes on two cores)."""
    pp = load_scenario(path).parallel.pp
    sets = [f"schedule.name={name}", f"parallel.vpp={2 if name == 'Interleaved1F1B' else 1}",
            f"schedule.n_microbatches={2 * pp}"]
    try:
        res = simulate(load_scenario(path, sets))
    except ParsimError as e:  # a combination the scenario cannot run (layers, degrees): refused, no trace
        pytest.skip(str(e))
    trace = chrome_trace(res)
    json.dumps(trace, allow_nan=False)  # valid JSON
    ev = trace["traceEvents"]
    by_track = tracks(ev)
    assert sum(len(v) for v in by_track.values()) == len(res.timeline)
    for key, sl in by_track.items():
        assert partial_overlaps(sl) == 0, (path.stem, name, key)
    named = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(by_track) <= named
    assert all("ts" in e for e in ev)
    counters = {e["pid"] for e in ev if e["ph"] == "C"}
    assert counters == set(range(res.schedule.pp))


def test_timestamps_are_whole_nanoseconds_and_durations_follow_rounded_ends():
    res = simulate(load_scenario(ROOT / "scenarios/gpt3-175b-1f1b.toml"))
    ev = [e for e in chrome_trace(res)["traceEvents"] if e["ph"] == "X"]
    tl = res.timeline
    for e, row in zip(ev, tl.itertuples(index=False)):
        assert round(e["ts"], 3) == e["ts"] and round(e["dur"], 3) == e["dur"]  # microseconds, 3 decimals: ns
        assert e["ts"] == pytest.approx(row.start_s * 1e6, abs=5e-4)
        assert e["ts"] + e["dur"] == pytest.approx(row.end_s * 1e6, abs=1e-3)
    text = json.dumps(ev)
    assert max(len(t) for t in text.replace(",", " ").replace("}", " ").split() if t[:1].isdigit()) <= 15


def test_memory_counters_peak_at_each_ranks_peak_memory():
    """The timeline's maximum per rank is the peak the metrics report (computed separately by rank_memory)."""
    for name in ("gpt3-175b-1f1b", "deepseek-v3-h800", "tiny-cpu"):
        res = simulate(load_scenario(ROOT / f"scenarios/{name}.toml"))
        mt = memory_timeline(res)
        for st in res.metrics["stages"]:
            got = mt[mt["rank"] == st["rank"]]["total_bytes"].max()
            assert got == pytest.approx(st["peak_memory_bytes"], rel=1e-12)
        m = mt.iloc[1:]
        assert ((m["total_bytes"] - m[["params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes",
                                          "other_bytes"]].sum(axis=1)).abs() < 1).all()
        ev = [e for e in chrome_trace(res)["traceEvents"] if e["ph"] == "C"]
        assert len(ev) == len(mt)
        assert max(sum(e["args"].values()) for e in ev) == pytest.approx(res.metrics["peak_memory_bytes"], rel=1e-12)


def test_trace_to_stdout_is_valid_json_and_the_summary_moves_to_stderr(capsysbinary):
    assert main(["simulate", str(ROOT / "scenarios/tiny-cpu.toml"), "--trace", "-"]) == 0
    out, err = capsysbinary.readouterr()
    trace = json.loads(out)
    assert {e["ph"] for e in trace["traceEvents"]} == {"M", "X", "C"}
    assert b"step time" in err


def test_memory_timeline_csv(tmp_path):
    f = tmp_path / "mem.csv"
    assert main(["simulate", str(ROOT / "scenarios/tiny-cpu.toml"), "--memory-timeline", str(f)]) == 0
    got = pd.read_csv(f)
    want = memory_timeline(simulate(load_scenario(ROOT / "scenarios/tiny-cpu.toml")))
    assert list(got.columns) == list(want.columns)
    assert np.allclose(got.to_numpy(float), want.to_numpy(float))
