"""The unfused attention core against a published measurement of it: the FlashAttention-2 paper's
"Pytorch" bars.

    python benchmarks/unfused_attention_pytorch.py

Source: Dao 2023 (arXiv:2307.08691), Fig. 4, "Attention forward + backward speed (A100 80GB
SXM4)", the Pytorch bars (the repository's assets/flash2_a100_fwd_bwd_benchmark.png): fp16,
16k tokens per batch (batch = 16384 / seq), hidden 2048 (heads = 2048 / head dim), no dropout,
TFLOP/s counted as the paper counts them (forward 4 b h s^2 d, halved with the causal mask,
backward 2.5x the forward). The benchmark's ``attention_pytorch``
(benchmarks/benchmark_flash_attention.py) runs: a ``baddbmm`` for QK^T into a preallocated
score tensor, with the causal mask an fp32 ``triu`` cast and added, ``torch.softmax``,
``F.dropout`` at p = 0 (returns its input), an ``einsum`` for PV.

What parsim charges for it (the kernel path, ``parsim.costs.compute.unfused_attention_gemms``
and the device's streaming time): the six batched GEMMs (QK^T and PV forward; dP, dV, dQ, dK
backward), each one strided-batched launch whose HBM floor holds its s x s operand or output,
plus the elementwise kernels' score traffic -- softmax read and write forward, the mask add's
read and write when causal, and softmax backward's two reads and one write. The device runs at
its burst clock, as a microbenchmark does.

A recorded comparison, not a fit and not a test: PyTorch's generic kernels are not Megatron's
fused ones (parsim's ``scores_traffic`` charges Megatron's unfused core), and the printout says
how far the kernel models' roofline is from what those generic kernels reached.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parsim.cluster.hardware import load_profile
from parsim.costs.layer import scores_pass_bytes

SEQS = (512, 1024, 2048, 4096, 8192)
"""The bars' sequence lengths (16k: out of memory in the figure)."""
PYTORCH_BARS = {(64, False): (36, 40, 43, 45, 46), (128, False): (53, 67, 76, 79, 86),
                (64, True): (15, 16, 17, 18, 18), (128, True): (23, 28, 32, 32, 34)}
"""(head dim, causal) -> TFLOP/s by sequence length, read from the figure's bar labels."""


def predicted_tflops(dev, head_dim: int, causal: bool, seq: int, scores_traffic: bool = False) -> float:
    """Forward + backward TFLOP/s parsim's kernel models give the benchmark's PyTorch attention:
    the elementwise kernels' own traffic, or (``scores_traffic``) what
    ``parsim.costs.layer.scores_traffic`` charges an unfused core without dropout beside the
    GEMMs (``scores_pass_bytes``: softmax and the PV read forward, twice that backward)."""
    bh = (16384 // seq) * (2048 // head_dim)
    elements = bh * seq * seq

    def gemm(m, n, k):
        return dev.gemm_time(m, n, k, "fp16", bh)

    forward = gemm(seq, seq, head_dim) + gemm(seq, head_dim, seq)
    backward = gemm(seq, head_dim, seq) + gemm(seq, seq, head_dim) + 2 * gemm(seq, head_dim, seq)
    forward_passes = 2.0 + (2.0 if causal else 0.0)   # softmax; the causal mask's add
    backward_passes = 3.0                              # softmax backward: grad and output read, written
    if scores_traffic:
        per_pass = scores_pass_bytes(1, 1, 1, "fp16") / 2  # element passes per forward
        forward_passes, backward_passes = per_pass + (2.0 if causal else 0.0), 2 * per_pass
    forward += dev.memory_time(forward_passes * elements * 2)
    backward += dev.memory_time(backward_passes * elements * 2)
    flops = 3.5 * 4.0 * bh * seq * seq * head_dim / (2 if causal else 1)
    return flops / (forward + backward) / 1e12


def main() -> None:
    dev = load_profile("dgx-a100-80g").device.burst()
    for label, charged in (("the elementwise kernels' own traffic", False), ("parsim's scores_traffic", True)):
        errors = []
        print(f"{label}: predicted / published TFLOP/s by sequence length (512 .. 8k)")
        for (head_dim, causal), bars in PYTORCH_BARS.items():
            cells = []
            for seq, published in zip(SEQS, bars):
                p = predicted_tflops(dev, head_dim, causal, seq, charged)
                errors.append(p / published - 1)
                cells.append(f"{p:6.1f} / {published:3d}")
            print(f"  head dim {head_dim:3d}, {'causal' if causal else 'full  '}: " + "   ".join(cells))
        print(f"  MAPE {100 * statistics.mean(abs(e) for e in errors):.1f}%, "
              f"bias {100 * statistics.mean(errors):+.1f}% (+: parsim faster than PyTorch ran)")


if __name__ == "__main__":
    main()
