"""Full mode's scaling (reported numbers, not timed tests).

    python benchmarks/bench_fullmode.py [--max-gpus N] [--repeat R] [--markdown PATH]

Llama-3-405B on dgx-h100, TP8 PP16, seq 8192, 1F1B, 16 microbatches per pipeline, dp as
the GPU count needs (1,024 GPUs: dp 8 ... 131,072 GPUs: dp 1,024): one optimizer step of
every rank with all p2p and DP traffic as max-min fair flows (``[simulation] mode =
"full"``), on one core. Per size: the engine's wall time (best of R), SimPy events
processed, the time per event, flows, the step time, and the step next to fast mode's
(nothing contends on this non-blocking fabric: they must agree within 1%). Wall time per
event flat as the cluster grows is what near-linear means here.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.config.scenario import SimulationConfig  # noqa: E402
from parsim.costs.model_costs import ModelCosts  # noqa: E402
from parsim.results.result import Result  # noqa: E402
from parsim.scenario import scenario_from_dict  # noqa: E402
from parsim.sim.fullsim import run_full  # noqa: E402
from parsim.simulate import schedule_for, simulate  # noqa: E402

MICROBATCHES = 16


def job(gpus: int):
    dp = gpus // 128
    return scenario_from_dict({
        "name": f"llama3-405b-{gpus}", "hardware": "dgx-h100", "gpus": gpus,
        "model": {"preset": "llama3-405b"},
        "training": {"global_batch": MICROBATCHES * dp, "seq_len": 8192, "microbatch_size": 1,
                     "recompute": "selective"},
        "parallel": {"dp": dp, "tp": 8, "pp": 16, "zero": 1, "sequence_parallel": True},
        "schedule": {"name": "1F1B"},
        "simulation": {"mode": "full"},
    }, "<bench_fullmode>")


def measure(gpus: int, repeat: int) -> dict:
    sc = job(gpus)
    sched = schedule_for(sc)
    costs = ModelCosts.from_scenario(sc)
    best = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        raw, stats = run_full(sc, sched, costs)
        wall = time.perf_counter() - t0
        best = wall if best is None else min(best, wall)
    step = Result.from_raw(sc, sched, costs.tables(sched.stage_to_rank), raw).metrics["step_time_s"]
    fast = simulate(replace(sc, simulation=SimulationConfig("fast"))).metrics["step_time_s"]
    return {"gpus": gpus, "dp": sc.parallel.dp, "wall_s": best, "events": stats.events,
            "us_per_event": best / stats.events * 1e6, "flows": stats.net.flows, "step_s": step,
            "vs_fast": step / fast - 1}


HEADER = ("| GPUs | dp | wall (s) | events | µs / event | flows | step (s) | step vs fast |\n"
          "|---:|---:|---:|---:|---:|---:|---:|---:|")


def row(r: dict) -> str:
    return (f"| {r['gpus']:,} | {r['dp']:,} | {r['wall_s']:.2f} | {r['events']:,} | {r['us_per_event']:.2f} | "
            f"{r['flows']:,} | {r['step_s']:.3f} | {r['vs_fast'] * 100:+.2f}% |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-gpus", type=int, default=131072)
    ap.add_argument("--repeat", type=int, default=1, help="engine runs per size; the best is reported")
    ap.add_argument("--markdown", type=Path, help="also write the table to this file (the table only)")
    args = ap.parse_args()
    print(f"python {platform.python_version()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores (one used)")
    print(HEADER, flush=True)
    rows, gpus = [], 1024
    while gpus <= args.max_gpus:
        r = measure(gpus, args.repeat)
        rows.append(r)
        print(row(r), flush=True)
        gpus *= 2
    if args.markdown:
        args.markdown.write_text(HEADER + "\n" + "\n".join(row(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
