"""Rank-by-step text grids of a schedule.

:func:`format_grid` lays out each rank's list, one fixed-width cell per step; a marked
cell is shown as ``[2F3]``, its row starts with ``>>`` and a ``^^^^`` line points at
it. :func:`format_timeline_grid` places compute actions at their dry-run time instead
(idle = ``.``), which is how ``parsim schedule NAME`` shows a schedule.
"""
from __future__ import annotations

from parsim.schedule.ir import Schedule

_ELLIPSIS = "..."


def _columns(n: int, mark_step: int | None, window: int | None) -> tuple[int, int]:
    if window is None or n <= 2 * window + 1:
        return 0, n
    centre = 0 if mark_step is None else mark_step
    lo = max(0, min(centre - window, n - 2 * window - 1))
    return lo, min(n, lo + 2 * window + 1)


def format_grid(
    schedule: Schedule,
    mark: tuple[int, int | None] | None = None,
    compute_only: bool = True,
    window: int | None = None,
) -> str:
    """A rank-by-step table of ``schedule``.

    ``mark = (rank, step)`` highlights one cell; ``step`` indexes the rank's full list
    (a marked comm action is shown even with ``compute_only``; ``step=None`` marks the
    row only). ``window`` limits the table to that many steps either side of the mark.
    """
    mark_rank, mark_step = mark if mark is not None else (None, None)
    rows: list[list[tuple[int, str]]] = []
    for r, row in enumerate(schedule.actions):
        cells = [
            (k, str(a))
            for k, a in enumerate(row)
            if not compute_only or a.op.is_compute or (r == mark_rank and k == mark_step)
        ]
        rows.append(cells)
    # position (column) of the marked cell in its row
    mark_col = None
    if mark_rank is not None and mark_step is not None and 0 <= mark_rank < len(rows):
        cols = [k for k, _ in rows[mark_rank]]
        mark_col = cols.index(mark_step) if mark_step in cols else None
    n_cols = max((len(c) for c in rows), default=0)
    lo, hi = _columns(n_cols, mark_col, window)
    width = max([len(t) for c in rows for _, t in c[lo:hi]] + [3]) + 2
    label_w = len(f"rank {len(rows) - 1}") + 4

    def head(r: int) -> str:
        tag = ">> " if r == mark_rank else "   "
        return f"{tag}rank {r}".ljust(label_w)

    pad = " " * (len(_ELLIPSIS) + 1) if lo > 0 else ""
    step_labels = "".join(str(c).center(width) for c in range(lo, hi))
    out = [" " * label_w + pad + step_labels.rstrip()]
    for r, cells in enumerate(rows):
        line = head(r) + (_ELLIPSIS + " " if lo > 0 and len(cells) > lo else pad)
        for col in range(lo, min(hi, len(cells))):
            text = cells[col][1]
            line += (f"[{text}]" if r == mark_rank and col == mark_col else text).center(width)
        if hi < len(cells):
            line += " " + _ELLIPSIS
        out.append(line.rstrip())
        if r == mark_rank and mark_col is not None and lo <= mark_col < hi:
            text = f"[{cells[mark_col][1]}]"
            start = label_w + len(pad) + (mark_col - lo) * width + (width - len(text)) // 2
            out.append(" " * start + "^" * len(text) + f" rank {r} step {mark_step}")
    if lo > 0 or hi < n_cols:
        out.append(f"(steps {lo}..{hi - 1} of {n_cols} shown)")
    return "\n".join(out) + "\n"


