"""Measured rank results -> Timeline DataFrame -> predicted vs measured, with errors.

Torch-free. The measured timeline has the simulator's columns (rank, stream, op, stage,
microbatch, start_s, end_s, bytes), with times relative to the step start (the earliest
post-barrier clock reading of all ranks when they share a host; each rank's own
otherwise). p2p spans run from the sender's isend to the moment the receiver's wait
returned (an upper bound of the arrival); ``post`` spans from the isend's call to its return (the
sender's own time posting it: gloo's caller thread writes into the socket). Metrics use the same definitions as
``parsim.result``: step time = makespan, busy = compute-stream time, bubble fraction =
mean over pipeline ranks of (step - busy) / step.
"""
from __future__ import annotations

import statistics

import numpy as np
import pandas as pd

from parsim.results.result import Result, spans_frame


def representatives(ranks: list[dict]) -> list[dict]:
    """One rank per pipeline rank: data-, tensor- and context-parallel index 0 (the simulator's
    representative replica)."""
    return [r for r in ranks if r["dp_rank"] == 0 and r.get("tp_rank", 0) == 0 and r.get("cp_rank", 0) == 0]


def step_timeline(ranks: list[dict], step: int, pp: int) -> pd.DataFrame:
    """Spans of measured step ``step`` of the first data-parallel replica."""
    reps = representatives(ranks)
    same_host = len({r["host"] for r in ranks}) == 1
    origin = min(r["steps"][step]["start"] for r in reps)
    rows, recv_at = [], {}
    for r in reps:
        st = r["steps"][step]
        t0 = origin if same_host else st["start"]
        for key, t in st["recvs"].items():
            recv_at[key] = t - t0
        for stream, op, stage, mb, a, b, nbytes in st["spans"]:
            rows.append((r["pp_rank"], stream, op, stage, mb, a - t0, b - t0, nbytes))
        for op, stage, a, b, nbytes in st["asyncs"]:
            rows.append((r["pp_rank"], "dp", op, stage, -1, a - t0, b - t0, nbytes))
    for r in reps:
        st = r["steps"][step]
        t0 = origin if same_host else st["start"]
        for op, stage, mb, a, nbytes, *posted in st["sends"]:
            dst = stage + 1 if op == "SEND_F" else stage - 1
            end = recv_at.get(f"{dst}:{op[-1]}:{mb}", a - t0)
            rows.append((r["pp_rank"], "p2p", op, stage, mb, a - t0, max(a - t0, end), nbytes))
            if posted and posted[0] > a:  # the sender's own time inside isend (records since 2026-11-25)
                rows.append((r["pp_rank"], "post", op, stage, mb, a - t0, posted[0] - t0, nbytes))
    return spans_frame(rows)


def timeline_metrics(tl: pd.DataFrame, pp: int) -> dict:
    """step_time_s, bubble_fraction and per-rank busy_s of one timeline."""
    T = float(tl["end_s"].max()) if len(tl) else 0.0
    comp = tl[tl["stream"] == "compute"]
    busy = [float((g["end_s"] - g["start_s"]).sum()) for g in (comp[comp["rank"] == r] for r in range(pp))]
    bubble = float(np.mean([(T - b) / T for b in busy])) if T > 0 else 0.0
    return {"step_time_s": T, "bubble_fraction": bubble,
            "stages": [{"rank": r, "busy_s": b} for r, b in enumerate(busy)]}


def action_durations(tl: pd.DataFrame) -> pd.DataFrame:
    """Median duration per (rank, stream, op, stage) over microbatches."""
    d = tl.assign(duration_s=tl["end_s"] - tl["start_s"])
    return (d.groupby(["rank", "stream", "op", "stage"], observed=True)["duration_s"]
            .agg(["median", "count"]).reset_index().rename(columns={"median": "duration_s"}))


def _launch_list(runs) -> list[list[dict]]:
    """One launch (a list of rank dicts) or several (a list of such lists) -> list of launches."""
    return [runs] if runs and isinstance(runs[0], dict) else list(runs)


def measured_summary(runs, pp: int) -> tuple[dict, pd.DataFrame, list[pd.DataFrame]]:
    """Median metrics over the measured steps of every launch, the median step's timeline,
    all timelines; ``launch_step_time_s``: each launch's own median (launch-to-launch spread)."""
    tls, per_launch, probes, faults = [], [], [], []
    for ranks in _launch_list(runs):
        first, n_steps = ranks[0]["warmup"], len(ranks[0]["steps"])
        probes += [st["probe_s"] for r in ranks for st in r["steps"][first:] if st.get("probe_s")]
        faults += [st["minor_faults"] for r in ranks for st in r["steps"][first:] if "minor_faults" in st]
        mine = [step_timeline(ranks, k, pp) for k in range(first, n_steps)]
        per_launch.append(statistics.median(timeline_metrics(t, pp)["step_time_s"] for t in mine))
        tls += mine
    mets = [timeline_metrics(t, pp) for t in tls]
    times = [m["step_time_s"] for m in mets]
    k_med = int(np.argsort(times)[len(times) // 2])
    out = {
        "step_time_s": statistics.median(times),
        "step_time_all_s": times,
        "launch_step_time_s": per_launch,
        "probe_s": statistics.median(probes) if probes else None,
        "minor_faults_per_step": statistics.median(faults) if faults else None,
        "bubble_fraction": statistics.median(m["bubble_fraction"] for m in mets),
        "stages": [{"rank": r, "busy_s": statistics.median(m["stages"][r]["busy_s"] for m in mets)}
                   for r in range(pp)],
    }
    return out, tls[k_med], tls


# The speed probe: one case of the calibration's GEMM grid (x W^T), timed between measured
# steps by parsim.validate.bench.probe exactly as calibration timed it. Defined here, torch-free.
PROBE = {"kind": "gemm", "name": "forward", "m": 256, "n": 1024, "k": 1024}


def calibration_probe_s(profile_path: str | None) -> float | None:
    """Seconds the speed probe (:data:`PROBE`) took at calibration: the
    median over ranks of its row in the profile's data CSV (``<profile>.csv``), if any."""
    from pathlib import Path

    if not profile_path:
        return None
    csv = Path(profile_path).with_suffix(".csv")
    if not csv.is_file():
        return None
    df = pd.read_csv(csv)
    hit = df
    for k, v in PROBE.items():
        if k not in hit:
            return None
        hit = hit[hit[k] == v]
    return float(hit["seconds"].median()) if len(hit) else None


def device_drift(c: dict, profile_path: str | None) -> dict | None:
    """How fast the device ran during the measured steps against during calibration (the
    same probe, timed the same way), and the step-time error the prediction would show had
    it been made for the device's speed during the run. A diagnostic: the gated error is the raw one."""
    cal, run = calibration_probe_s(profile_path), c["measured"].get("probe_s")
    if not cal or not run:
        return None
    ratio = run / cal
    pred, meas = c["predicted"]["step_time_s"], c["measured"]["step_time_s"]
    return {"probe": "gemm forward 256x1024x1024 (fp32), all ranks at once", "calibration_s": cal, "run_s": run,
            "run_over_calibration": ratio, "step_time_error_at_run_speed": _rel(pred * ratio, meas)}


def _rel(pred: float, meas: float) -> float | None:
    return None if not meas else (pred - meas) / meas


def compare(res: Result, runs) -> dict:
    """The ``parsim validate --json`` object: predicted, measured, relative_error (+ details).

    ``runs``: the rank results of one launch, or a list of launches."""
    pp = res.schedule.pp
    pm = res.metrics
    # the measured side's "bubble" is all compute-stream idle time: compare it with idle_fraction
    predicted = {"step_time_s": pm["step_time_s"], "bubble_fraction": pm["idle_fraction"],
                 "stages": [{"rank": s["rank"], "busy_s": s["busy_s"]} for s in pm["stages"]]}
    measured, tl_med, tls = measured_summary(runs, pp)
    ranks = _launch_list(runs)[0]
    mem_pred = {st.stage: st.activation_bytes for st in res.tables.stages}
    mem_meas = {int(s): v for r in representatives(ranks) for s, v in r["memory"].items()}
    predicted["activation_bytes"] = [mem_pred[s] for s in sorted(mem_pred)]
    measured["activation_bytes"] = [mem_meas.get(s, {}).get("activation_bytes") for s in sorted(mem_pred)]
    err = {
        "step_time_s": _rel(predicted["step_time_s"], measured["step_time_s"]),
        "bubble_fraction": _rel(predicted["bubble_fraction"], measured["bubble_fraction"]),
        "stages": [{"rank": r, "busy_s": _rel(predicted["stages"][r]["busy_s"], measured["stages"][r]["busy_s"])}
                   for r in range(pp)],
        "activation_bytes": [None if m is None else _rel(p, m)
                             for p, m in zip(predicted["activation_bytes"], measured["activation_bytes"])],
    }
    actions = compare_actions(res.timeline, tls, predicted_comm(res))
    orders = message_orders(res, runs)
    return {"scenario": res.scenario.name, "hardware": res.scenario.hardware.name,
            "hardware_file": res.scenario.hardware.source_path, "schedule": res.schedule.name,
            "model": res.scenario.model.name, "predicted": predicted, "measured": measured,
            "relative_error": err, "actions": actions.to_dict(orient="records"),
            **({"message_order": orders} if orders is not None else {}),
            "_timelines": (res.timeline, tl_med)}


def message_orders(res: Result, runs) -> dict | None:
    """Message-driven runs (AMPNet): the order each stage realized in every measured step
    against the order the simulator predicts from the costs (None for a listed schedule)."""
    reps = [r for launch in _launch_list(runs) for r in representatives(launch)]
    if not reps or "order" not in reps[0]["steps"][-1]:
        return None
    predicted = [[_order_item(a) for a in row if a.op.value in ("F", "B", "STEP")] for row in res.schedule.actions]
    steps, matching = 0, 0
    measured = {}
    for launch in _launch_list(runs):
        by_rank = {r["pp_rank"]: r for r in representatives(launch)}
        first = launch[0]["warmup"]
        for k in range(first, len(launch[0]["steps"])):
            got = [[tuple(x) for x in by_rank[p]["steps"][k]["order"]] for p in sorted(by_rank)]
            steps += 1
            matching += got == predicted
            measured.setdefault(str(got), [got, 0])[1] += 1
    common = max(measured.values(), key=lambda v: v[1])
    return {"predicted": predicted, "measured_most_common": common[0], "steps": steps,
            "steps_matching_prediction": matching}


def _order_item(a) -> tuple:
    return (a.op.value, -1 if a.microbatch is None else a.microbatch)


COMM_PARTS = {"tp_comm": "tp", "cp_comm": "cp", "ep_comm": "ep"}
"""Cost-model parts of an op -> the stream the runtime times them on (``parsim.validate.comm``)."""


def predicted_comm(res: Result) -> pd.DataFrame:
    """The tensor-/context-/expert-parallel communication the cost model puts inside each
    F/B/I (its ``tp_comm``/``cp_comm``/``ep_comm`` parts), one row per (rank, stream, op, stage)."""
    rows = []
    for r in res.tables.ops:
        if r.op not in ("F", "B", "I", "W"):
            continue
        for part, stream in COMM_PARTS.items():
            v = getattr(r.parts, part)
            if v > 0:
                rows.append({"rank": res.schedule.rank_of(r.stage), "stream": stream, "op": r.op, "stage": r.stage,
                             "duration_s": v, "count": 1})
    return pd.DataFrame(rows, columns=["rank", "stream", "op", "stage", "duration_s", "count"])


def compare_actions(pred_tl: pd.DataFrame, meas_tls: list[pd.DataFrame],
                    pred_comm: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (rank, stream, op, stage): predicted vs measured median action duration (compute and
    dp streams; the tp / cp / ep communication inside F/B/I when there is any)."""
    pred = action_durations(pred_tl)
    if pred_comm is not None and len(pred_comm):
        ops = set(pred["op"].astype(str))  # only the ops this schedule runs (B, or I and W)
        pred = pd.concat([pred, pred_comm[pred_comm["op"].isin(ops)]], ignore_index=True)
    meas = action_durations(pd.concat(meas_tls, ignore_index=True))
    keep = ["rank", "stream", "op", "stage"]
    for df in (pred, meas):
        for c in ("stream", "op"):
            df[c] = df[c].astype(str)
    j = pred.merge(meas, on=keep, how="outer", suffixes=("_predicted", "_measured"))
    j = j[j["stream"] != "p2p"].drop(columns=["count_predicted"]).rename(columns={"count_measured": "samples"})
    j["relative_error"] = (j["duration_s_predicted"] - j["duration_s_measured"]) / j["duration_s_measured"]
    return j.sort_values(["rank", "stage", "op"]).reset_index(drop=True)
