"""Naive model parallelism, GPipe with re-materialization, PipeDream and PipeDream-2BW.

* ``Naive`` (DistBelief-style model parallelism): consecutive layers on consecutive
  ranks and no pipelining: microbatch j runs forward through every stage and back
  before microbatch j+1 starts (rank r: F0 B0 F1 B1 ...). With uniform stages only one
  rank works at a time: bubble (p-1)/p.
* ``GPipeRemat``: GPipe's order (all F, then all B) with re-materialization: F keeps
  only the stage's input, B recomputes the forward first (traits ``remat``). Bubble as
  GPipe's, (p-1)/(m+p-1), with B's time including the recomputation.
* ``PipeDream`` (Narayanan et al. 2019): asynchronous 1F1B with weight stashing. The
  order is 1F1B's; there is no flush, the weights are updated after every backward,
  and stage s stashes one weight version per in-flight microbatch, min(p-s, m), its
  gradients p-s-1 updates stale. With data parallelism the replicated stages take
  microbatches round-robin (PipeDream's 1F1B-RR); parsim's dp replicas do exactly
  that, so 1F1B-RR is PipeDream with dp > 1.
* ``PipeDream2BW`` (Narayanan et al. 2021): the same order, gradients accumulated over
  the m microbatches of a step, two weight versions per stage, updates one step stale.

The orders are pure; what differs (weight versions, staleness, steady-state
throughput, re-materialized memory) is in :mod:`parsim.schedule.semantics` and the
cost and result layers.
"""
from __future__ import annotations

from parsim.schedule.builders import (
    _check_sizes,
    _linear,
    gpipe,
    one_f_one_b,
    register,
    single_chunk,
)
from parsim.schedule.ir import Op, Schedule, act
from parsim.schedule.semantics import ScheduleTraits, set_traits


def naive(pp: int, m: int) -> Schedule:
    """No pipelining: each rank runs F then B of one microbatch at a time."""
    _check_sizes(pp, m)
    rows = [[a for j in range(m) for a in (act(r, Op.F, j), act(r, Op.B, j))] for r in range(pp)]
    return _linear("Naive", pp, m, rows)


def gpipe_remat(pp: int, m: int) -> Schedule:
    """GPipe's order; memory semantics: re-materialization (see module doc)."""
    return _renamed(gpipe(pp, m), "GPipeRemat")


def pipedream(pp: int, m: int) -> Schedule:
    """PipeDream: 1F1B's order, no flush, weight stashing (see module doc)."""
    return _renamed(one_f_one_b(pp, m), "PipeDream")


def pipedream_2bw(pp: int, m: int) -> Schedule:
    """PipeDream-2BW: 1F1B's order, two weight versions, one-step-stale updates."""
    return _renamed(one_f_one_b(pp, m), "PipeDream2BW")


def _renamed(s: Schedule, name: str) -> Schedule:
    return Schedule.trusted(name, s.n_stages, s.n_microbatches, s.stage_to_rank, s.actions, s.n_chains)


register("Naive", single_chunk(naive, "Naive"))
register("GPipeRemat", single_chunk(gpipe_remat, "GPipeRemat"))
register("PipeDream", single_chunk(pipedream, "PipeDream"))
register("PipeDream2BW", single_chunk(pipedream_2bw, "PipeDream2BW"))
set_traits("GPipeRemat", ScheduleTraits(remat=True))
set_traits("PipeDream", ScheduleTraits(weight_versions="pipedream", asynchronous=True))
set_traits("PipeDream2BW", ScheduleTraits(weight_versions="2bw", asynchronous=True))
