"""Chrome/Perfetto trace and Gantt plot from a Result's timeline."""
from __future__ import annotations

import json

import pandas as pd

STREAM_TID = {"compute": 0, "p2p": 1, "dp": 2}


def chrome_trace(timeline: pd.DataFrame, name: str = "parsim") -> dict:
    """Trace Event Format (loads in Perfetto / chrome://tracing): a process per rank, a thread per stream."""
    events = []
    for rank in sorted(timeline["rank"].unique()):
        events.append({"ph": "M", "name": "process_name", "pid": int(rank), "args": {"name": f"pipeline rank {rank}"}})
        for stream, tid in STREAM_TID.items():
            events.append({"ph": "M", "name": "thread_name", "pid": int(rank), "tid": tid, "args": {"name": stream}})
    for row in timeline.itertuples(index=False):
        mb = "" if pd.isna(row.microbatch) else int(row.microbatch)
        events.append({
            "ph": "X", "name": f"{row.stage}{row.op}{mb}", "cat": row.op,
            "pid": int(row.rank), "tid": STREAM_TID.get(row.stream, 3),
            "ts": row.start_s * 1e6, "dur": (row.end_s - row.start_s) * 1e6,
            "args": {"stage": int(row.stage), "microbatch": mb, "bytes": float(row.bytes)},
        })
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": name}}


def write_trace(timeline: pd.DataFrame, path: str) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(timeline), f)




