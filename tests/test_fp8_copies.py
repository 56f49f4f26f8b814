"""FP8 copies Transformer Engine keeps and writes, by GPU and scaling recipe.

Oracle: Transformer Engine's ``is_non_tn_fp8_gemm_supported()`` (compute capability 10.x-11.x and
13+) and ``Float8Tensor.update_usage``: with per-tensor scaling (delayed, current) the column-wise
copy is a transpose, which TE builds only where FP8 GEMMs take TN layouts alone (Hopper); MXFP8
and blockwise scales run along one dimension, so both copies always exist, with 1 byte of scale
per 32 (MX) or 4 per 128 (blockwise) elements.
"""
from __future__ import annotations

import pytest

from parsim.costs.inputs import cost_inputs
from parsim.costs.memory_ops import fp8_cast_work, fp8_copy_bytes, non_tn_fp8_gemms
from parsim.costs.model_costs import ModelCosts
from parsim.model import get_preset
from parsim.scenario import scenario_from_dict


@pytest.mark.parametrize("recipe, hopper, blackwell", [
    ("delayed", 2.0, 1.0), ("current", 2.0, 1.0), ("mxfp8", 2 * (1 + 1 / 32), 2 * (1 + 1 / 32)),
    ("blockwise", 2 * (1 + 4 / 128), 2 * (1 + 4 / 128)),
])
def test_copies_per_element(recipe, hopper, blackwell):
    assert fp8_copy_bytes(recipe, non_tn=False) == hopper
    assert fp8_copy_bytes(recipe, non_tn=True) == blackwell


@pytest.mark.parametrize("profile, non_tn", [("dgx-h100", False), ("dgx-h200", False), ("dgx-a100-80g", False),
                                             ("hgx-b200", True), ("dgx-b200", True), ("gb200-nvl72", True),
                                             ("gb300-nvl72", True)])
def test_non_tn_fp8_gemms_on_blackwell_datacenter_parts_only(profile, non_tn):
    from parsim.cluster.hardware import load_profile
    assert non_tn_fp8_gemms(load_profile(profile).device) is non_tn


def _weights(profile: str, recipe: str) -> float:
    sc = scenario_from_dict({"name": "f", "hardware": profile, "gpus": 8, "model": {"preset": "llama3-8b"},
                             "training": {"global_batch": 8, "seq_len": 4096, "precision": "fp8", "fp8_recipe": recipe},
                             "parallel": {"dp": 8, "zero": 1, "framework": "megatron"}}, "f.toml")
    st = ModelCosts(cost_inputs(sc)).model_states([0], 0)
    return dict(st["buffers"])["fp8_weights"] / (st["params"] / 2)  # bytes per parameter (bf16 weights: 2)


@pytest.mark.parametrize("profile, recipe, per_param", [
    ("dgx-h100", "current", 2.0), ("gb200-nvl72", "current", 1.0), ("gb200-nvl72", "mxfp8", 2 * (1 + 1 / 32)),
])
def test_fp8_weight_copies_beside_the_16_bit_weights(profile, recipe, per_param):
    assert _weights(profile, recipe) == pytest.approx(per_param, rel=1e-12)


def test_cast_writes_one_copy_where_the_gemm_takes_any_layout():
    """Current scaling reads the bf16 tensor twice (amax, then cast: 4 bytes) and writes the copies:
    6 bytes an element on Hopper, 5 on Blackwell."""
    m = get_preset("llama3-8b")
    hopper = fp8_cast_work(m, 4096, 1, "current", 2, non_tn=False)
    blackwell = fp8_cast_work(m, 4096, 1, "current", 2, non_tn=True)
    for h, b in zip(hopper, blackwell):
        assert b.bytes / h.bytes == pytest.approx(5 / 6, rel=1e-12) and b.kernels == h.kernels
