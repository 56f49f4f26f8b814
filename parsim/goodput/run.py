"""Scenario + token budget -> goodput: the step from ``parsim.simulate``, the ``[faults]`` table,
the whole run by Monte Carlo (``parsim.goodput.montecarlo``) and the closed forms beside it."""
from __future__ import annotations

import math

import numpy as np

from parsim.config.scenario import Scenario
from parsim.costs.memory import state_bytes_per_param
from parsim.errors import ConfigError
from parsim.goodput.montecarlo import (
    RunModel,
    best_interval,
    daly_expected_time,
    daly_interval,
    expected_lost_per_failure,
    simulate_runs,
    young_interval,
)
from parsim.results.summary import fmt_b, fmt_s, pct, sig3, training_budget

HOUR = 3600.0
MAX_FAILURES_PER_RUN = 100_000
"""Most failures a simulated run may expect (the Monte Carlo steps through each one: ~10,000 a
second per interval); a month-long run on 100k GPUs expects a few thousand."""


def job_mtbf_s(sc: Scenario) -> float:
    """Mean time between failures of the whole job: 1 / (gpus / GPU MTBF + nodes / node MTBF +
    leaf switches / switch MTBF)."""
    f, hw = sc.faults, sc.hardware
    rate = sc.gpus / (f.gpu_mtbf_hours * HOUR)
    if f.node_mtbf_hours is not None:
        rate += math.ceil(sc.gpus / hw.gpus_per_node) / (f.node_mtbf_hours * HOUR)
    if f.switch_mtbf_hours is not None:
        rate += math.ceil(sc.gpus / hw.gpus_per_leaf) / (f.switch_mtbf_hours * HOUR)
    return 1.0 / rate


def checkpoint_write(sc: Scenario, params: float) -> tuple[float, float | None]:
    """(seconds one checkpoint takes, its bytes or None when the write time is given)."""
    f = sc.faults
    if f.checkpoint_write_s is not None:
        return f.checkpoint_write_s, f.checkpoint_bytes
    w, _, k = state_bytes_per_param(sc.training.optimizer, sc.training.precision)
    size = f.checkpoint_bytes if f.checkpoint_bytes is not None else params * (w + k)
    return size / (f.storage_gbyte_per_s * 1e9), size


def expected_failures(useful_s: float, interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Failures a run expects with a checkpoint every ``interval_s`` (Daly's expected wall time over
    the MTBF); infinite where that time overflows."""
    try:
        return daly_expected_time(useful_s, interval_s, write_s, restart_s, mtbf_s) / mtbf_s
    except OverflowError:
        return math.inf


def goodput(sc: Scenario, train_tokens: float, samples: int = 200, seed: int = 0, metrics: dict | None = None) -> dict:
    """The goodput figures of training ``sc`` on ``train_tokens`` tokens (``metrics``: the step's
    simulate metrics when already at hand)."""
    if sc.faults is None:
        raise ConfigError(sc.file, "faults", "missing [faults] table: parsim goodput needs at least gpu_mtbf_hours, "
                                             "restart_s and checkpoint_write_s or storage_gbyte_per_s")
    if metrics is None:
        from parsim.simulate import simulate
        metrics = simulate(sc).metrics
    budget = training_budget(metrics, train_tokens)
    useful, steps = budget["time_to_train_s"], budget["train_steps"]
    step = useful / steps
    f = sc.faults
    mtbf = job_mtbf_s(sc)
    write_s, size = checkpoint_write(sc, metrics["params"])
    # the Monte Carlo walks every failure of every run: refuse a run that fails more often than it can
    # count, judged at its best checkpoint interval by Daly's closed form
    tau = min(max(daly_interval(write_s, mtbf), step), useful)
    fewest = expected_failures(useful, tau, write_s, f.restart_s, mtbf)
    if fewest > MAX_FAILURES_PER_RUN:
        raise ConfigError(sc.file, "faults", f"{train_tokens:.3g} tokens ({useful / HOUR:.3g} h of training) with a "
                          f"failure every {mtbf / HOUR:.3g} h expects {fewest:.3g} failures per run even at the best "
                          f"checkpoint interval, more than parsim simulates ({MAX_FAILURES_PER_RUN:,}): fewer tokens, "
                          "a longer MTBF, a shorter restart or checkpoint write")
    nodes = -(-sc.gpus // sc.hardware.gpus_per_node)
    if f.spare_nodes is not None and f.spare_nodes > nodes:
        # the Monte Carlo keeps a free time per spare: a pool larger than the job never runs dry
        raise ConfigError(sc.file, "faults.spare_nodes", f"{f.spare_nodes:,} spares for a job of {nodes:,} nodes: a "
                          "pool that large never runs out (leave spare_nodes out: a replacement at once)")
    model = RunModel(useful, mtbf, write_s, f.restart_s, f.spare_nodes,
                     (f.node_repair_hours or 0.0) * HOUR)
    best, _, _ = best_interval(model, samples, seed, lo_s=step)
    wanted = f.checkpoint_interval_s if f.checkpoint_interval_s is not None else best
    interval = min(max(1, round(wanted / step)), steps) * step  # checkpoints fall between steps
    if f.checkpoint_interval_s is not None:  # the stated interval must be countable too (the best one is)
        at_interval = expected_failures(useful, interval, write_s, f.restart_s, mtbf)
        if at_interval > MAX_FAILURES_PER_RUN:
            raise ConfigError(sc.file, "faults.checkpoint_interval_s",
                              f"a checkpoint every {interval / HOUR:.3g} h with a failure every {mtbf / HOUR:.3g} h "
                              f"expects {at_interval:.3g} failures per run (each loses the work since the last "
                              f"checkpoint), more than parsim simulates ({MAX_FAILURES_PER_RUN:,}): a shorter "
                              f'interval, or "auto" (the simulated best, {best / HOUR:.3g} h)')
    runs = simulate_runs(model, [interval], samples, seed)
    wall = runs.wall_s[0]
    crashes = float(runs.work_failures.sum())
    closed = daly_expected_time(useful, interval, write_s, f.restart_s, mtbf)
    out = {
        "name": sc.name, "world_size": sc.gpus, "step_time_s": step, "train_tokens": float(train_tokens),
        "train_steps": steps, "useful_time_s": useful, "samples": samples, "seed": seed,
        "mtbf_s": mtbf, "checkpoint_write_s": write_s, "restart_s": f.restart_s,
        "checkpoint_interval_s": interval, "checkpoint_interval_auto": f.checkpoint_interval_s is None,
        "young_interval_s": young_interval(write_s, mtbf), "daly_interval_s": daly_interval(write_s, mtbf),
        "best_interval_s": best,
        "ettr": useful / float(wall.mean()),
        "ettr_p5": useful / float(np.percentile(wall, 95)), "ettr_p95": useful / float(np.percentile(wall, 5)),
        "expected_failures": float(runs.failures.mean()),
        "time_to_train_s": float(wall.mean()),
        "time_to_train_p5_s": float(np.percentile(wall, 5)),
        "time_to_train_p50_s": float(np.percentile(wall, 50)),
        "time_to_train_p95_s": float(np.percentile(wall, 95)),
        "lost_work_per_failure_s": float(runs.lost_s.sum()) / crashes if crashes else 0.0,
        "lost_work_per_failure_closed_form_s": expected_lost_per_failure(interval, write_s, mtbf),
        "checkpoint_overhead_s": math.ceil(steps * step / interval - 1e-9) * write_s,
        "lost_work_s": float(runs.lost_s.mean()), "restart_time_s": float(runs.restart_s.mean()),
        "spare_wait_s": float(runs.wait_s.mean()),
        "time_to_train_daly_s": closed, "ettr_daly": useful / closed,
        "gpu_hours": float(wall.mean()) * sc.gpus / HOUR,
    }
    if size is not None:
        out["checkpoint_bytes"] = size
    return out


def format_goodput(g: dict) -> str:
    """A readable summary of :func:`goodput`'s figures."""
    auto = " (auto: the simulated best)" if g["checkpoint_interval_auto"] else ""
    size = f" ({fmt_b(g['checkpoint_bytes'])})" if "checkpoint_bytes" in g else ""
    spare = f", {fmt_s(g['spare_wait_s'])} waiting for spares" if g["spare_wait_s"] > 0 else ""
    return "\n".join([
        f"{g['name']}: {g['train_steps']:,} steps of {fmt_s(g['step_time_s'])} on {g['world_size']:,} GPUs "
        f"= {fmt_s(g['useful_time_s'])} of training; {g['samples']} simulated runs (seed {g['seed']})",
        f"  job MTBF          {fmt_s(g['mtbf_s'])}; checkpoint write {fmt_s(g['checkpoint_write_s'])}{size}, "
        f"restart {fmt_s(g['restart_s'])}",
        f"  checkpoint every  {fmt_s(g['checkpoint_interval_s'])}{auto}; simulated best {fmt_s(g['best_interval_s'])}, "
        f"Young {fmt_s(g['young_interval_s'])}, Daly {fmt_s(g['daly_interval_s'])}",
        f"  ETTR              {sig3(g['ettr'])} (P5-P95 {sig3(g['ettr_p5'])}-{sig3(g['ettr_p95'])}; "
        f"Daly's closed form {sig3(g['ettr_daly'])})",
        f"  failures          {sig3(g['expected_failures'])} expected; {fmt_s(g['lost_work_per_failure_s'])} of work "
        f"lost per failure",
        f"  time to train     {fmt_s(g['time_to_train_s'])} (P5 {fmt_s(g['time_to_train_p5_s'])}, "
        f"P50 {fmt_s(g['time_to_train_p50_s'])}, P95 {fmt_s(g['time_to_train_p95_s'])}), "
        f"{sig3(g['gpu_hours'])} GPU-hours",
        f"  where time goes   training {pct(g['useful_time_s'] / g['time_to_train_s'])}, checkpoints "
        f"{fmt_s(g['checkpoint_overhead_s'])}, lost work {fmt_s(g['lost_work_s'])}, restarts "
        f"{fmt_s(g['restart_time_s'])}{spare}",
    ])
