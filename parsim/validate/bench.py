"""Microbenchmarks for `parsim calibrate`: one process per rank, all ranks at once.

``python -m parsim.validate.bench JOB.json`` (started by :mod:`parsim.validate.launch`).
Compute benchmarks run on every rank *simultaneously* (barrier before each case): a rank
of a real run shares the machine with the others, so the device being calibrated is
"one rank while all ranks compute". Cases:

* gemm: ``F.linear`` forward (x W^T), input-gradient (g W) and weight-gradient (g^T x)
  GEMMs over a grid of shapes, cycling through 64 MiB of operand copies (cold caches, as
  in training, where weights and activations stream from memory);
* memory: streaming ops (residual add, LayerNorm, GeLU) on activation-sized tensors,
  with the bytes each reads + writes;
* attention: the attention core (explicit scores + softmax + @V, and SDPA) forward and
  backward over a grid of sequence lengths and head counts;
* launch: a one-element op (per-op dispatch overhead);
* p2p: isend/irecv ping-pong between rank 0 and every other rank over message sizes;
* collectives: all_reduce, all_gather, broadcast over message sizes and group sizes.

Each rank writes ``bench_rank<R>.json``: rows of {kind, name, m, n, k, bytes, flops,
group, peers, seconds, rank, host}.
"""
from __future__ import annotations

import json
import math
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .timing import join_group, start_worker

GEMM_M = (64, 256, 1024)
GEMM_NK = ((256, 256), (768, 256), (1024, 256), (256, 1024), (1024, 1024), (3072, 1024))
MEM_SHAPES = ((256, 256), (1024, 256), (256, 1024), (1024, 1024), (2048, 1024))
ATTN = ((128, 8, 64), (256, 8, 64), (512, 4, 64), (64, 16, 64))  # (seq, batch*heads, head_dim)
COLD_BYTES = 64 * 2 ** 20  # operands cycled per benchmark: beyond the per-core caches
MSG_BYTES = tuple(4 ** i * 1024 for i in range(0, 7))  # 1 KiB .. 4 MiB
QUICK = {"GEMM_M": (256,), "GEMM_NK": GEMM_NK[:2], "MEM_SHAPES": MEM_SHAPES[:2], "ATTN": ATTN[:1],
         "MSG_BYTES": (4096, 1048576)}


def _time(fn, sync, target_s: float = 0.03, repeats: int = 7, calls: int | None = None) -> float:
    """Median seconds of one call (calls batched to ~target_s per repeat, or exactly ``calls``:
    communication benchmarks must make the same number of calls on every rank)."""
    fn(); sync()
    t = time.perf_counter(); fn(); sync()
    one = max(time.perf_counter() - t, 1e-7)
    n = calls or max(1, min(1000, int(target_s / one)))
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        out.append((time.perf_counter() - t) / n)
    return statistics.median(out)


def _comm_calls(nbytes: int) -> int:
    return max(3, min(100, int(4e6 / max(nbytes, 4e4))))


class Bench:
    def __init__(self, rank, world, device, dtype, quick):
        self.rank, self.world, self.dev, self.dtype = rank, world, device, dtype
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.rows: list[dict] = []
        self.host = socket.gethostname()
        self.quick = quick

    def add(self, kind, name, seconds, **kw):
        self.rows.append({"kind": kind, "name": name, "seconds": seconds, "rank": self.rank,
                          "host": self.host, **kw})

    def rand(self, *shape):
        return torch.randn(*shape, dtype=self.dtype, device=self.dev)

    def rotating(self, *shapes):
        """Enough copies of the operands to overflow the caches, and a cursor over them:
        in training, weights and activations stream from memory, not from a hot cache."""
        el = torch.finfo(self.dtype).bits // 8
        per_set = sum(math.prod(s) for s in shapes) * el
        sets = [[self.rand(*s) for s in shapes] for _ in range(max(1, min(64, math.ceil(COLD_BYTES / per_set))))]
        state = {"i": 0}

        def nxt():
            state["i"] = (state["i"] + 1) % len(sets)
            return sets[state["i"]]
        return nxt

    def gemms(self):
        for m in (QUICK["GEMM_M"] if self.quick else GEMM_M):
            for n, k in (QUICK["GEMM_NK"] if self.quick else GEMM_NK):
                ops = self.rotating((m, k), (n, k), (m, n))

                def fwd():
                    x, w, _ = ops()
                    return F.linear(x, w)

                def dx():
                    _, w, g = ops()
                    return g @ w

                def dw():
                    x, _, g = ops()
                    return g.t() @ x
                cases = {"forward": (fwd, (m, n, k)), "input_grad": (dx, (m, k, n)), "weight_grad": (dw, (n, k, m))}
                for name, (fn, (mm, nn, kk)) in cases.items():
                    dist.barrier()
                    self.add("gemm", name, _time(fn, self.sync), m=mm, n=nn, k=kk, flops=2.0 * mm * nn * kk)

    def memory(self):
        el = torch.finfo(self.dtype).bits // 8
        for t, d in (QUICK["MEM_SHAPES"] if self.quick else MEM_SHAPES):
            ops = self.rotating((t, d), (t, d))
            ln = torch.nn.LayerNorm(d, device=self.dev, dtype=self.dtype)

            def add():
                a, b = ops()
                return a + b

            def norm():
                return ln(ops()[0])

            def gelu():
                return F.gelu(ops()[0])
            cases = {"add": (add, 3), "layernorm": (norm, 2), "gelu": (gelu, 2)}
            with torch.no_grad():
                for name, (fn, touches) in cases.items():
                    dist.barrier()
                    self.add("memory", name, _time(fn, self.sync), m=t, n=d, bytes=float(touches * t * d * el))

    def attention(self):
        for s, bh, hd in (QUICK["ATTN"] if self.quick else ATTN):
            q, k, v = (self.rand(bh, s, hd).requires_grad_() for _ in range(3))
            mask = torch.full((s, s), float("-inf"), dtype=self.dtype, device=self.dev).triu(1)
            flops = 4.0 * bh * s * s * hd  # QK^T and PV, full s x s (model convention)

            def explicit():
                return torch.softmax((q * hd ** -0.5) @ k.transpose(-2, -1) + mask, -1) @ v

            def sdpa():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            for name, fn, executed in (("explicit", explicit, flops), ("sdpa", sdpa, flops / 2)):
                with torch.no_grad():
                    dist.barrier()
                    self.add("attention", f"{name}_forward", _time(fn, self.sync), m=s, n=bh, k=hd, flops=executed)
                out = fn()
                gout = torch.randn_like(out)
                ratio = 2.0 if name == "explicit" else 2.5

                def bwd(out=out, gout=gout):
                    torch.autograd.grad(out, (q, k, v), gout, retain_graph=True)
                dist.barrier()
                self.add("attention", f"{name}_backward", _time(bwd, self.sync), m=s, n=bh, k=hd,
                         flops=executed * ratio)

    def launch(self):
        a = self.rand(1)
        dist.barrier()
        self.add("launch", "tiny_op", _time(lambda: a.add(1.0), self.sync, repeats=7))

    def p2p(self, sizes):
        for peer in range(1, self.world):
            for nbytes in sizes:
                buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=self.dev)
                dist.barrier()
                if self.rank not in (0, peer):
                    continue
                other = peer if self.rank == 0 else 0

                def pingpong():
                    if self.rank == 0:
                        dist.send(buf, other); dist.recv(buf, other)
                    else:
                        dist.recv(buf, other); dist.send(buf, other)
                t = _time(pingpong, self.sync, repeats=5, calls=_comm_calls(nbytes)) / 2
                if self.rank == 0:
                    self.add("p2p", "send_recv", t, bytes=float(buf.numel() * 4), group=2, peers=f"0-{peer}")

    def collectives(self, sizes):
        for n in range(2, self.world + 1):
            group = dist.new_group(list(range(n)))
            for nbytes in sizes:
                el = max(n, (nbytes // 4) // n * n)
                buf = torch.zeros(el, dtype=torch.float32, device=self.dev)
                parts = list(buf.chunk(n))
                shard = torch.zeros(el // n, dtype=torch.float32, device=self.dev)
                cases = {"all_reduce": lambda: dist.all_reduce(buf, group=group),
                         "all_gather": lambda: dist.all_gather(parts, shard, group=group),
                         "broadcast": lambda: dist.broadcast(buf, 0, group=group)}
                for name, fn in cases.items():
                    dist.barrier()
                    if self.rank < n:
                        t = _time(fn, self.sync, repeats=5, calls=_comm_calls(nbytes))
                        if self.rank == 0:
                            self.add("collective", name, t, bytes=float(el * 4), group=n)


def main(job_file: str) -> int:
    job, rank, world, local = start_worker(job_file)
    device = join_group(job, rank, world, local, default_timeout_s=60)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[job.get("precision", "fp32")]
    quick = bool(job.get("quick"))
    b = Bench(rank, world, device, dtype, quick)
    sizes = QUICK["MSG_BYTES"] if quick else MSG_BYTES
    b.gemms(); b.memory(); b.attention(); b.launch()
    if world > 1:
        b.p2p(sizes); b.collectives(sizes)
    (Path(job["out"]) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "rows": b.rows}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
