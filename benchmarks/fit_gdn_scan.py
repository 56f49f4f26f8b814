"""Fit of the Gated DeltaNet delta-rule kernels' achieved rate (``parsim.costs.gdn.GDN_FLOP_PER_CLOCK_PER_SM``).

    python benchmarks/fit_gdn_scan.py

Data: ``benchmarks/data/gdn_kernel_times.csv`` -- flash-linear-attention's ``chunk_gated_delta_rule``
forward as SGLang 0.5.14 runs it (packed sequences, K = V = 128, bf16, the q / k L2 norm inside),
timed by ai-dynamo/aiconfigurator's collector on an H100 SXM, a B200 and a GB200, at the key / value
head counts of the Qwen3.5 models and their tensor-parallel shares (1 / 2 ... 16 / 64), 1 to 64
sequences of up to 32,768 tokens (the file's header says where each number comes from).

The one quantity fitted is the kernels' achieved FLOP rate per SM and clock (the chunked algorithm's
matmuls, :func:`parsim.costs.gdn.forward_kernels`): least squares on the log of the H100 rows at a
whole model's heads (16 key heads), the shapes a tensor-parallel rank of one GPU runs. Held out: the
H100 rows at the tensor-parallel shares (1 to 8 key heads), and every B200 and GB200 row (another
GPU: the rate scales with its SMs and clock). The model adds the profile's ``kernel_launch_us`` per
kernel and the two L2-norm passes over q and k (memory-bound) to the six kernels.

Not used: flash-linear-attention's README table (GB200, six shapes) carries a ~0.6 ms floor per call
(its smallest shape, 8 x 1024 tokens x 8 heads of 64, takes 0.63 ms) that these rows do not show, and
TileOPs' H200 table (PR #476) runs 4 heads, 8 of 132 SMs' worth of state blocks.
"""
from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import parsim.costs.gdn as gdn  # noqa: E402
from parsim.calibrate.search import golden_section_min  # noqa: E402
from parsim.cluster.hardware import load_profile  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "gdn_kernel_times.csv"
PROFILES = {"H100 SXM": "dgx-h100", "B200": "dgx-b200", "GB200": "gb200-nvl72"}
D = 128


def rows() -> list[dict]:
    with open(DATA) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def model_ms(dev, r: dict) -> float:
    b, t, hk, hv = (int(r[k]) for k in ("sequences", "tokens", "key_heads", "value_heads"))
    f, _, kf, _ = gdn.delta_times(dev, gdn.DeltaShape(b, t, hv, D, D), "bf16")
    l2 = dev.memory_time(2 * 2 * b * t * hk * D * 2.0)  # q and k read and written once each
    return (f + l2 + (kf + 2) * dev.kernel_launch_s) * 1e3


def errors(rate: float, select) -> list[tuple[dict, float]]:
    devs = {g: load_profile(p).device.burst() for g, p in PROFILES.items()}
    old = gdn.GDN_FLOP_PER_CLOCK_PER_SM
    gdn.GDN_FLOP_PER_CLOCK_PER_SM = rate
    try:
        return [(r, model_ms(devs[r["gpu"]], r) / float(r["forward_ms"]) - 1) for r in rows() if select(r)]
    finally:
        gdn.GDN_FLOP_PER_CLOCK_PER_SM = old


def fitted(r: dict) -> bool:
    return r["gpu"] == "H100 SXM" and r["key_heads"] == "16"


def fit() -> float:
    """The rate minimising the squared log error of the fit rows (golden-section search)."""
    def loss(x: float) -> float:
        return sum(math.log1p(e) ** 2 for _, e in errors(x, fitted))
    return golden_section_min(loss, 20.0, 4000.0, 1e-3)


def _summary(label: str, errs: list[tuple[dict, float]]) -> str:
    e = [x for _, x in errs]
    mape = 100 * sum(map(abs, e)) / len(e)
    bias = 100 * (math.exp(sum(math.log1p(x) for x in e) / len(e)) - 1)
    within = 100 * sum(abs(x) <= 0.25 for x in e) / len(e)
    return f"{label}: {len(e)} rows, MAPE {mape:.1f}%, geometric bias {bias:+.1f}%, {within:.0f}% within 25%"


def main() -> None:
    rate = fit()
    print(f"fitted GDN_FLOP_PER_CLOCK_PER_SM = {rate:.1f} (profile value {gdn.GDN_FLOP_PER_CLOCK_PER_SM})")
    print(_summary("fit: H100, 16 key heads", errors(rate, fitted)))
    print(_summary("held out: H100, 1-8 key heads", errors(rate, lambda r: r["gpu"] == "H100 SXM" and not fitted(r))))
    for g in ("B200", "GB200"):
        print(_summary(f"held out: {g}", errors(rate, lambda r, g=g: r["gpu"] == g)))
    big = errors(rate, lambda r: int(r["sequences"]) * int(r["tokens"]) >= 16384)
    print(_summary("all GPUs, >= 16,384 tokens", big))


if __name__ == "__main__":
    main()
