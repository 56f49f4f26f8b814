"""The schedule IR: per-rank ordered lists of actions, in PyTorch pipelining's grammar.

An :class:`Action` is ``(stage, op, microbatch)`` with the text form
``f"{stage}{op}{microbatch}"`` (``2F0``, ``3SEND_F1``, ``1UNSHARD``, ``0STEP``), the
same grammar as ``torch.distributed.pipelining``'s ``_Action`` plus ``STEP``. A
:class:`Schedule` holds, for every pipeline rank, the actions it issues, in order.
It is dense: idle time is an *output* of interpreting it, never a ``None`` cell.

Runtime semantics (the simulator and the torch runtime both follow them):

* Each rank walks its list in order. Compute actions (``F``, ``B``, ``I``, ``W``,
  ``STEP``) block the rank's compute stream until done; everything else is issued
  and the rank moves on.
* ``F`` of stage s needs the output of stage s-1 for the same microbatch (s > 0);
  ``B``/``I`` of s need the output-gradient of s+1 (s < n_stages-1) and s's own ``F``;
  ``W`` needs s's ``I``. ``B`` = ``I`` + ``W`` fused.
* ``sSEND_Fm``: stage s sends its forward output of microbatch m to stage s+1
  (non-blocking; issued right after the producing ``F``).
* ``sRECV_Fm``: stage s posts the receive of its forward input of m from s-1; the
  ``F`` that needs it waits until the data has arrived.
* ``sSEND_Bm``: stage s sends the input-gradient of m to s-1 (after its ``B`` or ``I``).
* ``sRECV_Bm``: stage s posts the receive of the output-gradient of m from s+1
  (before its ``B``/``I``).
* There is no SEND/RECV between two stages on the same rank (V-shaped or
  interleaved placements may put s and s+1 on one rank): the data stays local.
* ``sUNSHARD`` / ``sRESHARD``: ZeRO-3 parameter all-gather of stage s (asynchronous;
  compute of s waits for it) / free of the gathered parameters.
* ``sREDUCE_GRAD``: data-parallel gradient reduction of stage s, launched
  asynchronously (its own stream) after the last backward (``B`` or ``W``) of s.
* ``sSTEP``: optimizer step of stage s; waits for its ``REDUCE_GRAD`` (if any).
* ``(sFm;tBn)OVERLAP_F_B``: a composite compute action (DualPipe): the forward of
  stage s on microbatch m and the backward (``B``; or ``I``) of stage t on microbatch
  n run overlapped, one after the other's communication. It needs both inputs (the F
  input of s and the output-gradient of t), takes one duration (``[costs]
  overlap_f_b_s``, or the cost model's F+B minus the communication one hides under
  the other's compute), then produces both outputs. ``Action.sub`` holds the two
  parts; ``stage`` is the F part's stage. A runtime that cannot overlap may execute it
  as the F then the B, sequentially (the validation runtime does): the order and the
  dependencies are the same, only the duration differs.

Chains (bidirectional schedules, ``Schedule.n_chains > 1``): the stages split into
``n_chains`` equal runs, each a full copy of the model, each fed its own contiguous
block of ``n_microbatches // n_chains`` microbatches. A stage at the start of a run
has no predecessor (it reads the data), one at its end no successor (it computes the
loss): use ``Schedule.prev_stage``/``next_stage``/``microbatches_of`` rather than
``s - 1``/``s + 1``. With one chain (every other schedule) they are the plain ones.

A schedule with no SEND/RECV at all is *unlowered*: its cross-rank data dependencies
are implicit. :func:`parsim.schedule.passes.lower` makes them explicit.
"""
from __future__ import annotations

import csv
import gc
import io
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache


class Op(str, Enum):
    """What an action does. The value is its text form."""

    F = "F"
    """Forward of one microbatch through one stage."""
    B = "B"
    """Full backward (input and weight gradients together)."""
    I = "I"  # noqa: E741  (PyTorch's name)
    """Backward for inputs only (zero-bubble split)."""
    W = "W"
    """Backward for weights only (zero-bubble split)."""
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"
    STEP = "STEP"
    """Optimizer step of the stage's parameters (after its REDUCE_GRAD)."""
    OVERLAP_F_B = "OVERLAP_F_B"
    """Composite: the F of one (stage, microbatch) overlapped with the B/I of another (DualPipe)."""

    def __str__(self) -> str:
        return self.value

    @property
    def is_compute(self) -> bool:
        """Blocks the rank's compute stream: F, B, I, W, STEP, OVERLAP_F_B."""
        return self in _COMPUTE

    @property
    def is_comm(self) -> bool:
        """Everything that is not compute: p2p, gathers, reductions."""
        return self not in _COMPUTE

    @property
    def is_p2p(self) -> bool:
        return self in _P2P

    @property
    def is_backward(self) -> bool:
        """B, I or W."""
        return self in _BACKWARD

    @property
    def has_microbatch(self) -> bool:
        """Whether actions of this op carry a microbatch index."""
        return self in _PER_MICROBATCH


_COMPUTE = frozenset({Op.F, Op.B, Op.I, Op.W, Op.STEP, Op.OVERLAP_F_B})
_P2P = frozenset({Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B})
_BACKWARD = frozenset({Op.B, Op.I, Op.W})
_PER_MICROBATCH = frozenset({Op.F, Op.B, Op.I, Op.W}) | _P2P
_OPTIONAL_MICROBATCH = frozenset({Op.UNSHARD, Op.RESHARD, Op.REDUCE_GRAD})
"""Ops that name a microbatch when they run per microbatch (ZeRO-2/3, FSDP) and none when per step."""


@dataclass(frozen=True, slots=True)
class Action:
    """One entry of a rank's list: ``stage`` does ``op`` on ``microbatch``."""

    stage: int
    op: Op
    microbatch: int | None = None
    sub: tuple["Action", "Action"] | None = None
    """OVERLAP_F_B only: its (F, B-or-I) parts; ``stage`` is the F part's stage."""

    def __post_init__(self) -> None:
        if not isinstance(self.op, Op):
            object.__setattr__(self, "op", Op(self.op))
        if self.stage < 0:
            raise ValueError(f"action stage must be >= 0, got {self.stage}")
        if self.op is Op.OVERLAP_F_B:
            f, b = self.sub if self.sub is not None and len(self.sub) == 2 else (None, None)
            if f is None or f.op is not Op.F or b.op not in (Op.B, Op.I) or self.microbatch is not None:
                raise ValueError("OVERLAP_F_B needs sub=(an F action, a B or I action) and no microbatch")
            if self.stage != f.stage:
                raise ValueError(f"OVERLAP_F_B stage must be its F part's stage {f.stage}, got {self.stage}")
            return
        if self.sub is not None:
            raise ValueError(f"{self.op.value} takes no sub-actions")
        if self.op.has_microbatch:
            if self.microbatch is None or self.microbatch < 0:
                raise ValueError(f"{self.op.value} needs a microbatch >= 0, got {self.microbatch}")
        elif self.microbatch is not None and (self.op not in _OPTIONAL_MICROBATCH or self.microbatch < 0):
            raise ValueError(f"{self.op.value} takes no microbatch, got {self.microbatch}")

    @property
    def parts(self) -> tuple["Action", ...]:
        """The compute parts: (F, B) of a composite, else (self,)."""
        return self.sub if self.sub is not None else (self,)

    def __str__(self) -> str:
        if self.sub is not None:
            return f"({self.sub[0]};{self.sub[1]}){self.op.value}"
        mb = "" if self.microbatch is None else self.microbatch
        return f"{self.stage}{_OP_TEXT[self.op]}{mb}"

    def __repr__(self) -> str:
        return f"Action({self})"


_INTERN: dict[tuple, Action] = {}
_NEW = object.__new__
_SET_STAGE, _SET_OP = Action.stage.__set__, Action.op.__set__  # slot descriptors: no frozen check
_SET_MB, _SET_SUB = Action.microbatch.__set__, Action.sub.__set__


def act(stage: int, op: Op, microbatch: int | None = None) -> Action:
    """A trusted, interned action (no validation): for builders and passes on the hot path.

    Actions are immutable, so one object per (stage, op, microbatch) is shared.
    """
    key = (stage, op._value_, microbatch)  # Enum.__hash__ is slow Python code: key by the text
    a = _INTERN.get(key)
    if a is None:
        a = _NEW(Action)
        _SET_STAGE(a, stage)
        _SET_OP(a, op)
        _SET_MB(a, microbatch)
        _SET_SUB(a, None)
        if len(_INTERN) < 1 << 22:
            _INTERN[key] = a
    return a


def action_table(stage: int, op: Op, n: int) -> list[Action]:
    """``[act(stage, op, j) for j in range(n)]`` built in one tight loop (trusted, not interned):
    builders and passes index these tables instead of constructing actions one call at a time."""
    new, ss, so, sm, sb = _NEW, _SET_STAGE, _SET_OP, _SET_MB, _SET_SUB
    out = [new(Action) for _ in range(n)]
    for j, a in enumerate(out):
        ss(a, stage)
        so(a, op)
        sm(a, j)
        sb(a, None)
    return out


@contextmanager
def no_gc():
    """Pause the cyclic garbage collector while building large acyclic structures
    (hundreds of thousands of actions); reference counting still frees memory."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def overlap(f: Action, b: Action) -> Action:
    """The composite ``(f;b)OVERLAP_F_B`` action."""
    return Action(f.stage, Op.OVERLAP_F_B, None, (f, b))


_OP_TEXT = {op: op.value for op in Op}
_OP_BY_TEXT = {op.value: op for op in Op}
_OPS_ALT = "|".join(sorted((re.escape(o.value) for o in Op), key=len, reverse=True))
_ACTION_RE = re.compile(rf"([0-9]+)({_OPS_ALT})([0-9]*)")


def parse(text: str) -> Action:
    """Parse the text form of an action; ``parse(str(a)) == a``.

    Raises ValueError naming the text when it is not an action.
    """
    return _parse(text.strip())


@lru_cache(maxsize=1 << 16)
def _parse(text: str) -> Action:
    if text.startswith("(") and text.endswith(")" + Op.OVERLAP_F_B.value):
        inner = text[1:-len(Op.OVERLAP_F_B.value) - 1]
        parts = inner.split(";")
        try:
            if len(parts) != 2:
                raise ValueError("expected two parts")
            return overlap(_parse(parts[0].strip()), _parse(parts[1].strip()))
        except ValueError as err:
            raise ValueError(f"not an action: {text!r} ({err})") from None
    m = _ACTION_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"not an action: {text!r} (expected e.g. '2F0', '3SEND_F1', '1UNSHARD')")
    stage, op, mb = m.groups()
    stage, op = int(stage), _OP_BY_TEXT[op]
    try:
        return Action(stage, op, int(mb) if mb else None)
    except ValueError as err:
        raise ValueError(f"not an action: {text!r} ({err})") from None


def _as_actions(rows) -> tuple[tuple[Action, ...], ...]:
    out = []
    for row in rows:
        row = tuple(row)
        if not all(type(a) is Action for a in row):
            row = tuple(a if isinstance(a, Action) else parse(a) for a in row)
        out.append(row)
    return tuple(out)


@dataclass(frozen=True)
class Schedule:
    """Per-rank ordered actions of one training step of a pipeline."""

    name: str
    n_stages: int
    """Model pieces; ``pp * vpp``."""
    n_microbatches: int
    stage_to_rank: tuple[int, ...]
    """Stage index -> pipeline rank."""
    actions: tuple[tuple[Action, ...], ...] = field(repr=False)
    """Per pipeline rank, in issue order; dense (no None)."""
    n_chains: int = 1
    """Model copies the stages form (2 for DualPipe and Chimera: see the module doc)."""
    n_slices: int = 1
    """Token slices per sequence (TeraPipe): the action index u is slice u % n_slices of
    microbatch u // n_slices, and ``n_microbatches`` counts these units (see
    ``parsim.schedule.terapipe``); 1 for every other schedule."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stage_to_rank", tuple(int(r) for r in self.stage_to_rank))
        object.__setattr__(self, "actions", _as_actions(self.actions))
        if len(self.stage_to_rank) != self.n_stages:
            raise ValueError(
                f"stage_to_rank has {len(self.stage_to_rank)} entries for {self.n_stages} stages"
            )
        bad = [r for r in self.stage_to_rank if not 0 <= r < len(self.actions)]
        if bad:
            raise ValueError(f"stage_to_rank names rank {bad[0]} but there are {len(self.actions)} ranks")
        if self.n_slices < 1 or self.n_microbatches % self.n_slices:
            raise ValueError(f"{self.n_slices} token slices must divide the {self.n_microbatches} units")
        if self.n_chains < 1 or self.n_stages % self.n_chains or self.n_microbatches % self.n_chains:
            raise ValueError(f"{self.n_chains} chains must divide the {self.n_stages} stages "
                             f"and the {self.n_microbatches} microbatches")

    @classmethod
    def trusted(cls, name, n_stages, n_microbatches, stage_to_rank, actions, n_chains=1,
                n_slices=1) -> "Schedule":
        """Build without checks or conversion: ``actions`` must be tuples of Actions and
        ``stage_to_rank`` a tuple of ints (builders and passes on the hot path)."""
        s = object.__new__(cls)
        for k, v in (("name", name), ("n_stages", n_stages), ("n_microbatches", n_microbatches),
                     ("stage_to_rank", stage_to_rank), ("actions", actions), ("n_chains", n_chains),
                     ("n_slices", n_slices)):
            object.__setattr__(s, k, v)
        return s

    @property
    def chain_len(self) -> int:
        """Stages per chain (``n_stages`` with one chain)."""
        return self.n_stages // self.n_chains

    def prev_stage(self, stage: int) -> int | None:
        """The stage whose forward output ``stage`` consumes (None at a chain start)."""
        return stage - 1 if stage % self.chain_len else None

    def next_stage(self, stage: int) -> int | None:
        """The stage that consumes ``stage``'s forward output (None at a chain end)."""
        return stage + 1 if (stage + 1) % self.chain_len else None

    def microbatches_of(self, stage: int) -> range:
        """The microbatches ``stage`` processes (its chain's block; all with one chain)."""
        per = self.n_microbatches // self.n_chains
        c = stage // self.chain_len
        return range(c * per, (c + 1) * per)

    @property
    def pp(self) -> int:
        """Number of pipeline ranks."""
        return len(self.actions)

    @property
    def vpp(self) -> int:
        """Stages per rank (when every rank holds the same number)."""
        return self.n_stages // max(1, self.pp)

    def rank_of(self, stage: int) -> int:
        return self.stage_to_rank[stage]

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(s for s, r in enumerate(self.stage_to_rank) if r == rank)

    @property
    def is_lowered(self) -> bool:
        """Whether any rank holds an explicit SEND/RECV."""
        return any(a.op in _P2P for row in self.actions for a in row)

    def with_actions(self, actions) -> "Schedule":
        """A copy with other per-rank lists (same name, stages, placement, chains)."""
        return Schedule(self.name, self.n_stages, self.n_microbatches, self.stage_to_rank, actions,
                        self.n_chains, self.n_slices)

    def compute_only(self) -> "Schedule":
        """The same schedule without comm actions (F, B, I, W and STEP only)."""
        return self.with_actions(tuple(a for a in row if a.op.is_compute) for row in self.actions)

    def to_text(self) -> str:
        """One line per rank: ``rank 0: 0F0 0F1 ...``."""
        return "\n".join(
            f"rank {r}: " + " ".join(str(a) for a in row) for r, row in enumerate(self.actions)
        ) + "\n"

    def to_csv(self, torch_compatible: bool = False) -> str:
        """PyTorch pipelining CSV: one row per rank, one cell per action, padded.

        ``torch_compatible`` drops ``STEP`` actions, which torch's grammar lacks.
        """
        rows = [
            [str(a) for a in row if not (torch_compatible and a.op is Op.STEP)]
            for row in self.actions
        ]
        width = max((len(r) for r in rows), default=0)
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in rows:
            writer.writerow(row + [""] * (width - len(row)))
        return buf.getvalue()

    @classmethod
    def from_csv(
        cls,
        text: str,
        name: str = "csv",
        n_stages: int | None = None,
        n_microbatches: int | None = None,
        stage_to_rank: tuple[int, ...] | None = None,
        n_chains: int = 1,
    ) -> "Schedule":
        """Inverse of :meth:`to_csv`; see :func:`schedule_from_csv`."""
        return schedule_from_csv(text, name, n_stages, n_microbatches, stage_to_rank, n_chains)

    @classmethod
    def from_text(cls, text: str, name: str = "text", **kw) -> "Schedule":
        """Inverse of :meth:`to_text` (lines ``rank R: a b c``, in rank order)."""
        rows = []
        for line in text.splitlines():
            if not line.strip():
                continue
            head, _, body = line.partition(":")
            if not head.strip().startswith("rank"):
                raise ValueError(f"not a schedule line: {line!r}")
            rows.append([parse(t) for t in body.split()])
        return _assemble(rows, name, **kw)


def schedule_from_csv(
    text: str,
    name: str = "csv",
    n_stages: int | None = None,
    n_microbatches: int | None = None,
    stage_to_rank: tuple[int, ...] | None = None,
    n_chains: int = 1,
) -> Schedule:
    """Read a PyTorch pipelining CSV (one row per rank; empty cells are skipped).

    Missing sizes are inferred: stages from where their actions appear, microbatches
    from the largest index seen.
    """
    rows = [[parse(c) for c in row if c.strip()] for row in csv.reader(io.StringIO(text))]
    return _assemble(rows, name, n_stages, n_microbatches, stage_to_rank, n_chains)


def _assemble(rows, name, n_stages=None, n_microbatches=None, stage_to_rank=None, n_chains=1) -> Schedule:
    if stage_to_rank is None:
        seen: dict[int, int] = {}
        for r, row in enumerate(rows):
            for a in row:
                if seen.setdefault(a.stage, r) != r:
                    raise ValueError(f"stage {a.stage} appears on ranks {seen[a.stage]} and {r}")
        count = n_stages if n_stages is not None else max(seen, default=-1) + 1
        missing = [s for s in range(count) if s not in seen]
        if missing:
            raise ValueError(f"cannot infer the rank of stage {missing[0]}: pass stage_to_rank")
        stage_to_rank = tuple(seen[s] for s in range(count))
    if n_stages is None:
        n_stages = len(stage_to_rank)
    if n_microbatches is None:
        mbs = [p.microbatch for row in rows for a in row for p in a.parts if p.microbatch is not None]
        n_microbatches = max(mbs, default=-1) + 1
    return Schedule(name, n_stages, n_microbatches, tuple(stage_to_rank), rows, n_chains)
