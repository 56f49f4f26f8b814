"""Schedule builders: pure functions of integers returning compute-only schedules.

Every builder returns F, B (or I and W) actions only; :func:`parsim.schedule.passes.lower`
adds the communication. Stage s lives on rank s (non-interleaved) or s % pp
(interleaved). ``BUILDERS`` maps scenario names to callables ``(pp, m, vpp) -> Schedule``;
:func:`build` looks names up case-insensitively (ignoring ``-``, ``_`` and spaces; aliases
resolved: ``parsim.schedule.semantics`` owns names) and turns impossible combinations
into one-line :class:`ScheduleError`.

To add a schedule: write ``def my_schedule(pp, m) -> Schedule`` here or elsewhere and
``register("MySchedule", single_chunk(my_schedule))`` (or a callable taking vpp); give it
memory semantics with ``semantics.set_traits``. More builders live in ``pipedream.py``
(Naive, GPipeRemat, PipeDream, PipeDream2BW), ``zero_bubble.py`` (ZBV) and
``bidirectional.py`` (DualPipe, DualPipeV, Chimera). Builders construct trusted actions
(``ir.act``/``ir.action_table``) and ``Schedule.trusted``: no re-validation on the hot path.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import lru_cache

from parsim.errors import ScheduleError
from parsim.schedule.ir import Action, Op, Schedule, act, action_table, no_gc
from parsim.schedule.semantics import ALIASES, canonical_key, name_key

Builder = Callable[..., Schedule]


def _check_sizes(pp: int, m: int) -> None:
    if not isinstance(pp, int) or pp < 1:
        raise ScheduleError(f"pipeline degree pp must be >= 1, got {pp}")
    if not isinstance(m, int) or m < 1:
        raise ScheduleError(f"number of microbatches must be >= 1, got {m}")


def _linear(name: str, pp: int, m: int, rank_lists: list[list[Action]]) -> Schedule:
    return Schedule.trusted(name, pp, m, tuple(range(pp)), tuple(tuple(r) for r in rank_lists))


def gpipe(pp: int, m: int) -> Schedule:
    """GPipe: all forwards, then all backwards (microbatch order 0..m-1)."""
    _check_sizes(pp, m)
    rows = [
        [act(r, Op.F, j) for j in range(m)] + [act(r, Op.B, j) for j in range(m)]
        for r in range(pp)
    ]
    return _linear("GPipe", pp, m, rows)


def _one_f_one_b_rank(
    r: int, m: int, warmup: int, split: bool, w_lag: int = 0
) -> Iterator[Action]:
    """Warm-up forwards, then (F, backward) pairs, then the remaining backwards.

    With ``split`` the backward is I, and W of microbatch j - ``w_lag`` follows the
    I of microbatch j; the W's still owed at the end come last, in order.
    """
    warmup = min(warmup, m)
    fw = action_table(r, Op.F, m)
    bw = action_table(r, Op.I if split else Op.B, m)
    ww = action_table(r, Op.W, m) if split else None
    yield from fw[:warmup]
    next_w = 0
    for j in range(m):
        if warmup + j < m:
            yield fw[warmup + j]
        yield bw[j]
        if split and j >= w_lag:
            yield ww[next_w]
            next_w += 1
    if split:
        yield from ww[next_w:]


def one_f_one_b(pp: int, m: int) -> Schedule:
    """Megatron's non-interleaved 1F1B: min(pp-r-1, m) warm-up forwards on rank r,
    then one forward / one backward, then the cool-down backwards."""
    _check_sizes(pp, m)
    rows = [list(_one_f_one_b_rank(r, m, pp - r - 1, split=False)) for r in range(pp)]
    return _linear("1F1B", pp, m, rows)


def one_f_one_b_iw(pp: int, m: int) -> Schedule:
    """1F1B with every B split into I immediately followed by W.

    Same order and memory as 1F1B; because a rank's W no longer delays the gradient it
    sends, the bubble is (p-1)(T_F+T_I) instead of 1F1B's (p-1)(T_F+T_I+T_W).
    """
    _check_sizes(pp, m)
    rows = [list(_one_f_one_b_rank(r, m, pp - r - 1, split=True)) for r in range(pp)]
    return _linear("1F1B-IW", pp, m, rows)


def zero_bubble_h1(pp: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023): 1F1B's warm-up (same activation memory, p in flight),
    backward split into I and W, and rank r's W's lag its I's by r microbatches, so
    the I's of the cool-down run back to back and the deferred W's fill the bubbles.

    With T_F = T_I = T_W and no p2p cost the makespan is m(T_F+T_I+T_W) + (p-1)T_F:
    the bubble is (p-1)(T_F+T_B-T_W) in the paper's notation (T_B = input backward).
    """
    _check_sizes(pp, m)
    rows = [list(_one_f_one_b_rank(r, m, pp - r - 1, split=True, w_lag=r)) for r in range(pp)]
    return _linear("ZBH1", pp, m, rows)


def zero_bubble_h2(pp: int, m: int) -> Schedule:
    """ZB-H2 (Qi et al. 2023): 2(p-r-1) warm-up forwards on rank r (up to 2p-1
    microbatches in flight on rank 0) fill the bubble before the first I; rank r's W's
    lag its I's by 2r microbatches, which turns the tail into a parallelogram.

    With T_F = T_I = T_W, no p2p cost and m >= 2p, every rank is busy from its first
    to its last action: the bubble (p-1)(T_F+T_B-2T_W) is zero.
    """
    _check_sizes(pp, m)
    rows = [
        list(_one_f_one_b_rank(r, m, 2 * (pp - r - 1), split=True, w_lag=2 * r))
        for r in range(pp)
    ]
    return _linear("ZBH2", pp, m, rows)


def _interleaved_index(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Megatron's virtual-microbatch index -> (model chunk, microbatch)."""
    group = pp * vpp
    chunk = (k % group) // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return chunk, (k // group) * pp + k % pp


def interleaved_1f1b(pp: int, m: int, vpp: int) -> Schedule:
    """Megatron's interleaved 1F1B: stage s = chunk * pp + r on rank r = s % pp.

    Rank r runs min((pp-r-1)*2 + (vpp-1)*pp, m*vpp) warm-up forwards, then one forward
    and one backward per step, then the cool-down backwards; forwards go through
    chunks 0..vpp-1 in groups of pp microbatches, backwards through vpp-1..0.
    Like Megatron, m must be a multiple of pp.
    """
    _check_sizes(pp, m)
    if vpp < 2:
        raise ScheduleError(f"Interleaved1F1B needs vpp >= 2 (stages per rank), got vpp={vpp}")
    if m % pp:
        raise ScheduleError(
            f"Interleaved1F1B needs the number of microbatches ({m}) to be a multiple of pp={pp}"
        )
    total = m * vpp
    f_tab = [action_table(s, Op.F, m) for s in range(pp * vpp)]
    b_tab = [action_table(s, Op.B, m) for s in range(pp * vpp)]
    # virtual-microbatch index k -> (chunk, microbatch): the same for every rank
    fwd_idx = [_interleaved_index(k, pp, vpp, forward=True) for k in range(total)]
    bwd_idx = [_interleaved_index(k, pp, vpp, forward=False) for k in range(total)]
    rows = []
    for r in range(pp):
        warmup = min((pp - r - 1) * 2 + (vpp - 1) * pp, total)
        fwd = [f_tab[c * pp + r][j] for c, j in fwd_idx]
        bwd = [b_tab[c * pp + r][j] for c, j in bwd_idx]
        row = fwd[:warmup]
        for k in range(total - warmup):
            row.append(fwd[warmup + k])
            row.append(bwd[k])
        row += bwd[total - warmup:]
        rows.append(row)
    stage_to_rank = tuple(s % pp for s in range(pp * vpp))
    return Schedule.trusted("Interleaved1F1B", pp * vpp, m, stage_to_rank, tuple(tuple(r) for r in rows))


# ----------------------------------------------------------------------------- registry

BUILDERS: dict[str, Builder] = {}
"""Scenario schedule name -> callable ``(pp, m, vpp=1) -> Schedule``."""


def register(name: str, builder: Builder) -> Builder:
    """Add ``builder`` (called as ``builder(pp, m, vpp)``) under ``name``."""
    clash = [k for k in BUILDERS if name_key(k) == name_key(name) and k != name]
    if clash:
        raise ValueError(f"schedule name {name!r} clashes with {clash[0]!r}")
    if name_key(name) in ALIASES:
        raise ValueError(f"schedule name {name!r} is an alias of {ALIASES[name_key(name)]!r}")
    BUILDERS[name] = builder
    return builder


def single_chunk(fn: Callable[[int, int], Schedule], name: str | None = None) -> Builder:
    """Wrap a ``(pp, m)`` builder for the registry: it takes one stage per rank, vpp=1."""
    label = name or fn.__name__

    def builder(pp: int, m: int, vpp: int = 1) -> Schedule:
        if vpp != 1:
            raise ScheduleError(
                f"{label} places one stage per rank: vpp must be 1, got vpp={vpp}"
            )
        return fn(pp, m)

    builder.__name__ = f"{fn.__name__}_registered"
    builder.__doc__ = fn.__doc__
    return builder


def two_chunks(fn: Callable[[int, int], Schedule], label: str, shape: str = "") -> Builder:
    """Wrap a ``(pp, m)`` builder that places two stages on every rank (V-shaped or
    bidirectional): vpp is 2 by construction (1 is accepted as "not given")."""

    def builder(pp: int, m: int, vpp: int = 2) -> Schedule:
        if vpp not in (1, 2):
            raise ScheduleError(f"{label} places two stages per rank{shape}: vpp must be 2 (or 1), got vpp={vpp}")
        return fn(pp, m)

    builder.__name__ = f"{fn.__name__}_registered"
    builder.__doc__ = fn.__doc__
    return builder


def lookup(name: str) -> tuple[str, Builder]:
    """(canonical name, builder) for a name in any spelling or alias
    (``parsim.schedule.semantics``); ScheduleError if unknown."""
    key = canonical_key(name)
    for known, fn in BUILDERS.items():
        if name_key(known) == key:
            return known, fn
    raise ScheduleError(f"unknown schedule {name!r}; known: {', '.join(BUILDERS)}")


def build(name: str, pp: int, n_microbatches: int, vpp: int = 1) -> Schedule:
    """Build the named schedule; impossible combinations raise a one-line ScheduleError.

    Schedules are immutable, so builds are cached by (builder, pp, m, vpp).
    """
    _, fn = lookup(name)
    _check_sizes(pp, n_microbatches)
    if not isinstance(vpp, int) or vpp < 1:
        raise ScheduleError(f"vpp must be >= 1, got {vpp}")
    return _cached_build(fn, pp, n_microbatches, vpp)


@lru_cache(maxsize=256)
def _cached_build(fn: Builder, pp: int, m: int, vpp: int) -> Schedule:
    with no_gc():
        return fn(pp, m, vpp)


register("GPipe", single_chunk(gpipe, "GPipe"))
register("1F1B", single_chunk(one_f_one_b, "1F1B"))
register("Interleaved1F1B", interleaved_1f1b)
register("ZBH1", single_chunk(zero_bubble_h1, "ZBH1"))
register("ZBH2", single_chunk(zero_bubble_h2, "ZBH2"))
