"""A readable summary of a result's metrics, and JSON-safe values."""
from __future__ import annotations

import math

from parsim.units import fmt_bytes, fmt_count, fmt_seconds


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
