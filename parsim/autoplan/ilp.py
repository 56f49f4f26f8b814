"""Intra-operator parallelism as an integer linear program (Alpa, Zheng et al. OSDI 2022, §4.2).

One-hot variables ``x[o, s]`` pick a strategy per op; edge variables ``e[(u, v), s, t]`` linearise
the resharding cost between consecutive ops (``sum_t e[s, t] = x[u, s]``, ``sum_s e[s, t] =
x[v, t]``, ``e >= 0``: with one-hot x the only feasible e is their product); the objective is the
per-microbatch time of a stage of ``n_blocks`` alike blocks (compute, the collectives each
strategy implies, resharding); a memory constraint at each op's liveness point holds what is
kept there (model states plus the activations of the microbatches in flight: a training stage
peaks at the end of its forward) plus what lives only while that op runs (FSDP's gathered
weight and gradient). ``runnable`` adds family variables ``y[f]`` (one-hot) with
``y[f] <= sum_{s serves f} x[o, s]`` for every op: the space the engine and the runtime run
(Megatron's TP/SP, DP, FSDP), which the emitted scenario needs. Solved with HiGHS through
``scipy.optimize.milp`` (the ``autoplan`` extra).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from parsim.autoplan.graph import Graph, edge_matrices, families, op_time, serves
from parsim.cluster.hardware import HardwareProfile
from parsim.errors import ConfigError

EXTRA_HINT = "needs scipy (HiGHS) for its ILP: pip install 'parsim[autoplan]'"


@dataclass(frozen=True)
class Problem:
    """A stage's intra-op question."""

    graph: Graph
    hardware: HardwareProfile
    n_blocks: int = 1
    """Alike blocks in the stage (the block ops' costs and memory count this many times)."""
    n_microbatches: int = 1
    """Microbatches per step (per-step collectives are spread over them)."""
    recompute: str = "none"
    """none | full."""
    in_flight: int = 1
    """Microbatches whose activations are alive at the stage's peak (1F1B: pp - stage)."""
    memory_budget: float = float("inf")
    """Bytes a device may hold."""
    runnable: bool = False
    """Restrict to the axes families the engine runs (:func:`parsim.autoplan.graph.families`)."""


@dataclass(frozen=True)
class Solution:
    choice: tuple[int, ...]
    """Strategy index per op."""
    time_s: float
    """Per-microbatch seconds of the stage (objective)."""
    memory_bytes: float
    """Peak bytes per device (the largest left side of the memory constraints)."""


@dataclass(frozen=True)
class Coefficients:
    time: tuple[tuple[float, ...], ...]
    """Per op, per strategy: seconds per microbatch."""
    memory: tuple[tuple[float, ...], ...]
    """Per op, per strategy: bytes kept at the peak."""
    transient: tuple[tuple[float, ...], ...]
    """Per op, per strategy: bytes alive only while the op runs."""
    edges: tuple[tuple[tuple[float, ...], ...], ...]
    """Per edge, [s][t] seconds per microbatch."""


def _block_op(g: Graph, o: int) -> bool:
    return g.ops[o].kind not in ("embedding", "lm_head")


def coefficients(p: Problem) -> Coefficients:
    g = p.graph
    times, mems, trans = [], [], []
    for o, op in enumerate(g.ops):
        k = p.n_blocks if _block_op(g, o) else 1
        t, mm = [], []
        trans.append(tuple(s.transient_bytes for s in op.strategies))
        for s in op.strategies:
            t.append(k * op_time(s, p.recompute, p.n_microbatches))
            if p.recompute == "full" and _block_op(g, o):
                # only each block's input is kept; one block's activations are alive while it is recomputed
                stash = (k * p.in_flight * s.stash_bytes if op.name == "ln1" else 0.0) + s.stash_bytes
            else:
                stash = k * p.in_flight * s.stash_bytes
            mm.append(k * s.state_bytes + stash)
        times.append(tuple(t))
        mems.append(tuple(mm))
    edges = []
    refwd = 2.0 if p.recompute == "full" else 1.0
    for e in range(len(g.edges)):
        fwd, bwd = edge_matrices(p.hardware, g, e)
        k = p.n_blocks if all(_block_op(g, o) for o in g.edges[e][:2]) else 1
        edges.append(tuple(tuple(k * (refwd * f + b) for f, b in zip(fr, br)) for fr, br in zip(fwd, bwd)))
    return Coefficients(tuple(times), tuple(mems), tuple(trans), tuple(edges))


def evaluate(p: Problem, choice: tuple[int, ...], co: Coefficients | None = None) -> tuple[float, float]:
    """(per-microbatch seconds, peak bytes) of a strategy choice."""
    co = co or coefficients(p)
    t = sum(co.time[o][s] for o, s in enumerate(choice))
    t += sum(co.edges[e][choice[u]][choice[v]] for e, (u, v, _) in enumerate(p.graph.edges))
    m = sum(co.memory[o][s] for o, s in enumerate(choice)) + max(co.transient[o][s] for o, s in enumerate(choice))
    return t, m


def allowed(p: Problem) -> list[list[bool]]:
    """Per op, per strategy: inside the runnable space (all True when not ``runnable``)."""
    g = p.graph
    if not p.runnable:
        return [[True] * len(op.strategies) for op in g.ops]
    fams = families(g.mesh, g.n_experts)
    return [[any(serves(op, s, f) for f in fams) for s in op.strategies] for op in g.ops]


def brute_force(p: Problem) -> Solution | None:
    """Every combination (toy graphs only): the oracle the ILP is tested against."""
    co = coefficients(p)
    best = None
    fams = families(p.graph.mesh, p.graph.n_experts) if p.runnable else [None]
    for choice in itertools.product(*[range(len(op.strategies)) for op in p.graph.ops]):
        if p.runnable and not any(all(serves(op, op.strategies[s], f) for op, s in zip(p.graph.ops, choice))
                                  for f in fams):
            continue
        t, m = evaluate(p, choice, co)
        if m <= p.memory_budget and (best is None or t < best.time_s):
            best = Solution(tuple(choice), t, m)
    return best


def solve(p: Problem) -> Solution | None:
    """The ILP's optimum (None: nothing fits the memory budget)."""
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix
    except ImportError:
        raise ConfigError("parsim autoplan", None, EXTRA_HINT) from None
    g = p.graph
    co = coefficients(p)
    ok = allowed(p)
    n_s = [len(op.strategies) for op in g.ops]
    x0 = list(itertools.accumulate([0] + n_s))
    n_x = x0[-1]
    e0 = [n_x]
    for (u, v, _) in g.edges:
        e0.append(e0[-1] + n_s[u] * n_s[v])
    fams = families(g.mesh, g.n_experts) if p.runnable else []
    y0 = e0[-1]
    n_var = y0 + len(fams)
    c = np.zeros(n_var)
    for o in range(len(g.ops)):
        c[x0[o]:x0[o + 1]] = co.time[o]
    for e, (u, v, _) in enumerate(g.edges):
        c[e0[e]:e0[e + 1]] = np.asarray(co.edges[e]).ravel()
    rows, cols, vals, lo, hi = [], [], [], [], []
    r = 0

    def row(entries, lb, ub):
        nonlocal r
        for j, val in entries:
            rows.append(r)
            cols.append(j)
            vals.append(val)
        lo.append(lb)
        hi.append(ub)
        r += 1

    for o in range(len(g.ops)):  # one strategy per op
        row([(x0[o] + s, 1.0) for s in range(n_s[o])], 1, 1)
    for e, (u, v, _) in enumerate(g.edges):  # edge variables: marginals are the two ops' one-hots
        nv = n_s[v]
        for s in range(n_s[u]):
            row([(e0[e] + s * nv + t, 1.0) for t in range(nv)] + [(x0[u] + s, -1.0)], 0, 0)
        for t in range(nv):
            row([(e0[e] + s * nv + t, 1.0) for s in range(n_s[u])] + [(x0[v] + t, -1.0)], 0, 0)
    if p.memory_budget != float("inf"):  # one row per liveness point: while op i runs
        for i in range(len(g.ops)):
            row([(x0[o] + s, co.memory[o][s] + (co.transient[o][s] if o == i else 0.0))
                 for o in range(len(g.ops)) for s in range(n_s[o])], -np.inf, p.memory_budget)
    if fams:
        row([(y0 + f, 1.0) for f in range(len(fams))], 1, 1)
        for o, op in enumerate(g.ops):
            for f, fam in enumerate(fams):
                # family f chosen -> the op runs one of its strategies (a norm's may serve several)
                row([(x0[o] + s, -1.0) for s, st in enumerate(op.strategies) if serves(op, st, fam)]
                    + [(y0 + f, 1.0)], -np.inf, 0)
    upper = np.ones(n_var)
    for o in range(len(g.ops)):
        for s in range(n_s[o]):
            if not ok[o][s]:
                upper[x0[o] + s] = 0.0
    integrality = np.zeros(n_var)
    integrality[:n_x] = 1
    integrality[y0:] = 1
    a = coo_matrix((vals, (rows, cols)), shape=(r, n_var)).tocsr()
    res = milp(c, constraints=LinearConstraint(a, lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(n_var), upper), options={"disp": False})
    if res.x is None or res.status not in (0,):
        return None
    choice = tuple(int(np.argmax(res.x[x0[o]:x0[o + 1]])) for o in range(len(g.ops)))
    t, m = evaluate(p, choice, co)
    return Solution(choice, t, m)
