"""Fit a fused-attention kernel's pass numbers (parsim.cluster.attention_kernels.PassModel) to
published forward + backward TFLOP/s bars, the only form the FlashAttention-2 paper gives for the
Triton FlashAttention kernel (and, on H100, for FlashAttention-1).

    python benchmarks/fit_attention_fwd_bwd.py triton          # A100: Fig. 4's "FlashAttention Triton"
    python benchmarks/fit_attention_fwd_bwd.py triton-hopper   # H100: proxy bars (see below)

Data: tests/data/fa2_paper_fwd_bwd.json. A fwd+bwd bar cannot separate the two passes, so the
backward's tensor-core fraction and exposed softmax are tied to the forward's by FlashAttention-2's
own backward/forward ratios on A100 (0.707/0.983 and 1.847/1.358: the same algorithm, the backward
with five matmuls and the atomics), and the two passes share ``cta_io`` and ``diag_extra``: four
numbers. Fit: least squares of log(model / bar) over panels (a)-(c) (head dim 64 causal and not,
head dim 128 non-causal); panel (d), head dim 128 causal (the shape of the jobs that call the
kernel), is held out and its error printed. Tiles: flash_attn_triton.py's BLOCK_M = BLOCK_N = 128
in both passes.

``triton-hopper``: there are no published bars of the Triton kernel on H100. The FlashAttention-2
figure for H100 has FlashAttention-1's (CUDA, Ampere mma.sync, like the Triton kernel of that era,
which did not use Hopper's wgmma); on A100, where both are published, the Triton kernel is within
-18%..+18% of FlashAttention-1, mean ratio 1.01 over the 24 bars (``proxy_ratio`` below). So the
H100 fit uses FlashAttention-1's H100 bars, a stated proxy. Needs scipy (a development tool only).
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path

from scipy.optimize import least_squares

from parsim.cluster import attention_kernels as A
from parsim.cluster.hardware import load_profile

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "fa2_paper_fwd_bwd.json"
TARGETS = {"triton": ("a100", "FlashAttention Triton", "dgx-a100-80g"),
           "triton-hopper": ("h100", "FlashAttention", "dgx-h100")}
BWD_MMA, BWD_SOFTMAX = 0.707 / 0.983, 1.847 / 1.358
"""FlashAttention-2's backward/forward ratios on A100 (parsim.cluster.attention_kernels, "fa2")."""


def bars(gpu: str, impl: str):
    d = json.loads(DATA.read_text())
    for b in d["bars"]:
        if b["gpu"] == gpu and b["impl"] == impl:
            for s, v in zip(d["seq"], b["tflops"]):
                yield b["head_dim"], b["causal"], s, float(v)


def proxy_ratio() -> float:
    """Mean of Triton / FlashAttention-1 over the A100 bars where both are published."""
    tri = {(h, c, s): v for h, c, s, v in bars("a100", "FlashAttention Triton")}
    fa1 = {(h, c, s): v for h, c, s, v in bars("a100", "FlashAttention")}
    r = [tri[k] / fa1[k] for k in tri]
    return sum(r) / len(r)


def fwd_bwd_tflops(dev, kernel: str, hd: int, causal: bool, s: int) -> float:
    heads, batch = 2048 // hd, 16384 // s
    t = sum(A.attention_time(dev, batch, s, s, heads, heads, hd, causal, bwd, "bf16", kernel) for bwd in (False, True))
    return 3.5 * A.attention_flops(batch, s, s, heads, hd, causal, False) / t / 1e12


def passes(x) -> tuple[A.PassModel, A.PassModel]:
    mma, soft, io, diag, _, mask = x
    return (A.PassModel(mma, soft, io, diag, mask),
            A.PassModel(mma * BWD_MMA, soft * BWD_SOFTMAX, io, diag, mask * BWD_SOFTMAX))


def fit(target: str) -> None:
    gpu, impl, profile = TARGETS[target]
    dev = load_profile(profile).device
    proto = A.KERNELS["fa2"]
    tiles = {"fwd_tiles": ((128, 128, 128, 128),), "bwd_tiles": ((128, 128, 128),)}
    held = lambda hd, c: hd == 128 and c
    pts = list(bars(gpu, impl))

    def install(x):
        f, b = passes(x)
        A.KERNELS["_fit"] = dataclasses.replace(proto, name="_fit", forward=f, backward=b,
                                                mma_scale=((64, 1.0), (256, x[4])), **tiles)

    def residuals(x):
        install(x)
        return [math.log(fwd_bwd_tflops(dev, "_fit", hd, c, s) / v) for hd, c, s, v in pts if not held(hd, c)]

    r = least_squares(residuals, [0.5, 1.0, 0.5, 0.5, 1.0, 0.5], bounds=([0.05, 0, 0, 0, 0.2, 0], [1.08, 8, 5, 3, 2, 8]))
    install(r.x)
    f, b = passes(r.x)
    print(f"{target}: {impl} bars on {gpu} ({profile})")
    print(f"  forward=PassModel(mma_fraction={f.mma_fraction:.3f}, softmax_cost={f.softmax_cost:.3f}, "
          f"cta_io={f.cta_io:.3f}, diag_extra={f.diag_extra:.3f}, mask_cost={f.mask_cost:.3f})")
    print(f"  backward=PassModel(mma_fraction={b.mma_fraction:.3f}, softmax_cost={b.softmax_cost:.3f}, "
          f"cta_io={b.cta_io:.3f}, diag_extra={b.diag_extra:.3f}, mask_cost={b.mask_cost:.3f})")
    print(f"  mma_scale=((64, 1.0), (256, {r.x[4]:.3f}))")
    for label, sel in (("fit (a)-(c)", False), ("held out (d): head dim 128, causal", True)):
        errs = [fwd_bwd_tflops(dev, "_fit", hd, c, s) / v - 1 for hd, c, s, v in pts if held(hd, c) == sel]
        print(f"  {label}: {len(errs)} bars, max |error| {max(map(abs, errs)):.1%}, "
              f"mean |error| {sum(map(abs, errs)) / len(errs):.1%}")
    if target == "triton-hopper":
        print(f"  proxy: Triton / FlashAttention-1 on A100, mean ratio {proxy_ratio():.3f}")
    del A.KERNELS["_fit"]


if __name__ == "__main__":
    fit(sys.argv[1] if len(sys.argv) > 1 else "triton")
