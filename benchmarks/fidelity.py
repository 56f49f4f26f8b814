"""Fidelity benchmark: predicted vs published TFLOP/s per GPU and iteration time.

    python benchmarks/fidelity.py [--markdown reports/fidelity.md] [--json]

Every throughput case of ``shared/reference/published.json`` becomes a scenario
(``scenario_for``), one hardware profile per GPU type (``dgx-a100-80g``, ``dgx-h100``),
the same rules for every row and no per-case factor. Printed: predicted and published
TFLOP/s per GPU (Megatron's FLOP formula, as the sources count), iteration time, the
per-case error and the mean absolute percentage error (MAPE) per family.

Rules (documented defaults; the sources do not give these):

* Megatron-LM 2021 Table 1 (A100): fp16, full recompute, no FlashAttention (2022; the
  s x s scores go through HBM, with dropout), microbatch size 1 (as in
  Megatron's example scripts), no ZeRO, no sequence parallelism (2022), gradient
  all-reduce after the backward (Megatron v2's local DDP does not overlap it). With
  pp > 1 the interleaved schedule (the paper's PTD-P) with the smallest vpp > 1 that
  divides the layers per pipeline rank; the scatter/gather p2p optimisation (each TP
  rank sends 1/tp of the activation on its own NIC) is what sequence-sharded p2p models.
* Megatron-Core r0.8.0 weak scaling (H100): bf16, microbatch 1, no recompute,
  distributed optimizer (ZeRO-1) with --overlap-grad-reduce --overlap-param-gather
  --tp-comm-overlap (sequence parallelism on when tp > 1), 1F1B.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.scenario import scenario_from_dict  # noqa: E402
from parsim.simulate import simulate  # noqa: E402

PUBLISHED = ROOT / "tests" / "data" / "published.json"  # a copy of ../shared/reference/published.json

A100_PRESETS = {"1.7B": "megatron-1.7b", "3.6B": "megatron-3.6b", "7.5B": "megatron-7.5b", "18B": "megatron-18b",
                "39B": "megatron-39b", "76B": "megatron-76b", "145B": "megatron-145b", "310B": "megatron-310b",
                "530B": "megatron-530b", "1T": "megatron-1t"}


def load_cases(path: Path = PUBLISHED) -> list[dict]:
    """The throughput cases of published.json (Megatron 2021 Table 1, Megatron-Core H100)."""
    data = json.loads(Path(path).read_text())
    return [c for c in data if c.get("kind") == "throughput" and "tp" in c.get("inputs", {})]


def _vpp(layers: int, pp: int) -> int:
    if pp == 1:
        return 1
    per_rank = layers // pp
    return next((v for v in range(2, per_rank + 1) if per_rank % v == 0), 1)


def scenario_for(case: dict) -> dict:
    """The scenario document (TOML as a dict) of one published case."""
    i, cid = case["inputs"], case["id"]
    tp, pp, dp = i["tp"], i["pp"], i["dp"]
    if cid.startswith("megatron21-"):
        size = cid.split("-")[-1]
        vpp = _vpp(i["layers"], pp)
        return {
            "name": cid, "hardware": "dgx-a100-80g", "gpus": i["gpus"],
            "model": {"preset": A100_PRESETS[size]},
            "training": {"global_batch": i["global_batch"], "microbatch_size": 1, "seq_len": i["seq_len"],
                         "precision": "fp16", "recompute": "full", "flash_attention": False},
            "parallel": {"dp": dp, "tp": tp, "pp": pp, "vpp": vpp, "zero": 0, "sequence_parallel": False},
            "schedule": {"name": "Interleaved1F1B" if vpp > 1 else "1F1B"},
            "overlap": {"grad_reduce": False, "param_gather": False, "tp_comm": False},
        }
    size = i["model"].split()[-1].lower()
    return {
        "name": cid, "hardware": "dgx-h100", "gpus": i["gpus"],
        "model": {"preset": f"mcore-gpt-{size}"},
        "training": {"global_batch": i["global_batch"], "microbatch_size": 1, "seq_len": i["seq_len"],
                     "precision": "bf16", "recompute": "none"},
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "zero": 1, "sequence_parallel": tp > 1},
        "schedule": {"name": "1F1B"},
        "overlap": {"grad_reduce": True, "param_gather": True, "tp_comm": True},
    }


def published_tflops(case: dict) -> float:
    e = case["expected"]
    return e.get("achieved_TFLOPs_per_GPU", e.get("TFLOPs_per_GPU"))


def run_case(case: dict, clock: float | None = None) -> dict:
    sc = scenario_from_dict(scenario_for(case), f"<fidelity:{case['id']}>")
    if clock is not None:  # --fit only: try a sustained clock fraction for this GPU type
        dev = replace(sc.hardware.device, sustained_fraction=clock)
        sc = replace(sc, hardware=replace(sc.hardware, device=dev))
    mx = simulate(sc).metrics
    pub = published_tflops(case)
    pred = mx["megatron_tflops_per_gpu"]
    pub_t = mx["step_time_s"] * pred / pub  # the published iteration time under the same FLOP count
    return {"id": case["id"], "family": "a100" if case["id"].startswith("megatron21") else "h100",
            "gpus": sc.gpus, "tp": sc.parallel.tp, "pp": sc.parallel.pp, "dp": sc.parallel.dp,
            "vpp": sc.parallel.vpp, "predicted_tflops": pred, "published_tflops": pub,
            "predicted_step_s": mx["step_time_s"], "published_step_s": pub_t,
            "error": pred / pub - 1.0, "exposed_comm_s": mx["exposed_comm_s"],
            "exposed_by_axis": mx["exposed_comm_by_axis_s"], "bubble": mx["bubble_fraction"]}


def fit_subset(rows_or_cases: list) -> list:
    """The rows the global fit sees: every other case of each family (1st, 3rd, ...)."""
    out = []
    for fam in ("megatron21", "megatron-core"):
        out += [c for c in rows_or_cases if c["id"].startswith(fam)][0::2]
    return out


def fit_clock(cases: list[dict]) -> float:
    """The sustained clock fraction minimising MAPE on ``cases`` (one GPU type)."""
    best = (float("inf"), 1.0)
    grid = [x / 100 for x in range(60, 101, 4)]
    for rnd in range(2):
        for f in grid:
            err = mape([run_case(c, f) for c in cases])
            best = min(best, (err, f))
        grid = [best[1] + d / 100 for d in range(-3, 4) if 0 < best[1] + d / 100 <= 1]
    return best[1]


def mape(rows: list[dict]) -> float:
    return 100.0 * sum(abs(r["error"]) for r in rows) / len(rows) if rows else 0.0


def table(rows: list[dict]) -> str:
    head = ("| case | GPUs | tp·pp·dp (vpp) | predicted TFLOP/s | published TFLOP/s | predicted step s "
            "| published step s | error | exposed comm s | bubble |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['id']} | {r['gpus']} | {r['tp']}·{r['pp']}·{r['dp']} ({r['vpp']}) | "
                     f"{r['predicted_tflops']:.1f} | {r['published_tflops']:.1f} | {r['predicted_step_s']:.2f} | "
                     f"{r['published_step_s']:.2f} | {100 * r['error']:+.1f}% | {r['exposed_comm_s']:.3f} | "
                     f"{r['bubble']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="write the table to this Markdown file")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fit", action="store_true",
                    help="fit device.sustained_fraction per GPU type on the fit subset and print it")
    args = ap.parse_args()
    if args.fit:
        sub = fit_subset(load_cases())
        for fam, prof in (("megatron21", "dgx-a100-80g"), ("megatron-core", "dgx-h100")):
            f = fit_clock([c for c in sub if c["id"].startswith(fam)])
            print(f"{prof}: sustained_fraction = {f:.2f}  (fit on {[c['id'] for c in sub if c['id'].startswith(fam)]})")
        return
    rows = [run_case(c) for c in load_cases()]
    a100 = [r for r in rows if r["family"] == "a100"]
    h100 = [r for r in rows if r["family"] == "h100"]
    fit_ids = {r["id"] for r in fit_subset(rows)}
    held = [r for r in rows if r["id"] not in fit_ids]
    summary = {"mape_a100_pct": mape(a100), "mape_h100_pct": mape(h100), "mape_all_pct": mape(rows),
               "mape_a100_heldout_pct": mape([r for r in held if r["family"] == "a100"]),
               "mape_h100_heldout_pct": mape([r for r in held if r["family"] == "h100"]),
               "fit_rows": sorted(fit_ids)}
    if args.json:
        print(json.dumps({"rows": rows, **summary}, indent=1))
    else:
        print(table(rows))
        print(f"\nMAPE: Megatron-LM 2021 A100 {summary['mape_a100_pct']:.1f}%  "
              f"Megatron-Core H100 {summary['mape_h100_pct']:.1f}%  all {summary['mape_all_pct']:.1f}%\n"
              f"held-out rows only (not used by --fit): A100 {summary['mape_a100_heldout_pct']:.1f}%  "
              f"H100 {summary['mape_h100_heldout_pct']:.1f}%")
    if args.markdown:
        Path(args.markdown).write_text(_report(rows, summary))


def _report(rows: list[dict], summary: dict) -> str:
    return ("# Fidelity: predicted vs published throughput\n\n"
            "Generated by `python benchmarks/fidelity.py --markdown reports/fidelity.md`.\n\n"
            + (__doc__.split("Rules", 1)[1].join(["Rules", ""]) if "Rules" in __doc__ else "") + "\n\n"
            + table(rows) + "\n\n"
            f"MAPE: Megatron-LM 2021 Table 1 (A100) **{summary['mape_a100_pct']:.1f}%**, "
            f"Megatron-Core weak scaling (H100) **{summary['mape_h100_pct']:.1f}%**, "
            f"all rows {summary['mape_all_pct']:.1f}%.\n\n"
            "One global number per GPU type was fitted: `device.sustained_fraction` (0.82 for "
            "dgx-a100-80g, 0.67 for dgx-h100), by `python benchmarks/fidelity.py --fit` on every "
            f"other row of each family ({', '.join(summary['fit_rows'])}). On the held-out rows "
            f"the MAPE is {summary['mape_a100_heldout_pct']:.1f}% (A100) and "
            f"{summary['mape_h100_heldout_pct']:.1f}% (H100). The remaining trend -- small A100 "
            "models predicted ~10% slow, the largest H100 models ~13% slow -- is physics the "
            "model does not have yet (microbatch sizes the sources do not give; interleaving "
            "on H100), not tuned away.\n")


if __name__ == "__main__":
    main()
