"""Bytes by parallel axis: what one GPU of the representative replica sends per step (mean over
pipeline ranks), from the cost model's own accounting of each (stage, op) joined with the
spans that ran. Collectives count nccl-tests' bus bytes (ring all-reduce 2(n-1)/n of the
buffer, reduce-scatter / all-gather / all-to-all (n-1)/n); the context-parallel ring counts
the K/V blocks passed on; pipeline sends their activations."""
from __future__ import annotations

import pandas as pd

from parsim.costs.parts import AXES


def bytes_by_axis(tl: pd.DataFrame, sent: pd.DataFrame, pp: int) -> dict[str, float]:
    """``pp``, ``dp``, ``dp_buffer`` (the data-parallel buffers, not what is sent), ``tp``, ``cp``, ``ep``."""
    spans = pd.DataFrame({"stage": tl["stage"].to_numpy(), "op": tl["op"].astype(str).to_numpy()})
    j = spans.merge(sent, on=["stage", "op"], how="left").fillna(0.0)
    axis = {a: float(j[a].sum()) / pp for a in AXES}
    dp_buffer = float(tl.loc[tl["stream"] == "dp", "bytes"].sum()) / pp
    return {"pp": axis["pp"], "dp": axis["dp"], "dp_buffer": dp_buffer, "tp": axis["tp"], "cp": axis["cp"],
            "ep": axis["ep"]}
