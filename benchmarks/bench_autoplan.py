"""Speed of `parsim autoplan` (a reported number, not a timed test).

    python benchmarks/bench_autoplan.py [--model megatron-39b] [--hardware aws-p3.16xlarge] [--gpus 64]
                                        [--global-batch 1024] [--seq-len 1024] [--grid]

Default: Alpa's GPT-39B case (Zheng et al. OSDI 2022, Table 4: 48 layers, hidden 8192, 64 heads,
seq 1024, batch 1024, 64 GPUs on eight p3.16xlarge; Alpa reports its search with profiling on the
GPU cluster takes about 40 minutes). Prints the search (every submesh shape, logical mesh,
microbatch count and recomputation: the ILPs and the stage DP), the confirmation of the leaders
in the engine, the CPU time of the process (one core: the search is single-threaded) and the
wall time beside it, and the plan. Target: the whole autoplan within 60 s on one core.
``--grid`` also times `parsim plan`'s grid search for the same question (one worker).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.autoplan.run import AutoplanSpec, autoplan, sharding_table
from parsim.cluster.hardware import load_profile
from parsim.model import get_preset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="megatron-39b")
    ap.add_argument("--hardware", default="aws-p3.16xlarge")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=1024)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--precision", default=None)
    ap.add_argument("--grid", action="store_true", help="also time parsim plan's grid search")
    a = ap.parse_args()
    hw = load_profile(a.hardware)
    prec = a.precision or ("fp16" if "bf16" not in hw.device.peak_flops else "bf16")
    spec = AutoplanSpec(get_preset(a.model), a.model, hw, a.gpus, a.global_batch, a.seq_len, prec)
    c0, w0 = time.process_time(), time.perf_counter()
    res = autoplan(spec)
    c1, w1 = time.process_time(), time.perf_counter()
    st = res.stats
    print(f"autoplan {a.model} on {a.gpus} x {a.hardware}, batch {a.global_batch} x {a.seq_len} ({prec})")
    print(f"  plans {res.n_plans}, ILPs {st['ilps']} ({st['ilp_s']:.2f} s in HiGHS), stage DP {st['dp_s']:.2f} s, "
          f"{len(res.confirmed)} leaders simulated")
    print(f"  CPU {c1 - c0:.1f} s (one core), wall {w1 - w0:.1f} s")
    if res.best is not None:
        p = res.best
        print(f"  plan: pp={p.pp}, stage mesh {dict(p.mesh)}, family {p.family}, {p.n_microbatches} microbatches, "
              f"recompute={p.recompute}, layers {p.pipeline.layers_per_stage}")
        print(f"  sharding: {sharding_table(p)}")
        print(f"  step: {res.metrics['step_time_s']:.3f} s simulated (stage DP estimate {p.estimate_s:.3f} s), "
              f"MFU {100 * res.metrics['mfu']:.1f}%")
    if a.grid:
        from parsim.plan.run import run_plan
        from parsim.plan.space import PlanSpec, default_schedules
        ps = PlanSpec(model=spec.model, model_ref=a.model, hardware=hw, gpus=a.gpus, global_batch=a.global_batch,
                      seq_len=a.seq_len, schedules=default_schedules(), precision=prec)
        c2, w2 = time.process_time(), time.perf_counter()
        g = run_plan(ps, "time", top=1, confirm=4, workers=1, progress=False)
        c3, w3 = time.process_time(), time.perf_counter()
        if g.rows:
            r = g.rows[0]
            print(f"  parsim plan's best: {r['parallel']} {r['schedule']} recompute={r['recompute']} "
                  f"mbs={r['microbatch_size']}: {r['step_time_s']:.3f} s (CPU {c3 - c2:.1f} s, wall {w3 - w2:.1f} s)")


if __name__ == "__main__":
    main()
