"""TeraPipe (Li et al., ICML 2021): token-level pipelining of one sequence across stages.

With causal attention, token slice i of a sequence depends only on slices 0..i: stage s
can run slice i+1 while stage s+1 runs slice i. The token slice is the schedulable unit:
the schedule's action index ``u`` is slice ``u % K`` of microbatch ``u // K``
(``Schedule.n_slices = K``, ``Schedule.n_microbatches = M * K`` units), so lowering,
validation and the interpreters handle (microbatch, slice) pairs as they handle
microbatches. What a slice adds:

* forward of slice i on a stage needs slice i-1's keys and values on the *same* stage
  (its attention context): F's of one microbatch run in slice order on a rank;
* backward of slice i needs the K/V gradients the later slices' attention sent back to
  it: B's of one microbatch run in reverse slice order on a rank.

Both are same-rank orders, checked by :func:`check_slice_order` (``passes.validate`` calls
it). The order is GPipe's over units (all forwards, then all backwards), as the paper runs.

Slice lengths: ``token_slices = K`` cuts the sequence into K equal slices;
``"auto"`` solves TeraPipe's dynamic program (:func:`optimal_slicing`): slice lengths on a
grid, each slice's stage time ``t(l, c)`` (length l after c tokens of context: attention
grows with the position), and the iteration time ``M * sum(t_i) + (stages - 1) * max(t_i)``
minimised exactly by enumerating the bound ``t_max`` on the slowest slice (Algorithm 1).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from parsim.errors import ScheduleError
from parsim.schedule.builders import register, single_chunk
from parsim.schedule.ir import Op, Schedule, act


def terapipe(pp: int, m: int, k: int) -> Schedule:
    """TeraPipe over ``m`` microbatches of ``k`` token slices each on ``pp`` stages: every
    rank runs the forwards of all units (microbatch-major, slices ascending), then the
    backwards (microbatch-major, slices descending)."""
    for name, v in (("pp", pp), ("microbatches", m), ("token slices", k)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ScheduleError(f"TeraPipe: {name} must be an integer >= 1, got {v!r}")
    units = m * k
    back = [mb * k + i for mb in range(m) for i in reversed(range(k))]
    rows = tuple(tuple([act(r, Op.F, u) for u in range(units)] + [act(r, Op.B, u) for u in back])
                 for r in range(pp))
    return Schedule.trusted("TeraPipe", pp, units, tuple(range(pp)), rows, 1, k)


def unit_of(u: int, k: int) -> tuple[int, int]:
    """Action index -> (microbatch, slice) with ``k`` slices per microbatch."""
    return divmod(u, k)


def check_slice_order(schedule: Schedule) -> None:
    """Raise ScheduleError unless, on every stage, each microbatch's forwards run in slice
    order and its backwards in reverse slice order (the K/V dependencies of TeraPipe)."""
    k = schedule.n_slices
    if k <= 1:
        return
    for r, row in enumerate(schedule.actions):
        last: dict[tuple, int] = {}
        for step, a in enumerate(row):
            for p in a.parts:
                if p.op is Op.F or p.op.is_backward and p.op is not Op.W:
                    mb, i = divmod(p.microbatch, k)
                    key = (p.stage, p.op is Op.F, mb)
                    prev = last.get(key)
                    want = (prev is None and i == (0 if p.op is Op.F else k - 1)) or (
                        prev is not None and i == (prev + 1 if p.op is Op.F else prev - 1))
                    if not want:
                        kind = "forwards in slice order" if p.op is Op.F else "backwards in reverse slice order"
                        raise ScheduleError(f"schedule {schedule.name}: rank {r} step {step} ({a}) breaks the "
                                            f"token-slice order: stage {p.stage} must run microbatch {mb}'s "
                                            f"{kind} (K/V of earlier slices, their gradients from later ones)")
                    last[key] = i


# ----------------------------------------------------------------------------- the slicing DP

SliceTime = Callable[[int, int], float]
"""(slice length in tokens, tokens before it) -> seconds of F+B of that slice on the busiest stage."""


@dataclass(frozen=True)
class Slicing:
    """A solved slicing of one sequence."""

    lengths: tuple[int, ...]
    """Slice lengths in tokens, in sequence order (they sum to the sequence length)."""
    times_s: tuple[float, ...]
    """Stage time of each slice (F + B, the busiest stage)."""
    objective_s: float
    """``microbatches * sum(times_s) + (stages - 1) * max(times_s)``: the pipeline's iteration time."""


def objective(times: tuple[float, ...] | list[float], stages: int, microbatches: int = 1) -> float:
    """TeraPipe's iteration time of one slicing: M * sum + (stages - 1) * max."""
    return microbatches * math.fsum(times) + (stages - 1) * max(times)


def grid_points(seq_len: int, grid: int) -> list[int]:
    """Where a slice may start or end: every ``grid`` tokens, and the sequence's end (when
    ``grid`` does not divide ``seq_len`` the last cell is the shorter remainder)."""
    if grid < 1 or seq_len < 1:
        raise ScheduleError(f"TeraPipe: the slicing grid {grid} and the sequence length {seq_len} must be positive")
    return [min(i * grid, seq_len) for i in range(-(-seq_len // grid) + 1)]


def time_matrix(seq_len: int, grid: int, t: SliceTime) -> np.ndarray:
    """``T[j, i]``: the time of the slice from grid point j to grid point i (> j); inf elsewhere."""
    pts = grid_points(seq_len, grid)
    n = len(pts) - 1
    out = np.full((n + 1, n + 1), np.inf)
    for j in range(n):
        for i in range(j + 1, n + 1):
            out[j, i] = t(pts[i] - pts[j], pts[j])
    return out


def _min_sum(T: np.ndarray, cap: float) -> tuple[float, list[int]]:
    """Smallest sum of slice times covering the sequence with every slice <= cap; the cut points."""
    n = T.shape[0] - 1
    Tc = np.where(T <= cap, T, np.inf)
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    arg = np.zeros(n + 1, dtype=np.int64)
    for i in range(1, n + 1):
        cand = best[:i] + Tc[:i, i]
        j = int(np.argmin(cand))
        best[i], arg[i] = cand[j], j
    if not np.isfinite(best[n]):
        return math.inf, []
    cuts, i = [n], n
    while i > 0:
        i = int(arg[i])
        cuts.append(i)
    return float(best[n]), cuts[::-1]


def optimal_slicing(seq_len: int, stages: int, t: SliceTime, grid: int = 8, microbatches: int = 1,
                    T: np.ndarray | None = None) -> Slicing:
    """TeraPipe's DP: the slicing (cuts on :func:`grid_points`: lengths multiples of ``grid``
    but the last, which ends the sequence) minimising
    ``microbatches * sum(t_i) + (stages - 1) * max(t_i)``, exactly.

    For a bound t_max, the least sum S(t_max) with every slice <= t_max is a shortest path over
    grid points (:func:`_min_sum`); the optimum is min over t_max of
    ``M * S(t_max) + (stages - 1) * t_max``, reached at t_max = the optimal slicing's own max
    (Algorithm 1 of the paper enumerates every t_max). Here the bounds are walked downwards:
    the path found for a bound has a max m <= t_max and stays optimal for every bound in
    [m, t_max], so those are all settled by one DP (evaluated at m) and the next bound is the
    largest slice time below m. S only grows as the bound falls, so the walk stops once
    ``M * S(current) + (stages - 1) * (the least feasible max)`` cannot beat the best.
    """
    pts = grid_points(seq_len, grid)
    if T is None:
        T = time_matrix(seq_len, grid, t)
    vals = np.unique(T[np.isfinite(T)])
    lowest = _least_max(T)
    best, best_cuts = math.inf, None
    cap = float(vals[-1])
    while True:
        s, cuts = _min_sum(T, cap)
        if s == math.inf:
            break
        top = max(float(T[a, b]) for a, b in itertools.pairwise(cuts))
        total = microbatches * s + (stages - 1) * top
        if total < best:
            best, best_cuts = total, cuts
        if microbatches * s + (stages - 1) * lowest >= best:
            break
        k = int(np.searchsorted(vals, top, side="left"))  # the next bound: the largest value below top
        if k == 0:
            break
        cap = float(vals[k - 1])
    lengths = tuple(pts[b] - pts[a] for a, b in itertools.pairwise(best_cuts))
    times = tuple(float(T[a, b]) for a, b in itertools.pairwise(best_cuts))
    return Slicing(lengths, times, objective(times, stages, microbatches))


def _least_max(T: np.ndarray) -> float:
    """The smallest possible slowest slice over all slicings (a bottleneck shortest path)."""
    n = T.shape[0] - 1
    best = np.full(n + 1, np.inf)
    best[0] = -np.inf
    for i in range(1, n + 1):
        best[i] = np.min(np.maximum(best[:i], T[:i, i]))
    return float(best[n])


def brute_force_slicing(seq_len: int, stages: int, t: SliceTime, grid: int = 1, microbatches: int = 1) -> Slicing:
    """Every composition of the sequence into slices cut on :func:`grid_points` (2^(n-1) of
    them for n cells): the test oracle."""
    pts = grid_points(seq_len, grid)
    n = len(pts) - 1
    best = None
    for mask in itertools.product((False, True), repeat=n - 1):
        cuts = [0] + [i + 1 for i, cut in enumerate(mask) if cut] + [n]
        lengths = tuple(pts[b] - pts[a] for a, b in itertools.pairwise(cuts))
        times = tuple(t(pts[b] - pts[a], pts[a]) for a, b in itertools.pairwise(cuts))
        obj = objective(times, stages, microbatches)
        if best is None or obj < best.objective_s:
            best = Slicing(lengths, times, obj)
    return best


def uniform_lengths(seq_len: int, k: int) -> tuple[int, ...]:
    """``k`` slices as equal as possible (the first ones one token longer)."""
    if not isinstance(k, int) or k < 1 or k > seq_len:
        raise ScheduleError(f"TeraPipe: token_slices must be between 1 and the sequence length {seq_len}, got {k!r}")
    q, r = divmod(seq_len, k)
    return tuple(q + (i < r) for i in range(k))


def _registered(pp: int, m: int) -> Schedule:
    """The registry's TeraPipe: one slice per microbatch (GPipe's order) unless the caller
    (``simulate.schedule_for``, ``parsim schedule --token-slices``) asks :func:`terapipe` for K."""
    return terapipe(pp, m, 1)


register("TeraPipe", single_chunk(_registered, "TeraPipe"))
