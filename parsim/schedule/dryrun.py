"""Dry run: execute a schedule with fixed durations under the runtime semantics.

Each rank walks its list in order. Compute (F, B, I, W, STEP) blocks the rank and
starts when the rank is free *and* its inputs are there. SEND is issued and the rank
moves on; RECV posts a receive and the rank moves on. A transfer delivers at
``max(send + comm, post)`` (eager: the data travels as soon as it is sent; a compute
that needs it also needs the receive to have been posted), or with
``rendezvous=True`` at ``max(send, post) + comm``. UNSHARD (an asynchronous gather
that compute of the stage waits on) and REDUCE_GRAD (that STEP waits on) share the
rank's data-parallel stream, one collective at a time. A composite OVERLAP_F_B waits
for both its parts' inputs, lasts ``overlap`` (or its F plus its B) and then delivers
both outputs, as the engines do. An unlowered schedule (no SEND/RECV) has implicit
dependencies: the consumer waits for the producer's end plus ``comm`` when the two
stages live on different ranks, and for the end alone when they share one.

A rank that waits for something no other rank can ever produce is a deadlock; the
dry run then raises :class:`ScheduleError` naming every blocked rank, with a grid
marking the first one.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, fields, replace

from parsim.errors import ScheduleError
from parsim.schedule.coverage import Coverage, check_runs
from parsim.schedule.grid import format_grid
from parsim.schedule.ir import Action, Op, Schedule


COVERAGE = Coverage("dry run")
"""Every op (a composite OVERLAP_F_B as the fast engine runs it) and every trait: the dry
run times the order only; weights and memory are not its business."""


@dataclass(frozen=True)
class Durations:
    """Time of each kind of action in the dry run (any unit)."""

    f: float = 1.0
    b: float = 2.0
    i: float = 1.0
    w: float = 1.0
    comm: float = 1.0
    """Latency of one SEND -> RECV transfer between ranks."""
    unshard: float = 1.0
    reduce: float = 1.0
    step: float = 1.0
    rendezvous: bool = False
    """Transfers start only when both the SEND and the RECV were issued."""
    overlap: float | None = None
    """Time of a composite OVERLAP_F_B; None: its F plus its B (or I), serially."""

    def compute(self, op: Op) -> float:
        return {Op.F: self.f, Op.B: self.b, Op.I: self.i, Op.W: self.w, Op.STEP: self.step}[op]


@dataclass(frozen=True)
class DryRun:
    """Times of one dry run. ``spans[rank][step] = (start, end)`` for every action."""

    spans: tuple[tuple[tuple[float, float], ...], ...]
    busy: tuple[float, ...]
    """Compute time per rank."""
    compute_start: tuple[float, ...]
    compute_end: tuple[float, ...]
    makespan: float
    """End of the last action of any rank (async reductions included)."""

    def bubble(self, rank: int) -> float:
        """Idle time of ``rank`` within the step: makespan - busy."""
        return self.makespan - self.busy[rank]

    def span_bubble(self, rank: int) -> float:
        """Idle time between the rank's first and last compute (the ZB paper's view)."""
        return self.compute_end[rank] - self.compute_start[rank] - self.busy[rank]

    @property
    def bubble_fraction(self) -> float:
        """Mean over ranks of (makespan - busy) / makespan (DESIGN §6 definition)."""
        if self.makespan <= 0:
            return 0.0
        return sum(self.bubble(r) for r in range(len(self.busy))) / (len(self.busy) * self.makespan)


def _describe(key: tuple) -> str:
    """The action behind an availability key, as text."""
    if key[0] == "out":
        return f"{key[1]}F{key[2]}"
    if key[0] == "grad":
        return f"{key[1]}B{key[2]}/{key[1]}I{key[2]}"
    if key[0] == "done":
        return f"{key[1]}{key[2].value}{key[3] if key[3] is not None else ''}"
    if key[0] == "reduced":
        return f"{key[1]}REDUCE_GRAD"
    return f"{key[1]}{key[0].value}{key[2]}"


class _LocalError(Exception):
    def __init__(self, problem: str):
        self.problem = problem


def _fail(schedule: Schedule, rank: int, step: int, problem: str) -> ScheduleError:
    a = schedule.actions[rank][step]
    return ScheduleError(
        f"rank {rank} step {step} ({a}): {problem}",
        grid=format_grid(schedule, mark=(rank, step), compute_only=False, window=10),
    )


class _Runner:
    def __init__(self, schedule: Schedule, d: Durations):
        self.s, self.d = schedule, d
        self.dur = {op: d.compute(op) for op in (Op.F, Op.B, Op.I, Op.W, Op.STEP)}
        self.lowered = schedule.is_lowered
        pp = schedule.pp
        self.pos = [0] * pp
        self.clock = [0.0] * pp
        self.dp_free = [0.0] * pp  # the rank's data-parallel stream: UNSHARD, REDUCE_GRAD
        self.gathered: list[dict[int, float]] = [{} for _ in range(pp)]
        self.avail: dict[tuple, float] = {}
        self.bwd_done: dict[int, int] = defaultdict(int)
        self.spans = [[(0.0, 0.0)] * len(row) for row in schedule.actions]
        self.waiters: dict[tuple, list[int]] = defaultdict(list)
        self.waiting: dict[int, tuple[tuple, str]] = {}
        self.zero3 = {a.stage for row in schedule.actions for a in row if a.op is Op.UNSHARD}
        self.reduced = {a.stage for row in schedule.actions for a in row if a.op is Op.REDUCE_GRAD}

    # -- helpers -------------------------------------------------------------------
    def _set(self, key: tuple, t: float, ready: deque) -> None:
        self.avail[key] = t
        ready.extend(self.waiters.pop(key, ()))

    def _local(self, key: tuple) -> float:
        t = self.avail.get(key)
        if t is None:
            raise _LocalError(f"needs {_describe(key)}, which is missing or comes later on this rank")
        return t

    def _input(self, r: int, a: Action, src: int, fwd: bool):
        """(ready time, None) or (None, wait) for the data ``a`` needs from stage ``src``."""
        m, d = a.microbatch, self.d
        kind = "out" if fwd else "grad"
        if self.s.rank_of(src) == r:
            return self._local((kind, src, m)), None
        if not self.lowered:
            key = (kind, src, m)
            t = self.avail.get(key)
            if t is None:
                return None, (key, f"{_describe(key)} on rank {self.s.rank_of(src)}")
            return t + d.comm, None
        recv = Op.RECV_F if fwd else Op.RECV_B
        post = self._local((recv, a.stage, m))
        key = (Op.SEND_F if fwd else Op.SEND_B, src, m)
        sent = self.avail.get(key)
        if sent is None:
            return None, (key, f"{_describe(key)} on rank {self.s.rank_of(src)}")
        if d.rendezvous:
            return max(sent, post) + d.comm, None
        return max(sent + d.comm, post), None

    def _compute(self, r: int, a: Action, t: float, ready: deque) -> None:
        start = max(self.clock[r], t)
        end = start + self.dur[a.op]
        self.clock[r] = end
        self.spans[r][self.pos[r]] = (start, end)
        self._set(("done", a.stage, a.op, a.microbatch), end, ready)

    def _params(self, r: int, a: Action) -> float:
        if a.stage not in self.zero3:
            return 0.0
        if a.stage not in self.gathered[r]:
            raise _LocalError(f"stage {a.stage} parameters are not gathered (no UNSHARD before, or RESHARD)")
        return self.gathered[r][a.stage]

    # -- one action ----------------------------------------------------------------
    def _try(self, r: int, a: Action, ready: deque):
        s, m, op = a.stage, a.microbatch, a.op
        t = self.clock[r]
        if op is Op.F or op is Op.B or op is Op.I:
            t = max(t, self._params(r, a))
            got, wait = self._inputs(r, a)
            if wait:
                return wait
            self._compute(r, a, max(t, got), ready)
            self._produced(a, self.clock[r], ready)
        elif op is Op.OVERLAP_F_B:
            f, b = a.sub
            t = max(t, self._params(r, f), self._params(r, b))
            for part in a.sub:
                got, wait = self._inputs(r, part)
                if wait:
                    return wait
                t = max(t, got)
            dur = self.d.overlap if self.d.overlap is not None else self.dur[Op.F] + self.dur[b.op]
            start = max(self.clock[r], t)
            end = self.clock[r] = start + dur
            self.spans[r][self.pos[r]] = (start, end)
            for part in a.sub:
                self._set(("done", part.stage, part.op, part.microbatch), end, ready)
                self._produced(part, end, ready)
        elif op is Op.W:
            # W reads no parameters (dW = x^T dy): it may run after its stage resharded
            t = max(t, self.gathered[r].get(s, 0.0), self._local(("done", s, Op.I, m)))
            self._compute(r, a, t, ready)
            self.bwd_done[s] += 1
        elif op is Op.SEND_F or op is Op.SEND_B:
            produced = ("out" if op is Op.SEND_F else "grad", s, m)
            t = max(t, self._local(produced))
            self.spans[r][self.pos[r]] = (t, t + self.d.comm)
            self._set((op, s, m), t, ready)
        elif op is Op.RECV_F or op is Op.RECV_B:
            self.spans[r][self.pos[r]] = (t, t)
            self._set((op, s, m), t, ready)
        else:
            self._collective(r, a, t, ready)
        return None

    def _inputs(self, r: int, a: Action):
        """(ready time, None) or (None, wait) for an F, B or I: its own F (backward) and its peer's data."""
        s, m = a.stage, a.microbatch
        t = 0.0
        if a.op is not Op.F:
            t = self._local(("out", s, m))
        src = self.s.prev_stage(s) if a.op is Op.F else self.s.next_stage(s)
        if src is not None:
            got, wait = self._input(r, a, src, fwd=a.op is Op.F)
            if wait:
                return None, wait
            t = max(t, got)
        return t, None

    def _produced(self, a: Action, end: float, ready: deque) -> None:
        self._set(("out" if a.op is Op.F else "grad", a.stage, a.microbatch), end, ready)
        if a.op is Op.B:
            self.bwd_done[a.stage] += 1

    def _collective(self, r: int, a: Action, t: float, ready: deque) -> None:
        s, op = a.stage, a.op
        if op is Op.UNSHARD:
            start = max(t, self.dp_free[r])
            end = self.dp_free[r] = start + self.d.unshard
            self.gathered[r][s] = end
        elif op is Op.RESHARD:
            if self.gathered[r].pop(s, None) is None:
                raise _LocalError(f"RESHARD of stage {s} without a preceding UNSHARD")
            start = end = t
        elif op is Op.REDUCE_GRAD:
            # per microbatch (ZeRO-2/3, FSDP): its place after that backward is checked by validate
            if a.microbatch is None and self.bwd_done[s] < len(self.s.microbatches_of(s)):
                raise _LocalError(f"comes before the last backward of stage {s}")
            start = max(t, self.dp_free[r])
            end = self.dp_free[r] = start + self.d.reduce
            self.avail[("reduced", s)] = end
        else:  # STEP
            if self.bwd_done[s] < len(self.s.microbatches_of(s)):
                raise _LocalError(f"comes before the last backward of stage {s}")
            if s in self.reduced:
                t = max(t, self._local(("reduced", s)))
            self._compute(r, a, t, ready)
            return
        self.spans[r][self.pos[r]] = (start, end)

    # -- driver --------------------------------------------------------------------
    def run(self) -> DryRun:
        rows = self.s.actions
        ready: deque[int] = deque(range(self.s.pp))
        while ready:
            r = ready.popleft()
            self.waiting.pop(r, None)
            row = rows[r]
            while self.pos[r] < len(row):
                try:
                    wait = self._try(r, row[self.pos[r]], ready)
                except _LocalError as err:
                    raise _fail(self.s, r, self.pos[r], err.problem) from None
                if wait is not None:
                    self.waiting[r] = wait
                    self.waiters[wait[0]].append(r)
                    break
                self.pos[r] += 1
        if self.waiting:
            self._deadlock()
        return self._result()

    def _deadlock(self) -> None:
        blocked = sorted(self.waiting)
        parts = [
            f"rank {r} step {self.pos[r]} ({self.s.actions[r][self.pos[r]]}) waits for {self.waiting[r][1]}"
            for r in blocked
        ]
        r0 = blocked[0]
        raise ScheduleError(
            "deadlock: " + "; ".join(parts),
            grid=format_grid(self.s, mark=(r0, self.pos[r0]), compute_only=False, window=10),
        )

    def _result(self) -> DryRun:
        busy, first, last = [], [], []
        for row, spans in zip(self.s.actions, self.spans):
            comp = [sp for a, sp in zip(row, spans) if a.op.is_compute]
            busy.append(sum(e - b for b, e in comp))
            first.append(min((b for b, _ in comp), default=0.0))
            last.append(max((e for _, e in comp), default=0.0))
        makespan = max((e for spans in self.spans for _, e in spans), default=0.0)
        return DryRun(
            tuple(tuple(sp) for sp in self.spans), tuple(busy), tuple(first), tuple(last), makespan
        )


def dry_run(schedule: Schedule, durations: Durations | None = None, **overrides) -> DryRun:
    """Execute ``schedule`` with the given durations (``f=1, b=2, ...`` overrides).

    Raises ScheduleError on deadlock or on an action whose same-rank prerequisite is
    missing or comes later in the list.
    """
    unknown = set(overrides) - {f.name for f in fields(Durations)}
    if unknown:
        raise TypeError(f"unknown duration(s): {', '.join(sorted(unknown))}")
    d = replace(durations or Durations(), **overrides)
    check_runs(schedule, COVERAGE)
    return _Runner(schedule, d).run()


def peak_in_flight(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the most (stage, microbatch) pairs whose F is done and B/I is not.

    This is the activation stash a rank must hold (in microbatch-stage units); it
    depends on the order only, not on durations.
    """
    peaks = []
    for row in schedule.actions:
        live = peak = 0
        for whole in row:
            for a in whole.parts:
                if a.op is Op.F:
                    live += 1
                    peak = max(peak, live)
                elif a.op is Op.B or a.op is Op.I:
                    live -= 1
        peaks.append(peak)
    return tuple(peaks)


def format_timeline_grid(schedule: Schedule, durations=None, **overrides) -> str:
    """Compute actions placed at their dry-run time: one column per time unit.

    Defaults to unit durations with no p2p cost (``f=b=i=w=1, comm=0``); an action
    longer than one unit continues with ``-`` cells; idle is ``.``.
    """
    from parsim.schedule.dryrun import Durations, dry_run  # dryrun imports this module

    if durations is None:
        durations = Durations(f=1, b=1, i=1, w=1, comm=0, unshard=0, reduce=0, step=1)
    run = dry_run(schedule, durations, **overrides)
    end = int(round(max(run.compute_end, default=0)))
    labels = [str(a) for row in schedule.actions for a in row if a.op.is_compute]
    width = max([len(t) for t in labels] + [3]) + 1
    label_w = len(f"rank {schedule.pp - 1}") + 2
    out = [" " * label_w + "".join(str(t).ljust(width) for t in range(end)).rstrip()]
    for r, (row, spans) in enumerate(zip(schedule.actions, run.spans)):
        cells = ["." for _ in range(end)]
        for a, (b, e) in zip(row, spans):
            if not a.op.is_compute:
                continue
            t0, t1 = int(round(b)), max(int(round(e)), int(round(b)) + 1)
            cells[t0] = str(a)
            for t in range(t0 + 1, min(t1, end)):
                cells[t] = "-"
        line = f"rank {r}".ljust(label_w) + "".join(c.ljust(width) for c in cells)
        out.append(line.rstrip())
    busy = ", ".join(f"{b:g}" for b in run.busy)
    out.append(f"makespan {run.makespan:g}; busy per rank: {busy}; bubble {run.bubble_fraction:.1%}")
    return "\n".join(out) + "\n"
