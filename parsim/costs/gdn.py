"""The Gated DeltaNet delta rule of one layer, one microbatch, one GPU: its kernels, their bytes and
matmuls.

Gated DeltaNet (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks", arXiv:2412.06464) keeps, per
value head, a K x V state S updated token by token as S <- a S (I - b k k^T) + b v k^T. Training
runs it chunked (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule",
arXiv:2406.06484, Sec. 3: the WY representation of each chunk's products of Householder-like
factors) in flash-linear-attention's Triton kernels, ``fla.ops.gated_delta_rule.chunk_gated_delta_rule``,
which Megatron-Core's ``GatedDeltaNet`` and Transformers' Qwen3-Next / Qwen3.5 call. Per sequence of
T tokens cut into chunks of C = 64, with H value heads of V channels and keys of K channels (the
query / key heads repeated over the value heads they serve):

forward (``chunk_gated_delta_rule_fwd``, six kernels)

1. ``chunk_local_cumsum``: the gates' within-chunk cumulative log decay (fp32, one a head and token);
2. ``chunk_scaled_dot_kkt_fwd``: A = b K K^T o decay, strictly lower, a (C x K) @ (K x C) matmul per
   chunk and head, written in fp32;
3. ``solve_tril``: (I + A)^-1 of each chunk (C^3 / 3 a chunk and head), written at the keys' precision;
4. ``recompute_w_u_fwd``: the WY factors w = A (b k e^g) and u = A (b v), (C x C) @ (C x K) and
   (C x C) @ (C x V);
5. ``chunk_gated_delta_rule_fwd_h``: the state pass, sequential over a sequence's chunks: v' = u - w S
   and S <- e^g S + k^T v', (C x K) @ (K x V) and (K x C) @ (C x V), each chunk's state written;
6. ``chunk_fwd_o``: o = q S e^g + (q k^T o decay) v', (C x K) @ (K x V), (C x K) @ (K x C) and
   (C x C) @ (C x V);

backward (``chunk_gated_delta_rule_bwd``): kernels 4 and 5 again (the states are recomputed, not
kept), then ``chunk_bwd_dv_local``, ``chunk_gated_delta_rule_bwd_dhu`` (the state gradients,
sequential backwards over the chunks), ``chunk_bwd_dqkwg``, ``prepare_wy_repr_bwd`` and the reverse
``chunk_local_cumsum`` of the gates' gradient.

Each kernel is costed as what bounds it: its matmul FLOPs at :data:`GDN_FLOP_PER_CLOCK_PER_SM` per SM
and clock, or its tensors through HBM at the streaming rate, whichever is longer. The two sequential
state kernels run one thread block per value head and 64-channel slice of V (flash-linear-attention's
grid), so when a microbatch has fewer of those blocks than the GPU has SMs they use that share of it.
The rate is a documented fit of that one quantity, the kernels' achieved FLOP rate per SM and clock,
on measured forward times of ``chunk_gated_delta_rule`` (``benchmarks/fit_gdn_scan.py``: aiconfigurator's
H100 rows at a whole model's heads fitted; its tensor-parallel shares, B200 and GB200 held out). The
backward is the same rate over its own kernels' FLOPs (no backward time at a stated shape was found
that is not dominated by a per-call host floor). Other GPUs scale by their SM count and clock, as the
SSD scan's (:mod:`parsim.costs.ssd`), and training's power-saturated clock applies.
Launches are the caller's; the q / k L2 norms, the convolution and the gated output norm are
memory-bound work of the layer (``parsim.model.layer_elementwise_bytes``).
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.cluster.kernels import sm_clock_hz
from parsim.cluster.precision import PRECISION_TABLE
from parsim.costs.ssd import Kernel, kernels_time


@dataclass(frozen=True)
class DeltaShape:
    """One rank's share of one Gated DeltaNet layer's delta rule, for one microbatch."""

    sequences: int
    """Sequences the rank runs (the microbatch): each has its own state pass."""
    tokens: int
    """Tokens of each sequence."""
    heads: int
    """H: this rank's value heads (the model's over tensor and context parallelism)."""
    key_dim: int
    """K."""
    value_dim: int
    """V."""
    chunk: int = 64
    """C."""


STATE_BLOCK_V = 64
"""Value channels a thread block of the sequential state kernels owns (flash-linear-attention's
``chunk_gated_delta_rule_fwd_h`` / ``_bwd_dhu`` grid: ``(cdiv(V, BV), N * H)``, BV 64 on Hopper)."""


def _mm(m: int, n: int, k: int, count: float) -> float:
    return 2.0 * m * n * k * count


def forward_kernels(s: DeltaShape, act_bytes: float) -> tuple[Kernel, ...]:
    """The forward's six kernels (module docstring)."""
    h, k, v, c = s.heads, s.key_dim, s.value_dim, s.chunk
    t = s.sequences * s.tokens
    n = s.sequences * -(-s.tokens // c) * h  # chunks x heads
    a = act_bytes
    q_, k_, v_ = t * h * k * a, t * h * k * a, t * h * v * a
    g32 = t * h * 4.0
    states = n * k * v * a
    return (
        Kernel("chunk_local_cumsum", 2 * g32),
        Kernel("chunk_scaled_dot_kkt_fwd", k_ + g32 + t * h * a + t * h * c * 4.0, _mm(c, c, k, n)),
        Kernel("solve_tril", t * h * c * 4.0 + t * h * c * a, _mm(c, c, c, n) / 6),
        Kernel("recompute_w_u_fwd", k_ + v_ + t * h * c * a + g32 + t * h * a + k_ + v_,
               _mm(c, k, c, n) + _mm(c, v, c, n)),
        Kernel("chunk_gated_delta_rule_fwd_h", 2 * k_ + 2 * v_ + g32 + states, _mm(c, v, k, n) + _mm(k, v, c, n)),
        Kernel("chunk_fwd_o", q_ + k_ + v_ + states + g32 + v_, _mm(c, v, k, n) + _mm(c, c, k, n) + _mm(c, v, c, n)),
    )


def backward_kernels(s: DeltaShape, act_bytes: float) -> tuple[Kernel, ...]:
    """The backward's kernels: the WY factors and the states recomputed, then the gradients (module
    docstring); gradients at the activations' precision, the gates' in fp32."""
    h, k, v, c = s.heads, s.key_dim, s.value_dim, s.chunk
    t = s.sequences * s.tokens
    n = s.sequences * -(-s.tokens // c) * h
    a = act_bytes
    q_, k_, v_ = t * h * k * a, t * h * k * a, t * h * v * a
    g32 = t * h * 4.0
    states = n * k * v * a
    recompute = forward_kernels(s, act_bytes)[3:5]
    return recompute + (
        Kernel("chunk_bwd_dv_local", q_ + k_ + g32 + 2 * v_, _mm(c, c, k, n) + _mm(c, v, c, n)),
        Kernel("chunk_gated_delta_rule_bwd_dhu", q_ + 2 * k_ + g32 + 3 * v_ + states,
               _mm(k, v, c, n) * 2 + _mm(c, v, k, n)),
        Kernel("chunk_bwd_dqkwg", q_ + 2 * k_ + 2 * v_ + 2 * states + g32 + 3 * k_ + g32,
               3 * _mm(c, k, v, n) + 2 * _mm(c, k, c, n) + _mm(c, c, v, n)),
        Kernel("prepare_wy_repr_bwd", 2 * k_ + 2 * v_ + t * h * c * a + g32 + t * h * a + k_ + v_ + 2 * g32,
               _mm(c, c, k, n) + _mm(c, c, v, n) + _mm(c, k, c, n) + _mm(c, v, c, n) + 2 * _mm(c, c, c, n)
               + 2 * _mm(c, k, c, n)),
        Kernel("chunk_local_cumsum", 2 * g32),
    )


SEQUENTIAL = ("chunk_gated_delta_rule_fwd_h", "chunk_gated_delta_rule_bwd_dhu")
"""The kernels that walk a sequence's chunks one after another (one thread block per head and
value slice)."""


GDN_FLOP_PER_CLOCK_PER_SM = 295.6
"""FLOPs the delta-rule kernels (flash-linear-attention Triton) achieve per SM per clock, counting the
chunked algorithm's matmuls (:func:`forward_kernels`): 71 TFLOP/s on an H100 SXM's 132 SMs at
1,830 MHz, 7% of its BF16 tensor peak. The fit of ``benchmarks/fit_gdn_scan.py`` on aiconfigurator's
H100 times of ``chunk_gated_delta_rule`` at 16 key heads (160 rows: MAPE 8.5%, bias -0.1%); held out,
the H100's tensor-parallel shares of the heads (652 rows: 30%, the model +19% slow where few heads
leave the state kernels' SMs idle), the B200 (812 rows: 43%, +42% slow) and the GB200 (812 rows: 26%,
+18% slow) -- Blackwell's kernels gain more than its SM count and clock give, less than its doubled
tensor-core rate would (scaling by that instead: -21% and -34%)."""


def state_share(dev, s: DeltaShape) -> float:
    """Share of the GPU the sequential state kernels fill: their thread blocks over its SMs (at most 1)."""
    blocks = s.sequences * s.heads * -(-s.value_dim // STATE_BLOCK_V)
    return min(1.0, blocks / dev.kernels.sm_count)


def delta_rate(dev) -> float:
    """FLOP/s of the delta-rule kernels on ``dev``: its SMs at the kernel models' clock
    (:func:`parsim.cluster.kernels.sm_clock_hz`)."""
    return GDN_FLOP_PER_CLOCK_PER_SM * dev.kernels.sm_count * sm_clock_hz(dev)


def delta_kernels_time(dev, s: DeltaShape, kernels: tuple[Kernel, ...]) -> float:
    """Seconds of ``kernels``: each the longer of its FLOPs at :func:`delta_rate` (the sequential ones
    at their share of the SMs) and its bytes at the streaming rate."""
    rate, share = delta_rate(dev), state_share(dev, s)
    return sum(max(kn.flops / (rate * (share if kn.name in SEQUENTIAL else 1.0)), dev.memory_time(kn.bytes))
               for kn in kernels)


def delta_times(dev, shape: DeltaShape, precision: str) -> tuple[float, float, int, int]:
    """(forward seconds, backward seconds, forward kernels, backward kernels) of one layer's delta
    rule; its tensors at the activations' 16-bit precision (outside the FP8 recipes' GEMMs)."""
    a = PRECISION_TABLE["fp16" if precision == "fp16" else "bf16"].activation_bytes
    f, b = forward_kernels(shape, a), backward_kernels(shape, a)
    return delta_kernels_time(dev, shape, f), delta_kernels_time(dev, shape, b), len(f), len(b)


__all__ = ["DeltaShape", "forward_kernels", "backward_kernels", "delta_times", "delta_rate", "state_share",
           "GDN_FLOP_PER_CLOCK_PER_SM", "kernels_time"]
