"""GEMM time from the kernel's physics: shapes in, seconds out (no transformer knowledge here).

A tensor-core GEMM ``C[m x n] = A[m x k] @ B[k x n]`` is cut into output tiles of the kernel's
tile size; each tile is one thread block (CTA) that walks the K dimension; CTAs run in waves
over the SMs (Anthony et al. 2024, "The Case for Co-Designing Model Architectures with
Hardware", arXiv:2401.14489: tile quantization and wave quantization; one tile more than a
full wave costs a whole extra wave). Per CTA:

* main loop: ``2 * tm * tn * k_cta`` FLOP at the SM's share of the device's main-loop rate,
  slowed when shared memory cannot feed the tensor cores: each operand element is written to
  shared memory once and read once, ``2 * (tm + tn) * bytes`` per k, against
  ``smem_byte_per_clock_per_sm`` (small tiles reuse less, so they starve first);
* per tile, the epilogue: C staged through shared memory (written, then read by the store),
  which a short K cannot amortise -- the K-dimension roll-off (on Hopper and Blackwell the
  warp-specialized persistent kernels overlap it with the next tile); once, the pipeline fill
  (the first K block, cold from HBM at the SM's share of its bandwidth; later tiles' loads
  overlap the previous tile, and stores drain into L2);
* ``k`` rounds up to the kernel's K block (128 bytes of A and B per row);
* split-K when there are too few output tiles to fill the SMs (small m and n, long k): the
  fp32 partial tiles are written and reduced through HBM; on Hopper and Blackwell, Stream-K
  (``stream_k``) instead spreads all tiles' K blocks evenly over the SMs.

The library picks the fastest (tile, split) it has (cuBLAS heuristics), so the model takes the
minimum over the device's tile list; the HBM roofline (A, B read once, C written once) is a
floor. The main-loop rate is not a free factor: it is calibrated so the model reproduces the
device's measured maximum achievable matmul (MAMF, stas00/ml-engineering) at the shape it was
measured at (``mamf_<precision>_shape``); other shapes then follow from the tiles and waves.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from parsim.cluster.pace import chip_sigma, slowest_chip_share
from parsim.errors import ConfigError
from parsim.units import to_si

BASE_PRECISIONS = ("bf16", "fp16")
"""The tensor-core rate ``tensor_flop_per_clock_per_sm`` is counted in (bf16, else fp16)."""


def sm_clock_hz(dev: Any) -> float:
    """The SM clock ``dev``'s kernel models run at: the clock its base (BF16, else FP16) tensor
    peak implies over its SMs, times the power-saturated share under training load
    (``Device.clock_ratio``; 1 in a burst). Needs kernel facts."""
    kf = dev.kernels
    base = next(p for p in BASE_PRECISIONS if p in dev.peak_flops)
    return dev.peak_flops[base] / (kf.sm_count * kf.tensor_flop_per_clock_per_sm) * dev.clock_ratio
INPUT_BYTES = {"bf16": 2.0, "fp16": 2.0, "tf32": 4.0, "fp32": 4.0, "fp8": 1.0,
               "mxfp8": 1.0 + 1.0 / 32.0, "nvfp4": 0.5 + 1.0 / 16.0}
"""Bytes per A/B element a kernel reads (MXFP8: one 8-bit scale per 32 elements, OCP MX spec;
NVFP4: 4-bit E2M1 elements with one E4M3 scale per 16, Transformer Engine's NVFP4 docs)."""
OUTPUT_BYTES = {"bf16": 2.0, "fp16": 2.0, "tf32": 4.0, "fp32": 4.0, "fp8": 2.0, "mxfp8": 2.0, "nvfp4": 2.0}
"""Bytes per C element written (FP8 GEMMs write bf16, as torch._scaled_mm / Transformer Engine)."""
K_BLOCK_BYTES = 128
"""Bytes of one row of an A/B K-block (64 bf16, 128 fp8 elements): the 128-byte swizzled
shared-memory row that Hopper TMA / Ampere ldg8 kernels load (cuBLAS names ``...x64_...`` for
bf16); k rounds up to it."""


def k_block_elements(in_bytes: float) -> int:
    """Elements of one K-block row: 128 bytes of the element type (block scales ride beside the
    rows: MXFP8's 1/32 and NVFP4's 1/16 byte an element do not count), so 64 bf16, 128 fp8,
    256 fp4 (E2M1, two to a byte)."""
    element = 0.5 if in_bytes < 1.0 else float(int(in_bytes))
    return int(K_BLOCK_BYTES / element)


SPLIT_K = (1, 2, 3, 4, 6, 8, 12, 16)
"""Split-K factors a library tries when the output tiles do not fill the SMs."""
PARTIAL_BYTES = 4.0
"""fp32 partial-sum element of a split-K reduction."""


@dataclass(frozen=True)
class KernelFacts:
    """Per-device facts the kernel models need (profile keys under ``[device]``, each sourced)."""

    sm_count: int
    """Streaming multiprocessors (``multi_processor_count``); one CTA slot per SM per wave."""
    tensor_flop_per_clock_per_sm: float
    """Dense bf16 (fp16 where there is no bf16) tensor-core FLOP per SM per clock."""
    sfu_op_per_clock_per_sm: float
    """Special-function (exp2) results per SM per clock (CUDA guide throughput table: 16)."""
    smem_byte_per_clock_per_sm: float
    """Shared-memory bandwidth per SM per clock (32 banks x 4 bytes = 128)."""
    gemm_tiles: tuple[tuple[int, int, int], ...]
    """Output tiles (tm, tn, sms) the GEMM library has for this architecture; ``sms = 2`` is a
    Blackwell CTA pair (2-SM UMMA) sharing one tm x tn tile, each SM loading half of A and B."""
    mma_style: str = "warp"
    """Who reads the MMA operands from shared memory (PTX ISA): ``"warp"`` (mma.sync, Volta and
    Ampere: each warp its own slice of A and B, warp tiles of at most 64x64), ``"warpgroup"``
    (wgmma, Hopper: a 64-row warpgroup reads its A rows and all of B) or ``"tile"`` (tcgen05,
    Blackwell: the whole tile reads A and B once)."""
    stream_k: bool = False
    """The library balances the last partial wave by splitting K iterations across SMs
    (Stream-K, Osama et al. 2023; CUTLASS 3 / cuBLAS on Hopper and Blackwell), so whole-wave
    quantization does not apply; a split tile's partial sums go through an fp32 workspace."""
    mamf: Mapping[str, tuple[float, tuple[int, int, int] | None]] = field(default_factory=dict, hash=False)
    """Measured maximum achievable matmul by precision: (FLOP/s, (m, n, k) it was measured at)."""
    attention_kernel: str | None = None
    """Fused attention kernel of this architecture (``fa2``, ``fa3``, ``fa4``; see attention_kernels)."""
    gemm_latency_s: float = 0.0
    """Fixed device time of one GEMM kernel beyond its tiles' work: the launch reaching the SMs,
    the prologue (TMA descriptors, the first operands in flight) and the drain of the last
    stores -- what a tiny GEMM costs. Fitted per device to measured GEMM tables (profile key
    ``gemm_latency_us``; tests/test_gemm_tables.py holds the fit and its held-out error)."""
    grouped_gemm_setup_s: float = 0.0
    """Fixed device time a grouped launch over several problems takes beyond one GEMM's
    ``gemm_latency_s`` (``torch._grouped_mm``: the group offsets turned into per-problem arguments
    and each problem's TMA descriptors set before its tiles run), what a fine-grained expert layer
    pays per launch. Profile key ``grouped_gemm_setup_us`` (measured: benchmarks/gpu/measure.py's
    grouped rows, fitted on half of them, the other half held out); 0: not known."""
    collective_ctas: int = 0
    """SMs one NCCL collective holds while it runs inside the node (one CTA per channel): what
    overlapped compute loses while it is in flight (``parsim.cluster.contention``); 0: not known,
    overlapped communication is taken as free."""
    collective_ctas_net: int = 0
    """The same for a collective whose group spans nodes (NCCL builds fewer channels there);
    0: ``collective_ctas``."""
    msmf: tuple[float, float] | None = None
    """(sustained, burst) matmul TFLOP/s of one mamf-finder run: MSMF, the chip held at its power
    limit, and the same run's MAMF (profile keys ``msmf_bf16_tflops``, ``msmf_mamf_bf16_tflops``);
    None: not measured for this GPU (:attr:`saturated_ratio` 1)."""
    msmf_chip_range: tuple[float, int] | None = None
    """(range, chips) of the same measurement across the GPUs it ran on at once: how far the
    slowest chip's sustained rate sits below the fastest's, as a fraction of the mean, over that
    many chips (profile keys ``msmf_chip_range_pct``, ``msmf_chip_range_gpus``); None: not
    measured (every chip taken as the mean one: :meth:`slowest_chip_share` 1)."""

    def slowest_chip_share(self, gpus: int) -> float:
        """Sustained rate of the slowest of ``gpus`` chips over the mean chip's (the measured MSMF):
        a synchronous job waits on it every step (:mod:`parsim.cluster.pace`)."""
        if self.msmf_chip_range is None:
            return 1.0
        return slowest_chip_share(chip_sigma(*self.msmf_chip_range), gpus)

    @property
    def saturated_ratio(self) -> float:
        """Tensor-core rate of a chip held at its power limit, as a fraction of its rate in a
        short burst (MSMF / MAMF). The MAMF and the kernel papers' figures are bursts, run while
        the clock is still at boost; a training step keeps the SMs busy for seconds, the board
        sits at its power limit and the SM clock settles lower (stas00/ml-engineering: an H200
        at ~1405-1527 MHz against its 1980 MHz boost, a B200 at ~1228-1410 against 1965), so
        compute-bound kernels run at this fraction of their burst speed. HBM keeps its clock:
        memory-bound work is not scaled."""
        return 1.0 if self.msmf is None else self.msmf[0] / self.msmf[1]


MAX_TILE = 1024
"""Widest side of a GEMM output tile (the largest real ones are 256: cuBLAS/CUTLASS on Hopper and
Blackwell, 2-SM pairs included)."""


def parse_tile(text: str) -> tuple[int, int, int]:
    """``"128x256"`` -> (128, 256, 1); ``"256x256/2sm"`` (a CTA pair) -> (256, 256, 2)."""
    body, _, pair = str(text).lower().partition("/")
    parts = body.split("x")
    if (len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts)
            or pair not in ("", "1sm", "2sm") or (pair == "2sm" and int(parts[0]) % 2)
            or any(int(p) > MAX_TILE for p in parts)):
        raise ValueError(f"tile {text!r} must look like 128x256 or 256x256/2sm, each side at most {MAX_TILE}")
    return int(parts[0]), int(parts[1]), 2 if pair == "2sm" else 1


def format_tile(tile: tuple[int, int, int]) -> str:
    """(256, 256, 2) -> ``"256x256/2sm"``; the inverse of :func:`parse_tile`."""
    return f"{tile[0]}x{tile[1]}" + ("/2sm" if tile[2] == 2 else "")


def parse_shape(text: str) -> tuple[int, int, int]:
    """``"6912x16384x2048"`` (m x n x k, k the reduction) -> (6912, 16384, 2048)."""
    parts = str(text).lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shape {text!r} must look like MxNxK, e.g. 6144x17920x2816")
    return int(parts[0]), int(parts[1]), int(parts[2])


# ------------------------------------------------------------------ the device, as numbers
@dataclass(frozen=True)
class _Machine:
    """What one precision's GEMM sees of a device (derived, hashable)."""

    sm: int
    flop_per_clock: float      # tensor FLOP per SM per clock at this precision
    smem_per_clock: float
    bandwidth: float           # achievable HBM bytes/s
    in_bytes: float
    out_bytes: float
    tiles: tuple[tuple[int, int, int], ...]
    mma_style: str
    stream_k: bool
    latency: float = 0.0       # fixed seconds per kernel (KernelFacts.gemm_latency_s)


def _machine(dev: Any, precision: str) -> _Machine:
    kf: KernelFacts = dev.kernels
    base = next(p for p in BASE_PRECISIONS if p in dev.peak_flops)
    ratio = dev.peak(precision) / dev.peak_flops[base]  # same clock: per-clock rates scale as peaks
    return _Machine(kf.sm_count, kf.tensor_flop_per_clock_per_sm * ratio, kf.smem_byte_per_clock_per_sm,
                    dev.effective_memory_bandwidth, INPUT_BYTES[precision], OUTPUT_BYTES[precision],
                    kf.gemm_tiles, kf.mma_style, kf.stream_k, kf.gemm_latency_s)


MMA_STYLES = ("warp", "warpgroup", "tile")


def operand_reads(style: str, tm: int, tn: int) -> float:
    """A and B elements read from shared memory per k for one tm x tn tile (see ``mma_style``)."""
    if style == "warp":  # 4 warps (2x2) up to 128x128, 64x64 warp tiles beyond (CUTLASS sm80)
        wm, wn = min(64, tm // 2) or 1, min(64, tn // 2) or 1
        return tm * (tn / wn) + tn * (tm / wm)
    if style == "warpgroup":  # wgmma m64nNk16: A once, B once per 64 rows
        return tm + tn * max(1.0, tm / 64)
    return tm + tn


def feed_fraction(mc: _Machine, tm: int, tn: int, sms: int = 1) -> float:
    """Fraction of the tensor-core rate a (tm x tn) tile on ``sms`` SMs keeps when each SM's
    shared memory must take the operands in (``tm + tn`` per k) and give them to the MMAs
    (:func:`operand_reads`) at ``smem_per_clock`` while its tensor cores do ``2 tm tn / sms``
    FLOP per k. Small tiles reuse each operand less, so they starve first."""
    mma_clocks = 2.0 * tm * tn / sms / mc.flop_per_clock
    smem_bytes = (tm + tn + operand_reads(mc.mma_style, tm, tn)) / sms * mc.in_bytes
    return min(1.0, mma_clocks / (smem_bytes / mc.smem_per_clock))


def output_tiles(m: int, n: int, tile: tuple[int, ...], batch: int = 1) -> int:
    """Output tiles of ``batch`` m x n GEMMs cut in ``tile`` (its first two sides; ragged edges
    round up: tile quantization)."""
    return batch * math.ceil(m / tile[0]) * math.ceil(n / tile[1])


def _plan_time(mc: _Machine, rate: float, m: int, n: int, k: int, tile: tuple[int, int, int], split: int,
               batch: int = 1) -> float:
    """Seconds for ``batch`` GEMMs in one launch with ``tile`` and ``split``-way split-K (0: Stream-K)
    at ``rate``: a strided-batched launch puts every GEMM's tiles in one grid, so the waves run
    over all of them (cuBLAS ``gemmStridedBatched``: the batch is a grid dimension)."""
    tm, tn, sms = tile
    tiles = output_tiles(m, n, tile, batch)
    slots = mc.sm // sms
    k_block = k_block_elements(mc.in_bytes)
    clock = rate / (mc.sm * mc.flop_per_clock)  # the clock the main-loop rate implies
    per_sm_rate = rate / mc.sm * feed_fraction(mc, tm, tn, sms)
    block_time = 2.0 * tm * tn / sms * k_block / per_sm_rate   # one K block of one tile
    per_sm_bw = mc.bandwidth / mc.sm
    c_out = tm * tn / sms * mc.out_bytes
    # the epilogue stages C through shared memory (written, then read by the store); warp-
    # specialized persistent kernels (wgmma ping-pong, tcgen05 with its accumulator in tensor
    # memory) run it beside the next tile's main loop, so only the last one shows
    epilogue = 2.0 * c_out / mc.smem_per_clock / clock
    hidden = mc.mma_style != "warp"
    fill = (tm + tn) / sms * k_block * mc.in_bytes / per_sm_bw
    if split == 0:  # Stream-K: every SM gets an equal share of all tiles' K blocks
        blocks = tiles * math.ceil(k / k_block)
        per_slot = math.ceil(blocks / slots)
        # a tile cut between SMs passes its fp32 partial sums through the (L2-resident)
        # workspace: out of one SM and into another, at shared-memory speed on each side (a
        # constant, so the plan stays monotone; with whole waves the data-parallel plan wins)
        fixup = 2.0 * tm * tn / sms * PARTIAL_BYTES / mc.smem_per_clock / clock
        return (per_slot * block_time + (1 if hidden else math.ceil(tiles / slots)) * epilogue + fill + fixup
                + mc.latency)
    waves = math.ceil(tiles * split / slots)
    k_cta = math.ceil(math.ceil(k / split) / k_block) * k_block
    reduce = 0.0
    if split > 1:  # partials written, read back and the result written once, through HBM
        reduce = batch * (split * m * n * PARTIAL_BYTES + m * n * mc.out_bytes) / mc.bandwidth
    return waves * k_cta // k_block * block_time + (1 if hidden else waves) * epilogue + fill + reduce + mc.latency


def _best_time(mc: _Machine, rate: float, m: int, n: int, k: int,
               batch: int = 1) -> tuple[float, tuple[int, int, int], int]:
    """(seconds, tile, split) of the fastest plan the library has for ``batch`` GEMMs of this
    shape in one launch."""
    best: tuple[float, tuple[int, int, int], int] = (math.inf, mc.tiles[0], 1)
    for tile in mc.tiles:
        tiles = output_tiles(m, n, tile, batch)
        for split in SPLIT_K:
            if split > 1 and tiles * (split - 1) >= mc.sm // tile[2]:
                break  # the previous split already filled the SMs (fewer options as tiles grow: monotone)
            t = _plan_time(mc, rate, m, n, k, tile, split, batch)
            if t < best[0]:
                best = (t, tile, split)
        if mc.stream_k:
            t = _plan_time(mc, rate, m, n, k, tile, 0, batch)
            if t < best[0]:
                best = (t, tile, 0)
    return best


def gemm_bytes(m: int, n: int, k: int, precision: str) -> float:
    """HBM bytes of one GEMM moved once: A and B read, C written."""
    return (m * k + k * n) * INPUT_BYTES[precision] + m * n * OUTPUT_BYTES[precision]


@lru_cache(maxsize=256)
def _mainloop_rate(machine: _Machine, peak: float, mamf: float, shape: tuple[int, int, int] | None) -> float:
    """The device main-loop FLOP/s at which the model reproduces ``mamf`` at ``shape``.

    The model's time at a shape falls as the rate rises (monotone), so bisection finds it. A
    MAMF measured at an unknown shape is taken as the main-loop rate itself. Capped at peak.
    """
    if shape is None:
        return min(mamf, peak)
    # MAMF times long runs of back-to-back launches, where one kernel's launch and prologue
    # hide under the previous one's tail: the main loop is calibrated without the fixed latency
    machine = dataclasses.replace(machine, latency=0.0)
    m, n, k = shape
    flops = 2.0 * m * n * k
    lo, hi = mamf * 0.5, peak * 1.5
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if flops / _best_time(machine, mid, m, n, k)[0] < mamf:
            lo = mid
        else:
            hi = mid
    return min(hi, peak)


def mainloop_rate(dev: Any, precision: str) -> float:
    """Main-loop FLOP/s of ``precision`` GEMMs on ``dev`` (calibrated to its MAMF).

    Without a MAMF for this precision, the base precision's fraction of peak carries over (the
    same kernels at a different element size); without any MAMF, ``gemm_efficiency * peak``.
    """
    p = precision
    kf: KernelFacts = dev.kernels
    peak = dev.peak(p)
    if p in kf.mamf:
        flops, shape = kf.mamf[p]
        return _mainloop_rate(_machine(dev, p), peak, flops, shape)
    ref = next((q for q in BASE_PRECISIONS if q in kf.mamf and q in dev.peak_flops), None)
    if ref is None:
        return peak * dev.gemm_efficiency
    return peak * mainloop_rate(dev, ref) / dev.peak(ref)


def running_rate(dev: Any, precision: str) -> float:
    """Main-loop FLOP/s a GEMM on ``dev`` runs at: the burst (MAMF-calibrated) rate of
    :func:`mainloop_rate` times ``dev.clock_ratio`` (the power-saturated clock under training
    load, 1 for a burst: :meth:`~parsim.cluster.hardware.Device.burst`)."""
    return mainloop_rate(dev, precision) * dev.clock_ratio


def gemm_plan(dev: Any, m: int, n: int, k: int, precision: str, batch: int = 1) -> dict[str, Any]:
    """One GEMM on ``dev`` (``batch`` of them in one strided-batched launch): time (s), the
    chosen tile and split, waves, and whether the HBM roofline bound it. ``dev`` is a
    :class:`parsim.cluster.hardware.Device` with ``kernels``; its main loop at :func:`running_rate`."""
    mc = _machine(dev, precision)
    rate = running_rate(dev, precision)
    t, tile, split = _best_time(mc, rate, m, n, k, batch)
    floor = batch * gemm_bytes(m, n, k, precision) / mc.bandwidth
    tiles = output_tiles(m, n, tile, batch)
    return {"time_s": max(t, floor + mc.latency), "tile": format_tile(tile), "split_k": split,
            "stream_k": split == 0, "waves": math.ceil(tiles * max(split, 1) / (mc.sm // tile[2])),
            "memory_bound": floor > t, "mainloop_flops": rate}


def gemm_time(dev: Any, m: int, n: int, k: int, precision: str = "bf16", count: int = 1) -> float:
    """Seconds for ``count`` GEMMs ``(m x k) @ (k x n)`` on ``dev`` by the kernel model, issued
    as one batched launch (cuBLAS strided-batched: the attention core's per-head products): the
    tiles of all ``count`` GEMMs fill the waves together, the kernel's fixed latency once."""
    if min(m, n, k, count) < 0:
        raise ValueError(f"gemm: m={m}, n={n}, k={k}, count={count} must be >= 0")
    if m == 0 or n == 0 or k == 0 or count == 0:
        return 0.0
    return gemm_plan(dev, m, n, k, precision, count)["time_s"]


# ------------------------------------------------------------------ profile keys
KERNEL_FACT_KEYS = ("sm_count", "tensor_flop_per_clock_per_sm", "sfu_op_per_clock_per_sm",
                    "smem_byte_per_clock_per_sm", "gemm_tiles")
"""Device keys the kernel models need together (a profile gives all of them or none)."""


def facts_from_table(d: Mapping[str, Any], peaks: Mapping[str, float], precisions: tuple[str, ...],
                     file: str) -> KernelFacts | None:
    """The kernel facts of a checked ``[device]`` table (values already parsed), or None when it
    gives none; ConfigError for a partial set or a MAMF without its peak or above it."""
    for p in precisions:
        if f"mamf_{p}_shape" in d and f"mamf_{p}_tflops" not in d:
            raise ConfigError(file, f"device.mamf_{p}_shape", f"needs device.mamf_{p}_tflops beside it")
        if f"mamf_{p}_tflops" in d and p not in peaks:
            raise ConfigError(file, f"device.mamf_{p}_tflops", f"needs device.{p}_tflops (the peak) beside it")
    if not any(k in d for k in KERNEL_FACT_KEYS):
        for k, v in d.items():
            if (k.startswith(("mamf_", "msmf_")) or k in ("attention_kernel", "mma_style", "gemm_stream_k", "gemm_latency_us",
                                                                  "grouped_gemm_setup_us", "collective_ctas",
                                                                  "collective_ctas_net")
                    or (k == "gemm_model" and v == "kernel")):
                raise ConfigError(file, f"device.{k}",
                                  f"needs the kernel facts ({', '.join('device.' + x for x in KERNEL_FACT_KEYS)})")
        return None
    missing = [k for k in KERNEL_FACT_KEYS if k not in d]
    if missing:
        raise ConfigError(file, f"device.{missing[0]}",
                          f"missing: the kernel facts come together ({', '.join(KERNEL_FACT_KEYS)})")
    if not any(p in peaks for p in BASE_PRECISIONS):
        raise ConfigError(file, "device.bf16_tflops", "the kernel models need a bf16 or fp16 peak")
    # the peak is SMs x tensor FLOP per clock per SM x the clock: the clock these imply must be a clock
    base = next(p for p in BASE_PRECISIONS if p in peaks)
    clock = peaks[base] / (d["sm_count"] * d["tensor_flop_per_clock_per_sm"])
    if not CLOCK_RANGE_HZ[0] <= clock <= CLOCK_RANGE_HZ[1]:
        raise ConfigError(file, "device.sm_count",
                          f"{d['sm_count']:,} SMs x {d['tensor_flop_per_clock_per_sm']:g} tensor FLOP per clock at "
                          f"{peaks[base] / 1e12:g} {base} TFLOP/s implies a {clock / 1e9:.3g} GHz clock; GPUs clock "
                          f"{CLOCK_RANGE_HZ[0] / 1e9:g}-{CLOCK_RANGE_HZ[1] / 1e9:g} GHz (check the SM count, the FLOP "
                          "per clock and the peak)")
    mamf = {p: (to_si(f"mamf_{p}_tflops", d[f"mamf_{p}_tflops"]), d.get(f"mamf_{p}_shape"))
            for p in precisions if f"mamf_{p}_tflops" in d}
    msmf = _msmf(d, file)
    for p, (flops, _) in mamf.items():
        if flops > peaks[p]:
            raise ConfigError(file, f"device.mamf_{p}_tflops", f"must not exceed device.{p}_tflops ({peaks[p] / 1e12:g})")
    return KernelFacts(sm_count=d["sm_count"], tensor_flop_per_clock_per_sm=d["tensor_flop_per_clock_per_sm"],
                       sfu_op_per_clock_per_sm=d["sfu_op_per_clock_per_sm"],
                       smem_byte_per_clock_per_sm=d["smem_byte_per_clock_per_sm"],
                       gemm_tiles=d["gemm_tiles"], mma_style=d.get("mma_style", "warp"),
                       stream_k=d.get("gemm_stream_k", False), mamf=mamf, attention_kernel=d.get("attention_kernel"),
                       gemm_latency_s=to_si("gemm_latency_us", d.get("gemm_latency_us", 0.0)),
                       grouped_gemm_setup_s=to_si("grouped_gemm_setup_us", d.get("grouped_gemm_setup_us", 0.0)),
                       collective_ctas=_ctas(d, "collective_ctas", file),
                       collective_ctas_net=_ctas(d, "collective_ctas_net", file), msmf=msmf,
                       msmf_chip_range=_chip_range(d, msmf, file))


CLOCK_RANGE_HZ = (0.3e9, 4.0e9)
"""SM clocks a profile's kernel facts may imply (peak / (SMs x tensor FLOP per clock per SM)):
every data-center GPU since Volta boosts between ~1.4 and ~2.1 GHz (V100 1.53, A100 1.41, H100
1.83, B200 1.86); outside this range a number is in the wrong unit (1e8 SMs gave a 2.4 MHz clock
and a 7-day step)."""


MSMF_KEYS = ("msmf_bf16_tflops", "msmf_mamf_bf16_tflops")
"""A measured sustained rate and the burst rate of the same run: given together or not at all."""


def _pair_given(d: Mapping[str, Any], keys: tuple[str, str], what: str, file: str) -> bool:
    """Whether both ``keys`` are in ``d`` (False: neither); ConfigError naming the missing one
    when only one is (``what``: what the other says)."""
    given = [k for k in keys if k in d]
    if len(given) == 1:
        other = next(k for k in keys if k not in d)
        raise ConfigError(file, f"device.{given[0]}", f"needs device.{other} beside it ({what})")
    return bool(given)


def _msmf(d: Mapping[str, Any], file: str) -> tuple[float, float] | None:
    """(MSMF, MAMF) of one measurement (:attr:`KernelFacts.msmf`), checked: both keys or
    neither, the sustained rate not above the burst."""
    if not _pair_given(d, MSMF_KEYS, "the same run's burst rate", file):
        return None
    msmf, mamf = d["msmf_bf16_tflops"], d["msmf_mamf_bf16_tflops"]
    if msmf > mamf:
        raise ConfigError(file, "device.msmf_bf16_tflops",
                          f"{msmf:g} exceeds device.msmf_mamf_bf16_tflops ({mamf:g}): sustained cannot beat the burst")
    return float(msmf), float(mamf)


CHIP_RANGE_KEYS = ("msmf_chip_range_pct", "msmf_chip_range_gpus")
"""The spread of the MSMF measurement across its chips: given together, beside the MSMF."""


def _chip_range(d: Mapping[str, Any], msmf: tuple[float, float] | None, file: str) -> tuple[float, int] | None:
    """(range as a fraction, chips) of :attr:`KernelFacts.msmf_chip_range`, checked: both keys,
    an MSMF they describe, a range under half the mean, at least two chips."""
    if not _pair_given(d, CHIP_RANGE_KEYS, "how many chips the range spans", file):
        return None
    if msmf is None:
        raise ConfigError(file, f"device.{CHIP_RANGE_KEYS[0]}",
                          "needs device.msmf_bf16_tflops (the measurement it is the spread of)")
    pct, gpus = d["msmf_chip_range_pct"], d["msmf_chip_range_gpus"]
    if not 0.0 < pct < 50.0:
        raise ConfigError(file, "device.msmf_chip_range_pct",
                          f"expected a percentage of the mean above 0 and below 50, got {pct:g}")
    if gpus < 2:
        raise ConfigError(file, "device.msmf_chip_range_gpus", f"a range needs at least 2 chips, got {gpus}")
    return pct / 100.0, int(gpus)


def _ctas(d: Mapping[str, Any], key: str, file: str) -> int:
    """A collective's SM count, checked against the device's SMs (it must leave some to compute)."""
    v = int(d.get(key, 0))
    if v and v >= d["sm_count"]:
        raise ConfigError(file, f"device.{key}", f"{v} must be below device.sm_count ({d['sm_count']})")
    return v


def facts_to_table(kf: KernelFacts | None) -> dict[str, Any]:
    """``kf`` back in ``[device]`` key space (human units); empty for None."""
    if kf is None:
        return {}
    out: dict[str, Any] = {"sm_count": kf.sm_count, "tensor_flop_per_clock_per_sm": kf.tensor_flop_per_clock_per_sm,
                           "sfu_op_per_clock_per_sm": kf.sfu_op_per_clock_per_sm,
                           "smem_byte_per_clock_per_sm": kf.smem_byte_per_clock_per_sm,
                           "gemm_tiles": [format_tile(t) for t in kf.gemm_tiles], "mma_style": kf.mma_style}
    if kf.stream_k:
        out["gemm_stream_k"] = True
    if kf.attention_kernel:
        out["attention_kernel"] = kf.attention_kernel
    if kf.gemm_latency_s:
        out["gemm_latency_us"] = kf.gemm_latency_s * 1e6
    if kf.grouped_gemm_setup_s:
        out["grouped_gemm_setup_us"] = kf.grouped_gemm_setup_s * 1e6
    if kf.collective_ctas:
        out["collective_ctas"] = kf.collective_ctas
    if kf.collective_ctas_net:
        out["collective_ctas_net"] = kf.collective_ctas_net
    for p, (flops, shape) in kf.mamf.items():
        out[f"mamf_{p}_tflops"] = flops / 1e12
        if shape is not None:
            out[f"mamf_{p}_shape"] = "x".join(str(x) for x in shape)
    if kf.msmf is not None:
        out["msmf_bf16_tflops"], out["msmf_mamf_bf16_tflops"] = kf.msmf
    if kf.msmf_chip_range is not None:
        out["msmf_chip_range_pct"] = kf.msmf_chip_range[0] * 100.0
        out["msmf_chip_range_gpus"] = kf.msmf_chip_range[1]
    return out


# ------------------------------------------------------------------ grouped GEMM (MoE experts)
def _slot_loads(problems: tuple[tuple[int, int, int], ...], tile: tuple[int, int, int], k_block: int,
                slots: int) -> tuple[int, int]:
    """(K blocks, tiles) of the busiest CTA slot of one grouped launch.

    A grouped GEMM (CUTLASS ``GemmGrouped`` / its persistent SM90 and SM100 schedulers, the
    kernels behind Transformer Engine's and Megatron-Core's grouped experts) numbers the
    output tiles of every problem in order, problem after problem, and hands tile ``j`` to
    slot ``j mod slots``; each tile walks its own problem's K. So the waves run over the
    tiles of *all* problems together (one partial wave per launch, not one per expert), and
    a problem's ragged M costs ``ceil(m / tm)`` tiles (tile quantization per expert).
    """
    # every slot gets ``full`` tiles of a problem, the ``rest`` slots from ``j`` on (mod slots)
    # one more: per problem an O(1) update of a difference array over the slots, one prefix sum
    # at the end (a walk over every slot per problem took ~5 ms a call at 256 experts)
    base_load = base_tiles = 0
    d_load = [0] * (slots + 1)
    d_tiles = [0] * (slots + 1)
    j = 0
    for m, n, k in problems:
        count = output_tiles(m, n, tile)
        if count == 0 or k == 0:
            continue
        kb = math.ceil(k / k_block)
        full, rest = divmod(count, slots)
        base_load += full * kb
        base_tiles += full
        for lo, hi in ((j, min(j + rest, slots)), (0, j + rest - slots)):
            if hi > lo:
                d_load[lo] += kb
                d_load[hi] -= kb
                d_tiles[lo] += 1
                d_tiles[hi] -= 1
        j = (j + count) % slots
    loads = [base_load + x for x in itertools.accumulate(d_load[:slots])]
    tiles = [base_tiles + x for x in itertools.accumulate(d_tiles[:slots])]
    busiest = max(range(slots), key=lambda s: (loads[s], tiles[s]))
    return loads[busiest], tiles[busiest]


def grouped_gemm_bytes(problems: tuple[tuple[int, int, int], ...], precision: str) -> float:
    """HBM bytes of a grouped GEMM moved once: every problem's A, B read and C written."""
    return sum(gemm_bytes(m, n, k, precision) for m, n, k in problems if m and n and k)


def grouped_gemm_plan(dev: Any, problems: tuple[tuple[int, int, int], ...], precision: str) -> dict[str, Any]:
    """One grouped launch of the GEMMs ``problems`` ((m, n, k) each) on ``dev``.

    Per tile the same physics as :func:`gemm_plan` (main loop at the MAMF-calibrated rate
    and the tile's shared-memory feed, the epilogue, one pipeline fill); across tiles the
    round-robin slots of :func:`_slot_loads`, so the busiest slot sets the time. No
    split-K or Stream-K (grouped kernels do not split a problem's K). Floor: the HBM
    roofline of :func:`grouped_gemm_bytes` (each expert's weights are read once, so
    small-M experts turn memory-bound). The main loop at :func:`running_rate`, as
    :func:`gemm_plan`.
    """
    mc = _machine(dev, precision)
    rate = running_rate(dev, precision)
    probs = tuple((int(m), int(n), int(k)) for m, n, k in problems if m > 0 and n > 0 and k > 0)
    if not probs:
        return {"time_s": 0.0, "tile": None, "waves": 0, "memory_bound": False, "mainloop_flops": rate}
    k_block = k_block_elements(mc.in_bytes)
    clock = rate / (mc.sm * mc.flop_per_clock)
    per_sm_bw = mc.bandwidth / mc.sm
    hidden = mc.mma_style != "warp"
    best: tuple[float, tuple[int, int, int], int] = (math.inf, mc.tiles[0], 0)
    for tile in mc.tiles:
        tm, tn, sms = tile
        slots = mc.sm // sms
        blocks, tiles = _slot_loads(probs, tile, k_block, slots)
        block_time = 2.0 * tm * tn / sms * k_block / (rate / mc.sm * feed_fraction(mc, tm, tn, sms))
        epilogue = 2.0 * tm * tn / sms * mc.out_bytes / mc.smem_per_clock / clock
        fill = (tm + tn) / sms * k_block * mc.in_bytes / per_sm_bw
        t = blocks * block_time + (1 if hidden else tiles) * epilogue + fill + mc.latency
        if t < best[0]:
            best = (t, tile, tiles)
    floor = grouped_gemm_bytes(probs, precision) / mc.bandwidth
    setup = dev.kernels.grouped_gemm_setup_s if len(probs) > 1 else 0.0  # one problem: a plain GEMM's launch
    return {"time_s": max(best[0], floor + mc.latency) + setup, "tile": format_tile(best[1]), "waves": best[2],
            "memory_bound": floor > best[0], "mainloop_flops": rate}


def _problems(problems: tuple[tuple[int, int, int], ...], what: str) -> list[tuple[int, int, int]]:
    """The non-empty problems of a group of GEMMs (ValueError naming ``what`` on a negative dimension)."""
    if any(min(p) < 0 for p in problems):
        raise ValueError(f"{what}: negative dimension in {problems}")
    return [(int(m), int(n), int(k)) for m, n, k in problems if m > 0 and n > 0 and k > 0]


def grouped_gemm_time(dev: Any, problems: tuple[tuple[int, int, int], ...], precision: str = "bf16") -> float:
    """Seconds of one grouped GEMM launch over ``problems`` ((m, n, k), ragged m or k allowed)."""
    _problems(problems, "grouped gemm")  # refuses a negative dimension; the plan drops empty problems
    return grouped_gemm_plan(dev, tuple(problems), precision)["time_s"]


EXPERT_GEMM_IMPLEMENTATIONS = ("grouped", "multi_stream", "loop")
"""How a framework runs the experts' GEMMs of one MoE layer (``moe.expert_gemm``):

* ``grouped``: one grouped-GEMM kernel over every local expert (:func:`grouped_gemm_time`; CUTLASS
  grouped GEMM, ``torch._grouped_mm``: torchtitan's ``GroupedExperts``);
* ``multi_stream``: one cuBLAS GEMM per expert, issued round-robin on four CUDA streams
  (:func:`multi_stream_gemm_time`; Transformer Engine's ``GroupedLinear``, which Megatron-Core's
  ``TEGroupedMLP`` runs);
* ``loop``: one GEMM per expert on one stream, each paying its own launch and prologue
  (a Python loop over ``nn.Linear`` experts: DeepSpeed-MoE, Megatron-Core's ``SequentialMLP``)."""

def multi_stream_gemm_time(dev: Any, problems: tuple[tuple[int, int, int], ...], precision: str = "bf16") -> float:
    """Seconds of Transformer Engine's grouped GEMM: one cuBLAS kernel per problem, round-robin
    over four streams (``nvte_multi_tensor_gemm`` -> ``multi_stream_cublas_gemm``, the default on
    Hopper and the only path on Blackwell; transformer_engine/common/util/multi_stream.cpp:
    ``num_compute_streams = 4``).

    Each kernel runs as it would alone (:func:`gemm_plan`: its own tiles, waves and split): the
    Hopper/Blackwell cuBLAS kernels are persistent, a kernel's CTAs hold the SMs until its tail,
    so two experts' main loops do not share a wave. What the streams buy is the fixed cost: the
    next kernel is launched and set up while the previous one runs, so the kernels' fixed latency
    (``gemm_latency_us``) is paid once, as in :func:`gemm_time`'s back-to-back count. Against
    TE PR #2045's measured ``general_grouped_gemm`` on H100 BF16 (TE 2.7, CUDA 12.9;
    tests/test_kernels.py holds the points): (8, 4096, 768, 2048) 628 TFLOP/s, (16, 2048, 768,
    2048) 554; this model 617 and 513 (-2%, -7%: the streams also overlap some tails). The
    single grouped kernel (:func:`grouped_gemm_time`) gives 755 on both.
    """
    probs = _problems(problems, "multi-stream gemm")
    if not probs:
        return 0.0
    lat = dev.kernels.gemm_latency_s
    return sum(gemm_plan(dev, m, n, k, precision)["time_s"] - lat for m, n, k in probs) + lat


def loop_gemm_time(dev: Any, problems: tuple[tuple[int, int, int], ...], precision: str = "bf16") -> float:
    """Seconds of one GEMM per problem on one stream, each launched on its own (its fixed latency
    exposed every time): a Python loop over per-expert linear layers."""
    return sum(gemm_plan(dev, m, n, k, precision)["time_s"] for m, n, k in _problems(problems, "loop gemm"))


def expert_gemm_time(dev: Any, problems: tuple[tuple[int, int, int], ...], precision: str,
                     implementation: str) -> float:
    """Seconds of one MoE layer's expert GEMMs ``problems`` run the way ``implementation``
    (:data:`EXPERT_GEMM_IMPLEMENTATIONS`) runs them."""
    if implementation == "multi_stream":
        return multi_stream_gemm_time(dev, problems, precision)
    if implementation == "loop":
        return loop_gemm_time(dev, problems, precision)
    if implementation == "grouped":
        return grouped_gemm_time(dev, problems, precision)
    raise ValueError(f"expert gemm implementation {implementation!r} not one of {', '.join(EXPERT_GEMM_IMPLEMENTATIONS)}")
