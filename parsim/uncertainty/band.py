"""``parsim simulate --samples N``: the step simulated N times in the fast engine with drawn
durations (``parsim.uncertainty.sampled``), seeded, and the P5/P50/P95 of step time and throughput.
A full-mode scenario is sampled in full mode (its stragglers, replicas and network included)."""
from __future__ import annotations

import math
import random
from dataclasses import replace
from statistics import NormalDist

import numpy as np

from parsim.cluster.spread import Spread, spread_of
from parsim.config.scenario import Scenario
from parsim.costs.model_costs import ModelCosts
from parsim.schedule.coverage import check_runs
from parsim.schedule.ir import Schedule
from parsim.schedule.semantics import traits
from parsim.sim import engine, fullsim
from parsim.sim.engine import simulate_schedule
from parsim.sim.stragglers import gpu_slowdowns, rank_factors, slowed
from parsim.simulate import engine_costs, full_mode, schedule_and_costs
from parsim.uncertainty.sampled import SampledCosts


def spread_for(sc: Scenario) -> Spread:
    """The spread ``sc`` draws from: its profile's (:func:`spread_of`), with the MoE model
    discrepancy in place of the dense one for a mixture-of-experts model where the profile states
    one (``spread_model_moe``)."""
    s = spread_of(sc.hardware)
    return replace(s, model=s.model_moe) if sc.model.is_moe and s.model_moe > 0 else s


def model_factors(sigma: float, samples: int, rng: random.Random) -> list[float]:
    """One model-discrepancy factor per sample, stratified: the lognormal's quantiles at
    (k + 0.5) / samples for k = 0 .. samples - 1, in a seeded random order (Latin hypercube
    sampling of the one factor every duration of a sample shares). A band's percentiles of this
    factor are then its distribution's, not a draw's: with sigma 0.3 and 200 plain draws the
    sample median alone wanders by ~2.7%."""
    if sigma <= 0:
        return [1.0] * samples
    nd = NormalDist()
    f = [math.exp(sigma * nd.inv_cdf((k + 0.5) / samples)) for k in range(samples)]
    rng.shuffle(f)
    return f


def sample_step_times(sc: Scenario, samples: int, seed: int = 0, spread: Spread | None = None,
                      schedule: Schedule | None = None) -> np.ndarray:
    """``samples`` step times (makespans) of ``sc`` with drawn durations, in the engine ``sc`` runs
    in (full mode: every replica, its stragglers and network; each replica draws its own noise);
    the same seed, the same numbers. ``schedule``: an already lowered one of ``sc`` to sample (as
    ``simulate`` takes it: a validation run's, receives posted early); default ``sc``'s own."""
    if traits(sc.schedule.name).message_driven:  # AMPNet: its own engine, its order re-made by every draw
        return _sample_message_driven(sc, samples, seed, spread or spread_for(sc))
    # token slices solved as simulate does
    sched, costs = schedule_and_costs(sc, ModelCosts.from_scenario(sc), schedule)
    full = full_mode(sc)
    check_runs(sched, fullsim.COVERAGE if full else engine.COVERAGE)
    run = engine_costs(sc, costs)
    if not full and sc.stragglers is not None:  # the fast engine's job: replica 0's slow ranks
        factors = rank_factors(sc.parallel, gpu_slowdowns(sc.stragglers, sc.hardware.gpus_per_node, sc.gpus))
        run = slowed(run, sched.stage_to_rank, factors, 0)
    spread = spread or spread_for(sc)
    rng = random.Random(seed)
    model = model_factors(spread.model, samples, random.Random(f"model:{seed}"))
    out = np.empty(samples)
    for i in range(samples):
        drawn = SampledCosts(run, spread, rng, model[i])
        raw = fullsim.simulate_full(sc, sched, drawn) if full else simulate_schedule(sched, drawn)
        out[i] = max(row[6] for row in raw.spans)
    return out


def _sample_message_driven(sc: Scenario, samples: int, seed: int, spread: Spread) -> np.ndarray:
    """AMPNet's one-step makespan with drawn durations: the engine ``simulate`` runs for it
    (``parsim.sim.ampnet``), asking the drawing table once per message it runs, so each draw
    can change the order the messages' arrival makes."""
    from parsim.simulate import simulate_message_driven_run
    rng = random.Random(seed)
    model = model_factors(spread.model, samples, random.Random(f"model:{seed}"))
    costs = ModelCosts.from_scenario(sc)
    out = np.empty(samples)
    for i in range(samples):
        run = simulate_message_driven_run(sc, SampledCosts(costs, spread, rng, model[i]))
        out[i] = max(row[6] for row in run.raw.spans)
    return out


def band(sc: Scenario, metrics: dict, samples: int, seed: int = 0, spread: Spread | None = None,
         schedule: Schedule | None = None) -> dict:
    """P5/P50/P95 of step time and tokens per second over ``samples`` draws (JSON keys), with where
    the spread came from and its model-discrepancy sigma (``spread_model``, 0 when not stated);
    ``schedule`` as :func:`sample_step_times` takes it."""
    spread = spread or spread_for(sc)
    t = sample_step_times(sc, samples, seed, spread, schedule)
    p5, p50, p95 = (float(x) for x in np.percentile(t, [5, 50, 95]))
    tok = metrics["tokens_per_step"]
    return {"samples": samples, "seed": seed, "step_time_p5_s": p5, "step_time_p50_s": p50, "step_time_p95_s": p95,
            "tokens_per_s_p5": tok / p95, "tokens_per_s_p50": tok / p50, "tokens_per_s_p95": tok / p5,
            "spread_source": spread.source, "spread_model": spread.model}



def plan_bands(rows: list[dict], toml_of, samples: int, seed: int = 0) -> None:
    """``parsim plan --samples``: add each ranked row's band (its scenario from ``toml_of(row)``)."""
    import tomllib

    from parsim.scenario import scenario_from_dict
    for row in rows:
        sc = scenario_from_dict(tomllib.loads(toml_of(row)), "parsim plan")
        row.update(band(sc, row, samples, seed))


def plan_band_lines(rows: list[dict]) -> list[str]:
    """The bands under the plan's table: P5 .. P95 of step time per ranked row."""
    out = ["", f"90% band of step time ({rows[0]['samples']} samples per row, seed {rows[0]['seed']}):"] if rows else []
    for i, r in enumerate(rows, 1):
        out.append(f"  #{i}  P5 {r['step_time_p5_s']:.4g} s  P50 {r['step_time_p50_s']:.4g} s  "
                   f"P95 {r['step_time_p95_s']:.4g} s  (point {r['step_time_s']:.4g} s)")
    return out
