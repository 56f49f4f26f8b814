"""The report `parsim fl SCENARIO --out DIR` writes: rounds.csv, result.json, report.md and two
figures (the round-time distribution, and virtual time to N rounds)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from parsim.federated.results import FLResult

FILES = ("report.md", "result.json", "rounds.csv", "round_times.png", "time_to_rounds.png")


def plot_round_times(res: FLResult, path: str) -> None:
    """Histogram of round durations (successful and failed rounds apart)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r.duration_s for r in res.rows if not r.failed]
    bad = [r.duration_s for r in res.rows if r.failed]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.hist([ok, bad] if bad else [ok], bins=30, stacked=True, label=["aggregated", "failed"][: 2 if bad else 1],
            color=["#4C72B0", "#C44E52"][: 2 if bad else 1])
    ax.axvline(res.metrics["round_time_s_p50"], color="k", linestyle="--", linewidth=1, label="p50")
    ax.set_xlabel("round duration (s, virtual)")
    ax.set_ylabel("rounds")
    ax.set_title(f"{res.name}: round time distribution")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def plot_time_to_rounds(res: FLResult, path: str) -> None:
    """Successful rounds completed against virtual time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = res.time_to_rounds()
    end = float(t[-1]) if len(t) else 0.0
    unit, scale = ("s", 1.0) if end < 600 else ("min", 60.0) if end < 36000 else ("h", 3600.0)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.step(t / scale, range(1, len(t) + 1), where="post", label=res.metrics["mode"])
    ax.set_xlabel(f"virtual time ({unit})")
    ax.set_ylabel("rounds aggregated")
    ax.set_title(f"{res.name}: time to N rounds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def report_markdown(res: FLResult, version: str | None = None) -> str:
    return (f"# parsim federated rounds: {res.name}\n\n"
            f"parsim {version or ''} virtual-clock simulation (client tasks: FedScale's completion time; "
            "uplink: Konečný et al. 2016 encodings).\n\n```\n" + res.summary() + "\n```\n\n"
            "![round time distribution](round_times.png)\n\n![time to N rounds](time_to_rounds.png)\n\n"
            "Per-round rows: [rounds.csv](rounds.csv); metrics: [result.json](result.json).\n")


def write_fl_report(res: FLResult, out: Path, atomic_write, version: str | None = None) -> None:
    """All of FILES into ``out`` (created), each written atomically."""
    out.mkdir(parents=True, exist_ok=True)

    def png(plot):
        def w(tmp):
            plot(res, tmp + ".png")
            os.replace(tmp + ".png", tmp)
        return w

    atomic_write(out / "rounds.csv", lambda tmp: res.frame().to_csv(tmp, index=False))
    atomic_write(out / "result.json", lambda tmp: Path(tmp).write_text(json.dumps(res.metrics, indent=1)))
    atomic_write(out / "round_times.png", png(plot_round_times))
    atomic_write(out / "time_to_rounds.png", png(plot_time_to_rounds))
    atomic_write(out / "report.md", lambda tmp: Path(tmp).write_text(report_markdown(res, version)))
