"""Comparison reports: ``parsim compare`` -> DIR/report.html (self-contained) and DIR/report.md.

Figures (matplotlib, every one with a title, axis labels with units and a legend):

* the pipeline Gantt of each scenario (parsim.sim.trace.gantt);
* memory per pipeline rank as stacked bars (params, grads, optimizer, activations,
  other) against the device's usable capacity;
* the step-time breakdown of each scenario (compute, recompute, exposed communication
  per axis, optimizer, bubble) as stacked bars;
* a scaling chart when a dimension is swept: step time and throughput per GPU on two
  panels, one metric per axis, each axis from zero (or as % of the baseline with one).

Tables show one unit per column (the unit in the header), fractions as percentages, a
delta column against the baseline (``--baseline``; default the first scenario), a context
line (parsim version, hardware, model, batch, sequence) and the measured fidelity.

The HTML embeds the figures as base64 PNGs (nothing else to ship); the Markdown links
the same PNGs written beside it.
"""
from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from pathlib import Path

from parsim.report.context import context_line, uncertainty_line
from parsim.results.result import MEMORY_KINDS, Result
from parsim.results.summary import fmt_b, fmt_s, pct, sig3, table

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
    "scaling": "Step time and throughput per GPU against the swept value, each on its own axis from zero.",
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
    title = f"Pipeline schedule: {label} (step {fmt_s(res.metrics['step_time_s'])})"
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


def scaling_figure(key: str, values: list, items: list[tuple[str, Result]], baseline: int | None = None) -> Figure | None:
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return None
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    T = [r.metrics["step_time_s"] for _, r in items]
    tput = [r.metrics["tokens_per_s"] / r.metrics["world_size"] for _, r in items]
    # a baseline given as a scenario file is listed first, outside the sweep: the swept points
    # are the last len(values) items
    swept = slice(len(items) - len(values), len(items))
    panels = ((ax1, T, "step time (s)", "o-", "#4C72B0"), (ax2, tput, "throughput (tokens/s per GPU)", "s-", "#DD8452"))
    for ax, ys, label, style, color in panels:
        if baseline is not None:  # the same metric as % of the baseline's: one scale for both panels
            ys = [100.0 * y / ys[baseline] for y in ys]
            label = label.split(" (")[0] + " (% of baseline)"
            ax.axhline(100.0, color="black", linestyle=":", linewidth=1, label="baseline")
        ys = ys[swept]
        ax.plot(values, ys, style, color=color, label=label.split(" (")[0])
        ax.set_xlabel(f"{key} (swept value)")
        ax.set_ylabel(label)
        ax.set_ylim(0, max(ys) * 1.15)  # from zero: differences drawn to scale
        if all(v > 0 for v in values) and max(values) / min(values) >= 4:
            ax.set_xscale("log", base=2)
        ax.set_xticks(values)
        ax.set_xticklabels([str(v) for v in values])
        ax.legend(loc="lower right", fontsize=8, frameon=False)
    title = f"Scaling with {key}"
    fig.suptitle(title)
    fig.tight_layout()
    return Figure("scaling.png", title, _png(fig))


def _seconds_unit(values: list[float]) -> tuple[str, float]:
    """One unit for a whole column: the one that suits its largest value."""
    top = max((abs(v) for v in values), default=0.0)
    for unit, scale in (("s", 1.0), ("ms", 1e-3)):
        if top >= scale:
            return unit, scale
    return "us", 1e-6


def summary_table(items: list[tuple[str, Result]], baseline: int | None = 0) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the comparison table: one unit per column, deltas against ``baseline``."""
    mxs = [res.metrics for _, res in items]
    t_unit, t_scale = _seconds_unit([m["step_time_s"] for m in mxs])
    c_unit, c_scale = _seconds_unit([m["exposed_comm_s"] for m in mxs])
    head = ["scenario", "schedule", "parallel", f"step time ({t_unit})", "vs baseline", "tokens/s", "MFU",
            "pipeline bubble", "idle", f"exposed comm ({c_unit})", "peak memory (GiB)", "fits"]
    base = mxs[baseline] if baseline is not None else None
    rows = []
    for (label, _), mx in zip(items, mxs):
        p = mx["parallel"]
        fit = "yes" if mx["fits_in_memory"] else f"no (rank {mx['oom']['rank']} +{fmt_b(mx['oom']['over_by_bytes'])})"
        if base is None:
            delta = ""
        elif mx is base:
            delta = "baseline"
        else:
            delta = f"{100.0 * (mx['step_time_s'] / base['step_time_s'] - 1):+.1f}%"
        rows.append([label, mx["schedule"], f"dp{p['dp']} tp{p['tp']} pp{p['pp']} cp{p['cp']} vpp{p['vpp']} zero{p['zero']}",
                     sig3(mx["step_time_s"] / t_scale), delta, f"{mx['tokens_per_s']:,.0f}", pct(mx["mfu"]),
                     pct(mx["bubble_fraction"]), pct(mx["idle_fraction"]), sig3(mx["exposed_comm_s"] / c_scale),
                     sig3(mx["peak_memory_bytes"] / GiB), fit])
    return head, rows


def build_figures(items: list[tuple[str, Result]], sweep: tuple[str, list] | None = None,
                  baseline: int | None = None) -> list[Figure]:
    figs = [breakdown_figure(items), memory_figure(items)]
    if sweep:
        sc = scaling_figure(sweep[0], sweep[1], items, baseline)
        if sc:
            figs.append(sc)
    figs += [gantt_figure(label, res, i) for i, (label, res) in enumerate(items)]
    return figs


def write_report(items: list[tuple[str, Result]], out: Path, title: str, sweep: tuple[str, list] | None = None,
                 command: str | None = None, write=None, baseline: int | None = None,
                 version: str | None = None) -> tuple[Path, Path]:
    """Write report.html, report.md and the figures' PNGs into ``out``; ``baseline``: the index
    of the item the others are compared with (None: deltas against the first, and the scaling
    chart in absolute units)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figs = build_figures(items, sweep, baseline)
    write = write or _plain_write
    base = 0 if baseline is None else baseline
    for f in figs:
        write(out / f.file, f.png)
    write(out / "report.md", markdown(items, figs, title, command, base, version).encode())
    write(out / "report.html", html_page(items, figs, title, command, base, version).encode())
    return out / "report.html", out / "report.md"


def _plain_write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _context(items, version: str | None = None) -> list[str]:
    """One context line per distinct (model, hardware, GPUs, batch, seq) among the scenarios."""
    seen: list[str] = []
    for _, res in items:
        line = context_line(res.metrics, version)
        if line not in seen:
            seen.append(line)
    return seen


def markdown(items, figs: list[Figure], title: str, command: str | None, baseline: int = 0,
             version: str | None = None) -> str:
    lines = [f"# {title}", ""]
    lines += [f"{c}." for c in _context(items, version)] + ["", uncertainty_line(), ""]
    if command:
        lines += ["Generated by:", "", "```bash", command, "```", ""]
    head, rows = summary_table(items, baseline)
    lines += [table(rows, head, markdown=True, align=["left", "left", "left"] + ["right"] * (len(head) - 3)), ""]
    lines += [f"Deltas are step time against `{items[baseline][0]}`.", ""]
    for f in figs:
        lines += [f"## {f.title}", "", f"![{f.title}]({f.file})", ""]
    lines += [_glossary()]
    return "\n".join(lines) + "\n"


def _glossary() -> str:
    return ("Step time is the makespan of one optimizer step. Pipeline bubble (bubble_fraction): mean over pipeline "
            "ranks of the step's share spent idle on the pipeline (fill, drain, waits on stage-to-stage transfers). "
            "Idle (idle_fraction): the bubble plus exposed data-parallel communication. Exposed communication: time "
            "a rank waits on communication that is not hidden behind compute. MFU counts model FLOPs (no recompute). "
            "Memory bars: the peak of each pipeline rank, split by kind, against the device's usable memory "
            "(dashed line).")


def html_page(items, figs: list[Figure], title: str, command: str | None, baseline: int = 0,
              version: str | None = None) -> str:
    e = html.escape
    head_cells, rows = summary_table(items, baseline)
    head = "".join(f"<th>{e(h)}</th>" for h in head_cells)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    fig_html = "".join(
        f'<figure><h2>{e(f.title)}</h2><img alt="{e(f.title)}" src="data:image/png;base64,'
        f'{base64.b64encode(f.png).decode()}"><figcaption>{e(CAPTIONS.get(f.file.split("-")[0].split(".")[0], ""))}</figcaption></figure>' for f in figs)
    cmd = f"<p>Generated by:</p><pre>{e(command)}</pre>" if command else ""
    ctx = "".join(f"<p>{e(c)}.</p>" for c in _context(items, version)) + f"<p><em>{e(uncertainty_line())}</em></p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:2em;max-width:1300px;color:#222}}
table{{border-collapse:collapse;font-size:14px}}th,td{{border:1px solid #ccc;padding:4px 8px;text-align:right}}
th{{background:#f2f2f2}}td:first-child{{text-align:left}}figure{{margin:2em 0}}img{{max-width:100%}}
pre{{background:#f6f6f6;padding:8px;overflow-x:auto}}
</style></head><body>
<h1>{e(title)}</h1>{ctx}{cmd}
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<p>Deltas are step time against {e(items[baseline][0])}.</p>
{fig_html}
<p>{e(_glossary())}</p>
</body></html>
"""
