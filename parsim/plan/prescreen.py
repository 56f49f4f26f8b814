"""Analytic pre-screen for ``parsim plan``: cost every candidate (parsim.plan.space) fast.

Nothing here is a second cost model. Per-stage seconds and bytes come from
:class:`parsim.costs.ModelCosts` (memoised across candidates that share the same
tensor/context degree, microbatch, recompute mode and stage shape); legality comes from
the scenario loader's own checks; the pipeline's shape comes from the registered
schedule builders. What is closed-form is only the step-time arithmetic on top:

* work of a pipeline rank = m * sum over its stages of (F + B);
* bubble, per schedule family, with the slowest stage's times t_F, t_I, t_W
  (Narayanan et al. 2021; Qi et al. 2023): GPipe/1F1B (p-1)(t_F+t_B), 1F1B-IW
  (p-1)(t_F+t_I), interleaved (p-1)(t_F+t_B) with per-virtual-stage times, ZB-H1
  (p-1)max(t_F, t_F+t_I-t_W), ZB-H2 (p-1)max(t_F, t_F+t_I-2t_W) (over the makespan, so
  the staggered start counts; checked against the dry run); any other registered schedule
  is dry-run (parsim.schedule.dry_run) with those durations;
* plus 2(n_stages-1) activation transfers and each rank's data-parallel tail
  (gradient reduction, optimizer step, parameter gather), as the engine runs them.

Memory is exact for ZeRO 0-2 and an upper bound for ZeRO-3: model states from
``ModelCosts.rank_model_states`` plus the activation stash walked over each rank's
action order with the same stash/free/transient rules the engine applies. So a
configuration the pre-screen admits also fits in the event simulation.
"""
import copy
from dataclasses import dataclass, replace
from functools import lru_cache

from parsim.config.scenario import Scenario
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.model import is_moe_layer
from parsim.plan.space import Candidate, PlanSpec, _schedule, make_scenario
from parsim.schedule import dry_run
from parsim.schedule.ir import Op
from parsim.schedule.semantics import bubble_time


@dataclass
class Estimate:
    """Pre-screen numbers of one candidate."""

    cand: Candidate
    step_time_s: float
    bubble_s: float
    exposed_comm_s: float
    peak_memory_bytes: float
    fits: bool


# ---------------------------------------------------------------------------- memoised costs

_STAGE_CACHE: dict[tuple, tuple] = {}
_LAYER_CACHE: dict[tuple, tuple] = {}


class CachedCosts(ModelCosts):
    """ModelCosts whose per-layer and per-stage results are memoised across candidates.

    Stages with the same layer kinds, position (first/last) and per-GPU shard shape
    cost the same; candidates differing only in dp, pp or ZeRO reuse them. Each of
    ModelCosts' construction steps is wrapped, never re-implemented: what a step sets
    on the StageCost is recorded once and replayed.
    """

    def _base_key(self) -> tuple:
        sc, par = self.sc, self.sc.parallel
        key = (id(sc.model), sc.model.name, sc.hardware.name, par.tp, par.cp, par.ep,
               par.sequence_parallel, sc.training, sc.overlap)
        if sc.model.is_moe:  # expert groups and routing depend on the whole grid
            key += (par.dp, par.pp, par.vpp, getattr(sc, "moe", None))
        return key

    def _shape_key(self, st) -> tuple:
        sc, par = self.sc, self.sc.parallel
        kinds = tuple(is_moe_layer(sc.model, li) for li in st.layers) if sc.model.is_moe else len(st.layers)
        # tp/cp groups and their links do not depend on dp/pp (tp, cp innermost in the default order)
        return self._base_key() + (kinds, self._is_first(st), self._is_last(st), par.n_stages > 1)

    def _memo(self, step: str, st, fn, extra: tuple = ()) -> None:
        key = (step,) + self._shape_key(st) + extra
        hit = _STAGE_CACHE.get(key)
        if hit is None:
            before = dict(vars(st))
            fn(st)
            hit = _STAGE_CACHE[key] = {k: v for k, v in vars(st).items() if k not in before or before[k] is not v}
        vars(st).update(hit)

    def _layer_times(self, li: int):
        key = self._base_key() + (is_moe_layer(self.sc.model, li),)
        hit = _LAYER_CACHE.get(key)
        if hit is None:
            hit = _LAYER_CACHE[key] = super()._layer_times(li)
        return hit

    def _stage_params(self, st) -> None:
        self._memo("params", st, super()._stage_params)

    def _stage_times(self, st) -> None:
        self._memo("times", st, super()._stage_times)

    def _stage_memory(self, st) -> None:
        self._memo("memory", st, super()._stage_memory)

    def _stage_ops(self, st) -> None:
        par = self.sc.parallel
        self._memo("ops", st, super()._stage_ops, (par.dp, par.pp, par.zero, par.order))


def costs_for(sc: Scenario) -> ModelCosts:
    return CachedCosts(sc)


def with_zero(costs: ModelCosts, zero: int) -> ModelCosts:
    """The same costs under another ZeRO stage: only the data-parallel ops are redone."""
    c2 = copy.copy(costs)
    c2.__dict__.pop("_plan_static", None)
    c2.sc = replace(costs.sc, parallel=replace(costs.sc.parallel, zero=zero))
    c2.stages = []
    for st in costs.stages:
        st2 = copy.copy(st)
        c2._stage_ops(st2)
        c2.stages.append(st2)
    return c2


# ---------------------------------------------------------------------------- memory

@lru_cache(maxsize=4096)
def stash_states(name: str, pp: int, m: int, vpp: int) -> tuple[tuple, ...]:
    """Per rank, the distinct (live F stash per stage, pending W per stage, stage in backward)
    states at which the engine's activation memory can peak (allocation instants)."""
    sched = _schedule(name, pp, m, vpp)
    out = []
    for row in sched.actions:
        mine = sorted({a.stage for a in row})
        idx = {s: i for i, s in enumerate(mine)}
        live, wpend = [0] * len(mine), [0] * len(mine)
        states = set()
        for a in row:
            op = a.op
            if op is Op.F:
                live[idx[a.stage]] += 1
                states.add((tuple(live), tuple(wpend), -1))
            elif op is Op.B or op is Op.I:
                i = idx[a.stage]
                states.add((tuple(live), tuple(wpend), i))
                live[i] -= 1
                if op is Op.I:
                    wpend[i] += 1
            elif op is Op.W:
                wpend[idx[a.stage]] -= 1
        named = {(tuple((mine[i], n) for i, n in enumerate(lv) if n),
                  tuple((mine[i], n) for i, n in enumerate(wp) if n),
                  mine[b] if b >= 0 else -1) for lv, wp, b in states}
        out.append(_pareto(named))
    return tuple(out)


def _pareto(states: set) -> tuple:
    """Drop states another state dominates (memory is a non-negative combination of the counts)."""
    vecs = []
    for live, wpend, bwd in states:
        v = {("a", s): n for s, n in live if n}
        v.update({("w", s): n for s, n in wpend if n})
        if bwd >= 0:
            v[("t", bwd)] = 1
        vecs.append((sum(v.values()), v, (live, wpend, bwd)))
    vecs.sort(key=lambda x: -x[0])  # a dominator has a larger count sum: it comes first
    keep: list[tuple[dict, tuple]] = []
    for _, v, st in vecs:
        if any(all(u.get(k, 0) >= n for k, n in v.items()) for u, _ in keep):
            continue
        keep.append((v, st))
    return tuple(st for _, st in keep)


def rank_peaks(costs: ModelCosts, sched_key: tuple) -> list[float]:
    """Peak bytes of each pipeline rank: model states + activation stash (+ ZeRO-3 windows)."""
    sched = _schedule(*sched_key)
    states = stash_states(*sched_key)
    s2r = sched.stage_to_rank
    stages = costs.stages
    trans = {}
    out = []
    static = costs.__dict__.setdefault("_plan_static", {})
    for rank, rank_states in enumerate(states):
        best = 0.0
        for live, wpend, bwd in rank_states:
            v = sum(n * stages[s].activation_bytes for s, n in live)
            v += sum(n * stages[s].weight_grad_stash_bytes for s, n in wpend)
            if bwd >= 0:
                if bwd not in trans:
                    trans[bwd] = costs.op_cost(bwd, Op.B).transient_bytes
                v += trans[bwd]
            best = max(best, v)
        if rank not in static:
            other = sum(costs.op_cost(s, Op.UNSHARD).stash_bytes for s in range(len(s2r)) if s2r[s] == rank)
            ms = costs.rank_model_states(rank, s2r)
            static[rank] = other + ms["params"] + ms["grads"] + ms["optimizer"]
        out.append(best + static[rank])
    return out


# ---------------------------------------------------------------------------- time

def _bubble(name: str, p: int, v: int, tf: float, ti: float, tw: float, m: int, sched_key) -> float:
    if p == 1:
        return 0.0
    closed = bubble_time(name, p, tf, ti, tw)  # the family's closed form (parsim.schedule.semantics)
    if closed is not None:
        return closed
    # any other family: dry-run its order; the bubble is homogeneous in the durations, so
    # one run per (order, t_I/t_F, t_W/t_F) to two digits serves every candidate
    if tf <= 0:
        return 0.0
    return tf * _dry_bubble(sched_key, round(ti / tf, 2), round(tw / tf, 2))


@lru_cache(maxsize=65536)
def _dry_bubble(sched_key: tuple, ri: float, rw: float) -> float:
    sched = _schedule(*sched_key)
    m, v = sched_key[2], sched_key[3]
    d = dry_run(sched, f=1.0, b=ri + rw, i=ri, w=rw, comm=0.0, unshard=0.0, reduce=0.0, step=0.0)
    return max(0.0, d.makespan - m * v * (1.0 + ri + rw))


def estimate(spec: PlanSpec, c: Candidate, costs: ModelCosts) -> Estimate:
    """Pre-screen step time and peak memory of one candidate, from its (memoised) costs."""
    sc = costs.sc
    m = sc.n_microbatches
    sched_key = (c.schedule, c.pp, m, c.vpp)
    stages = costs.stages
    F = [st.parts[Op.F].total for st in stages]
    I = [st.parts[Op.I].total for st in stages]
    W = [st.parts[Op.W].total for st in stages]
    work = [0.0] * c.pp
    tail = [0.0] * c.pp
    reduce_last = [0.0] * c.pp
    for s, st in enumerate(stages):
        r = s % c.pp
        work[r] += m * (F[s] + I[s] + W[s])
        red = costs.op_cost(s, Op.REDUCE_GRAD).duration_s
        step = costs.op_cost(s, Op.STEP)
        # the last-finishing stage's reduction is exposed; every stage's step and gather run after
        tail[r] += step.duration_s + step.then_comm_s
        reduce_last[r] = max(reduce_last[r], red)
    bubble = _bubble(c.schedule, c.pp, c.vpp, max(F), max(I), max(W), m, sched_key)
    p2p = 0.0
    if c.pp > 1:
        _, bw, lat = costs.link_spec(0, 1)
        p2p = 2 * (c.pp * c.vpp - 1) * (stages[0].p2p_bytes / bw + lat) if bw > 0 else 0.0
    unshard = costs.op_cost(0, Op.UNSHARD).duration_s
    dp_tail = max(t + rl for t, rl in zip(tail, reduce_last))
    T = max(work) + bubble + p2p + dp_tail + unshard
    peaks = rank_peaks(costs, sched_key)
    peak = max(peaks)
    cap = spec.hardware.device.usable_memory_bytes
    return Estimate(c, T, bubble, p2p + dp_tail + unshard, peak, peak <= cap)


def prescreen(spec: PlanSpec, cands: list[Candidate], progress=None) -> tuple[list[Estimate], dict[str, list]]:
    """Estimates of every candidate; configurations the scenario rules refuse go to rejections."""
    rejected: dict[str, list] = {}
    out: list[Estimate] = []
    base_costs: dict[tuple, ModelCosts] = {}
    zero_costs: dict[tuple, ModelCosts] = {}
    for n, c in enumerate(cands):
        if progress is not None and n % 512 == 0:
            progress.update(min(512, len(cands) - n))
        k = (c.dp, c.tp, c.pp, c.cp, c.ep, c.vpp, c.microbatch_size, c.recompute)
        try:
            costs = zero_costs.get(k + (c.zero,))
            if costs is None:
                if k not in base_costs:
                    base_costs[k] = costs_for(make_scenario(spec, replace(c, zero=0)))
                costs = zero_costs[k + (c.zero,)] = with_zero(base_costs[k], c.zero)
            out.append(estimate(spec, c, costs))
        except ConfigError as e:
            rejected.setdefault(e.problem, []).append((c.family(), 1))
    return out, rejected
