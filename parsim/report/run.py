"""The report `parsim simulate --out DIR` writes: one scenario, one directory."""
from __future__ import annotations

import json
import os
from pathlib import Path

from parsim.report.gantt import plot_gantt
from parsim.results.result import Result, json_safe
from parsim.results.trace import write_trace
from parsim.units import fmt_bytes, fmt_seconds


def run_report_markdown(res: Result) -> str:
    mx = res.metrics
    sc = res.scenario
    T = mx["step_time_s"] or 1.0
    rows = "\n".join(f"| {k} | {fmt_seconds(v)} | {v / T:.1%} |" for k, v in mx["breakdown_s"].items())
    stage_rows = "\n".join(
        f"| {s['rank']} | {s['layers']} | {fmt_seconds(s['busy_s'])} | {s['bubble_fraction']:.4f} | "
        f"{fmt_bytes(s['peak_memory_bytes'])} | {fmt_bytes(s['memory']['params'])} | {fmt_bytes(s['memory']['grads'])} | "
        f"{fmt_bytes(s['memory']['optimizer'])} | {fmt_bytes(s['memory']['activations'])} | {fmt_bytes(s['memory']['other'])} |"
        for s in mx["stages"])
    fit = "yes" if mx["fits_in_memory"] else f"**no** — rank {mx['oom']['rank']} over by {fmt_bytes(mx['oom']['over_by_bytes'])}"
    return f"""# parsim prediction: {sc.name}

Scenario `{sc.file}` — {mx['model']} on {mx['world_size']} GPUs of `{mx['hardware']}`, schedule {mx['schedule']}
with {mx['n_microbatches']} microbatches of {mx['microbatch_size']} sequences; parallel {mx['parallel']}.

| metric | value |
|---|---|
| step time | {fmt_seconds(mx['step_time_s'])} |
| tokens/s | {mx['tokens_per_s']:,.0f} |
| TFLOP/s per GPU (model FLOPs) | {mx['tflops_per_gpu']:.1f} |
| MFU / HFU | {mx['mfu']:.1%} / {mx['hfu']:.1%} |
| bubble fraction | {mx['bubble_fraction']:.4f} |
| exposed communication | {fmt_seconds(mx['exposed_comm_s'])} |
| peak memory (worst rank) | {fmt_bytes(mx['peak_memory_bytes'])} of {fmt_bytes(mx['memory_capacity_bytes'])} usable |
| fits in memory | {fit} |

## Where the step time goes (mean pipeline rank)

| part | time | share |
|---|---|---|
{rows}

## Per pipeline rank

| rank | layers | busy | bubble | peak memory | params | grads | optimizer | activations | other |
|---|---|---|---|---|---|---|---|---|---|
{stage_rows}

## Pipeline

![Gantt chart of one step](gantt.png)

Files: `result.json` (the `--json` fields), `timeline.csv` (one row per executed action),
`trace.json` (open in https://ui.perfetto.dev).
"""


def write_run_report(res: Result, out: Path, atomic_write) -> None:
    out.mkdir(parents=True, exist_ok=True)

    def text(name, s):
        def w(tmp):
            with open(tmp, "w") as f:
                f.write(s)
        atomic_write(out / name, w)

    text("result.json", json.dumps(json_safe(res.metrics), indent=1))
    atomic_write(out / "timeline.csv", lambda tmp: res.timeline.to_csv(tmp, index=False))
    atomic_write(out / "trace.json", lambda tmp: write_trace(res.timeline, tmp))

    def png(tmp):
        plot_gantt(res.timeline, tmp + ".png", res.scenario.name)
        os.replace(tmp + ".png", tmp)
    atomic_write(out / "gantt.png", png)
    text("report.md", run_report_markdown(res))
