"""Pipeline Gantt charts of a timeline (matplotlib)."""
from __future__ import annotations

import pandas as pd

OP_COLORS = {"F": "#4C72B0", "B": "#DD8452", "I": "#C44E52", "W": "#8172B3", "STEP": "#55A868",
             "SEND_F": "#64B5CD", "SEND_B": "#CCB974", "REDUCE_GRAD": "#937860", "UNSHARD": "#DA8BC3",
             "PARAM_GATHER": "#8C8C8C"}
# [offload] tiers (parsim.costs.offload): a thin row above each rank's compute
TIER_COLORS = {"D2H_GRADS": "#E377C2", "H2D_PARAMS": "#17BECF", "CPU_ADAM": "#2CA02C", "NVME_READ": "#BCBD22",
               "NVME_WRITE": "#7F7F7F", "D2H_ACTS": "#FF9896", "H2D_ACTS": "#98DF8A"}
TIER_STREAMS = ("pcie", "c2c", "cpu", "nvme")


def gantt(timeline: pd.DataFrame, ax, title: str = "", show_labels: bool | None = None) -> None:
    """Pipeline Gantt on ``ax``: one row per rank (compute), dp-stream bars beneath; idle = white."""
    ranks = sorted(timeline["rank"].unique())
    comp = timeline[timeline["stream"] == "compute"]
    dp = timeline[timeline["stream"] == "dp"]
    tiers = timeline[timeline["stream"].isin(TIER_STREAMS)]
    if show_labels is None:
        show_labels = len(comp) <= 400
    for r in ranks:
        rc = comp[comp["rank"] == r]
        for op, grp in rc.groupby("op", observed=True):
            ax.broken_barh(list(zip(grp["start_s"], grp["end_s"] - grp["start_s"])), (r - 0.4, 0.55),
                           facecolors=OP_COLORS.get(op, "#999999"), edgecolor="white", linewidth=0.3)
        rd = dp[dp["rank"] == r]
        for op, grp in rd.groupby("op", observed=True):
            ax.broken_barh(list(zip(grp["start_s"], grp["end_s"] - grp["start_s"])), (r + 0.18, 0.2),
                           facecolors=OP_COLORS.get(op, "#999999"))
        rt = tiers[tiers["rank"] == r]
        for op, grp in rt.groupby("op", observed=True):
            ax.broken_barh(list(zip(grp["start_s"], grp["end_s"] - grp["start_s"])), (r - 0.6, 0.16),
                           facecolors=TIER_COLORS.get(op, "#999999"))
        if show_labels:
            for row in rc.itertuples(index=False):
                if row.op in ("F", "B", "I", "W") and not pd.isna(row.microbatch):
                    ax.text((row.start_s + row.end_s) / 2, r - 0.12, str(int(row.microbatch)),
                            ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(ranks)
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_ylabel("pipeline rank")
    if title:
        ax.set_title(title)
    from matplotlib.patches import Patch
    shown = pd.concat([comp, dp])
    shown = shown[shown["end_s"] > shown["start_s"]]
    present = [op for op in OP_COLORS if op in set(shown["op"].astype(str))]
    colors = {**OP_COLORS, **TIER_COLORS}
    present += [op for op in TIER_COLORS if op in set(tiers["op"].astype(str))]
    ax.legend(handles=[Patch(color=colors[o], label=o) for o in present], loc="upper right",
              bbox_to_anchor=(1.0, -0.08), fontsize=7, ncol=max(1, len(present)), frameon=False,
              title="compute (tall) / data-parallel stream (thin); white = idle", title_fontsize=7)


def plot_gantt(timeline: pd.DataFrame, path: str, title: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = timeline["rank"].nunique()
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.45 * n))
    gantt(timeline, ax, title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
