"""parsim simulate --samples: prediction intervals from the profile's spread (Monte Carlo in the fast engine).

Oracles: a spread of zero gives the deterministic step exactly; a device-speed spread alone scales
the whole step by one lognormal factor (so log(step / point) has that sigma); the calibration's
pass/noise split recovers a synthetic table's speed and noise; the bundled calibrated profile's
residual spread is read back.
"""
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import scenario

from parsim.calibrate.spread import pass_spread, robust_sigma, spread_table
from parsim.cluster.spread import DEFAULT_SPREAD, Spread, spread_of
from parsim.scenario import load_scenario
from parsim.simulate import simulate
from parsim.uncertainty.band import band, sample_step_times

ROOT = Path(__file__).resolve().parent.parent
ZERO = Spread(**{f"{fam}_{kind}": 0.0 for fam in ("compute", "memory", "collective", "p2p")
                 for kind in ("repeat", "residual")}, speed=0.0, source="test")


def test_samples_200_on_a_bundled_scenario_band_around_the_point():
    sc = load_scenario(ROOT / "scenarios" / "llama3-70b-h100.toml")
    mx = simulate(sc).metrics
    b = band(sc, mx, samples=200, seed=0)
    assert b["step_time_p5_s"] < b["step_time_p50_s"] < b["step_time_p95_s"]
    assert b["step_time_p50_s"] == pytest.approx(mx["step_time_s"], rel=0.01)
    assert b["tokens_per_s_p5"] < b["tokens_per_s_p50"] < b["tokens_per_s_p95"]
    assert b["tokens_per_s_p50"] == pytest.approx(mx["tokens_per_step"] / b["step_time_p50_s"])
    assert "Sinha" in b["spread_source"]  # dgx-h100 states no spread: the documented default


def test_zero_spread_is_the_deterministic_step():
    sc = scenario(pp=4, m=8, dp=2, tp=2)
    t = sample_step_times(sc, 3, seed=1, spread=ZERO)
    assert list(t) == [simulate(sc).metrics["step_time_s"]] * 3


def test_speed_spread_scales_the_whole_step_by_one_lognormal():
    # [costs]: every duration is compute (no communication): the step is the point times the speed factor
    sc = scenario(pp=2, m=4, costs={"forward_s": 1.0, "backward_s": 2.0})
    point = simulate(sc).metrics["step_time_s"]
    sigma = 0.1
    t = sample_step_times(sc, 400, seed=3, spread=replace(ZERO, speed=sigma))
    x = np.log(t / point)
    assert abs(x.mean()) < 3 * sigma / math.sqrt(400)
    assert x.std() == pytest.approx(sigma, rel=0.1)


def test_token_slices_are_sampled_as_simulate_runs_them():
    """TeraPipe: the band is drawn around the sliced schedule simulate() runs (before, the samples
    ran the unsliced schedule: P50 10x the point); with no spread it is that step exactly."""
    sc = load_scenario(ROOT / "scenarios" / "gpt3-175b-terapipe-p3.toml", ["schedule.token_slices=4"])
    point = simulate(sc).metrics["step_time_s"]
    assert list(sample_step_times(sc, 2, seed=0, spread=ZERO)) == pytest.approx([point] * 2, rel=1e-12)
    t = sample_step_times(sc, 20, seed=0)
    assert np.median(t) == pytest.approx(point, rel=0.02) and t.min() < t.max()


def test_message_driven_amp_net_is_sampled_in_its_own_engine():
    """AMPNet's band comes from its message-driven engine (the order re-made by every draw): with
    no spread every sample is the point prediction exactly; with the spread P5 < P50 < P95, P50
    within 1% of the point, and the same seed gives the same numbers."""
    sc = load_scenario(ROOT / "scenarios" / "ampnet-gpt2-a100.toml")
    point = simulate(sc).metrics["step_time_s"]
    assert list(sample_step_times(sc, 3, seed=0, spread=ZERO)) == pytest.approx([point] * 3, rel=1e-12)
    t = sample_step_times(sc, 100, seed=1)
    p5, p50, p95 = np.percentile(t, [5, 50, 95])
    assert p5 < p50 < p95 and p50 == pytest.approx(point, rel=0.01)
    assert (t == sample_step_times(sc, 100, seed=1)).all()


def test_same_seed_same_numbers_other_seed_other_numbers():
    sc = scenario(pp=2, m=4)
    a, b = sample_step_times(sc, 20, seed=5), sample_step_times(sc, 20, seed=5)
    assert (a == b).all()
    assert not (a == sample_step_times(sc, 20, seed=6)).all()


def test_pass_spread_separates_machine_speed_from_noise():
    rng = np.random.default_rng(0)
    base = rng.uniform(1e-4, 1e-2, size=(60, 1))
    speed = np.exp(0.2 * rng.standard_normal((1, 21)))
    noise = np.exp(0.03 * rng.standard_normal((60, 21)))
    repeat, s = pass_spread(base * speed * noise)
    assert s == pytest.approx(0.2, rel=0.35)  # 21 passes: the estimate of a spread from 21 draws
    assert np.median(repeat) == pytest.approx(0.03, rel=0.2)
    assert robust_sigma([0.1, -0.1, 0.1]) == pytest.approx(0.14826)


def test_calibrated_profile_keeps_its_fit_residuals():
    import pandas as pd
    prof = ROOT / "parsim" / "cluster" / "profiles" / "calibrated" / "cpu-gloo.toml"
    table = spread_table(pd.read_csv(prof.with_suffix(".csv")))
    sc = load_scenario(ROOT / "scenarios" / "tiny-cpu.toml", ["hardware=\"calibrated/cpu-gloo\""])
    sp = spread_of(sc.hardware)
    for key, v in table.items():
        assert getattr(sp, key.removeprefix("spread_")) == v
    # the repeat noise and the speed drift this calibration recorded are the profile's, not the default
    import tomllib
    cal = tomllib.loads(prof.read_text())["calibration"]
    assert sp.compute_repeat == cal["spread_compute_repeat"] != DEFAULT_SPREAD.compute_repeat
    assert sp.speed == cal["spread_speed"]


def test_cli_samples_json_and_summary():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/tiny-cpu.toml", "--samples", "50",
                          "--json"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    mx = json.loads(out.stdout)
    assert mx["step_time_p5_s"] < mx["step_time_p50_s"] < mx["step_time_p95_s"]
    text = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/tiny-cpu.toml", "--samples", "50"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert "90% band" in text
    bad = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/tiny-cpu.toml", "--samples", "0"],
                         cwd=ROOT, env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "--samples" in bad.stderr


def test_band_covers_90_percent_of_steps_drawn_from_the_same_spread():
    # the well-specified case: "measurements" drawn from the very distribution the band states
    sc = load_scenario(ROOT / "scenarios" / "tiny-cpu.toml", ["hardware=\"calibrated/cpu-gloo\""])
    b = band(sc, simulate(sc).metrics, samples=200, seed=0)
    measured = sample_step_times(sc, 400, seed=1)
    inside = np.mean((measured >= b["step_time_p5_s"]) & (measured <= b["step_time_p95_s"]))
    assert inside == pytest.approx(0.90, abs=0.05)


def test_run_report_shows_the_band(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/tiny-cpu.toml", "--samples", "20",
                    "--out", str(tmp_path / "r")], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert "step time 90% band (P5 .. P95, P50)" in (tmp_path / "r" / "report.md").read_text()
    assert "step_time_p95_s" in json.loads((tmp_path / "r" / "result.json").read_text())


def test_band_follows_the_stragglers_the_fast_engine_runs():
    plain = load_scenario(ROOT / "scenarios" / "tiny-cpu.toml")
    slow = load_scenario(ROOT / "scenarios" / "tiny-cpu.toml", ["stragglers.gpus=[[1, 1.5]]"])
    point, slow_point = simulate(plain).metrics["step_time_s"], simulate(slow).metrics
    b = band(slow, slow_point, samples=100, seed=0)
    assert b["step_time_p50_s"] == pytest.approx(slow_point["step_time_s"], rel=0.01)
    assert b["step_time_p5_s"] > point  # the band is the straggler's, not the uniform job's


def test_plan_samples_adds_each_rows_band():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "parsim", "plan", "--model", "llama3-8b", "--hardware", "dgx-h100",
                          "--gpus", "16", "--global-batch", "32", "--seq-len", "4096", "--top", "2", "--samples", "20",
                          "--workers", "1", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    assert len(rows) == 2
    for r in rows:
        assert r["step_time_p5_s"] < r["step_time_p50_s"] < r["step_time_p95_s"]
        assert r["step_time_p50_s"] == pytest.approx(r["step_time_s"], rel=0.02)


def test_full_mode_band_samples_every_replica_and_its_stragglers():
    from helpers import TINY_GPT

    from parsim.scenario import scenario_from_dict
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": 16, "model": {**TINY_GPT, "n_layers": 8},
           "training": {"global_batch": 16, "seq_len": 512}, "parallel": {"pp": 2, "dp": 8},
           "schedule": {"name": "1F1B"}, "simulation": {"mode": "full"}, "stragglers": {"gpus": [[9, 1.5]]}}
    sc = scenario_from_dict(doc, "t.toml")
    mx = simulate(sc).metrics
    b = band(sc, mx, samples=40, seed=0)
    assert b["step_time_p5_s"] < b["step_time_p50_s"] < b["step_time_p95_s"]
    assert b["step_time_p50_s"] == pytest.approx(mx["step_time_s"], rel=0.01)  # the straggler in replica 4 included
    assert list(sample_step_times(sc, 2, seed=0, spread=ZERO)) == [mx["step_time_s"]] * 2
