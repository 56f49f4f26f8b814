"""The GPU profiles' model discrepancy from the held-out published runs (benchmarks/heldout_band.py,
``[calibration] spread_model`` / ``spread_model_moe``).

Oracles: hand-computed conformal quantiles and coverage counts on made-up rows, the split's
definition, and the profiles' own tables (what ``--samples`` draws for a dense and an MoE job).
"""
from __future__ import annotations

import math
import sys
from dataclasses import replace

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import heldout_band as hb

from parsim.calibrate.spread import Z_BAND
from parsim.cluster.hardware import load_profile
from parsim.cluster.spread import spread_of
from parsim.scenario import load_scenario
from parsim.uncertainty.band import sample_step_times, spread_for


def _row(rid: str, error: float) -> dict:
    return {"id": rid, "error": error}


def test_step_error_is_the_log_of_predicted_over_published():
    # predicted 1.25x the published throughput: the run's step was 1.25x the predicted one
    assert hb.step_error(_row("a", 0.25)) == pytest.approx(math.log(1.25), rel=1e-12)


def test_split_alternates_rows_sorted_by_id():
    rows = [_row(i, 0.0) for i in ("d", "a", "c", "b", "e")]
    fit, held = hb.split(rows)
    assert [r["id"] for r in fit] == ["a", "c", "e"] and [r["id"] for r in held] == ["b", "d"]


def test_coverage_counts_the_rows_inside_the_90_percent_range():
    sigma = 0.1  # 90% range: |log error| <= 0.1645
    rows = [_row("a", math.exp(0.16) - 1), _row("b", math.exp(-0.16) - 1), _row("c", math.exp(0.17) - 1)]
    assert hb.covered(rows, sigma) == 2


def test_the_fit_is_the_conformal_quantile_of_the_fit_half():
    # ten fit rows with |log error| 0.01 .. 0.10: ceil(11 x 0.9) = 10th smallest = 0.10
    from parsim.calibrate.spread import model_discrepancy
    errs = [0.01 * k for k in range(1, 11)]
    assert model_discrepancy(errs) == pytest.approx(round(0.10 / Z_BAND, 4))


@pytest.mark.parametrize("scenario, key", [("scenarios/llama3-70b-h100.toml", "model"),
                                            ("scenarios/mixtral-8x7b-h100.toml", "model_moe")])
def test_a_job_draws_the_discrepancy_of_what_it_trains(scenario, key):
    sc = load_scenario(scenario)
    stated = spread_of(load_profile("dgx-h100"))
    assert stated.model > 0 and stated.model_moe > stated.model  # MoE runs miss by more
    assert spread_for(sc).model == getattr(stated, key)


def test_profiles_state_one_discrepancy_per_generation():
    for gen, profiles in hb.GENERATIONS.items():
        values = {(spread_of(load_profile(p)).model, spread_of(load_profile(p)).model_moe) for p in profiles}
        assert len(values) == 1, gen
    assert spread_of(load_profile("cpu-gloo")).model == 0.0  # a CPU profile: its validation records say


def test_the_discrepancy_widens_the_band_and_does_not_move_it():
    sc = load_scenario("scenarios/llama3-70b-h100.toml", ["parallel.pp=2", "gpus=32", "training.global_batch=16"])
    with_model = sample_step_times(sc, 200, seed=3)
    without = sample_step_times(sc, 200, seed=3, spread=replace(spread_for(sc), model=0.0))
    width = lambda t: np.percentile(t, 95) / np.percentile(t, 5)
    assert width(with_model) > width(without)
    # the drawn factor is about one: the median moves by much less than the band is wide
    assert abs(math.log(np.median(with_model) / np.median(without))) < 0.25 * math.log(width(with_model))


def test_model_factors_are_the_lognormal_quantiles_in_a_seeded_order():
    import random
    from statistics import NormalDist

    from parsim.uncertainty.band import model_factors
    f = model_factors(0.3, 201, random.Random(7))
    want = [math.exp(0.3 * NormalDist().inv_cdf((k + 0.5) / 201)) for k in range(201)]
    assert sorted(f) == pytest.approx(want, rel=1e-12)
    assert sorted(f)[100] == pytest.approx(1.0, abs=1e-12)  # the median stratum is the point
    assert f != sorted(f) and f == model_factors(0.3, 201, random.Random(7))  # shuffled, the same seed the same order
    assert model_factors(0.0, 5, random.Random(0)) == [1.0] * 5


def test_write_puts_each_generations_fit_in_its_profiles(tmp_path):
    import shutil

    from parsim.cluster.hardware import load_profile
    from parsim.cluster.spread import spread_of
    for name in hb.GENERATIONS["ampere"]:
        shutil.copy(hb.PROFILE_DIR / f"{name}.toml", tmp_path / f"{name}.toml")
    b = {("ampere", "dense"): {"profiles": hb.GENERATIONS["ampere"], "sigma": 0.12345, "fit": 7, "held": 6,
                               "covered_held": 5}}
    hb.write_profiles(b, tmp_path)
    for name in hb.GENERATIONS["ampere"]:
        text = (tmp_path / f"{name}.toml").read_text()
        assert "on 7 held-out rows of" in text and "; 5 of the other 6 inside" in text
        assert spread_of(load_profile(str(tmp_path / f"{name}.toml"))).model == pytest.approx(0.1235)
