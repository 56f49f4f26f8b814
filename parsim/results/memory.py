"""Peak memory per pipeline rank: the static model states (from the cost tables) plus the
dynamic allocations (memory events), broken down by kind at the peak."""
from __future__ import annotations

import numpy as np

from parsim.costs.memory import ALLOCATOR_FRAGMENTATION
from parsim.costs.tables import RankStatic

MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "other")
"""Kinds every breakdown shows; the framework's buffers (grad_buckets, comm_buffers,
fp8_weights, param_units: ZeRO-3/FSDP's gathered units) are added where present."""


def rank_memory(static: RankStatic, time: np.ndarray, delta: np.ndarray,
                kind: np.ndarray) -> tuple[float, dict[str, float]]:
    """Peak bytes of a rank and the breakdown by kind at that moment (events of this rank only)."""
    kinds = {"activations": 0.0, "other": 0.0}
    if len(delta):
        order = np.lexsort((delta, time))  # at equal times frees (negative) come first
        total = np.cumsum(delta[order])
        upto = order[: int(np.argmax(total)) + 1]
        for k in np.unique(kind[upto]):
            kinds[str(k)] = kinds.get(str(k), 0.0) + float(delta[upto][kind[upto] == k].sum())
    breakdown = {"params": static.params, "grads": static.grads, "optimizer": static.optimizer, **kinds}
    for k, v in static.buffers:
        breakdown[k] = breakdown.get(k, 0.0) + v
    return float(sum(breakdown.values())), breakdown


def reserved_bytes(allocated: float) -> float:
    """Peak memory the caching allocator reserves for ``allocated`` bytes at peak
    (parsim.costs.memory.ALLOCATOR_FRAGMENTATION)."""
    return allocated / (1.0 - ALLOCATOR_FRAGMENTATION)
