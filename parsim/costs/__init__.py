"""Action -> seconds, bytes, FLOPs: the cost model -- pure per-layer (layer.py), per-stage (stage.py)
and data-parallel (dp.py) parts of typed inputs (inputs.py), assembled by ModelCosts
(model_costs.py), handed to results as tables (tables.py); memory, MoE and the balanced
stage partition beside them."""
from parsim.costs.inputs import CostInputs, LayerInputs, cost_inputs, layer_inputs
from parsim.costs.layer import LayerCost, layer_cost, scores_pass_bytes
from parsim.costs.model_costs import ModelCosts, clear_caches
from parsim.costs.parts import AXES, PART_NAMES, AxisBytes, Parts
from parsim.costs.stage import StageCost, StageShape, stage_cost
from parsim.costs.tables import CostTables, MoEFigures, OpRow, RankStatic, StageRow

__all__ = [
           "AXES",
           "PART_NAMES",
           "AxisBytes",
           "CostInputs",
           "CostTables",
           "LayerCost",
           "LayerInputs",
           "MoEFigures",
           "ModelCosts",
           "OpRow",
           "Parts",
           "RankStatic",
           "StageCost",
           "StageRow",
           "StageShape",
           "clear_caches",
           "cost_inputs",
           "layer_cost",
           "layer_inputs",
           "scores_pass_bytes",
           "stage_cost",
]
