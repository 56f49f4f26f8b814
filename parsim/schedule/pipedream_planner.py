"""PipeDream's partitioner (Narayanan et al., SOSP'19, Sec. 3.1): stage boundaries and per-stage
replication chosen together.

Inputs per layer l (in model order): ``compute[l]`` (forward + backward seconds of one
microbatch), ``weights[l]`` (bytes of its gradient), ``act[l]`` (bytes of its output
activation, sent to the next stage when a boundary falls after l). A stage of layers i..j
replicated over m workers takes microbatches round robin, so in steady state it needs

    T(i..j, m) = max(sum compute, sync(sum weights, m)) / m

per microbatch (the replicas' gradient synchronisation overlaps their compute; PipeDream's
W^m term), and a boundary after layer i costs ``2 * comm(act[i])`` (the activation forward, its
gradient back). The pipeline's steady-state time per microbatch is its slowest part:

    A(j, m) = min( T(0..j, m),  min over i < j, 1 <= m' < m of  max(A(i, m - m'), 2 comm(act[i]), T(i+1..j, m')) )

over the first j+1 layers on m workers (the last stage on workers m - m' .. m - 1: its
replicas' all-reduce is priced where they sit). :func:`plan` solves it (every worker used) and
:func:`brute_force_plan` enumerates every partition and replication (the test oracle).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from parsim.errors import ScheduleError

Sync = Callable[[float, int, int], float]
"""(gradient bytes of a stage, replicas m, first worker) -> seconds to synchronise them among
workers first .. first + m - 1 (0 for one replica). Workers are numbered stage by stage."""
Comm = Callable[[float], float]
"""(activation bytes) -> seconds of one transfer between neighbouring stages."""


@dataclass(frozen=True)
class PipeDreamPlan:
    """A partition of the layers into stages with a replication factor each."""

    stages: tuple[tuple[int, int], ...]
    """Per stage: (first layer, last layer), inclusive, in model order."""
    replication: tuple[int, ...]
    """Per stage: workers holding a replica (they take microbatches round robin)."""
    period_s: float
    """Steady-state time per microbatch: the slowest stage or boundary."""

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(j - i + 1 for i, j in self.stages)

    def config(self) -> str:
        """PipeDream's notation: replication factors joined by dashes (``2-1-1``)."""
        return "-".join(str(r) for r in self.replication)


def stage_time(compute: float, weights: float, m: int, sync: Sync, first: int = 0) -> float:
    """T(i..j, m): a stage's steady-state seconds per microbatch with m replicas on workers
    first .. first + m - 1."""
    return max(compute, sync(weights, m, first) if m > 1 else 0.0) / m


def plan_period(compute: Sequence[float], weights: Sequence[float], act: Sequence[float],
                stages: Sequence[tuple[int, int]], replication: Sequence[int], sync: Sync, comm: Comm) -> float:
    """The steady-state period of a given partition and replication."""
    worst, first = 0.0, 0
    for k, ((i, j), m) in enumerate(zip(stages, replication)):
        worst = max(worst, stage_time(sum(compute[i:j + 1]), sum(weights[i:j + 1]), m, sync, first))
        first += m
        if k > 0:
            worst = max(worst, 2 * comm(act[i - 1]))
    return worst


def plan(compute: Sequence[float], weights: Sequence[float], act: Sequence[float], workers: int,
         sync: Sync, comm: Comm) -> PipeDreamPlan:
    """PipeDream's dynamic program over (last layer, workers): the partition and replication
    with the smallest steady-state period using all ``workers``."""
    n = len(compute)
    if n < 1 or len(weights) != n or len(act) != n:
        raise ScheduleError("PipeDream planner: compute, weights and act need one entry per layer")
    if workers < 1:
        raise ScheduleError(f"PipeDream planner: workers must be >= 1, got {workers}")
    pc = [0.0]
    pw = [0.0]
    for c, w in zip(compute, weights):
        pc.append(pc[-1] + c)
        pw.append(pw[-1] + w)
    T = lambda i, j, m, first: stage_time(pc[j + 1] - pc[i], pw[j + 1] - pw[i], m, sync, first)  # noqa: E731
    edge = [2 * comm(a) for a in act]
    A = [[math.inf] * (workers + 1) for _ in range(n)]
    arg: list[list[tuple | None]] = [[None] * (workers + 1) for _ in range(n)]
    for j in range(n):
        for m in range(1, workers + 1):
            best, choice = T(0, j, m, 0), None
            for i in range(j):
                e = edge[i]
                if e >= best:
                    continue
                for mp in range(1, m):
                    prev = A[i][m - mp]
                    if prev >= best:
                        continue
                    v = max(prev, e, T(i + 1, j, mp, m - mp))
                    if v < best:
                        best, choice = v, (i, mp)
            A[j][m], arg[j][m] = best, choice
    stages, reps = [], []
    j, m = n - 1, workers
    while True:
        c = arg[j][m]
        if c is None:
            stages.append((0, j))
            reps.append(m)
            break
        i, mp = c
        stages.append((i + 1, j))
        reps.append(mp)
        j, m = i, m - mp
    return PipeDreamPlan(tuple(stages[::-1]), tuple(reps[::-1]), A[n - 1][workers])


def brute_force_plan(compute: Sequence[float], weights: Sequence[float], act: Sequence[float], workers: int,
                     sync: Sync, comm: Comm) -> PipeDreamPlan:
    """Every contiguous partition and every replication using all workers (the test oracle)."""
    n = len(compute)
    best = None
    for mask in itertools.product((False, True), repeat=n - 1):
        cuts = [0] + [i + 1 for i, c in enumerate(mask) if c] + [n]
        stages = [(a, b - 1) for a, b in zip(cuts, cuts[1:])]
        k = len(stages)
        if k > workers:
            continue
        for bars in itertools.combinations(range(1, workers), k - 1):  # compositions of workers into k parts
            edges = (0, *bars, workers)
            reps = [b - a for a, b in zip(edges, edges[1:])]
            p = plan_period(compute, weights, act, stages, reps, sync, comm)
            if best is None or p < best.period_s:
                best = PipeDreamPlan(tuple(stages), tuple(reps), p)
    return best


def noam(replication: Sequence[int]) -> int:
    """PipeDream's NOAM, ceil(workers / workers of the input stage): microbatches each input-stage
    replica keeps in the pipeline in steady state (NOAM x replication[0] in all)."""
    return -(-sum(replication) // replication[0])
