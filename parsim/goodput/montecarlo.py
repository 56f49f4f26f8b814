"""A whole training run under failures, by Monte Carlo, and the closed forms beside it.

The run: ``useful_s`` seconds of training cut into segments of ``interval_s`` (the last one
shorter), each followed by a checkpoint write of ``write_s`` (the last one too: the model is
saved at the end). Failures of the job form a Poisson process of mean time between failures
``mtbf_s`` over wall-clock time, during training, checkpoint writes and restarts alike. A
failure loses everything since the last completed checkpoint (the work and a half-written
checkpoint); the job then gets a replacement node (at once, or, with ``spare_nodes``, the
first spare free: a failed node returns as a spare ``repair_s`` later) and restarts, which
takes ``restart_s`` and can itself be hit by a failure (then it begins again).

This is exactly the model of J. T. Daly, "A higher order estimate of the optimum checkpoint
interval for restart dumps", Future Generation Computer Systems 22 (2006) 303-312: with
unlimited spares the expected wall time is ``M e^{R/M} (e^{(tau+delta)/M} - 1) W / tau``
(:func:`daly_expected_time`), his optimum interval :func:`daly_interval`, and to first order
J. W. Young's ``sqrt(2 delta M)`` (Communications of the ACM 17(9), 1974, 530-531).

Draws are common random numbers across intervals (the i-th failure gap of sample s is the
same for every interval), so curves over the interval are smooth and their minimum is stable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def young_interval(write_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval sqrt(2 delta M)."""
    return math.sqrt(2.0 * write_s * mtbf_s)


def daly_interval(write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum: sqrt(2dM)[1 + sqrt(d/2M)/3 + (d/2M)/9] - d for d < 2M, else M."""
    if write_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = write_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * write_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - write_s


def daly_expected_time(useful_s: float, interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Daly's expected wall time of the run (exponential failures, restarts that can fail):
    M e^{R/M} (e^{(tau+delta)/M} - 1) W / tau."""
    m = mtbf_s
    return m * math.exp(restart_s / m) * math.expm1((interval_s + write_s) / m) * useful_s / interval_s


def expected_lost_per_failure(interval_s: float, write_s: float, mtbf_s: float) -> float:
    """Mean time since the last checkpoint when a failure strikes a segment of tau + delta:
    E[X | X < L] = M - L / (e^{L/M} - 1), about L/2 when L << M."""
    cycle = interval_s + write_s
    return mtbf_s - cycle / math.expm1(cycle / mtbf_s)


@dataclass(frozen=True)
class RunModel:
    """One training run's failure and checkpoint parameters, seconds."""

    useful_s: float
    """Training time the run needs without failures or checkpoints."""
    mtbf_s: float
    """Mean time between failures of the whole job."""
    write_s: float
    """Time one checkpoint stops training."""
    restart_s: float
    """Time from a replacement being at hand to training again."""
    spare_nodes: int | None = None
    """Spare nodes; None: a replacement always at hand."""
    repair_s: float = 0.0
    """Time a failed node takes to return as a spare."""


@dataclass(frozen=True)
class Runs:
    """Monte Carlo outcomes, arrays of shape (intervals, samples)."""

    wall_s: np.ndarray
    """Wall-clock time of each simulated run."""
    failures: np.ndarray
    """Failures in each run (during restarts too)."""
    work_failures: np.ndarray
    """Failures that struck training or a checkpoint write (the ones that lose work)."""
    lost_s: np.ndarray
    """Time lost to failures (work since the last checkpoint, half-written checkpoints)."""
    wait_s: np.ndarray
    """Time spent waiting for a spare node."""
    restart_s: np.ndarray
    """Time spent restarting (failed restarts included)."""


def simulate_runs(model: RunModel, intervals_s, samples: int, seed: int) -> Runs:
    """Simulate ``samples`` runs for each checkpoint interval in ``intervals_s`` (seeded: the same
    seed gives the same numbers)."""
    rng = np.random.default_rng(seed)
    tau = np.asarray(intervals_s, float).reshape(-1, 1)
    shape = (tau.shape[0], samples)
    W, M, d, R = model.useful_s, model.mtbf_s, model.write_s, model.restart_s
    cycle = tau + d
    done = np.zeros(shape)
    t, fails, work_fails, lost, wait, restart = (np.zeros(shape) for _ in range(6))
    active = np.ones(shape, bool)
    spares = model.spare_nodes
    tokens = np.zeros(shape + (spares,)) if spares else None  # when each spare is (again) free
    while active.any():
        rem = W - done
        segments = np.ceil(rem / tau - 1e-9)
        to_finish = rem + segments * d
        x = rng.exponential(M, samples)[None, :]
        finish = active & (x >= to_finish)
        t = np.where(finish, t + to_finish, t)
        failed = active & ~finish
        active = failed
        if not failed.any():
            break
        k = np.floor(x / cycle)
        done = np.where(failed, done + k * tau, done)
        lost = np.where(failed, lost + (x - k * cycle), lost)
        t = np.where(failed, t + x, t)
        fails = fails + failed
        work_fails = work_fails + failed
        pending = failed
        while pending.any():  # replace the node, restart; a failure during the restart starts it again
            start = _replacement(t, pending, spares, model.repair_s, tokens)
            wait = wait + np.where(pending, start - t, 0.0)
            t = np.where(pending, start, t)
            y = rng.exponential(M, samples)[None, :]
            ok = pending & (y >= R)
            bad = pending & ~ok
            t = np.where(ok, t + R, np.where(bad, t + y, t))
            restart = restart + np.where(ok, R, np.where(bad, y, 0.0))
            fails = fails + bad
            pending = bad
    return Runs(t, fails, work_fails, lost, wait, restart)


def _replacement(t, pending, spares, repair_s, tokens):
    """When the failed node's replacement is at hand (the failed node goes to repair)."""
    if spares is None:
        return t
    if spares == 0:
        return np.where(pending, t + repair_s, t)
    j = np.argmin(tokens, axis=2)[..., None]
    free = np.take_along_axis(tokens, j, axis=2)[..., 0]
    start = np.where(pending, np.maximum(t, free), t)
    np.put_along_axis(tokens, j, np.where(pending, t + repair_s, free)[..., None], axis=2)
    return start


def best_interval(model: RunModel, samples: int, seed: int, lo_s: float = 0.0, points: int = 41) -> tuple[float, np.ndarray, np.ndarray]:
    """The interval of least mean wall time: a grid from Daly's optimum / 4 to x 4 (not below
    ``lo_s``), then the vertex of a parabola through the mean wall times in log(interval)
    around the grid's minimum. Returns (best, grid, mean wall time per grid point)."""
    centre = daly_interval(model.write_s, model.mtbf_s)
    grid = np.geomspace(max(centre / 4.0, lo_s), max(centre * 4.0, 4.0 * lo_s, lo_s * 1.0001), points)
    grid = grid[grid <= model.useful_s] if (grid <= model.useful_s).any() else grid[:1]
    mean = simulate_runs(model, grid, samples, seed).wall_s.mean(axis=1)
    i = int(np.argmin(mean))
    lo, hi = max(0, i - 5), min(len(grid), i + 6)
    if hi - lo >= 3:
        a, b, _ = np.polyfit(np.log(grid[lo:hi]), mean[lo:hi], 2)
        if a > 0:
            v = math.exp(-b / (2 * a))
            if grid[lo] <= v <= grid[hi - 1]:
                return v, grid, mean
    return float(grid[i]), grid, mean
