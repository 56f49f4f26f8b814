"""Wall time to simulate one optimizer step (a reported number, not a timed test).

    python benchmarks/bench_sim.py [--repeat N]

Prints, for megatron-1t (3,072 A100, TP8 PP64 DP6, interleaved vpp=2, 512 microbatches)
and the same job with 8x the data-parallel degree (global batch x8, so the same
microbatches per pipeline): scenario load, schedule build+lower, engine, metrics, total.
The engine simulates one replica, so cost must not grow with dp.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim import load_scenario  # noqa: E402
from parsim.costs import ModelCosts  # noqa: E402
from parsim.results.result import Result  # noqa: E402
from parsim.sim.engine import simulate_schedule  # noqa: E402
from parsim.simulate import schedule_for  # noqa: E402

CASES = {
    "megatron-1t": [],
    "megatron-1t dp x8": ["gpus=24576", "parallel.dp=48", "training.global_batch=24576"],
}


def time_one(path: Path, overrides: list[str]) -> dict:
    t0 = time.perf_counter()
    sc = load_scenario(path, overrides)
    t1 = time.perf_counter()
    sched = schedule_for(sc)
    costs = ModelCosts.from_scenario(sc)
    t2 = time.perf_counter()
    raw = simulate_schedule(sched, costs)
    t3 = time.perf_counter()
    res = Result.from_raw(sc, sched, costs.tables(sched.stage_to_rank), raw)
    t4 = time.perf_counter()
    n_actions = sum(len(a) for a in sched.actions)
    return {"load": t1 - t0, "build": t2 - t1, "engine": t3 - t2, "metrics": t4 - t3, "total": t4 - t0,
            "actions": n_actions, "spans": len(res.timeline), "step_time_s": res.metrics["step_time_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = ROOT / "scenarios" / "megatron-1t-interleaved.toml"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores; best of {args.repeat}")
    print(f"{'case':<28}{'actions':>9}{'spans':>9}{'load':>8}{'build':>8}{'engine':>8}{'metrics':>9}{'total':>8}  predicted step")
    for name, ov in CASES.items():
        runs = [time_one(path, ov) for _ in range(args.repeat)]
        # the first run builds the schedule; later ones reuse the cached (immutable) build
        for label, best in ((name + " (cold)", runs[0]), (name + " (best)", min(runs, key=lambda r: r["total"]))):
            print(f"{label:<28}{best['actions']:>9}{best['spans']:>9}{best['load']:>8.3f}{best['build']:>8.3f}"
                  f"{best['engine']:>8.3f}{best['metrics']:>9.3f}{best['total']:>8.3f}  {best['step_time_s']:.2f} s")


if __name__ == "__main__":
    main()
