"""Inter-operator parallelism: Alpa's stage DP (Zheng et al. OSDI 2022, §5.2, Algorithm 1).

Layers are cut into ``pp`` contiguous stages on submeshes of one shape. For a latency cap
``t_max`` the DP finds the cut minimising the sum of stage latencies with every stage at most
``t_max`` and within memory; the pipeline's step is then ``sum(t_i) + (m - 1) * t_max`` (a
1F1B/GPipe pipeline of m microbatches is paced by its slowest stage). ``t_max`` is enumerated
over the distinct stage latencies, ascending, stopping once ``(m - 1) * t_max`` alone exceeds
the best step found (Alpa's early stop).

Stage costs are linear in the number of blocks (every block of a stage runs the same
strategy): ``t(k) = k * block_s + first_s [stage 0] + last_s [last stage]``; memory
``a + k * b + k * in_flight * c`` with ``in_flight = pp - stage`` microbatches alive in 1F1B.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageModel:
    """A stage's latency and memory as functions of its block count (module docstring)."""

    block_s: float
    """Seconds per block per microbatch."""
    first_s: float
    """Seconds the embedding adds to the first stage."""
    last_s: float
    """Seconds the head and loss add to the last stage."""
    mem_fixed: float
    """Bytes independent of the blocks (one block's recompute working set, say)."""
    mem_block: float
    """Bytes per block (model states)."""
    mem_block_in_flight: float
    """Bytes per block per microbatch alive (the activation stash)."""
    mem_first: float
    """Bytes the embedding adds."""
    mem_last: float
    """Bytes the head adds."""

    def time(self, k: int, first: bool, last: bool) -> float:
        return k * self.block_s + (self.first_s if first else 0.0) + (self.last_s if last else 0.0)

    def memory(self, k: int, first: bool, last: bool, in_flight: int) -> float:
        return (self.mem_fixed + k * (self.mem_block + in_flight * self.mem_block_in_flight)
                + (self.mem_first if first else 0.0) + (self.mem_last if last else 0.0))


@dataclass(frozen=True)
class Pipeline:
    """Alpa's DP answer for one submesh shape."""

    layers_per_stage: tuple[int, ...]
    stage_s: tuple[float, ...]
    """Per-microbatch latency of each stage."""
    step_s: float
    """sum(stage_s) + (m - 1) * max(stage_s)."""
    t_max: float


def best_split(sm: StageModel, n_layers: int, pp: int, m: int, budget: float) -> Pipeline | None:
    """Alpa's DP over contiguous cuts of ``n_layers`` blocks into ``pp`` stages (None: no cut fits)."""
    if pp > n_layers:
        return None
    cands = sorted({sm.time(k, s == 0, s == pp - 1) for s in range(pp) for k in range(1, n_layers - pp + 2)})
    best: Pipeline | None = None
    for t_max in cands:
        if best is not None and (m - 1) * t_max >= best.step_s:
            break
        cut = _dp(sm, n_layers, pp, t_max, budget, m)
        if cut is None:
            continue
        times = tuple(sm.time(k, s == 0, s == pp - 1) for s, k in enumerate(cut))
        step = sum(times) + (m - 1) * max(times)
        if best is None or step < best.step_s:
            best = Pipeline(cut, times, step, max(times))
    return best


def _dp(sm: StageModel, n_layers: int, pp: int, t_max: float, budget: float, m: int) -> tuple[int, ...] | None:
    """Min sum of stage latencies, each <= t_max and within memory: F[s][l] over the first s stages
    holding l blocks. Stage latencies are increasing in k, so each stage's k ranges up to a cap."""
    inf = float("inf")
    f = [[inf] * (n_layers + 1) for _ in range(pp + 1)]
    arg = [[0] * (n_layers + 1) for _ in range(pp + 1)]
    f[0][0] = 0.0
    for s in range(pp):
        first, last = s == 0, s == pp - 1
        flight = min(m, pp - s)
        ks = [k for k in range(1, n_layers - (pp - s - 1) + 1)
              if sm.time(k, first, last) <= t_max * (1 + 1e-12) and sm.memory(k, first, last, flight) <= budget]
        if not ks:
            return None
        row, nxt, a = f[s], f[s + 1], arg[s + 1]
        for l0 in range(s, n_layers - (pp - s) + 1):
            base = row[l0]
            if base == inf:
                continue
            for k in ks:
                l1 = l0 + k
                if l1 > n_layers - (pp - s - 1):
                    break
                v = base + sm.time(k, first, last)
                if v < nxt[l1]:
                    nxt[l1], a[l1] = v, k
    if f[pp][n_layers] == inf:
        return None
    cut, l = [], n_layers
    for s in range(pp, 0, -1):
        k = arg[s][l]
        cut.append(k)
        l -= k
    return tuple(reversed(cut))
