"""Wall time of `parsim fl` on 100,000 clients x 100 rounds, 1,000 updates per round (a reported
number, not a timed test; the goal is under 60 s on one core).

    python benchmarks/bench_fl.py [--repeat N]

Cases on scenarios/fl-mobile.toml: as bundled (sync, 30% online, over-commitment 1.3, deadline),
everyone online, availability from a FedScale-format trace (1,000 synthetic on/off traces), and
async FedBuff (1,000 concurrent, buffer 10, 100 aggregations). Prints the best wall time of N
runs (load + simulate + metrics), the SimPy events processed, and the virtual time simulated.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import simpy

from parsim.federated import load_fl_scenario, simulate_fl

SCENARIO = ROOT / "scenarios" / "fl-mobile.toml"


def trace_file(d: str) -> str:
    """1,000 traces: 1-day period, online intervals covering about half of it."""
    rng = np.random.default_rng(0)
    doc = {}
    for i in range(1, 1001):
        edges = np.sort(rng.uniform(0, 86400, 40))
        doc[str(i)] = {"active": edges[0::2].tolist(), "inactive": edges[1::2].tolist(), "finish_time": 86400.0}
    p = os.path.join(d, "trace.json")
    Path(p).write_text(json.dumps(doc))
    return p


def count_events():
    """Patch simpy.Environment.step to count processed events (restored by the caller)."""
    counter = {"n": 0}
    orig = simpy.Environment.step

    def step(self):
        counter["n"] += 1
        return orig(self)
    simpy.Environment.step = step
    return counter, orig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cases = {
            "sync, 30% online (as bundled)": [],
            "sync, always online": ["federated.availability=\"always\""],
            "sync, FedScale-format trace": ["federated.availability=\"trace\"",
                                            f"federated.availability_trace=\"{trace_file(d)}\""],
            "async FedBuff, buffer 10": ["federated.mode=\"async\"", "federated.buffer_size=10"],
        }
        print(f"{'case':32s} {'wall (s)':>9s} {'events':>9s} {'rounds':>7s} {'virtual time':>13s}")
        for name, sets in cases.items():
            best = float("inf")
            for _ in range(args.repeat):
                counter, orig = count_events()
                try:
                    t0 = time.perf_counter()
                    res = simulate_fl(load_fl_scenario(SCENARIO, sets))
                    best = min(best, time.perf_counter() - t0)
                finally:
                    simpy.Environment.step = orig
            m = res.metrics
            print(f"{name:32s} {best:9.2f} {counter['n']:9,d} {m['rounds']:7d} {m['total_time_s']:11.1f} s")


if __name__ == "__main__":
    main()
