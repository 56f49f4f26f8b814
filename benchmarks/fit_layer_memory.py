"""Fit of the A100's ``layer_memory_efficiency`` on Korthikanti et al. 2022, Table 4.

    python benchmarks/fit_layer_memory.py [--markdown reports/fit-layer-memory.md]

The quantity: the fraction of HBM bandwidth the transformer block's memory-bound kernels reach
(``Device.layer_memory_efficiency``: layer norms, bias-GeLU, bias-dropout-add, the unfused
attention's fused scale-mask-softmax and dropout over the s x s scores, the loss), over the bytes
``parsim.costs`` counts for them. A plain copy reaches more (``memory_efficiency``, 0.85 on an
A100); kernels that reduce rows or draw random numbers reach less, and no microbenchmark of the
2021-22 kernels (apex's layer norm, Megatron's fused softmax, PyTorch's fused dropout) on an
A100 is published.

The data: Table 4 of the paper times one transformer layer of its 22B model (hidden 6144, 64
heads, sequence 2048, microbatch 4, tensor parallelism 8; Megatron-LM of 2022, fp16, on a DGX
A100 80GB) forward and backward under five settings -- no recomputation, sequence parallelism,
full recomputation, selective recomputation, selective with sequence parallelism: ten times
(``benchmarks/data/korthikanti_table4.json``). The five settings mix GEMMs, the scores' traffic,
the norms and dropouts (on 1/8 of the tokens under sequence parallelism) and the tensor-parallel
collectives in different proportions, so one bandwidth fraction has to hold for all ten.

The fit: the value that minimises the squared log errors of the ten per-layer times (the
model's times fall monotonically as the fraction rises: a golden-section search). Everything
else in the profile stays as it is (GEMMs at the MAMF-calibrated kernel model, collectives at
NCCL's measured lines). Held out of the fit, reported beside: the end-to-end iteration times of
the same paper's Table 5 (eight cells, 22B to 1T) and of Megatron-LM's 2021 Table 1 (ten rows,
1.7B to 1T, the 2021 code), both through ``benchmarks/fidelity.py``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from parsim.costs.inputs import cost_inputs, layer_inputs  # noqa: E402
from parsim.costs.stage import StageShape, stage_cost  # noqa: E402
from parsim.scenario import scenario_from_dict  # noqa: E402
from parsim.schedule.ir import Op  # noqa: E402

TABLE_4 = ROOT / "benchmarks" / "data" / "korthikanti_table4.json"
PROFILE = "dgx-a100-80g"


def load_table() -> dict:
    return json.loads(TABLE_4.read_text())


def _scenario(row: dict, table: dict):
    """The scenario of one Table 4 row: the 22B of Table 5 (``fidelity.classic_scenario``) in the
    row's recompute and sequence-parallel setting."""
    import fidelity

    case = next(c for c in fidelity.load_classic() if c["id"].endswith("-22B"))
    m = table["model"]
    i = case["inputs"]
    assert (i["hidden"], i["heads"], i["seq_len"], i["microbatch"], i["tp"]) == (
        m["hidden"], m["heads"], m["seq_len"], m["microbatch"], m["tp"]), "Table 4 is Table 5's 22B"
    doc = fidelity.classic_scenario(case, "full_recompute_s")
    doc["training"]["recompute"] = row["recompute"]
    doc["parallel"]["sequence_parallel"] = row["sequence_parallel"]
    return scenario_from_dict(doc, f"<table4:{row['experiment']}>")


def block_seconds(sc) -> tuple[float, float]:
    """(forward, backward) seconds of one block of scenario ``sc`` on a middle pipeline stage (no
    embedding, no head): B includes the recomputation."""
    cost = stage_cost(layer_inputs(cost_inputs(sc)), StageShape(kinds=(False,), first=False, last=False,
                                                                head_copy=False))
    return cost.parts[Op.F].total, cost.parts[Op.B].total


def layer_times(row: dict, table: dict, efficiency: float | None) -> tuple[float, float]:
    """(forward, backward) seconds of one block of the row's setting, the profile's
    ``layer_memory_efficiency`` replaced by ``efficiency`` (None: as the profile states it):
    :func:`block_seconds`."""
    sc = _scenario(row, table)
    if efficiency is not None:
        dev = dataclasses.replace(sc.hardware.device, layer_memory_efficiency=efficiency)
        sc = dataclasses.replace(sc, hardware=dataclasses.replace(sc.hardware, device=dev))
    return block_seconds(sc)


def residuals(table: dict, efficiency: float | None) -> list[tuple[str, str, float, float]]:
    """(experiment, pass, predicted s, published s) for the ten times."""
    out = []
    for row in table["rows"]:
        f, b = layer_times(row, table, efficiency)
        out += [(row["experiment"], "forward", f, row["forward_ms"] / 1e3),
                (row["experiment"], "backward", b, row["backward_ms"] / 1e3)]
    return out


def loss(table: dict, efficiency: float) -> float:
    return sum(math.log(p / m) ** 2 for _, _, p, m in residuals(table, efficiency))


def fit(table: dict, lo: float = 0.4, hi: float = 1.0, tol: float = 1e-4) -> float:
    """The fraction minimising :func:`loss` (golden-section search on [lo, hi])."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(table, c), loss(table, d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(table, c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(table, d)
    return (a + b) / 2


TE_H100 = ROOT / "benchmarks" / "data" / "te_getting_started_h100.json"


def hopper_layers(precision: str = "bf16") -> list[tuple[str, float, float]]:
    """(implementation, predicted s, measured s) of Transformer Engine's getting-started layer on an
    H100 (``benchmarks/data/te_getting_started_h100.json``), its rows at ``precision``, through
    ``dgx-h100`` as it stands (no ``layer_memory_efficiency``: the copy rate). The BF16 rows are the same
    quantity's check on Hopper: the eager layer's scores pass through HBM as the A100's do, at 2026's
    kernels. The FP8 rows (``precision = "fp8"``: TE's DelayedScaling, the "Fused" and TransformerLayer
    rows with fused norms and activations) are recorded beside them, not checked."""
    data = json.loads(TE_H100.read_text())
    L = data["layer"]
    out = []
    for row in data["rows"]:
        if row["precision"] != precision:
            continue
        eager = row["attention"] == "eager"
        fused = precision == "fp8" and row["implementation"] != "TE Unfused + TE Attention + FP8"
        doc = {"name": "te-getting-started", "hardware": "dgx-h100", "gpus": 1,
               "model": {"name": "te-getting-started", "n_layers": 1, "d_model": L["hidden"], "n_heads": L["heads"],
                         "n_kv_heads": L["heads"], "vocab_size": 32000, "d_ff": L["ffn"], "ffn": "gelu",
                         "norm": "layernorm", "bias": True, "position": "none", "max_seq_len": L["seq_len"]},
               "training": {"global_batch": L["microbatch"], "microbatch_size": L["microbatch"],
                            "seq_len": L["seq_len"], "precision": precision, "recompute": "none",
                            **({"fp8_recipe": "delayed"} if precision == "fp8" else {}),
                            "dropout": L["dropout"] > 0, "fused_kernels": fused,  # else torch GeLU, Dropout, adds
                            **({"flash_attention": False} if eager else {"attention_kernel": "cudnn"})},
               "parallel": {"dp": 1, "tp": 1, "pp": 1}}
        f, b = block_seconds(scenario_from_dict(doc, f"<te:{row['implementation']}>"))
        out.append((row["implementation"], f + b, row["time_ms"] / 1e3))
    return out


def _mape(errors: list[float]) -> float:
    return 100 * sum(abs(e) for e in errors) / len(errors)


def held_out() -> dict:
    """MAPE of Table 1 (A100 rows of ``fidelity.py``) and Table 5 with the profile as it stands."""
    import fidelity

    rows = [fidelity.run_case(c) for c in fidelity.load_cases() if c["id"].startswith("megatron21-")]
    classic = [r for c in fidelity.load_classic() for r in fidelity.run_classic(c)]
    return {"table1_mape_pct": _mape([r["error"] for r in rows]),
            "table1_errors_pct": {r["id"]: 100 * r["error"] for r in rows},
            "table5_mape_pct": _mape([r["error"] for r in classic]),
            "table5_errors_pct": {f"{r['id']} {r['mode']}": 100 * r["error"] for r in classic}}


def report(table: dict, fitted: float, stated: float | None) -> str:
    lines = ["# `layer_memory_efficiency` of dgx-a100-80g: fit on Korthikanti et al. Table 4", "",
             "Generated by `python benchmarks/fit_layer_memory.py --markdown reports/fit-layer-memory.md`.", "",
             f"Fitted fraction of HBM bandwidth: **{fitted:.3f}** (the profile states {stated}); "
             "a plain copy's `memory_efficiency` stays 0.85.", "",
             "| experiment | pass | published ms | parsim ms, copy rate (0.85) | error | parsim ms, fitted | error |",
             "|---|---|---|---|---|---|---|"]
    before = residuals(table, 0.85)
    after = residuals(table, fitted)
    for (e, ps, p0, m), (_, _, p1, _) in zip(before, after):
        lines.append(f"| {e} | {ps} | {1e3 * m:.1f} | {1e3 * p0:.2f} | {100 * (m / p0 - 1):+.1f}% | "
                     f"{1e3 * p1:.2f} | {100 * (m / p1 - 1):+.1f}% |")
    lines += ["", "Error = published / predicted - 1 (+: parsim too fast), as in `reports/fidelity.md`.", "",
              "## The same quantity on Hopper: no fit", "",
              "`dgx-h100` states no `layer_memory_efficiency`: its layer kernels run at the copy rate "
              "(`memory_efficiency` 0.9). Transformer Engine's getting-started layer, timed on an H100 "
              "(2026 kernels; `benchmarks/data/te_getting_started_h100.json`), says so: the eager layer "
              "sends its s x s scores through HBM as the A100's 2022 layer does, and lands within 2% there.", "",
              "| implementation | measured ms | parsim ms | error |", "|---|---|---|---|"]
    for name, p, m in hopper_layers():
        lines.append(f"| {name} | {1e3 * m:.2f} | {1e3 * p:.2f} | {100 * (m / p - 1):+.1f}% |")
    lines += ["", "The same page's FP8 rows, recorded (not checked; nothing fitted to them): parsim runs TE's FP8 "
              "layer 8-13% slow -- its FP8 GEMMs at the BF16 sustained clock, which the H200's single FP8 GEMMs "
              "(reports/gpu/h200) also beat; no FP8 sustained-clock measurement exists to set it, and the held-out "
              "Hopper FP8 training rows are on average slightly fast, not slow.", "",
              "| implementation | measured ms | parsim ms | error |", "|---|---|---|---|"]
    for name, p, m in hopper_layers("fp8"):
        lines.append(f"| {name} | {1e3 * m:.2f} | {1e3 * p:.2f} | {100 * (m / p - 1):+.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="write the fit and its residuals to this Markdown file")
    args = ap.parse_args()
    table = load_table()
    fitted = fit(table)
    stated = _scenario(table["rows"][0], table).hardware.device.layer_memory_efficiency
    print(f"fitted layer_memory_efficiency = {fitted:.4f} (profile: {stated})")
    for e, ps, p, m in residuals(table, None):
        print(f"  {e:24s} {ps:8s} published {1e3 * m:5.1f} ms  parsim {1e3 * p:6.2f} ms  {100 * (m / p - 1):+5.1f}%")
    for name, p, m in hopper_layers():
        print(f"  H100 (no fit) {name:28s} measured {1e3 * m:6.2f} ms  parsim {1e3 * p:6.2f} ms  {100 * (m / p - 1):+5.1f}%")
    ho = held_out()
    print(f"held out (profile as stated): Table 1 MAPE {ho['table1_mape_pct']:.1f}%, "
          f"Table 5 MAPE {ho['table5_mape_pct']:.1f}%")
    if args.markdown:
        text = report(table, fitted, stated)
        text += (f"\nHeld out of the fit, with the profile as it stands: Megatron-LM 2021 Table 1 "
                 f"(ten A100 rows) MAPE {ho['table1_mape_pct']:.1f}%, Korthikanti Table 5 (eight cells) "
                 f"MAPE {ho['table5_mape_pct']:.1f}% (`python benchmarks/fidelity.py`).\n")
        Path(args.markdown).write_text(text)


if __name__ == "__main__":
    main()
