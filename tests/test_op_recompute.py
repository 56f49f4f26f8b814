"""torchtitan's op-level selective activation checkpointing (``training.recompute = "op"``).

Oracles: the policy in torchtitan (``parallelize_llama._apply_ac_to_transformer_block``,
``selective_ac_option = "op"``) -- save the outputs of ``aten.mm`` and of SDPA, recompute every
other op, and of the matmuls save only those at an odd position of a running per-block count
-- worked by hand for a Llama block (seven matmuls: the saved set alternates between
{wq, wv, w1, w2} and {wk, wo, w3}) and a GPT block (four: qkv and fc1 saved every step).
"""
from __future__ import annotations

import dataclasses

import pytest

import parsim.costs.compute as _compute
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.layer import op_recompute_time, representative_layer
from parsim.costs.memory import (
    ActivationOptions,
    layer_activation_bytes,
    op_checkpoint_bytes_per_token,
)
from parsim.model import PRESETS
from parsim.model.shapes import layer_gemms
from parsim.simulate import simulate
from tests.helpers import scenario


def test_llama3_8b_keeps_the_larger_alternating_set_by_hand():
    # h 4096, q 32 x 128 = 4096, kv 8 x 128 = 1024, SwiGLU f 14336, 32 heads; bf16:
    # block input h, {wq q, wv kv, w1 f, w2 h} (> {wk kv, wo h, w3 f}), SDPA output q, fp32 lse per head
    by_hand = 2 * (4096 + (4096 + 1024 + 14336 + 4096) + 4096) + 4 * 32
    assert by_hand == 63616
    spec = PRESETS["llama3-8b"]
    opts = ActivationOptions("op", flash_attention=True, dropout=False)
    assert op_checkpoint_bytes_per_token(spec, 1, opts) == by_hand
    assert layer_activation_bytes(spec, 8192, 2, 1, opts) == 2 * 8192 * by_hand


def test_gpt3_keeps_qkv_and_fc1_by_hand():
    # h 12288, 96 heads of 128, GeLU f 4h: block input, qkv (3h), fc1 (4h), SDPA output (h), lse
    by_hand = 2 * (12288 + 3 * 12288 + 4 * 12288 + 12288) + 4 * 96
    opts = ActivationOptions("op", flash_attention=True, dropout=False)
    assert op_checkpoint_bytes_per_token(PRESETS["gpt3-175b"], 1, opts) == by_hand
    # tensor parallel: every term but the (not sequence-parallel) block input is sharded
    tp8 = 2 * (12288 + (3 * 12288 + 4 * 12288 + 12288) / 8) + 4 * 96 / 8
    assert op_checkpoint_bytes_per_token(PRESETS["gpt3-175b"], 8, opts) == pytest.approx(tp8)


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt3-175b"])
def test_op_keeps_less_than_none_and_more_than_full(preset):
    spec = PRESETS[preset]
    kept = {r: layer_activation_bytes(spec, 4096, 1, 1, ActivationOptions(r, True, False, False))
            for r in ("none", "op", "full")}
    assert kept["full"] < kept["op"] < kept["none"]


def _inputs(model: str, recompute: str):
    sc = scenario(model={"preset": model}, hardware="dgx-h100", training={"recompute": recompute, "seq_len": 4096})
    return sc, layer_inputs(cost_inputs(sc))


@pytest.mark.parametrize("model, share", [
    ("llama3-8b", 0.5),  # seven matmuls: each one recomputed every other step
    ("gpt3-175b", (1 + 4) / (3 + 1 + 4 + 4)),  # proj (h^2) and fc2 (4h^2) of 12h^2, every step
])
def test_rerun_is_the_unsaved_matmuls_and_the_memory_bound_forward(model, share):
    _sc, inp = _inputs(model, "op")
    spec = inp.model
    gemms = layer_gemms(spec, inp.shard.tokens, inp.shard.tp, representative_layer(spec, False))
    bc = _compute.block_compute(inp, tuple(gemms), False)
    assert op_recompute_time(inp, False) == pytest.approx(share * bc.gemm[0] + bc.memory[0])
    # less than rerunning the whole forward (full recompute), more than nothing
    assert 0 < op_recompute_time(inp, False) < sum(bc.gemm[:1]) + bc.attention[0] + bc.memory[0]


def test_a_step_with_op_recompute_sits_between_none_and_full():
    runs = {}
    for r in ("none", "op", "full"):
        sc = scenario(model={"preset": "llama3-8b"}, hardware="dgx-h100", m=2,
                      training={"recompute": r, "seq_len": 4096})
        runs[r] = simulate(sc).metrics
    b = {r: runs[r]["breakdown_s"]["recompute"] for r in runs}
    assert b["none"] == 0.0 < b["op"] < b["full"]
    step = {r: runs[r]["step_time_s"] for r in runs}
    assert step["none"] < step["op"] < step["full"]
    mem = {r: runs[r]["peak_memory_bytes"] for r in runs}
    assert mem["full"] < mem["op"] < mem["none"]
    # every block of every microbatch reruns the same work
    _sc, inp = _inputs("llama3-8b", "op")
    assert b["op"] == pytest.approx(2 * 32 * op_recompute_time(inp, False), rel=1e-9)


# ------------------------------------------------------------------ the loss's backward temporaries
@pytest.mark.parametrize("training, per_logit", [
    ({"fused_kernels": False}, 8),  # eager: log_softmax_backward's fp32 gradient in and out
    ({}, 2),  # Megatron's vocabulary-parallel loss: the bf16 logits' gradient beside its softmax
])
def test_the_loss_backward_peak_by_hand(training, per_logit):
    def peak(**tr):
        sc = scenario(model={"preset": "llama3-8b"}, hardware="dgx-h100", m=1, training={"seq_len": 4096, **tr})
        return simulate(sc).metrics["peak_memory_bytes"]
    # against a fused (chunked) loss, which holds nothing of the logits' size: tokens x vocabulary
    extra = peak(**training) - peak(**training, cross_entropy_fusion=True)
    assert extra == per_logit * 4096 * 128256


def test_a_moe_models_dense_blocks_keep_their_own_ffn_width():
    # DeepSeek-V3 with its three dense blocks' FFN narrowed, so that they differ from a routed
    # block's 8 x 2048 + 2048: the dense block keeps w1 of d_ff, the routed one of the experts'
    spec = dataclasses.replace(PRESETS["deepseek-v3"], d_ff=12288)
    opts = ActivationOptions("op", flash_attention=True, dropout=False)
    dense, routed = (op_checkpoint_bytes_per_token(spec, 1, opts, li) for li in (0, spec.n_layers - 1))
    assert routed - dense == 2 * ((8 * 2048 + 2048) - 12288)
