"""A readable summary of a result's metrics, the human number formats, the one table
formatter, the training-budget figures, and JSON-safe values.

Human output shows three significant digits (``26.3 s``, ``812 ms``, ``74.5 GiB``,
``7.73%``): more than a model of this fidelity supports would be noise. JSON keeps full
precision. Every table — terminal and Markdown — goes through :func:`table` (tabulate).
"""
from __future__ import annotations

import math

from tabulate import tabulate


def sig3(x: float) -> str:
    """``x`` with three significant digits, thousands separated, never in e-notation."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if x == 0:
        return "0"
    decimals = 2 - math.floor(math.log10(abs(x)))
    if decimals > 0:
        text = f"{x:.{decimals}f}"
        # rounding may carry into a new digit (9.996 -> 10.00): one decimal less then
        return text if len(text.lstrip("-").replace(".", "").lstrip("0")) <= 3 else f"{x:.{decimals - 1}f}"
    return f"{round(x, decimals):,.0f}"


def fmt_s(s: float) -> str:
    """Seconds in the unit that puts 1..999 before it (days and hours for long runs)."""
    a = abs(s)
    for unit, scale in (("days", 86400.0), ("h", 3600.0)):
        if a >= 2 * scale:
            return f"{sig3(s / scale)} {unit}"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if a >= scale * 0.9995:
            return f"{sig3(s / scale)} {unit}"
    return f"{sig3(s * 1e9)} ns" if s else "0 s"


def fmt_b(b: float) -> str:
    """Bytes in binary units, as nvidia-smi and torch.cuda report memory."""
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(b) >= scale * 0.9995:
            return f"{sig3(b / scale)} {unit}"
    return f"{b:.0f} B"


def fmt_n(n: float) -> str:
    """A count: ``175B``, ``3.15M``."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale * 0.9995:
            return f"{sig3(n / scale)}{unit}"
    return sig3(n)


def pct(f: float) -> str:
    """A fraction as a percentage, three significant digits."""
    return f"{sig3(100.0 * f)}%"


def table(rows: list[list], headers: list[str], markdown: bool = False, align: list[str] | None = None) -> str:
    """The one table formatter: plain columns for a terminal, a pipe table for Markdown.
    Cells are strings already formatted (units in the header or the cell, one per column)."""
    fmt = "github" if markdown else "simple"
    cols = align or ["left"] + ["right"] * (len(headers) - 1)
    return tabulate([[str(c) for c in r] for r in rows], headers=headers, tablefmt=fmt, colalign=cols,
                    disable_numparse=True)


def parallel_text(par: dict) -> str:
    return (f"dp={par['dp']} tp={par['tp']} pp={par['pp']} cp={par['cp']} ep={par['ep']} vpp={par['vpp']} "
            f"zero={par['zero']}{' sp' if par['sequence_parallel'] else ''}")


def gpus_text(world: int, gpus_per_node: int | None, hardware: str) -> str:
    """``1,024 GPUs (128 nodes of dgx-a100-80g)``: not ``1024 x dgx-a100-80g``, which reads as boxes."""
    if gpus_per_node and world >= gpus_per_node and world % gpus_per_node == 0:
        n = world // gpus_per_node
        return f"{world:,} GPUs ({n:,} node{'s' if n > 1 else ''} of {hardware})"
    return f"{world:,} GPU{'s' if world > 1 else ''} of {hardware}"


def training_budget(mx: dict, train_tokens: float, gpu_hour_price: float | None = None) -> dict:
    """Time and GPU-hours to train on ``train_tokens`` tokens at this step: whole steps of
    ``tokens_per_step`` tokens (the last one full), each ``step_time_s`` long (PipeDream:
    its steady-state step)."""
    steps = math.ceil(train_tokens / mx["tokens_per_step"])
    step = mx.get("pipedream", {}).get("steady_state_step_s", mx["step_time_s"])
    t = steps * step
    out = {"train_tokens": float(train_tokens), "train_steps": steps, "time_to_train_s": t,
           "gpu_hours": t * mx["world_size"] / 3600.0}
    if gpu_hour_price is not None:
        out["gpu_hour_price"] = float(gpu_hour_price)
        out["cost"] = out["gpu_hours"] * gpu_hour_price
    return out


def budget_line(b: dict) -> str:
    line = (f"  time to train     {fmt_s(b['time_to_train_s'])} for {fmt_n(b['train_tokens'])} tokens "
            f"({b['train_steps']:,} steps), {fmt_n(b['gpu_hours'])} GPU-hours")
    if "cost" in b:
        line += f", {fmt_n(b['cost'])} at {sig3(b['gpu_hour_price'])} per GPU-hour"
    return line


def recompute_text(mx: dict) -> str:
    """The recompute mode with what it reruns (``selective(mla_up_proj+moe_act)``, ``full(block 5)``)."""
    if "recompute_modules" in mx:
        return f"{mx['recompute']}({'+'.join(mx['recompute_modules']) or 'nothing'})"
    if "recompute_method" in mx:
        return f"{mx['recompute']}({mx['recompute_method']} {mx['recompute_num_layers']})"
    return mx["recompute"]


def precision_text(mx: dict) -> str:
    """The training precision; under FP8 its recipe, what the linear GEMMs run at and the blocks
    kept in BF16 (``parsim.results.metrics.precision_detail``)."""
    p = mx.get("precision", "?")
    if "fp8_recipe" not in mx:
        return p
    kept = mx.get("bf16_layers") or {}
    ends = ", ".join(f"{k} {v}" for k, v in kept.items() if v)
    return (f"{p}, recipe {mx['fp8_recipe']}: linear GEMMs {mx['linear_gemm_precision']} (attention, router, "
            f"LM head 16-bit)" + (f"; blocks kept bf16: {ends}" if ends else ""))


def format_summary(mx: dict) -> str:
    par = mx["parallel"]
    T = mx["step_time_s"] or 1.0
    lines = [
        f"{mx['name']}: {mx['model']} on {gpus_text(mx['world_size'], mx.get('gpus_per_node'), mx['hardware'])}",
        f"  {parallel_text(par)}; {mx['schedule']}, {mx['n_microbatches']} microbatches of {mx['microbatch_size']}, "
        f"recompute={recompute_text(mx)}",
        f"  batch             {mx['global_batch']:,} sequences x {mx['seq_len']:,} tokens = "
        f"{fmt_n(mx['tokens_per_step'])} tokens per step",
        f"  params            {fmt_n(mx['params'])}" + (f"  (active {fmt_n(mx['active_params'])})" if "active_params" in mx else ""),
        f"  precision         {precision_text(mx)}",
        f"  step time         {fmt_s(mx['step_time_s'])}",
        f"  throughput        {fmt_n(mx['tokens_per_s'])} tokens/s, {sig3(mx['tflops_per_gpu'])} TFLOP/s per GPU "
        f"(MFU {pct(mx['mfu'])}, HFU {pct(mx['hfu'])})",
        f"  pipeline bubble   {pct(mx['bubble_fraction'])} of the step (bubble_fraction: fill, drain, p2p waits = bubble + pp_comm below)",
        f"  idle              {pct(mx['idle_fraction'])} of the step (idle_fraction: the bubble + exposed dp communication)",
        f"  exposed comm      {fmt_s(mx['exposed_comm_s'])}  "
        + "  ".join(f"{k}={fmt_s(v)}" for k, v in mx["exposed_comm_by_axis_s"].items() if v > 0),
    ]
    cc = mx.get("compute_clock")
    if cc and (cc["saturated_ratio"] < 1.0 or cc["slowest_chip_share"] < 1.0):
        lines.append(f"  compute clock     {cc['saturated_ratio']:.3f} of the burst at the power limit"
                     + (f" x {cc['slowest_chip_share']:.3f}, the slowest of {cc['paced_gpus']:,} chips"
                        if cc["slowest_chip_share"] < 1.0 else "")
                     + " (compute-bound kernels; memory-bound work keeps HBM's clock)")
    if "step_time_p50_s" in mx:  # --samples (parsim.uncertainty.band)
        rel = {k: f"{100 * (mx[f'step_time_{k}_s'] / T - 1):+.2f}%" for k in ("p5", "p50", "p95")}
        lines.append(f"  90% band          step time P5 {rel['p5']}, P50 {rel['p50']}, P95 {rel['p95']} of the point; "
                     f"{fmt_n(mx['tokens_per_s_p5'])} .. {fmt_n(mx['tokens_per_s_p95'])} tokens/s "
                     f"({mx['samples']} samples, seed {mx['seed']}"
                     + (f"; model discrepancy sigma {mx['spread_model']:.3f} included" if mx.get("spread_model") else "")
                     + ")")
    if "pace_setter" in mx:  # [stragglers] (parsim.results.pace)
        ps = mx["pace_setter"]
        lines.append(f"  pace set by       pipeline rank {ps['rank']} of replica {ps['replica']} (GPUs "
                     f"{', '.join(map(str, ps['gpus']))}; slowdown {sig3(ps['slowdown'])}): busy {fmt_s(ps['busy_s'])}, "
                     f"{sig3(ps['busy_over_median'])}x the median rank")
    if "token_slice_lengths" in mx:
        ls = mx["token_slice_lengths"]
        shown = ", ".join(str(x) for x in ls) if len(ls) <= 12 else f"{ls[0]}, {ls[1]}, ..., {ls[-1]}"
        lines.append(f"  token slices      {len(ls)} per sequence (TeraPipe): {shown} tokens")
    if "ampnet" in mx:
        a = mx["ampnet"]
        lines.append(f"  AMPNet            max_in_flight={a['max_in_flight']} update_every={a['update_every']}: steady "
                     f"state {fmt_s(a['steady_state_step_s'])} per step ({fmt_n(a['steady_state_tokens_per_s'])} "
                     f"tokens/s); staleness per stage (mode) {a['staleness_steps']}")
    if "pipedream_rr" in mx:
        d = mx["pipedream_rr"]
        lines.append(f"  PipeDream         {d['config']} (layers {d['stage_layers']}), no flush: steady state "
                     f"{fmt_s(d['steady_state_step_s'])} per step ({fmt_n(d['steady_state_tokens_per_s'])} tokens/s); "
                     f"staleness {d['staleness_steps']}, weight versions {d['weight_versions']}")
    if "time_to_train_s" in mx:
        lines.append(budget_line(mx))
    fit = "fits" if mx["fits_in_memory"] else (
        f"DOES NOT FIT: rank {mx['oom']['rank']} over by {fmt_b(mx['oom']['over_by_bytes'])}")
    lines.append(f"  peak memory       {fmt_b(mx['peak_memory_bytes'])} of {fmt_b(mx['memory_capacity_bytes'])} usable: {fit}")
    if mx.get("tier_time_s"):  # [offload]: what the host and NVMe tiers hold and how long they work
        busy = ", ".join(f"{k} {fmt_s(v)}" for k, v in mx["tier_time_s"].items())
        lines.append(f"  offload tiers     host {fmt_b(mx['host_memory_bytes_per_node'])}/node, "
                     f"NVMe {fmt_b(mx['nvme_bytes_per_node'])}/node; busy: {busy}")
    lines += ["", "  step time breakdown (mean pipeline rank):"]
    rows = [[k, fmt_s(v), pct(v / T)] for k, v in mx["breakdown_s"].items() if v > 0]
    lines += ["    " + ln for ln in table(rows, ["part", "time", "share"]).splitlines()]
    lines += ["", "  per pipeline rank:"]
    rows = [[s["rank"], s["layers"], fmt_s(s["busy_s"]), pct(s["bubble_fraction"]), pct(s["idle_fraction"]),
             fmt_b(s["peak_memory_bytes"]), *(fmt_b(s["memory"][k]) for k in ("params", "grads", "optimizer", "activations"))]
            for s in mx["stages"]]
    heads = ["rank", "layers", "busy", "bubble", "idle", "peak memory", "params", "grads", "optimizer", "activations"]
    lines += ["    " + ln for ln in table(rows, heads, align=["right"] * len(heads)).splitlines()]
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
