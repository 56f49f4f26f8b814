"""Sustained-load ground truth for one GPU: do kernels keep their microbenchmark speed under
a training-like load, and at what clock?

    python benchmarks/gpu_sustained.py --out DIR [--hardware dgx-h100] [--seconds 60]
    python benchmarks/gpu_sustained.py --out DIR --quick        # CPU smoke run (tiny sizes)

Why: parsim's Hopper and Blackwell rows were 20-45% faster than the published runs (before the profiles took the published MSMF/MAMF ratio; this script measures it on the machine it runs on)
(``reports/fidelity.md``, ``reports/fidelity-heldout.md``) while each kernel model holds to
its microbenchmark (MAMF, the OpenXLA GEMM table, the FlashAttention papers). Whatever real
training loses between the two -- a lower sustained clock under the power limit, a mix of
kernels that draws more power than a GEMM loop, cold caches -- has no measured number yet.
This script produces one, on the machine it runs on, in three phases written under ``--out``:

* ``gemm``: the MAMF shape of ``--hardware`` and two training shapes, each run back to back
  for ``--seconds``; TFLOP/s per second of wall time (``gemm.csv``), first second against the
  last half (the sustained ratio);
* ``layers``: a Llama-like stack of the validation runtime's own blocks (``parsim.validate.model``,
  bf16, SDPA attention) forward + backward for ``--seconds``; forward and backward per
  microbatch against parsim's prediction for the same stage on ``--hardware`` (``layers.csv``);
* clocks: ``nvidia-smi`` sampled every 100 ms through both phases (SM clock, power, temperature,
  throttle reasons: ``clocks.csv``), when there is one.

``summary.json`` holds the medians and ratios. Nothing here is fitted: the numbers are for a
profile key with a measured source (a sustained clock, a power-limited rate), to be read by a
person, with the run's machine and versions recorded beside them.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TRAINING_GEMMS = ((4096, 6144, 4096), (4096, 14336, 4096))
"""A Llama-3-8B-like QKV and MLP-up projection of one 4096-token microbatch (m x n x k)."""
LAYERS = {"n_layers": 4, "d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "d_ff": 14336, "vocab_size": 32768,
          "ffn": "swiglu", "position": "rope", "norm": "rmsnorm", "bias": False, "tied_embeddings": False}
"""The layer stack: Llama-3-8B's block shapes, four of them (a vocabulary small enough to leave
the blocks the larger share of the time)."""
QUICK_LAYERS = {**LAYERS, "n_layers": 2, "d_model": 128, "n_heads": 4, "n_kv_heads": 2, "d_ff": 256,
                "vocab_size": 512}


def _smi_sampler(path: Path):
    """Start ``nvidia-smi`` sampling to ``path`` (None when there is no nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    with path.open("w") as sink:  # the child keeps its own descriptor
        return subprocess.Popen([exe, f"--query-gpu={fields}", "--format=csv,nounits", "-lms", "100"],
                                stdout=sink, stderr=subprocess.DEVNULL)


def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def gemm_phase(device, dtype, shapes, seconds: float) -> list[dict]:
    """Each shape back to back for ``seconds``: one row per wall-clock second (TFLOP/s)."""
    import torch
    rows = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        flops = 2.0 * m * n * k
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < seconds:
            calls, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                for _ in range(10):
                    a @ b
                _sync(device)
                calls += 10
            dt = time.perf_counter() - t0
            rows.append({"shape": f"{m}x{n}x{k}", "t_s": round(time.perf_counter() - t_start, 3),
                         "tflops": calls * flops / dt / 1e12})
    return rows


def _spec(layers: dict, seq: int):
    from parsim.model import ModelSpec
    return ModelSpec(name="sustained-stack", max_seq_len=seq, **layers)


def predicted_passes(layers: dict, seq: int, hardware: str) -> dict:
    """parsim's forward and backward seconds of the whole stack, one microbatch, on ``hardware``."""
    from parsim.costs.model_costs import ModelCosts
    from parsim.scenario import scenario_from_dict
    from parsim.schedule.ir import Op
    doc = {"name": "sustained-stack", "hardware": hardware, "gpus": 1, "model": dict(layers, max_seq_len=seq),
           "training": {"global_batch": 1, "microbatch_size": 1, "seq_len": seq, "precision": "bf16",
                        "flash_attention": True, "recompute": "none"}}
    ops = ModelCosts.from_scenario(scenario_from_dict(doc, "gpu_sustained")).stage_ops(0)
    return {"forward_s": ops[Op.F].duration_s, "backward_s": ops[Op.B].duration_s}


def layers_phase(device, dtype, layers: dict, seq: int, seconds: float) -> list[dict]:
    """Forward + backward of the stack for ``seconds``; one row per microbatch."""
    import torch

    from parsim.validate.model import build_stages
    spec = _spec(layers, seq)
    stage = build_stages(spec, (spec.n_layers,), seq, True, dtype=dtype)[0].to(device)
    tokens = torch.randint(0, spec.vocab_size, (1, seq), device=device)
    targets = torch.randint(0, spec.vocab_size, (1, seq), device=device)
    rows, t_start = [], time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        _sync(device)
        t0 = time.perf_counter()
        loss = stage(tokens, targets)
        _sync(device)
        t1 = time.perf_counter()
        loss.backward()
        _sync(device)
        t2 = time.perf_counter()
        stage.zero_grad(set_to_none=True)
        rows.append({"t_s": round(t2 - t_start, 3), "forward_s": t1 - t0, "backward_s": t2 - t1})
    return rows


def _csv(path: Path, rows: list[dict]) -> None:
    if rows:
        pd.DataFrame(rows).to_csv(path, index=False)


def summarise(gemm: list[dict], layer_rows: list[dict], predicted: dict) -> dict:
    out: dict = {"gemm": {}}
    for shape in dict.fromkeys(r["shape"] for r in gemm):
        tf = [r["tflops"] for r in gemm if r["shape"] == shape]
        last = tf[len(tf) // 2:] or tf
        out["gemm"][shape] = {"first_s_tflops": tf[0], "sustained_tflops": statistics.median(last),
                              "sustained_over_first": statistics.median(last) / tf[0]}
    if layer_rows:
        warm = layer_rows[len(layer_rows) // 4:] or layer_rows
        f = statistics.median(r["forward_s"] for r in warm)
        b = statistics.median(r["backward_s"] for r in warm)
        out["layers"] = {"measured_forward_s": f, "measured_backward_s": b,
                         "predicted_forward_s": predicted["forward_s"], "predicted_backward_s": predicted["backward_s"],
                         "forward_error": predicted["forward_s"] / f - 1, "backward_error": predicted["backward_s"] / b - 1}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hardware", default="dgx-h100", help="profile whose MAMF shape and prediction to use")
    ap.add_argument("--seconds", type=float, default=60.0, help="seconds per GEMM shape and for the layer stack")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shapes, fp32, 1 s each")
    args = ap.parse_args(argv)
    import torch

    from parsim.cluster.hardware import load_profile
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not args.quick
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    kf = load_profile(args.hardware).device.kernels
    mamf = kf.mamf.get("bf16", (None, None))[1] if kf is not None else None
    if args.quick:
        shapes, layers, seq, seconds = ((64, 64, 64),), QUICK_LAYERS, 32, min(args.seconds, 1.0)
    else:
        shapes, layers, seq, seconds = ((mamf,) if mamf else ()) + TRAINING_GEMMS, LAYERS, args.seq, args.seconds
    smi = _smi_sampler(out / "clocks.csv")
    try:
        gemm = gemm_phase(device, dtype, shapes, seconds)
        layer_rows = layers_phase(device, dtype, layers, seq, seconds)
    finally:
        if smi is not None:  # stop sampling and let the last lines reach the file
            smi.terminate()
            smi.wait()
    _csv(out / "gemm.csv", gemm)
    _csv(out / "layers.csv", layer_rows)
    summary = summarise(gemm, layer_rows, predicted_passes(layers, seq, args.hardware))
    summary["machine"] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
                          "hardware_profile": args.hardware, "seconds": seconds, "seq": seq}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
