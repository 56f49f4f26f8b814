"""MoE fidelity: parsim's predictions for the MoE scenarios against published figures.

    python benchmarks/fidelity_moe.py [--out reports/fidelity-moe.md]

Each case names the published figure, its source, the metric compared and how loose the
comparison is (what the source leaves unsaid). Signed error = (predicted - published) /
published. Not a test: the numbers move as the cost model improves.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim import load_scenario, simulate  # noqa: E402

CASES = [
    {
        "scenario": "mixtral-8x7b-h100",
        "metric": "tflops_per_gpu",
        "published": 468.0,
        "source": "Megatron-LM megatron/core/transformer/moe/README.md (MCore v0.9): "
                  "\"468 TFLOPS for Mixtral 8X7B bf16 training\" on H100",
        "looseness": "loose: the README gives neither the GPU count nor the parallel layout; "
                     "the scenario uses Megatron's Mixtral example layout (TP1 PP4 EP8) on 64 H100",
    },
    {
        "scenario": "qwen3-235b-h100",
        "metric": "step_time_s",
        "published": 19.7,
        "source": "NVIDIA Megatron-MoE-ModelZoo best_practice/Qwen3/readme.md, 256 H100, "
                  "TP2 EP32 ETP1 PP8 VPP4 DP16, GBS 2048, seq 4096, DeepEP: 19.7 s/step, 245 TFLOP/s/GPU",
        "looseness": "close configuration, but parsim runs plain 1F1B (their VPP4 custom layout "
                     "does not split 94 layers evenly here) and models the A2A dispatcher, not DeepEP",
    },
    {
        "scenario": "qwen3-235b-h100",
        "metric": "tflops_per_gpu",
        "published": 245.0,
        "source": "same row as above",
        "looseness": "FLOP conventions differ (parsim counts the full s^2 attention, Megatron's "
                     "MoE counter may not); prefer the step-time row",
    },
    {
        "scenario": "deepseek-v3-h800",
        "metric": "tokens_per_s_per_gpu",
        "published": 1e12 / (180e3 * 3600),
        "source": "DeepSeek-V3 technical report (arXiv:2412.19437) Sec. 1 / Table 1: "
                  "180K H800 GPU-hours per trillion tokens (2.664M for 14.8T pre-training tokens)",
        "looseness": "loose: a whole-run average (batch-size ramp, MTP module, evaluation and "
                     "checkpoint overheads included) against one steady-state step; parsim runs 1F1B "
                     "on DualPipeV with all-to-all overlap stated and full recompute, FP8 GEMMs at the "
                     "profile's GEMM efficiency, no node-limited routing",
    },
    {
        "scenario": "glam-64e-h100",
        "metric": "tflops_per_gpu",
        "published": None,
        "source": "none: GLaM was trained on 1,024 TPU-v4 chips (Du et al. 2022); no GPU figure is published",
        "looseness": "prediction only",
    },
]


NOTES = """
## Reading these numbers

- The two Megatron-Core H100 figures (Mixtral 8x7B TFLOP/s, Qwen3-235B step time) are the
  tightest comparisons; the Qwen3 TFLOP/s row differs more because FLOP conventions differ.
- DeepSeek-V3 is predicted ~1.8x as fast as the report's whole-run average. The scenario runs
  DualPipeV with full recompute: with "selective", its busiest pipeline rank needs ~160 GiB
  under parsim's activation model. Both point at what parsim does not model yet: DeepSeek's
  fine-grained recomputation (norms, MLA up-projections, SwiGLU) and FP8 activation caching
  (memory), FP8 GEMMs with fine-grained scaling running well under the dense FP8 peak, and
  node-limited routing. A whole-run GPU-hour average also
  carries overheads (batch-size ramp, the MTP module, checkpoints) no step simulation sees.
  Treat that row as an order-of-magnitude check, not a calibration target.
- The GLaM-style job has no published GPU figure; it shows imbalance as an input (Zipf
  routing: the busiest expert-parallel rank gets more than twice the mean, and the overflow
  beyond capacity is dropped).
"""


def metric(mx: dict, name: str) -> float:
    if name == "tokens_per_s_per_gpu":
        return mx["tokens_per_s"] / mx["world_size"]
    return float(mx[name])


def run() -> list[dict]:
    cache: dict[str, dict] = {}
    rows = []
    for case in CASES:
        name = case["scenario"]
        if name not in cache:
            cache[name] = simulate(load_scenario(ROOT / "scenarios" / f"{name}.toml")).metrics
        mx = cache[name]
        pred = metric(mx, case["metric"])
        pub = case["published"]
        err = None if pub is None else (pred - pub) / pub
        rows.append({**case, "predicted": pred, "error": err, "fits": mx["fits_in_memory"],
                     "ep_comm_s": mx["breakdown_s"]["ep_comm"], "step_time_s": mx["step_time_s"],
                     "imbalance": mx["moe"]["imbalance"], "dropped": mx["moe"]["dropped_fraction"]})
    return rows


def markdown(rows: list[dict]) -> str:
    out = ["# MoE fidelity (generated by benchmarks/fidelity_moe.py)", "",
           "Signed error = (predicted - published) / published.", "",
           "| scenario | metric | published | predicted | error | fits | exposed EP comm / step | imbalance | dropped |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pub = "—" if r["published"] is None else f"{r['published']:.4g}"
        err = "—" if r["error"] is None else f"{r['error']:+.1%}"
        out.append(f"| {r['scenario']} | {r['metric']} | {pub} | {r['predicted']:.4g} | {err} | "
                   f"{'yes' if r['fits'] else 'no'} | {r['ep_comm_s']:.3f} s of {r['step_time_s']:.2f} s | "
                   f"{r['imbalance']:.2f} | {r['dropped']:.1%} |")
    out += ["", "## Sources and how loose each comparison is", ""]
    for r in rows:
        out.append(f"- **{r['scenario']} / {r['metric']}** — {r['source']}. {r['looseness']}.")
    return "\n".join(out) + "\n" + NOTES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", help="write the Markdown table here")
    args = ap.parse_args()
    md = markdown(run())
    print(md)
    if args.out:
        Path(args.out).write_text(md)


if __name__ == "__main__":
    main()
