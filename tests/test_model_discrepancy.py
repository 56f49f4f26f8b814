"""The model discrepancy in the band: ``spread_model`` from validation records
(``parsim calibrate --validations``), drawn once per sample on every duration.

Oracles: with every other sigma zero, each sample is the point prediction times exp(sigma * z)
with z the seed's own normal sequence -- exactly, communication and links included (the engine
is linear in its durations); the sigma is the hand-computed split-conformal quantile of the
records' absolute log errors over 1.645, and its coverage of a new exchangeable error is the
closed form k / (n + 1) by brute force; a record that names its scenario is predicted again as
``parsim validate`` predicts it now; bad records and too few of them are one line, exit 2, and
leave the profile as it was.
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tomllib
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import pytest
from helpers import scenario

from parsim.calibrate.records import find_records, records_for, with_calibration
from parsim.calibrate.spread import model_discrepancy, step_error
from parsim.cluster.hardware import load_profile
from parsim.cluster.spread import Spread, spread_from_table, spread_of
from parsim.errors import ConfigError
from parsim.simulate import simulate
from parsim.uncertainty.band import sample_step_times

ROOT = Path(__file__).resolve().parent.parent
ZERO = Spread(**{f"{fam}_{kind}": 0.0 for fam in ("compute", "memory", "collective", "p2p")
                 for kind in ("repeat", "residual")}, speed=0.0, source="test")
RECORD_PROFILE = ROOT / "reports" / "validation" / "coverage" / "cpu-gloo.toml"


@pytest.mark.parametrize("sc", [scenario(pp=2, m=4, costs={"forward_s": 1.0, "backward_s": 2.0}),
                                scenario(pp=4, m=8, dp=2, tp=2)], ids=["compute-only", "pp4-dp2-tp2"])
def test_model_discrepancy_scales_every_duration_by_one_factor_per_sample(sc):
    point = simulate(sc).metrics["step_time_s"]
    sigma = 0.1
    t = sample_step_times(sc, 30, seed=7, spread=replace(ZERO, model=sigma))
    # the only factors: one per sample (every other sigma is zero), the lognormal's 30 strata in
    # the seed's order (parsim.uncertainty.band.model_factors)
    expect = [point * math.exp(sigma * NormalDist().inv_cdf((k + 0.5) / 30)) for k in range(30)]
    random.Random("model:7").shuffle(expect)
    assert list(t) == pytest.approx(expect, rel=1e-9)


def test_spread_model_is_read_from_the_calibration_table():
    sp = spread_from_table({"spread_model": 0.05, "spread_speed": 0.01}, "p.toml")
    assert sp.model == 0.05 and sp.speed == 0.01 and "model" in sp.source
    assert spread_from_table({}, "p.toml").model == 0.0


def test_discrepancy_is_the_conformal_quantile_of_the_log_errors_about_zero():
    errs = [step_error(1.0, [1.1, 1.1, 1.2]), step_error(2.0, [1.9]), step_error(1.0, [1.02, 0.9, 1.5])]
    assert errs == pytest.approx([math.log(1.1), math.log(0.95), math.log(1.02)])
    z = 1.6448536269514722  # the standard normal's 95th percentile
    # 3 records: rank ceil(4 * 0.9) = 4 > 3, so the largest |error|; a shared bias is not taken out
    assert model_discrepancy(errs) == round(math.log(1.1) / z, 4)
    assert model_discrepancy([0.1, 0.1, 0.1]) == round(0.1 / z, 4)
    # 19 records |e| = 0.01 .. 0.19 (signs mixed): rank ceil(20 * 0.9) = 18, the 18th smallest, 0.18
    e19 = [(-1) ** i * 0.01 * (i + 1) for i in range(19)]
    assert model_discrepancy(e19) == round(0.18 / z, 4)
    # 29: rank ceil(30 * 0.9) = 27
    assert model_discrepancy([0.01 * (i + 1) for i in range(29)]) == round(0.27 / z, 4)
    assert model_discrepancy([]) == 0.0


def test_conformal_quantile_covers_a_new_exchangeable_error_k_over_n_plus_1():
    """Brute force: n errors and one more drawn alike (heavy-tailed, biased); the new one lies
    within the quantile's 90% half-width k / (n + 1) of the time, k = ceil((n + 1) 0.9)."""
    rng = random.Random(3)
    n, trials, inside = 17, 20000, 0
    z = 1.6448536269514722
    for _ in range(trials):
        draws = [0.05 + rng.gauss(0, 1) * (0.3 if rng.random() < 0.2 else 0.03) for _ in range(n + 1)]
        half = model_discrepancy(draws[:n]) * z
        inside += abs(draws[n]) <= half + 5e-5  # the sigma is rounded to 4 places
    k = math.ceil((n + 1) * 0.9)
    assert abs(inside / trials - k / (n + 1)) < 0.01


def _record(d: Path, name: str, profile: str, predicted: float, measured: list[float]) -> Path:
    (d / name).mkdir(parents=True)
    f = d / name / "comparison.json"
    f.write_text(json.dumps({"scenario": name, "hardware_file": profile, "predicted": {"step_time_s": predicted},
                             "measured": {"step_time_all_s": measured}}))
    return f


def _cli(*args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "parsim", "calibrate", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)


def test_calibrate_validations_writes_spread_model_into_the_profile(tmp_path):
    prof = tmp_path / "prof" / "cpu-gloo.toml"
    prof.parent.mkdir()
    shutil.copy(RECORD_PROFILE, prof)
    recs = tmp_path / "records"
    # hardware_file as the runs named it: relative to where they ran (tmp_path)
    _record(recs, "a", "prof/cpu-gloo.toml", 0.100, [0.110, 0.108, 0.112])
    _record(recs, "b", "prof/cpu-gloo.toml", 0.200, [0.190, 0.189, 0.191])
    _record(recs, "c", "prof/cpu-gloo.toml", 0.050, [0.051, 0.051])
    run = _cli("--validations", str(recs), "--profile", str(prof), cwd=ROOT)  # run from elsewhere
    assert run.returncode == 0, run.stderr
    # |errors| log 1.1, log 0.95, log 1.02 (the records name no scenario: their own predictions);
    # 3 records, so the largest
    want = round(math.log(1.1) / 1.6448536269514722, 4)
    cal = tomllib.loads(prof.read_text())["calibration"]
    assert cal["spread_model"] == want and cal["spread_model_records"] == 3
    assert spread_of(load_profile(str(prof))).model == want
    # the rest of the calibration table is kept, and a second fold replaces rather than repeats
    assert cal["spread_speed"] == tomllib.loads(RECORD_PROFILE.read_text())["calibration"]["spread_speed"]
    _record(recs, "d", "prof/cpu-gloo.toml", 0.100, [0.130])
    assert _cli("--validations", str(recs), cwd=tmp_path).returncode == 0  # the profile the records name
    text = prof.read_text()
    assert text.count("spread_model =") == 1
    assert tomllib.loads(text)["calibration"]["spread_model_records"] == 4


def test_calibrate_validations_refuses_in_one_line_and_writes_nothing(tmp_path):
    prof = tmp_path / "p.toml"
    shutil.copy(RECORD_PROFILE, prof)
    before = prof.read_bytes()
    recs = tmp_path / "r"
    _record(recs, "a", str(prof), 0.1, [0.11])
    _record(recs, "b", str(prof), 0.1, [0.09])
    too_few = _cli("--validations", str(recs), cwd=tmp_path)
    assert too_few.returncode == 2 and "at least 3" in too_few.stderr and "Traceback" not in too_few.stderr
    assert len(too_few.stderr.strip().splitlines()) == 1
    _record(recs, "c", "elsewhere.toml", 0.1, [0.1])
    several = _cli("--validations", str(recs), cwd=tmp_path)
    assert several.returncode == 2 and "--profile" in several.stderr
    bad = recs / "c" / "comparison.json"
    bad.write_text(json.dumps({"hardware_file": str(prof), "predicted": {"step_time_s": -1},
                               "measured": {"step_time_all_s": [0.1]}}))
    neg = _cli("--validations", str(recs), "--profile", str(prof), cwd=tmp_path)
    assert neg.returncode == 2 and "predicted.step_time_s" in neg.stderr and str(bad) in neg.stderr
    bad.write_text("{not json")
    garbled = _cli("--validations", str(recs), "--profile", str(prof), cwd=tmp_path)
    assert garbled.returncode == 2 and "not JSON" in garbled.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    none = _cli("--validations", str(empty), "--profile", str(prof), cwd=tmp_path)
    assert none.returncode == 2 and "no comparison.json" in none.stderr
    stray = _cli("--profile", str(prof), cwd=tmp_path)
    assert stray.returncode == 2 and "--validations" in stray.stderr
    assert prof.read_bytes() == before


def test_records_on_file_name_the_profile_they_were_predicted_with():
    recs = find_records([ROOT / "reports" / "validation" / "coverage"])
    mine = records_for(recs, RECORD_PROFILE)
    assert len(mine) == len(recs) >= 3  # every coverage record was predicted with the coverage profile
    assert records_for(recs, ROOT / "reports" / "validation" / "cpu-gloo.toml") == []


def test_with_calibration_creates_the_table_and_refuses_non_toml():
    text = with_calibration('name = "x"\n', {"spread_model": 0.1, "spread_model_source": 'a "b"'}, "x.toml")
    assert tomllib.loads(text)["calibration"] == {"spread_model": 0.1, "spread_model_source": 'a "b"'}
    with pytest.raises(ConfigError, match="not TOML"):
        with_calibration("name = \n", {"spread_model": 0.1}, "x.toml")


def test_simulate_samples_states_the_discrepancy_it_drew(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "parsim", "simulate", "scenarios/tiny-cpu.toml", "--samples", "20",
            "--set", f'hardware="{RECORD_PROFILE}"']
    out = subprocess.run([*args, "--json"], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    stated = tomllib.loads(RECORD_PROFILE.read_text())["calibration"]["spread_model"]
    assert json.loads(out.stdout)["spread_model"] == stated > 0
    text = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert f"model discrepancy sigma {stated:.3f} included" in text


def test_with_calibration_finds_a_commented_header_and_leaves_other_tables_alone():
    text = 'name = "x"\n[calibration]  # fitted\nspread_model = 0.2\nother = 1\n[[runs]]\nspread_model = 7\n'
    got = tomllib.loads(with_calibration(text, {"spread_model": 0.1}, "x.toml"))
    assert got["calibration"] == {"spread_model": 0.1, "other": 1} and got["runs"] == [{"spread_model": 7}]


def test_records_naming_their_scenario_are_predicted_again_as_validate_predicts(tmp_path):
    """Three records whose stored prediction is stale (1 s): the fold uses what ``parsim
    validate`` (``plan_validation``, the prediction it compares against) predicts for the same
    scenario, overrides and profile today."""
    pytest.importorskip("torch")
    from parsim.cli.validate import plan_validation

    prof = tmp_path / "cpu-gloo.toml"
    shutil.copy(RECORD_PROFILE, prof)
    recs = tmp_path / "records"
    cases = {"1f1b": [], "gpipe": ["schedule.name=GPipe"], "zbh1": ["schedule.name=ZBH1"]}
    measured = {"1f1b": 0.140, "gpipe": 0.150, "zbh1": 0.120}
    errors = []
    for name, ov in cases.items():
        f = _record(recs, name, str(prof), 1.0, [measured[name]])
        d = json.loads(f.read_text())
        d.update(scenario_file="scenarios/tiny-cpu.toml", overrides=ov, backend="gloo", recv="early")
        f.write_text(json.dumps(d))
        now = plan_validation(str(ROOT / "scenarios" / "tiny-cpu.toml"), ov, "gloo", str(prof))
        errors.append(math.log(measured[name] / now.predicted.metrics["step_time_s"]))
    run = _cli("--validations", str(recs), "--profile", str(prof), cwd=ROOT)
    assert run.returncode == 0, run.stderr
    cal = tomllib.loads(prof.read_text())["calibration"]
    assert cal["spread_model"] == model_discrepancy(errors)
    assert cal["spread_model"] != model_discrepancy([math.log(measured[n] / 1.0) for n in cases])
    assert "each predicted again with today's model" in cal["spread_model_source"]
    assert run.stdout.count("(today)") == 3


def test_a_record_with_a_malformed_scenario_field_is_one_line(tmp_path):
    recs = tmp_path / "records"
    f = _record(recs, "a", "prof.toml", 0.1, [0.1])
    d = json.loads(f.read_text())
    d["overrides"] = "schedule.name=GPipe"  # a string, not a list
    f.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="overrides"):
        find_records([recs])


def test_oversubscribed_records_are_set_aside(tmp_path):
    prof = tmp_path / "cpu-gloo.toml"
    shutil.copy(RECORD_PROFILE, prof)
    recs = tmp_path / "records"
    for name, pred, meas in (("a", 0.10, 0.11), ("b", 0.20, 0.19), ("c", 0.05, 0.051), ("over", 0.10, 0.20)):
        f = _record(recs, name, str(prof), pred, [meas])
        d = json.loads(f.read_text())
        d.update(world=4 if name == "over" else 2, cpu_count=2, backend="gloo")
        f.write_text(json.dumps(d))
    run = _cli("--validations", str(recs), "--profile", str(prof), cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "over" in run.stdout and "set aside" in run.stdout
    cal = tomllib.loads(prof.read_text())["calibration"]
    # a, b, c only: log 1.1, log 0.95, log 1.02 -> the largest (3 records)
    assert cal["spread_model_records"] == 3
    assert cal["spread_model"] == round(math.log(1.1) / 1.6448536269514722, 4)
    (recs / "c" / "comparison.json").unlink()  # two left beside the oversubscribed one: too few
    before = prof.read_text()
    run = _cli("--validations", str(recs), "--profile", str(prof), cwd=ROOT)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1 and prof.read_text() == before


def test_a_record_names_its_scenario_relative_to_where_it_ran(tmp_path, monkeypatch):
    from parsim.cli.validate import _as_run
    (tmp_path / "scenarios").mkdir()
    f = tmp_path / "scenarios" / "x.toml"
    f.write_text("")
    monkeypatch.chdir(tmp_path)
    assert _as_run(str(f)) == str(Path("scenarios") / "x.toml")  # absolute, under the cwd: relative
    assert _as_run("scenarios/x.toml") == str(Path("scenarios") / "x.toml")
    outside = str(tmp_path.parent / "elsewhere.toml")
    assert _as_run(outside) == outside  # not under the cwd: as given
