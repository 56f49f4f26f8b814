"""Collectives the runtime's models run inside F and B, as autograd operators, timed.

* Megatron's conjugate operators (Shoeybi et al. 2019): ``f`` (:class:`CopyToGroup`:
  identity forward, all-reduce of the gradient backward) before a column-parallel linear,
  ``g`` (:class:`ReduceFromGroup`: all-reduce forward, identity backward) after a
  row-parallel one;
* sequence parallelism (Korthikanti et al. 2022): :class:`GatherSeq` (all-gather along the
  sequence forward, reduce-scatter of the gradient backward) replaces ``f``,
  :class:`ScatterSeq` (reduce-scatter forward, all-gather backward) replaces ``g``;
* :class:`AllToAll`: the expert dispatch / combine (variable splits; its backward is the
  reverse all-to-all).

Every call is blocking and recorded, while a :class:`CommRecorder` is active, as
``(stream, start, end, bytes)``: the runtime attributes the time to the F/B/I it ran in
(the simulator's ``tp_comm`` / ``cp_comm`` / ``ep_comm`` parts of that op). Bytes are what
the collective's buffer holds (nccl-tests' size convention: all-gather's output,
reduce-scatter's input).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

_REC: list | None = None  # the active recorder's rows (autograd runs backward on this thread)


class CommRecorder:
    """Context manager: collectives run inside are appended to ``self.rows``."""

    def __init__(self):
        self.rows: list[tuple[str, float, float, float]] = []

    def __enter__(self):
        global _REC
        _REC = self.rows
        return self

    def __exit__(self, *exc):
        global _REC
        _REC = None
        return False


def record(stream: str, t0: float, nbytes: float) -> None:
    """Append one finished communication (started at ``t0``) to the active recorder."""
    if _REC is not None:
        _REC.append((stream, t0, time.perf_counter(), float(nbytes)))


@dataclass
class Group:
    """A process group as the model sees it."""

    ranks: tuple[int, ...]
    """Global ranks, in group order (the ring order for cp)."""
    index: int
    """This process's position in ``ranks``."""
    pg: object = None
    """The torch process group (None when the group is this rank alone)."""
    stream: str = "tp"
    """Where its time is attributed: tp, cp or ep."""

    @property
    def size(self) -> int:
        return len(self.ranks)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def all_reduce(t: torch.Tensor, g: Group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    t0 = time.perf_counter()
    dist.all_reduce(t, op=op, group=g.pg)
    record(g.stream, t0, _nbytes(t))
    return t


def _gather_single(out, inp, group, async_op=False):
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, inp, group=group, async_op=async_op)


def _scatter_single(out, inp, group, async_op=False):
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, inp, group=group, async_op=async_op)


def all_gather_flat(out: torch.Tensor, shard: torch.Tensor, group, async_op: bool = False):
    """All-gather of equal 1-D shards into ``out`` (nccl and gloo alike)."""
    return _gather_single(out, shard.contiguous(), group, async_op)


def reduce_scatter_flat(out: torch.Tensor, full: torch.Tensor, group, async_op: bool = False):
    """Sum ``full`` over the group, this rank's 1-D shard into ``out``."""
    return _scatter_single(out, full.contiguous(), group, async_op)


def gather_seq(x: torch.Tensor, g: Group) -> torch.Tensor:
    """(b, s, ...) shards -> (b, n*s, ...): rank i's shard at position i along the sequence."""
    n = g.size
    buf = torch.empty((n * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    t0 = time.perf_counter()
    _gather_single(buf, x.contiguous(), g.pg)
    record(g.stream, t0, _nbytes(buf))
    b = x.shape[0]
    return buf.view((n, b) + tuple(x.shape[1:])).transpose(0, 1).reshape((b, n * x.shape[1]) + tuple(x.shape[2:]))


def scatter_seq(x: torch.Tensor, g: Group) -> torch.Tensor:
    """(b, n*s, ...) summed over the group, this rank's (b, s, ...) slice of the sequence."""
    n, b = g.size, x.shape[0]
    s = x.shape[1] // n
    parts = x.reshape((b, n, s) + tuple(x.shape[2:])).transpose(0, 1).reshape((n * b, s) + tuple(x.shape[2:]))
    out = torch.empty((b, s) + tuple(x.shape[2:]), dtype=x.dtype, device=x.device)
    t0 = time.perf_counter()
    _scatter_single(out, parts, g.pg)
    record(g.stream, t0, _nbytes(parts))
    return out


class CopyToGroup(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return all_reduce(dy.contiguous().clone(), ctx.g), None


class ReduceFromGroup(torch.autograd.Function):
    """Megatron's g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, g):
        return all_reduce(x.contiguous().clone(), g)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class GatherSeq(torch.autograd.Function):
    """Sequence parallelism's f: all-gather along the sequence, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return gather_seq(x, g)

    @staticmethod
    def backward(ctx, dy):
        return scatter_seq(dy, ctx.g), None


class ScatterSeq(torch.autograd.Function):
    """Sequence parallelism's g: reduce-scatter along the sequence, all-gather backward."""

    @staticmethod
    def forward(ctx, x, g):
        ctx.g = g
        return scatter_seq(x, g)

    @staticmethod
    def backward(ctx, dy):
        return gather_seq(dy.contiguous(), ctx.g), None


def all_to_all(x: torch.Tensor, out_rows: list[int], in_rows: list[int], g: Group) -> torch.Tensor:
    """Rows of ``x`` (in_rows[j] for rank j, in order) out; out_rows[j] rows from rank j in."""
    out = torch.empty((sum(out_rows),) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    t0 = time.perf_counter()
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=out_rows, input_split_sizes=in_rows, group=g.pg)
    record(g.stream, t0, max(_nbytes(x), _nbytes(out)))
    return out


class AllToAll(torch.autograd.Function):
    """Expert dispatch / combine: an all-to-all with splits; backward the reverse one."""

    @staticmethod
    def forward(ctx, x, out_rows, in_rows, g):
        ctx.splits, ctx.g = (out_rows, in_rows), g
        return all_to_all(x, out_rows, in_rows, g)

    @staticmethod
    def backward(ctx, dy):
        out_rows, in_rows = ctx.splits
        return all_to_all(dy, in_rows, out_rows, ctx.g), None, None, None


def exchange_counts(counts: torch.Tensor, g: Group) -> torch.Tensor:
    """(G, k) counts this rank sends to each rank -> (G, k) counts each rank sends here.
    An all-gather of every rank's table (a few bytes: gloo's all-to-all costs several times
    an all-gather's latency at this size), of which this rank keeps its column."""
    out = torch.empty((g.size * counts.shape[0],) + tuple(counts.shape[1:]), dtype=counts.dtype, device=counts.device)
    t0 = time.perf_counter()
    _gather_single(out, counts.contiguous(), g.pg)
    record(g.stream, t0, _nbytes(out))
    return out.view((g.size,) + tuple(counts.shape))[:, g.index]
