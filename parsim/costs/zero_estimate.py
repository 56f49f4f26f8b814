"""DeepSpeed's model-state memory estimators, as its documentation states them.

``estimate_zero2_model_states_mem_needs`` and ``estimate_zero3_model_states_mem_needs``
(deepspeed/runtime/zero/stage_1_and_2.py and stage3.py; the "Memory Requirements" page of
DeepSpeed's docs prints their tables for t5-3b). They count model states only — fp16
params, fp32 grads, fp32 master params and Adam's two moments — with DeepSpeed's
``additional_buffer_factor`` (1.5) on the host side. The host figure is the peak during
model *initialisation* (every GPU's process holding an fp32 copy when ``zero.Init`` is not
used), not the steady state; that is what the estimator prints and what this reproduces.

What they leave out (activations, communication buckets, the allocator's fragmentation,
the CUDA context) is what :func:`parsim.costs.memory` adds for a full scenario.

ZeRO-2 without offload: the documented table (15.93 GiB per GPU for t5-3b on 8 GPUs)
comes from ``4·P + 16·P/N`` (fp16 params and fp16+fp32 grads resident, fp32 master params
and moments partitioned); a later DeepSpeed revision rewrote the term as
``2·P + 18·P/N``. ``zero2_formula="docs"`` (the default) gives the documented numbers,
``"v0.16"`` the rewrite.
"""
from __future__ import annotations

from dataclasses import dataclass

BUFFER_FACTOR = 1.5
"""DeepSpeed's ``additional_buffer_factor`` default (host side only)."""


@dataclass(frozen=True, kw_only=True)
class ZeroMemoryEstimate:
    """One row of DeepSpeed's estimator table."""

    zero: int
    """ZeRO stage (2 or 3)."""
    offload_optimizer: str
    """"none" or "cpu"."""
    offload_param: str
    """"none" or "cpu" (ZeRO-3 only)."""
    zero_init: bool
    """Whether the model is built under ``deepspeed.zero.Init`` (ZeRO-3 only)."""
    per_gpu_bytes: int
    """Model states on each GPU."""
    per_cpu_bytes: int
    """Host memory per node (the estimator's "per CPU")."""
    largest_layer_bytes: int
    """4 bytes per parameter of the largest layer (ZeRO-3's gathered fp16 params + grads); 0 for ZeRO-2."""


def estimate_zero2(*, params: float, gpus_per_node: int, nodes: int, offload_optimizer: str,
                   buffer_factor: float = BUFFER_FACTOR, zero2_formula: str = "docs") -> ZeroMemoryEstimate:
    """ZeRO-2 model states per GPU and host memory per node (DeepSpeed's estimator)."""
    total = nodes * gpus_per_node
    if offload_optimizer == "cpu":
        gpu = 2 * params  # fp16 params; grads stream to the host, Adam runs there
        cpu = params * max(4 * total, 16) * buffer_factor
    else:
        if zero2_formula == "docs":
            gpu = 4 * params + int(16 * params / total)
        else:
            gpu = 2 * params + int(18 * params / total)
        cpu = params * 4 * gpus_per_node * buffer_factor  # fp32 init copy per process
    return ZeroMemoryEstimate(zero=2, offload_optimizer=offload_optimizer, offload_param="none",
                              zero_init=False, per_gpu_bytes=int(gpu), per_cpu_bytes=int(cpu),
                              largest_layer_bytes=0)


def estimate_zero3(*, params: float, largest_layer_params: float, gpus_per_node: int, nodes: int,
                   offload_optimizer: str, offload_param: str, zero_init: bool,
                   buffer_factor: float = BUFFER_FACTOR) -> ZeroMemoryEstimate:
    """ZeRO-3 model states per GPU and host memory per node (DeepSpeed's estimator).

    ``offload_param="cpu"`` needs ``offload_optimizer="cpu"`` (the estimator has no other row).
    """
    total = nodes * gpus_per_node
    per_node = 1 / nodes  # the node's share of the partitioned states
    layer = 4 * largest_layer_params
    if offload_optimizer == "cpu":
        # 18 = 16 (fp32 params, grads, two moments) + 2 (fp16 params on the host); 16 without
        host_bytes = 18 if offload_param == "cpu" else 16
        gpu = layer if offload_param == "cpu" else layer + int(2 * params / total)
        factor = host_bytes * per_node if zero_init else max(4 * gpus_per_node, host_bytes * per_node)
        cpu = params * factor * buffer_factor
    else:
        if offload_param == "cpu":
            raise ValueError("offload_param='cpu' needs offload_optimizer='cpu'")
        gpu = layer + int(18 * params / total)
        cpu = (largest_layer_params if zero_init else params) * 4 * gpus_per_node * buffer_factor
    return ZeroMemoryEstimate(zero=3, offload_optimizer=offload_optimizer, offload_param=offload_param,
                              zero_init=zero_init, per_gpu_bytes=int(gpu), per_cpu_bytes=int(cpu),
                              largest_layer_bytes=int(layer))


def estimator_table(*, zero: int, params: float, largest_layer_params: float, gpus_per_node: int,
                    nodes: int) -> list[ZeroMemoryEstimate]:
    """Every row DeepSpeed's ``..._all_cold`` prints, in its order."""
    if zero == 2:
        return [estimate_zero2(params=params, gpus_per_node=gpus_per_node, nodes=nodes, offload_optimizer=o)
                for o in ("cpu", "none")]
    rows = []
    for opt, par in (("cpu", "cpu"), ("cpu", "none"), ("none", "none")):
        for init in (True, False):
            rows.append(estimate_zero3(params=params, largest_layer_params=largest_layer_params,
                                       gpus_per_node=gpus_per_node, nodes=nodes, offload_optimizer=opt,
                                       offload_param=par, zero_init=init))
    return rows
