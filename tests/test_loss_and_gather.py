"""Two costs counted by hand: the cross-entropy's HBM passes per framework, and the part of
ZeRO-1/2's overlapped parameter all-gather that the next step's first forward waits for."""
from __future__ import annotations

import pytest
from helpers import scenario

from parsim.costs.dp import param_gather_exposed
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.memory_ops import loss_work
from parsim.costs.stage import head_cost


@pytest.mark.parametrize("fused_kernels, fusion, fwd, bwd", [
    # Megatron-Core vocab-parallel: cast 2+4, max 4, sub 8, exp 8, sum 4, div 8 | mul 8, cast back 4+2
    (True, False, 34, 14),
    # eager: cast 6, log_softmax 12 | nll grad 4, log_softmax_backward 12, cast back 6
    (False, False, 18, 22),
    # one fused kernel per pass: read the bf16 logits | read them again, write the gradient
    (True, True, 2, 4),
    (False, True, 2, 4),
])
def test_loss_bytes_per_logit(fused_kernels, fusion, fwd, bwd):
    f, b = loss_work(1000.0, 2.0, fused_kernels, fusion)
    assert (f.bytes, b.bytes) == (1000.0 * fwd, 1000.0 * bwd)


@pytest.mark.parametrize("fused_kernels, fwd, bwd, kernels", [
    # fp32 logits: .float() is the tensor itself, no cast either way
    (True, 28, 8, (5, 1)),    # max 4, sub 8, exp 8, sum 4, div 8 | mul 8
    (False, 12, 16, (2, 3)),  # log_softmax 12 | nll grad 4, log_softmax_backward 12
])
def test_fp32_logits_are_not_cast(fused_kernels, fwd, bwd, kernels):
    f, b = loss_work(1000.0, 4.0, fused_kernels, False)
    assert (f.bytes, b.bytes) == (1000.0 * fwd, 1000.0 * bwd)
    assert (f.kernels, b.kernels) == kernels
    f16, b16 = loss_work(1000.0, 2.0, fused_kernels, False)
    assert (f16.kernels - f.kernels, b16.kernels - b.kernels) == (1, 1)  # the cast and its backward


def test_unfused_loss_costs_its_bytes_at_hbm_bandwidth():
    vocab, seq = 50_000, 512
    model = {"name": "t", "n_layers": 2, "d_model": 256, "n_heads": 8, "n_kv_heads": 8, "d_ff": 1024,
             "vocab_size": vocab, "ffn": "gelu", "norm": "layernorm", "bias": True, "position": "learned",
             "max_seq_len": 512}
    ends = {}
    for fusion in (False, True):
        sc = scenario(model=model, hardware="dgx-h100", training={"cross_entropy_fusion": fusion})
        inp = layer_inputs(cost_inputs(sc))
        ends[fusion] = head_cost(inp)
    dev = scenario(hardware="dgx-h100").hardware.device
    logits = seq * vocab  # one microbatch of one sequence, tp 1
    # the difference is the bytes' difference at HBM bandwidth (both far above the launch floor)
    assert ends[False].forward.compute - ends[True].forward.compute == pytest.approx(
        dev.memory_time(logits * 34) - dev.memory_time(logits * 2), rel=1e-9)
    assert ends[False].backward_input.compute - ends[True].backward_input.compute == pytest.approx(
        dev.memory_time(logits * 14) - dev.memory_time(logits * 4), rel=1e-9)


@pytest.mark.parametrize("gather, nbytes, bucket, forward, exposed", [
    (0.8, 4e9, 1e9, 0.0, 0.8),          # nothing to hide under: all of it
    (0.8, 4e9, 1e9, 2.0, 0.2),          # compute per bucket 0.5 >= gather per bucket 0.2: the first bucket
    (0.8, 4e9, 1e9, 0.4, 0.2 + 3 * 0.1),  # 0.1 per bucket of compute: each later bucket waits 0.1
    (0.8, 1e9, 4e9, 5.0, 0.8),          # one bucket: the forward needs all of it first
])
def test_param_gather_exposure_by_hand(gather, nbytes, bucket, forward, exposed):
    assert param_gather_exposed(gather, nbytes, bucket, forward) == pytest.approx(exposed)
