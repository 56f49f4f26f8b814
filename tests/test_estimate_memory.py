"""`parsim estimate-memory` against DeepSpeed's printed estimator tables for t5-3b
(tests/data/deepspeed_memory_t5_3b.json, from DeepSpeed's "Memory Requirements" page):
every ZeRO-2/ZeRO-3 x offload row, live and cold, to +-0.01 GiB (the tables print two
decimals). The live rows use t5-3b's own parameter count and largest module, computed
here from its config (T5Model: tied embedding, 24+24 blocks, relative-position bias in
the first block of each stack, weight-only layer norms)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from parsim.costs.zero_estimate import estimate_zero2, estimate_zero3

DATA = json.loads((ROOT / "tests" / "data" / "deepspeed_memory_t5_3b.json").read_text())
GIB = 2 ** 30
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def t5_counts(c: dict) -> tuple[int, int]:
    """(total params, largest module's own params) of T5Model from its config."""
    d, f, inner = c["d_model"], c["d_ff"], c["n_heads"] * c["d_kv"]
    attn = 4 * d * inner
    ffn = 2 * d * f
    encoder_block = attn + ffn + 2 * d                 # self-attn, FFN, two layer norms
    decoder_block = 2 * attn + ffn + 3 * d             # self-attn, cross-attn, FFN, three norms
    bias = c["relative_attention_num_buckets"] * c["n_heads"]
    embedding = c["vocab_size"] * d                    # shared by encoder, decoder (and tied head)
    total = (embedding + c["num_layers"] * encoder_block + c["num_decoder_layers"] * decoder_block
             + 2 * (bias + d))                         # a bias table and a final norm per stack
    largest = max(embedding, f * d, inner * d)
    return total, largest


def test_t5_3b_count_is_the_published_2851m():
    total, largest = t5_counts(DATA["live_model"])
    assert int(total / 1e6) == 2851 and int(largest / 1e6) == 32  # the tables' "2851M", "32M"


def _sizes(kind):
    if kind == "cold":
        return DATA["cold"]["params"], DATA["cold"]["largest_layer_params"]
    return t5_counts(DATA["live_model"])


@pytest.mark.parametrize("kind", ["live", "cold"])
def test_zero2_rows(kind):
    params, _ = _sizes(kind)
    for row in DATA["zero2"][kind]:
        r = estimate_zero2(params=params, gpus_per_node=DATA["gpus_per_node"], nodes=DATA["nodes"],
                           offload_optimizer=row["offload_optimizer"])
        assert r.per_gpu_bytes / GIB == pytest.approx(row["per_gpu_gib"], abs=0.01), row
        assert r.per_cpu_bytes / GIB == pytest.approx(row["per_cpu_gib"], abs=0.01), row
        # the table prints two decimals: the rounded value is the printed one
        assert f"{r.per_gpu_bytes / GIB:.2f}" == f"{row['per_gpu_gib']:.2f}"
        assert f"{r.per_cpu_bytes / GIB:.2f}" == f"{row['per_cpu_gib']:.2f}"


@pytest.mark.parametrize("kind", ["live", "cold"])
def test_zero3_rows(kind):
    params, layer = _sizes(kind)
    for row in DATA["zero3"][kind]:
        r = estimate_zero3(params=params, largest_layer_params=layer, gpus_per_node=DATA["gpus_per_node"],
                           nodes=DATA["nodes"], offload_optimizer=row["offload_optimizer"],
                           offload_param=row["offload_param"], zero_init=row["zero_init"])
        assert f"{r.per_gpu_bytes / GIB:.2f}" == f"{row['per_gpu_gib']:.2f}", row
        assert f"{r.per_cpu_bytes / GIB:.2f}" == f"{row['per_cpu_gib']:.2f}", row


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "parsim", "estimate-memory", *args], capture_output=True,
                          text=True, env=ENV, cwd=ROOT)


def test_cli_json_reproduces_a_cold_row():
    p = _cli("--params", "2851e6", "--largest-layer-params", "32e6", "--gpus-per-node", "8", "--nodes", "1",
             "--zero", "3", "--offload-optimizer", "cpu", "--offload-param", "none", "--zero-init", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["per_gpu_bytes"] / GIB == pytest.approx(0.78, abs=0.01)
    assert out["per_cpu_bytes"] / GIB == pytest.approx(63.72, abs=0.01)
    # closed form: 4 L + 2 P / N on the GPU; 16 P x 1.5 on the host
    assert out["per_gpu_bytes"] == 4 * 32_000_000 + int(2 * 2851e6 / 8)
    assert out["per_cpu_bytes"] == int(2851e6 * 16 * 1.5)


def test_cli_summary_prints_the_whole_table():
    p = _cli("--params", "2851M", "--gpus-per-node", "8", "--zero", "2")
    assert p.returncode == 0, p.stderr
    assert "127.45" in p.stdout and "15.93" in p.stdout and "5.31" in p.stdout


@pytest.mark.parametrize("args, key", [
    (["--params", "1e9", "--zero", "3"], "--largest-layer-params"),
    (["--params", "1e9", "--zero", "2", "--offload-param", "cpu"], "--offload-param"),
    (["--params", "1e9", "--largest-layer-params", "1e6", "--zero", "3", "--offload-param", "cpu"], "--offload-param"),
    (["--params", "lots", "--zero", "2"], "--params"),
    (["--params", "-5", "--zero", "2"], "--params"),
    (["--params", "1e6", "--largest-layer-params", "2e6", "--zero", "3"], "--largest-layer-params"),
])
def test_cli_bad_input_is_one_line(args, key):
    p = _cli(*args)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and key in p.stderr, p.stderr


def test_scenario_mode_puts_the_estimate_beside_the_full_count():
    p = _cli("--scenario", str(ROOT / "scenarios" / "zero-offload-10b-v100.toml"), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    ds, ps = out["deepspeed"], out["parsim"]
    assert ds["per_gpu_bytes"] == 2 * ds["params"]  # ZeRO-2 + CPU offload: the fp16 parameters
    # parsim's model states are exactly what the estimator counts; the rest is what it leaves out
    assert ps["model_states_bytes"] == pytest.approx(ds["per_gpu_bytes"])
    rest = ps["activations_bytes"] + ps["buffers_bytes"] + ps["fragmentation_bytes"] + ps["cuda_context_bytes"]
    assert out["left_out_bytes"] == pytest.approx(ps["model_states_bytes"] + rest - ds["per_gpu_bytes"])
    assert ps["activations_bytes"] > 0
    p = _cli("--scenario", str(ROOT / "scenarios" / "gpt3-175b-1f1b.toml"))
    assert p.returncode == 2 and "parallel.zero" in p.stderr and len(p.stderr.strip().splitlines()) == 1
