"""Validation report: predicted vs measured tables and the two Gantt charts, one above the other."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from parsim.report.gantt import gantt  # noqa: E402


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def plot_both(pred: pd.DataFrame, meas: pd.DataFrame, path: Path, title: str) -> None:
    fig, axes = plt.subplots(2, 1, figsize=(12, 5.5), sharex=True)
    gantt(pred, axes[0], f"{title}: predicted (simulator)")
    gantt(meas, axes[1], f"{title}: measured (torch.distributed)")
    axes[1].set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown(c: dict) -> str:
    p, m, e = c["predicted"], c["measured"], c["relative_error"]
    lines = [
        f"# Validation: {c['scenario']} ({c['schedule']}, {c['model']})",
        "",
        f"Backend **{c['backend']}**, {c['world']} ranks; profile `{c['hardware_file'] or c['hardware']}`. "
        f"Measured: median of {len(m['step_time_all_s'])} steps ({c.get('launches', 1)} launch(es), "
        f"{c['warmup']} warm-up steps each; per-launch medians "
        f"{', '.join(f'{t:.4f}' for t in m.get('launch_step_time_s', []))} s); receives posted {c.get('recv', 'late')}. "
        f"Machine: {c.get('cpu_count')} CPUs, 1-minute load average {c.get('load_average_1min', ['?'])[0]:.2f} before "
        f"and {c.get('load_average_1min', [0, 0])[-1]:.2f} after the run (other processes share the cores); "
        f"rank niceness increment {c.get('nice', 0)}."
        + (" More ranks than cores: oversubscribed, not a fidelity gate." if c['world'] > (c.get('cpu_count') or 0) else ""),
        "",
        "| metric | predicted | measured | error |",
        "|---|---:|---:|---:|",
        f"| step time (s) | {p['step_time_s']:.4f} | {m['step_time_s']:.4f} | {_pct(e['step_time_s'])} |",
        f"| bubble fraction | {p['bubble_fraction']:.3f} | {m['bubble_fraction']:.3f} | {_pct(e['bubble_fraction'])} |",
    ]
    for ps, ms, es in zip(p["stages"], m["stages"], e["stages"]):
        lines.append(f"| rank {ps['rank']} busy (s) | {ps['busy_s']:.4f} | {ms['busy_s']:.4f} | {_pct(es['busy_s'])} |")
    for s, (pa, ma, ea) in enumerate(zip(p["activation_bytes"], m["activation_bytes"], e["activation_bytes"])):
        lines.append(f"| stage {s} activations, one microbatch (MiB) | {pa / 2**20:.3f} | "
                     f"{'n/a' if ma is None else f'{ma / 2**20:.3f}'} | {_pct(ea)} |")
    d = c.get("device_drift")
    if d:
        lines += ["", f"Device speed during the run: the probe ({d['probe']}) took {d['run_s'] * 1e3:.3f} ms against "
                  f"{d['calibration_s'] * 1e3:.3f} ms at calibration ({d['run_over_calibration'] - 1:+.1%}). "
                  f"Had the prediction used the device's speed during the run, the step-time error would be "
                  f"{_pct(d['step_time_error_at_run_speed'])} (a diagnostic; the error above is the one reported)."]
    mo = c.get("message_order")
    if mo:
        show = (lambda rows: "; ".join(f"rank {r}: " + " ".join(f"{op}{'' if j < 0 else j}" for op, j in row)
                                       for r, row in enumerate(rows)))
        lines += ["", f"Message-driven order (what the messages' arrival made it): {mo['steps_matching_prediction']} "
                  f"of {mo['steps']} measured steps ran the order the simulator predicts from the costs. "
                  f"Predicted: {show(mo['predicted'])}. Measured (most common): {show(mo['measured_most_common'])}."]
    mr = c.get("moe_routing")
    if mr:
        rows = "; ".join(f"layer {j}: " + " ".join(f"{n:.0f}" for n in row) for j, row in enumerate(mr["histogram"]))
        lines += ["", f"Routing the run's router produced (top-k assignments per expert before capacity dropping, "
                  f"summed over ranks and measured steps, per MoE layer): {rows}. Predicted with it "
                  f"(`[moe] routing = \"histogram\"`): {mr['predicted_step_time_s']:.4f} s, "
                  f"{_pct(mr['relative_error'])} against the measured step (the error above keeps the scenario's routing)."]
    faults = m.get("minor_faults_per_step")
    if faults is not None:
        lines += ["", f"Page faults per measured step (median over ranks and steps): {faults:.0f}."]
    lines += ["", "Per-action durations (median over microbatches and steps; streams: compute, dp = data-parallel "
              "collectives, tp / cp / ep = the tensor-, context- and expert-parallel communication inside that "
              "F/B/I, all of it per action):", "",
              "| rank | stage | stream | op | predicted (ms) | measured (ms) | error |", "|---:|---:|---|---|---:|---:|---:|"]
    for a in c["actions"]:
        pr, me = a.get("duration_s_predicted"), a.get("duration_s_measured")
        f = (lambda v: "n/a" if v is None or v != v else f"{v * 1e3:.3f}")
        err = a.get("relative_error")
        lines.append(f"| {a['rank']} | {a['stage']} | {a['stream']} | {a['op']} | {f(pr)} | {f(me)} | "
                     f"{'n/a' if err is None or err != err else _pct(err)} |")
    lines += ["", "![predicted (top) and measured (bottom)](gantt.png)", "",
              "Files: `comparison.json` (this table), `predicted.csv` and `measured.csv` (span rows)."]
    return "\n".join(lines) + "\n"


def write_report(c: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pred, meas = c["_timelines"]
    plot_both(pred, meas, out / "gantt.png", c["scenario"])
    pred.to_csv(out / "predicted.csv", index=False)
    meas.to_csv(out / "measured.csv", index=False)
    (out / "comparison.json").write_text(json.dumps(public(c), indent=1, default=float))
    (out / "report.md").write_text(markdown(c))


def public(c: dict) -> dict:
    """The comparison without the in-memory timelines (JSON-safe)."""
    from parsim.results.result import json_safe
    return json_safe({k: v for k, v in c.items() if not k.startswith("_")})
