"""What the project knows about a schedule beyond its action order, in one place:

* names: :func:`name_key` is how names compare (case-insensitive, ignoring ``-``, ``_``
  and spaces: ``ZB-V`` is ``ZBV``), :data:`ALIASES` the other names a schedule is known
  by in the literature; :func:`canonical_key` resolves both (``build`` looks names up
  through it);
* traits: placement shape and memory semantics. The builders give the *order*; some
  schedules share an order and differ only in what the runtime keeps and when it
  updates weights (DESIGN §3). ``TRAITS`` records that per registered name;
  :func:`traits` looks a name up;
* closed forms: the pipeline bubble of a schedule family with uniform stages and free
  p2p (:data:`CLOSED_FORMS`, :func:`bubble_time`, :func:`bubble_fraction`); families
  without one are dry-run (``parsim.schedule.dry_run``).

Traits:

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
* ``message_driven``: AMPNet: each stage runs forward and backward messages as they arrive
  and updates its own weights every ``update_every`` backward messages; the order is an
  output (``parsim.sim.ampnet``), which only that engine runs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# ----------------------------------------------------------------------------- names


def name_key(name: str) -> str:
    """How schedule names compare: lower case, without ``-``, ``_`` and spaces."""
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


ALIASES: dict[str, str] = {
    # Narayanan et al. 2021 (PipeDream-2BW paper) call synchronous 1F1B with a flush "PipeDream-Flush"
    "pipedreamflush": "1F1B",
    # DAPPLE (Fan et al. 2021): early backward scheduling, the same per-rank order as 1F1B
    "dapple": "1F1B",
    # PipeDream's 1F1B-RR: 1F1B with replicated stages taking microbatches round-robin,
    # which parsim's dp replicas do (see parsim.schedule.pipedream)
    "1f1brr": "PipeDream",
}
"""Other names (as :func:`name_key` spells them) -> the registered name they mean."""


def canonical_key(name: str) -> str:
    """The :func:`name_key` of the registered schedule ``name`` means (aliases resolved)."""
    key = name_key(name)
    return name_key(ALIASES.get(key, key))


# ----------------------------------------------------------------------------- traits


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
    message_driven: bool = False
    """Stages run messages as they arrive (AMPNet): the order is an output of the costs."""


DEFAULT = ScheduleTraits()
TRAITS: dict[str, ScheduleTraits] = {}
"""Canonical schedule name -> traits; names missing here have the defaults."""


_TRAITS_BY_KEY: dict[str, ScheduleTraits] = {}


def set_traits(name: str, t: ScheduleTraits) -> None:
    TRAITS[name] = t
    _TRAITS_BY_KEY[name_key(name)] = t


def traits(name: str) -> ScheduleTraits:
    """Traits of a schedule name (any spelling or alias ``build`` accepts); defaults if
    unknown (an unknown name is reported by ``build``, with the list of names)."""
    return _TRAITS_BY_KEY.get(canonical_key(name), DEFAULT)


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


# ----------------------------------------------------------------------------- closed forms


@dataclass(frozen=True)
class ClosedForm:
    """The pipeline bubble of one schedule family in closed form (uniform stages, free p2p)."""

    bubble: Callable[[int, float, float, float], float]
    """(p, t_F, t_I, t_W) -> makespan minus the busiest rank's work m(t_F + t_I + t_W);
    times per stage (per virtual stage for interleaved), t_B = t_I + t_W fused."""
    exact_from: Callable[[int], int]
    """p -> the smallest number of microbatches from which the form is exact (checked
    against the dry run in tests/test_schedule_bubbles.py); below it, an estimate."""
    source: str
    """Where the form comes from."""


def _fused(p: int, tf: float, ti: float, tw: float) -> float:
    return (p - 1) * (tf + (ti + tw))  # t_B = t_I + t_W first: the same float the planner always had


CLOSED_FORMS: dict[str, ClosedForm] = {
    "gpipe": ClosedForm(_fused, lambda p: 1, "Huang et al. 2019: (p-1)/(m+p-1) of the makespan"),
    "1f1b": ClosedForm(_fused, lambda p: 1, "Narayanan et al. 2021: the same bubble as GPipe"),
    "interleaved1f1b": ClosedForm(_fused, lambda p: p,
                                  "Narayanan et al. 2021: (p-1)(t_F+t_B) with per-virtual-stage times"),
    "1f1biw": ClosedForm(lambda p, tf, ti, tw: (p - 1) * (tf + ti), lambda p: 1,
                         "W no longer gates the gradient chain: (p-1)(t_F+t_I)"),
    # over the makespan the staggered start alone costs (p-1) t_F
    "zbh1": ClosedForm(lambda p, tf, ti, tw: (p - 1) * max(tf, tf + ti - tw), lambda p: p,
                       "Qi et al. 2023: (p-1)(t_F+t_B-t_W), t_B their input backward"),
    "zbh2": ClosedForm(lambda p, tf, ti, tw: (p - 1) * max(tf, tf + ti - 2 * tw), lambda p: 2 * p - 1,
                       "Qi et al. 2023: (p-1)(t_F+t_B-2t_W), t_B their input backward"),
}
"""Schedule families (by :func:`name_key`) whose bubble has a closed form."""


def closed_form(name: str) -> ClosedForm | None:
    """The closed form of a schedule name (any spelling or alias), or None (dry-run it)."""
    return CLOSED_FORMS.get(canonical_key(name))


def bubble_time(name: str, p: int, tf: float, ti: float, tw: float) -> float | None:
    """Closed-form bubble (makespan - busiest rank's work) of ``name`` on p ranks; None
    when the family has none. Exact from ``closed_form(name).exact_from(p)`` microbatches."""
    form = closed_form(name)
    if form is None:
        return None
    return 0.0 if p == 1 else form.bubble(p, tf, ti, tw)


def bubble_fraction(name: str, p: int, m: int, v: int = 1, tf: float = 1.0, ti: float = 1.0,
                    tw: float = 1.0) -> float | None:
    """DESIGN §6's bubble_fraction (idle over the makespan) for uniform stages, or None;
    GPipe/1F1B: (p-1)/(m+p-1); interleaved (v stages per rank): (p-1)/(m v + p - 1)."""
    bubble = bubble_time(name, p, tf, ti, tw)
    if bubble is None:
        return None
    total = m * v * (tf + ti + tw) + bubble
    return bubble / total if total > 0 else 0.0
