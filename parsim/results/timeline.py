"""Timing metrics from the span rows: per pipeline rank busy time, exposed data-parallel and
pipeline communication, bubble, and where the compute spans' time goes (their op's parts).

* busy_s of a pipeline rank: time its compute stream runs (F, B, I, W, STEP, including
  the TP/CP/EP communication that runs inside those ops).
* exposed dp / pp communication: idle while a collective or a transfer for this rank is
  in flight (a transfer belongs to the rank that waits for it).
* bubble: the rest of the step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from parsim.costs.parts import PART_NAMES


@dataclass(frozen=True)
class RankTimes:
    """One pipeline rank over one step."""

    busy_s: float
    """Compute stream busy time."""
    optimizer_s: float
    """Of which optimizer steps (STEP)."""
    exposed_dp_s: float
    """Data-parallel collectives not hidden under compute."""
    exposed_pp_s: float
    """Pipeline transfers not hidden under compute or dp collectives."""
    bubble_s: float
    """The rest of the step: waiting with nothing in flight."""
    parts: dict[str, float]
    """Seconds of the non-STEP compute spans by part (compute, recompute, tp/cp/ep comm)."""
    flops: float
    """Hardware FLOPs executed."""


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    # a new block begins where a start exceeds every earlier end
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    block_end = np.append(e[idx[1:] - 1], e[-1])
    return float(np.sum(block_end - s[idx]))


def exposed(cs: np.ndarray, ce: np.ndarray, bs: np.ndarray, be: np.ndarray) -> float:
    """Length of the comm intervals [cs, ce) not covered by busy intervals [bs, be)."""
    if len(cs) == 0:
        return 0.0
    both = _union_length(np.concatenate([cs, bs]), np.concatenate([ce, be]))
    return both - _union_length(bs, be)


def rank_slices(ranks: np.ndarray, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): rows of rank r are order[bounds[r]:bounds[r+1]]."""
    order = np.argsort(ranks, kind="stable")
    return order, np.searchsorted(ranks[order], np.arange(pp + 1))


def hidden_comm(j: pd.DataFrame) -> pd.DataFrame:
    """Spans shorter than their op's parts (the halves of a DualPipe OVERLAP_F_B) hid
    communication under the other op's compute: take the difference off their tp/cp/ep
    parts first, then off compute, so every span's parts (a composite's two halves: their
    parts together) add up to its duration."""
    if j.empty:
        return j
    dur = (j["end_s"] - j["start_s"]).to_numpy()
    tot = j[list(PART_NAMES)].sum(axis=1).to_numpy()
    excess = tot - dur
    mask = excess > 1e-9 * np.maximum(tot, 1e-30)
    if not mask.any():
        return j
    j = j.copy()
    comm_cols, work_cols = ["tp_comm", "cp_comm", "ep_comm"], ["compute", "recompute"]
    comm = j[comm_cols].sum(axis=1).to_numpy()
    work = j[work_cols].sum(axis=1).to_numpy()
    cut = np.where(mask, np.minimum(excess, comm), 0.0)
    rest = np.where(mask, excess - cut, 0.0)
    k_comm = np.where(comm > 0, (comm - cut) / np.where(comm > 0, comm, 1.0), 1.0)
    k_work = np.where(work > 0, (work - rest) / np.where(work > 0, work, 1.0), 1.0)
    # the two halves of one composite (an F span ending where the next span of its rank starts,
    # both shorter than their parts) hid each other's communication: pool them, so the pair's
    # communication goes before either half's compute, both halves scaled by the pair's factors
    op, rank = j["op"].to_numpy(), j["rank"].to_numpy()
    start, end = j["start_s"].to_numpy(), j["end_s"].to_numpy()
    pair = (mask[:-1] & mask[1:] & (op[:-1] == "F") & (op[1:] != "F") & (rank[:-1] == rank[1:])
            & np.isclose(end[:-1], start[1:], rtol=0.0, atol=1e-12))
    for i in np.flatnonzero(pair):
        e, c, w = excess[i] + excess[i + 1], comm[i] + comm[i + 1], work[i] + work[i + 1]
        c_cut = min(e, c)
        k_comm[i:i + 2] = (c - c_cut) / c if c > 0 else 1.0
        k_work[i:i + 2] = (w - (e - c_cut)) / w if w > 0 else 1.0
    for c in comm_cols:
        j[c] = j[c].to_numpy() * k_comm
    for c in work_cols:
        j[c] = j[c].to_numpy() * k_work
    return j


def _cols(df: pd.DataFrame, *names: str) -> list[np.ndarray]:
    return [df[n].to_numpy() for n in names]


def rank_times(tl: pd.DataFrame, parts: pd.DataFrame, stage_to_rank: tuple[int, ...], pp: int,
               T: float) -> list[RankTimes]:
    """Timing of each of the ``pp`` pipeline ranks; ``parts``: seconds by part and FLOPs per (stage, op)."""
    compute = tl[tl["stream"] == "compute"]
    joined = hidden_comm(compute.merge(parts, on=["stage", "op"], how="left").fillna(0.0))
    c_rank, c_start, c_end = _cols(compute, "rank", "start_s", "end_s")
    busy_all = np.bincount(c_rank, weights=c_end - c_start, minlength=pp)
    j_rank, j_start, j_end, j_flops = _cols(joined, "rank", "start_s", "end_s", "flops")
    is_step = (joined["op"] == "STEP").to_numpy()
    optim_all = np.bincount(j_rank[is_step], weights=(j_end - j_start)[is_step], minlength=pp)
    parts_all = {n: np.bincount(j_rank[~is_step], weights=joined[n].to_numpy()[~is_step], minlength=pp)
                 for n in PART_NAMES}
    flops_all = np.bincount(j_rank, weights=j_flops, minlength=pp)
    c_ord, c_b = rank_slices(c_rank, pp)
    dpf = tl[tl["stream"] == "dp"]
    d_rank, d_start, d_end = _cols(dpf, "rank", "start_s", "end_s")
    d_ord, d_b = rank_slices(d_rank, pp)
    p2p = tl[tl["stream"] == "p2p"]
    p_start, p_end = _cols(p2p, "start_s", "end_s")
    if len(p2p):
        # a transfer belongs to the rank that waits for it
        dst_stage = p2p["stage"].to_numpy() + np.where((p2p["op"] == "SEND_F").to_numpy(), 1, -1)
        p_rank = np.asarray(stage_to_rank)[dst_stage]
    else:
        p_rank = np.zeros(0, dtype=np.int64)
    p_ord, p_b = rank_slices(p_rank, pp)
    out = []
    for r in range(pp):
        ci, di, pi = (o[b[r]:b[r + 1]] for o, b in ((c_ord, c_b), (d_ord, d_b), (p_ord, p_b)))
        busy = float(busy_all[r])
        exp_dp = exposed(d_start[di], d_end[di], c_start[ci], c_end[ci])
        exp_pp = exposed(p_start[pi], p_end[pi], np.concatenate([c_start[ci], d_start[di]]),
                         np.concatenate([c_end[ci], d_end[di]])) if len(pi) else 0.0
        out.append(RankTimes(busy, float(optim_all[r]), exp_dp, exp_pp, max(0.0, T - busy - exp_dp - exp_pp),
                             {n: float(parts_all[n][r]) for n in PART_NAMES}, float(flops_all[r])))
    return out


def span_bubble(compute: pd.DataFrame, busy: list[float]) -> float:
    """Qi et al.'s (zero-bubble paper) bubble: with S the longest span of any rank's compute
    (first start to last end), mean over ranks of (S - busy) / S."""
    spans = []
    if len(compute):
        g = compute.groupby("rank")
        spans = list((g["end_s"].max() - g["start_s"].min()).to_numpy())
    S = max(spans, default=0.0)
    return float(np.mean([(S - b) / S for b in busy])) if S > 0 and busy else 0.0
