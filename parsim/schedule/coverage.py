"""What each interpreter of the schedule IR runs, declared; anything else refused up front.

Four interpreters read the same lowered schedule: the dry run (``parsim.schedule.dryrun``),
the fast engine (``parsim.sim.engine``), the full engine (``parsim.sim.fullsim``) and
the torch runtime (``parsim.validate.runtime``; its declaration sits torch-free in
``parsim.validate.scale``). Each declares a :class:`Coverage`: the ops it executes and
the schedule traits it cannot honour (a trait changes what the actions *mean*, not
their order: a runtime that ignores weight stashing would run PipeDream as 1F1B and
measure the wrong job). :func:`check_runs` refuses, before anything starts, a schedule
that needs anything else, in one line naming the schedule, the op or trait, and the
interpreter. tests/test_interpreters.py holds the declarations to what the code does.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from parsim.errors import ScheduleError
from parsim.schedule.ir import Op, Schedule
from parsim.schedule.semantics import traits

ALL_OPS = frozenset(Op)


class Trait(str, Enum):
    """Schedule semantics beyond the action order that an interpreter may not implement."""

    TWO_CHAINS = "two model chains (bidirectional: each chain a whole model copy)"
    WEIGHT_STASHING = "weight stashing (several weight versions per stage)"
    REMAT = "re-materialisation (B recomputes the forward)"
    ASYNCHRONOUS = "asynchronous updates (no flush between steps)"
    MESSAGE_DRIVEN = ("message-driven execution (AMPNet: the order is an output of the costs, each stage "
                      "updating every update_every backward messages)")
    TOKEN_SLICES = "token slices (TeraPipe: a unit is one slice of a sequence, its K/V cached on the stage)"

    def __str__(self) -> str:
        return self.value


def schedule_traits(schedule: Schedule) -> frozenset[Trait]:
    """The traits ``schedule`` has: its chains, and its registered name's semantics."""
    t = traits(schedule.name)
    out = set()
    if schedule.n_chains > 1:
        out.add(Trait.TWO_CHAINS)
    if t.weight_versions is not None:
        out.add(Trait.WEIGHT_STASHING)
    if t.remat:
        out.add(Trait.REMAT)
    if t.asynchronous:
        out.add(Trait.ASYNCHRONOUS)
    if schedule.n_slices > 1:
        out.add(Trait.TOKEN_SLICES)
    if t.message_driven:
        out.add(Trait.MESSAGE_DRIVEN)
    return frozenset(out)


@dataclass(frozen=True)
class Coverage:
    """What one interpreter runs."""

    interpreter: str
    """Its name, as messages print it: "dry run", "fast engine", "full engine", "torch runtime"."""
    ops: frozenset[Op] = ALL_OPS
    """The ops it executes (the parts of a composite OVERLAP_F_B count too)."""
    refuses: frozenset[Trait] = frozenset()
    """Schedule traits it does not implement."""


def _first_uncovered(schedule: Schedule, ops: frozenset[Op]):
    """(rank, step, action, op) of the first action needing an op outside ``ops``, or None."""
    for r, row in enumerate(schedule.actions):
        if ops.issuperset({a.op for a in row}) and all(
                p.op in ops for a in row if a.sub is not None for p in a.sub):
            continue
        for k, a in enumerate(row):
            for op in (a.op, *(p.op for p in (a.sub or ()))):
                if op not in ops:
                    return r, k, a, op
    return None


def check_runs(schedule: Schedule, coverage: Coverage) -> None:
    """Raise a one-line ScheduleError if ``coverage``'s interpreter cannot run ``schedule``."""
    if coverage.ops != ALL_OPS:
        hit = _first_uncovered(schedule, coverage.ops)
        if hit is not None:
            r, k, a, op = hit
            raise ScheduleError(f"schedule {schedule.name}: the {coverage.interpreter} does not run "
                                f"{op.value} actions (first: rank {r} step {k}, {a})")
    bad = schedule_traits(schedule) & coverage.refuses
    if bad:
        trait = min(bad, key=lambda t: list(Trait).index(t))
        raise ScheduleError(f"schedule {schedule.name}: the {coverage.interpreter} does not run "
                            f"{trait.value}")
