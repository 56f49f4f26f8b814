"""parsim's GEMM model against measured GEMMs it was not built from (aiconfigurator's TensorRT-LLM
grids on seven GPUs, ``benchmarks/data/aiconfigurator_gemm_times.csv``; ``benchmarks/kernel_crosscheck.py``).

Oracle: published kernel measurements. BF16 everywhere and FP8 on Hopper hold within 10% / 20% at the
median (burst model: the collector replays a few calls in a CUDA graph), FP8 on Hopper within 15% where
the measured call's own input quantization is light; FP8 on Blackwell is a known gap
(``reports/kernel-crosscheck.md``), held as a strict expected failure so that a change closing it is seen."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import kernel_crosscheck  # noqa: E402
from parsim.cluster.hardware import load_profile  # noqa: E402

RATIOS = kernel_crosscheck.ratios()
BLACKWELL = ("B200", "GB200", "B300", "GB300")


@pytest.mark.parametrize("gpu", list(kernel_crosscheck.PROFILES))
def test_bf16_gemms_hold_within_ten_percent_at_the_median(gpu):
    r = RATIOS[(gpu, "bf16")]["burst"]
    assert len(r) >= 100 and 0.9 < statistics.median(r) < 1.1


@pytest.mark.parametrize("gpu", ["H100 SXM", "H200 SXM"])
def test_hopper_fp8_gemms_hold_within_fifteen_percent(gpu):
    # the shapes whose dynamic input quantization (inside the measured call) is under a tenth of the GEMM
    d = RATIOS[(gpu, "fp8")]
    assert len(d["light_quant"]) >= 20 and 0.85 < statistics.median(d["light_quant"]) < 1.15
    assert 0.9 < statistics.median(d["big_burst"]) < 1.1


@pytest.mark.xfail(strict=True, reason="parsim's FP8 GEMMs on Blackwell run 13-29% faster than TensorRT-LLM's "
                                       "cuBLASLt FP8 where its quantization is light (reports/kernel-crosscheck.md)")
def test_blackwell_fp8_gemms_hold_within_fifteen_percent():
    pooled = [x for g in BLACKWELL for x in RATIOS[(g, "fp8")]["light_quant"]]
    assert len(pooled) >= 100 and 0.85 < statistics.median(pooled) < 1.15


@pytest.mark.parametrize("gpu", ["H100 SXM", "H200 SXM"])
def test_hopper_flashattention3_holds_within_fifteen_percent_of_vllms(gpu):
    # parsim's FA3 is fitted to the FA3 paper's curves; vLLM's FA3 measured on paged, varlen calls
    v = kernel_crosscheck.attention_ratios()[(gpu, "fa3")]
    assert len(v) >= 50 and 0.85 < statistics.median(x for _, x in v) < 1.15


def test_fp8_split_accumulation_costs_what_fast_accumulation_saves_on_hopper():
    # one FP32 FMA per output element every 128 K on the CUDA cores (66.9 TFLOP/s on an H100):
    # 2 m n ceil(k / 128) FLOPs -- by hand at 8192^3; pytorch/ao#2377 measures fast accumulation
    # 1.1-1.2x faster; nothing on Blackwell (tcgen05 accumulates in FP32)
    from parsim.costs.memory_ops import fp8_promotion_time
    h100 = load_profile("dgx-h100").device.burst()
    promo = fp8_promotion_time(h100, 8192, 8192, 8192)
    assert promo == pytest.approx(2 * 8192 * 8192 * 64 / 66.9e12)
    gemm = h100.gemm_time(8192, 8192, 8192, "fp8")
    assert 1.1 <= (gemm + promo) / gemm <= 1.2
    assert fp8_promotion_time(load_profile("dgx-b200").device.burst(), 8192, 8192, 8192) == 0.0


def test_hopper_cudnn_holds_against_cudnn_91s_own_h200_benchmark():
    """parsim's cuDNN kernel (fitted to the FlashAttention-3 paper's cuDNN bars) against cuDNN 9.1.0's
    published H200 numbers (cudnn-frontend's benchmark_results.csv, clocks locked), never used to fit
    it: forward and backward, causal and full, 4k-64k tokens -- 20 ratios, MAPE 4.7%, every one within
    15% (the worst: the full-mask forward at 4-8k, 13% slow; the causal backward 2-10% fast)."""
    v = kernel_crosscheck.cudnn_ratios()
    assert len(v) == 20
    errors = [abs(x - 1) for *_, x in v]
    assert max(errors) < 0.15 and sum(errors) / len(errors) < 0.06
