"""One-dimensional minimisation for the documented single-quantity fits (benchmarks/fit_*.py)."""
from __future__ import annotations

import math
from collections.abc import Callable


def golden_section_min(f: Callable[[float], float], lo: float, hi: float, tol: float) -> float:
    """The ``x`` in ``[lo, hi]`` minimising ``f`` (unimodal there), to within ``tol``: golden-section
    search, one evaluation of ``f`` per step."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_log_error(predict: Callable[[dict, float], float], rows: list[dict], lo: float, hi: float,
                  tol: float) -> float:
    """The value ``x`` in ``[lo, hi]`` minimising the squared log error of ``predict(row, x)``
    against each row's ``"published"`` figure (the one quantity a documented fit names)."""
    return golden_section_min(lambda x: sum(math.log(predict(r, x) / r["published"]) ** 2 for r in rows),
                              lo, hi, tol)


def before_after(rows: list[dict], predict: Callable[[dict, float | None], float], before: float | None,
                 after: float, is_fit: Callable[[dict], bool], cells: Callable[[dict], str]) -> tuple[list[str], dict]:
    """One Markdown table line per row (``cells(row)``, then the published figure, the
    predictions with ``before`` and ``after`` and their errors, and whether the fit saw the row),
    and per group ("fit", "held out"): (MAPE before, MAPE after, worst error after, rows)."""
    lines, errs = [], {"fit": ([], []), "held out": ([], [])}
    for r in rows:
        p0, p1 = predict(r, before), predict(r, after)
        e0, e1 = p0 / r["published"] - 1, p1 / r["published"] - 1
        which = "fit" if is_fit(r) else "held out"
        errs[which][0].append(abs(e0))
        errs[which][1].append(abs(e1))
        lines.append(f"| {cells(r)} | {r['published']:g} | {p0:.2f} ({e0:+.1%}) | {p1:.2f} ({e1:+.1%}) | "
                     f"{'yes' if which == 'fit' else ''} |")
    stats = {k: (sum(v[0]) / len(v[0]), sum(v[1]) / len(v[1]), max(v[1]), len(v[0])) for k, v in errs.items()}
    return lines, stats
