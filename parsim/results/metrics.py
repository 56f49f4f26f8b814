"""The result's metrics (the ``--json`` object), assembled from the span rows, the memory
events and the cost tables.

Definitions (what every number means):

* step_time_s: makespan of one optimizer step (all streams, all pipeline ranks).
* bubble_fraction: the pipeline's bubble, mean over pipeline ranks of (step_time - busy -
  exposed dp communication) / step_time: fill, drain, imbalance and waiting on stage-to-stage
  transfers (the breakdown's ``bubble`` + ``pp_comm`` rows over the step; what the
  zero-bubble paper's Table 5 calls the bubble rate). 0 without a pipeline (pp = 1).
* idle_fraction: mean over pipeline ranks of (step_time - busy) / step_time, every idle
  moment of the compute stream, exposed data-parallel communication included (DESIGN.md's
  ``bubble_fraction`` before the two were told apart; ``validate`` compares it with the
  measured runs' idle time). The two are equal when no dp communication is exposed.
* breakdown: the mean pipeline rank's step time split into compute, recompute,
  tp/cp/ep communication inside ops, optimizer, exposed dp and pp communication and the
  pure pipeline bubble (``parsim.results.timeline``). The parts add up to step_time_s.
* mfu / hfu: ``parsim.results.throughput`` (MoE: routed, not dropped, assignments; hfu:
  selective recompute's FLOPs too); bytes by axis: ``parsim.results.comm``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from parsim.config.scenario import Scenario
from parsim.costs.inputs import paced_gpus
from parsim.costs.memory import ALLOCATOR_FRAGMENTATION
from parsim.costs.memory_ops import default_fp8_recipe, fp8_gemm_precision
from parsim.costs.parts import PART_NAMES
from parsim.costs.tables import CostTables
from parsim.model import active_params, trained_params
from parsim.results.comm import bytes_by_axis, collective_algorithms
from parsim.results.frames import parts_frame, sent_frame
from parsim.results.memory import MEMORY_KINDS, rank_memory, reserved_bytes
from parsim.results.moe import moe_layers_per_rank, moe_metrics
from parsim.results.throughput import throughput
from parsim.results.timeline import rank_slices, rank_times, span_bubble
from parsim.schedule.ir import Schedule
from parsim.schedule.semantics import staleness_steps, traits

BREAKDOWN = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "optimizer", "dp_comm", "pp_comm", "bubble")


def metrics(sc: Scenario, schedule: Schedule, tables: CostTables, tl: pd.DataFrame, mem: pd.DataFrame) -> dict:
    """The metrics of one simulated step."""
    par, tr, m = sc.parallel, sc.training, sc.model
    T = float(tl["end_s"].max()) if len(tl) else 0.0
    pp, s2r = schedule.pp, schedule.stage_to_rank
    stages_out, totals, peak_all, worst, hw_flops = _per_rank(sc, schedule, tables, tl, mem, T)
    # token slices (TeraPipe): the tables are per sequence; the K slices of a sequence execute
    # its FLOPs once (their causal attention pieces sum to the full causal square)
    hw_flops /= schedule.n_slices
    mean = {k: v / pp for k, v in totals.items()}
    axis_comm = {"tp": mean["tp_comm"], "cp": mean["cp_comm"], "ep": mean["ep_comm"],
                 "dp": mean["dp_comm"], "pp": mean["pp_comm"]}
    capacity = sc.hardware.device.usable_memory_bytes
    out = {
        "name": sc.name,
        "hardware": sc.hardware.name,
        "model": m.name,
        "schedule": schedule.name,
        "world_size": par.world_size,
        "gpus_per_node": sc.hardware.gpus_per_node,
        "global_batch": sc.tokens_per_step // tr.seq_len,  # what the step simulates (schedule.n_microbatches may say)
        "seq_len": tr.seq_len,
        "tokens_per_step": sc.tokens_per_step,
        "parallel": {"dp": par.dp, "tp": par.tp, "pp": par.pp, "cp": par.cp, "ep": par.ep,
                     "vpp": par.vpp, "zero": par.zero, "sequence_parallel": par.sequence_parallel},
        "n_microbatches": schedule.n_microbatches // schedule.n_slices,
        "microbatch_size": tr.microbatch_size,
        "recompute": tr.recompute,
        **recompute_detail(tr),
        "precision": tr.precision,
        **precision_detail(sc),
        "params": trained_params(m),  # the multi-token prediction modules are trained too
        "step_time_s": T,
        **throughput(sc, T, hw_flops, pp, tables.moe.dropped_fraction if tables.moe is not None else 0.0),
        "bubble_fraction": float(np.mean([s["bubble_fraction"] for s in stages_out])) if stages_out else 0.0,
        "idle_fraction": float(np.mean([s["idle_fraction"] for s in stages_out])) if stages_out else 0.0,
        "exposed_comm_s": float(sum(axis_comm.values())),
        "exposed_comm_by_axis_s": axis_comm,
        "comm_bytes_by_axis": bytes_by_axis(tl, sent_frame(tables), pp),
        "collective_algorithms": collective_algorithms(sc),
        "breakdown_s": {k: mean[k] for k in BREAKDOWN},
        "peak_memory_bytes": peak_all,
        "peak_reserved_bytes": reserved_bytes(peak_all),
        "allocator_fragmentation": ALLOCATOR_FRAGMENTATION,
        "memory_capacity_bytes": capacity,
        "fits_in_memory": worst is None,
        "oom": None if worst is None else {"rank": worst[0], "over_by_bytes": worst[1]},
        "stages": stages_out,
    }
    out.update(compute_clock(sc))
    out.update(_schedule_metrics(sc, schedule, tables, tl[tl["stream"] == "compute"], stages_out))
    if m.is_moe:
        out["active_params"] = active_params(m)
        if tables.moe is not None:
            per_rank = moe_layers_per_rank([st.moe_layers for st in tables.stages], s2r, pp)
            out["moe"] = moe_metrics(tables.moe, per_rank, schedule.n_microbatches, tr.recompute == "full", peak_all)
    return out


def compute_clock(sc: Scenario) -> dict:
    """``compute_clock``: the clock the kernel models ran the job's compute at, against the burst
    they are calibrated to -- the power-saturated fraction (``saturated_ratio``) times the slowest
    of ``paced_gpus`` chips against the mean one (``slowest_chip_share``); empty on a profile
    without kernel facts (its rates are calibrated as they run)."""
    dev = sc.hardware.paced(paced_gpus(sc)).device  # the device cost_inputs costs the job on
    if dev.kernels is None:
        return {}
    return {"compute_clock": {"saturated_ratio": dev.kernels.saturated_ratio,
                              "slowest_chip_share": dev.kernels.slowest_chip_share(dev.paced_gpus),
                              "paced_gpus": dev.paced_gpus}}


def precision_detail(sc: Scenario) -> dict:
    """Under ``precision = "fp8"``: the recipe in force (the scenario's, else the device's
    default), the precision the linear layers' GEMMs run at (fp8, mxfp8 or nvfp4; attention, the
    router and the LM head stay 16-bit) and the blocks kept in BF16 at each end."""
    tr = sc.training
    if tr.precision != "fp8":
        return {}
    peaks = sc.hardware.device.peak_flops
    recipe = tr.fp8_recipe or default_fp8_recipe(peaks)
    return {"fp8_recipe": recipe, "linear_gemm_precision": fp8_gemm_precision(recipe, peaks),
            "bf16_layers": {"first": tr.bf16_first_layers, "last": tr.bf16_last_layers}}


def recompute_detail(tr) -> dict:
    """What the recompute mode reruns, where it says more than its name: ``recompute_modules``
    under selective (Megatron's modules), ``recompute_method`` / ``recompute_num_layers`` under
    full recomputation of part of the blocks."""
    if tr.recompute == "selective":
        return {"recompute_modules": list(tr.recompute_modules_)}
    if tr.recompute == "full" and tr.recompute_method is not None:
        return {"recompute_method": tr.recompute_method, "recompute_num_layers": tr.recompute_num_layers or 1}
    return {}


def _per_rank(sc: Scenario, schedule: Schedule, tables: CostTables, tl: pd.DataFrame, mem: pd.DataFrame, T: float):
    """(per-rank JSON rows, summed breakdown, peak memory, worst overflow, summed FLOPs)."""
    pp, s2r = schedule.pp, schedule.stage_to_rank
    times = rank_times(tl, parts_frame(tables), s2r, pp, T)
    totals = {k: 0.0 for k in BREAKDOWN}
    capacity = sc.hardware.device.usable_memory_bytes
    m_rank, m_time, m_delta = (mem[n].to_numpy() for n in ("rank", "time_s", "delta_bytes"))
    m_kind = np.asarray(mem["kind"].to_numpy())
    m_ord, m_b = rank_slices(m_rank, pp)
    stages_out, peak_all, worst, hw_flops = [], 0.0, None, 0.0
    for r, rt in enumerate(times):
        mi = m_ord[m_b[r]:m_b[r + 1]]
        for n in PART_NAMES:
            totals[n] += rt.parts[n]
        totals["optimizer"] += rt.optimizer_s
        totals["dp_comm"] += rt.exposed_dp_s
        totals["pp_comm"] += rt.exposed_pp_s
        totals["bubble"] += rt.bubble_s
        hw_flops += rt.flops
        peak, breakdown = rank_memory(tables.static_memory[r], m_time[mi], m_delta[mi], m_kind[mi])
        peak_all = max(peak_all, peak)
        if peak > capacity and (worst is None or peak - capacity > worst[1]):
            worst = (r, peak - capacity)
        stages_out.append({
            "rank": r,
            "stages": [s for s in range(len(s2r)) if s2r[s] == r],
            "layers": sum(sc.layers_per_stage[s] for s in range(len(s2r)) if s2r[s] == r),
            "busy_s": rt.busy_s,
            "bubble_fraction": (rt.bubble_s + rt.exposed_pp_s) / T if T > 0 else 0.0,
            "idle_fraction": (T - rt.busy_s) / T if T > 0 else 0.0,
            "exposed_dp_comm_s": rt.exposed_dp_s,
            "exposed_pp_comm_s": rt.exposed_pp_s,
            "peak_memory_bytes": peak,
            "peak_reserved_bytes": reserved_bytes(peak),
            "memory": {**{k: float(breakdown.get(k, 0.0)) for k in MEMORY_KINDS},
                       **{k: float(v) for k, v in breakdown.items() if k not in MEMORY_KINDS}},
        })
    return stages_out, totals, peak_all, worst, hw_flops


def _schedule_metrics(sc: Scenario, sched: Schedule, tables: CostTables, compute: pd.DataFrame,
                      stages_out: list) -> dict:
    """Schedule-level fields: the split, the ZB-paper bubble, PipeDream semantics.

    * ``layers_per_stage``: transformer blocks of every stage (the chosen partition).
    * ``bubble_fraction_span``: Qi et al.'s (zero-bubble paper) view
      (:func:`parsim.results.timeline.span_bubble`). Equal to ``bubble_fraction`` when every
      rank starts at 0 and the last compute ends the step; lower for ZB-H2's parallelogram.
    * ``pipedream`` (PipeDream, PipeDream2BW only): per pipeline rank ``weight_versions``
      and ``staleness_steps``, and ``steady_state_step_s`` / ``steady_state_tokens_per_s``:
      without a flush, a step in steady state lasts the busiest rank's compute per step
      (fill and drain are paid once per run); ``step_time_s`` stays the makespan of one
      step started from an empty pipeline.
    """
    out: dict = {"layers_per_stage": list(sc.layers_per_stage), "partition": sc.schedule.partition
                 if sc.schedule.layers_per_stage is None else "explicit"}
    out["bubble_fraction_span"] = span_bubble(compute, [st["busy_s"] for st in stages_out])
    if sched.n_slices > 1 or sc.schedule.token_slices is not None:
        out["token_slices"] = sched.n_slices
    t = traits(sc.schedule.name)
    if t.weight_versions:
        steady = max((st["busy_s"] for st in stages_out), default=0.0)
        out["pipedream"] = {
            "weight_versions": list(tables.weight_versions),
            "staleness_steps": [staleness_steps(t, sched.pp, r) for r in range(sched.pp)],
            "steady_state_step_s": steady,
            "steady_state_tokens_per_s": sc.tokens_per_step / steady if steady > 0 else 0.0,
        }
    return out
