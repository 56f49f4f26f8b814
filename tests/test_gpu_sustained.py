"""The sustained-load GPU script (benchmarks/gpu_sustained.py) runs end to end: a CPU smoke run
writes its tables and a summary whose prediction is parsim's for the same stack."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_writes_its_tables_and_compares_with_parsim(tmp_path):
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_sustained

    assert gpu_sustained.main(["--out", str(tmp_path), "--quick", "--seconds", "0.3"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / "gemm.csv").read_text().startswith("shape,t_s,tflops")
    assert (tmp_path / "layers.csv").read_text().startswith("t_s,forward_s,backward_s")
    lay = summary["layers"]
    want = gpu_sustained.predicted_passes(gpu_sustained.QUICK_LAYERS, 32, "dgx-h100")
    assert lay["predicted_forward_s"] == pytest.approx(want["forward_s"])
    assert lay["forward_error"] == pytest.approx(lay["predicted_forward_s"] / lay["measured_forward_s"] - 1)
    assert lay["measured_backward_s"] > 0 and summary["machine"]["device"] == "cpu"


def test_prediction_of_the_full_stack_is_a_real_b200_h100_ratio():
    """The full-size stack's prediction goes through the kernel models: B200 is faster per pass
    than H100 by less than its 2.27x dense-bf16 peak ratio (2250 / 989.4 TFLOP/s), more than 1x."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_sustained

    h = gpu_sustained.predicted_passes(gpu_sustained.LAYERS, 4096, "dgx-h100")
    b = gpu_sustained.predicted_passes(gpu_sustained.LAYERS, 4096, "dgx-b200")
    assert 1.0 < h["forward_s"] / b["forward_s"] < 2250 / 989.4
    assert 1.0 < h["backward_s"] / b["backward_s"] < 2250 / 989.4
