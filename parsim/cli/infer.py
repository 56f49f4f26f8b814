"""`parsim infer SCENARIO`: prefill and decode of the scenario's ``[inference]`` table.

``--json`` prints one object (``prefill_s``, ``decode_s_per_token``, ``generate_tokens_per_s``,
``kv_cache_bytes``, ``max_batch``, ``fits_in_memory``, ...); ``--timeline`` writes the span
rows (CSV), ``--trace`` a Chrome/Perfetto trace, ``--plot`` a Gantt chart.
"""
from __future__ import annotations

import json
import os
import sys

from parsim.cli.common import STDOUT, atomic_write, out_files


def register(sub) -> None:
    p = sub.add_parser("infer", help="predict prefill, per-token decode and tokens/s of an [inference] scenario",
                       description="Generation of the scenario's [inference] table (batch, prompt_tokens, "
                                   "generate_tokens, precision, weight_bits, kv_cache) on its model, hardware and "
                                   "parallel tables; [offload] params = \"cpu\"|\"nvme\" streams the weights "
                                   "(ZeRO-Inference).",
                       epilog="example: parsim infer scenarios/inference/opt-30b-zero-inference-v100.toml")
    p.add_argument("scenario", help="scenario TOML file with an [inference] table")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a scenario key (repeatable), e.g. --set inference.batch=64")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    p.add_argument("--timeline", metavar="FILE", help="write the span rows as CSV ('-': stdout)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace ('-': stdout)")
    p.add_argument("--plot", metavar="FILE", help="write a Gantt chart (PNG)")
    p.set_defaults(func=cmd_infer)


def _trace(tl, path: str) -> None:
    events = [{"name": r.op, "cat": r.stream, "ph": "X", "pid": int(r.rank), "tid": r.stream,
               "ts": r.start_s * 1e6, "dur": (r.end_s - r.start_s) * 1e6,
               "args": {"token": int(r.microbatch), "bytes": float(r.bytes)}} for r in tl.itertuples()]
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


def _plot(tl, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted({(int(r), s) for r, s in zip(tl["rank"], tl["stream"])})
    colors = {"PREFILL": "tab:red", "DECODE": "tab:blue", "FETCH": "tab:orange", "ALL_GATHER": "tab:green",
              "SEND_F": "tab:gray"}
    fig, ax = plt.subplots(figsize=(12, 0.5 + 0.4 * len(rows)))
    for i, key in enumerate(rows):
        part = tl[(tl["rank"] == key[0]) & (tl["stream"] == key[1])]
        ax.broken_barh(list(zip(part["start_s"], part["end_s"] - part["start_s"])), (i - 0.4, 0.8),
                       facecolors=[colors.get(o, "tab:purple") for o in part["op"]])
    ax.set_yticks(range(len(rows)), [f"stage {r} {s}" for r, s in rows])
    ax.set_xlabel("seconds")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def summary(mx: dict) -> str:
    from parsim.results.summary import fmt_b, fmt_n, fmt_s, sig3

    par = mx["parallel"]
    lines = [f"{mx['name']}: {mx['model']} ({fmt_n(mx['params'])} params) on {mx['world_size']} GPU"
             f"{'s' * (mx['world_size'] > 1)} of {mx['hardware']}",
             f"  dp={par['dp']} tp={par['tp']} pp={par['pp']}; batch {mx['batch']} per replica, prompt "
             f"{mx['prompt_tokens']} + {mx['generate_tokens']} new tokens, {mx['precision']}, "
             f"{mx['weight_bits']}-bit weights on {mx['weights']}, KV cache on {mx['kv_cache']}"
             + (f"; engine {mx['engine']}" if mx.get("engine", "fused") != "fused" else ""),
             f"  prefill           {fmt_s(mx['prefill_s'])}",
             f"  decode            {fmt_s(mx['decode_s_per_token'])} per token (step of the whole batch)",
             f"  generation        {sig3(mx['generate_tokens_per_s'])} tokens/s "
             f"({sig3(mx['generate_tokens_per_s_per_gpu'])} per GPU), {fmt_s(mx['total_s'])} in all",
             f"  memory per GPU    weights {fmt_b(mx['weight_bytes_per_gpu'])}, KV cache "
             f"{fmt_b(mx['kv_cache_bytes'])}, peak {fmt_b(mx['peak_memory_bytes'])} of "
             f"{fmt_b(mx['memory_capacity_bytes'])}: {'fits' if mx['fits_in_memory'] else 'DOES NOT FIT'}",
             f"  largest batch     {mx['max_batch']} sequences per replica"]
    if mx["host_memory_bytes_per_node"] or mx["nvme_bytes_per_node"]:
        lines.append(f"  offload tiers     host {fmt_b(mx['host_memory_bytes_per_node'])}, NVMe "
                     f"{fmt_b(mx['nvme_bytes_per_node'])} per node; busy: "
                     + ", ".join(f"{k} {fmt_s(v)}" for k, v in mx["stream_busy_s"].items()))
    return "\n".join(lines)


def cmd_infer(args) -> int:
    from parsim.infer import load_inference, run_inference
    from parsim.results.summary import json_safe

    outputs = out_files("parsim infer", {"--timeline": args.timeline, "--trace": args.trace,  # before any work
                                         "--plot": args.plot})
    job = load_inference(args.scenario, args.set)
    mx, tl = run_inference(job)
    human = sys.stderr if STDOUT in outputs else sys.stdout
    print(json.dumps(json_safe(mx), indent=1) if args.json else summary(mx), file=human)
    if args.timeline:
        atomic_write(args.timeline, lambda tmp: tl.to_csv(tmp, index=False))
    if args.trace:
        atomic_write(args.trace, lambda tmp: _trace(tl, tmp))
    if args.plot:
        def png(tmp):
            _plot(tl, tmp + ".png", job.scenario.name)
            os.replace(tmp + ".png", tmp)
        atomic_write(args.plot, png)
    return 0
