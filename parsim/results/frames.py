"""The result's tables as DataFrames: span rows (the Timeline), memory events, and the cost
tables' per (stage, op) rows to join them with."""
from __future__ import annotations

import numpy as np
import pandas as pd

from parsim.costs.parts import AXES, PART_NAMES
from parsim.costs.tables import CostTables

SPAN_DTYPE = [("rank", "i8"), ("stream", "U8"), ("op", "U16"), ("stage", "i8"), ("microbatch", "i8"),
              ("start_s", "f8"), ("end_s", "f8"), ("bytes", "f8")]
MEM_DTYPE = [("rank", "i8"), ("time_s", "f8"), ("delta_bytes", "f8"), ("kind", "U16")]
PIPELINE_OPS = ("F", "I", "W", "B")


def _frame(rows: list[tuple], dtype: list[tuple[str, str]], categories: tuple[str, ...]) -> pd.DataFrame:
    """Columnar DataFrame from row tuples: numpy parses them in C; strings become categoricals."""
    arr = np.array(rows, dtype=dtype) if rows else np.zeros(0, dtype=dtype)
    return pd.DataFrame({name: (pd.Categorical(arr[name].astype(object)) if name in categories else arr[name])
                         for name in arr.dtype.names})


def spans_frame(spans: list[tuple]) -> pd.DataFrame:
    """The Timeline: one row per executed action."""
    tl = _frame(spans, SPAN_DTYPE, ("stream", "op"))
    mb = tl["microbatch"].to_numpy()
    tl["microbatch"] = pd.arrays.IntegerArray(mb, mb < 0)  # -1 in the engine = no microbatch
    return tl


def memory_frame(events: list[tuple]) -> pd.DataFrame:
    """Dynamic allocations over the step: rank, time_s, delta_bytes, kind."""
    return _frame(events, MEM_DTYPE, ("kind",))


def parts_frame(tables: CostTables) -> pd.DataFrame:
    """Per (stage, pipeline op): seconds by part and FLOPs, for one execution."""
    rows = [(r.stage, r.op, *(getattr(r.parts, n) for n in PART_NAMES), r.flops)
            for r in tables.ops if r.op in PIPELINE_OPS]
    return pd.DataFrame(rows, columns=["stage", "op", *PART_NAMES, "flops"])


def sent_frame(tables: CostTables) -> pd.DataFrame:
    """Per (stage, op): bytes one GPU sends per execution, by axis."""
    rows = [(r.stage, r.op, *(getattr(r.sent, a) for a in AXES)) for r in tables.ops]
    return pd.DataFrame(rows, columns=["stage", "op", *AXES])
