"""The report `parsim simulate --out DIR` writes: one scenario, one directory."""
from __future__ import annotations

import json
import os
from pathlib import Path

from parsim.report.context import context_line, uncertainty_line
from parsim.report.gantt import plot_gantt
from parsim.results.result import Result, json_safe
from parsim.results.summary import (
    budget_line,
    fmt_b,
    fmt_n,
    fmt_s,
    parallel_text,
    pct,
    sig3,
    table,
)
from parsim.results.trace import write_memory_timeline, write_trace


def run_report_markdown(res: Result, version: str | None = None) -> str:
    mx = res.metrics
    sc = res.scenario
    T = mx["step_time_s"] or 1.0
    parts = table([[k, fmt_s(v), pct(v / T)] for k, v in mx["breakdown_s"].items()], ["part", "time", "share of step"],
                  markdown=True)
    ranks = table([[s["rank"], s["layers"], fmt_s(s["busy_s"]), pct(s["bubble_fraction"]), pct(s["idle_fraction"]),
                    *(fmt_b(v) for v in (s["peak_memory_bytes"], *(s["memory"][k] for k in
                                                                     ("params", "grads", "optimizer", "activations", "other"))))]
                   for s in mx["stages"]],
                  ["rank", "layers", "busy", "pipeline bubble", "idle", "peak memory", "params", "grads", "optimizer",
                   "activations", "other"], markdown=True, align=["right"] * 11)
    fit = "yes" if mx["fits_in_memory"] else f"**no**: rank {mx['oom']['rank']} over by {fmt_b(mx['oom']['over_by_bytes'])}"
    rows = [
        ["step time", fmt_s(mx["step_time_s"])],
        ["throughput", f"{fmt_n(mx['tokens_per_s'])} tokens/s"],
        ["TFLOP/s per GPU (model FLOPs)", sig3(mx["tflops_per_gpu"])],
        ["MFU / HFU", f"{pct(mx['mfu'])} / {pct(mx['hfu'])}"],
        ["pipeline bubble (bubble_fraction)", pct(mx["bubble_fraction"])],
        ["idle: bubble + exposed dp comm (idle_fraction)", pct(mx["idle_fraction"])],
        ["exposed communication", fmt_s(mx["exposed_comm_s"])],
        ["peak memory (worst rank)", f"{fmt_b(mx['peak_memory_bytes'])} of {fmt_b(mx['memory_capacity_bytes'])} usable"],
        ["fits in memory", fit],
    ]
    if "step_time_p50_s" in mx:  # --samples: the 90% band (parsim.uncertainty.band)
        rows.insert(1, ["step time 90% band (P5 .. P95, P50)", f"{fmt_s(mx['step_time_p5_s'])} .. "
                        f"{fmt_s(mx['step_time_p95_s'])}, {fmt_s(mx['step_time_p50_s'])} ({mx['samples']} samples)"])
    if "pace_setter" in mx:  # [stragglers]
        ps = mx["pace_setter"]
        rows.append(["pace set by", f"pipeline rank {ps['rank']} of replica {ps['replica']} (slowdown {sig3(ps['slowdown'])})"])
    if "time_to_train_s" in mx:
        rows.append(["time to train", budget_line(mx).split("time to train", 1)[1].strip()])
    return f"""# parsim prediction: {sc.name}

{context_line(mx, version)}.

Scenario `{sc.file}`: schedule {mx['schedule']} with {mx['n_microbatches']} microbatches of
{mx['microbatch_size']} sequences; {parallel_text(mx['parallel'])}; recompute {mx['recompute']}.

{uncertainty_line()}

{table(rows, ["metric", "value"], markdown=True, align=["left", "right"])}

## Where the step time goes (mean pipeline rank)

{parts}

## Per pipeline rank

{ranks}

## Pipeline

![Gantt chart of one step](gantt.png)

Files: `result.json` (the `--json` fields), `timeline.csv` (one row per executed action),
`memory.csv` (bytes allocated per rank over the step), `trace.json` (open in
https://ui.perfetto.dev; memory as counter tracks).
"""


def write_run_report(res: Result, out: Path, atomic_write, version: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)

    def text(name, s):
        def w(tmp):
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(s)
        atomic_write(out / name, w)

    text("result.json", json.dumps(json_safe(res.metrics), indent=1))
    atomic_write(out / "timeline.csv", lambda tmp: res.timeline.to_csv(tmp, index=False))
    atomic_write(out / "memory.csv", lambda tmp: write_memory_timeline(res, tmp))
    atomic_write(out / "trace.json", lambda tmp: write_trace(res, tmp))

    def png(tmp):
        plot_gantt(res.timeline, tmp + ".png", res.scenario.name)
        os.replace(tmp + ".png", tmp)
    atomic_write(out / "gantt.png", png)
    text("report.md", run_report_markdown(res, version))
