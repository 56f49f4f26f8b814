"""Training with model states off the GPU: ZeRO-Offload (optimizer on the CPU), ZeRO-Infinity
(optimizer and/or parameters on CPU or NVMe), activation-checkpoint offload, Twin-Flow's
partial offload and ZeRO-Offload's one-step delayed parameter update.

What moves, per GPU and per optimizer step (``P`` = this GPU's parameter shard, ``r`` =
``offload.optimizer_ratio``, the fraction of it updated on the CPU):

* gradients to the host: ``g·r·P`` bytes over the GPU's host link (PCIe, or NVLink-C2C),
  copied as each partition is reduced, so it hides under the last backward;
* CPU-Adam on ``r·P`` parameters: read fp32 param, grad, m, v; write param, m, v and the
  16-bit copy, 30 bytes per parameter, at the node's host-memory bandwidth (STREAM-level)
  shared by the node's GPUs, or the cores' compute rate if that is lower;
* optimizer states on NVMe (``optimizer = "nvme"``): the fp32 states (``K·r·P``) read in
  and written back around the CPU step (DeepSpeed's default swapper: not pipelined), the
  node's drives shared by its GPUs; GPUDirect Storage or a bounce through pinned host memory;
* the updated 16-bit parameters back to the GPU: ``w·r·P`` bytes;
* the GPU updates the rest, ``(1-r)·P``, as before (an HBM-bound step).

Parameters offloaded (ZeRO-3, ``params = "cpu"|"nvme"``): every forward and backward fetches
the stage's 16-bit shard over the host link (from NVMe through host memory), prefetched under
the compute it feeds; activation checkpoints offloaded: copied out after the forward, back
before the backward, under the compute around them.

All of it becomes *phases* of the ops (spans on the ``pcie``, ``cpu`` and ``nvme`` streams of
the timeline); what compute cannot hide lengthens the op. With ``delayed_update`` the CPU step
of step k runs during step k+1's forward and backward, so only what exceeds them is exposed.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.cluster.hardware import HardwareProfile
from parsim.cluster.host import HostTier
from parsim.config.offload import OffloadConfig
from parsim.errors import ConfigError

CPU_ADAM_BYTES_PER_PARAM = 30.0
"""fp32 param, grad, m, v read (16) + param, m, v written (12) + the 16-bit copy written (2)."""
CPU_ADAM_STATE_BYTES = 16.0
"""Host bytes per offloaded parameter: fp32 master, gradient, m, v (DeepSpeed's 16; its 18 adds
the 16-bit parameters when they live on the host too)."""


@dataclass(frozen=True, kw_only=True)
class Tiers:
    """The bandwidths one GPU sees to the tiers behind it (bytes/s, SI)."""

    host_link: float
    """Host <-> this GPU, per direction (PCIe or C2C, effective)."""
    host_link_name: str
    """"pcie" or "c2c"."""
    cpu_adam_params_per_s: float
    """CPU-Adam parameters per second available to this GPU's process."""
    nvme_read: float
    """NVMe read available to this GPU (the node's drives shared by its GPUs)."""
    nvme_write: float
    """NVMe write available to this GPU."""
    gpudirect: bool
    """NVMe <-> GPU without the host bounce."""


def tiers(hw: HardwareProfile, gpus_on_node: int, file: str = "<scenario>") -> Tiers:
    """What one GPU gets when ``gpus_on_node`` GPUs of a node offload at once."""
    host: HostTier | None = hw.host
    if host is None:
        raise ConfigError(file, "offload", f"hardware profile {hw.name} has no [host] table (host memory, "
                                           "CPU, NVMe): offload cannot be costed on it")
    n = max(1, gpus_on_node)
    if host.c2c_bandwidth > 0:
        link, name = host.c2c_bandwidth * host.c2c_efficiency, "c2c"
    else:
        link, name = hw.pcie.effective_bandwidth, "pcie"
    bw_rate = host.stream_bandwidth / n / CPU_ADAM_BYTES_PER_PARAM
    core_rate = host.cpu_adam_params_per_s_per_core * host.cpu_cores / n
    return Tiers(host_link=link, host_link_name=name, cpu_adam_params_per_s=min(bw_rate, core_rate),
                 nvme_read=host.nvme_read / n, nvme_write=host.nvme_write / n, gpudirect=host.gpudirect_storage)


def nvme_to_gpu_s(nbytes: float, t: Tiers) -> float:
    """NVMe -> GPU: direct with GDS; otherwise through a pinned host buffer, the two hops
    pipelined in chunks, so the slower one sets the pace."""
    if nbytes <= 0:
        return 0.0
    if t.nvme_read <= 0:
        raise ValueError("no NVMe on this profile")
    return nbytes / min(t.nvme_read, t.host_link)


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """The offloaded optimizer step of one pipeline stage on one GPU."""

    duration_s: float
    """The STEP op's exposed length on the compute stream."""
    phases: tuple[tuple[str, str, float, float, float], ...]
    """(stream, name, offset from the STEP's start in s, duration s, bytes) of each transfer and CPU step."""
    tier_s: dict
    """Seconds busy per tier: pcie (or c2c), cpu, nvme."""


def step_plan(*, off: OffloadConfig, t: Tiers, shard_params: float, weight_bytes: int, grad_bytes: int,
              state_bytes: int, gpu_update_s: float, backward_s: float, compute_s: float) -> StepPlan:
    """The optimizer step with ``off``: ``shard_params`` this GPU updates, ``gpu_update_s`` what
    the GPU-resident update of all of them would take, ``backward_s`` the last backward (the
    gradient copy hides under it), ``compute_s`` the step's forward+backward (what the delayed
    update hides under)."""
    r = off.optimizer_ratio if off.optimizer != "none" else 0.0
    p_cpu = r * shard_params
    d2h_b, h2d_b = grad_bytes * p_cpu, weight_bytes * p_cpu
    d2h, h2d = d2h_b / t.host_link, h2d_b / t.host_link
    adam = p_cpu / t.cpu_adam_params_per_s if p_cpu else 0.0
    nv_read = nv_write = 0.0
    states_b = state_bytes * p_cpu
    if off.optimizer == "nvme" and p_cpu:
        if t.nvme_read <= 0:
            raise ValueError("no NVMe on this profile")
        nv_read, nv_write = states_b / t.nvme_read, states_b / t.nvme_write
    gpu_part = (1.0 - r) * gpu_update_s
    hidden_d2h = min(d2h, backward_s)
    chain = [("nvme", "NVME_READ", nv_read, states_b), ("cpu", "CPU_ADAM", adam, 0.0),
             ("nvme", "NVME_WRITE", nv_write, states_b), (t.host_link_name, "H2D_PARAMS", h2d, h2d_b)]
    chain = [c for c in chain if c[2] > 0]
    serial = (d2h - hidden_d2h) + sum(c[2] for c in chain)
    if off.delayed_update:
        # step k's CPU chain runs under step k+1's forward+backward; steady state shown in one step
        exposed = max(0.0, serial - compute_s)
        duration = gpu_part + exposed
        offset = duration - serial  # the chain ends with the STEP (negative: it began under the compute)
    else:
        duration = gpu_part + serial
        offset = gpu_part
    phases = []
    if d2h:
        phases.append((t.host_link_name, "D2H_GRADS", offset - hidden_d2h, d2h, d2h_b))
    at = offset + (d2h - hidden_d2h)
    for stream, name, dur, nbytes in chain:
        phases.append((stream, name, at, dur, nbytes))
        at += dur
    tier_s = {t.host_link_name: d2h + h2d, "cpu": adam, "nvme": nv_read + nv_write}
    return StepPlan(duration_s=duration, phases=tuple(phases), tier_s=tier_s)


def fetch_params_s(*, off: OffloadConfig, t: Tiers, shard_bytes: float) -> float:
    """Seconds to bring this GPU's 16-bit parameter shard of a stage to the GPU once."""
    if off.params == "cpu":
        return shard_bytes / t.host_link
    if off.params == "nvme":
        return nvme_to_gpu_s(shard_bytes, t)
    return 0.0


@dataclass(frozen=True, kw_only=True)
class TierBytes:
    """Where one GPU's model states live (bytes)."""

    host: float
    """In host memory (pinned)."""
    nvme: float
    """On NVMe."""


def tier_bytes(*, off: OffloadConfig, shard_params: float, weight_bytes: int, state_bytes: int,
               grad_fp32_bytes: int = 4, activation_bytes: float = 0.0) -> TierBytes:
    """Host and NVMe bytes of one GPU's shard (DeepSpeed's layout: fp32 master, m, v and an fp32
    gradient per offloaded parameter, on the host or on NVMe; the 16-bit parameters where
    ``params`` says; the swap buffers in pinned memory are not counted)."""
    r = off.optimizer_ratio if off.optimizer != "none" else 0.0
    p = r * shard_params
    host = nvme = 0.0
    if off.optimizer == "cpu":
        host += (state_bytes + grad_fp32_bytes) * p
    elif off.optimizer == "nvme":
        nvme += (state_bytes + grad_fp32_bytes) * p  # ZeRO-Infinity swaps the fp32 gradients too
    if off.params == "cpu":
        host += weight_bytes * shard_params
    elif off.params == "nvme":
        nvme += weight_bytes * shard_params
    if off.activations == "cpu":
        host += activation_bytes
    return TierBytes(host=host, nvme=nvme)


def largest_model_params(*, hw: HardwareProfile, gpus: int, zero: int, off: OffloadConfig,
                         optimizer: str = "adam", precision: str = "fp16") -> tuple[float, str]:
    """The most parameters whose model states fit one node's tiers (no activations): (params,
    the tier that binds). Each GPU holds its share of what stays on the GPU (ZeRO's
    ``(2+2+K)/N`` terms less what ``off`` moves); the node's host memory (pinned) and drives
    hold the rest (:func:`tier_bytes`)."""
    from parsim.costs.memory import model_state_bytes, state_bytes_per_param

    w, g, k = state_bytes_per_param(optimizer, precision)
    ms = model_state_bytes(1.0, gpus, zero, optimizer, precision)
    r = off.optimizer_ratio if off.optimizer != "none" else 0.0
    gpu = ms.params * (0.0 if off.params != "none" else 1.0) + (ms.grads + ms.optimizer) * (1.0 - r)
    shard = 1.0 / (gpus if zero >= 1 else 1)
    tb = tier_bytes(off=off, shard_params=shard, weight_bytes=w, state_bytes=k)
    per_node = min(gpus, hw.gpus_per_node)
    limits = {"gpu": hw.device.usable_memory_bytes / gpu if gpu else float("inf")}
    if tb.host:
        limits["host"] = (hw.host.pinned_memory_bytes if hw.host else 0.0) / (tb.host * per_node)
    if tb.nvme:
        limits["nvme"] = (hw.host.nvme_bytes if hw.host else 0.0) / (tb.nvme * per_node)
    tier = min(limits, key=limits.get)
    return limits[tier], tier
