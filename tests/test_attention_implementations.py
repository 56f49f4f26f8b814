"""Attention implementations a framework may call on Hopper (``training.attention_kernel``):
FlashAttention-2 and cuDNN fitted to the FlashAttention-3 paper's H100 bars (Fig. 5, 6;
tests/data/fa3_paper_h100_attention.json), refused where no bars exist."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from parsim.cluster import attention_kernels as A
from parsim.cluster.hardware import load_profile
from parsim.scenario import load_scenario
from parsim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
DATA = json.loads((ROOT / "tests" / "data" / "fa3_paper_h100_attention.json").read_text())
H100 = load_profile("dgx-h100").device.burst()


def _bars(impl, head_dims):
    for b in DATA["bars"]:
        if impl in b and b["head_dim"] in head_dims:
            for s, v in zip(DATA["seq"], b[impl]):
                if v is not None:
                    yield b["pass"] == "backward", b["head_dim"], b["causal"], s, v


def _tflops(impl, backward, hd, causal, s):
    heads, batch = 2048 // hd, 16384 // s
    t = H100.attention_kernel_time(batch, s, s, heads, heads, hd, causal, backward, "bf16", impl)
    return A.attention_flops(batch, s, s, heads, hd, causal, backward) / t / 1e12


@pytest.mark.parametrize("impl, tol", [("fa2", 0.08), ("cudnn", 0.10), ("fa3", 0.08)])
def test_fitted_bars(impl, tol):
    errs = [_tflops(impl, *bar[:4]) / bar[4] - 1 for bar in _bars(impl, (64, 128))]
    assert len(errs) >= 27
    assert max(map(abs, errs)) < tol, max(errs, key=abs)


def test_implementations_rank_as_the_paper_at_long_sequences():
    # head dim 128, causal, 16k: FA3 616 > cuDNN 539 > FA2 335 (Fig. 5), forward and backward
    for backward in (False, True):
        fa2, cudnn, fa3 = (_tflops(i, backward, 128, False, 16384) for i in ("fa2", "cudnn", "fa3"))
        assert fa3 > cudnn > 1.4 * fa2


def test_unmodelled_pairs_are_refused():
    a100 = load_profile("dgx-a100-80g").device.burst()
    with pytest.raises(ValueError, match="no model"):
        a100.attention_kernel_time(1, 4096, 4096, 32, 32, 128, True, False, "bf16", "cudnn")
    assert A.resolve("fa2", "warp") == "fa2" and A.resolve("fa2", "warpgroup") == "fa2-hopper"
    assert A.resolve("fa3", "tile") is None and A.resolve("fa4", "warpgroup") is None


def test_scenario_key_changes_the_step_by_the_attention_time():
    base = simulate(load_scenario(ROOT / "scenarios" / "llama3-70b-h100.toml", [])).metrics
    fa2 = simulate(load_scenario(ROOT / "scenarios" / "llama3-70b-h100.toml",
                                 ["training.attention_kernel=fa2"])).metrics
    assert fa2["step_time_s"] > base["step_time_s"]  # the device default is FA3


def test_bad_attention_kernel_is_one_line_exit_2():
    r = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/gpt3-175b-1f1b.toml",
                        "--set", "training.attention_kernel=cudnn"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "training.attention_kernel" in r.stderr
