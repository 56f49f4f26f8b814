"""TeraPipe on the torch runtime (gloo, 2 CPU ranks): token slices executed with their K/V
dependencies give the gradients of the unsliced step.

Oracles: single-process training of the whole sequence (parsim.validate.reference) for the
pipeline run; for the dependency itself, the full-sequence gradient of one stage against its
slices run forward in order and backward in reverse order (and a backward out of order, which
misses a later slice's K/V gradient, must not match).
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import launch_parity

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from parsim.validate.model import build_stages  # noqa: E402
from parsim.validate.reference import check_parity  # noqa: E402
from parsim.validate.scale import prepare  # noqa: E402
from parsim.validate.slices import SliceKV  # noqa: E402

pytestmark = pytest.mark.torch
TINY = str(Path(__file__).parent / "data" / "validate-tiny.toml")
VARIANTS = {
    "K4": ["schedule.name=TeraPipe", "schedule.token_slices=4"],
    "K3-uneven": ["schedule.name=TeraPipe", "schedule.token_slices=3"],   # 11, 11, 10 tokens
    "K4-sdpa-llama": ["schedule.name=TeraPipe", "schedule.token_slices=4", "training.flash_attention=true",
                      "model.ffn=swiglu", "model.norm=rmsnorm", "model.n_kv_heads=2", "model.bias=false"],
}


def _assert_parity(variants: dict, n_ranks: int, tmp_path, timeout: int, deadline: int) -> None:
    """Run every variant on ``n_ranks`` gloo ranks in one launch; each one's gradients must equal
    a single process's within 1e-6."""
    ranks = launch_parity(TINY, variants.values(), n_ranks, tmp_path, timeout, deadline)
    for i, name in enumerate(variants):
        sc = prepare(TINY, variants[name], "gloo")
        res = check_parity(sc, tmp_path, [r["variants"][i] for r in ranks], variant=i)
        assert res["max_abs_diff"] < 1e-6, name


def test_terapipe_gradients_equal_single_process(tmp_path):
    _assert_parity(VARIANTS, 2, tmp_path, 60, 120)


FOUR_RANKS = {  # on top of tensor and data parallelism (pp=2 x tp=2, pp=2 x dp=2)
    "K4-tp2": ["gpus=4", "parallel.tp=2", "schedule.name=TeraPipe", "schedule.token_slices=4"],
    "K4-dp2": ["gpus=4", "parallel.dp=2", "training.global_batch=16", "schedule.name=TeraPipe",
               "schedule.token_slices=4"],
}


@pytest.mark.slow
def test_terapipe_with_tp_and_dp_gradients_equal_single_process(tmp_path):
    _assert_parity(FOUR_RANKS, 4, tmp_path, 90, 200)


def _grads(stage, x, g_out, lengths, order):
    """One stage's parameter gradients from its slices: forwards in order, backwards in ``order``."""
    stage.zero_grad()
    outs, kvs, first = [], [SliceKV() for _ in stage.blocks], 0
    for i, n in enumerate(lengths):
        for blk, kv in zip(stage.blocks, kvs):
            blk.kv = kv
        outs.append(stage(x[:, first:first + n]))
        first += n
    for blk in stage.blocks:
        blk.kv = None
    firsts = [sum(lengths[:i]) for i in range(len(lengths))]
    for i in order:
        more, grads = [], []
        for kv in kvs:
            t, g = kv.outputs(i)
            more += t
            grads += g
        torch.autograd.backward([outs[i], *more], [g_out[:, firsts[i]:firsts[i] + lengths[i]], *grads])
        for kv in kvs:
            kv.collect(i)
    return [p.grad.clone() for p in stage.parameters()]


def test_a_slice_backward_needs_the_later_slices_kv_gradients():
    sc = prepare(TINY, [], "gloo")
    stage = build_stages(sc.model, (1, 2, 1), 32, False, seed=0)[1]  # a middle stage: two blocks
    torch.manual_seed(0)
    x, g = torch.randn(2, 32, 64), torch.randn(2, 32, 64)
    stage.zero_grad()
    torch.autograd.backward(stage(x), g)
    want = [p.grad.clone() for p in stage.parameters()]
    lengths = [8, 12, 12]
    got = _grads(stage, x, g, lengths, order=[2, 1, 0])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    wrong = _grads(stage, x, g, lengths, order=[0, 1, 2])  # slice 0 before the slices that attend to it
    assert max(float((a - b).abs().max()) for a, b in zip(wrong, want)) > 1e-4
