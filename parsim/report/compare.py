"""Comparison reports: ``parsim compare`` -> DIR/report.html (self-contained) and DIR/report.md.

Figures (matplotlib, every one with a title, axis labels with units and a legend):

* the pipeline Gantt of each scenario (parsim.sim.trace.gantt);
* memory per pipeline rank as stacked bars (params, grads, optimizer, activations,
  other) against the device's usable capacity;
* the step-time breakdown of each scenario (compute, recompute, exposed communication
  per axis, optimizer, bubble) as stacked bars;
* a scaling chart (step time and throughput per GPU against the swept value) when a
  dimension is swept.

The HTML embeds the figures as base64 PNGs (nothing else to ship); the Markdown links
the same PNGs written beside it.
"""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path

from parsim.results.result import MEMORY_KINDS, Result
from parsim.units import fmt_bytes, fmt_seconds

BREAKDOWN = (("compute", "compute", "#4C72B0"), ("recompute", "recompute", "#8172B3"),
             ("tp_comm", "TP comm (exposed)", "#CCB974"), ("cp_comm", "CP comm (exposed)", "#64B5CD"),
             ("ep_comm", "EP comm (exposed)", "#DA8BC3"), ("dp_comm", "DP comm (exposed)", "#937860"),
             ("pp_comm", "PP comm (exposed)", "#C44E52"), ("optimizer", "optimizer step", "#55A868"),
             ("bubble", "pipeline bubble", "#DDDDDD"))
MEM_COLORS = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868", "activations": "#C44E52",
              "other": "#8C8C8C"}
GiB = 2.0 ** 30
CAPTIONS = {
    "breakdown": "Mean pipeline rank's step split into parts that add up to the step time.",
    "memory": "Each bar is one pipeline rank's peak, split by kind; the dashed line is the usable device memory.",
    "scaling": "Step time (left axis) and throughput per GPU (right axis) against the swept value.",
    "gantt": "One row per pipeline rank: F blue, B orange, I red, W purple, optimizer green; "
             "thin bars: data-parallel collectives; white: idle (bubble).",
}


@dataclass
class Figure:
    """One rendered figure."""

    file: str
    """PNG file name beside report.md."""
    title: str
    png: bytes


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def gantt_figure(label: str, res: Result, i: int) -> Figure:
    from parsim.report.gantt import gantt
    plt = _plt()
    n = res.timeline["rank"].nunique()
    fig, ax = plt.subplots(figsize=(12, 1.4 + 0.45 * n))
    title = f"Pipeline schedule: {label} (step {fmt_seconds(res.metrics['step_time_s'])})"
    gantt(res.timeline, ax, title)
    return Figure(f"gantt-{i}.png", title, _png(fig))


def memory_figure(items: list[tuple[str, Result]]) -> Figure:
    plt = _plt()
    n = len(items)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(max(6, 3.4 * cols), 3.6 * rows + 0.6), sharey=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.set_visible(False)
    cap = max(r.metrics["memory_capacity_bytes"] for _, r in items) / GiB
    top = cap
    for ax, (label, res) in zip(flat, items):
        stages = res.metrics["stages"]
        x = [s["rank"] for s in stages]
        bottom = [0.0] * len(stages)
        for kind in MEMORY_KINDS:
            vals = [s["memory"][kind] / GiB for s in stages]
            ax.bar(x, vals, bottom=bottom, color=MEM_COLORS[kind], label=kind, width=0.7)
            bottom = [b + v for b, v in zip(bottom, vals)]
        top = max(top, max(bottom))
        ax.axhline(res.metrics["memory_capacity_bytes"] / GiB, color="black", linestyle="--", linewidth=1,
                   label="usable device memory")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("pipeline rank")
        ax.set_xticks(x)
        ax.set_ylabel("memory per GPU (GiB)")
    axes[0][0].set_ylim(0, top * 1.1)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=6, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.06))
    title = "Peak memory per pipeline rank against device capacity"
    fig.suptitle(title)
    fig.tight_layout()
    return Figure("memory.png", title, _png(fig))


def breakdown_figure(items: list[tuple[str, Result]]) -> Figure:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.55 * len(items)))
    labels = [lab for lab, _ in items]
    left = [0.0] * len(items)
    for key, name, color in BREAKDOWN:
        vals = [r.metrics["breakdown_s"].get(key, 0.0) for _, r in items]
        if not any(v > 0 for v in vals):
            continue
        ax.barh(labels, vals, left=left, color=color, label=name, height=0.6)
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("time per optimizer step (s), mean pipeline rank")
    ax.set_ylabel("scenario")
    title = "Where the step time goes"
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(items) < 4 else -0.12), ncol=5,
              fontsize=8, frameon=False)
    fig.tight_layout()
    return Figure("breakdown.png", title, _png(fig))


def scaling_figure(key: str, values: list, items: list[tuple[str, Result]]) -> Figure | None:
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    T = [r.metrics["step_time_s"] for _, r in items]
    tput = [r.metrics["tokens_per_s"] / r.metrics["world_size"] for _, r in items]
    l1 = ax.plot(values, T, "o-", color="#4C72B0", label="step time (s)")
    ax.set_xlabel(f"{key} (swept value)")
    ax.set_ylabel("step time (s)")
    ax2 = ax.twinx()
    l2 = ax2.plot(values, tput, "s--", color="#DD8452", label="throughput (tokens/s per GPU)")
    ax2.set_ylabel("throughput (tokens/s per GPU)")
    if all(v > 0 for v in values) and max(values) / min(values) >= 4:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values)
    ax.set_xticklabels([str(v) for v in values])
    title = f"Scaling with {key}"
    ax.set_title(title)
    ax.legend(l1 + l2, [h.get_label() for h in l1 + l2], loc="upper center", bbox_to_anchor=(0.5, -0.15),
              ncol=2, fontsize=8, frameon=False)
    fig.tight_layout()
    return Figure("scaling.png", title, _png(fig))


def summary_rows(items: list[tuple[str, Result]]) -> list[list[str]]:
    rows = []
    for label, res in items:
        mx = res.metrics
        p = mx["parallel"]
        fit = "yes" if mx["fits_in_memory"] else f"no (rank {mx['oom']['rank']} +{fmt_bytes(mx['oom']['over_by_bytes'])})"
        rows.append([label, mx["schedule"], f"dp{p['dp']} tp{p['tp']} pp{p['pp']} cp{p['cp']} vpp{p['vpp']} zero{p['zero']}",
                     fmt_seconds(mx["step_time_s"]), f"{mx['tokens_per_s']:,.0f}", f"{mx['mfu']:.1%}",
                     f"{mx['bubble_fraction']:.3f}", fmt_seconds(mx["exposed_comm_s"]),
                     fmt_bytes(mx["peak_memory_bytes"]), fit])
    return rows


SUMMARY_HEAD = ["scenario", "schedule", "parallel", "step time", "tokens/s", "MFU", "bubble fraction",
                "exposed comm", "peak memory", "fits"]


def build_figures(items: list[tuple[str, Result]], sweep: tuple[str, list] | None = None) -> list[Figure]:
    figs = [breakdown_figure(items), memory_figure(items)]
    if sweep:
        sc = scaling_figure(sweep[0], sweep[1], items)
        if sc:
            figs.append(sc)
    figs += [gantt_figure(label, res, i) for i, (label, res) in enumerate(items)]
    return figs


def write_report(items: list[tuple[str, Result]], out: Path, title: str, sweep: tuple[str, list] | None = None,
                 command: str | None = None, write=None) -> tuple[Path, Path]:
    """Write report.html, report.md and the figures' PNGs into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figs = build_figures(items, sweep)
    write = write or _plain_write
    for f in figs:
        write(out / f.file, f.png)
    write(out / "report.md", markdown(items, figs, title, command).encode())
    write(out / "report.html", html_page(items, figs, title, command).encode())
    return out / "report.html", out / "report.md"


def _plain_write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def markdown(items, figs: list[Figure], title: str, command: str | None) -> str:
    lines = [f"# {title}", ""]
    if command:
        lines += ["Generated by:", "", "```bash", command, "```", ""]
    lines += ["| " + " | ".join(SUMMARY_HEAD) + " |", "|" + "---|" * len(SUMMARY_HEAD)]
    lines += ["| " + " | ".join(r) + " |" for r in summary_rows(items)]
    lines += [""]
    for f in figs:
        lines += [f"## {f.title}", "", f"![{f.title}]({f.file})", ""]
    lines += [_glossary()]
    return "\n".join(lines) + "\n"


def _glossary() -> str:
    return ("Step time is the makespan of one optimizer step. Bubble fraction: mean over pipeline ranks of "
            "(step - busy)/step. Exposed communication: time a rank waits on communication that is not hidden "
            "behind compute. MFU counts model FLOPs (no recompute). Memory bars: the peak of each pipeline rank, "
            "split by kind, against the device's usable memory (dashed line).")


def html_page(items, figs: list[Figure], title: str, command: str | None) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in SUMMARY_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in summary_rows(items))
    fig_html = "".join(
        f'<figure><h2>{e(f.title)}</h2><img alt="{e(f.title)}" src="data:image/png;base64,'
        f'{base64.b64encode(f.png).decode()}"><figcaption>{e(CAPTIONS.get(f.file.split("-")[0].split(".")[0], ""))}</figcaption></figure>' for f in figs)
    cmd = f"<p>Generated by:</p><pre>{e(command)}</pre>" if command else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}}
table{{border-collapse:collapse;font-size:14px}}th,td{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
th{{background:#f2f2f2}}td:first-child{{text-align:left}}figure{{margin:2em 0}}img{{max-width:100%}}
pre{{background:#f6f6f6;padding:8px;overflow-x:auto}}
</style></head><body>
<h1>{e(title)}</h1>{cmd}
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
{fig_html}
<p>{e(_glossary())}</p>
</body></html>
"""
