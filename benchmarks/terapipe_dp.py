"""TeraPipe's slicing DP (parsim.schedule.terapipe.optimal_slicing): wall time for L = 2048 tokens
on TeraPipe's 8-token grid (256 grid points) and 96 stages, on the GPT-3 175B / p3.16xlarge
scenario's own slice times, and the end-to-end ``token_slices = "auto"`` (cost-model table
on the scenario's 32-token grid + DP + simulation). Best of 3.

    PYTHONPATH=. python benchmarks/terapipe_dp.py
"""
from __future__ import annotations

import time
from pathlib import Path

from parsim.costs.slices import SliceCostModel
from parsim.scenario import load_scenario
from parsim.schedule.terapipe import optimal_slicing, time_matrix
from parsim.simulate import simulate

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "gpt3-175b-terapipe-p3.toml"


def best_of(fn, n=3):
    out, best = None, float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def main() -> None:
    sc = load_scenario(str(SCENARIO))
    model = SliceCostModel(sc)
    # the table t(l, c) on the 8-token grid, from the cost model (computed once, not timed):
    # tile-exact attention GEMMs for 33k (length, context) pairs take a while
    t0 = time.perf_counter()
    T = time_matrix(2048, 8, model.stage_time)
    table_s = time.perf_counter() - t0
    for stages in (8, 48, 96):
        sol, dt = best_of(lambda: optimal_slicing(2048, stages, model.stage_time, grid=8, microbatches=2, T=T))
        print(f"DP  L=2048 grid=8 (256 points) stages={stages:3d}: {dt:.3f} s  -> {len(sol.lengths)} slices, "
              f"first {sol.lengths[:4]} last {sol.lengths[-4:]}, objective {sol.objective_s:.3f} s")
    print(f"(cost table for the 8-token grid: {table_s:.1f} s, once)")
    res, dt = best_of(lambda: simulate(sc), n=1)
    print(f"end to end: simulate(token_slices='auto') {dt:.2f} s -> {res.metrics['token_slices']} slices, "
          f"step {res.metrics['step_time_s']:.3f} s")


if __name__ == "__main__":
    main()
