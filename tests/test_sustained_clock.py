"""The power-saturated clock (``device.msmf_*``): training-load kernel times against bursts.

Oracles: the published MSMF/MAMF pairs the profiles cite (stas00/ml-engineering's mamf-finder
runs on all 8 GPUs of an H200 and a B200 node), the kernel model's own structure (a
compute-bound GEMM scales with the clock, an HBM-bound one does not), and the loader's rules.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from parsim.cluster.hardware import PROFILE_DIR, load_profile, parse_profile
from parsim.errors import ConfigError

H200_MSMF, H200_MAMF = 698.6, 823.9      # all 8 GPUs x 5 rounds, torch 2.14.0.dev20260810+cu130
B200_MSMF, B200_MAMF = 1426.4, 1751.2    # all 8 GPUs x 5 rounds, torch 2.13.0+cu130
A100_RANDN_8192 = 257.5                  # Horace He (thonking.ai 2024): cuBLAS 8192^3 on random inputs, 258 and 257


@pytest.mark.parametrize("profile, ratio", [
    ("dgx-h100", H200_MSMF / H200_MAMF), ("dgx-h200", H200_MSMF / H200_MAMF),
    ("dgx-h800", H200_MSMF / H200_MAMF), ("grand-teton-h100", H200_MSMF / H200_MAMF),
    ("dgx-b200", B200_MSMF / B200_MAMF), ("hgx-b200", B200_MSMF / B200_MAMF),
    ("gb200-nvl72", B200_MSMF / B200_MAMF), ("gb300-nvl72", B200_MSMF / B200_MAMF),
    ("dgx-a100-80g", A100_RANDN_8192 / 275.7), ("dgx-a100-40g", A100_RANDN_8192 / 276.1), ("dgx2-v100", 1.0),
])
def test_profile_ratio_is_the_cited_measurement(profile, ratio):
    dev = load_profile(profile).device
    assert dev.clock_ratio == pytest.approx(ratio, rel=1e-12)
    assert dev.burst().clock_ratio == 1.0


def test_profiles_without_kernel_facts_run_at_their_calibrated_rates():
    assert load_profile("cpu-gloo").device.clock_ratio == 1.0


def test_compute_bound_gemm_slows_by_the_ratio_and_hbm_bound_does_not():
    dev = load_profile("dgx-h100").device
    r = dev.clock_ratio
    big = (8192, 8192, 8192)
    burst, sustained = dev.burst().kernel_gemm_time(*big), dev.kernel_gemm_time(*big)
    # everything but the fixed launch-to-drain latency runs on the SM clock (to 0.1%: the
    # Stream-K split is chosen again at the lower rate)
    lat = dev.kernels.gemm_latency_s
    assert (sustained - lat) == pytest.approx((burst - lat) / r, rel=1e-3)
    # a matrix-vector product is bound by HBM, whose clock the power limit leaves alone
    gemv = (1, 8192, 8192)
    assert dev.burst().kernel_gemm_plan(*gemv)["memory_bound"]
    assert dev.kernel_gemm_time(*gemv) == pytest.approx(dev.burst().kernel_gemm_time(*gemv), rel=1e-12)


def test_attention_slows_by_at_most_the_ratio():
    dev = load_profile("dgx-b200").device
    r = dev.clock_ratio
    for backward in (False, True):
        args = (1, 8192, 8192, 32, 8, 128, True, backward)
        burst, sustained = dev.burst().attention_kernel_time(*args), dev.attention_kernel_time(*args)
        # the matmuls and exponentials slow with the clock; the CTAs' HBM traffic does not
        assert burst < sustained <= burst / r * (1 + 1e-9)
        assert sustained > burst / r * 0.9


def test_v100_is_untouched():
    dev = load_profile("dgx2-v100").device  # no sustained measurement for V100
    args = (8192, 8192, 8192, "fp16")
    assert dev.kernel_gemm_time(*args) == dev.burst().kernel_gemm_time(*args)


def _h100_table():
    return tomllib.loads((PROFILE_DIR / "dgx-h100.toml").read_text())


@pytest.mark.parametrize("drop", ["msmf_bf16_tflops", "msmf_mamf_bf16_tflops"])
def test_the_pair_comes_together(drop):
    data = _h100_table()
    del data["device"][drop]
    with pytest.raises(ConfigError) as err:
        parse_profile(data, "h.toml")
    assert "msmf" in err.value.line() and "beside it" in err.value.line()


def test_sustained_cannot_beat_the_burst():
    data = _h100_table()
    data["device"]["msmf_bf16_tflops"] = 900.0
    with pytest.raises(ConfigError) as err:
        parse_profile(data, "h.toml")
    assert "device.msmf_bf16_tflops" in err.value.line()


def test_without_the_pair_the_ratio_is_one():
    data = _h100_table()
    for k in ("msmf_bf16_tflops", "msmf_mamf_bf16_tflops", "msmf_chip_range_pct", "msmf_chip_range_gpus"):
        del data["device"][k]
    assert parse_profile(data, "h.toml").device.clock_ratio == 1.0


def test_a_chip_range_without_its_msmf_is_refused():
    data = _h100_table()
    for k in ("msmf_bf16_tflops", "msmf_mamf_bf16_tflops"):
        del data["device"][k]
    with pytest.raises(ConfigError) as err:
        parse_profile(data, "h.toml")
    assert "device.msmf_chip_range_pct" in err.value.line() and "msmf_bf16_tflops" in err.value.line()


def test_kernel_cli_headline_is_the_burst_with_the_sustained_beside_it():
    out = subprocess.run([sys.executable, "-m", "parsim", "kernel", "gemm", "8192", "8192", "8192",
                          "--hardware", "dgx-h100", "--json"], capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)
    dev = load_profile("dgx-h100").device
    assert j["time_s"] == pytest.approx(dev.burst().kernel_gemm_time(8192, 8192, 8192), rel=1e-12)
    assert j["sustained_time_s"] == pytest.approx(dev.kernel_gemm_time(8192, 8192, 8192), rel=1e-12)
    assert j["sustained_tflops"] < j["tflops"]
