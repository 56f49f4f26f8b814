"""Peak memory per pipeline rank: the static model states (from the cost tables) plus the
dynamic allocations (memory events), broken down by kind at the peak."""
from __future__ import annotations

import numpy as np

from parsim.costs.tables import RankStatic

MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "other")


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
    return float(sum(breakdown.values())), breakdown
