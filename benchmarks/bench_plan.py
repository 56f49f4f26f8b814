"""Speed of `parsim plan` (a reported number, not a timed test).

    python benchmarks/bench_plan.py [--gpus 1024] [--model llama3-70b] [--hardware dgx-h100]

For Llama-3-70B on 1,024 H100 at 4M tokens per step (512 x 8192) it prints:
enumeration time, configurations evaluated per second through the analytic pre-screen on
one core (process CPU time; the wall time beside it depends on what else the machine runs)
-- cold: the cost model's caches and the schedules' activation states emptied, the way one
`parsim plan` starts after enumerating; warm: run again --, the time to confirm the top
configurations with the event simulation, and the end-to-end wall time.
Targets: > 10,000 configurations per second through the cold pre-screen; the whole plan
within 60 s on a 2-core machine.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import parsim.plan.prescreen as ps
from parsim.cluster.hardware import load_profile
from parsim.model import get_preset
from parsim.plan.run import run_plan
from parsim.plan.space import PlanSpec, default_schedules, enumerate_candidates


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-70b")
    ap.add_argument("--hardware", default="dgx-h100")
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--seq-len", type=int, default=8192)
    a = ap.parse_args()
    spec = PlanSpec(model=get_preset(a.model), model_ref=a.model, hardware=load_profile(a.hardware),
                       gpus=a.gpus, global_batch=a.global_batch, seq_len=a.seq_len,
                       schedules=default_schedules(), recompute=("none", "full"))
    t0 = time.perf_counter()
    cands, _ = enumerate_candidates(spec)
    t1 = time.perf_counter()
    ps.clear_caches()  # the schedule builds stay: enumeration makes them, as in every `parsim plan`
    t1, c1 = time.perf_counter(), time.process_time()
    est, _ = ps.prescreen(spec, cands)
    t2, c2 = time.perf_counter(), time.process_time()
    est, _ = ps.prescreen(spec, cands)
    t3, c3 = time.perf_counter(), time.process_time()
    print(f"{a.model} on {a.gpus} x {a.hardware}, {a.global_batch} x {a.seq_len} tokens per step")
    print(f"  enumerate          {len(cands):>7} candidates in {t1 - t0:6.2f} s")
    for label, wall, cpu in (("cold", t2 - t1, c2 - c1), ("warm", t3 - t2, c3 - c2)):
        print(f"  pre-screen ({label})  {len(est):>7} in {cpu:6.2f} s CPU = {len(est) / cpu:,.0f} configurations/s "
              f"on one core ({wall:.2f} s wall)")
    ps.clear_caches()  # the schedule builds stay: enumeration makes them, as in every `parsim plan`
    ps._schedule.cache_clear()
    t4 = time.perf_counter()
    res = run_plan(spec, "time", top=10, workers=1)
    t5 = time.perf_counter()
    w = res.rows[0]
    print(f"  plan end to end    {t5 - t4:6.2f} s (simulate top {res.n_simulated}: {res.timings_s['simulate']:.2f} s)")
    print(f"  winner             {w['key']}: {w['step_time_s']:.3f} s/step, MFU {w['mfu']:.1%}, "
          f"peak {w['peak_memory_bytes'] / 2**30:.1f} of {w['memory_capacity_bytes'] / 2**30:.1f} GiB "
          f"({'fits' if w['fits_in_memory'] else 'DOES NOT FIT'})")


if __name__ == "__main__":
    main()
