"""A synchronous job runs at the pace of its slowest chip.

Chips of one GPU model do not all sustain the same clock at their power limit: leakage and
cooling differ from die to die. stas00/ml-engineering (compute/accelerator/benchmarks/README.md,
'What we measured: alone vs all-8 concurrent') ran mamf-finder on all 8 GPUs of a node at once,
5 rounds: the sustained matmul rate (MSMF) spanned 4.5% across an H200 node and 10.4% across a
B200 node, each GPU keeping to its own part of the range, and "since [a full-node training run]
waits on its slowest GPU, the bottom of that range is what it actually gets". The profile's
MSMF is that measurement's *mean* chip; a job whose GPUs wait on one another every step (the
data-parallel reduction, the pipeline's sends, tensor parallelism's lockstep) runs its compute at
the slowest of its N chips.

A later revision of that README measured other nodes (torch 2.14.0+cu130): a 3.4% range on
H200 and 4.9% on B200, with sustained/burst ratios of 0.887 and 0.823 against the 0.848 and
0.815 of the runs the profiles cite; the profiles keep one campaign for both numbers.

Chip rates are taken as normal with standard deviation ``sigma`` (a fraction of the mean), read
from the measured range of ``g`` chips as ``range / E[range of g normals]``; the slowest of N
then sits ``sigma * E[max of N standard normals]`` below the mean. Memory-bound work is not
paced: HBM keeps its clock (as ``KernelFacts.saturated_ratio``).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

_GRID = np.linspace(-12.0, 12.0, 48001)
"""Integration grid of :func:`expected_max_normal` (standard-normal units; beyond +-12 the
densities are below 1e-31)."""


@lru_cache(maxsize=256)
def expected_max_normal(n: int) -> float:
    """E[max of ``n`` independent standard normals]: the integral of ``x n phi(x) Phi(x)^(n-1)``
    (trapezoid on a 5e-4 grid: within 1e-9 of the closed forms 1/sqrt(pi) at n = 2 and
    3/(2 sqrt(pi)) at n = 3); 0 for n <= 1."""
    if n <= 1:
        return 0.0
    x = _GRID
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    # Phi^(n-1) through logs: n reaches 1e5 and more on the largest jobs
    with np.errstate(divide="ignore"):
        log_cdf = np.log(cdf)
    density = n * pdf * np.exp((n - 1) * log_cdf)
    return float(np.trapezoid(x * density, x))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[float])(x)


def chip_sigma(range_fraction: float, chips: int) -> float:
    """Standard deviation of the chips' sustained rate (fraction of the mean) from the range
    ``range_fraction`` measured across ``chips`` of them: range / (2 E[max of ``chips``])."""
    if chips < 2 or range_fraction <= 0.0:
        return 0.0
    return range_fraction / (2.0 * expected_max_normal(chips))


def slowest_chip_share(sigma: float, n: int) -> float:
    """Sustained rate of the slowest of ``n`` chips as a fraction of the mean chip's."""
    return max(0.0, 1.0 - sigma * expected_max_normal(n))
