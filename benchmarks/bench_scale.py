"""Scale benchmark (reported numbers, not timed tests).

    python benchmarks/bench_scale.py

1. Default (fast) mode: one simulated step of Llama-3-405B on 16,384 H100
   (TP8 PP16 DP128, seq 8192, global batch 2048, 1F1B): wall time on one core.
2. Full-fidelity mode (``[simulation] mode = "full"``): every rank of a 1,024-GPU job
   (GPT-3 175B, TP8 PP8 DP16, 1F1B, 96 microbatches) with all p2p and DP traffic as flows
   on the shared network (max-min fair): wall time, and the step time next to fast mode.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim import load_scenario  # noqa: E402
from parsim.config.scenario import SimulationConfig  # noqa: E402
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate  # noqa: E402

LLAMA_16K = {
    "name": "llama3-405b-16k", "hardware": "dgx-h100", "gpus": 16384,
    "model": {"preset": "llama3-405b"},
    "training": {"global_batch": 2048, "seq_len": 8192, "microbatch_size": 1, "recompute": "selective"},
    "parallel": {"dp": 128, "tp": 8, "pp": 16, "zero": 1, "sequence_parallel": True},
    "schedule": {"name": "1F1B"},
}


def timed(sc) -> tuple[float, dict]:
    t0 = time.perf_counter()
    mx = simulate(sc).metrics
    return time.perf_counter() - t0, mx


def main() -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    sc = scenario_from_dict(LLAMA_16K, "<bench_scale>")
    wall, mx = min((timed(sc) for _ in range(3)), key=lambda x: x[0])
    print(f"fast  llama3-405b 16,384 H100 TP8 PP16 DP128: {wall:.2f} s wall  "
          f"(step {mx['step_time_s']:.2f} s, MFU {mx['mfu']:.3f})")
    g = load_scenario(ROOT / "scenarios" / "gpt3-175b-1f1b.toml")
    wall_fast, fast = timed(g)
    wall_full, full = timed(replace(g, simulation=SimulationConfig("full")))
    print(f"fast  gpt3-175b 1,024 A100 TP8 PP8 DP16:      {wall_fast:.2f} s wall  (step {fast['step_time_s']:.3f} s)")
    print(f"full  gpt3-175b 1,024 A100, every rank, flows: {wall_full:.2f} s wall  (step {full['step_time_s']:.3f} s, "
          f"exposed dp {full['exposed_comm_by_axis_s']['dp']:.3f} s vs fast {fast['exposed_comm_by_axis_s']['dp']:.3f} s)")


if __name__ == "__main__":
    main()
