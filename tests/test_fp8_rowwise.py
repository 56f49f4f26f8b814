"""torchao.float8's rowwise recipe (``training.fp8_recipe = "rowwise"``).

Oracles: the casts and rescales torchao runs per linear layer, counted by hand from its source
(``float8_linear.matmul_with_hp_or_float8_args``: every tensor reduced and cast once per GEMM
that uses it, along the dimension that GEMM contracts; ``addmm_float8_unwrapped``: the two
backward GEMMs, without fast accumulation, rescale their output); the speedups over bf16 that
torchao's documentation publishes for Llama3-8B on 8 H100 (tests/data/torchao_float8_e2e.json).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from parsim.costs.memory_ops import fp8_cast_work, rowwise_cast_work
from parsim.errors import ConfigError
from parsim.model import get_preset
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate

DATA = json.loads((Path(__file__).parent / "data" / "torchao_float8_e2e.json").read_text())


def test_cast_and_rescale_bytes_by_hand():
    m = get_preset("llama3-8b")  # d 4096, 32 heads x 128, 8 KV heads, SwiGLU FFN 14336
    fwd, bwd = rowwise_cast_work(m, tokens_local=1, tp=1, act_bytes=2)
    # (K, N) of QKV, proj, FC1 (gate + up), FC2
    linears = [(4096, 4096 + 2 * 1024), (4096, 4096), (4096, 2 * 14336), (14336, 4096)]
    x = 4096 + 4096 + 4096 + 14336          # the inputs, one token
    dy = 6144 + 4096 + 28672 + 4096          # the output gradients, one token
    w = sum(k * n for k, n in linears)       # 218,103,808 weight elements
    assert w == 4096 * 53248
    cast = 2 + 2 + 1                         # amax read, cast read, FP8 write
    assert fwd.bytes == pytest.approx((x + w) * cast)                     # x and W along K
    assert bwd.bytes == pytest.approx((2 * dy + x + w) * cast + (x + w) * 4)  # dy twice, x, W; rescale dx, dW
    assert (fwd.kernels, bwd.kernels) == (4 * 2 * 2, 4 * (4 * 2 + 2))
    assert fp8_cast_work(m, 1, 1, "rowwise", 2) == (fwd, bwd)


def test_rowwise_casts_more_than_current_scaling():
    m = get_preset("llama3-8b")
    for r, c in zip(fp8_cast_work(m, 8192, 1, "rowwise", 2), fp8_cast_work(m, 8192, 1, "current", 2)):
        assert r.bytes > c.bytes and r.kernels > c.kernels


def _scenario(precision: str, recipe: str | None = None, recompute: str = "op"):
    t = {"global_batch": 8, "seq_len": DATA["seq_len"], "microbatch_size": 1, "precision": precision,
         "recompute": recompute, "attention_kernel": "fa2"}
    if recipe:
        t["fp8_recipe"] = recipe
    return scenario_from_dict({"name": "torchao-float8", "hardware": DATA["hardware"], "gpus": DATA["gpus"],
                               "model": {"preset": DATA["model"]}, "training": t,
                               "parallel": {"dp": DATA["gpus"], "zero": 3, "framework": "fsdp"}}, "t.toml")


@pytest.fixture(scope="module")
def runs():
    return {k: simulate(_scenario(*v)) for k, v in
            {"bf16": ("bf16",), "tensorwise": ("fp8", "current"), "rowwise": ("fp8", "rowwise")}.items()}


def test_speedups_over_bf16_match_torchaos_table(runs):
    pub = DATA["median_tokens_per_s"]
    tps = {k: r.metrics["tokens_per_s"] for k, r in runs.items()}
    for key, pub_key in (("tensorwise", "tensorwise_float8_all_gather"), ("rowwise", "rowwise_bf16_all_gather")):
        predicted, published = tps[key] / tps["bf16"], pub[pub_key] / pub["bf16"]
        assert predicted / published - 1 == pytest.approx(0, abs=DATA["tolerance"]), (key, predicted, published)
    assert tps["rowwise"] < tps["tensorwise"]


def test_rowwise_keeps_the_16_bit_linear_inputs(runs):
    """torchao saves the high-precision input (its weight gradient casts it along the tokens), so
    without recompute the activations equal bf16 training's; current scaling keeps the 1-byte
    copies Transformer Engine saves. Under the table's per-op SAC the saved tensors are the
    matmul outputs, the same for all three (its peak memory: 47.65, 47.77, 47.79 GB)."""
    act = {k: simulate(_scenario(*v, recompute="none")).to_json()["stages"][0]["memory"]["activations"]
           for k, v in {"bf16": ("bf16",), "current": ("fp8", "current"), "rowwise": ("fp8", "rowwise")}.items()}
    assert act["rowwise"] == act["bf16"] > act["current"]
    sac = {k: r.to_json()["stages"][0]["memory"]["activations"] for k, r in runs.items()}
    assert sac["rowwise"] == sac["bf16"] == sac["tensorwise"]


def test_loader_accepts_rowwise_and_names_the_key_for_others():
    assert _scenario("fp8", "rowwise").training.fp8_recipe == "rowwise"
    with pytest.raises(ConfigError, match="training.fp8_recipe"):
        _scenario("fp8", "columnwise")
