"""Fit a fused-attention kernel's four numbers per pass (parsim.cluster.attention_kernels.PassModel)
to the FlashAttention-3 paper's H100 bars for one implementation (FlashAttention-2, cuDNN).

    python benchmarks/fit_attention_kernels.py fa2     # or cudnn

Data: tests/data/fa3_paper_h100_attention.json (Fig. 5 and 6). Fit: least squares of
log(model / bar) over the forward bars at head dims 64 and 128 (causal and not) and the backward
bars (non-causal; the backward's diag_extra is the forward's); head dim 256 is held out.
Prints the numbers and the errors, fit and held out. Needs scipy (a development tool only).
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

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "fa3_paper_h100_attention.json"
BOOST = 1.98 / 1.83
"""The matmul rate may pass the 989 TFLOP/s spec (counted at 1.83 GHz) by the boost clock, 1.98 GHz."""


def points(impl: str, backward: bool, held_out: bool):
    d = json.loads(DATA.read_text())
    for b in d["bars"]:
        if (b["pass"] == "backward") != backward or impl not in b:
            continue
        if (b["head_dim"] == 256) != held_out:
            continue
        for s, v in zip(d["seq"], b[impl]):
            if v is not None:
                yield b["head_dim"], b["causal"], s, float(v)


def tflops(dev, kernel, hd, causal, s, backward):
    heads, batch = 2048 // hd, 16384 // s
    t = A.attention_time(dev, batch, s, s, heads, heads, hd, causal, backward, "bf16", kernel)
    return A.attention_flops(batch, s, s, heads, hd, causal, backward) / t / 1e12


def fit(impl: str, base: str) -> None:
    dev = load_profile("dgx-h100").device
    proto = A.KERNELS[base]

    def with_pass(fwd, bwd):
        A.KERNELS["_fit"] = dataclasses.replace(proto, name="_fit", forward=fwd, backward=bwd)

    def res_fwd(x):
        with_pass(A.PassModel(*x), proto.backward)
        return [math.log(tflops(dev, "_fit", hd, c, s, False) / v) for hd, c, s, v in points(impl, False, False)]

    f = least_squares(res_fwd, [0.5, 1.0, 0.5, 0.3], bounds=([0.05, 0, 0, 0], [BOOST, 5, 5, 3]))
    fwd = A.PassModel(*f.x)

    def res_bwd(x):
        with_pass(fwd, A.PassModel(x[0], x[1], x[2], fwd.diag_extra))
        return [math.log(tflops(dev, "_fit", hd, c, s, True) / v) for hd, c, s, v in points(impl, True, False)]

    b = least_squares(res_bwd, [0.5, 1.0, 0.5], bounds=([0.05, 0, 0], [BOOST, 5, 5]))
    bwd = A.PassModel(b.x[0], b.x[1], b.x[2], fwd.diag_extra)
    with_pass(fwd, bwd)
    print(f"{impl} on H100 (tiles of {base}):")
    print(f"  forward=PassModel(mma_fraction={fwd.mma_fraction:.3f}, softmax_cost={fwd.softmax_cost:.3f}, "
          f"cta_io={fwd.cta_io:.3f}, diag_extra={fwd.diag_extra:.3f})")
    print(f"  backward=PassModel(mma_fraction={bwd.mma_fraction:.3f}, softmax_cost={bwd.softmax_cost:.3f}, "
          f"cta_io={bwd.cta_io:.3f}, diag_extra={bwd.diag_extra:.3f})")
    for label, held in (("fit", False), ("held out (head dim 256)", True)):
        errs = [tflops(dev, "_fit", hd, c, s, bw) / v - 1 for bw in (False, True)
                for hd, c, s, v in points(impl, bw, held)]
        if errs:
            print(f"  {label}: {len(errs)} bars, max |error| {max(map(abs, errs)):.1%}, "
                  f"mean |error| {sum(map(abs, errs)) / len(errs):.1%}")
    del A.KERNELS["_fit"]


if __name__ == "__main__":
    impl = sys.argv[1] if len(sys.argv) > 1 else "fa2"
    fit(impl, {"fa2": "fa2", "cudnn": "fa3"}[impl])
