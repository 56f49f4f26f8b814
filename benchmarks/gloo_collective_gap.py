"""How a gloo collective's in-situ cost depends on the compute before it (CPU ranks).

    python benchmarks/gloo_collective_gap.py [--gaps 0.75,1.5,3,6] [--kib 256] [--ranks 2]

Calibration (``parsim.validate.bench.Bench.collectives``) times each blocking collective *in
situ*: ``COMM_GAP_S`` (1.5 ms) of GEMMs between calls, the same work on every rank, and what the
calls add to that loop is the row (``in_situ_call_time``). This script repeats that measurement
at several gaps. On the 2-core VM of the validation records (2026-11-30, quiet) a 256 KiB
all-reduce cost 1.58 ms after 0.9 ms of GEMMs, 1.79 ms after 1.8 ms, 2.23 ms after 2.7 ms and
2.97 ms after 6.3 ms (calibration recorded 1.61 ms at its 1.5 ms gap): the transport's threads
wake on cores the compute has held longer. A layer that computes longer
than the calibrated gap between its collectives (the tiny GPT's tp=2 backward, ~2.6 ms) pays more
per call than the profile says -- one part of the tp2 / ep2 validation cases' gap (the ranks'
arrival skew, which equal work here leaves out, is another). Measured, not fitted: the numbers
are printed, nothing is written.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _worker(rank: int, world: int, gaps_s: list[float], nbytes: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    from parsim.validate.bench import in_situ_call_time
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = dist.new_group(list(range(world)))  # as the runtime's tp / ep groups
    a = [torch.randn(32, 1024) for _ in range(64)]  # operands cycled as a layer's would be
    b = torch.randn(1024, 1024)
    cursor = [0]

    def gemm():
        cursor[0] = (cursor[0] + 1) % len(a)
        return a[cursor[0]] @ b
    t = time.perf_counter()
    for _ in range(50):
        gemm()
    per = (time.perf_counter() - t) / 50
    buf = torch.zeros(max(world, nbytes // 4), dtype=torch.float32)
    rows = []
    for gap_s in gaps_s:
        count = torch.tensor([max(1, round(gap_s / per))])
        dist.broadcast(count, 0)  # the same work on every rank, as calibration runs it
        n = int(count.item())

        def gap(n=n):
            for _ in range(n):
                gemm()
        dist.barrier()
        mean, per_repeat = in_situ_call_time(lambda: dist.all_reduce(buf, group=group), gap, lambda: None,
                                             repeats=6, calls=40)
        rows.append((n * per, mean, statistics.median(per_repeat)))
    if rank == 0:
        print(f"all-reduce of {buf.numel() * 4 / 1024:.0f} KiB over {world} gloo ranks, timed in situ "
              f"(one GEMM {per * 1e3:.2f} ms)")
        print("gap before each call (ms) | in-situ cost, mean (ms) | median of repeats (ms)")
        for g, m, med in rows:
            print(f"{g * 1e3:25.2f} | {m * 1e3:23.3f} | {med * 1e3:.3f}")
    dist.destroy_process_group()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gaps", default="0.75,1.5,3,6", help="compute between calls, ms (comma-separated)")
    ap.add_argument("--kib", type=int, default=256, help="all-reduce size (KiB)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--port", type=int, default=29533)
    args = ap.parse_args(argv)
    import torch.multiprocessing as mp
    gaps = [float(x) * 1e-3 for x in args.gaps.split(",")]
    mp.spawn(_worker, args=(args.ranks, gaps, args.kib * 1024, args.port), nprocs=args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
