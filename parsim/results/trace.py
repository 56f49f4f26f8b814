"""A result as a Chrome/Perfetto trace (Trace Event Format), and the per-rank memory timeline.

* a process per pipeline rank; a track (thread) per stream: compute, data-parallel, and one
  per p2p direction (``p2p -> rank 3``). Perfetto draws slices on one track only if they
  nest; transfers of bidirectional schedules (DualPipe, ZBV) overlap partially, so slices
  that would partially overlap one already on a track go to a numbered extra lane of the
  same name (``p2p -> rank 3 #2``): every track is free of partial overlaps.
* timestamps are whole nanoseconds (written as microseconds with three decimals): a trace
  of a large run is not 17-digit floats; a slice's duration is end minus start after
  rounding, so rounding never makes neighbours overlap.
* metadata events carry ``ts`` (0), which some importers require.
* memory: a counter (``"ph": "C"``) per rank, the bytes allocated after each instant at
  which the allocation changes (model states are allocated for the whole step); the same
  rows are :func:`memory_timeline`, which ``--memory-timeline FILE`` writes as CSV.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

STREAM_TID = {"compute": 0, "dp": 1}
P2P_TID = 10  # p2p tracks are numbered from here, one per direction (and lane)
MEMORY_COLUMNS = ("rank", "time_s", "total_bytes", "params_bytes", "grads_bytes", "optimizer_bytes",
                  "activations_bytes", "other_bytes")


def _ns(x: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(x, dtype=float) * 1e9).astype(np.int64)


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane of each slice (in start order): the first lane whose slices all ended by its start,
    or whose last open slice contains it entirely (nesting is allowed on a track)."""
    order = np.lexsort((-ends, starts))  # equal starts: the longer first, so the shorter nests
    lane = np.zeros(len(starts), dtype=np.int64)
    s_o, e_o = starts[order], ends[order]
    if len(order) < 2 or np.all(s_o[1:] >= np.maximum.accumulate(e_o)[:-1]):
        return lane  # the usual case: nothing overlaps, one lane
    stacks: list[list[int]] = []  # per lane, the ends of the open (enclosing) slices
    for i in order:
        s, e = starts[i], ends[i]
        for k, st in enumerate(stacks):
            while st and st[-1] <= s:
                st.pop()
            if not st or e <= st[-1]:
                st.append(e)
                lane[i] = k
                break
        else:
            stacks.append([e])
            lane[i] = len(stacks) - 1
    return lane


def _p2p_dest(tl: pd.DataFrame, stage_to_rank) -> np.ndarray:
    """Destination rank of each p2p row (SEND_F goes to the next stage, SEND_B to the previous)."""
    s2r = np.asarray(stage_to_rank)
    dst_stage = tl["stage"].to_numpy() + np.where((tl["op"] == "SEND_F").to_numpy(), 1, -1)
    return s2r[np.clip(dst_stage, 0, len(s2r) - 1)]


def memory_timeline(res) -> pd.DataFrame:
    """Per pipeline rank, the bytes allocated after every instant the allocation changes
    (columns :data:`MEMORY_COLUMNS`; the first row of a rank, at time 0, is the model states)."""
    mem, parts = res.memory_events, []
    for r, static in enumerate(res.tables.static_memory):
        ev = mem[mem["rank"] == r]
        t, d = ev["time_s"].to_numpy(), ev["delta_bytes"].to_numpy()
        kind = np.asarray(ev["kind"].to_numpy()).astype(str)
        order = np.lexsort((d, t))  # at equal times frees first: the order rank_memory peaks in
        t, d, kind = t[order], d[order], kind[order]
        is_act = kind == "activations"
        act = np.cumsum(np.where(is_act, d, 0.0))
        other = np.cumsum(np.where(is_act, 0.0, d))
        last = np.append(t[1:] != t[:-1], True) if len(t) else np.zeros(0, dtype=bool)  # after all events of an instant
        t, act, other = np.append(0.0, t[last]), np.append(0.0, act[last]), np.append(0.0, other[last])
        n = len(t)
        base = static.params + static.grads + static.optimizer
        parts.append(pd.DataFrame({
            "rank": np.full(n, r), "time_s": t, "total_bytes": base + act + other,
            "params_bytes": np.full(n, float(static.params)), "grads_bytes": np.full(n, float(static.grads)),
            "optimizer_bytes": np.full(n, float(static.optimizer)), "activations_bytes": act, "other_bytes": other}))
    if not parts:
        return pd.DataFrame({c: [] for c in MEMORY_COLUMNS})
    return pd.concat(parts, ignore_index=True)[list(MEMORY_COLUMNS)]


def chrome_trace(res, name: str = "parsim") -> dict:
    """The trace of one result (loads in https://ui.perfetto.dev and chrome://tracing)."""
    tl = res.timeline
    events: list[dict] = []
    tracks: dict[tuple[int, int], str] = {}
    start, end = _ns(tl["start_s"]), _ns(tl["end_s"])
    tid = np.full(len(tl), -1, dtype=np.int64)
    rank = tl["rank"].to_numpy()
    stream = tl["stream"].astype(str).to_numpy()
    is_p2p = stream == "p2p"
    dest = np.full(len(tl), -1, dtype=np.int64)
    if is_p2p.any():
        dest[is_p2p] = _p2p_dest(tl[is_p2p], res.schedule.stage_to_rank)
    # one group per (rank, track name); lanes inside a group only where slices overlap partially
    keys = [(int(r), s if s != "p2p" else f"p2p -> rank {int(d)}") for r, s, d in zip(rank, stream, dest)]
    groups: dict[tuple[int, str], list[int]] = {}
    for i, k in enumerate(keys):
        groups.setdefault(k, []).append(i)
    next_tid: dict[int, int] = {}
    for (r, track), idx in sorted(groups.items()):
        idx = np.asarray(idx)
        lanes = _lanes(start[idx], end[idx])
        base = STREAM_TID.get(track)
        for lane in range(int(lanes.max()) + 1):
            if base is not None and lane == 0:
                t = base
            else:
                t = next_tid.get(r, P2P_TID)
                next_tid[r] = t + 1
            tracks[(r, t)] = track if lane == 0 else f"{track} #{lane + 1}"
            tid[idx[lanes == lane]] = t
    for r in sorted({int(x) for x in rank} | set(range(len(res.tables.static_memory)))):
        events.append({"ph": "M", "name": "process_name", "pid": r, "ts": 0, "args": {"name": f"pipeline rank {r}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": r, "ts": 0, "args": {"sort_index": r}})
    for (r, t), track in sorted(tracks.items()):
        events.append({"ph": "M", "name": "thread_name", "pid": r, "tid": t, "ts": 0, "args": {"name": track}})
    mb = tl["microbatch"]
    mbs = ["" if m is pd.NA else int(m) for m in mb.astype(object).where(mb.notna(), pd.NA)]
    ops, stages = tl["op"].astype(str).tolist(), tl["stage"].tolist()
    nbytes = tl["bytes"].astype(float).tolist()
    for r, t, s0, e0, op, st, m, b in zip(rank.tolist(), tid.tolist(), start.tolist(), end.tolist(), ops, stages,
                                          mbs, nbytes):
        events.append({"ph": "X", "name": f"{st}{op}{m}", "cat": op, "pid": r, "tid": t, "ts": _us(s0),
                       "dur": _us(e0 - s0), "args": {"stage": st, "microbatch": m, "bytes": b}})
    mt = memory_timeline(res)
    states = (mt["params_bytes"] + mt["grads_bytes"] + mt["optimizer_bytes"]).tolist()
    for r, t, ms, a, o in zip(mt["rank"].tolist(), _ns(mt["time_s"]).tolist(), states,
                              mt["activations_bytes"].tolist(), mt["other_bytes"].tolist()):
        events.append({"ph": "C", "name": "memory (bytes)", "pid": r, "ts": _us(t),
                       "args": {"model states": ms, "activations": a, "other": o}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"generator": name}}


def write_trace(res, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(res), f, separators=(",", ":"))


def write_memory_timeline(res, path: str) -> None:
    memory_timeline(res).to_csv(path, index=False)
