"""Fused (Flash) attention time from the kernel's work decomposition: shapes in, seconds out.

Forward (FlashAttention-2 Alg. 1; FlashAttention-3 and -4 keep the decomposition): one thread
block (CTA) per (batch, head, block of ``Bq`` query rows) walks the key/value blocks of
``Bk`` columns. Each step does two matmuls (``S = Q K^T``, ``O += P V``: ``4 Bq Bk d`` FLOP)
and the softmax of ``Bq Bk`` scores, whose exponentials run on the special-function units
(16 per SM per clock against thousands of tensor-core FLOP: FlashAttention-3 Sec. 3.2,
"989 TFLOPS of FP16 matmul but only 3.9 TFLOPS of special functions"). What a kernel hides of
the softmax behind the matmuls is its design (FA2: little; FA3: ping-pong warpgroups; FA4:
part of the exponentials emulated on the FMA units), so each kernel carries:

* ``mma_fraction``: the tensor-core rate its inner loop sustains, as a fraction of peak;
* ``softmax_cost``: softmax time left exposed per score element, in SFU exponentials;
* ``cta_io``: a CTA's prologue and epilogue traffic (forward: Q and the first K/V block in,
  O out; backward: K, V and the first Q/dO block in, dK and dV out) left exposed, as a
  multiple of its time at the SM's share of HBM bandwidth (all SMs start and finish together);
* ``diag_extra``: extra cost of a block the causal mask cuts (mask arithmetic), in steps.

Causal masking skips the blocks above the diagonal (FA2 Sec. 3.1: 1.7-1.8x faster than
non-causal); the diagonal blocks are computed whole although the FLOP count credits half.
CTAs are scheduled longest first over the SMs (the last partial wave of short sequences
leaves SMs idle: under-occupancy). Backward (FA2 Alg. 2): one CTA per block of ``Bk`` keys
walks the query blocks with five matmuls per step (``10 Bq Bk d`` FLOP, 2.5x the forward's),
plus two memory-bound kernels around it: ``D = rowsum(dO * O)`` before, and the fp32 ``dQ``
accumulator (atomic adds) converted after; with GQA the per-query-head ``dK, dV`` are summed.
HBM traffic (Q, K, V, O once; K/V shared by ``heads / kv_heads`` query heads) is a floor.

The four numbers per kernel and pass are fitted to the kernel papers' published TFLOP/s by
sequence length (FA2, FA3: least squares over the figures' bars; FA4: solved from its stated
peak and a measured FA4/FA3 ratio); the points are listed, with figure numbers, in
tests/test_kernels.py, which holds the model to them within 10% (held-out points included).
The device side (SM count, tensor FLOP and SFU ops per clock, HBM bandwidth) comes from the profile.
Known miss: FA3 causal at head dim 256 runs 11-23% slower in the paper than this model says.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from parsim.cluster.kernels import BASE_PRECISIONS, INPUT_BYTES, sm_clock_hz

ATTENTION_PRECISIONS = ("bf16", "fp16", "fp8")
"""Precisions the fused kernels run (FP8: FlashAttention-3 Sec. 3.3, cuDNN on Hopper/Blackwell)."""


@dataclass(frozen=True)
class PassModel:
    """One pass (forward or backward) of one fused-attention kernel."""

    mma_fraction: float
    """Fraction of the tensor-core peak its inner-loop matmuls sustain."""
    softmax_cost: float
    """Exposed non-matmul time per score element, in special-function (exp) operations."""
    cta_io: float
    """Exposed prologue/epilogue HBM traffic per CTA, as a multiple of its transfer time at the
    SM's share of HBM bandwidth."""
    diag_extra: float
    """Extra cost of a block the causal mask cuts, in inner-loop steps."""
    mask_cost: float = 0.0
    """Exposed mask arithmetic per score element on *every* block of a causal pass, in
    special-function operations: kernels that apply the mask to all blocks rather than only to
    the diagonal ones (the Triton FlashAttention kernel's ``tl.where`` in its inner loop); 0 for
    the CUDA kernels, which mask the diagonal blocks only (``diag_extra``)."""


@dataclass(frozen=True)
class AttentionKernel:
    """A fused attention kernel: its tiles by head dimension and its two passes."""

    name: str
    """Human name, e.g. ``"FlashAttention-3"``."""
    source: str
    """Paper and code the tiles and the fitted numbers come from."""
    forward: PassModel
    """Forward pass model."""
    backward: PassModel
    """Backward pass model."""
    fwd_tiles: tuple[tuple[int, int, int, int], ...]
    """(max head dim, Bq, Bk non-causal, Bk causal), first row whose head dim fits wins."""
    bwd_tiles: tuple[tuple[int, int, int], ...]
    """(max head dim, Bq, Bk) of the backward pass."""
    mma_scale: tuple[tuple[int, float], ...] = ()
    """(max head dim, factor) on both passes' ``mma_fraction``, first row whose head dim fits
    wins; none: 1. For kernels whose launch configuration changes with the head dimension in a
    way the tiles do not show (the Triton kernel: 4 warps up to head dim 64, 8 beyond)."""

    def mma_factor(self, head_dim: int) -> float:
        """The ``mma_scale`` factor for this head dimension (1 when none is given)."""
        return next((f for d, f in self.mma_scale if head_dim <= d), 1.0)

    def tile(self, head_dim: int, causal: bool, backward: bool) -> tuple[int, int]:
        """(Bq, Bk) for this head dimension; ValueError beyond the kernel's largest."""
        if backward:
            row = next((r for r in self.bwd_tiles if head_dim <= r[0]), None)
            if row is not None:
                return row[1], row[2]
        else:
            row4 = next((r for r in self.fwd_tiles if head_dim <= r[0]), None)
            if row4 is not None:
                return row4[1], row4[3] if causal else row4[2]
        raise ValueError(f"{self.name} supports head_dim up to {self.fwd_tiles[-1][0]}, got {head_dim}")


# Tiles: flash-attention csrc/flash_attn/src/flash_{fwd,bwd}_launch_template.h (sm80 branch)
# for FA2; for FA3 the kernel the paper measured, hopper/flash_{fwd,bwd}_launch_template.h at
# commit 74b0761 (July 2024; head dim 256 backward from today's hopper/flash_bwd_launch_template.h);
# FA4 (Blackwell, flash_attn/cute): two 128-row Q tiles per CTA forward, 128x128 backward
# with the 2-CTA MMA. Pass numbers: see fit notes beside each (tests/test_kernels.py lists the points).
KERNELS: dict[str, AttentionKernel] = {
    "fa2": AttentionKernel(
        name="FlashAttention-2",
        source="Dao 2023, arXiv:2307.08691: Fig. 4 (fwd+bwd, A100 80GB SXM4) and Sec. 1/4 (forward up to "
               "230 TFLOP/s = 73%, backward up to 63% of 312)",
        # least squares (log TFLOP/s) over the 22 legible bars of Fig. 4 and the two stated maxima
        # (read as head dim 128, non-causal, 16k); forward and backward share cta_io and
        # diag_extra (fwd+bwd cannot tell them apart); max error 4.9%
        forward=PassModel(mma_fraction=0.983, softmax_cost=1.358, cta_io=0.463, diag_extra=0.228),
        backward=PassModel(mma_fraction=0.707, softmax_cost=1.847, cta_io=0.463, diag_extra=0.228),
        fwd_tiles=((64, 128, 128, 128), (128, 128, 64, 64), (256, 128, 64, 64)),
        bwd_tiles=((64, 128, 128), (128, 64, 128), (256, 64, 64)),
    ),
    "fa3": AttentionKernel(
        name="FlashAttention-3",
        source="Shah et al. 2024, arXiv:2407.08608: Fig. 5 (forward) and Fig. 6 (backward), H100 80GB SXM5, BF16",
        # forward: least squares over the 24 bars of Fig. 5 (a-d), head dims 64 and 128, causal
        # and not (max error 7.5%); head dim 256 (Fig. 5 e-f) held out. The matmul rate may pass
        # the 989 TFLOP/s spec, which is counted at 1.83 GHz: H100 SXM boosts to 1.98 GHz
        # (stas00/ml-engineering, clock table), i.e. up to 1.08x. Backward: the 12 bars of Fig. 6
        # (non-causal; diag_extra taken from the forward), max error 3.1%.
        forward=PassModel(mma_fraction=1.050, softmax_cost=0.981, cta_io=0.420, diag_extra=0.387),
        backward=PassModel(mma_fraction=0.776, softmax_cost=1.632, cta_io=0.801, diag_extra=0.387),
        fwd_tiles=((64, 192, 128, 128), (128, 128, 176, 128), (256, 128, 80, 80)),
        bwd_tiles=((64, 128, 128), (128, 64, 128), (256, 64, 80)),
    ),
    "fa4": AttentionKernel(
        name="FlashAttention-4",
        source="Zadouri et al. 2026 (FlashAttention-4, B200 BF16): up to 1613 TFLOP/s (71%); stas00/ml-engineering "
               "insights/when-to-upgrade-gpus: FA4 on B200 / FA3 on H200, causal fwd+bwd, 32 heads, 8 KV heads, "
               "d=128: 1.88x at 8k, 1.95x at 32k",
        # forward: exponentials partly emulated on the FMA units and overlapped with the
        # asynchronous MMAs (the paper's design: 1024 MMA vs 1024 exp cycles per 128^3 step), so
        # no exposed softmax; mma_fraction solves 1613 TFLOP/s at d=128, non-causal, 16k tokens
        # (the papers' benchmark shape); cta_io and diag_extra carried over from FA3. Backward:
        # mma_fraction solves the 1.88x ratio at 8k (the 1.95x at 32k is held out); the paper's
        # shared-memory bound (3328 SMEM vs 2560 MMA cycles per step) alone would allow 0.563.
        forward=PassModel(mma_fraction=0.732, softmax_cost=0.0, cta_io=0.420, diag_extra=0.387),
        backward=PassModel(mma_fraction=0.494, softmax_cost=0.0, cta_io=0.801, diag_extra=0.387),
        fwd_tiles=((128, 256, 128, 128), (256, 128, 128, 128)),
        bwd_tiles=((128, 128, 128), (256, 64, 128)),
    ),
    "fa2-hopper": AttentionKernel(
        name="FlashAttention-2 on Hopper",
        source="Shah et al. 2024, arXiv:2407.08608: Fig. 5 and 6, the FlashAttention-2 bars on H100 80GB SXM5 "
               "(FA2's Ampere mma.sync kernels, no wgmma or TMA)",
        # benchmarks/fit_attention_kernels.py fa2: least squares over the 18 forward bars at head
        # dims 64 and 128 (causal and not) and the 9 backward bars: max error 7.6%, mean 1.7%;
        # head dim 256 held out (12 bars): mean error 15.8%, max 27%
        forward=PassModel(mma_fraction=0.418, softmax_cost=0.540, cta_io=0.348, diag_extra=0.836),
        backward=PassModel(mma_fraction=0.378, softmax_cost=1.394, cta_io=1.035, diag_extra=0.836),
        fwd_tiles=((64, 128, 128, 128), (128, 128, 64, 64), (256, 128, 64, 64)),
        bwd_tiles=((64, 128, 128), (128, 64, 128), (256, 64, 64)),
    ),
    "cudnn-hopper": AttentionKernel(
        name="cuDNN fused attention on Hopper",
        source="Shah et al. 2024, arXiv:2407.08608: Fig. 5 and 6, the cuDNN bars on H100 80GB SXM5 (the kernel "
               "Transformer Engine's FusedAttention backend runs: NeMo, Megatron-Core)",
        # benchmarks/fit_attention_kernels.py cudnn (FA3's tiles; the matmul rate capped at the
        # 1.98/1.83 boost ratio): 27 bars at head dims 64 and 128, max error 9.6%, mean 3.2%;
        # head dim 256 held out: mean error 28%, max 46% (its tiles there are not known)
        forward=PassModel(mma_fraction=1.082, softmax_cost=1.397, cta_io=0.105, diag_extra=1.083),
        backward=PassModel(mma_fraction=0.693, softmax_cost=1.583, cta_io=0.741, diag_extra=1.083),
        fwd_tiles=((64, 192, 128, 128), (128, 128, 176, 128), (256, 128, 80, 80)),
        bwd_tiles=((64, 128, 128), (128, 64, 128), (256, 64, 80)),
    ),
    "triton": AttentionKernel(
        name="FlashAttention (Triton)",
        source="Dao 2023, arXiv:2307.08691 Fig. 4, the 'FlashAttention Triton' bars (fwd+bwd, A100 80GB SXM4): "
               "flash_attn_triton.py, the kernel llm-foundry's attn_impl: triton runs",
        # benchmarks/fit_attention_fwd_bwd.py triton: BLOCK_M = BLOCK_N = 128 both passes; the
        # backward tied to the forward by FA2's ratios; the mask applied on every block of a
        # causal pass (its inner loop's tl.where); fit on panels (a)-(c), 18 bars: max error 8.0%,
        # mean 3.2%; panel (d) (head dim 128, causal) held out: mean 9.6%, max 16% (seq 512)
        forward=PassModel(mma_fraction=0.465, softmax_cost=0.941, cta_io=0.0, diag_extra=0.0, mask_cost=1.875),
        backward=PassModel(mma_fraction=0.334, softmax_cost=1.280, cta_io=0.0, diag_extra=0.0, mask_cost=2.550),
        fwd_tiles=((256, 128, 128, 128),),
        bwd_tiles=((256, 128, 128),),
        mma_scale=((64, 1.0), (256, 0.855)),  # 8 warps beyond head dim 64 (flash_attn_triton.py)
    ),
    "triton-hopper": AttentionKernel(
        name="FlashAttention (Triton) on Hopper",
        source="No published bars of the Triton kernel on H100: FlashAttention-1's H100 bars (the FA2 repository's "
               "assets/flash2_h100_fwd_bwd_benchmark.png) as a proxy -- on A100, where both are published, the "
               "Triton kernel is within -18%..+18% of FlashAttention-1, mean ratio 1.004 over 24 bars",
        # benchmarks/fit_attention_fwd_bwd.py triton-hopper: fit on panels (a)-(c): max error 4.5%,
        # mean 1.8%; panel (d) held out: mean 4.8%, max 10.1% (against the proxy bars)
        forward=PassModel(mma_fraction=0.336, softmax_cost=2.851, cta_io=0.0, diag_extra=0.048, mask_cost=1.115),
        backward=PassModel(mma_fraction=0.242, softmax_cost=3.878, cta_io=0.0, diag_extra=0.048, mask_cost=1.516),
        fwd_tiles=((256, 128, 128, 128),),
        bwd_tiles=((256, 128, 128),),
        mma_scale=((64, 1.0), (256, 0.620)),
    ),
}

IMPLEMENTATIONS = ("fa2", "fa3", "fa4", "cudnn", "triton")
"""What ``training.attention_kernel`` may name: the implementation a framework calls."""
VARIANTS: dict[tuple[str, str], str] = {
    ("fa2", "warp"): "fa2", ("fa2", "warpgroup"): "fa2-hopper",
    ("fa3", "warpgroup"): "fa3", ("fa4", "tile"): "fa4", ("cudnn", "warpgroup"): "cudnn-hopper",
    ("triton", "warp"): "triton", ("triton", "warpgroup"): "triton-hopper",
}
"""(implementation, the device's MMA style) -> the fitted kernel; missing pairs are not modelled
(FA3 runs on Hopper only, FA4 on Blackwell; FA2 and cuDNN have published bars on Ampere/Hopper only)."""


def resolve(implementation: str, mma_style: str) -> str | None:
    """The KERNELS entry for ``implementation`` on a device of ``mma_style``; None if not modelled."""
    return VARIANTS.get((implementation, mma_style))


# ------------------------------------------------------------------ scheduling
MAKESPAN_EXACT_JOBS = 2_000_000
"""Above this many jobs :func:`makespan` takes a list-scheduling estimate instead of placing each
job (a causal pass over 10^8 tokens is ~10^6 CTA groups, minutes of heap operations). Both lie
within the longest job of ``total / slots``: with a kernel's CTAs at most twice their mean (causal
rows: n steps at most, n/2 on average) that is under ``2 x slots / jobs`` of the step, 0.02%
here."""


def makespan(groups, slots: int, exact_jobs: int = MAKESPAN_EXACT_JOBS) -> float:
    """Greedy longest-first makespan of ``count`` jobs of ``duration`` each over ``slots``.

    ``groups`` is a list of (duration, count), or a pair of arrays (durations, counts). Each
    job goes to the earliest-free slot (the hardware block scheduler gives a freed SM the next
    block; FA3/FA4's persistent schedulers hand out the longest blocks first). Identical jobs
    are placed a whole round at a time when the slots' free times lie within one job of each
    other (then a round is exactly one job per slot), else one at a time. Beyond ``exact_jobs``
    jobs: every slot is busy until the job that ends last starts, so the makespan lies in
    [total / slots, total / slots + longest]; longest-first, that job is usually one of the
    shortest, p, and the estimate is ``(total - p) / slots + p``.
    """
    if isinstance(groups, tuple):  # (durations, counts) arrays
        durations, counts = groups
        live = counts > 0
        if int(counts[live].sum()) > exact_jobs:
            shortest = float(durations[live].min())
            return (float(np.dot(durations[live], counts[live])) - shortest) / slots + shortest
        groups = [(float(d), int(c)) for d, c in zip(durations[live], counts[live])]
    free = [0.0] * slots
    heapq.heapify(free)
    for duration, count in sorted(groups, reverse=True):
        while count:
            if count >= slots and max(free) - free[0] <= duration:
                rounds = count // slots
                free = [f + rounds * duration for f in free]  # order kept: still a heap
                count -= rounds * slots
            else:
                heapq.heapreplace(free, free[0] + duration)
                count -= 1
    return max(free) if free else 0.0


# ------------------------------------------------------------------ the model
def _rates(dev: Any, precision: str) -> tuple[float, float, float, int]:
    """(clock Hz, tensor FLOP/clock/SM at ``precision``, SFU ops/clock/SM, SMs) of ``dev``."""
    kf = dev.kernels
    base = next(p for p in BASE_PRECISIONS if p in dev.peak_flops)
    # the peak's clock, lowered to the power-saturated one under training load (dev.clock_ratio)
    flop_clk = kf.tensor_flop_per_clock_per_sm * dev.peak(precision) / dev.peak_flops[base]
    return sm_clock_hz(dev), flop_clk, kf.sfu_op_per_clock_per_sm, kf.sm_count


def _step_clocks(pm: PassModel, bq: int, bk: int, d: int, matmuls: int, flop_clk: float, sfu: float,
                 causal: bool = False) -> float:
    """Clocks of one inner-loop step: ``matmuls`` GEMMs of Bq x Bk x d plus exposed softmax (and
    the per-block mask of kernels that mask every block of a causal pass)."""
    exposed = pm.softmax_cost + (pm.mask_cost if causal else 0.0)
    return 2.0 * matmuls * bq * bk * d / (flop_clk * pm.mma_fraction) + exposed * bq * bk / sfu


def _groups(steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(steps, CTAs) per distinct positive step count, as arrays (a causal pass over 10^8
    tokens has ~10^6 query blocks)."""
    return np.unique(steps[steps > 0], return_counts=True)


def _forward_groups(pm: PassModel, sq: int, sk: int, bq: int, bk: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(inner-loop steps per CTA, CTAs per (batch, head)) over the query blocks."""
    n_k = math.ceil(sk / bk)
    n_blocks = math.ceil(sq / bq)
    if not causal:
        return _groups(np.full(n_blocks, n_k, dtype=np.int64))
    i = np.arange(n_blocks, dtype=np.int64)
    # bottom-right aligned mask: query row r sees keys < r + 1 + (sk - sq)
    last = np.minimum(sk, (i + 1) * bq + (sk - sq))
    first_cut = np.maximum(0, i * bq + 1 + (sk - sq))
    n = np.maximum(0, -(-last // bk))
    cut = n - np.minimum(n, first_cut // bk)
    return _groups(n + pm.diag_extra * cut)


def _backward_groups(pm: PassModel, sq: int, sk: int, bq: int, bk: int, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """(inner-loop steps per CTA, CTAs per (batch, head)) over the key blocks (each walks the query blocks)."""
    n_q = math.ceil(sq / bq)
    n_blocks = math.ceil(sk / bk)
    if not causal:
        return _groups(np.full(n_blocks, n_q, dtype=np.int64))
    j = np.arange(n_blocks, dtype=np.int64)
    # query rows r >= key column c - (sk - sq) see column c
    first_row = np.maximum(0, j * bk - (sk - sq))
    full_from = np.maximum(0, (j + 1) * bk - 1 - (sk - sq))
    n = n_q - np.minimum(n_q, first_row // bq)
    cut = np.minimum(n, np.maximum(0, -(-full_from // bq) - first_row // bq))
    return _groups(n + pm.diag_extra * cut)


def attention_flops(batch: int, seq_q: int, seq_k: int, heads: int, head_dim: int, causal: bool,
                    backward: bool) -> float:
    """FLOPs as the FlashAttention papers count them: forward ``4 b h sq sk d`` (halved with the
    causal mask), backward 2.5x the forward (5 matmuls against 2)."""
    f = 4.0 * batch * heads * seq_q * seq_k * head_dim / (2.0 if causal else 1.0)
    return 2.5 * f if backward else f


def attention_time(dev: Any, batch: int, seq_q: int, seq_k: int, heads: int, kv_heads: int, head_dim: int,
                   causal: bool = False, backward: bool = False, precision: str = "bf16",
                   kernel: str | None = None) -> float:
    """Seconds of one fused-attention pass on ``dev`` (a Device with ``kernels``)."""
    for name, v in (("batch", batch), ("seq_q", seq_q), ("seq_k", seq_k), ("heads", heads),
                    ("kv_heads", kv_heads), ("head_dim", head_dim)):
        if int(v) != v or v < 1:
            raise ValueError(f"attention: {name}={v} must be a positive integer")
    if heads % kv_heads:
        raise ValueError(f"attention: heads={heads} must be a multiple of kv_heads={kv_heads}")
    if precision not in ATTENTION_PRECISIONS:
        raise ValueError(f"attention: precision {precision!r} not one of {', '.join(ATTENTION_PRECISIONS)}")
    name = kernel or dev.kernels.attention_kernel
    if name not in KERNELS:
        raise ValueError(f"attention kernel {name!r} unknown (known: {', '.join(KERNELS)})")
    k = KERNELS[name]
    pm = k.backward if backward else k.forward
    bq, bk = k.tile(head_dim, causal, backward)
    clock, flop_clk, sfu, sms = _rates(dev, precision)
    el = INPUT_BYTES[precision]
    bw = dev.effective_memory_bandwidth
    step = _step_clocks(pm, bq, bk, head_dim, 5 if backward else 2, flop_clk * k.mma_factor(head_dim), sfu, causal)
    cta_bytes = ((4 * bk + 2 * bq) if backward else (2 * bq + 2 * bk)) * head_dim * el
    io = pm.cta_io * cta_bytes / (bw / sms / clock)
    groups = (_backward_groups if backward else _forward_groups)(pm, seq_q, seq_k, bq, bk, causal)
    per_head = batch * heads
    steps, n = groups
    compute = makespan((io + steps * step, n * per_head), sms) / clock
    q_o = 2.0 * batch * heads * seq_q * head_dim * el
    k_v = 2.0 * batch * kv_heads * seq_k * head_dim * el
    if not backward:
        return max(compute, (q_o + k_v) / bw)
    # backward: read Q, K, V, O, dO; write dQ, dK, dV; D and the fp32 dQ accumulator around it
    tokens_q = batch * heads * seq_q
    pre = (2.0 * tokens_q * head_dim * el + 4.0 * tokens_q) / bw          # D = rowsum(dO * O)
    post = (tokens_q * head_dim * (4.0 + 4.0 + el)) / bw                  # zero, read dQaccum, write dQ
    if kv_heads < heads:  # dK, dV per query head in fp32, summed over the group
        post += (2.0 * batch * heads * seq_k * head_dim * 4.0 * 2 + k_v) / bw
    main = max(compute, (2.0 * q_o + k_v + k_v) / bw)
    return pre + main + post
