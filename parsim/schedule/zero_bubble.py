"""ZB-V (Qi et al. 2024, "zero bubble" V schedule): two stages per rank in a V.

Stage s lives on rank s for s < p and on rank 2p-1-s for s >= p, so the first and the
last stage share rank 0 and the turn of the V (stages p-1, p) is local to rank p-1.
Backward is split into I and W. Rank r runs 2(p-r)-1 forwards of its first stage, r
(F of the second, F of the first) pairs, p-r (F, I, W) triples on the second stage,
then the steady (F, I, W) of each stage in turn, and a cool-down of I's whose W's fill
the tail (the order of PyTorch's ScheduleZBVZeroBubble). Peak activation memory is
about p microbatches of a full rank's layers (2p stage-microbatches of half size),
ZB-H1's, with (near) zero bubble when T_F = T_I = T_W.
"""
from __future__ import annotations

from parsim.schedule.builders import _check_sizes, register, two_chunks
from parsim.schedule.ir import Op, Schedule, act
from parsim.schedule.semantics import ScheduleTraits, set_traits


def zbv_rank(r: int, pp: int, m: int) -> list:
    n = max(2 * pp - 1, m)  # built for at least 2p-1 microbatches, then trimmed to m
    s0, s1 = r, 2 * pp - 1 - r
    out: list = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (pp - r) - 1):
        out.append(act(s0, Op.F, f0)); f0 += 1
    for _ in range(r):
        out.append(act(s1, Op.F, f1)); f1 += 1
        out.append(act(s0, Op.F, f0)); f0 += 1
    for _ in range(pp - r):
        out.append(act(s1, Op.F, f1)); f1 += 1
        out += [act(s1, Op.I, b1), act(s1, Op.W, b1)]; b1 += 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            out.append(act(s0, Op.F, f0)); f0 += 1
        out += [act(s0, Op.I, b0), act(s0, Op.W, b0)]; b0 += 1
        out.append(act(s1, Op.F, f1)); f1 += 1
        out += [act(s1, Op.I, b1), act(s1, Op.W, b1)]; b1 += 1
    w0, w1 = b0, b1
    for _ in range(r):
        out.append(act(s0, Op.I, b0)); b0 += 1
        out.append(act(s1, Op.I, b1)); b1 += 1
    for _ in range(pp - r):
        out.append(act(s0, Op.I, b0)); b0 += 1
        out.append(act(s0, Op.W, w0)); w0 += 1
    out += [act(s1, Op.W, j) for j in range(w1, b1)]
    out += [act(s0, Op.W, j) for j in range(w0, b0)]
    return [a for a in out if a.microbatch < m]


def zbv(pp: int, m: int) -> Schedule:
    """ZB-V: V placement (2p stages), I/W split, ZB-H1-like memory (see module doc)."""
    _check_sizes(pp, m)
    rows = tuple(tuple(zbv_rank(r, pp, m)) for r in range(pp))
    s2r = tuple(s if s < pp else 2 * pp - 1 - s for s in range(2 * pp))
    return Schedule.trusted("ZBV", 2 * pp, m, s2r, rows)


register("ZBV", two_chunks(zbv, "ZBV", " in a V"))
set_traits("ZBV", ScheduleTraits(stages_per_rank=2))
