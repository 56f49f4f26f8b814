"""A synchronous job at its slowest chip's clock (``parsim.cluster.pace``, ``device.msmf_chip_range_*``).

Oracles: the closed forms of the expected maximum of 2 and 3 standard normals, brute force
(Monte Carlo over drawn chips), the measured ranges the profiles cite (stas00/ml-engineering:
4.5% across an H200 node, 10.4% across a B200 node, 8 GPUs x 5 rounds), and the engines' own
structure (a compute-bound kernel slows with the clock; memory-bound work does not).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tomllib

import numpy as np
import pytest

from parsim.cluster.hardware import PROFILE_DIR, load_profile, parse_profile
from parsim.cluster.pace import chip_sigma, expected_max_normal, slowest_chip_share
from parsim.costs.inputs import cost_inputs
from parsim.errors import ConfigError
from parsim.scenario import load_scenario

H200_RANGE, B200_RANGE = 0.045, 0.104


def test_expected_maximum_matches_its_closed_forms():
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-9)
    assert expected_max_normal(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-9)


@pytest.mark.parametrize("n", [8, 64, 1000])
def test_expected_maximum_matches_brute_force(n):
    draws = np.random.default_rng(n).standard_normal((20000, n)).max(axis=1)
    assert expected_max_normal(n) == pytest.approx(draws.mean(), abs=5 * draws.std() / math.sqrt(len(draws)))


def test_expected_maximum_grows_with_the_job():
    values = [expected_max_normal(n) for n in (1, 2, 8, 64, 512, 4096, 32768, 262144)]
    assert values == sorted(values) and values[-1] < 5.0  # ~sqrt(2 ln n): slowly


def test_sigma_read_from_a_range_gives_that_range_back():
    """chips drawn with the sigma read from a range of 8 span that range on average."""
    sigma = chip_sigma(H200_RANGE, 8)
    assert sigma == pytest.approx(H200_RANGE / (2 * 1.4236003), rel=1e-6)
    chips = 1 + sigma * np.random.default_rng(0).standard_normal((20000, 8))
    spans = chips.max(axis=1) - chips.min(axis=1)
    assert spans.mean() == pytest.approx(H200_RANGE, rel=0.01)


@pytest.mark.parametrize("n", [8, 48, 512])
def test_slowest_share_is_the_mean_slowest_of_drawn_chips(n):
    sigma = chip_sigma(B200_RANGE, 8)
    slowest = (1 + sigma * np.random.default_rng(n).standard_normal((20000, n))).min(axis=1)
    assert slowest_chip_share(sigma, n) == pytest.approx(slowest.mean(), abs=5 * slowest.std() / math.sqrt(20000))


@pytest.mark.parametrize("profile, spread", [
    ("dgx-h100", H200_RANGE), ("dgx-h200", H200_RANGE), ("dgx-h800", H200_RANGE), ("grand-teton-h100", H200_RANGE),
    ("dgx-b200", B200_RANGE), ("hgx-b200", B200_RANGE), ("gb200-nvl72", B200_RANGE), ("gb300-nvl72", B200_RANGE),
])
def test_profiles_pace_at_the_cited_spread(profile, spread):
    hw = load_profile(profile)
    base = hw.device.clock_ratio
    assert hw.device.paced_gpus == 1 and hw.paced(1) is hw
    for n in (8, 64, 4096):
        want = base * (1 - spread / (2 * expected_max_normal(8)) * expected_max_normal(n))
        assert hw.paced(n).device.clock_ratio == pytest.approx(want, rel=1e-12)
        assert hw.paced(n).device.burst().clock_ratio == 1.0  # a burst is one chip at boost


@pytest.mark.parametrize("profile", ["dgx-a100-80g", "dgx-a100-40g", "dgx2-v100", "cpu-gloo"])
def test_a_profile_without_a_measured_spread_is_not_paced(profile):
    hw = load_profile(profile)
    assert hw.paced(4096) is hw


def test_a_job_runs_at_the_slowest_of_all_its_gpus_unless_stragglers_draw_them():
    sc = load_scenario("scenarios/llama3-70b-h100.toml")
    assert cost_inputs(sc).hardware.device.paced_gpus == sc.gpus
    drawn = load_scenario("scenarios/llama3-70b-h100.toml", ["stragglers.gpu_sigma=0.02"])
    assert cost_inputs(drawn).hardware.device.paced_gpus == 1


def test_compute_bound_gemm_slows_with_the_job_and_an_hbm_bound_one_does_not():
    hw = load_profile("dgx-h100")
    one, many = hw.device, hw.paced(1024).device
    share = many.clock_ratio / one.clock_ratio
    big, lat = (8192, 8192, 8192), one.kernels.gemm_latency_s
    # all but the fixed launch-to-drain latency on the SM clock (0.1%: Stream-K re-chosen)
    assert (one.kernel_gemm_time(*big) - lat) / (many.kernel_gemm_time(*big) - lat) == pytest.approx(share, rel=1e-3)
    gemv = (1, 8192, 8192)  # a matrix-vector product: HBM-bound, HBM keeps its clock
    assert one.burst().kernel_gemm_plan(*gemv)["memory_bound"]
    assert many.kernel_gemm_time(*gemv) == pytest.approx(one.kernel_gemm_time(*gemv), rel=1e-12)


def test_kernel_cli_gives_the_slowest_of_n_beside_the_burst():
    def run(*extra):
        out = subprocess.run([sys.executable, "-m", "parsim", "kernel", "gemm", "8192", "8192", "8192",
                              "--hardware", "dgx-h100", "--json", *extra], capture_output=True, text=True, check=True)
        return json.loads(out.stdout)
    one, many = run(), run("--gpus", "1024")
    assert many["gpus"] == 1024 and one["gpus"] == 1
    assert many["time_s"] == one["time_s"]  # the headline is a burst
    hw = load_profile("dgx-h100")
    ratio = hw.device.clock_ratio / hw.paced(1024).device.clock_ratio
    assert many["sustained_time_s"] / one["sustained_time_s"] == pytest.approx(ratio, rel=0.01)


@pytest.mark.parametrize("change, key", [
    ({"msmf_chip_range_gpus": None}, "device.msmf_chip_range_pct"),   # one of the pair
    ({"msmf_chip_range_pct": None}, "device.msmf_chip_range_gpus"),
    ({"msmf_chip_range_pct": 0.0}, "device.msmf_chip_range_pct"),     # no spread is no key
    ({"msmf_chip_range_pct": 60.0}, "device.msmf_chip_range_pct"),    # half the mean or more: not a clock spread
    ({"msmf_chip_range_gpus": 1}, "device.msmf_chip_range_gpus"),     # a range needs two chips
])
def test_a_bad_chip_range_is_refused_naming_its_key(change, key):
    data = tomllib.loads((PROFILE_DIR / "dgx-h100.toml").read_text())
    for k, v in change.items():
        if v is None:
            del data["device"][k]
        else:
            data["device"][k] = v
    with pytest.raises(ConfigError) as err:
        parse_profile(data, "h.toml")
    assert err.value.line().startswith("h.toml") and key in err.value.line()


def test_simulate_states_the_clock_it_ran_the_compute_at():
    from parsim.simulate import simulate
    sc = load_scenario("scenarios/llama3-70b-h100.toml")
    cc = simulate(sc).metrics["compute_clock"]
    hw = load_profile("dgx-h100")
    assert cc["paced_gpus"] == sc.gpus == 64
    assert cc["saturated_ratio"] * cc["slowest_chip_share"] == pytest.approx(hw.paced(64).device.clock_ratio, rel=1e-12)
    a100 = simulate(load_scenario("scenarios/gpt3-175b-1f1b.toml")).metrics["compute_clock"]
    # A100: a measured saturated clock, no measured chip-to-chip spread (not paced)
    assert a100 == {"saturated_ratio": load_profile("dgx-a100-80g").device.kernels.saturated_ratio,
                    "slowest_chip_share": 1.0, "paced_gpus": 1}
    assert a100["saturated_ratio"] < 1.0


HE_RANDN_8192_TFLOPS = (258.0, 257.0)
"""Horace He, thonking.ai 2024: an 8192^3 matmul on an A100 through cuBLAS with random inputs,
two runs (the all-zero inputs: 295, the clock held at boost)."""


@pytest.mark.parametrize("profile", ["dgx-a100-80g", "dgx-a100-40g"])
def test_a100_sustained_gemm_is_the_measured_random_input_rate(profile):
    """The A100 profiles' sustained pair: the random-input 8192^3 rate measured on the chip, over
    the burst the GEMM model (calibrated to the MAMF) gives at that shape; so the model run at the
    saturated clock reproduces the measurement, and its burst stays the MAMF calibration's."""
    dev = load_profile(profile).device
    sustained, burst = dev.kernels.msmf
    n = 8192
    flops = 2.0 * n ** 3
    assert flops / dev.burst().kernel_gemm_time(n, n, n) / 1e12 == pytest.approx(burst, rel=2e-3)
    assert sustained == pytest.approx(sum(HE_RANDN_8192_TFLOPS) / 2, abs=0.05)
    assert flops / dev.kernel_gemm_time(n, n, n) / 1e12 == pytest.approx(sustained, rel=3e-3)
