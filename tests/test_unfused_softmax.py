"""The unfused attention core's scores traffic and Megatron's fused upper-triangular softmax.

Oracle: Megatron-LM's ``scaled_upper_triang_masked_softmax.h`` (b1a8337, March 2021; unchanged
in Megatron-Core): the forward loads the ``row + 1`` scores a causal row keeps and stores the
whole row (zeros past the diagonal); the backward loads the gradient and the output of those
same elements and stores the whole row; ``FusedScaleMaskSoftmax`` takes that path for a causal
mask when ``16 < sk <= 4096`` (2,048 in 2021) and the query and key lengths are equal.
"""
import pytest

from parsim.costs.inputs import causal_softmax_triangle, cost_inputs, layer_inputs
from parsim.costs.layer import scores_pass_bytes, scores_traffic
from parsim.scenario import scenario_from_dict


def test_the_triangle_halves_the_softmax_reads_only():
    bh, s = 24, 2048
    el = bh * s * s * 2  # fp16 score elements, in bytes
    # element passes by hand: softmax read 1 + write 1, dropout read 1 + write 1 + a 1-byte mask
    # (0.5 of a 2-byte element), the PV product's read 1
    assert scores_pass_bytes(bh, s, s, "fp16", dropout=True) == pytest.approx(el * (2 + 2.5 + 1))
    # the triangular kernel reads half the row: 0.5 + 1
    assert scores_pass_bytes(bh, s, s, "fp16", dropout=True, triangle=True) == pytest.approx(el * (1.5 + 2.5 + 1))
    assert scores_pass_bytes(bh, s, s, "fp16") - scores_pass_bytes(bh, s, s, "fp16", triangle=True) == \
        pytest.approx(0.5 * el)


@pytest.mark.parametrize("framework, seq, cp, want", [
    ("megatron", 2048, 1, True), ("megatron", 4096, 1, True), ("megatron", 16, 1, False),
    ("megatron", 17, 1, True), ("megatron", 8192, 1, False), ("megatron", 2048, 2, False),
    ("fsdp", 2048, 1, False), ("deepspeed", 2048, 1, False), ("zero", 2048, 1, False),
])
def test_only_megatron_s_kernel_takes_the_triangle(framework, seq, cp, want):
    assert causal_softmax_triangle(framework, seq, cp) is want


def _inputs(framework: str):
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": 8, "model": {"preset": "megatron-1.7b"},
           "training": {"global_batch": 8, "seq_len": 2048, "precision": "fp16", "flash_attention": False},
           "parallel": {"dp": 8, "framework": framework}}
    return layer_inputs(cost_inputs(scenario_from_dict(doc, "t.toml")))


def test_a_megatron_job_pays_the_triangle_and_another_framework_does_not():
    meg, other = _inputs("megatron"), _inputs("zero")
    assert meg.options.causal_softmax_triangle and not other.options.causal_softmax_triangle
    bh, s = 24, 2048  # megatron-1.7b: 24 heads, microbatch 1
    half_pass = meg.hardware.device.layer_memory_time(0.5 * bh * s * s * 2)  # a layer kernel's rate
    for passes in (1.0, 2.0):  # forward, backward
        assert scores_traffic(other, passes) - scores_traffic(meg, passes) == pytest.approx(passes * half_pass)
