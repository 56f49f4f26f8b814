"""Action -> seconds, bytes, FLOPs: the cost model (per layer and per stage), memory, MoE and the
balanced stage partition."""
from parsim.costs.model_costs import (
    PART_NAMES,
    ModelCosts,
    Parts,
    StageCost,
    scores_pass_bytes,
)

__all__ = ["ModelCosts", "PART_NAMES", "Parts", "StageCost", "scores_pass_bytes"]
