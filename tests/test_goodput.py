"""parsim goodput: the whole run under failures (Monte Carlo) against closed forms and published figures.

Oracles: Young's interval sqrt(2 delta M) and Daly's optimum and expected wall time
M e^{R/M}(e^{(tau+delta)/M} - 1) W / tau (J. T. Daly, FGCS 22, 2006); the mean work lost per
failure E[X | X < L]; Llama 3's 419 unexpected interruptions in 54 days on 16,384 H100 with > 90%
effective training time; BLOOM's 3-hour checkpoint interval (tests/data/reliability.json).
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from parsim.goodput.montecarlo import (
    RunModel,
    daly_expected_time,
    daly_interval,
    expected_lost_per_failure,
    simulate_runs,
    young_interval,
)
from parsim.goodput.run import goodput
from parsim.scenario import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parent.parent
RELIABILITY = {e["id"]: e for e in json.loads((ROOT / "tests" / "data" / "reliability.json").read_text())}
HOUR, DAY = 3600.0, 86400.0


def synthetic(faults: dict, gpus: int = 8):
    """A job whose step is exactly 10 s: [costs] forward 4 s + backward 6 s, one microbatch, pp = 1."""
    doc = {"name": "synthetic", "hardware": "dgx-h100", "gpus": gpus,
           "model": {"name": "t", "n_layers": 2, "d_model": 256, "n_heads": 8, "n_kv_heads": 8, "d_ff": 1024,
                     "vocab_size": 1000, "ffn": "gelu", "norm": "layernorm", "bias": True, "position": "learned",
                     "max_seq_len": 512},
           "training": {"global_batch": gpus, "seq_len": 512}, "parallel": {"dp": gpus},
           "costs": {"forward_s": 4.0, "backward_s": 6.0}, "faults": faults}
    return scenario_from_dict(doc, "synthetic.toml")


def test_closed_forms_by_hand():
    # delta = 5 min, M = 10 h: Young sqrt(2 * 300 * 36000) = 4647.6 s; Daly's correction below it
    assert young_interval(300, 36000) == pytest.approx(4647.58, abs=0.01)
    x = 300 / 72000
    assert daly_interval(300, 36000) == pytest.approx(4647.58 * (1 + math.sqrt(x) / 3 + x / 9) - 300, rel=1e-6)
    assert daly_interval(100, 40) == 40  # delta >= 2M: Daly's rule gives M
    # no failures in the limit M -> inf: wall time = W (tau + delta) / tau
    assert daly_expected_time(3600, 600, 60, 100, 1e15) == pytest.approx(3600 * 660 / 600, rel=1e-6)
    assert expected_lost_per_failure(3 * HOUR, 0, 1e12) == pytest.approx(1.5 * HOUR, rel=1e-6)


def test_monte_carlo_reproduces_daly_expected_time():
    M, d, R = 10 * HOUR, 300.0, 600.0
    tau = daly_interval(d, M)
    W = 400 * tau
    runs = simulate_runs(RunModel(W, M, d, R), [tau], 400, 3)
    mean, se = runs.wall_s.mean(), runs.wall_s.std() / math.sqrt(400)
    assert abs(mean - daly_expected_time(W, tau, d, R, M)) < 3 * se
    # failures: Poisson over the wall time (training, checkpoints and restarts)
    assert runs.failures.mean() == pytest.approx(mean / M, rel=0.02)


def test_goodput_on_a_synthetic_job_matches_young_and_the_expected_waste():
    # 8 GPUs of 222.2 h MTBF: job MTBF 1e5 s; delta 600 s; R 1,800 s; 5e6 s of training: ~55 failures
    sc = synthetic({"gpu_mtbf_hours": 8e5 / HOUR, "checkpoint_write_s": 600, "restart_s": 1800,
                    "checkpoint_interval_s": 10000})
    g = goodput(sc, train_tokens=8 * 512 * 500_000, samples=400, seed=1)  # 500,000 steps of 10 s
    M = 1e5
    assert g["mtbf_s"] == pytest.approx(M)
    assert g["young_interval_s"] == pytest.approx(math.sqrt(2 * 600 * M))
    assert g["checkpoint_interval_s"] == 10000  # whole steps of 10 s
    W = 5e6
    expected = daly_expected_time(W, 10000, 600, 1800, M)
    assert g["time_to_train_daly_s"] == pytest.approx(expected)
    assert g["time_to_train_s"] == pytest.approx(expected, rel=0.01)
    assert g["ettr"] == pytest.approx(W / expected, rel=0.01)
    assert g["time_to_train_p5_s"] < g["time_to_train_p50_s"] < g["time_to_train_p95_s"]


def test_simulated_optimum_within_10_percent_of_daly():
    sc = synthetic({"gpu_mtbf_hours": 80, "checkpoint_write_s": 300, "restart_s": 600}, gpus=8)  # M = 10 h
    g = goodput(sc, train_tokens=8 * 512 * 200_000, samples=300, seed=2)  # 2e6 s of training: ~60 failures
    assert g["checkpoint_interval_auto"]
    assert g["best_interval_s"] == pytest.approx(g["daly_interval_s"], rel=0.10)
    assert g["checkpoint_interval_s"] == pytest.approx(g["best_interval_s"], abs=10.0)  # rounded to a step


def test_llama3_405b_16k_h100_keeps_ettr_above_90_percent():
    ref = RELIABILITY["llama3-405b-54day-interruptions"]
    sc = load_scenario(ROOT / "scenarios" / "llama3-405b-16k-faults.toml")
    assert sc.faults.gpu_mtbf_hours == pytest.approx(ref["derived"]["gpu_mtbf_hours"], rel=1e-3)
    first = goodput(sc, train_tokens=1e12, samples=50, seed=0)
    # tokens of the 54-day snapshot at this ETTR: its wall time is 54 days
    tokens_per_s = 1e12 / first["useful_time_s"]
    g = goodput(sc, train_tokens=54 * DAY * first["ettr"] * tokens_per_s, samples=100, seed=0)
    assert g["time_to_train_s"] == pytest.approx(54 * DAY, rel=0.02)
    assert g["expected_failures"] == pytest.approx(ref["expected"]["unexpected"], rel=0.05)
    assert g["ettr"] > ref["expected"]["effective_training_time_ratio_min"]
    # the checkpoint the paper's scale implies: 405B x 14 bytes (bf16 weights, fp32 master, Adam m, v) at 2 TB/s
    assert g["checkpoint_write_s"] == pytest.approx(405.8e9 * 14 / 2e12, rel=0.02)


def test_bloom_3_hour_interval_loses_about_1_5_hours_per_crash():
    ref = RELIABILITY["bloom-176b-checkpoint-interval"]
    tau = ref["inputs"]["checkpoint_interval_hours"] * HOUR
    doc = {"name": "bloom", "hardware": "dgx-a100-80g", "gpus": 384, "model": {"preset": "bloom-176b"},
           "training": {"global_batch": 2048, "seq_len": 2048, "microbatch_size": 2},
           "parallel": {"tp": 4, "pp": 12, "dp": 8, "zero": 1},
           "faults": {"gpu_mtbf_hours": RELIABILITY["llama3-405b-54day-interruptions"]["derived"]["gpu_mtbf_hours"],
                      "checkpoint_interval_s": tau, "checkpoint_write_s": 60, "restart_s": 1800,
                      "spare_nodes": 4, "node_repair_hours": 24}}
    sc = scenario_from_dict(doc, "bloom.toml")
    g = goodput(sc, train_tokens=366e9, samples=200, seed=0)
    assert g["checkpoint_interval_s"] == pytest.approx(tau, rel=0.01)
    assert g["lost_work_per_failure_s"] / HOUR == pytest.approx(ref["expected"]["lost_work_per_crash_hours"], rel=0.05)
    assert g["lost_work_per_failure_s"] == pytest.approx(g["lost_work_per_failure_closed_form_s"], rel=0.05)


def test_spares_exhausted_make_the_job_wait():
    base = {"gpu_mtbf_hours": 80, "checkpoint_write_s": 300, "restart_s": 600, "checkpoint_interval_s": 3000}
    free = goodput(synthetic(base), train_tokens=8 * 512 * 100_000, samples=100, seed=4)
    none = goodput(synthetic({**base, "spare_nodes": 0, "node_repair_hours": 2}), train_tokens=8 * 512 * 100_000,
                   samples=100, seed=4)
    assert free["spare_wait_s"] == 0
    # no spare: every failure waits the 2 h repair (and more failures strike while it does not: none while waiting)
    assert none["spare_wait_s"] == pytest.approx(none["expected_failures"] * 2 * HOUR, rel=1e-9)
    assert none["time_to_train_s"] > free["time_to_train_s"]


def test_same_seed_same_numbers():
    sc = synthetic({"gpu_mtbf_hours": 80, "checkpoint_write_s": 300, "restart_s": 600})
    a = goodput(sc, train_tokens=8 * 512 * 10_000, samples=50, seed=7)
    b = goodput(sc, train_tokens=8 * 512 * 10_000, samples=50, seed=7)
    assert a == b


ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_cli_json_fields():
    out = subprocess.run([sys.executable, "-m", "parsim", "goodput", "scenarios/llama3-405b-16k-faults.toml",
                          "--train-tokens", "1e12", "--samples", "20", "--json"], cwd=ROOT, env=ENV,
                         capture_output=True, text=True, check=True)
    g = json.loads(out.stdout)
    for k in ("ettr", "expected_failures", "time_to_train_s", "checkpoint_interval_s", "young_interval_s"):
        assert isinstance(g[k], float)
    text = subprocess.run([sys.executable, "-m", "parsim", "goodput", "scenarios/llama3-405b-16k-faults.toml",
                           "--train-tokens", "1e12", "--samples", "20"], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, check=True).stdout
    assert "ETTR" in text and "Young" in text


@pytest.mark.parametrize("args, needle", [
    (["scenarios/tiny-cpu.toml"], "faults: missing [faults] table"),
    (["scenarios/llama3-405b-16k-faults.toml", "--set", "faults.mtbf=3"], "faults.mtbf: unknown key"),
    (["scenarios/llama3-405b-16k-faults.toml", "--set", "faults.checkpoint_write_s=30"], "faults.checkpoint_write_s"),
    (["scenarios/llama3-405b-16k-faults.toml", "--set", "faults.gpu_mtbf_hours=-1"], "faults.gpu_mtbf_hours"),
    (["scenarios/llama3-405b-16k-faults.toml", "--set", "faults.checkpoint_interval_s=\"often\""],
     "faults.checkpoint_interval_s"),
    (["scenarios/llama3-405b-16k-faults.toml", "--set", "faults.spare_nodes=2"], "faults.node_repair_hours"),
])
def test_bad_faults_one_line_exit_2(args, needle):
    r = subprocess.run([sys.executable, "-m", "parsim", "goodput", *args, "--train-tokens", "1e9"], cwd=ROOT,
                       env=ENV, capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
