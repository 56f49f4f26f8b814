"""Lowering passes (compute-only schedule -> runnable schedule) and validation.

Passes are small functions Schedule -> Schedule; :func:`lower` composes them:

1. :func:`add_unshard_reshard` (ZeRO-3 only): ``sUNSHARD`` right before the first F of
   stage s and ``sRESHARD`` right after its last F; again before its first backward and
   after its last. When the forward and backward windows overlap (1F1B and every
   schedule that mixes them), the stage stays gathered from its first F to its last
   backward: one window.
2. :func:`add_send_recv`: ``RECV_F`` right before each F whose input comes from another
   rank, ``SEND_F`` right after each F whose consumer is on another rank; ``RECV_B``
   before and ``SEND_B`` after each B/I likewise. Nothing between stages on one rank.
3. :func:`add_grad_reduction`: ``sREDUCE_GRAD`` right after the last backward of s (the
   last B, or the last W when split; after the SEND that follows it, if any), and
   ``sSTEP`` for each stage at the end of its rank's list, in reduction order.

:func:`validate` checks a schedule (lowered or not) and dry-runs it; any failure is a
:class:`ScheduleError` naming the rank, step and action, with a grid marking it.
"""
from __future__ import annotations

from collections import Counter

from ..errors import ScheduleError
from .dryrun import DryRun, _fail, dry_run
from .grid import format_grid
from .ir import Action, Op, Schedule

_P2P = (Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B)


def _refuse_if_present(schedule: Schedule, ops: tuple[Op, ...], pass_name: str) -> None:
    for r, row in enumerate(schedule.actions):
        for k, a in enumerate(row):
            if a.op in ops:
                raise _fail(schedule, r, k, f"{pass_name}: the schedule already has {a.op.value} actions")


def add_send_recv(schedule: Schedule) -> Schedule:
    """Insert SEND/RECV around every compute whose peer stage is on another rank."""
    _refuse_if_present(schedule, _P2P, "add_send_recv")
    n, rank_of = schedule.n_stages, schedule.rank_of
    rows = []
    for r, row in enumerate(schedule.actions):
        out: list[Action] = []
        for a in row:
            s, m = a.stage, a.microbatch
            fwd, bwd = a.op is Op.F, a.op is Op.B or a.op is Op.I
            if fwd and s > 0 and rank_of(s - 1) != r:
                out.append(Action(s, Op.RECV_F, m))
            if bwd and s < n - 1 and rank_of(s + 1) != r:
                out.append(Action(s, Op.RECV_B, m))
            out.append(a)
            if fwd and s < n - 1 and rank_of(s + 1) != r:
                out.append(Action(s, Op.SEND_F, m))
            if bwd and s > 0 and rank_of(s - 1) != r:
                out.append(Action(s, Op.SEND_B, m))
        rows.append(out)
    return schedule.with_actions(rows)


def _windows(row: tuple[Action, ...], stage: int) -> list[tuple[int, int]]:
    """Index windows [first, last] during which ``stage`` needs its parameters."""
    fwd = [k for k, a in enumerate(row) if a.stage == stage and a.op is Op.F]
    bwd = [k for k, a in enumerate(row) if a.stage == stage and a.op.is_backward]
    wins = [(w[0], w[-1]) for w in (fwd, bwd) if w]
    if len(wins) == 2 and wins[1][0] <= wins[0][1]:
        return [(min(wins[0][0], wins[1][0]), max(wins[0][1], wins[1][1]))]
    return sorted(wins)


def add_unshard_reshard(schedule: Schedule) -> Schedule:
    """ZeRO-3: gather each stage's parameters around its forward and backward groups."""
    _refuse_if_present(schedule, (Op.UNSHARD, Op.RESHARD), "add_unshard_reshard")
    rows = []
    for r, row in enumerate(schedule.actions):
        before: dict[int, list[Action]] = {}
        after: dict[int, list[Action]] = {}
        for s in schedule.stages_of(r):
            for lo, hi in _windows(row, s):
                before.setdefault(lo, []).append(Action(s, Op.UNSHARD))
                after.setdefault(hi, []).append(Action(s, Op.RESHARD))
        out: list[Action] = []
        for k, a in enumerate(row):
            out += before.get(k, [])
            out.append(a)
            out += after.get(k, [])
        rows.append(out)
    return schedule.with_actions(rows)


def add_grad_reduction(schedule: Schedule, reduce: bool = True, step: bool = True) -> Schedule:
    """REDUCE_GRAD after each stage's last backward (if ``reduce``); STEPs at the end."""
    _refuse_if_present(schedule, (Op.REDUCE_GRAD, Op.STEP), "add_grad_reduction")
    rows = []
    for r, row in enumerate(schedule.actions):
        last: dict[int, int] = {}
        for k, a in enumerate(row):
            if a.op is Op.B or a.op is Op.W:
                last[a.stage] = k
        at: dict[int, list[Action]] = {}
        for s, k in sorted(last.items(), key=lambda kv: kv[1]):
            while k + 1 < len(row) and row[k + 1].op in (Op.SEND_B, Op.SEND_F):
                k += 1
            if reduce:
                at.setdefault(k, []).append(Action(s, Op.REDUCE_GRAD))
        out: list[Action] = []
        for k, a in enumerate(row):
            out.append(a)
            out += at.get(k, [])
        if step:
            out += [Action(s, Op.STEP) for s, _ in sorted(last.items(), key=lambda kv: kv[1])]
        rows.append(out)
    return schedule.with_actions(rows)


def lower(
    schedule: Schedule,
    *,
    zero3: bool = False,
    reduce_grad: bool = True,
    optimizer_step: bool = True,
) -> Schedule:
    """Compose the passes: UNSHARD/RESHARD (zero3), SEND/RECV, REDUCE_GRAD and STEP."""
    s = add_unshard_reshard(schedule) if zero3 else schedule
    s = add_send_recv(s)
    if reduce_grad or optimizer_step:
        s = add_grad_reduction(s, reduce=reduce_grad, step=optimizer_step)
    return s


# ----------------------------------------------------------------------------- validate


def _check_placement(schedule: Schedule) -> None:
    n, nm = schedule.n_stages, schedule.n_microbatches
    for r, row in enumerate(schedule.actions):
        for k, a in enumerate(row):
            s = a.stage
            if s >= n:
                raise _fail(schedule, r, k, f"stage {s} out of range (n_stages={n})")
            if schedule.rank_of(s) != r:
                raise _fail(schedule, r, k, f"stage {s} lives on rank {schedule.rank_of(s)}, not here")
            if a.microbatch is not None and a.microbatch >= nm:
                raise _fail(schedule, r, k, f"microbatch {a.microbatch} out of range (n_microbatches={nm})")
            if a.op.is_p2p:
                peer = s + 1 if a.op in (Op.SEND_F, Op.RECV_B) else s - 1
                if not 0 <= peer < n:
                    raise _fail(schedule, r, k, f"stage {s} has no stage {peer} to talk to")
                if schedule.rank_of(peer) == r:
                    raise _fail(schedule, r, k, f"stages {s} and {peer} share rank {r}: no SEND/RECV between them")


def _check_rank_order(schedule: Schedule, r: int, lowered: bool) -> None:
    """Same-rank prerequisites, duplicates, ZeRO-3 windows, reduction placement."""
    row = schedule.actions[r]
    managed = {a.stage for a in row if a.op is Op.UNSHARD}
    last_bwd = {a.stage: k for k, a in enumerate(row) if a.op is Op.B or a.op is Op.W}
    reduced = {a.stage for a in row if a.op is Op.REDUCE_GRAD}
    seen: set[tuple] = set()  # (stage, op, microbatch) of the actions issued so far
    gathered: set[int] = set()
    for k, a in enumerate(row):
        s, m, op = a.stage, a.microbatch, a.op
        key = (s, op, m)
        if key in seen and op not in (Op.UNSHARD, Op.RESHARD):
            problem = "appears twice"
        elif op in (Op.F, Op.B, Op.I, Op.W) and s in managed and s not in gathered:
            problem = f"stage {s} parameters are not gathered here (UNSHARD missing or RESHARD too early)"
        elif op in (Op.F, Op.B, Op.I, Op.W, Op.SEND_F, Op.SEND_B):
            problem = _check_compute(schedule, r, a, seen, lowered)
        elif op in (Op.REDUCE_GRAD, Op.STEP) and last_bwd.get(s, -1) > k:
            problem = f"comes before the last backward of stage {s} (step {last_bwd[s]})"
        elif op is Op.STEP and s in reduced and (s, Op.REDUCE_GRAD, None) not in seen:
            problem = f"comes before {s}REDUCE_GRAD"
        elif op is Op.UNSHARD and s in gathered:
            problem = f"stage {s} is already gathered"
        elif op is Op.RESHARD and s not in gathered:
            problem = f"stage {s} is not gathered"
        else:
            problem = None
        if problem:
            raise _fail(schedule, r, k, problem)
        seen.add(key)
        if op is Op.UNSHARD:
            gathered.add(s)
        elif op is Op.RESHARD:
            gathered.discard(s)


def _check_compute(schedule: Schedule, r: int, a: Action, seen: set[tuple], lowered: bool) -> str | None:
    """Same-rank prerequisites of F, B, I, W and of the SENDs of their results."""
    s, m, op = a.stage, a.microbatch, a.op
    if op is Op.F:
        return _check_input(schedule, r, a, seen, lowered, fwd=True)
    if op is Op.B or op is Op.I:
        if (s, Op.F, m) not in seen:
            return f"comes before its forward {s}F{m}"
        if (s, Op.I if op is Op.B else Op.B, m) in seen:
            return f"stage {s} microbatch {m} has both B and I"
        return _check_input(schedule, r, a, seen, lowered, fwd=False)
    if op is Op.W:
        return None if (s, Op.I, m) in seen else f"comes before its {s}I{m}"
    if op is Op.SEND_F:
        return None if (s, Op.F, m) in seen else f"sends before its {s}F{m} ran"
    if (s, Op.B, m) in seen or (s, Op.I, m) in seen:  # SEND_B
        return None
    return f"sends before its {s}B{m}/{s}I{m} ran"


def _check_input(schedule: Schedule, r: int, a: Action, seen: set[tuple], lowered: bool, fwd: bool) -> str | None:
    s, m = a.stage, a.microbatch
    src = s - 1 if fwd else s + 1
    if not 0 <= src < schedule.n_stages:
        return None
    if schedule.rank_of(src) == r:
        if fwd and (src, Op.F, m) in seen:
            return None
        if not fwd and ((src, Op.B, m) in seen or (src, Op.I, m) in seen):
            return None
        return f"comes before its input {src}{'F' if fwd else 'B/I'}{m} on the same rank"
    recv = Op.RECV_F if fwd else Op.RECV_B
    if lowered and (s, recv, m) not in seen:
        return f"no {s}{recv.value}{m} posted before it"
    return None


def _first_step(schedule: Schedule, r: int, pred) -> int | None:
    return next((k for k, a in enumerate(schedule.actions[r]) if pred(a)), None)


def _check_counts(schedule: Schedule) -> None:
    """Each (stage, microbatch): one F, and one B or one I and one W (plus their sends)."""
    count = Counter((a.stage, a.op, a.microbatch) for row in schedule.actions for a in row)
    lowered = schedule.is_lowered
    n = schedule.n_stages
    for s in range(n):
        r = schedule.rank_of(s)
        for m in range(schedule.n_microbatches):
            at = lambda op: _first_step(schedule, r, lambda a: a == Action(s, op, m))  # noqa: E731
            problem, step = None, None
            if not count[(s, Op.F, m)]:
                problem = f"stage {s} microbatch {m} has no F"
            elif not (count[(s, Op.B, m)] or count[(s, Op.I, m)]):
                problem, step = f"stage {s} microbatch {m} has no B (or I+W)", at(Op.F)
            elif count[(s, Op.I, m)] and not count[(s, Op.W, m)]:
                problem, step = f"stage {s} microbatch {m} has I but no W", at(Op.I)
            elif lowered and s < n - 1 and schedule.rank_of(s + 1) != r and not count[(s, Op.SEND_F, m)]:
                problem, step = f"{s}F{m} has no {s}SEND_F{m} for stage {s + 1}", at(Op.F)
            elif lowered and s > 0 and schedule.rank_of(s - 1) != r and not count[(s, Op.SEND_B, m)]:
                problem = f"stage {s} microbatch {m} sends no gradient to stage {s - 1} (SEND_B missing)"
                step = at(Op.B) if count[(s, Op.B, m)] else at(Op.I)
            if problem:
                if step is not None:
                    raise _fail(schedule, r, step, problem)
                raise ScheduleError(
                    f"rank {r}: {problem}", grid=format_grid(schedule, mark=(r, None), window=10)
                )


def validate(schedule: Schedule, **durations) -> DryRun:
    """Check ``schedule`` and dry-run it; raise ScheduleError on the first problem.

    Checks, in order: placement (stages on their rank, indices in range, SEND/RECV only
    between ranks); same-rank order (B/I after F, W after I, SEND after its producer,
    an F/B/I after a same-rank producer or, when lowered, after its RECV; ZeRO-3 windows;
    REDUCE_GRAD/STEP after the last backward); counts (one F and one B or I+W per stage
    and microbatch; when lowered every cross-rank output sent); then the dry run, which
    enforces cross-rank causality and finds deadlocks. Returns the dry run.
    """
    _check_placement(schedule)
    lowered = schedule.is_lowered
    for r in range(schedule.pp):
        _check_rank_order(schedule, r, lowered)
    _check_counts(schedule)
    return dry_run(schedule, **durations)
