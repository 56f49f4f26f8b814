"""Microbenchmarks for `parsim calibrate`: one process per rank, all ranks at once.

``python -m parsim.validate.bench JOB.json`` (started by :mod:`parsim.validate.launch`).
Compute benchmarks run on every rank *simultaneously* (barrier before each case): a rank
of a real run shares the machine with the others, so the device being calibrated is
"one rank while all ranks compute". Cases:

* gemm: ``F.linear`` forward (x W^T), input-gradient (g W) and weight-gradient (g^T x)
  GEMMs over a grid of shapes, cycling through 64 MiB of operand copies (cold caches, as
  in training, where weights and activations stream from memory), every result kept
  (:class:`Sink`: written to memory that is not in a cache, as a step's outputs are);
* memory: streaming ops (residual add, LayerNorm, GeLU) on activation-sized tensors,
  with the bytes each reads + writes, results kept the same way; and in-place updates
  (``add_`` as gradient accumulation does, ``mul_`` + ``addcmul_`` as an optimizer's state
  update: read and write the same buffers, ``update``), and the optimizer step itself (Adam,
  fused as the runtime builds it: ``optimizer``);
* attention: the attention core (explicit scores + softmax + @V, and SDPA) forward (autograd
  recording, as in training) and backward over a grid of sequence lengths and head counts;
* launch: a one-element op (per-op dispatch overhead);
* eager: the runtime's own block forward and backward at a negligible size, with the aten ops
  each dispatched (host time per op of an eager module pass; CPU devices only);
* p2p: isend/irecv ping-pong between rank 0 and every other rank over message sizes
  (``p2p_idle``: both sides waiting), and the exchange pipeline ranks make after an F or B,
  one of them computing on while its send drains (``p2p`` ``exchange``; on several hosts,
  one-way sends whose sender goes on computing, ``send_busy_sender``): what the link's
  alpha/beta are fitted to; and the sender's own time inside ``isend`` (``p2p_post``, CPU
  ranks: gloo's caller thread writes into the socket);
* collectives: all_reduce, all_gather, reduce_scatter, all_to_all (as the runtime calls
  them), broadcast and the context-parallel ring step over message sizes and group sizes;
* core share: a GEMM loop beside an in-flight all-reduce against both alone (``core_share``:
  what an overlapped collective takes from the compute of a CPU rank);
* re-warm: the runtime's block forward right after each blocking kind against right after a
  spin of the call's length, less the same difference for a GEMM loop of the block's length
  (``rewarm``: what a blocking call costs the block ops after it beyond what the in-situ
  collective rows, timed between GEMM loops, already price; CPU ranks).

Compute cases are timed in interleaved passes (every case once per pass, ``PASSES``
passes, median per case): this shared VM's speed drifts by +-10% over seconds to
minutes, and timing one case's repeats back to back would bend the fitted shape curves
with it; interleaved, every case sees the same mix of fast and slow moments.

Each rank writes ``bench_rank<R>.json``: rows of {kind, name, m, n, k, bytes, flops,
group, peers, seconds, rank, host}.

:func:`probe` times one fixed case of the grid (``PROBE``) exactly as calibration does;
validation runs it between measured steps, so a report can say how fast the device ran
during the run compared with during the calibration.
"""
from __future__ import annotations

import itertools
import json
import math
import socket
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parsim.calibrate.spread import pass_spread, robust_sigma
from parsim.cluster.collectives import FLOOR_S
from parsim.validate.compare import PROBE
from parsim.validate.optim import optimizer_factory
from parsim.validate.ring import exchange
from parsim.validate.timing import join_group, start_worker

GEMM_M = (64, 256, 1024)
GEMM_NK = ((256, 256), (768, 256), (1024, 256), (256, 1024), (1024, 1024), (3072, 1024))
MEM_SHAPES = ((256, 256), (1024, 256), (256, 1024), (1024, 1024), (2048, 1024))
ATTN = ((128, 8, 64), (256, 8, 64), (512, 4, 64), (64, 16, 64))  # (seq, batch*heads, head_dim)
COLD_BYTES = 64 * 2 ** 20  # operands cycled per benchmark: beyond the per-core caches
MSG_BYTES = tuple(4 ** i * 1024 for i in range(0, 8))  # 1 KiB .. 16 MiB (a stage's gradients: ~8 MB)
PASSES = 7
CORE_SHARE_BYTES = (1 << 20, 4 << 20, 16 << 20)  # gradient buckets: long enough to time a GEMM loop beside
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




def in_situ_call_time(fn, gap, sync, repeats: int, calls: int) -> tuple[float, list[float]]:
    """(mean seconds ``fn`` adds to a rank that computes ``gap`` between its calls, per
    repeat). Each repeat, after one gap, times ``calls`` x (fn, gap) and then ``calls`` x gap
    alone: the difference per call is the call itself, its wait for the other ranks and
    whatever it slows in the compute after it (caches refilled, the transport's threads still
    on the core), which is what a blocking collective inside F or B costs that rank."""
    fn(); sync()
    out = []
    for _ in range(repeats):
        gap(); sync()  # every timed call follows compute, as inside F/B
        t = time.perf_counter()
        for _ in range(calls):
            fn(); gap()  # each call's aftermath lands in the compute timed after it
        sync()
        both = time.perf_counter() - t
        gap(); sync()  # absorbs what the last call slowed
        t = time.perf_counter()
        for _ in range(calls):
            gap()
        sync()
        # floored (FLOOR_S) a call: where the loop's own noise is larger than the call (a cheap
        # call, a quick calibration's few repeats) the difference can come out at or below zero
        out.append(max(FLOOR_S, (both - (time.perf_counter() - t)) / calls))
    return statistics.fmean(out), out


def rotating(shapes, dtype, device):
    """Enough copies of the operands to overflow the caches, and a cursor over them:
    in training, weights and activations stream from memory, not from a hot cache."""
    el = torch.finfo(dtype).bits // 8
    per_set = sum(math.prod(s) for s in shapes) * el
    n_sets = max(1, min(64, math.ceil(COLD_BYTES / per_set)))
    sets = [[torch.randn(*s, dtype=dtype, device=device) for s in shapes] for _ in range(n_sets)]
    state = {"i": 0}

    def nxt():
        state["i"] = (state["i"] + 1) % len(sets)
        return sets[state["i"]]
    return nxt


class Sink:
    """Keeps the results of timed calls alive, the newest ``COLD_BYTES`` of them (one sink
    shared by every case, so the memory held stays bounded): each call then writes to memory
    that is not in a cache. A training step keeps its forward's outputs for the backward and
    the allocator hands every new output a block last touched long before; a benchmark that
    drops each result writes the next one into the same, cache-hot block. On this 2-core VM
    that difference is 17-21% of an output-heavy GEMM (256 x 768 x 256, fp32: 0.61 ms
    dropped, 0.75 ms kept; inside the tiny model's forward 0.71 ms) and 5% of a K-heavy one
    (256 x 256 x 1024)."""

    def __init__(self, limit_bytes: float = COLD_BYTES):
        self.limit = limit_bytes
        self.held: deque = deque()
        self.bytes = 0.0

    def keep(self, out) -> None:
        tensors = out if isinstance(out, (tuple, list)) else (out,)
        n = float(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)))
        self.held.append((out, n))
        self.bytes += n
        while self.bytes > self.limit and len(self.held) > 1:
            self.bytes -= self.held.popleft()[1]

    def wrap(self, fn):
        """``fn`` with its result kept."""
        def call():
            out = fn()
            self.keep(out)
            return out
        return call


def probe(device, dtype):
    """A callable timing ``PROBE`` the way :meth:`Bench.gemms` does (seconds per call)."""
    ops = rotating(((PROBE["m"], PROBE["k"]), (PROBE["n"], PROBE["k"])), dtype, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def fwd():
        x, w = ops()
        return F.linear(x, w)
    timed = Sink().wrap(fwd)
    return lambda: _time(timed, sync, repeats=3)


COMM_REPEATS = 6
"""Repeats of a collective case; with :func:`_comm_calls` at least 60 calls per case, enough
for the mean of a heavy-tailed time (a stall in ~1 of 20 calls) to settle within ~10%."""
IN_SITU_CALLS = 40
"""Calls per repeat at least, timed in situ: there ~15-30% of calls wait ~3.5 ms, so their
mean needs more calls than :func:`_comm_calls` gives large messages."""
COMM_GAP_S = 1.5e-3
"""Compute between two collectives timed in situ: what a rank of the validated models computes
between two blocking collectives inside F/B (the tiny GPT at tp=2: ~1 ms forward, ~2 ms backward)."""


GAP_SWEEP_S = (0.5 * COMM_GAP_S, COMM_GAP_S, 2 * COMM_GAP_S, 4 * COMM_GAP_S)
"""Compute before each call in :meth:`Bench.collective_gaps` (the reference gap among them): the
tiny models' blocks compute ~1-7 ms between their tensor- and expert-parallel collectives."""
GAP_SWEEP_BYTES = 256 * 2 ** 10
"""Size of the gap sweep's calls: the tiny GPT's activation (2 x 128 tokens x 256 x fp32)."""
GAP_SWEEP_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
"""The blocking kinds a block calls inside F/B: tensor parallelism's all-reduce (and with sequence
parallelism all-gather and reduce-scatter), the expert all-to-all and its count all-gather. The
context-parallel ring step is not one: it runs beside its block's attention (``parsim.costs.context``)."""


REWARM_TRIALS = 150
"""Trials of :meth:`Bench.rewarm` (each: every kind, after a call and after a spin, before a block
forward and before a GEMM loop, in a shuffled order); at ~0.2 s a trial, half a minute."""


def _spin(seconds: float) -> None:
    """Keep the core busy for ``seconds`` (a wait that does not let it idle)."""
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def _comm_calls(nbytes: int) -> int:
    return max(10, min(100, int(4e6 / max(nbytes, 4e4))))


class Bench:
    def __init__(self, rank, world, device, dtype, quick, passes: int = 0):
        self.rank, self.world, self.dev, self.dtype = rank, world, device, dtype
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.rows: list[dict] = []
        self.host = socket.gethostname()
        self.quick = quick
        self.passes = passes  # 0: the default (PASSES, or 3 with quick)
        self.sink = Sink()  # timed compute writes to cache-cold memory, as a training step does

    def add(self, kind, name, seconds, **kw):
        self.rows.append({"kind": kind, "name": name, "seconds": seconds, "rank": self.rank,
                          "host": self.host, **kw})

    def rand(self, *shape):
        return torch.randn(*shape, dtype=self.dtype, device=self.dev)

    def rotating(self, *shapes):
        return rotating(shapes, self.dtype, self.dev)

    def run_passes(self, cases: list[tuple]) -> None:
        """Time ``cases`` [(kind, name, fn, row fields)] in ``PASSES`` interleaved passes
        (both ranks in lockstep: a barrier before each timing); one row per case, the median."""
        passes = self.passes or (3 if self.quick else PASSES)
        times: list[list[float]] = [[] for _ in cases]
        for _ in range(passes):
            for i, (_, _, fn, _) in enumerate(cases):
                dist.barrier()
                times[i].append(_time(fn, self.sync, repeats=1))
        repeat, speed = pass_spread(times)  # kept in the profile: what --samples draws from
        for (kind, name, _, fields), ts, r in zip(cases, times, repeat):
            self.add(kind, name, statistics.median(ts), repeat_sigma=r, speed_sigma=speed, **fields)

    def gemms(self):
        cases = []
        for m in (QUICK["GEMM_M"] if self.quick else GEMM_M):
            for n, k in (QUICK["GEMM_NK"] if self.quick else GEMM_NK):
                ops = self.rotating((m, k), (n, k), (m, n))

                def fwd(ops=ops):
                    x, w, _ = ops()
                    return F.linear(x, w)

                def dx(ops=ops):
                    _, w, g = ops()
                    return g @ w

                def dw(ops=ops):
                    x, _, g = ops()
                    return g.t() @ x
                for name, fn, (mm, nn, kk) in (("forward", fwd, (m, n, k)), ("input_grad", dx, (m, k, n)),
                                               ("weight_grad", dw, (n, k, m))):
                    cases.append(("gemm", name, self.sink.wrap(fn),
                                  {"m": mm, "n": nn, "k": kk, "flops": 2.0 * mm * nn * kk}))
        self.run_passes(cases)

    def memory(self):
        el = torch.finfo(self.dtype).bits // 8
        cases = []
        for t, d in (QUICK["MEM_SHAPES"] if self.quick else MEM_SHAPES):
            ops = self.rotating((t, d), (t, d))
            ln = torch.nn.LayerNorm(d, device=self.dev, dtype=self.dtype)

            def add(ops=ops):
                a, b = ops()
                return a + b

            def norm(ops=ops, ln=ln):
                return ln(ops()[0])

            def gelu(ops=ops):
                return F.gelu(ops()[0])
            for name, fn, touches in (("add", add, 3), ("layernorm", norm, 2), ("gelu", gelu, 2)):
                cases.append(("memory", name, self.sink.wrap(fn), {"m": t, "n": d, "bytes": float(touches * t * d * el)}))
            upd = self.rotating((t, d), (t, d), (t, d))

            def add_(ops=upd):  # grad += dW
                a, b, _ = ops()
                a.add_(b)

            def addcmul_(ops=upd):  # an optimizer's state update: m = beta m + (1 - beta) g * g
                a, b, c = ops()
                a.mul_(0.999).addcmul_(b, c, value=0.001)
            for name, fn, touches in (("add_", add_, 3), ("addcmul_", addcmul_, 6)):
                cases.append(("update", name, fn, {"m": t, "n": d, "bytes": float(touches * t * d * el)}))
            cases.append(("optimizer", "adam", self.adam_steps(t, d), {"m": t, "n": d, "bytes": float(7 * t * d * el)}))
        with torch.no_grad():
            self.run_passes(cases)

    def adam_steps(self, t: int, d: int):
        """One Adam step (fused where this torch has it, as the validation runtime builds it)
        per call, over a rotating set of (t, d) parameters with gradients: cold, as a real
        step's states are. Bytes per element as ``parsim.costs.dp`` counts an fp32-weight step
        without a master copy: m and v read and written, the gradient read, the weight read
        and written (7 elements)."""
        n = max(1, min(64, math.ceil(COLD_BYTES / (5 * t * d * (torch.finfo(self.dtype).bits // 8)))))
        params = [torch.nn.Parameter(self.rand(t, d)) for _ in range(n)]
        for p in params:
            p.grad = self.rand(t, d)
        make = optimizer_factory("adam")
        opts = [make([p]) for p in params]
        for o in opts:  # states allocated before timing
            o.step()
        turn = itertools.cycle(opts)
        return lambda: next(turn).step()

    def attention(self):
        cases = []
        for s, bh, hd in (QUICK["ATTN"] if self.quick else ATTN):
            q, k, v = (self.rand(bh, s, hd).requires_grad_() for _ in range(3))
            mask = torch.full((s, s), float("-inf"), dtype=self.dtype, device=self.dev).triu(1)
            flops = 4.0 * bh * s * s * hd  # QK^T and PV, full s x s (model convention)

            def explicit(q=q, k=k, v=v, mask=mask, hd=hd):
                return torch.softmax((q * hd ** -0.5) @ k.transpose(-2, -1) + mask, -1) @ v

            def sdpa(q=q, k=k, v=v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

            for name, fn, executed, ratio in (("explicit", explicit, flops, 2.0), ("sdpa", sdpa, flops / 2, 2.5)):
                # the forward as a training step runs it: autograd records it and keeps what the
                # backward needs (the sink holds the output, and with it those tensors), so each
                # call writes fresh memory; under no_grad, which frees and reuses its buffers, this
                # VM ran the explicit core 15-40% and SDPA 5-40% faster than with the graph kept
                fwd = fn
                out = fn()
                gout = torch.randn_like(out)

                def bwd(out=out, gout=gout, q=q, k=k, v=v):
                    return torch.autograd.grad(out, (q, k, v), gout, retain_graph=True)
                shape = {"m": s, "n": bh, "k": hd}
                cases.append(("attention", f"{name}_forward", self.sink.wrap(fwd), {**shape, "flops": executed}))
                cases.append(("attention", f"{name}_backward", self.sink.wrap(bwd),
                              {**shape, "flops": executed * ratio}))
        self.run_passes(cases)

    def launch(self):
        a = self.rand(1)
        dist.barrier()
        self.add("launch", "tiny_op", _time(lambda: a.add(1.0), self.sync, repeats=7))

    def eager(self, repeats: int = 201) -> None:
        """Host time per aten op of the torch runtime's own block (``parsim.validate.model.Block``)
        at a negligible size (d_model 8, 4 tokens): forward and backward, two flavours (the tiny
        GPT's LayerNorm / GELU / biases / explicit attention, and RMSNorm / SwiGLU / GQA / SDPA,
        whose norm and FFN are autograd Functions). Rows ``eager`` ``block_<pass>_<flavour>``:
        the median pass time and, in ``ops``, the aten ops it dispatched (counted with a
        ``TorchDispatchMode``), from which the fit takes seconds per op. Only where the host runs
        the kernels (a CPU device): a GPU's host issues them ahead of the device."""
        if self.dev.type != "cpu":
            return
        from parsim.model import ModelSpec
        from parsim.validate.model import Block
        flavours = {"gpt": (ModelSpec("eager-gpt", 1, 8, 2, 2, 32, 16, ffn="gelu", norm="layernorm", bias=True,
                                      position="learned", max_seq_len=8), False),
                    "llama": (ModelSpec("eager-llama", 1, 8, 2, 1, 32, 16, ffn="swiglu", norm="rmsnorm"), True)}
        mask = torch.full((4, 4), float("-inf"), dtype=self.dtype, device=self.dev).triu(1)
        dist.barrier()
        for flavour, (spec, flash) in flavours.items():
            blk = Block(spec, flash, self.dtype).to(self.dev)
            x = torch.randn(1, 4, spec.d_model, dtype=self.dtype, device=self.dev, requires_grad=True)
            fwd, bwd = [], []
            for i in range(repeats + 20):
                t0 = time.perf_counter()
                y = blk(x, mask)
                t1 = time.perf_counter()
                y.backward(torch.ones_like(y))
                t2 = time.perf_counter()
                if i >= 20:  # warm
                    fwd.append(t1 - t0)
                    bwd.append(t2 - t1)
            with op_counter() as cf:
                y = blk(x, mask)
            with op_counter() as cb:
                y.backward(torch.ones_like(y))
            for name, times, ops in (("forward", fwd, cf.n), ("backward", bwd, cb.n)):
                mid = statistics.median(times)
                self.add("eager", f"block_{name}_{flavour}", mid, ops=float(ops),
                         repeat_sigma=robust_sigma([math.log(t / mid) for t in times]))

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
                    self.add("p2p_idle", "send_recv", t, bytes=float(buf.numel() * 4), group=2, peers=f"0-{peer}")

    def p2p_busy_sender(self, sizes, trials: int = 9, busy_s: float = 0.012):
        """One-way p2p time when the sender goes on computing right after its isend, as a
        pipeline rank does (the next F/B): on a CPU rank the transport's progress thread then
        shares its core with that compute. Rank 1 times from the common barrier to its
        receive completing (barrier exit skew, ~0.1 ms, is inside the number). The time is
        bimodal here (~0.25 ms when the progress thread gets the other core, ~1.7 ms when it
        waits for a scheduler slice), so the row is the mean over trials less the slowest one:
        what a pipeline accumulates, not the typical case a median would give."""
        a, w = self.rand(256, 256), self.rand(256, 256)
        for nbytes in sizes:
            buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=self.dev)
            times = []
            for _ in range(trials):
                dist.barrier()
                if self.rank == 0:
                    work = dist.isend(buf, 1)
                    gemms_for(busy_s, a, w)
                    work.wait()
                    self.sync()
                elif self.rank == 1:
                    t0 = time.perf_counter()
                    dist.recv(buf, 0)
                    self.sync()  # on a GPU the receive returns once enqueued: time its completion
                    times.append(time.perf_counter() - t0)
            if self.rank == 1:
                kept = sorted(times)[:-1]
                mean = sum(kept) / len(kept)
                self.add("p2p", "send_busy_sender", mean, bytes=float(buf.numel() * 4), group=2, peers="0-1",
                         repeat_sigma=robust_sigma([math.log(t / mean) for t in kept]))

    def p2p_exchange(self, sizes, trials: int = 40, busy_s: float = 0.010) -> bool:
        """One-way p2p time as pipeline ranks meet it: ranks 0 and 1 compute (an F or B), then
        send to each other at about the same moment, the receive posted early, as the runtime
        posts it; after its receive one rank goes on computing (its next F/B, while its own
        send drains) and the other waits for its send, the roles alternating trial by trial.
        A direction's time runs from the later of the send and the receiver's wait (both
        clocks are this host's monotonic clock) to the receive completing: what the receiver
        waited beyond its own readiness.

        On this 2-vCPU VM that time is heavy-tailed: ~0.2-0.4 ms usually, 4-5 ms in about
        one exchange of five (a transport thread woken on a core that is computing waits for
        a scheduler tick; pinning ranks to cores, idle polling and keeping the vCPUs busy did
        not remove it). Those ticks accumulate over a step (a DualPipe step on the tiny GPT
        lost ~15 ms to them against 0.14 ms a send fitted one-way), so the row is the mean
        over the samples less the slowest one, not a median; its ``repeat_sigma`` is the spread
        of the mean over blocks of ``EXCHANGES_PER_STEP`` (what one step's sends average to).
        Only where every rank shares one host (a common clock); returns whether it ran."""
        hosts = [None] * self.world
        dist.all_gather_object(hosts, self.host)
        if len(set(hosts)) > 1:
            return False
        a, w = self.rand(256, 256), self.rand(256, 256)
        for nbytes in sizes:
            out = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=self.dev)
            stamps = []
            for trial, recv in self._pair_trials(out, trials):
                gemms_for(busy_s, a, w)
                self.sync()
                sent = time.perf_counter()
                send = dist.isend(out, 1 - self.rank)
                recv.wait()
                self.sync()
                got = time.perf_counter()
                if trial % 2 == self.rank:
                    gemms_for(busy_s, a, w)
                send.wait()
                stamps.append((sent, got))
            rank0, rank1 = self._gather_pair(stamps, trials, (0.0, 0.0))
            if self.rank == 1:
                mean, sigma = step_mean(exchange_waits(rank0, rank1))
                self.add("p2p", "exchange", mean, bytes=float(out.numel() * 4), group=2, peers="0-1",
                         repeat_sigma=sigma)
        return True

    def _pair_trials(self, out: torch.Tensor, trials: int):
        """The trials of a two-rank exchange bench: each one, ranks 0 and 1 post their receive
        from each other early (as the runtime posts it, into a buffer shaped like ``out``),
        every rank meets at a barrier, and ranks 0 and 1 get ``(trial, receive)``; the others
        sit the trial out."""
        inn = torch.zeros_like(out)
        for trial in range(trials):
            recv = dist.irecv(inn, 1 - self.rank) if self.rank < 2 else None
            dist.barrier()
            if self.rank < 2:
                yield trial, recv

    def _gather_pair(self, samples: list, trials: int, blank) -> tuple[list, list]:
        """Ranks 0's and 1's per-trial samples on every rank (the others contribute ``blank``)."""
        mine = torch.tensor(samples if self.rank < 2 else [blank] * trials, dtype=torch.float64)
        both = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(both, mine)
        return both[0].tolist(), both[1].tolist()

    def p2p_post(self, sizes, trials: int = 40, busy_s: float = 0.010, lag_s: float = 0.004) -> None:
        """The sender's own time inside ``isend``, as a pipeline rank pays it before its next
        F/B: on gloo the caller thread writes the message into the socket (and takes the pair's
        lock), so posting is not free on a CPU rank. Ranks 0 and 1 post their receives early (as
        the runtime does), compute, and send to each other; one of them (alternating trial by
        trial) computes ``lag_s`` longer first, so half the sends go to a peer that is still
        computing and half to one already waiting, as a pipeline's sends meet their receivers.
        Row: the mean over both ranks' posts less the slowest one (a step accumulates them; one
        in a few waits for a scheduler tick), its ``repeat_sigma`` the spread of the mean over
        blocks of ``EXCHANGES_PER_STEP``. CPU devices only: a GPU rank's ``isend`` enqueues
        a kernel and its compute runs on without the host."""
        if self.world < 2 or self.dev.type != "cpu":
            return
        a, w = self.rand(256, 256), self.rand(256, 256)
        for nbytes in sizes:
            out = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=self.dev)
            posts = []
            for trial, recv in self._pair_trials(out, trials):
                gemms_for(busy_s + (lag_s if trial % 2 == self.rank else 0.0), a, w)
                self.sync()
                t0 = time.perf_counter()
                send = dist.isend(out, 1 - self.rank)
                posts.append(time.perf_counter() - t0)
                recv.wait()
                send.wait()
            rank0, rank1 = self._gather_pair(posts, trials, 0.0)
            if self.rank == 0:
                mean, sigma = step_mean(rank0 + rank1)
                self.add("p2p_post", "isend", mean, bytes=float(out.numel() * 4), group=2, peers="0-1",
                         repeat_sigma=sigma)

    def compute_gap(self, seconds: float):
        """About ``seconds`` of compute as a layer runs it between two collectives: GEMMs on
        operands cycled through more memory than the caches hold, the count measured on rank 0
        and shared, so every rank runs the same work."""
        ops = rotating(((256, 256), (256, 512)), self.dtype, self.dev)

        def one():
            x, w = ops()
            return x @ w
        per = _time(one, self.sync, repeats=3)
        count = torch.tensor([max(1, round(seconds / max(per, 1e-9)))], dtype=torch.int64, device=self.dev)
        dist.broadcast(count, 0)
        n = int(count.item())

        def run():
            for _ in range(n):
                one()
        return run

    def collectives(self, sizes):
        """The collectives the runtime runs, called as it calls them (``parsim.validate.comm``):
        all-reduce (DP gradients, Megatron's f/g), all-gather and reduce-scatter of one flat
        buffer (ZeRO, sequence parallelism), all-to-all of equal splits (expert dispatch /
        combine), broadcast, on every rank between stretches of compute.

        The blocking ones are timed *in situ*: ``COMM_GAP_S`` of cache-cold GEMMs between two
        calls, as a layer computes between its collectives, and the row is what the calls add
        to that loop (:func:`in_situ_call_time`). On this 2-core VM a collective's cost grows
        with the compute before it, because its threads wake on cores the ranks' compute has
        held: a 256 KiB all-reduce took 0.40 ms on average back to back, 0.93 ms after 0.33 ms
        of GEMMs, 1.05 ms after 0.9 ms and 1.1-1.6 ms after 2-7 ms (medians 0.29-0.54 ms: the
        mean is carried by calls that wait ~3.5 ms, 15-30% of them). Timed after a short GEMM,
        as calibration did before, the tiny GPT's tp=2 collectives were predicted 30% short
        (0.74-0.86 ms a call against ~1.1-1.2 ms inside its F and B). The row is a mean, not a
        median: a step makes dozens of these calls, so it accumulates their expected time.

        ``p2p`` is a context-parallel ring step as ``parsim.validate.ring`` runs it: every rank
        sends K and V (two tensors, ``bytes`` together) to its successor and receives its
        predecessor's in one batch_isend_irecv, and later waits for them. It is timed in situ
        too: on a CPU rank the posting is not free -- gloo's caller thread writes into the
        socket and takes the pair's lock, so a post waits for a scheduler tick as a wait does
        (the tiny GPT's ring at cp = 2: posts 0.1-0.3 ms median but 0.5-0.9 ms mean, one in
        five 2-5 ms; waits 0.6-0.8 ms mean), and the runtime pays both, the post inside its
        attention's compute and the wait after it; timed right after a short GEMM, post + wait
        came to 0.9 ms at 2 x 128 KiB where the ring paid ~2 ms a step. ``bytes``: nccl-tests'
        size convention (the all-reduce buffer, all-gather's output, reduce-scatter's input,
        the all-to-all send buffer; the ring step's K + V)."""
        gap = self.compute_gap(COMM_GAP_S)
        for n in range(2, self.world + 1):
            group = dist.new_group(list(range(n)))
            for nbytes in sizes:
                el, cases = self._collective_calls(n, nbytes, group)
                for name, fn in cases.items():
                    dist.barrier()
                    if self.rank < n:  # inside F/B (or waited on at STEP): what it adds to the rank
                        t, ts = in_situ_call_time(fn, gap, self.sync, repeats=COMM_REPEATS,
                                                  calls=max(IN_SITU_CALLS, _comm_calls(nbytes)))
                        if self.rank == 0:
                            self.add("collective", name, t, bytes=float(el * 4), group=n,
                                     repeat_sigma=robust_sigma([math.log(x / t) for x in ts]))

    def _collective_calls(self, n: int, nbytes: int, group) -> tuple[int, dict]:
        """(elements, {kind: one call}) of ``nbytes`` on the group of the first ``n`` ranks, each
        called as the runtime calls it (:meth:`collectives`)."""
        from parsim.validate.comm import all_gather_flat, reduce_scatter_flat
        el = max(n, (nbytes // 4) // n * n)
        buf = torch.zeros(el, dtype=torch.float32, device=self.dev)
        out = torch.zeros(el, dtype=torch.float32, device=self.dev)
        shard = torch.zeros(el // n, dtype=torch.float32, device=self.dev)
        half = el // 2
        kv, kv_in = (buf[:half], buf[half:2 * half]), (out[:half], out[half:2 * half])
        return el, {"all_reduce": lambda: dist.all_reduce(buf, group=group),
                    "all_gather": lambda: all_gather_flat(out, shard, group),
                    "reduce_scatter": lambda: reduce_scatter_flat(shard, buf, group),
                    "all_to_all": lambda: dist.all_to_all_single(out, buf, group=group),
                    "broadcast": lambda: dist.broadcast(buf, 0, group=group),
                    "p2p": lambda: ring_step(kv, kv_in, n, group)}

    def collective_gaps(self, nbytes: int = GAP_SWEEP_BYTES, gaps_s: tuple[float, ...] = GAP_SWEEP_S) -> None:
        """The blocking collectives a block calls inside F/B (``GAP_SWEEP_KINDS``) timed in situ
        after several lengths of compute (``gaps_s``; :meth:`collectives` times every size after
        ``COMM_GAP_S``): on CPU ranks a call costs more after more compute -- its transport
        threads wake on cores the compute has held longer, and the ranks arrive further apart.
        Rows ``collective_gap`` (name = kind, ``gap_s``) at one size, the reference gap among
        them; ``parsim.calibrate.fit.fit_collective_gaps`` turns them into the profile's slope."""
        for n in range(2, self.world + 1):
            group = dist.new_group(list(range(n)))
            el, cases = self._collective_calls(n, nbytes, group)
            for gap_s in gaps_s:
                gap = self.compute_gap(gap_s)  # every rank: it broadcasts the count
                for name in GAP_SWEEP_KINDS:
                    dist.barrier()
                    if self.rank < n:
                        t, ts = in_situ_call_time(cases[name], gap, self.sync, repeats=COMM_REPEATS,
                                                  calls=IN_SITU_CALLS)
                        if self.rank == 0:
                            self.add("collective_gap", name, t, bytes=float(el * 4), group=n, gap_s=gap_s,
                                     reference_gap_s=COMM_GAP_S,
                                     repeat_sigma=robust_sigma([math.log(x / t) for x in ts]))

    def rewarm(self, trials: int = REWARM_TRIALS, nbytes: int = GAP_SWEEP_BYTES) -> None:
        """What a blocking collective costs the block ops after it beyond the in-situ price
        (CPU ranks: ``device.comm_rewarm_us``). The in-situ rows time each call between GEMM
        loops on operands cycled through more memory than the caches hold, which lose little
        to a call; a block's forward (norms, GEMMs, softmax, GELU, autograd recording) keeps a
        working set warm and loses more when the call idles its core while the transport's
        threads run. Per kind, in a shuffled order every trial: a block forward, then the call
        or a spin of the call's median length, then the block forward timed; the same with a
        GEMM loop of the block's length (the calibration's gap compute). Row ``rewarm`` per
        kind: (block after call - block after spin) - (GEMMs after call - GEMMs after spin),
        means over the trials. The block: the runtime's own (``parsim.validate.model.Block``,
        GPT flavour) at the tiny models' width and sequence, as ``COMM_GAP_S`` is theirs."""
        if self.dev.type != "cpu":
            return
        import random

        from parsim.model import ModelSpec
        from parsim.validate.model import Block
        torch.manual_seed(0)  # the same block on every rank
        spec = ModelSpec("rewarm-gpt", 1, 256, 4, 4, 1024, 1024, ffn="gelu", norm="layernorm", bias=True,
                         position="learned", max_seq_len=128)
        blk = Block(spec, False, self.dtype).to(self.dev)
        x = torch.randn(2, 128, spec.d_model, dtype=self.dtype, device=self.dev, requires_grad=True)
        mask = torch.full((128, 128), float("-inf"), dtype=self.dtype, device=self.dev).triu(1)
        ops = rotating(((256, 256), (256, 512)), self.dtype, self.dev)  # compute_gap's GEMMs

        def gemm():
            a, w = ops()
            return a @ w
        per = torch.tensor([_time(lambda: blk(x, mask), self.sync, repeats=3), _time(gemm, self.sync, repeats=3)])
        dist.broadcast(per, 0)  # the same work on every rank
        n = max(1, round(float(per[0] / per[1])))
        pieces = {"block": lambda: blk(x, mask), "gemms": lambda: [gemm() for _ in range(n)]}
        _, cases = self._collective_calls(self.world, nbytes, dist.group.WORLD)
        length = []
        for kind in GAP_SWEEP_KINDS:  # each call's median length: what the spin stands in for
            ts = []
            for _ in range(11):
                dist.barrier()
                t = time.perf_counter()
                cases[kind]()
                ts.append(time.perf_counter() - t)
            length.append(statistics.median(ts))
        length_t = torch.tensor(length)
        dist.broadcast(length_t, 0)
        spin_s = dict(zip(GAP_SWEEP_KINDS, length_t.tolist()))
        plan = [(k, p, c) for k in GAP_SWEEP_KINDS for p in pieces for c in ("call", "spin")]
        got: dict[tuple, list[float]] = {key: [] for key in plan}
        rng = random.Random(0)  # the same order on every rank
        for _ in range(max(2, trials)):
            rng.shuffle(plan)
            for kind, piece, how in plan:
                dist.barrier()
                pieces[piece]()  # compute before the call, as inside a pass
                if how == "call":
                    cases[kind]()
                else:
                    _spin(spin_s[kind])
                t = time.perf_counter()
                pieces[piece]()
                self.sync()
                got[(kind, piece, how)].append(time.perf_counter() - t)
        if self.rank == 0:
            for kind in GAP_SWEEP_KINDS:
                m = {key[1:]: statistics.fmean(v) for key, v in got.items() if key[0] == kind}
                extra = (m[("block", "call")] - m[("block", "spin")]) - (m[("gemms", "call")] - m[("gemms", "spin")])
                self.add("rewarm", kind, extra, bytes=float(nbytes), group=self.world, call_s=spin_s[kind],
                         block_s=float(per[0]), trials=float(trials),
                         block_after_call_s=m[("block", "call")], block_after_spin_s=m[("block", "spin")],
                         gemms_after_call_s=m[("gemms", "call")], gemms_after_spin_s=m[("gemms", "spin")])

    def core_share(self, sizes, trials: int = 9) -> None:
        """Compute beside an in-flight data-parallel all-reduce (``Device.transport_core_share``):
        every rank starts an asynchronous all-reduce and runs a GEMM loop about three times the
        all-reduce's longest of three calls (so it covers the collective), against both timed
        alone. On a CPU rank gloo's threads take the core from the loop: the slowdown over the
        collective's own time is the share. Rows: ``seconds`` the loop's slowdown, ``comm_s``
        the collective alone.

        Only where the transport runs on the rank's own processor (a CPU device): NCCL on a GPU
        runs its collectives as kernels on SMs, which the profile states as kernel facts
        (``collective_ctas``, ``parsim.cluster.contention``), so a GPU calibration writes no
        ``core_share`` rows and no ``transport_core_share``."""
        if self.dev.type != "cpu":
            return
        a, w = self.rand(256, 512), self.rand(512, 512)
        t0 = time.perf_counter()
        for _ in range(20):
            a @ w
        self.sync()
        one = torch.tensor([(time.perf_counter() - t0) / 20], device=self.dev)
        dist.all_reduce(one, op=dist.ReduceOp.MAX)  # every rank runs the same loop
        for nbytes in sizes:
            buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=self.dev)
            took = []
            for _ in range(3):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                self.sync()
                took.append(time.perf_counter() - t0)
            est = torch.tensor([max(took)], device=self.dev)
            dist.all_reduce(est, op=dist.ReduceOp.MAX)
            calls = max(4, math.ceil(3.0 * float(est) / float(one)))  # the loop outlasts the collective

            def gemm(calls=calls):
                for _ in range(calls):
                    a @ w

            def collective(async_op, buf=buf):
                return dist.all_reduce(buf, async_op=async_op)
            alone, comm, beside = core_share_trials(gemm, collective, self.sync, trials)
            if self.rank == 0:
                self.add("core_share", "all_reduce", beside - alone, bytes=float(buf.numel() * 4),
                         group=self.world, comm_s=comm, gemm_s=alone)


def core_share_trials(gemm, collective, sync, trials: int) -> tuple[float, float, float]:
    """(mean compute alone, mean collective alone, mean compute beside the in-flight collective),
    the three interleaved trial by trial (barriers between, so both ranks run each together)."""
    alone, comm, beside = [], [], []
    for _ in range(trials):
        dist.barrier()
        t0 = time.perf_counter(); gemm(); sync(); alone.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter(); collective(False); sync(); comm.append(time.perf_counter() - t0)
        dist.barrier()
        work = collective(True)
        t0 = time.perf_counter(); gemm(); sync(); beside.append(time.perf_counter() - t0)
        work.wait()
    return (statistics.fmean(alone), statistics.fmean(comm), statistics.fmean(beside))


def gemms_for(seconds: float, a, w) -> None:
    """GEMMs ``a @ w`` for about ``seconds`` (a rank's F or B beside a transfer)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ w


def op_counter():
    """A context manager counting the aten ops dispatched inside it, views included (a
    ``TorchDispatchMode``): ``with op_counter() as c: ...`` then ``c.n``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))
    return Count()


EXCHANGES_PER_STEP = 8
"""Pipeline exchanges in one step of the bundled tiny scenarios (4 microbatches, 2 stages: an F
and a B send each): the block over which :meth:`Bench.p2p_exchange` measures a step's spread."""


def step_mean(times: list[float]) -> tuple[float, float]:
    """(mean less the slowest sample, repeat sigma) of per-message times: a step accumulates them,
    so the row is a mean, not a median (one in a few waits for a scheduler tick). The band's
    sampler prices a link once per sample (a step): its repeat noise is the spread of a step's
    mean, not of one message (consecutive blocks of ``EXCHANGES_PER_STEP``)."""
    kept = sorted(times)[:-1]
    mean = sum(kept) / len(kept)
    blocks = [times[i:i + EXCHANGES_PER_STEP]
              for i in range(0, len(times) - EXCHANGES_PER_STEP + 1, EXCHANGES_PER_STEP)]
    return mean, robust_sigma([math.log(sum(b) / len(b) / mean) for b in blocks])


def exchange_waits(rank0: list, rank1: list) -> list[float]:
    """Per trial and direction of :meth:`Bench.p2p_exchange`, from each rank's (isend issued,
    receive completed) stamps on the host's common clock: how long the receiver waited for the
    data beyond the later of the send and its own readiness (floored at 0.1 us)."""
    out = []
    for (s0, r0), (s1, r1) in zip(rank0, rank1):
        ready = max(s0, s1)
        out += [max(r1 - ready, FLOOR_S), max(r0 - ready, FLOOR_S)]  # 0 -> 1, then 1 -> 0
    return out


def ring_step(send: tuple, recv: tuple, n: int, group) -> None:
    """One ring step over the group of global ranks 0..n-1: ``send`` to the successor, ``recv``
    from the predecessor, posted as ``parsim.validate.ring`` posts them, then waited."""
    me = dist.get_rank()
    for w in exchange(send, recv, (me + 1) % n, (me - 1) % n, group):
        w.wait()


def main(job_file: str) -> int:
    job, rank, world, local = start_worker(job_file)
    device = join_group(job, rank, world, local, default_timeout_s=60)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[job.get("precision", "fp32")]
    quick = bool(job.get("quick"))
    b = Bench(rank, world, device, dtype, quick, passes=int(job.get("passes") or 0))
    sizes = QUICK["MSG_BYTES"] if quick else MSG_BYTES
    b.gemms(); b.memory(); b.attention(); b.launch(); b.eager()
    if world > 1:
        p2p_sizes = sizes if quick else MSG_BYTES[:7]  # 1 KiB .. 4 MiB: what a pipeline sends
        b.p2p(p2p_sizes)
        if not b.p2p_exchange(p2p_sizes):  # ranks on several hosts: no common clock
            b.p2p_busy_sender(p2p_sizes)
        b.p2p_post(p2p_sizes)
        b.collectives(sizes)
        if not quick:
            b.collective_gaps()
        b.rewarm(trials=10 if quick else REWARM_TRIALS)
        b.core_share(CORE_SHARE_BYTES[:1] if quick else CORE_SHARE_BYTES)
    (Path(job["out"]) / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "rows": b.rows}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from parsim.validate.launch import die_with_launcher

    die_with_launcher()
    sys.exit(main(sys.argv[1]))
