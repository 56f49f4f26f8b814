"""parsim's MoE layer against Megatron-Core's own MoE layer performance test (``moe_perf``: one layer on 8
H100s, expert parallelism 8; ``benchmarks/moe_layer_check.py``, ``benchmarks/data/megatron_moe_perf.json``).

Oracle: Megatron-LM's measured forward and backward milliseconds, which nothing in parsim was fitted
to. BF16 holds within 15% a time (6.6% MAPE over twelve); the flex dispatchers' per-GPU deduplication
shows as the measured speed-up over the all-to-all dispatcher; TE's blockwise FP8 holds within 10% MAPE
(8.1%) with the Hopper split accumulation costed."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import moe_layer_check as mlc  # noqa: E402

ERRORS = mlc.errors()


@pytest.mark.parametrize("case", sorted(c for c in ERRORS if c.endswith("bf16")))
def test_bf16_moe_layer_within_fifteen_percent(case):
    f, b = ERRORS[case]
    assert abs(f) < 0.15 and abs(b) < 0.15


def test_flex_dispatchers_send_a_token_once_per_gpu():
    # DeepSeek proxy: top-8 of 32 experts in 8 groups (one a GPU), 4 groups a token: DeepEP / HybridEP send
    # a token to 4 GPUs, the all-to-all dispatcher a copy per expert (8); Mixtral's top-2 of 8: 2 either way,
    # so there the two differ only by transport (NCCL's all-to-all at its measured nccl-tests line, DeepEP's
    # NVLink kernels): no more than the measured layers differ
    data = json.loads(mlc.DATA.read_text())
    ms = {c: mlc.layer_ms(c, data["proxies"]) for c in ("deepseek_a2a_tp1ep8_bf16", "deepseek_deepep_tp1ep8_bf16",
                                                         "mixtral_a2a_tp1ep8_bf16", "mixtral_deepep_tp1ep8_bf16")}
    measured = data["cases"]
    saved = ms["deepseek_a2a_tp1ep8_bf16"][0] - ms["deepseek_deepep_tp1ep8_bf16"][0]
    measured_saved = measured["deepseek_a2a_tp1ep8_bf16"]["forward_ms"] - measured["deepseek_deepep_tp1ep8_bf16"]["forward_ms"]
    assert saved == pytest.approx(measured_saved, rel=0.35)  # 1.15 ms against the measured 1.44
    model_gap = abs(ms["mixtral_a2a_tp1ep8_bf16"][0] / ms["mixtral_deepep_tp1ep8_bf16"][0] - 1)
    measured_gap = abs(measured["mixtral_a2a_tp1ep8_bf16"]["forward_ms"] / measured["mixtral_deepep_tp1ep8_bf16"]["forward_ms"] - 1)
    assert model_gap <= measured_gap  # 2.2% against the measured 6.7%


def test_fp8_blockwise_moe_layer_within_ten_percent_mape():
    # TE's blockwise recipe on Hopper promotes every GEMM's partial sums to FP32 each 128 K elements
    # (parsim.costs.memory_ops.fp8_promotion_time): 14.3% MAPE without it, parsim too fast in 11 of 12
    e = [abs(x) for c, fb in ERRORS.items() if c.endswith("fp8") for x in fb]
    assert sum(e) / len(e) < 0.10 and max(e) < 0.16
