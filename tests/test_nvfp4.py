"""NVFP4 training (``training.precision = "fp8"``, ``training.fp8_recipe = "nvfp4"``): Blackwell's
4-bit block-scaled GEMMs as Transformer Engine's ``NVFP4BlockScaling`` runs them.

Oracles: pytorch/ao#2427's NVFP4 matmul sweep on a B200 (one shape fitted, the others held out);
Transformer Engine's NVFP4 format (E2M1 elements, one E4M3 scale per 16; 16x16 scale blocks for
weights) and its quantizer's kernels (an amax pass, then both copies from one read); Megatron-Core's
128-row expert padding for FP4 (``fp4_utils.get_fp4_align_size``); hand-computed byte counts.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from parsim.cluster.hardware import load_profile
from parsim.costs import compute
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.memory import ActivationOptions, layer_activation_bytes
from parsim.costs.memory_ops import (
    fp8_cast_work,
    fp8_copy_bytes,
    fp8_weight_copy_bytes,
    saved_input_bytes,
)
from parsim.costs.moe import expert_rows, quant_bytes_per_element
from parsim.errors import ConfigError
from parsim.model import get_preset
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate

# pytorch/ao#2427 (benchmarks/float8/bench_matmul.py --recipe nvfp4, NVIDIA B200): M = K = N, FLOP/s.
# 6144^3 (5.50e15) is the profile's mamf_nvfp4 calibration point; the others are held out.
TORCHAO_B200_NVFP4 = {3072: 3.51e15, 4096: 4.46e15, 8192: 5.37e15}


@pytest.mark.parametrize("size, measured", sorted(TORCHAO_B200_NVFP4.items()))
def test_nvfp4_gemm_matches_the_measured_b200_sweep(size, measured):
    dev = load_profile("dgx-b200").device.burst()  # a microbenchmark: the boost clock
    flops = 2.0 * size ** 3 / dev.gemm_time(size, size, size, "nvfp4")
    assert flops == pytest.approx(measured, rel=0.05)


def _kernel(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "parsim", "kernel", "gemm", *args],
                          capture_output=True, text=True, check=False)


def test_kernel_cli_runs_nvfp4_on_blackwell_and_refuses_it_on_hopper():
    ok = _kernel("8192", "8192", "8192", "--hardware", "dgx-b200", "--precision", "nvfp4", "--json")
    assert ok.returncode == 0, ok.stderr
    row = json.loads(ok.stdout)
    bf16 = json.loads(_kernel("8192", "8192", "8192", "--hardware", "dgx-b200", "--json").stdout)
    assert row["time_s"] < bf16["time_s"] / 3  # measured: 5.37e15 vs 1.42e15 FLOP/s at 8192^3 (pytorch/ao#2427)
    bad = _kernel("64", "64", "64", "--hardware", "dgx-h100", "--precision", "nvfp4")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--precision" in bad.stderr and "nvfp4" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_copies_and_casts_per_element():
    """Both copies always (TN-only GEMMs): 2 x (1/2 + 1/16) bytes an element; weights' 16x16 scale
    blocks: 2 x (1/2 + 1/256); a cast reads the 16-bit tensor twice (amax, then the fused cast)."""
    assert fp8_copy_bytes("nvfp4", non_tn=True) == fp8_copy_bytes("nvfp4", non_tn=False) == 2 * (0.5 + 1 / 16)
    assert fp8_weight_copy_bytes("nvfp4", non_tn=True) == 2 * (0.5 + 1 / 256)
    assert fp8_weight_copy_bytes("mxfp8", non_tn=True) == fp8_copy_bytes("mxfp8", non_tn=True)
    assert saved_input_bytes("nvfp4") == 0.5625 and saved_input_bytes("mxfp8") == 1.0 and saved_input_bytes(None) == 1.0
    m = get_preset("llama3-8b")
    nv = fp8_cast_work(m, 4096, 1, "nvfp4", 2, non_tn=True)
    cur = fp8_cast_work(m, 4096, 1, "current", 2, non_tn=True)  # 2 reads + 1 copy of 1 byte: 5 bytes
    for a, b in zip(nv, cur):
        assert a.bytes / b.bytes == pytest.approx((4 + 1.125) / 5, rel=1e-12) and a.kernels == b.kernels
    assert quant_bytes_per_element("nvfp4", non_tn=True) == 4 + 1.125


def _scenario(hardware: str, recipe: str | None, **extra) -> dict:
    training = {"global_batch": 64, "seq_len": 8192, "precision": "fp8", **extra}
    if recipe:
        training["fp8_recipe"] = recipe
    return {"name": "n", "hardware": hardware, "gpus": 8, "model": {"preset": "llama3-70b"},
            "training": training, "parallel": {"tp": 8, "dp": 1, "zero": 1, "sequence_parallel": True,
                                               "framework": "megatron"}}


def test_linear_gemms_run_at_nvfp4_and_the_head_stays_bf16():
    sc = scenario_from_dict(_scenario("gb200-nvl72", "nvfp4"), "n.toml")
    inp = layer_inputs(cost_inputs(sc))
    assert compute.linear_precision(inp) == "nvfp4" and compute.gemm_precision(inp, "router") == "bf16"
    nv = simulate(sc).metrics
    mx = simulate(scenario_from_dict(_scenario("gb200-nvl72", "mxfp8"), "n.toml")).metrics
    # the linear GEMMs (most of a 70B block) run at twice the block-scaled rate: the step is faster,
    # but less than twice (attention, the BF16 head, the casts and the communication stay)
    assert 1.2 < mx["step_time_s"] / nv["step_time_s"] < 2.0
    # the result says what ran: the recipe and the linear GEMMs' precision (--json and the summary)
    assert (nv["precision"], nv["fp8_recipe"], nv["linear_gemm_precision"]) == ("fp8", "nvfp4", "nvfp4")
    assert (mx["fp8_recipe"], mx["linear_gemm_precision"]) == ("mxfp8", "mxfp8")
    from parsim.results.summary import format_summary
    assert "recipe nvfp4: linear GEMMs nvfp4" in format_summary(nv)


@pytest.mark.parametrize("hardware", ["dgx-h100", "dgx-h200"])
def test_nvfp4_needs_blackwell(hardware):
    with pytest.raises(ConfigError, match="training.fp8_recipe") as e:
        scenario_from_dict(_scenario(hardware, "nvfp4"), "n.toml")
    assert "NVFP4" in str(e.value)


@pytest.mark.parametrize("word", ["fp4", "nvfp4"])
def test_fp4_precision_says_how_to_ask_for_it(word):
    doc = _scenario("gb200-nvl72", None)
    doc["training"]["precision"] = word
    with pytest.raises(ConfigError, match="training.precision") as e:
        scenario_from_dict(doc, "n.toml")
    assert 'fp8_recipe = "nvfp4"' in str(e.value)


def test_saved_linear_inputs_are_the_4_bit_copies():
    """Per token the QKV, projection, FC1 and FC2 inputs (h, q, h, f elements) are kept at 9/16 of
    a byte instead of FP8's one."""
    m = get_preset("llama3-8b")
    fp8 = ActivationOptions("none", True, False, False, bytes_per_element=2, fp8_linear_inputs=True)
    nv = ActivationOptions("none", True, False, False, bytes_per_element=2, fp8_linear_inputs=True,
                           quantized_input_bytes=saved_input_bytes("nvfp4"))
    tokens = 4096
    diff = layer_activation_bytes(m, tokens, 1, 1, fp8) - layer_activation_bytes(m, tokens, 1, 1, nv)
    q = m.n_heads * m.head_dim_
    assert diff == pytest.approx(tokens * (1 - 0.5625) * (2 * m.d_model + q + m.d_ff), rel=1e-12)


def test_expert_rows_pad_to_128_under_nvfp4():
    kept = np.array([1.0, 127.0, 128.0, 129.0, 300.0])
    assert expert_rows(kept, "nvfp4", None, False) == [128, 128, 128, 256, 384]
    assert expert_rows(kept, "mxfp8", None, False) == [32, 128, 128, 160, 320]
