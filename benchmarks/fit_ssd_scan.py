"""Fit of the Mamba-2 SSD scan kernels' achieved rate (``parsim.costs.ssd.SSD_FLOP_PER_CLOCK_PER_SM``).

    python benchmarks/fit_ssd_scan.py

Data: TileOPs PR #1557 (tile-ai/TileOPs commit c9f559f297ea25504cf21e51349f4f82199991c4, 2026-06-09,
"[Perf][Mamba] Add Mamba2 e2e benchmark ..."): ``mamba_ssm``'s ``mamba_chunk_scan_combined`` forward
(x, dt, A, B, C; dt_softplus, no D, no z) on an H200 at a locked 1,830 MHz, bf16, P = 64, N = 128,
G = 1, Q = 256, timed as the CUPTI sum of its kernels' device time with L2 flushed before each
iteration (median of 3 x 50). Heads H = 24, 48, 64, 80, 128 at batch 32 x 2,048 tokens and batch 4 x
32,768 tokens, and batch 8 x 2,048 (which TileOPs PR #1675 re-measured up to 30% apart).

The one quantity fitted is the kernels' achieved FLOP rate per SM and clock: least squares on the
log of the five 32k-token rows' times (the shapes nearest a training microbatch's), the batch-32 rows
held out; the batch-8 rows are reported apart (their two measurements disagree by up to 30%).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import parsim.costs.ssd as ssd  # noqa: E402
from parsim.calibrate.search import golden_section_min  # noqa: E402
from parsim.cluster.hardware import load_profile  # noqa: E402

P, N, G, Q = 64, 128, 1, 256
MEASURED_MS = {  # heads: (batch 32 x 2048, batch 4 x 32768, batch 8 x 2048), ms
    24: (1.4055, 3.4685, 0.2267), 48: (3.3191, 7.1387, 0.4125), 64: (4.4721, 9.9299, 0.6468),
    80: (5.7969, 12.2623, 0.9137), 128: (9.6147, 19.7326, 1.6876)}
TOKENS = (32 * 2048, 4 * 32768, 8 * 2048)


def model_ms(dev, heads: int, tokens: int) -> float:
    f, _, _, _ = ssd.scan_times(dev, ssd.ScanShape(tokens, heads, P, N, G, Q), "bf16")
    return f * 1e3


def errors(rate: float, which: int) -> list[float]:
    dev = load_profile("dgx-h200").device.burst()
    old = ssd.SSD_FLOP_PER_CLOCK_PER_SM
    ssd.SSD_FLOP_PER_CLOCK_PER_SM = rate
    try:
        return [model_ms(dev, h, TOKENS[which]) / t[which] - 1 for h, t in MEASURED_MS.items()]
    finally:
        ssd.SSD_FLOP_PER_CLOCK_PER_SM = old


def fit() -> float:
    """The rate minimising the squared log error on the 32k-token rows (golden-section search)."""
    def loss(r: float) -> float:
        return sum(math.log1p(e) ** 2 for e in errors(r, 1))
    return golden_section_min(loss, 50.0, 1000.0, 1e-3)


def main() -> None:
    r = fit()
    print(f"fitted SSD_FLOP_PER_CLOCK_PER_SM = {r:.1f} (profile value {ssd.SSD_FLOP_PER_CLOCK_PER_SM})")
    for which, label in ((1, "fit: batch 4 x 32768"), (0, "held out: batch 32 x 2048"), (2, "batch 8 x 2048")):
        e = errors(r, which)
        print(f"{label}: MAPE {100 * sum(map(abs, e)) / len(e):.1f}%  "
              + "  ".join(f"H={h} {100 * x:+.0f}%" for h, x in zip(MEASURED_MS, e)))


if __name__ == "__main__":
    main()
