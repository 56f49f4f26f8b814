"""Analytic pre-screen for ``parsim plan``: cost every candidate (parsim.plan.space) fast.

Nothing here is a second cost model. Per-stage seconds and bytes come from
:class:`parsim.costs.ModelCosts`, whose per-layer, per-stage and data-parallel parts are
pure functions cached by their typed inputs (``parsim.costs.layer``/``stage``/``dp``): a
candidate that shares a shard shape with another reuses its costs through them. Legality
comes from the scenario loader's own checks; the pipeline's shape comes from the
registered schedule builders. What is closed-form is only the step-time arithmetic on top:

* work of a pipeline rank = m * sum over its stages of (F + B);
* bubble, per schedule family, with the slowest stage's times t_F, t_I, t_W
  (Narayanan et al. 2021; Qi et al. 2023; ``parsim.schedule.semantics.bubble_time``),
  over the makespan (checked against the dry run); any other registered schedule is
  dry-run (parsim.schedule.dry_run) with those durations;
* plus 2(n_stages-1) activation transfers and each rank's data-parallel tail
  (gradient reduction, optimizer step, parameter gather), as the engine runs them.

Memory is exact for ZeRO 0-2 and an upper bound for ZeRO-3: model states from
``ModelCosts.model_states`` plus the activation stash at every instant a rank can
peak (:func:`stash_states`: its action order under the engine's stash/free/transient
rules). So a configuration the pre-screen admits also fits in the event simulation.

Within one :func:`prescreen` call, what candidates share is computed once: per
configuration (dp, tp, pp, cp, ep, vpp, microbatch, recompute) its cost model and pipeline
summary, per ZeRO stage on top its data-parallel summary, per schedule its bubble and
activation peaks; across calls the cost model's own caches and :func:`stash_states` serve.
"""
from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from functools import lru_cache
from operator import add

import numpy as np

from parsim.costs import clear_caches as costs_clear_caches
from parsim.costs.inputs import cost_inputs
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.plan.space import Candidate, PlanSpec, _schedule, make_scenario
from parsim.schedule import dry_run
from parsim.schedule.ir import Op
from parsim.schedule.semantics import bubble_time
from parsim.sim.engine import OpCost


@dataclass
class Estimate:
    """Pre-screen numbers of one candidate."""

    cand: Candidate
    """The configuration."""
    step_time_s: float
    """Busiest rank's work + bubble + transfers + data-parallel tail."""
    bubble_s: float
    """The schedule's bubble (closed form or dry run)."""
    exposed_comm_s: float
    """Pipeline transfers of fill and drain + the data-parallel tail + ZeRO-3's first gather."""
    peak_memory_bytes: float
    """Largest rank's model states + activation stash at its worst instant."""
    fits: bool
    """Peak within the device's usable memory."""


# ---------------------------------------------------------------------------- memory

@dataclass(frozen=True)
class StashStates:
    """The activation states at which a schedule's ranks can peak: at each F (after it
    allocates) and each B/I (while it runs), the microbatches stashed and waiting for W
    per stage slot (slot j of rank r: stage r + j*pp) and the slot in backward. States
    another state dominates (more of everything; memory is a non-negative combination of
    the counts) are left out."""

    rank: np.ndarray
    """(n,) pipeline rank of each state, ascending."""
    live: np.ndarray
    """(n, k) microbatches stashed per slot (F done, backward not started)."""
    wpend: np.ndarray
    """(n, k) microbatches waiting for W per slot (I done)."""
    bwd: np.ndarray
    """(n,) slot running a backward (its transient counts), -1 at an F."""
    starts: np.ndarray
    """(pp,) index of each rank's first state."""


_CODE = {Op.F: 1, Op.B: 2, Op.I: 3, Op.W: 4}


@lru_cache(maxsize=4096)
def stash_states(name: str, pp: int, m: int, vpp: int) -> StashStates:
    """The states of the schedule ``name`` (pp ranks, m microbatches, vpp stages per rank)."""
    rows = _schedule(name, pp, m, vpp).actions
    total = sum(len(r) for r in rows)
    code = np.fromiter((a.stage * 8 + _CODE.get(a.op, 0) for row in rows for a in row), np.int64, total)
    stage, op = np.divmod(code, 8)
    rank = np.repeat(np.arange(pp), [len(r) for r in rows])
    keep = op > 0
    stage, op, rank = stage[keep], op[keep], rank[keep]
    slot = stage // pp  # the planner pre-screens placements with stage s on rank s % pp
    k = int(slot.max()) + 1
    is_f, is_i = op == 1, op == 3
    is_b = (op == 2) | is_i
    # every rank's row nets to zero, so one running sum over all rows is each rank's own;
    # a backward's state is taken before it frees
    if k == 1:
        live = np.cumsum(is_f.astype(np.int64) - is_b)[:, None] + is_b[:, None]
        wpend = np.cumsum(is_i.astype(np.int64) - (op == 4))[:, None] - is_i[:, None]
    else:
        n = len(op)
        d_live, d_w = np.zeros((n, k), np.int64), np.zeros((n, k), np.int64)
        d_live[is_f, slot[is_f]] = 1
        d_live[is_b, slot[is_b]] = -1
        d_w[is_i, slot[is_i]] = 1
        d_w[op == 4, slot[op == 4]] = -1
        live, wpend = np.cumsum(d_live, axis=0), np.cumsum(d_w, axis=0)
        live[is_b] -= d_live[is_b]
        wpend[is_i] -= d_w[is_i]
    same_next = np.append(rank[1:] == rank[:-1], False)
    nxt = np.where(same_next, np.append(op[1:], 0), 0)
    prev_b = np.insert(same_next[:-1] & (op[:-1] == 2), 0, False) & (np.insert(slot[:-1], 0, -1) == slot)
    # an F followed by F/B/I of the same rank is dominated by the next state; so is a
    # backward right after a B of the same slot (one microbatch fewer, nothing more)
    sel = (is_f & (nxt != 1) & (nxt != 2) & (nxt != 3)) | (is_b & ~prev_b)
    table = np.column_stack([rank[sel], live[sel], wpend[sel], np.where(is_b, slot, -1)[sel] + 1])
    table = table[_pareto_single_slot(table)] if k == 1 else _unique_rows(table)
    r = table[:, 0]
    return StashStates(r, table[:, 1:1 + k], table[:, 1 + k:1 + 2 * k], table[:, -1] - 1,
                       np.searchsorted(r, np.arange(pp)))


def _unique_rows(t: np.ndarray) -> np.ndarray:
    """Distinct rows, sorted (mixed-radix codes in one int64 when they fit: a 1-D sort)."""
    radix = t.max(axis=0) + 1
    if float(np.prod(radix.astype(float))) >= 2.0 ** 62:
        return np.unique(t, axis=0)
    code = np.zeros(len(t), np.int64)
    for c in range(t.shape[1]):
        code = code * radix[c] + t[:, c]
    code = np.unique(code)
    out = np.empty((len(code), t.shape[1]), np.int64)
    for c in range(t.shape[1] - 1, -1, -1):
        code, out[:, c] = np.divmod(code, radix[c])
    return out


def _pareto_single_slot(t: np.ndarray) -> np.ndarray:
    """Rows (rank-major) of the states (rank, live, wpend, in backward) no other state of the
    rank dominates; duplicates count once."""
    rank, live, w, b = t[:, 0], t[:, 1], t[:, 2], t[:, 3] > 0
    order = np.lexsort((~b, -w, -live, rank))  # per rank: most live first, in-backward before not
    big = int(w.max()) + 2
    base = rank[order] * big
    wv = base + w[order]
    # exclusive running maxima of wpend over earlier (more live) states: all, and in-backward only
    prev_all = np.maximum.accumulate(np.concatenate([[-1], wv[:-1]]))
    wb = np.where(b[order], wv, base - 1)
    prev_b = np.maximum.accumulate(np.concatenate([[-1], wb[:-1]]))
    keep = np.where(b[order], prev_b < wv, prev_all < wv)
    return order[keep]  # rank-major


def activation_peaks(states: StashStates, act: np.ndarray, wstash: np.ndarray, transient: np.ndarray,
                     pp: int) -> np.ndarray:
    """Per rank, the largest activation bytes over its states (``act``, ``wstash``, ``transient``:
    per stage, one microbatch's stash, what W keeps, what a backward holds while it runs)."""
    k = states.live.shape[1]
    stage = states.rank[:, None] + pp * np.arange(k)[None, :]
    v = np.zeros(len(states.rank))
    for j in range(k):  # slot by slot, in stage order: the same float sums as a walk
        v = v + states.live[:, j] * act[stage[:, j]]
    w = np.zeros(len(states.rank))
    for j in range(k):
        w = w + states.wpend[:, j] * wstash[stage[:, j]]
    v = v + w
    in_bwd = states.bwd >= 0
    v = v + np.where(in_bwd, transient[states.rank + pp * np.maximum(states.bwd, 0)], 0.0)
    return np.maximum(np.maximum.reduceat(v, states.starts), 0.0)


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


@dataclass(frozen=True)
class PipelineSummary:
    """What every schedule and ZeRO stage of one configuration shares (stage s on rank s % pp)."""

    n_microbatches: int
    """Microbatches per step and pipeline."""
    work_s: float
    """Busiest pipeline rank's F + B over the step."""
    t_f: float
    """Slowest stage's F."""
    t_i: float
    """Slowest stage's I."""
    t_w: float
    """Slowest stage's W."""
    p2p_s: float
    """The 2(n_stages-1) activation transfers of the fill and drain."""
    activation: np.ndarray
    """Per stage: one microbatch's activation stash."""
    weight_grad_stash: np.ndarray
    """Per stage: what W still needs after I."""
    transient: np.ndarray
    """Per stage: bytes a backward holds while it runs."""


@dataclass(frozen=True)
class DPSummary:
    """What every schedule of one configuration under one ZeRO stage shares."""

    tail_s: float
    """Largest rank tail: its last reduction, then every stage's step and parameter gather."""
    unshard_s: float
    """ZeRO-3: what the largest rank's compute waits for its parameter gathers per step."""
    static: list[float]
    """Per pipeline rank: model states + ZeRO-3 gather windows."""
    dp_busy_s: float = 0.0
    """Largest rank's data-parallel stream time per step (gathers and per-microbatch reductions)."""


def _rank_groups(costs: ModelCosts, pp: int) -> tuple[tuple[int, ...], ...]:
    """Ranks grouped by the shapes of the stages they hold (equal shapes: equal sums); every
    rank alone when the schedule gives ranks different weight versions."""
    if costs.traits.weight_versions:
        return tuple((r,) for r in range(pp))
    return _groups_by_shape(costs.shape_of, pp)


@lru_cache(maxsize=4096)
def _groups_by_shape(shape_of: tuple[int, ...], pp: int) -> tuple[tuple[int, ...], ...]:
    out: dict[tuple, list[int]] = {}
    for r in range(pp):
        out.setdefault(shape_of[r::pp], []).append(r)
    return tuple(tuple(g) for g in out.values())


def pipeline_summary(costs: ModelCosts, pp: int, vpp: int) -> PipelineSummary:
    """The part of the estimate that no ZeRO stage changes."""
    m = costs.inputs.n_microbatches
    stages = costs.stage_costs
    n = len(stages)
    F = [st.parts[Op.F].total for st in stages]
    I = [st.parts[Op.I].total for st in stages]
    W = [st.parts[Op.W].total for st in stages]
    work = 0.0
    for ranks in _rank_groups(costs, pp):
        wk = 0.0
        for s in range(ranks[0], n, pp):
            wk += m * (F[s] + I[s] + W[s])
        work = max(work, wk)
    p2p = 0.0
    if pp > 1:
        _, bw, lat = costs.link_spec(0, 1)
        p2p = 2 * (pp * vpp - 1) * (stages[0].p2p_bytes / bw + lat) if bw > 0 else 0.0
    return PipelineSummary(m, work, max(F), max(I), max(W), p2p, np.array([st.activation_bytes for st in stages]),
                           np.array([st.weight_grad_stash_bytes for st in stages]),
                           np.array([st.ops[Op.B].transient_bytes for st in stages]))


_NO_OP = OpCost(0.0)


def dp_summary(costs: ModelCosts, pp: int) -> DPSummary:
    """The part of the estimate a ZeRO stage changes: the data-parallel tail and model states.

    ZeRO-3/FSDP resharding after forward gathers each stage's parameters before every F and
    every B (2 m per stage and step), and ZeRO-2/3 reduce every microbatch's gradients: the
    compute waits for each gather's exposed part, and the data-parallel stream must carry
    all of it (``unshard_s``: the larger of the waits and what the stream carries beyond the
    rank's work, added by :func:`_estimate`)."""
    n = len(costs.stage_costs)
    par, m = costs.inputs.parallel, costs.inputs.n_microbatches
    gathers = 2 * m if par.reshard_after_forward else 1
    reductions = m if par.dp > 1 and par.grad_per_microbatch else 1
    tail, static, waits, busy = 0.0, [0.0] * pp, 0.0, 0.0
    for ranks in _rank_groups(costs, pp):
        tl, rl, other, wt, bz = 0.0, 0.0, 0, 0.0, 0.0
        mine = list(range(ranks[0], n, pp))
        for s in mine:
            ops = costs.dp_ops[s].ops
            step = ops[Op.STEP]
            # the last-finishing stage's reduction is exposed; every stage's step and gather run after
            tl += step.duration_s + step.then_comm_s
            rg = ops.get(Op.REDUCE_GRAD, _NO_OP)
            red = rg.duration_s
            rl = max(rl, red - rg.lead_s, rg.tail_s)  # what outlasts the backward
            un = ops.get(Op.UNSHARD, _NO_OP)
            other += un.stash_bytes
            wt += gathers * (un.duration_s if un.wait_s is None else un.wait_s)
            bz += gathers * un.duration_s + reductions * red
        tail = max(tail, tl + rl)
        waits, busy = max(waits, wt), max(busy, bz)
        ms = costs.model_states(mine, ranks[0])
        for r in ranks:
            static[r] = other + ms["params"] + ms["grads"] + ms["optimizer"] + sum(v for _, v in ms["buffers"])
    return DPSummary(tail, waits, static, busy)


def _schedule_part(c: Candidate, s: PipelineSummary) -> tuple[float, list[float]]:
    """(bubble seconds, activation peak per rank) of a candidate's schedule: the same for
    every ZeRO stage (they change neither the op times nor the stash)."""
    sched_key = (c.schedule, c.pp, s.n_microbatches, c.vpp)
    bubble = _bubble(c.schedule, c.pp, c.vpp, s.t_f, s.t_i, s.t_w, s.n_microbatches, sched_key)
    states = stash_states(*sched_key)
    return bubble, activation_peaks(states, s.activation, s.weight_grad_stash, s.transient, c.pp).tolist()


def _estimate(c: Candidate, s: PipelineSummary, d: DPSummary, bubble: float, peaks: list[float],
              capacity: float) -> Estimate:
    gathers = max(d.unshard_s, d.dp_busy_s - s.work_s - d.tail_s)  # waits, or a stream busier than compute
    T = s.work_s + bubble + s.p2p_s + d.tail_s + gathers
    peak = max(map(add, peaks, d.static))
    return Estimate(c, T, bubble, s.p2p_s + d.tail_s + gathers, peak, peak <= capacity)


def estimate(spec: PlanSpec, c: Candidate, costs: ModelCosts) -> Estimate:
    """Pre-screen step time and peak memory of one candidate, from its cost model."""
    s = pipeline_summary(costs, c.pp, c.vpp)
    return _estimate(c, s, dp_summary(costs, c.pp), *_schedule_part(c, s), spec.hardware.device.usable_memory_bytes)


def clear_caches() -> None:
    """Empty the pre-screen's caches and the cost model's (a cold start, as a new process)."""
    costs_clear_caches()
    for fn in (stash_states, _groups_by_shape, _dry_bubble):
        fn.cache_clear()


def prescreen(spec: PlanSpec, cands: list[Candidate], progress=None) -> tuple[list[Estimate], dict[str, list]]:
    """Estimates of every candidate; configurations the scenario rules refuse go to rejections."""
    # The schedules the enumeration built hold about a million tracked objects; while the
    # pre-screen fills its caches (acyclic values) the cyclic collector would walk them again
    # and again (a sixth of the run). Collection resumes afterwards.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _prescreen(spec, cands, progress)
    finally:
        if was_enabled:
            gc.enable()


def _prescreen(spec: PlanSpec, cands: list[Candidate], progress) -> tuple[list[Estimate], dict[str, list]]:
    rejected: dict[str, list] = {}
    out: list[Estimate] = []
    capacity = spec.hardware.device.usable_memory_bytes
    # what candidates share, computed once per call: per configuration (at ZeRO 0) its cost
    # inputs and pipeline summary, per ZeRO stage its data-parallel summary, per schedule
    # its bubble and activation peaks
    configs: dict[tuple, tuple[ModelCosts, PipelineSummary] | ConfigError] = {}
    dps: dict[tuple, DPSummary] = {}
    scheds: dict[tuple, tuple] = {}
    for n, c in enumerate(cands):
        if progress is not None and n % 512 == 0:
            progress.update(min(512, len(cands) - n))
        k = (c.dp, c.tp, c.pp, c.cp, c.ep, c.vpp, c.microbatch_size, c.recompute)
        conf = configs.get(k)
        if conf is None:
            try:
                costs = ModelCosts(cost_inputs(make_scenario(spec, replace(c, zero=0))))
                conf = configs[k] = (costs, pipeline_summary(costs, c.pp, c.vpp))
            except ConfigError as e:
                conf = configs[k] = e
        if isinstance(conf, ConfigError):
            rejected.setdefault(conf.problem, []).append((c.family(), 1))
            continue
        costs, s = conf
        d = dps.get(k + (c.zero,))
        if d is None:
            if c.zero:
                ci = costs.inputs
                costs = ModelCosts(replace(ci, parallel=replace(ci.parallel, zero=c.zero)))
            d = dps[k + (c.zero,)] = dp_summary(costs, c.pp)
        part = scheds.get((k, c.schedule))
        if part is None:
            part = scheds[(k, c.schedule)] = _schedule_part(c, s)
        out.append(_estimate(c, s, d, *part, capacity))
    return out, rejected
