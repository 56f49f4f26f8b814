"""The Mamba-2 SSD scan of one layer, one microbatch, one GPU: its kernels, their bytes and matmuls.

Mamba-2's scan (Dao & Gu 2024, "Transformers are SSMs", Sec. 6) runs as the chunked "state space
duality" algorithm of ``mamba_ssm/ops/triton/ssd_combined.py`` (``mamba_chunk_scan_combined``,
which Megatron-Core's ``MambaMixer`` calls). Per sequence of T tokens cut into chunks of Q, with H
heads of P channels, G groups of B and C projections of state size N:

forward (five Triton kernels)

1. ``_chunk_cumsum_fwd``: dt through softplus and its bias, the within-chunk cumulative decay
   ``dA_cumsum`` (fp32, one per head and token);
2. ``_chunk_state_fwd``: each chunk's final state B^T (decay * dt * x), an (N x Q) @ (Q x P)
   matmul per chunk and head, written in fp32;
3. ``_state_passing_fwd``: the states carried across chunks (a scan over T / Q steps), read in fp32
   and written at the activations' precision;
4. ``_bmm_chunk_fwd``: C B^T within each chunk and group, (Q x N) @ (N x Q), written in fp32;
5. ``_chunk_scan_fwd``: the outputs, the masked within-chunk product (CB o decay) @ x, (Q x Q) @
   (Q x P), plus the carried state's contribution C @ state, (Q x N) @ (N x P), and D x.

backward: the first four again (``_mamba_chunk_scan_combined_bwd`` recomputes the states rather
than keeping them), then ``_chunk_scan_bwd_dstates``, ``_state_passing_bwd``,
``_chunk_scan_chunk_state_bwd_dx``, ``_chunk_state_bwd_db``, ``_chunk_scan_bwd_dC``,
``_chunk_scan_bwd_dcb``, ``_bmm_chunk_bwd`` (twice: dB and dC), ``_chunk_scan_bwd_ddAcs_stable`` and
``_chunk_cumsum_bwd``.

Each kernel is costed as what bounds it: its matmul FLOPs (the chunked algorithm's, counted per
kernel below) at :data:`SSD_FLOP_PER_CLOCK_PER_SM` per SM and clock, or the tensors it reads and
writes through HBM at the device's streaming rate, whichever is longer; launches are the caller's.
The rate is not the tensor cores': these Triton kernels keep small tiles, fp32 intermediates and a
sequential state scan, and run at ~6% of Hopper's BF16 peak. It is a documented fit of that one
quantity, the kernels' achieved FLOP rate per SM-clock, on published measurements of the forward
(``benchmarks/fit_ssd_scan.py``: TileOPs PR #1557, ``mamba_chunk_scan_combined`` on an H200 at a
locked 1,830 MHz, CUPTI kernel time with L2 flushed; fitted on the five 32k-token rows, the five
batch-32 rows held out). The backward is the same rate over its own kernels' FLOPs (no published
backward time with a stated shape was found: PR #827's per-kernel table is not readable). Other
GPUs scale by their SM count and clock (the kernels are not tensor-core bound), and training's
power-saturated clock applies (``Device.clock_ratio``).
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.cluster.kernels import sm_clock_hz
from parsim.cluster.precision import PRECISION_TABLE


@dataclass(frozen=True)
class ScanShape:
    """One rank's share of one Mamba-2 layer's scan, for one microbatch."""

    tokens: int
    """T: tokens the rank scans (microbatch x sequence)."""
    heads: int
    """H: this rank's heads (the model's over tensor parallelism)."""
    head_dim: int
    """P."""
    state: int
    """N."""
    groups: int
    """G: this rank's groups of B and C."""
    chunk: int
    """Q."""


@dataclass(frozen=True)
class Kernel:
    """One scan kernel: what it moves and multiplies."""

    name: str
    """The Triton kernel (``mamba_ssm/ops/triton``)."""
    bytes: float
    """HBM bytes read and written."""
    flops: float = 0.0
    """Its per-chunk matmuls' FLOPs (2 m n k each)."""


def _mm(m: int, n: int, k: int, count: float) -> float:
    """FLOPs of ``count`` (m x k) @ (k x n) matmuls."""
    return 2.0 * m * n * k * count


def forward_kernels(s: ScanShape, act_bytes: float) -> tuple[Kernel, ...]:
    """The forward's five kernels (module docstring)."""
    t, h, p, n, g, q = s.tokens, s.heads, s.head_dim, s.state, s.groups, s.chunk
    a = act_bytes
    c = -(-t // q)  # chunks
    states32 = c * h * p * n * 4.0
    x, bc, dt = t * h * p * a, t * g * n * a, t * h * 4.0  # x; one of B, C; one fp32 per head and token
    cb = c * g * q * q * 4.0
    return (
        Kernel("_chunk_cumsum_fwd", t * h * a + 2 * dt),
        Kernel("_chunk_state_fwd", bc + x + 2 * dt + states32, _mm(n, p, q, c * h)),
        Kernel("_state_passing_fwd", states32 + c * h * p * n * a + c * h * 4.0),
        Kernel("_bmm_chunk_fwd", 2 * bc + cb, _mm(q, q, n, c * g)),
        Kernel("_chunk_scan_fwd", cb + 2 * x + bc + c * h * p * n * a + 2 * dt,
               _mm(q, p, q, c * h) + _mm(q, p, n, c * h)),
    )


def backward_kernels(s: ScanShape, act_bytes: float) -> tuple[Kernel, ...]:
    """The backward's kernels: the states recomputed (the forward's first four), then the
    gradients (module docstring); ``dout`` and the input gradients at the activations' precision,
    ``dstates`` and the partial dB, dC, dCB in fp32."""
    t, h, p, n, g, q = s.tokens, s.heads, s.head_dim, s.state, s.groups, s.chunk
    a = act_bytes
    c = -(-t // q)
    states32, states = c * h * p * n * 4.0, c * h * p * n * a
    x, bc, dt = t * h * p * a, t * g * n * a, t * h * 4.0
    cb = c * g * q * q * 4.0
    recompute = forward_kernels(s, act_bytes)[:4]
    return recompute + (
        Kernel("_chunk_scan_bwd_dstates", bc + x + dt + states32, _mm(n, p, q, c * h)),
        Kernel("_state_passing_bwd", 2 * states32 + states + 2 * c * h * 4.0),
        Kernel("_chunk_scan_chunk_state_bwd_dx", 3 * x + 3 * dt + bc + cb + states32,
               _mm(q, p, q, c * h) + _mm(q, p, n, c * h)),
        Kernel("_chunk_state_bwd_db", x + 2 * dt + states32 + 2 * bc, _mm(q, n, p, c * h)),
        Kernel("_chunk_scan_bwd_dC", states + x + dt + 2 * bc, _mm(q, n, p, c * h)),
        Kernel("_chunk_scan_bwd_dcb", 2 * x + 2 * dt + cb, _mm(q, q, p, c * h)),
        Kernel("_bmm_chunk_bwd", 2 * bc + cb, _mm(q, n, q, c * g)),
        Kernel("_bmm_chunk_bwd", 2 * bc + cb, _mm(q, n, q, c * g)),
        Kernel("_chunk_scan_bwd_ddAcs_stable", 2 * x + 2 * dt + cb, _mm(q, q, p, c * h)),
        Kernel("_chunk_cumsum_bwd", 4 * dt + t * h * a),
    )


SSD_FLOP_PER_CLOCK_PER_SM = 250.1
"""FLOPs the SSD scan kernels (``mamba_ssm`` Triton, forward and backward) achieve per SM per clock,
counting the chunked algorithm's matmuls (:func:`forward_kernels`): 60.4 TFLOP/s on an H200's 132 SMs
at 1,830 MHz, the fit of ``benchmarks/fit_ssd_scan.py`` (module docstring): 3.3% on the five
32k-token rows it is fitted on, 10.6% on the five batch-32 rows held out (H = 24 +32%, the others
within 9%); the batch-8 rows, measured twice up to 30% apart, run 42-120% faster than this."""


def scan_rate(dev) -> float:
    """FLOP/s of the scan kernels on ``dev``: its SMs at the kernel models' clock
    (:func:`parsim.cluster.kernels.sm_clock_hz`)."""
    return SSD_FLOP_PER_CLOCK_PER_SM * dev.kernels.sm_count * sm_clock_hz(dev)


def kernels_time(dev, kernels: tuple[Kernel, ...]) -> float:
    """Seconds of ``kernels`` on ``dev``: each the longer of its FLOPs at :func:`scan_rate` and its
    bytes at the streaming rate (kernel launches are the caller's)."""
    rate = scan_rate(dev)
    return sum(max(k.flops / rate, dev.memory_time(k.bytes)) for k in kernels)


def scan_times(dev, shape: ScanShape, precision: str) -> tuple[float, float, int, int]:
    """(forward seconds, backward seconds, forward kernels, backward kernels) of one scan. Its
    tensors are at the activations' 16-bit precision (the scan is not in Transformer Engine's FP8
    recipes)."""
    a = PRECISION_TABLE["fp16" if precision == "fp16" else "bf16"].activation_bytes
    f, b = forward_kernels(shape, a), backward_kernels(shape, a)
    return kernels_time(dev, f), kernels_time(dev, b), len(f), len(b)
