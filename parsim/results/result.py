"""Span rows -> Timeline (pandas) -> Result metrics, JSON and a readable summary.

Definitions (what every number means):

* step_time_s: makespan of one optimizer step (all streams, all pipeline ranks).
* busy_s of a pipeline rank: time its compute stream runs (F, B, I, W, STEP, including
  the TP/CP/EP communication that runs inside those ops).
* bubble_fraction: mean over pipeline ranks of (step_time - busy) / step_time
  (DESIGN.md); it counts every idle moment of the compute stream.
* breakdown: the mean pipeline rank's step time split into compute, recompute,
  tp/cp/ep communication inside ops, optimizer, exposed dp and pp communication (idle
  while a collective or a transfer for this rank is in flight) and the pure pipeline
  bubble (the rest). The parts add up to step_time_s.
* mfu: model FLOPs (3 x forward of all layers and the LM head, full s^2 attention, no
  recompute) per GPU per second / peak; hfu counts what runs, recompute included.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from parsim.config.scenario import Scenario
from parsim.costs.model_costs import PART_NAMES, ModelCosts
from parsim.costs.moe import moe_metrics
from parsim.model import (
    active_params,
    is_moe_layer,
    megatron_flops_per_step,
    model_flops_per_step,
    total_params,
)
from parsim.schedule.ir import Schedule
from parsim.sim.engine import RawTimeline
from parsim.units import fmt_bytes, fmt_count, fmt_seconds

COMPUTE_OPS = ("F", "B", "I", "W", "STEP")
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "other")


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    # a new block begins where a start exceeds every earlier end
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    block_end = np.append(e[idx[1:] - 1], e[-1])
    return float(np.sum(block_end - s[idx]))


def _exposed_arrays(cs: np.ndarray, ce: np.ndarray, bs: np.ndarray, be: np.ndarray) -> float:
    """Length of the comm intervals [cs, ce) not covered by busy intervals [bs, be)."""
    if len(cs) == 0:
        return 0.0
    both = _union_length(np.concatenate([cs, bs]), np.concatenate([ce, be]))
    return both - _union_length(bs, be)


def _frame(rows: list[tuple], dtype: list[tuple[str, str]], categories: tuple[str, ...]) -> pd.DataFrame:
    """Columnar DataFrame from row tuples: numpy parses them in C; strings become categoricals."""
    arr = np.array(rows, dtype=dtype) if rows else np.zeros(0, dtype=dtype)
    return pd.DataFrame({name: (pd.Categorical(arr[name].astype(object)) if name in categories else arr[name])
                         for name in arr.dtype.names})


SPAN_DTYPE = [("rank", "i8"), ("stream", "U8"), ("op", "U16"), ("stage", "i8"), ("microbatch", "i8"),
              ("start_s", "f8"), ("end_s", "f8"), ("bytes", "f8")]
MEM_DTYPE = [("rank", "i8"), ("time_s", "f8"), ("delta_bytes", "f8"), ("kind", "U16")]


def spans_frame(spans: list[tuple]) -> pd.DataFrame:
    """The Timeline: one row per executed action."""
    tl = _frame(spans, SPAN_DTYPE, ("stream", "op"))
    mb = tl["microbatch"].to_numpy()
    tl["microbatch"] = pd.arrays.IntegerArray(mb, mb < 0)  # -1 in the engine = no microbatch
    return tl


@dataclass
class Result:
    """One simulated optimizer step."""

    scenario: Scenario
    schedule: Schedule
    costs: ModelCosts
    timeline: pd.DataFrame
    """One row per executed action (Span): rank, stream, op, stage, microbatch, start_s, end_s, bytes."""
    memory_events: pd.DataFrame
    """rank, time_s, delta_bytes, kind: dynamic allocations over the step."""
    metrics: dict

    @classmethod
    def from_raw(cls, sc: Scenario, schedule: Schedule, costs: ModelCosts, raw: RawTimeline) -> "Result":
        tl = spans_frame(raw.spans)
        mem = _frame(raw.mem_events, MEM_DTYPE, ("kind",))
        res = cls(sc, schedule, costs, tl, mem, {})
        res.metrics = _metrics(res)
        return res

    def to_json(self) -> dict:
        return self.metrics

    def summary(self) -> str:
        return format_summary(self.metrics)


def _rank_memory(res: Result, rank: int, time: np.ndarray, delta: np.ndarray,
                 kind: np.ndarray) -> tuple[float, dict[str, float]]:
    """Peak bytes of a rank and the breakdown by kind at that moment (events of this rank only)."""
    static = res.costs.rank_model_states(rank, res.schedule.stage_to_rank)
    kinds = {"activations": 0.0, "other": 0.0}
    if len(delta):
        order = np.lexsort((delta, time))  # at equal times frees (negative) come first
        total = np.cumsum(delta[order])
        upto = order[: int(np.argmax(total)) + 1]
        for k in np.unique(kind[upto]):
            kinds[str(k)] = kinds.get(str(k), 0.0) + float(delta[upto][kind[upto] == k].sum())
    breakdown = {**static, **kinds}
    return float(sum(breakdown.values())), breakdown


def _rank_slices(ranks: np.ndarray, pp: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, bounds): rows of rank r are order[bounds[r]:bounds[r+1]]."""
    order = np.argsort(ranks, kind="stable")
    return order, np.searchsorted(ranks[order], np.arange(pp + 1))


def _metrics(res: Result) -> dict:
    sc, tl, costs = res.scenario, res.timeline, res.costs
    par, tr, m = sc.parallel, sc.training, sc.model
    T = float(tl["end_s"].max()) if len(tl) else 0.0
    pp = res.schedule.pp
    s2r = res.schedule.stage_to_rank
    compute = tl[tl["stream"] == "compute"]
    # parts of each compute span, from the cost table (uniform over microbatches)
    part_rows = []
    for st in costs.stages:
        for op, p in st.parts.items():
            part_rows.append((st.stage, op.value, *(getattr(p, n) for n in PART_NAMES), st.flops.get(op, 0.0)))
    parts = pd.DataFrame(part_rows, columns=["stage", "op", *PART_NAMES, "flops"])
    joined = _hidden_comm(compute.merge(parts, on=["stage", "op"], how="left").fillna(0.0))
    stages_out, totals = [], {k: 0.0 for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm",
                                                 "optimizer", "dp_comm", "pp_comm", "bubble")}
    peak_all, worst = 0.0, None
    capacity = sc.hardware.device.usable_memory_bytes
    hw_flops_per_gpu = 0.0
    def cols(df, *names):
        return [df[n].to_numpy() for n in names]

    c_rank, c_start, c_end = cols(compute, "rank", "start_s", "end_s")
    busy_all = np.bincount(c_rank, weights=c_end - c_start, minlength=pp)
    j_rank, j_start, j_end, j_flops = cols(joined, "rank", "start_s", "end_s", "flops")
    is_step = (joined["op"] == "STEP").to_numpy()
    optim_all = np.bincount(j_rank[is_step], weights=(j_end - j_start)[is_step], minlength=pp)
    parts_all = {n: np.bincount(j_rank[~is_step], weights=joined[n].to_numpy()[~is_step], minlength=pp)
                 for n in PART_NAMES}
    flops_all = np.bincount(j_rank, weights=j_flops, minlength=pp)
    c_ord, c_b = _rank_slices(c_rank, pp)
    dpf = tl[tl["stream"] == "dp"]
    d_rank, d_start, d_end = cols(dpf, "rank", "start_s", "end_s")
    d_ord, d_b = _rank_slices(d_rank, pp)
    p2p = tl[tl["stream"] == "p2p"]
    p_start, p_end = cols(p2p, "start_s", "end_s")
    if len(p2p):
        # a transfer belongs to the rank that waits for it
        s2r_arr = np.asarray(s2r)
        dst_stage = p2p["stage"].to_numpy() + np.where((p2p["op"] == "SEND_F").to_numpy(), 1, -1)
        p_rank = s2r_arr[dst_stage]
    else:
        p_rank = np.zeros(0, dtype=np.int64)
    p_ord, p_b = _rank_slices(p_rank, pp)
    mev = res.memory_events
    m_rank, m_time, m_delta, m_kind = cols(mev, "rank", "time_s", "delta_bytes", "kind")
    m_ord, m_b = _rank_slices(m_rank, pp)
    for r in range(pp):
        ci, di, pi, mi = (o[b[r]:b[r + 1]] for o, b in ((c_ord, c_b), (d_ord, d_b), (p_ord, p_b), (m_ord, m_b)))
        busy = float(busy_all[r])
        optim = float(optim_all[r])
        exp_dp = _exposed_arrays(d_start[di], d_end[di], c_start[ci], c_end[ci])
        exp_pp = _exposed_arrays(p_start[pi], p_end[pi], np.concatenate([c_start[ci], d_start[di]]),
                                 np.concatenate([c_end[ci], d_end[di]])) if len(pi) else 0.0
        bubble = max(0.0, T - busy - exp_dp - exp_pp)
        for n in PART_NAMES:
            totals[n] += float(parts_all[n][r])
        totals["optimizer"] += optim
        totals["dp_comm"] += exp_dp
        totals["pp_comm"] += exp_pp
        totals["bubble"] += bubble
        hw_flops_per_gpu += float(flops_all[r])
        peak, mem = _rank_memory(res, r, m_time[mi], m_delta[mi], np.asarray(m_kind)[mi])
        if peak > peak_all:
            peak_all = peak
        if peak > capacity and (worst is None or peak - capacity > worst[1]):
            worst = (r, peak - capacity)
        stages_out.append({
            "rank": r,
            "stages": [s for s in range(len(s2r)) if s2r[s] == r],
            "layers": sum(sc.layers_per_stage[s] for s in range(len(s2r)) if s2r[s] == r),
            "busy_s": busy,
            "bubble_fraction": (T - busy) / T if T > 0 else 0.0,
            "exposed_dp_comm_s": exp_dp,
            "exposed_pp_comm_s": exp_pp,
            "peak_memory_bytes": peak,
            "memory": {k: float(mem.get(k, 0.0)) for k in MEMORY_KINDS},
        })
    mean = {k: v / pp for k, v in totals.items()}
    tokens = sc.tokens_per_step
    world = par.world_size
    model_flops = model_flops_per_step(m, tokens, tr.seq_len)
    tflops = model_flops / T / world / 1e12 if T > 0 else 0.0
    peak_flops = sc.hardware.device.peak(tr.precision)
    meg = megatron_flops_per_step(m, tr.global_batch, tr.seq_len, recompute=tr.recompute == "full")
    axis_comm = {"tp": mean["tp_comm"], "cp": mean["cp_comm"], "ep": mean["ep_comm"],
                 "dp": mean["dp_comm"], "pp": mean["pp_comm"]}
    bytes_by_axis = _bytes_by_axis(res)
    n_params = total_params(m)
    out = {
        "name": sc.name,
        "hardware": sc.hardware.name,
        "model": m.name,
        "schedule": res.schedule.name,
        "world_size": world,
        "parallel": {"dp": par.dp, "tp": par.tp, "pp": par.pp, "cp": par.cp, "ep": par.ep,
                     "vpp": par.vpp, "zero": par.zero, "sequence_parallel": par.sequence_parallel},
        "n_microbatches": res.schedule.n_microbatches,
        "microbatch_size": tr.microbatch_size,
        "recompute": tr.recompute,
        "params": n_params,
        "step_time_s": T,
        "tokens_per_s": tokens / T if T > 0 else 0.0,
        "tflops_per_gpu": tflops,
        "mfu": tflops * 1e12 / peak_flops,
        "hfu": (hw_flops_per_gpu / pp) * (1.0) / T / peak_flops if T > 0 else 0.0,
        "megatron_tflops_per_gpu": meg / T / world / 1e12 if T > 0 else 0.0,
        "bubble_fraction": float(np.mean([s["bubble_fraction"] for s in stages_out])) if stages_out else 0.0,
        "exposed_comm_s": float(sum(axis_comm.values())),
        "exposed_comm_by_axis_s": axis_comm,
        "comm_bytes_by_axis": bytes_by_axis,
        "breakdown_s": {"compute": mean["compute"], "recompute": mean["recompute"],
                        "tp_comm": mean["tp_comm"], "cp_comm": mean["cp_comm"], "ep_comm": mean["ep_comm"],
                        "optimizer": mean["optimizer"], "dp_comm": mean["dp_comm"],
                        "pp_comm": mean["pp_comm"], "bubble": mean["bubble"]},
        "peak_memory_bytes": peak_all,
        "memory_capacity_bytes": capacity,
        "fits_in_memory": worst is None,
        "oom": None if worst is None else {"rank": worst[0], "over_by_bytes": worst[1]},
        "stages": stages_out,
    }
    out.update(_schedule_metrics(res, compute, T, stages_out))
    if m.is_moe:
        out["active_params"] = active_params(m)
        if costs.moe is not None:
            out["moe"] = _moe_metrics(res, peak_all)
            out["comm_bytes_by_axis"]["ep"] = _ep_bytes(res, out["moe"])
    return out


def _moe_layers_per_rank(res: Result) -> list[int]:
    m, s2r = res.scenario.model, res.schedule.stage_to_rank
    per = [0] * res.schedule.pp
    for st in res.costs.stages:
        per[s2r[st.stage]] += sum(is_moe_layer(m, li) for li in st.layers)
    return per


def _moe_metrics(res: Result, peak: float) -> dict:
    """The ``moe`` object: per-EP-rank routed tokens, expert compute, all-to-all, drops, memory."""
    sc = res.scenario
    return moe_metrics(res.costs.moe, _moe_layers_per_rank(res), res.schedule.n_microbatches,
                       sc.training.recompute == "full", peak, res.costs.act_opts.bytes_per_element,
                       sc.model.d_model)


def _ep_bytes(res: Result, mx: dict) -> float:
    """Bytes one GPU sends in dispatch/combine all-to-alls per step (mean pipeline rank)."""
    per_layer = (6 if res.scenario.training.recompute == "full" else 4) * mx["all_to_all_bytes_per_rank"]["send"]
    return per_layer * float(np.mean(_moe_layers_per_rank(res))) * res.schedule.n_microbatches


def _hidden_comm(j: pd.DataFrame) -> pd.DataFrame:
    """Spans shorter than their op's parts (the halves of a DualPipe OVERLAP_F_B) hid
    communication under the other op's compute: take the difference off their tp/cp/ep
    parts first, then off compute, so every span's parts add up to its duration."""
    if j.empty:
        return j
    dur = (j["end_s"] - j["start_s"]).to_numpy()
    tot = j[list(PART_NAMES)].sum(axis=1).to_numpy()
    excess = tot - dur
    mask = excess > 1e-9 * np.maximum(tot, 1e-30)
    if not mask.any():
        return j
    j = j.copy()
    comm_cols, work_cols = ["tp_comm", "cp_comm", "ep_comm"], ["compute", "recompute"]
    comm = j[comm_cols].sum(axis=1).to_numpy()
    work = j[work_cols].sum(axis=1).to_numpy()
    cut = np.where(mask, np.minimum(excess, comm), 0.0)
    rest = np.where(mask, excess - cut, 0.0)
    k_comm = np.where(comm > 0, (comm - cut) / np.where(comm > 0, comm, 1.0), 1.0)
    k_work = np.where(work > 0, (work - rest) / np.where(work > 0, work, 1.0), 1.0)
    for c in comm_cols:
        j[c] = j[c].to_numpy() * k_comm
    for c in work_cols:
        j[c] = j[c].to_numpy() * k_work
    return j


def _schedule_metrics(res: Result, compute: pd.DataFrame, T: float, stages_out: list) -> dict:
    """Schedule-level fields: the split, the ZB-paper bubble, PipeDream semantics.

    * ``layers_per_stage``: transformer blocks of every stage (the chosen partition).
    * ``bubble_fraction_span``: Qi et al.'s (zero-bubble paper) view: with S the longest
      span of any rank's compute (first start to last end), mean over ranks of
      (S - busy) / S. Equal to ``bubble_fraction`` when every rank starts at 0 and the
      last compute ends the step; lower for ZB-H2's parallelogram.
    * ``pipedream`` (PipeDream, PipeDream2BW only): per pipeline rank ``weight_versions``
      and ``staleness_steps``, and ``steady_state_step_s`` / ``steady_state_tokens_per_s``:
      without a flush, a step in steady state lasts the busiest rank's compute per step
      (fill and drain are paid once per run); ``step_time_s`` stays the makespan of one
      step started from an empty pipeline.
    """
    sc, sched = res.scenario, res.schedule
    out: dict = {"layers_per_stage": list(sc.layers_per_stage), "partition": sc.schedule.partition
                 if sc.schedule.layers_per_stage is None else "explicit"}
    spans = []
    if len(compute):
        g = compute.groupby("rank")
        spans = list((g["end_s"].max() - g["start_s"].min()).to_numpy())
    S = max(spans, default=0.0)
    out["bubble_fraction_span"] = (float(np.mean([(S - st["busy_s"]) / S for st in stages_out]))
                                   if S > 0 and stages_out else 0.0)
    from parsim.schedule.semantics import staleness_steps, traits
    t = traits(sc.schedule.name)
    if t.weight_versions:
        steady = max((st["busy_s"] for st in stages_out), default=0.0)
        out["pipedream"] = {
            "weight_versions": [res.costs.weight_versions(r) for r in range(sched.pp)],
            "staleness_steps": [staleness_steps(t, sched.pp, r) for r in range(sched.pp)],
            "steady_state_step_s": steady,
            "steady_state_tokens_per_s": sc.tokens_per_step / steady if steady > 0 else 0.0,
        }
    return out


def _bytes_by_axis(res: Result) -> dict[str, float]:
    """Bytes one GPU of the representative replica sends per step, by axis (mean over pipeline ranks)."""
    tl, sc = res.timeline, res.scenario
    pp = res.schedule.pp
    p2p = float(tl.loc[tl["stream"] == "p2p", "bytes"].sum()) / pp
    dp = float(tl.loc[tl["stream"] == "dp", "bytes"].sum()) / pp
    n = sc.parallel.dp
    # ring collectives: each GPU sends (n-1)/n of the buffer per reduce-scatter/all-gather phase
    dp_factor = {"REDUCE_GRAD": 2 * (n - 1) / n if sc.parallel.zero == 0 else (n - 1) / n,
                 "UNSHARD": (n - 1) / n, "PARAM_GATHER": (n - 1) / n}
    dp_sent = 0.0
    for op, grp in tl[tl["stream"] == "dp"].groupby("op"):
        dp_sent += float(grp["bytes"].sum()) * dp_factor.get(op, 1.0)
    dp_sent /= pp
    return {"pp": p2p, "dp": dp_sent, "dp_buffer": dp, "tp": _tp_bytes(res), "cp": 0.0, "ep": 0.0}


def _tp_bytes(res: Result) -> float:
    sc = res.scenario
    t = sc.parallel.tp
    if t <= 1:
        return 0.0
    b, seq = sc.training.microbatch_size, sc.training.seq_len // sc.parallel.cp
    per_collective = b * seq * sc.model.d_model * 2 * 2 * (t - 1) / t  # ring all-reduce bytes sent per GPU
    passes = 3 if sc.training.recompute == "full" else 2  # forward, backward (+ recomputed forward)
    layers = sc.model.n_layers / sc.parallel.pp
    return per_collective * 2 * passes * layers * res.schedule.n_microbatches


def format_summary(mx: dict) -> str:
    par = mx["parallel"]
    lines = [
        f"{mx['name']}: {mx['model']} on {mx['world_size']} x {mx['hardware']}  "
        f"(dp={par['dp']} tp={par['tp']} pp={par['pp']} cp={par['cp']} ep={par['ep']} vpp={par['vpp']} "
        f"zero={par['zero']}{' sp' if par['sequence_parallel'] else ''}; {mx['schedule']}, "
        f"{mx['n_microbatches']} microbatches of {mx['microbatch_size']}, recompute={mx['recompute']})",
        f"  params            {fmt_count(mx['params'])}" + (f"  (active {fmt_count(mx['active_params'])})" if "active_params" in mx else ""),
        f"  step time         {fmt_seconds(mx['step_time_s'])}",
        f"  throughput        {mx['tokens_per_s']:,.0f} tokens/s, {mx['tflops_per_gpu']:.1f} TFLOP/s per GPU "
        f"(MFU {mx['mfu']:.1%}, HFU {mx['hfu']:.1%})",
        f"  bubble fraction   {mx['bubble_fraction']:.4f}",
        f"  exposed comm      {fmt_seconds(mx['exposed_comm_s'])}  "
        + "  ".join(f"{k}={fmt_seconds(v)}" for k, v in mx["exposed_comm_by_axis_s"].items() if v > 0),
        "  step time breakdown (mean pipeline rank):",
    ]
    T = mx["step_time_s"] or 1.0
    for k, v in mx["breakdown_s"].items():
        if v > 0:
            lines.append(f"    {k:<12} {fmt_seconds(v):>12}  {v / T:6.1%}")
    fit = "fits" if mx["fits_in_memory"] else (
        f"DOES NOT FIT: rank {mx['oom']['rank']} over by {fmt_bytes(mx['oom']['over_by_bytes'])}")
    lines.append(f"  peak memory       {fmt_bytes(mx['peak_memory_bytes'])} of {fmt_bytes(mx['memory_capacity_bytes'])} usable: {fit}")
    lines.append("  rank  layers  busy          bubble   peak memory   params     grads      optimizer  activations")
    for s in mx["stages"]:
        mm = s["memory"]
        lines.append(f"  {s['rank']:>4}  {s['layers']:>6}  {fmt_seconds(s['busy_s']):>12}  {s['bubble_fraction']:7.4f}  "
                     f"{fmt_bytes(s['peak_memory_bytes']):>11}  {fmt_bytes(mm['params']):>9}  {fmt_bytes(mm['grads']):>9}  "
                     f"{fmt_bytes(mm['optimizer']):>9}  {fmt_bytes(mm['activations']):>9}")
    return "\n".join(lines)


def json_safe(obj):
    """Replace NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
