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
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from parsim.costs.compute import unfused_attention_gemms
from parsim.costs.inputs import cluster_of, cost_inputs, layer_inputs
from parsim.costs.layer import scores_traffic
from parsim.scenario import scenario_from_dict

SEQS = (512, 1024, 2048, 4096, 8192)
"""The bars' sequence lengths (16k: out of memory in the figure)."""
PYTORCH_BARS = {(64, False): (36, 40, 43, 45, 46), (128, False): (53, 67, 76, 79, 86),
                (64, True): (15, 16, 17, 18, 18), (128, True): (23, 28, 32, 32, 34)}
"""(head dim, causal) -> TFLOP/s by sequence length, read from the figure's bar labels."""


def _layer(dev_profile: str, head_dim: int, seq: int):
    """The per-block inputs of the benchmark's shape: batch 16384 / seq sequences, hidden 2048 in
    2048 / head_dim heads, fp16, no dropout, no fused attention, one GPU."""
    heads = 2048 // head_dim
    model = {"name": "fa2-bench", "n_layers": 1, "d_model": 2048, "n_heads": heads, "n_kv_heads": heads,
             "d_ff": 8192, "vocab_size": 32000, "max_seq_len": seq}
    doc = {"name": "fa2-bench", "hardware": dev_profile, "gpus": 1, "model": model,
           "training": {"global_batch": 16384 // seq, "microbatch_size": 16384 // seq, "seq_len": seq,
                        "precision": "fp16", "flash_attention": False, "dropout": False},
           "parallel": {"dp": 1}}
    return layer_inputs(cost_inputs(scenario_from_dict(doc, "fa2-bench")))


def predicted_tflops(inp, causal: bool, scores: bool = False) -> float:
    """Forward + backward TFLOP/s parsim's kernel models give the benchmark's PyTorch attention
    (``inp``: :func:`_layer`): the six batched GEMMs of ``unfused_attention_gemms`` plus the
    elementwise kernels' own traffic, or (``scores``) what ``scores_traffic`` charges an unfused
    core beside them (softmax and the PV read forward, twice that backward)."""
    dev, sh = inp.hardware.device.burst(), inp.shard
    inp = replace(inp, cluster=cluster_of(replace(inp.hardware, device=dev)))  # a microbenchmark: burst clock
    bh, seq, head_dim = sh.microbatch_size * inp.model.n_heads, sh.seq_len, inp.model.head_dim_
    pass_s = dev.memory_time(bh * seq * seq * 2)  # one read or write of the fp16 scores
    mask = 2.0 if causal else 0.0                  # the causal mask's add: read and write
    if scores:
        forward, backward = scores_traffic(inp, 1.0) + mask * pass_s, scores_traffic(inp, 2.0)
    else:  # softmax read and write; its backward: gradient and output read, written
        forward, backward = (2.0 + mask) * pass_s, 3.0 * pass_s
    forward += unfused_attention_gemms(inp, False)
    backward += unfused_attention_gemms(inp, True)
    flops = 3.5 * 4.0 * bh * seq * seq * head_dim / (2 if causal else 1)
    return flops / (forward + backward) / 1e12


def main() -> None:
    layers = {(hd, seq): _layer("dgx-a100-80g", hd, seq) for hd in (64, 128) for seq in SEQS}
    for label, charged in (("the elementwise kernels' own traffic", False), ("parsim's scores_traffic", True)):
        errors = []
        print(f"{label}: predicted / published TFLOP/s by sequence length (512 .. 8k)")
        for (head_dim, causal), bars in PYTORCH_BARS.items():
            cells = []
            for seq, published in zip(SEQS, bars):
                p = predicted_tflops(layers[head_dim, seq], causal, charged)
                errors.append(p / published - 1)
                cells.append(f"{p:6.1f} / {published:3d}")
            print(f"  head dim {head_dim:3d}, {'causal' if causal else 'full  '}: " + "   ".join(cells))
        print(f"  MAPE {100 * statistics.mean(abs(e) for e in errors):.1f}%, "
              f"bias {100 * statistics.mean(errors):+.1f}% (+: parsim faster than PyTorch ran)")


if __name__ == "__main__":
    main()
