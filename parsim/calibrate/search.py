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
