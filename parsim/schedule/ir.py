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

A schedule with no SEND/RECV at all is *unlowered*: its cross-rank data dependencies
are implicit. :func:`parsim.schedule.passes.lower` makes them explicit.
"""
from __future__ import annotations

import csv
import io
import re
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

    def __str__(self) -> str:
        return self.value

    @property
    def is_compute(self) -> bool:
        """Blocks the rank's compute stream: F, B, I, W, STEP."""
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


_COMPUTE = frozenset({Op.F, Op.B, Op.I, Op.W, Op.STEP})
_P2P = frozenset({Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B})
_BACKWARD = frozenset({Op.B, Op.I, Op.W})
_PER_MICROBATCH = frozenset({Op.F, Op.B, Op.I, Op.W}) | _P2P


@dataclass(frozen=True, slots=True)
class Action:
    """One entry of a rank's list: ``stage`` does ``op`` on ``microbatch``."""

    stage: int
    op: Op
    microbatch: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.op, Op):
            object.__setattr__(self, "op", Op(self.op))
        if self.stage < 0:
            raise ValueError(f"action stage must be >= 0, got {self.stage}")
        if self.op.has_microbatch:
            if self.microbatch is None or self.microbatch < 0:
                raise ValueError(f"{self.op.value} needs a microbatch >= 0, got {self.microbatch}")
        elif self.microbatch is not None:
            raise ValueError(f"{self.op.value} takes no microbatch, got {self.microbatch}")

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else self.microbatch
        return f"{self.stage}{_OP_TEXT[self.op]}{mb}"

    def __repr__(self) -> str:
        return f"Action({self})"


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
        out.append(tuple(a if isinstance(a, Action) else parse(a) for a in row))
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
        return any(a.op.is_p2p for row in self.actions for a in row)

    def with_actions(self, actions) -> "Schedule":
        """A copy with other per-rank lists (same name, stages, placement)."""
        return Schedule(self.name, self.n_stages, self.n_microbatches, self.stage_to_rank, actions)

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
    ) -> "Schedule":
        """Inverse of :meth:`to_csv`; see :func:`schedule_from_csv`."""
        return schedule_from_csv(text, name, n_stages, n_microbatches, stage_to_rank)

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
) -> Schedule:
    """Read a PyTorch pipelining CSV (one row per rank; empty cells are skipped).

    Missing sizes are inferred: stages from where their actions appear, microbatches
    from the largest index seen.
    """
    rows = [[parse(c) for c in row if c.strip()] for row in csv.reader(io.StringIO(text))]
    return _assemble(rows, name, n_stages, n_microbatches, stage_to_rank)


def _assemble(rows, name, n_stages=None, n_microbatches=None, stage_to_rank=None) -> Schedule:
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
        mbs = [a.microbatch for row in rows for a in row if a.microbatch is not None]
        n_microbatches = max(mbs, default=-1) + 1
    return Schedule(name, n_stages, n_microbatches, tuple(stage_to_rank), rows)
