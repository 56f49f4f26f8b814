"""Compute slowed by the communication it hides: the SMs an overlapped collective holds.

A collective that runs "under" compute is not free on a GPU: NCCL runs each collective as a
kernel with one CTA per channel, and each CTA occupies an SM for as long as the collective
is in flight; Transformer Engine's userbuffers kernels (``--tp-comm-overlap``) hold a
configured number of SMs the same way. The GEMMs and attention kernels running beside it get
the remaining SMs. Measured: an H100 GEMM launched as one full wave of 132 CTAs beside a
24-CTA ``ncclAllGather`` nearly doubled (its tiles no longer fit one wave; NVIDIA developer
forum, "Compute-communication overlap causes severe GEMM performance degradation because of
tail effect", 2025); across GPT and Llama training steps on A100/H100 overlapping slowed the
compute 18.9% on average, up to 40% (Lee et al. 2025, arXiv:2507.03114).

The model: while a collective holding ``s`` of the device's ``N`` SMs is in flight, compute
progresses at ``(N - s) / N`` of its rate (the whole-wave tail effect above is the worst
case of this and is not modelled: cuBLAS on Hopper balances partial waves with Stream-K).
Compute of ``W`` seconds under a collective of ``C`` seconds then ends ``C s / N`` later
when ``C <= W N / (N - s)``, else ``W s / (N - s)`` later (the compute, slowed all along,
ends before the collective). Profiles state ``s`` per device (``device.collective_ctas``
inside a node, ``device.collective_ctas_net`` for groups that span nodes); a profile
without them takes overlapped communication as free, as before.

A CPU rank has no SMs to split: its gloo threads share the rank's core with the compute
beside them. ``device.transport_core_share`` (what ``parsim calibrate`` measures as a GEMM
loop's slowdown beside an all-reduce over the all-reduce's own time) is the same fraction of
the compute's rate, applied to data-parallel collectives the same way
(:func:`transport_slowdown_s`; the engines slow compute while their rank's dp stream is busy).
After a *blocking* call the compute is slower for a moment too, re-warming the core the call
left idle (``device.comm_rewarm_us``, :func:`rewarm_s`).
"""
from __future__ import annotations

from collections.abc import Iterable

from parsim.cluster.hardware import Device, HardwareProfile

USERBUFFERS_SMS = {"ring_exchange": 1, "pipeline": 24, "bulk": 8}
"""SMs Transformer Engine's userbuffers hold per overlap method, from NeMo's H100 TP-overlap
configs (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py: all-gathers before
QKV and FC1 and the dgrad reduce-scatters by ``ring_exchange`` with TE's default
``num_sm = 1``; the forward reduce-scatters after proj and FC2 ``pipeline`` with
``num_sm = 24``; the backward's bulk overlaps ``num_sm`` 2, 4, 24 and 2-4 for qkv_dgrad,
qkv_wgrad, fc1_dgrad and fc1_wgrad: 8 as their mean)."""


def sms_of(dev: Device, spans_nodes: bool) -> int:
    """SMs one NCCL collective holds on ``dev`` (0 when the profile does not say)."""
    kf = dev.kernels
    if kf is None:
        return 0
    if spans_nodes and kf.collective_ctas_net:
        return kf.collective_ctas_net
    return kf.collective_ctas


def group_sms(hw: HardwareProfile, ranks: Iterable[int]) -> int:
    """SMs an NCCL collective over the global ``ranks`` holds on each of its GPUs (its group
    spans nodes or not, placed as ``hw.node_of`` places ranks)."""
    return sms_of(hw.device, len({hw.node_of(r) for r in ranks}) > 1)


def slowdown_s(dev: Device, sms: float, comm_s: float, compute_s: float) -> float:
    """Seconds ``compute_s`` of compute takes longer while ``comm_s`` of a collective holding
    ``sms`` SMs runs beside it (module docstring)."""
    kf = dev.kernels
    if kf is None or sms <= 0:
        return 0.0
    return shared_slowdown_s(sms / kf.sm_count, comm_s, compute_s)


def shared_slowdown_s(share: float, comm_s: float, compute_s: float) -> float:
    """Seconds ``compute_s`` of compute takes longer while ``comm_s`` of a collective that takes
    ``share`` of the compute's rate runs beside it: ``comm_s * share`` when the collective ends
    first, else the compute, slowed all along, loses ``compute_s * share / (1 - share)``."""
    if share <= 0.0 or comm_s <= 0.0 or compute_s <= 0.0:
        return 0.0
    if share >= 1.0 or comm_s * (1.0 - share) <= compute_s:
        return comm_s * min(share, 1.0)
    return compute_s * share / (1.0 - share)


def transport_slowdown_s(dev: Device, comm_s: float, compute_s: float) -> float:
    """Seconds compute takes longer beside ``comm_s`` of a data-parallel collective on a device
    whose transport shares the rank's processor (``Device.transport_core_share``: gloo on CPU
    ranks); 0 elsewhere."""
    return shared_slowdown_s(dev.transport_core_share or 0.0, comm_s, compute_s)


def async_beside(hw: HardwareProfile, comm_s: float, compute_s: float, ranks: Iterable[int]) -> tuple[float, float]:
    """(exposed seconds, compute slowdown) of a collective over the global ``ranks`` launched
    asynchronously beside ``compute_s`` of compute and waited for after it (Megatron's
    backward re-gather beside the input-gradient GEMM): what outlasts the compute is exposed,
    the hidden part slows the compute by the SMs its CTAs hold. Only a GPU (a profile with kernel
    facts) runs a collective's kernels on a stream beside the compute; on CPU ranks (gloo, the
    transport's threads on the rank's own cores, the torch runtime's collectives blocking)
    nothing hides."""
    if comm_s <= 0.0:
        return 0.0, 0.0
    if hw.device.kernels is None or hw.device.transport_core_share is not None:
        return comm_s, 0.0
    exposed = max(0.0, comm_s - compute_s)
    return exposed, slowdown_s(hw.device, group_sms(hw, ranks), comm_s - exposed, compute_s)


def rewarm_s(dev: Device, calls: float) -> float:
    """Compute a rank loses re-warming after ``calls`` blocking collectives inside a pass
    (``Device.comm_rewarm_s`` each; 0 where the profile does not state it: a GPU)."""
    return calls * (dev.comm_rewarm_s or 0.0) if calls > 0 else 0.0
