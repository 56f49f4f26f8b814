"""Hardware: one GPU (`Device`), the links between GPUs (`LinkTier`), and the cluster
around them (`HardwareProfile`), loaded strictly from the bundled ``profiles/*.toml`` (package data).

Everything here is SI; TOML keys carry their unit in their name (:func:`parsim.units.to_si`).
The compute model is small so calibration can refit it: GEMMs (a shape model with a
roofline floor, see :meth:`Device.gemm_time`), streaming kernels at
``memory_bandwidth * memory_efficiency``, fused attention at ``peak * attention_efficiency``.
Kernel launch overhead (``kernel_launch_s``) is *not* added here; the cost layer adds it.

Kernel models (``parsim.cluster.kernels`` for GEMMs: tiles, waves, K roll-off, MAMF-calibrated
main loop, HBM floor; ``parsim.cluster.attention_kernels`` for FlashAttention-2/3/4 by sequence
length, head dim, causal mask, GQA, forward/backward) use the optional device facts
(``sm_count``, per-clock rates, ``gemm_tiles``, ``mamf_*``, ``attention_kernel``):
:meth:`Device.kernel_gemm_time` and :meth:`Device.attention_kernel_time`. ``gemm_time`` is the
kernel model wherever the profile gives kernel facts (``device.gemm_model = "shape"`` keeps the
two-knob model, which ``parsim calibrate`` fits for profiles without them, e.g. ``cpu-gloo``).
There is no end-to-end factor: ``device.sustained_fraction`` was removed (a profile that still
sets it is refused with a one-line error).
"""
from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from itertools import combinations
from pathlib import Path
from typing import Any

from parsim.cluster import attention_kernels, kernels, nvlink_mesh
from parsim.cluster.host import HostTier, parse_host
from parsim.cluster.kernels import KernelFacts, parse_shape, parse_tile
from parsim.cluster.plausible import check_plausible
from parsim.cluster.precision import GEMM_PRECISIONS, PRECISION_TABLE
from parsim.cluster.precision import precision as precision_row
from parsim.errors import ConfigError
from parsim.files import read_input_text
from parsim.units import GB, TB, TFLOP, US, GiB, to_si

# Bundled profiles are package data (they travel with a wheel); calibrations a user runs are
# written under the working directory (``parsim calibrate --out-dir``), never into the package.
PROFILE_DIR = Path(str(resources.files("parsim.cluster") / "profiles"))
BUNDLED_CALIBRATED_DIR = PROFILE_DIR / "calibrated"
CALIBRATED_DIR = Path("hardware_profiles") / "calibrated"
"""Where ``parsim calibrate`` writes by default, relative to the working directory."""


def calibrated_dirs() -> list[Path]:
    """Calibrated profiles, searched in this order: the user's (working directory), then the bundled ones."""
    return [CALIBRATED_DIR, BUNDLED_CALIBRATED_DIR]


def find_calibrated(name: str) -> Path | None:
    """The calibrated profile ``name`` (user's first, then bundled), or None."""
    return next((d / f"{name}.toml" for d in calibrated_dirs() if (d / f"{name}.toml").is_file()), None)

PRECISIONS = GEMM_PRECISIONS


def canonical_precision(precision: str) -> str:
    """``"bfloat16"`` -> ``"bf16"`` etc.; unknown names raise ValueError."""
    return precision_row(str(precision).lower()).name


def _bytes_time(what: str, nbytes: float, rate: float) -> float:
    """``nbytes`` at ``rate`` bytes/s; ValueError naming ``what`` for a negative size."""
    if nbytes < 0:
        raise ValueError(f"{what}: nbytes={nbytes} must be >= 0")
    return nbytes / rate


@dataclass(frozen=True)
class Device:
    """One accelerator (or, for ``cpu-gloo``, one CPU core)."""

    name: str
    """Marketing name, e.g. ``"H100-SXM5-80GB"``."""
    peak_flops: dict[str, float] = field(hash=False)
    """Dense peak FLOP/s by precision (``"bf16"``, ``"fp16"``, ``"fp32"``, ``"tf32"``, ``"fp8"``, and on
    Blackwell the block-scaled ``"mxfp8"`` and ``"nvfp4"``)."""
    memory_bytes: float
    """Device memory capacity as the framework reports it (bytes)."""
    memory_reserved_bytes: float
    """Memory never available to tensors: CUDA context, library workspaces, fragmentation (bytes)."""
    memory_bandwidth: float
    """Datasheet memory bandwidth (bytes/s)."""
    gemm_efficiency: float
    """Asymptotic fraction of peak a very large GEMM reaches (0..1]."""
    gemm_half_dim: float
    """GEMM shape parameter: a dimension of this size halves throughput (``u(d) = d/(d+h)``)."""
    memory_efficiency: float
    """Fraction of ``memory_bandwidth`` that streaming (elementwise) kernels reach (0..1]."""
    attention_efficiency: float
    """Fraction of peak that fused (Flash) attention reaches (0..1]."""
    kernel_launch_s: float
    """Per-kernel launch/dispatch overhead (seconds); added by the cost layer, not here."""
    unfused_attention_efficiency: float | None = None
    """Fraction of peak the attention core's two batched GEMMs (QK^T, PV) reach when the
    attention is *not* fused (``training.flash_attention = false``); the s x s scores'
    softmax/mask traffic is costed separately as memory-bound. Optional key
    ``device.unfused_attention_efficiency``; ``None``: the same as ``attention_efficiency``."""
    attention_backward_efficiency: float | None = None
    """Fraction of peak the fused attention's *backward* reaches over the FLOPs the cost model
    counts for it (the forward's times ``FLASH_BACKWARD_FLOP_RATIO``). A GPU's FlashAttention
    backward runs at its own rate (the kernel models give it); a CPU's SDPA backward takes
    about as long as its forward, which one efficiency for both passes cannot say (one
    geometric mean put this 2-core VM's forward 30-49% fast and its backward 57-84% slow).
    Optional key ``device.attention_backward_efficiency`` (``parsim calibrate`` fits it from
    the SDPA backward cases); ``None``: ``attention_efficiency``."""
    unfused_attention_backward_efficiency: float | None = None
    """The same for the unfused core's backward (its four batched GEMMs, the scores' traffic
    costed apart). Optional key ``device.unfused_attention_backward_efficiency``; ``None``:
    ``unfused_attention_efficiency``."""
    update_efficiency: float | None = None
    """Fraction of ``memory_bandwidth`` that in-place read-modify-write kernels reach (gradient
    accumulation into existing buffers; the optimizer step too unless
    ``optimizer_efficiency`` is given). A kernel writing a *fresh*
    output on a write-allocate cache (a CPU) first reads every line it writes (a read for
    ownership) -- the streaming ops behind ``memory_efficiency`` pay it, an update in place
    does not. Optional key ``device.update_efficiency`` (``parsim calibrate`` measures it);
    ``None``: ``memory_efficiency`` (GPUs write L2 sectors without fetching them)."""
    optimizer_efficiency: float | None = None
    """Fraction of ``memory_bandwidth`` the optimizer step's kernel reaches over the bytes the
    cost model counts for it (``parsim.costs.dp``: states read and written, gradients read,
    weights written, and read too without a master copy). Where the step is bandwidth-bound
    (a fused Adam on a GPU) it is the in-place rate; on a CPU core fused Adam's per-element
    arithmetic (a square root, a division) holds it lower. Optional key
    ``device.optimizer_efficiency`` (``parsim calibrate`` times the fused step); ``None``: the
    in-place rate (``update_efficiency``)."""
    eager_norm_efficiency: float | None = None
    """Fraction of ``memory_bandwidth`` eager PyTorch's RMSNorm reaches over the bytes
    ``parsim.costs.memory_ops`` counts for it (Hugging Face's ``LlamaRMSNorm``: upcast, ``pow``,
    ``mean``, ``rsqrt``, scale, downcast, weight -- a row reduction among pointwise kernels, below a
    copy's rate). Optional key ``device.eager_norm_efficiency`` (measured by
    benchmarks/gpu/measure.py); ``None``: ``layer_memory_efficiency``."""
    eager_rotary_efficiency: float | None = None
    """The same for Hugging Face's ``apply_rotary_pos_emb`` (``q * cos``, ``rotate_half``'s negated
    half and ``cat``, ``* sin``, ``+``: broadcasts of cos / sin over the heads and half-width slices).
    Optional key ``device.eager_rotary_efficiency``; ``None``: ``layer_memory_efficiency``."""
    layer_memory_efficiency: float | None = None
    """Fraction of ``memory_bandwidth`` the model's memory-bound layer kernels reach over the bytes
    ``parsim.costs`` counts for them: normalizations, activation functions, residual adds and
    dropout, the unfused attention's softmax and dropout passes over the scores, the loss's softmax,
    the embedding lookup -- kernels that read activations, reduce or draw random numbers over them
    and write them back, below the rate of a plain copy (``memory_efficiency``, which copies,
    gradient updates and optimizer steps keep). Optional key ``device.layer_memory_efficiency``
    (a documented fit per GPU: ``benchmarks/fit_layer_memory.py``); ``None``: ``memory_efficiency``."""
    transport_core_share: float | None = None
    """Fraction of a rank's compute rate that an asynchronous data-parallel collective takes
    while it is in flight, on a device whose transport runs on the rank's own processor: gloo
    on a CPU host with one core per rank, where the collective's socket copies and reductions
    are threads that share the core with the compute beside them (a 7.4 MB all-reduce of
    8.4 ms slowed a GEMM loop beside it by 4.7 ms on this 2-core VM). Both engines run compute
    at ``1 - share`` of its rate while its rank's dp stream has a collective in flight, and the
    cost model charges a reduction hidden under the backward the same way
    (``parsim.cluster.contention.transport_slowdown_s``). Optional key
    ``device.transport_core_share`` (``parsim calibrate`` times GEMMs beside all-reduces);
    ``None``: no such sharing (a GPU's collectives hold SMs instead: ``parsim.cluster.contention``)."""
    comm_rewarm_s: float | None = None
    """Seconds a rank's compute loses after each blocking collective it waits on inside a pass,
    on a device whose host runs the compute (a CPU rank): while the call's transport threads
    ran, the rank's core went idle and its caches turned over, and the block ops after the call
    run slower until they are warm again -- more than the cache-cold GEMM loop calibration
    prices the calls between (``parsim.validate.bench.Bench.rewarm``: a block forward after a
    256 KiB call against after an equal spin, less the same for that GEMM loop: 0.09-0.22 ms,
    mean over the four kinds, in four runs on this 2-core VM). The cost model adds it per blocking call
    (``parsim.cluster.contention.rewarm_s``). Optional key ``device.comm_rewarm_us``; ``None``:
    0 (a GPU's host runs ahead of its kernels)."""
    eager_op_forward_s: float | None = None
    """Host seconds per aten op of the torch runtime's eager block forward (the Python module
    call, the dispatcher and autograd recording, views included) on a device where the host
    runs the kernels itself: a CPU rank, where that time adds to the compute. The 53 ops of
    the tiny GPT's block took 210-240 us at a negligible size on this VM (~4 us an op), where
    the launch-gap count (15 kernels at the one-element op's 2 us) said 30 us. Optional key
    ``device.eager_op_forward_us`` (``parsim calibrate`` times the runtime's block); ``None``:
    launch gaps (``kernel_launch_s`` per kernel; a GPU's host runs ahead of its kernels)."""
    eager_op_backward_s: float | None = None
    """The same for the block's backward, run by autograd's engine (the tiny GPT's 84 ops took
    ~290 us here, 2.5-3.4 us an op by flavour). Optional key ``device.eager_op_backward_us``."""
    ds07_decode_gemm_flops: float | None = None
    """FLOP/s at which DeepSpeed-Inference v0.7's decode GEMMs (cuBLAS 11 ``cublasGemmEx`` calls of a
    few to a few hundred token rows against a weight streamed from HBM) add their math *after*
    the weight stream: such a GEMM takes the weight read at streaming bandwidth plus its FLOPs
    at this rate, not the larger of the two (``inference.engine = "deepspeed-0.7"``,
    :mod:`parsim.costs.inference`). A documented fit of that one quantity on published decode
    times (``benchmarks/fit_ds07_gemm.py``: fitted on one family of rows, the error on the others
    reported). Optional key ``device.ds07_decode_gemm_tflops``; ``None``: the device's GEMM model."""
    kernels: KernelFacts | None = field(default=None, hash=False)
    """Facts the kernel models need (SM count, per-clock rates, GEMM tiles, MAMF, attention
    kernel); ``None`` when the profile gives none (``kernel_*`` methods then refuse)."""
    sustained: bool = True
    """Kernel times are those of a chip at its power limit, as in training (the kernel models'
    burst rates times ``kernels.saturated_ratio``); False: a burst, as microbenchmarks and the
    kernel papers time them (:meth:`burst`; ``parsim kernel`` prints both)."""
    paced_gpus: int = 1
    """GPUs of the job that wait on one another every step: its compute runs at the slowest of
    that many chips' sustained clock (``kernels.slowest_chip_share``; :func:`paced`). 1: one chip,
    the measured mean."""
    gemm_model: str = "kernel"
    """Which model :meth:`gemm_time` uses: ``"kernel"`` (:mod:`parsim.cluster.kernels`, the
    default wherever the profile gives kernel facts) or ``"shape"`` (the two-knob shape model
    above: profiles without kernel facts, e.g. ``cpu-gloo`` and what ``parsim calibrate``
    fits). Optional key ``device.gemm_model``."""

    @property
    def clock_ratio(self) -> float:
        """The compute clock relative to the kernel models' burst calibration: the measured
        power-saturated fraction (``kernels.saturated_ratio``) under sustained load, times the
        slowest of the job's ``paced_gpus`` chips against the mean one; 1 in a burst or without
        kernel facts."""
        if not self.sustained or self.kernels is None:
            return 1.0
        return self.kernels.saturated_ratio * self.kernels.slowest_chip_share(self.paced_gpus)

    def burst(self) -> Device:
        """This device as a microbenchmark sees it: kernels at their burst (boost-clock) rate."""
        return replace(self, sustained=False)

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s at ``precision``; ValueError naming the known ones otherwise."""
        try:
            p = canonical_precision(precision)
        except ValueError:
            p = None
        if p is None or p not in self.peak_flops:
            known = ", ".join(k for k in PRECISIONS if k in self.peak_flops)
            raise ValueError(f"{self.name} has no peak for precision {precision!r} (known: {known})")
        return self.peak_flops[p]

    @property
    def usable_memory_bytes(self) -> float:
        """Memory left for parameters, gradients, optimizer states and activations."""
        return self.memory_bytes - self.memory_reserved_bytes

    @property
    def effective_memory_bandwidth(self) -> float:
        """Bytes/s that streaming kernels reach."""
        return self.memory_bandwidth * self.memory_efficiency

    def layer_memory_time(self, nbytes: float) -> float:
        """Seconds for the model's memory-bound layer kernels moving ``nbytes`` in total (reads +
        writes): see ``layer_memory_efficiency``."""
        eff = self.memory_efficiency if self.layer_memory_efficiency is None else self.layer_memory_efficiency
        return _bytes_time("layer_memory_time", nbytes, self.memory_bandwidth * eff)

    def update_time(self, nbytes: float) -> float:
        """Seconds for an in-place memory-bound kernel that reads + writes ``nbytes`` in total
        (gradient accumulation): see ``update_efficiency``."""
        eff = self.memory_efficiency if self.update_efficiency is None else self.update_efficiency
        return _bytes_time("update_time", nbytes, self.memory_bandwidth * eff)

    def optimizer_time(self, nbytes: float) -> float:
        """Seconds of an optimizer step over ``nbytes`` of state, gradients and weights (see
        ``optimizer_efficiency``)."""
        if self.optimizer_efficiency is None:
            return self.update_time(nbytes)
        return _bytes_time("optimizer_time", nbytes, self.memory_bandwidth * self.optimizer_efficiency)

    def gemm_shape_factor(self, m: int, n: int, k: int) -> float:
        """``u(m) u(n) u(k)`` with ``u(d) = d / (d + gemm_half_dim)``, in (0, 1]."""
        h = self.gemm_half_dim
        return (m / (m + h)) * (n / (n + h)) * (k / (k + h))

    def gemm_bytes(self, m: int, n: int, k: int, precision: str = "bf16") -> float:
        """HBM bytes of one ``(m x k) @ (k x n)`` GEMM: read A and B once, write C once."""
        p = canonical_precision(precision)
        row = PRECISION_TABLE[p]
        return (m * k + k * n) * row.gemm_in_bytes + m * n * row.gemm_out_bytes

    def gemm_time(self, m: int, n: int, k: int, precision: str = "bf16", count: int = 1) -> float:
        """Seconds for ``count`` GEMMs of shape ``(m x k) @ (k x n)`` (2mnk FLOP each).

        First shape model (kept to two knobs so calibration can refit them):

        * compute: ``2mnk / (peak * gemm_efficiency * u(m) u(n) u(k))`` where
          ``u(d) = d / (d + gemm_half_dim)`` -- a small dimension under-fills the
          output tiles / the SMs (tile and wave quantisation smoothed into one curve);
          ``gemm_efficiency`` is the asymptote a very large GEMM approaches;
        * roofline floor: the GEMM cannot beat moving A, B and C through HBM once,
          ``gemm_bytes / (memory_bandwidth * memory_efficiency)``.

        The time is the larger of the two, so skinny GEMMs (m=1: a GEMV) are
        memory-bound and large square ones compute-bound. Monotone in m, n, k.
        A zero dimension or count costs nothing.
        """
        if min(m, n, k, count) < 0:
            raise ValueError(f"gemm_time: m={m}, n={n}, k={k}, count={count} must be >= 0")
        if m == 0 or n == 0 or k == 0 or count == 0:
            return 0.0
        if self.gemm_model == "kernel" and self.kernels is not None:
            return self.kernel_gemm_time(m, n, k, precision, count)
        rate = self.peak(precision) * self.gemm_efficiency * self.gemm_shape_factor(m, n, k)
        compute = 2.0 * m * n * k / rate
        memory = self.gemm_bytes(m, n, k, precision) / self.effective_memory_bandwidth
        return count * max(compute, memory)

    def _kernel_facts(self, what: str) -> KernelFacts:
        if self.kernels is None:
            raise ValueError(f"{self.name}: the profile gives no kernel facts (device.sm_count ...) for {what}")
        return self.kernels

    def kernel_gemm_time(self, m: int, n: int, k: int, precision: str = "bf16", count: int = 1) -> float:
        """Seconds for ``count`` GEMMs ``(m x k) @ (k x n)`` by the kernel model
        (:mod:`parsim.cluster.kernels`: tiles and waves over the SMs, K roll-off, split-K, the
        main loop calibrated to this device's MAMF, the HBM roofline as a floor)."""
        self._kernel_facts("a kernel GEMM")
        return kernels.gemm_time(self, m, n, k, canonical_precision(precision), count)

    def kernel_gemm_plan(self, m: int, n: int, k: int, precision: str = "bf16") -> dict:
        """The kernel model's choice for one GEMM: ``time_s``, ``tile``, ``split_k``, ``waves``,
        ``memory_bound``, ``mainloop_flops``."""
        self._kernel_facts("a kernel GEMM")
        return kernels.gemm_plan(self, m, n, k, canonical_precision(precision))

    def attention_kernel_time(self, batch: int, seq_q: int, seq_k: int, heads: int, kv_heads: int,
                              head_dim: int, causal: bool = False, backward: bool = False,
                              precision: str = "bf16", implementation: str | None = None) -> float:
        """Seconds of one fused-attention pass (forward, or backward with ``backward=True``) by
        this device's attention kernel (:mod:`parsim.cluster.attention_kernels`), or by the
        named ``implementation`` (fa2 | fa3 | fa4 | cudnn) as fitted for this architecture."""
        kf = self._kernel_facts("fused attention")
        kernel = None
        if implementation is not None:
            kernel = attention_kernels.resolve(implementation, kf.mma_style)
            if kernel is None:
                raise ValueError(f"attention kernel {implementation!r} has no model on {self.name}")
        return attention_kernels.attention_time(self, batch, seq_q, seq_k, heads, kv_heads, head_dim,
                                                causal, backward, canonical_precision(precision), kernel)

    def memory_time(self, nbytes: float) -> float:
        """Seconds for a memory-bound kernel that reads + writes ``nbytes`` in total."""
        return _bytes_time("memory_time", nbytes, self.effective_memory_bandwidth)

    def attention_time(self, flops: float, precision: str = "bf16", fused: bool = True,
                       backward: bool = False) -> float:
        """Seconds for the attention core doing ``flops`` FLOP: fused (Flash; scores never
        hit HBM) or, with ``fused=False``, its batched GEMMs alone (the scores' memory
        traffic is the caller's); ``backward``: the backward pass, at its own efficiency where
        the profile gives one."""
        if flops < 0:
            raise ValueError(f"attention_time: flops={flops} must be >= 0")
        return flops / (self.peak(precision) * self.attention_efficiency_of(fused, backward))

    def attention_efficiency_of(self, fused: bool, backward: bool = False) -> float:
        """The attention core's fraction of peak: fused or not, forward or backward (each
        optional efficiency falling back as its docstring says)."""
        eff = self.attention_efficiency
        if not fused and self.unfused_attention_efficiency is not None:
            eff = self.unfused_attention_efficiency
        if backward:
            own = self.attention_backward_efficiency if fused else self.unfused_attention_backward_efficiency
            eff = eff if own is None else own
        return eff


@dataclass(frozen=True)
class LinkTier:
    """One kind of link: NVLink/NVSwitch port, PCIe, or a NIC (IB/RoCE rail)."""

    name: str
    """``"nvlink"``, ``"pcie"`` or ``"nic"``."""
    bandwidth: float
    """Line rate, bytes/s per direction, per GPU (one port / one NIC)."""
    latency_s: float
    """Per-transfer (per ring step) latency, seconds."""
    efficiency: float
    """Achievable fraction of line rate for large transfers (0..1]."""

    @property
    def effective_bandwidth(self) -> float:
        """Bytes/s a large transfer actually reaches."""
        return self.bandwidth * self.efficiency

    def transfer_time(self, nbytes: float) -> float:
        """alpha-beta time of one point-to-point transfer of ``nbytes`` on an idle link."""
        if nbytes < 0:
            raise ValueError(f"transfer_time: nbytes={nbytes} must be >= 0")
        return self.latency_s + nbytes / self.effective_bandwidth


@dataclass(frozen=True)
class HardwareProfile:
    """A cluster of identical nodes: devices, intra-node links, and the network."""

    name: str
    """Profile name (``dgx-h100`` ...)."""
    description: str
    """One human sentence about the system."""
    device: Device
    """The accelerator in every slot."""
    gpus_per_node: int
    """Devices per node (one NVLink/NVSwitch domain)."""
    nvlink: LinkTier
    """Intra-node GPU<->GPU link, per GPU."""
    pcie: LinkTier
    """Host<->device link, per GPU."""
    nic: LinkTier
    """Inter-node link: one NIC (rail), bandwidth per NIC."""
    nics_per_node: int
    """Compute NICs per node (rails)."""
    spine_oversubscription: float
    """Leaf down/up bandwidth ratio: 1.0 = full bisection, >1 oversubscribed above the leaf."""
    gpus_per_leaf: int
    """GPUs in one leaf domain (a rail-optimised scalable unit): traffic inside it skips the spine."""
    switch_latency_s: float
    """Latency of one network switch hop, seconds."""
    source_path: str
    """The TOML file it was loaded from (``""`` when built in code)."""
    nvls_bandwidth: float = 0.0
    """NVLink SHARP (in-switch reduction) all-reduce algorithm bandwidth S/t inside a node,
    bytes/s; 0 = the NVSwitch cannot reduce (optional key ``node.nvls_gbyte_per_s``)."""
    collective_fits: tuple[tuple[str, int, float, float, float], ...] = ()
    """Measured collectives inside one node, from ``parsim calibrate`` or nccl-tests
    (``benchmarks/fit_nccl_intranode.py``; ``[calibration]`` keys ``collective_<kind>_<n>`` =
    [[max bytes, latency us, GB/s], ...]): (kind, group size, max bytes, per-step latency s, link
    bandwidth B/s) in the ring formulas' terms. A group inside one node with a fit for its kind is
    priced by it (``parsim.cluster.collectives.fitted_line``). Kind ``custom_all_reduce``: a serving
    engine's own NVLink all-reduce kernel (vLLM's CustomAllreduce), which only ``parsim infer``'s
    serving engine uses (``parsim.costs.inference.tp_allreduce_s``)."""
    collective_gaps: tuple[tuple[str, int, float, float, float, float], ...] = ()
    """How a blocking collective's in-situ cost grows with the compute before it, measured by
    ``parsim calibrate`` (``[calibration]`` keys ``comm_gap_<kind>_<n>`` = [reference gap us,
    shortest gap us, longest gap us, slope]): (kind, group size, reference gap s, shortest and
    longest measured gap s, slope: seconds the call adds per second of compute before it). The
    ``collective_fits`` rows were timed after the reference gap; a call after a longer stretch
    of compute costs ``slope`` x the difference more (``parsim.cluster.collectives.in_pass_time``).
    Empty: not measured (every GPU profile), the fits are used as they are."""
    host: HostTier | None = None
    """Host memory, CPU, NVMe and C2C per node (optional ``[host]`` table; None: not given)."""
    nvlink_links: nvlink_mesh.Links | None = None
    """GPUs wired to each other directly (a hybrid cube-mesh, no NVSwitch): NVLink links between
    local GPUs a and b of a node (``node.nvlink_links``, ``nvidia-smi topo -m``'s NV#; 0 = none);
    ``nvlink`` is then one GPU's links together. None: an NVSwitch, every pair at the port rate."""
    mesh_rings: dict[tuple[int, ...], tuple[tuple[int, ...], ...]] = field(
        default_factory=dict, compare=False, repr=False)
    """With ``nvlink_links``: the rings (:func:`nvlink_mesh.rings`) of every group of local GPUs,
    sorted, worked out once when the profile is built (a search over the group's cycles)."""
    send_post_latency_s: float = 0.0
    """Time a rank's own thread spends posting one point-to-point send before it can go on
    computing, fixed part, seconds (``node.send_post_us``). gloo's caller thread writes into the
    socket inside ``isend``; a GPU's NCCL send is one kernel launch (0: nothing beyond it)."""
    send_post_bandwidth: float = 0.0
    """Bytes/s of that posting's size-dependent part (``node.send_post_gbyte_per_s``; 0: none)."""

    def paced(self, gpus: int) -> HardwareProfile:
        """This cluster running one synchronous job of ``gpus`` GPUs: its compute at the slowest
        chip's sustained clock (:attr:`Device.paced_gpus`); itself where the profile states no
        spread between chips."""
        kf = self.device.kernels
        if kf is None or kf.msmf_chip_range is None or self.device.paced_gpus == gpus:
            return self
        return replace(self, device=replace(self.device, paced_gpus=max(1, int(gpus))))

    def send_post_time(self, nbytes: float) -> float:
        """Seconds the sender's compute waits while it posts a send of ``nbytes``."""
        return self.send_post_latency_s + (nbytes / self.send_post_bandwidth if self.send_post_bandwidth > 0 else 0.0)

    def __post_init__(self) -> None:
        if self.nvlink_links is not None and not self.mesh_rings:
            g = range(self.gpus_per_node)
            for size in range(2, self.gpus_per_node + 1):
                for group in combinations(g, size):
                    self.mesh_rings[group] = nvlink_mesh.rings(self.nvlink_links, group)

    @property
    def nvlink_link_bandwidth(self) -> float:
        """Line rate of one NVLink link per direction (bytes/s): the GPU's port over its links."""
        if self.nvlink_links is None:
            return self.nvlink.bandwidth
        return self.nvlink.bandwidth / nvlink_mesh.links_per_gpu(self.nvlink_links)

    def local_rings(self, gpus: list[int]) -> tuple[tuple[int, ...], ...] | None:
        """Directed rings (local GPU indices) a group inside one node of a direct-link mesh can
        run at once; None on an NVSwitch (or when the group spans nodes)."""
        if self.nvlink_links is None or len({self.node_of(g) for g in gpus}) != 1:
            return None
        return self.mesh_rings[tuple(sorted({g % self.gpus_per_node for g in gpus}))]

    @property
    def node_nic_bandwidth(self) -> float:
        """Line rate out of one node, all NICs together (bytes/s per direction)."""
        return self.nic.bandwidth * self.nics_per_node

    def node_of(self, gpu: int) -> int:
        """Node index of a global GPU index."""
        if gpu < 0:
            raise ValueError(f"gpu index {gpu} must be >= 0")
        return gpu // self.gpus_per_node

    def leaf_of(self, gpu: int) -> int:
        """Leaf-domain index of a global GPU index."""
        return self.node_of(gpu) // (self.gpus_per_leaf // self.gpus_per_node)

    def link_between(self, gpu_a: int, gpu_b: int) -> LinkTier:
        """The tier a transfer between two global GPU indices uses (same node -> NVLink; on a
        direct-link mesh the links between the two, or PCIe through the host where none)."""
        if self.node_of(gpu_a) != self.node_of(gpu_b):
            return self.nic
        if self.nvlink_links is None:
            return self.nvlink
        n = self.nvlink_links[gpu_a % self.gpus_per_node][gpu_b % self.gpus_per_node]
        if n == 0:
            return self.pcie
        return replace(self.nvlink, bandwidth=n * self.nvlink_link_bandwidth)

    def crosses_spine(self, gpu_a: int, gpu_b: int) -> bool:
        """True when the two GPUs sit under different leaf domains."""
        return self.leaf_of(gpu_a) != self.leaf_of(gpu_b)


# --------------------------------------------------------------------------- schema
# kind: "str" | "pos" (>0 number) | "nonneg" (>=0 number) | "frac" (0<x<=1)
#       | "ge1" (>=1 number) | "int" (integer >= 1)
_REQ, _OPT = True, False
_SCHEMA: dict[str, dict[str, tuple[str, bool]]] = {
    "": {"name": ("str", _REQ), "description": ("str", _REQ)},
    "device": {
        "name": ("str", _REQ),
        "bf16_tflops": ("pos", _OPT), "fp16_tflops": ("pos", _OPT), "fp32_tflops": ("pos", _OPT),
        "tf32_tflops": ("pos", _OPT), "fp8_tflops": ("pos", _OPT),
        "memory_gib": ("pos", _REQ), "memory_reserved_gib": ("nonneg", _REQ),
        "memory_tbyte_per_s": ("pos", _REQ),
        "gemm_efficiency": ("frac", _REQ), "gemm_half_dim": ("nonneg", _REQ),
        "memory_efficiency": ("frac", _REQ), "attention_efficiency": ("frac", _REQ),
        "kernel_launch_us": ("nonneg", _REQ),
        "unfused_attention_efficiency": ("frac", _OPT), "update_efficiency": ("frac", _OPT),
        "attention_backward_efficiency": ("frac", _OPT), "unfused_attention_backward_efficiency": ("frac", _OPT),
        "optimizer_efficiency": ("frac", _OPT), "transport_core_share": ("frac", _OPT),
        "comm_rewarm_us": ("nonneg", _OPT),
        "eager_norm_efficiency": ("frac", _OPT), "eager_rotary_efficiency": ("frac", _OPT),
        "layer_memory_efficiency": ("frac", _OPT),
        "eager_op_forward_us": ("pos", _OPT), "eager_op_backward_us": ("pos", _OPT),
        "mxfp8_tflops": ("pos", _OPT), "nvfp4_tflops": ("pos", _OPT), "ds07_decode_gemm_tflops": ("pos", _OPT),
        # kernel-model facts (parsim.cluster.kernels, attention_kernels): all or none
        "sm_count": ("int", _OPT), "tensor_flop_per_clock_per_sm": ("pos", _OPT),
        "sfu_op_per_clock_per_sm": ("pos", _OPT), "smem_byte_per_clock_per_sm": ("pos", _OPT),
        "gemm_tiles": ("tiles", _OPT), "mma_style": ("mma_style", _OPT), "gemm_stream_k": ("bool", _OPT),
        "gemm_latency_us": ("nonneg", _OPT), "grouped_gemm_setup_us": ("nonneg", _OPT),
        "msmf_bf16_tflops": ("pos", _OPT), "msmf_mamf_bf16_tflops": ("pos", _OPT),
        "msmf_chip_range_pct": ("pos", _OPT), "msmf_chip_range_gpus": ("int", _OPT),
        "collective_ctas": ("int", _OPT), "collective_ctas_net": ("int", _OPT),
        "attention_kernel": ("attention_kernel", _OPT), "gemm_model": ("gemm_model", _OPT),
        **{f"mamf_{p}_{what}": (kind, _OPT) for p in GEMM_PRECISIONS
           for what, kind in (("tflops", "pos"), ("shape", "shape"))},
    },
    "node": {
        "gpus_per_node": ("int", _REQ),
        "nvlink_gbyte_per_s": ("pos", _REQ), "nvlink_latency_us": ("nonneg", _REQ),
        "nvlink_efficiency": ("frac", _REQ),
        "pcie_gbyte_per_s": ("pos", _REQ), "pcie_latency_us": ("nonneg", _REQ),
        "pcie_efficiency": ("frac", _REQ), "nvls_gbyte_per_s": ("pos", _OPT),
        "nvlink_links": ("links", _OPT),
        "send_post_us": ("nonneg", _OPT), "send_post_gbyte_per_s": ("pos", _OPT),
    },
    "network": {
        "nic_gbit_per_s": ("pos", _REQ), "nics_per_node": ("int", _REQ),
        "nic_latency_us": ("nonneg", _REQ), "nic_efficiency": ("frac", _REQ),
        "spine_oversubscription": ("ge1", _REQ), "gpus_per_leaf": ("int", _REQ),
        "switch_latency_us": ("nonneg", _REQ),
    },
    "calibration": {},  # optional, free-form provenance written by `parsim calibrate`
    "host": {},  # optional: host memory, CPU, NVMe, C2C (parsim.cluster.host checks its keys)
}
_OPTIONAL_TABLES = {"calibration", "host"}
_TOP_TABLES = [t for t in _SCHEMA if t]


GEMM_MODELS = ("shape", "kernel")
_REMOVED = {"device.sustained_fraction":
            "was removed: no per-GPU end-to-end factor; compute time comes from the kernel models "
            "(delete the key)"}
"""Keys older profiles had, refused with why."""


def _check_value(file: str, key: str, kind: str, v: Any) -> Any:
    if kind == "tiles":
        if not isinstance(v, list) or not v:
            raise ConfigError(file, key, f"must be a non-empty list of tiles like [\"128x256\"], got {v!r}")
        try:
            return tuple(parse_tile(t) for t in v)
        except ValueError as exc:
            raise ConfigError(file, key, str(exc)) from None
    if kind == "shape":
        try:
            return parse_shape(v) if isinstance(v, str) else parse_shape("")
        except ValueError as exc:
            raise ConfigError(file, key, str(exc)) from None
    if kind == "links":
        return v  # checked against node.gpus_per_node in parse_profile (nvlink_mesh.check_links)
    if kind == "bool":
        if not isinstance(v, bool):
            raise ConfigError(file, key, f"must be true or false, got {v!r}")
        return v
    if kind in ("attention_kernel", "gemm_model", "mma_style"):
        known = {"attention_kernel": tuple(attention_kernels.KERNELS), "gemm_model": GEMM_MODELS,
                 "mma_style": kernels.MMA_STYLES}[kind]
        if v not in known:
            raise ConfigError(file, key, f"must be one of {', '.join(known)}, got {v!r}")
        return v
    if kind == "str":
        if not isinstance(v, str) or not v.strip():
            raise ConfigError(file, key, f"must be a non-empty string, got {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(file, key, f"must be a number, got {v!r}")
    if kind == "int":
        if not isinstance(v, int) or v < 1:
            raise ConfigError(file, key, f"must be a positive integer, got {v!r}")
        check_plausible(file, key, v)
        return v
    problems = {
        "pos": (v > 0, "must be > 0"),
        "nonneg": (v >= 0, "must be >= 0"),
        "frac": (0 < v <= 1, "must be a fraction in (0, 1]"),
        "ge1": (v >= 1, "must be >= 1 (1.0 = full bisection)"),
    }
    ok, why = problems[kind]
    if not ok:
        raise ConfigError(file, key, f"{why}, got {v!r}")
    check_plausible(file, key, v)
    return float(v)


def _validate(data: Mapping[str, Any], file: str) -> dict[str, dict[str, Any]]:
    """Check every table and key against the schema; return {table: {key: value}}."""
    out: dict[str, dict[str, Any]] = {"": {}}
    known_top = list(_SCHEMA[""]) + _TOP_TABLES
    for key, value in data.items():
        if key in _SCHEMA[""]:
            out[""][key] = _check_value(file, key, _SCHEMA[""][key][0], value)
        elif key in _TOP_TABLES:
            if not isinstance(value, dict):
                raise ConfigError(file, key, "must be a table ([" + key + "])")
            out[key] = dict(value) if key in _OPTIONAL_TABLES else {}
            if key in _OPTIONAL_TABLES:
                continue
            for sub, v in value.items():
                dotted = f"{key}.{sub}"
                if dotted in _REMOVED:
                    raise ConfigError(file, dotted, _REMOVED[dotted])
                if sub not in _SCHEMA[key]:
                    raise ConfigError(file, dotted, f"unknown key (known: {', '.join(_SCHEMA[key])})")
                out[key][sub] = _check_value(file, dotted, _SCHEMA[key][sub][0], v)
        else:
            raise ConfigError(file, key, f"unknown key (known: {', '.join(known_top)})")
    for table, keys in _SCHEMA.items():
        if table and table not in out:
            if table in _OPTIONAL_TABLES:
                continue
            raise ConfigError(file, table, "missing table (every profile must give it)")
        for k, (_, required) in keys.items():
            if required and k not in out[table]:
                raise ConfigError(file, f"{table}.{k}" if table else k, "missing (every profile must give it)")
    return out


def parse_profile(data: Mapping[str, Any], file: str = "<profile>") -> HardwareProfile:
    """Build a profile from an already-parsed TOML mapping (strict; errors name ``file``)."""
    t = _validate(data, file)
    d, nd, nw = t["device"], t["node"], t["network"]
    if d["memory_reserved_gib"] >= d["memory_gib"]:
        raise ConfigError(file, "device.memory_reserved_gib",
                          f"must be below device.memory_gib ({d['memory_gib']:g})")
    if nw["gpus_per_leaf"] % nd["gpus_per_node"]:
        raise ConfigError(file, "network.gpus_per_leaf",
                          f"must be a multiple of node.gpus_per_node ({nd['gpus_per_node']})")
    links = None
    if "nvlink_links" in nd:
        links = nvlink_mesh.check_links(nd["nvlink_links"], nd["gpus_per_node"])
        if isinstance(links, str):
            raise ConfigError(file, "node.nvlink_links", links)
    if "bf16_tflops" not in d and "fp16_tflops" not in d:  # V100 has fp16 tensor cores, no bf16
        raise ConfigError(file, "device.bf16_tflops", "missing (every profile gives bf16_tflops or fp16_tflops)")
    peaks = {p: to_si(f"{p}_tflops", d[f"{p}_tflops"]) for p in PRECISIONS if f"{p}_tflops" in d}
    device = Device(
        name=d["name"], peak_flops=peaks,
        memory_bytes=to_si("memory_gib", d["memory_gib"]),
        memory_reserved_bytes=to_si("memory_reserved_gib", d["memory_reserved_gib"]),
        memory_bandwidth=to_si("memory_tbyte_per_s", d["memory_tbyte_per_s"]),
        gemm_efficiency=d["gemm_efficiency"], gemm_half_dim=d["gemm_half_dim"],
        memory_efficiency=d["memory_efficiency"], attention_efficiency=d["attention_efficiency"],
        kernel_launch_s=to_si("kernel_launch_us", d["kernel_launch_us"]),
        unfused_attention_efficiency=d.get("unfused_attention_efficiency"),
        attention_backward_efficiency=d.get("attention_backward_efficiency"),
        unfused_attention_backward_efficiency=d.get("unfused_attention_backward_efficiency"),
        update_efficiency=d.get("update_efficiency"), optimizer_efficiency=d.get("optimizer_efficiency"),
        transport_core_share=d.get("transport_core_share"),
        comm_rewarm_s=None if "comm_rewarm_us" not in d else to_si("comm_rewarm_us", d["comm_rewarm_us"]),
        eager_norm_efficiency=d.get("eager_norm_efficiency"), eager_rotary_efficiency=d.get("eager_rotary_efficiency"),
        layer_memory_efficiency=d.get("layer_memory_efficiency"),
        eager_op_forward_s=None if "eager_op_forward_us" not in d else to_si("eager_op_forward_us", d["eager_op_forward_us"]),
        eager_op_backward_s=None if "eager_op_backward_us" not in d else to_si("eager_op_backward_us", d["eager_op_backward_us"]),
        kernels=kernels.facts_from_table(d, peaks, PRECISIONS, file), gemm_model=d.get("gemm_model", "kernel"),
        ds07_decode_gemm_flops=(None if "ds07_decode_gemm_tflops" not in d
                                else to_si("ds07_decode_gemm_tflops", d["ds07_decode_gemm_tflops"])),
    )

    def tier(name: str, table: dict[str, Any], bw_key: str) -> LinkTier:
        return LinkTier(name=name, bandwidth=to_si(bw_key, table[bw_key]),
                        latency_s=to_si(f"{name}_latency_us", table[f"{name}_latency_us"]),
                        efficiency=table[f"{name}_efficiency"])

    return HardwareProfile(
        name=t[""]["name"], description=t[""]["description"], device=device,
        gpus_per_node=nd["gpus_per_node"],
        nvlink=tier("nvlink", nd, "nvlink_gbyte_per_s"), pcie=tier("pcie", nd, "pcie_gbyte_per_s"),
        nic=tier("nic", nw, "nic_gbit_per_s"), nics_per_node=nw["nics_per_node"],
        spine_oversubscription=nw["spine_oversubscription"], gpus_per_leaf=nw["gpus_per_leaf"],
        switch_latency_s=to_si("switch_latency_us", nw["switch_latency_us"]),
        source_path="" if file.startswith("<") else file,
        nvls_bandwidth=to_si("nvls_gbyte_per_s", nd["nvls_gbyte_per_s"]) if "nvls_gbyte_per_s" in nd else 0.0,
        collective_fits=_collective_fits(data.get("calibration", {}), file),
        collective_gaps=_collective_gaps(data.get("calibration", {}), file),
        host=parse_host(data.get("host"), file),
        nvlink_links=links,
        send_post_latency_s=to_si("send_post_us", nd.get("send_post_us", 0.0)),
        send_post_bandwidth=to_si("send_post_gbyte_per_s", nd["send_post_gbyte_per_s"])
        if "send_post_gbyte_per_s" in nd else 0.0,
    )


def _collective_fits(cal: Mapping[str, Any], file: str) -> tuple[tuple[str, int, float, float, float], ...]:
    """The ``collective_<kind>_<n>`` keys of a ``[calibration]`` table (see HardwareProfile)."""
    out = []
    for key, rows in cal.items():
        if not key.startswith("collective_"):
            continue
        kind, _, n = key[len("collective_"):].rpartition("_")
        ok = n.isdigit() and int(n) >= 2 and isinstance(rows, list) and rows and all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                        for x in r) and r[0] > 0 and 0 <= r[1] <= 1e6
            # GB/s from 1e-4 (parsim.cluster.plausible) to 1e7: a latency-bound bucket's fit may come out
            # far above any link (calibrated/cpu-gloo: 5e5); the last bucket's max bytes is inf
            and 1e-4 <= r[2] <= 1e7
            for r in rows)
        if not ok:
            raise ConfigError(file, f"calibration.{key}", "expected collective_<kind>_<group size> = "
                              "[[max bytes, latency us, GB/s], ...] with positive sizes, latencies up to 10^6 us and "
                              "bandwidths of 1e-4 to 1e7 GB/s")
        out += [(kind, int(n), float(r[0]), r[1] * 1e-6, r[2] * 1e9) for r in sorted(rows)]
    return tuple(out)


def _collective_gaps(cal: Mapping[str, Any], file: str) -> tuple[tuple[str, int, float, float, float, float], ...]:
    """The ``comm_gap_<kind>_<n>`` keys of a ``[calibration]`` table (see HardwareProfile)."""
    out = []
    for key, row in cal.items():
        if not key.startswith("comm_gap_"):
            continue
        kind, _, n = key[len("comm_gap_"):].rpartition("_")
        ok = (n.isdigit() and int(n) >= 2 and kind != "" and isinstance(row, list) and len(row) == 4
              and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in row)
              and 0 < row[1] <= row[0] <= row[2] <= 1e6 and -10.0 <= row[3] <= 10.0)
        if not ok:
            raise ConfigError(file, f"calibration.{key}", "expected comm_gap_<kind>_<group size> = [reference gap us, "
                              "shortest gap us, longest gap us, slope] with 0 < shortest <= reference <= longest <= "
                              "10^6 us and a slope (seconds per second of compute) from -10 to 10")
        out.append((kind, int(n), row[0] * 1e-6, row[1] * 1e-6, row[2] * 1e-6, float(row[3])))
    return tuple(sorted(out))


# --------------------------------------------------------------------------- loading
def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def list_profiles() -> list[str]:
    """Bundled profile names, then calibrated ones (``calibrated/x`` if a bundled ``x`` exists)."""
    bundled = sorted(p.stem for p in PROFILE_DIR.glob("*.toml"))
    calibrated = []
    for d in calibrated_dirs():
        for p in sorted(d.glob("*.toml")):
            name = p.stem if p.stem not in bundled else f"calibrated/{p.stem}"
            if name not in calibrated:
                calibrated.append(name)
    return bundled + calibrated


def _candidates(name_or_path: str, base_dir: Path | None) -> list[Path]:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.is_absolute():
        out = [base_dir / p] if base_dir is not None and not p.is_absolute() else []
        return out + [p]
    # A name: bundled first (so a calibrated file never silently replaces it), then calibrated.
    return [PROFILE_DIR / f"{name_or_path}.toml"] + [d / f"{name_or_path}.toml" for d in calibrated_dirs()]


def load_profile(name_or_path: str, base_dir: Path | None = None, *,
                 source: str | None = None) -> HardwareProfile:
    """Load a profile by name (bundled ``parsim/cluster/profiles/<name>.toml``, then a calibrated
    one: ``./hardware_profiles/calibrated/<name>.toml``, then the bundled calibrations) or by path to a ``.toml`` file
    (relative paths are tried against ``base_dir`` first, e.g. the scenario's folder).

    ``source`` is the file that named the profile (a scenario); it is used in the
    error when no profile is found. Every problem raises :class:`ConfigError`.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ConfigError(source, "hardware", f"must name a profile, got {name_or_path!r} "
                          f"(known: {', '.join(list_profiles())})")
    path = next((c for c in _candidates(name_or_path, base_dir) if c.is_file()), None)
    if path is None:
        raise ConfigError(source, "hardware",
                          f"no profile {name_or_path!r} (known: {', '.join(list_profiles())})")
    file = _display(path)
    try:
        data = tomllib.loads(read_input_text(path))  # a leading BOM skipped
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, None, f"invalid TOML: {' '.join(str(exc).split())}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(file, None, f"not UTF-8 text (byte {exc.start}): a profile is a TOML file") from None
    except OSError as exc:
        raise ConfigError(file, None, f"cannot read: {exc.strerror or exc}") from None
    return parse_profile(data, file)


# --------------------------------------------------------------------------- writing
def profile_to_tables(profile: HardwareProfile) -> dict[str, dict[str, Any]]:
    """The profile back in TOML key space (human units), e.g. for `parsim calibrate`."""
    d, nv, pc, nic = profile.device, profile.nvlink, profile.pcie, profile.nic
    dev: dict[str, Any] = {"name": d.name}
    dev.update({f"{p}_tflops": d.peak_flops[p] / TFLOP for p in PRECISIONS if p in d.peak_flops})
    dev.update({
        "memory_gib": d.memory_bytes / GiB, "memory_reserved_gib": d.memory_reserved_bytes / GiB,
        "memory_tbyte_per_s": d.memory_bandwidth / TB, "gemm_efficiency": d.gemm_efficiency,
        "gemm_half_dim": d.gemm_half_dim, "memory_efficiency": d.memory_efficiency,
        "attention_efficiency": d.attention_efficiency, "kernel_launch_us": d.kernel_launch_s / US,
    })
    for key in ("unfused_attention_efficiency", "attention_backward_efficiency",
                "unfused_attention_backward_efficiency"):
        if getattr(d, key) is not None:
            dev[key] = getattr(d, key)
    if d.update_efficiency is not None:
        dev["update_efficiency"] = d.update_efficiency
    if d.optimizer_efficiency is not None:
        dev["optimizer_efficiency"] = d.optimizer_efficiency
    if d.transport_core_share is not None:
        dev["transport_core_share"] = d.transport_core_share
    if d.comm_rewarm_s is not None:
        dev["comm_rewarm_us"] = d.comm_rewarm_s / US
    for key in ("eager_norm_efficiency", "eager_rotary_efficiency", "layer_memory_efficiency"):
        if getattr(d, key) is not None:
            dev[key] = getattr(d, key)
    for key in ("eager_op_forward", "eager_op_backward"):
        if getattr(d, f"{key}_s") is not None:
            dev[f"{key}_us"] = getattr(d, f"{key}_s") / US
    if d.ds07_decode_gemm_flops is not None:
        dev["ds07_decode_gemm_tflops"] = d.ds07_decode_gemm_flops / TFLOP
    dev.update(kernels.facts_to_table(d.kernels))
    if d.gemm_model != "kernel":
        dev["gemm_model"] = d.gemm_model
    node = {"gpus_per_node": profile.gpus_per_node,
            "nvlink_gbyte_per_s": nv.bandwidth / GB, "nvlink_latency_us": nv.latency_s / US,
            "nvlink_efficiency": nv.efficiency,
            "pcie_gbyte_per_s": pc.bandwidth / GB, "pcie_latency_us": pc.latency_s / US,
            "pcie_efficiency": pc.efficiency}
    if profile.nvls_bandwidth:
        node["nvls_gbyte_per_s"] = profile.nvls_bandwidth / GB
    if profile.nvlink_links is not None:
        node["nvlink_links"] = [list(row) for row in profile.nvlink_links]
    if profile.send_post_latency_s:
        node["send_post_us"] = profile.send_post_latency_s / US
    if profile.send_post_bandwidth:
        node["send_post_gbyte_per_s"] = profile.send_post_bandwidth / GB
    net = {"nic_gbit_per_s": nic.bandwidth * 8 / GB, "nics_per_node": profile.nics_per_node,
           "nic_latency_us": nic.latency_s / US, "nic_efficiency": nic.efficiency,
           "spine_oversubscription": profile.spine_oversubscription,
           "gpus_per_leaf": profile.gpus_per_leaf, "switch_latency_us": profile.switch_latency_s / US}
    return {"": {"name": profile.name, "description": profile.description},
            "device": dev, "node": node, "network": net}


def _toml_value(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return repr(round(float(v), 12))


def dumps_profile(profile: HardwareProfile, sources: Mapping[str, str] | None = None,
                  calibration: Mapping[str, Any] | None = None) -> str:
    """TOML text for ``profile``; every number gets a ``# source:`` comment, taken from
    ``sources[dotted_key]`` or else "carried over from <source_path>". ``calibration``
    (flat str/number values) becomes the optional ``[calibration]`` table."""
    sources = dict(sources or {})
    fallback = f"carried over from {profile.source_path or 'the in-memory profile'}"
    lines: list[str] = []
    for table, keys in profile_to_tables(profile).items():
        if table:
            lines += ["", f"[{table}]"]
        for k, v in keys.items():
            line = f"{k} = {_toml_value(v)}"
            if not isinstance(v, str):
                line += f"  # source: {sources.get(f'{table}.{k}' if table else k, fallback)}"
            lines.append(line)
    if calibration:
        lines += ["", "[calibration]"] + [f"{k} = {_toml_value(v)}" for k, v in calibration.items()]
    return "\n".join(lines) + "\n"
