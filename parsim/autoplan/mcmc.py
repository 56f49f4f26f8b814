"""FlexFlow-style search (Jia et al., SysML 2019, §5): Markov chain Monte Carlo over the same
strategy space as the ILP, for graphs too large for it.

A state is a strategy per op; a proposal changes one op's strategy at random (FlexFlow's
"random op, random configuration"), the Metropolis-Hastings rule accepts it with probability
``min(1, exp(beta * (cost - cost')))``; a choice over the memory budget costs its time plus
``penalty`` seconds per byte over (it can be walked through, never returned). The best feasible
state seen is the answer. Deterministic for a seed; costs from ``parsim.autoplan.ilp``.
"""
from __future__ import annotations

import math
import random

from parsim.autoplan.ilp import Problem, Solution, allowed, coefficients, evaluate


def search(p: Problem, steps: int = 20000, seed: int = 0, beta: float | None = None,
           start: tuple[int, ...] | None = None) -> Solution | None:
    """The best feasible strategy choice an MCMC walk of ``steps`` proposals finds (None: none
    fitted the budget). ``beta`` defaults to 20 / (the start's cost): a proposal 5% worse is
    accepted about 37% of the time. ``runnable`` problems are walked over the engine's
    families only (the whole graph moves to another family)."""
    rng = random.Random(seed)
    co = coefficients(p)
    ops = p.graph.ops
    ok = allowed(p)
    if p.runnable:
        return _family_walk(p, co, rng, steps)
    choices = [[s for s in range(len(op.strategies)) if ok[o][s]] for o, op in enumerate(ops)]
    cur = list(start) if start is not None else [rng.choice(c) for c in choices]

    def cost(ch) -> tuple[float, float]:
        t, m = evaluate(p, tuple(ch), co)
        over = max(0.0, m - p.memory_budget) if p.memory_budget != float("inf") else 0.0
        return t + over * _penalty(t), m

    c_cur, m_cur = cost(cur)
    beta = beta if beta is not None else 20.0 / max(c_cur, 1e-12)
    best = Solution(tuple(cur), *evaluate(p, tuple(cur), co)) if m_cur <= p.memory_budget else None
    for _ in range(steps):
        o = rng.randrange(len(ops))
        if len(choices[o]) < 2:
            continue
        new = list(cur)
        new[o] = rng.choice([s for s in choices[o] if s != cur[o]])
        c_new, m_new = cost(new)
        if c_new <= c_cur or rng.random() < math.exp(-beta * (c_new - c_cur)):
            cur, c_cur = new, c_new
            if m_new <= p.memory_budget:
                t = evaluate(p, tuple(cur), co)[0]
                if best is None or t < best.time_s:
                    best = Solution(tuple(cur), t, m_new)
    return best


def _penalty(t: float) -> float:
    """Seconds per byte over budget: a GiB over costs as much as the whole choice."""
    return t / 2**30


def _family_walk(p: Problem, co, rng: random.Random, steps: int) -> Solution | None:
    from parsim.autoplan.graph import families, serves
    fams = families(p.graph.mesh, p.graph.n_experts)
    cands = []
    for f in fams:
        ch = []
        for op in p.graph.ops:
            s = [i for i, st in enumerate(op.strategies) if serves(op, st, f)]
            if not s:
                break
            ch.append(s[0])
        else:
            cands.append(tuple(ch))
    best = None
    for _ in range(min(steps, 4 * len(cands))):
        ch = rng.choice(cands)
        t, m = evaluate(p, ch, co)
        if m <= p.memory_budget and (best is None or t < best.time_s):
            best = Solution(ch, t, m)
    return best
