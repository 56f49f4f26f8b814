"""What a schedule means beyond its action order: placement shape and memory semantics.

The builders give the *order*; some schedules share an order and differ only in what
the runtime keeps and when it updates weights (DESIGN §3). ``TRAITS`` records that per
registered name; :func:`traits` looks a name up (case-insensitive, like ``build``).

* ``stages_per_rank``: 2 for V-shaped and bidirectional schedules (ZBV, DualPipeV,
  DualPipe, Chimera): the scenario's vpp is set to 2 for them; None = the scenario's vpp.
* ``n_chains``: 2 for bidirectional schedules with two model copies (DualPipe, Chimera):
  each chain holds the whole model, so every stage carries n_layers / pp layers and
  every rank holds two pieces (2x parameters).
* ``remat``: GPipe with re-materialization: F keeps only the stage's input (the
  boundary activation), B first recomputes the forward (its time is added to B as
  ``recompute``) and holds the full activations only while it runs.
* ``weight_versions``: ``"pipedream"`` (asynchronous 1F1B with weight stashing, no
  flush: stage s keeps one weight version per in-flight microbatch, min(p - s, m),
  and its gradients are p - s - 1 updates stale) or ``"2bw"`` (PipeDream-2BW: two
  versions on every stage, gradients accumulated over the m microbatches of a step,
  one step stale). Extra versions are (versions - 1) x the stage's 16-bit weights,
  counted under memory kind ``params``.
* ``asynchronous``: no pipeline flush; the result also reports the steady-state step
  (the busiest rank's compute per step: fill and drain are paid once per run, not per
  step; communication is assumed hidden in steady state, as PipeDream's planner does).
* ``overlap_f_b``: the schedule issues composite OVERLAP_F_B actions (DualPipe family).
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.schedule.builders import lookup


@dataclass(frozen=True)
class ScheduleTraits:
    """Placement shape and memory semantics of one registered schedule."""

    stages_per_rank: int | None = None
    """Fixed stages per rank (2 for V and bidirectional shapes); None: the scenario's vpp."""
    n_chains: int = 1
    """Model copies (2: DualPipe, Chimera)."""
    remat: bool = False
    """Only stage-boundary activations are kept; B recomputes the forward."""
    weight_versions: str | None = None
    """None (one version, flush every step) | "pipedream" | "2bw"."""
    asynchronous: bool = False
    """No flush between steps (PipeDream, PipeDream-2BW)."""
    overlap_f_b: bool = False
    """Issues OVERLAP_F_B composite actions."""


DEFAULT = ScheduleTraits()
TRAITS: dict[str, ScheduleTraits] = {}
"""Canonical schedule name -> traits; names missing here have the defaults."""


def set_traits(name: str, t: ScheduleTraits) -> None:
    TRAITS[name] = t


def traits(name: str) -> ScheduleTraits:
    """Traits of a schedule name (any spelling ``build`` accepts); defaults if unknown."""
    try:
        canonical, _ = lookup(name)
    except Exception:  # an unknown name is reported by build(), with the list of names
        return DEFAULT
    return TRAITS.get(canonical, DEFAULT)


def weight_versions(t: ScheduleTraits, pp: int, m: int, rank: int) -> int:
    """Weight versions rank ``rank`` (stage ``rank``) holds."""
    if t.weight_versions == "pipedream":
        return max(1, min(pp - rank, m))
    if t.weight_versions == "2bw":
        return 2
    return 1


def staleness_steps(t: ScheduleTraits, pp: int, rank: int) -> int:
    """Optimizer updates between a microbatch's forward and the update its gradient joins."""
    if t.weight_versions == "pipedream":
        return pp - rank - 1
    if t.weight_versions == "2bw":
        return 1
    return 0
