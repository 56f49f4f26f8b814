"""What-if capacity planning: "what should I run on N GPUs?"

Enumerate legal configurations (parsim.plan.prescreen), pre-screen all of them
analytically with the simulator's own per-stage costs and memory rules, then confirm
the best ``confirm`` of them with the event simulation (parsim.simulate) through
parsim.plan.sweep (process pool or dask; resumable results file) and rank them by the
objective. Every pruned family keeps the reason it was pruned; the winner gets an
explanation against the runner-up (bubble, exposed communication, memory headroom).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field

from parsim.config.scenario import split_recompute
from parsim.plan.prescreen import Estimate, prescreen
from parsim.plan.space import Candidate, PlanSpec, enumerate_candidates, make_scenario
from parsim.plan.sweep import Progress, run_sweep
from parsim.results.result import json_safe
from parsim.results.summary import (
    fmt_b,
    fmt_n,
    fmt_s,
    gpus_text,
    pct,
    sig3,
    table,
    training_budget,
)

OBJECTIVES = ("time", "mfu", "cost")


@dataclass
class PlanResult:
    """Everything ``parsim plan`` reports."""

    spec: PlanSpec
    objective: str
    rows: list[dict]
    """Confirmed configurations that fit, best first (the --json list)."""
    families: list[dict]
    """Per (tp, pp, cp) family: status, best pre-screen time or why it was rejected."""
    explanation: list[str]
    """Why the winner wins (sentences)."""
    n_candidates: int = 0
    n_fit: int = 0
    n_simulated: int = 0
    timings_s: dict = field(default_factory=dict)


def spec_digest(spec: PlanSpec) -> str:
    """Short hash of everything but the search space: results files are keyed with it."""
    d = {"model": asdict(spec.model), "hw": spec.hardware.name, "gb": spec.global_batch,
         "seq": spec.seq_len, "prec": spec.precision, "opt": spec.optimizer, "overlap": asdict(spec.overlap)}
    if not spec.flash_attention or spec.dropout is not None:  # absent keeps the digests of older results files
        d.update(flash=spec.flash_attention, dropout=spec.dropout)
    return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:10]


def score(metrics: dict, objective: str) -> float:
    """Lower is better: step time, -MFU, or GPU-seconds per token."""
    if objective == "mfu":
        return -metrics["mfu"]
    if objective == "cost":
        return metrics["world_size"] / max(metrics["tokens_per_s"], 1e-9)
    return metrics["step_time_s"]


def _estimate_score(e: Estimate, objective: str, spec: PlanSpec) -> float:
    if objective == "cost":
        return e.step_time_s * e.cand.world
    if objective == "mfu":
        return e.step_time_s * e.cand.world  # MFU is inversely proportional to T * world
    return e.step_time_s


def simulate_candidate(payload: tuple[PlanSpec, Candidate]) -> dict:
    """Sweep job: the event simulation of one candidate -> its metrics (JSON-safe)."""
    from parsim.simulate import simulate
    spec, cand = payload
    res = simulate(make_scenario(spec, cand))
    return {"candidate": asdict(cand), "metrics": json_safe(res.to_json())}


def run_plan(spec: PlanSpec, objective: str = "time", top: int = 10, confirm: int | None = None, *,
             executor: str = "local", workers: int | None = None, scheduler: str | None = None,
             results: str | None = None, progress: bool | None = None,
             connect_timeout: float = 10.0, train_tokens: float | None = None,
             gpu_hour_price: float | None = None) -> PlanResult:
    """``train_tokens`` (and ``gpu_hour_price``): every row gets ``time_to_train_s``, ``gpu_hours``
    (and ``cost``) of that token budget (``parsim.results.summary.training_budget``)."""
    t0 = time.perf_counter()
    cands, rejected = enumerate_candidates(spec)
    t1 = time.perf_counter()
    bar = Progress(len(cands), "pre-screen", progress)
    est, rej2 = prescreen(spec, cands, bar)
    bar.close()
    t2 = time.perf_counter()
    for reason, fams in rej2.items():
        rejected.setdefault(reason, []).extend(fams)
    fit = sorted((e for e in est if e.fits), key=lambda e: (_estimate_score(e, objective, spec), e.peak_memory_bytes))
    n_confirm = confirm if confirm is not None else max(2 * top, 8)
    chosen = fit[:n_confirm]
    digest = spec_digest(spec)
    jobs = [(f"{digest}:{e.cand.key()}", (spec, e.cand)) for e in chosen]
    recs = run_sweep(jobs, simulate_candidate, results=results, executor=executor, workers=workers,
                     scheduler=scheduler, progress=progress, label="simulating", connect_timeout=connect_timeout)
    t3 = time.perf_counter()
    by_key = {e.cand.key(): e for e in chosen}
    rows = []
    for key, _ in jobs:
        rec = recs.get(key, {})
        if "metrics" not in rec:
            continue
        mx = rec["metrics"]
        if not mx.get("fits_in_memory"):
            continue
        e = by_key[key.split(":", 1)[1]]
        rows.append(_row(e, mx))
    rows.sort(key=lambda r: (score(r, objective), r["peak_memory_bytes"]))
    for i, r in enumerate(rows):
        r["rank"] = i + 1
        if train_tokens is not None:
            r.update(training_budget(r, train_tokens, gpu_hour_price))
    families = _families(est, rejected, rows, objective, spec)
    res = PlanResult(spec, objective, rows[:top], families, _explain(rows, est, spec),
                     n_candidates=len(cands) + sum(n for v in rejected.values() for _, n in v),
                     n_fit=len(fit), n_simulated=len(jobs))
    res.timings_s = {"enumerate": t1 - t0, "prescreen": t2 - t1, "simulate": t3 - t2, "total": t3 - t0,
                     "prescreened": len(est)}
    return res


def _row(e: Estimate, mx: dict) -> dict:
    c = e.cand
    row = {"rank": 0, "key": c.key(), "parallel": c.parallel_dict(), "schedule": c.schedule,
           "recompute": c.recompute, "microbatch_size": c.microbatch_size}
    row.update({k: v for k, v in mx.items() if k not in row})
    row["prescreen_step_time_s"] = e.step_time_s
    row["prescreen_peak_memory_bytes"] = e.peak_memory_bytes
    row["memory_headroom_bytes"] = mx["memory_capacity_bytes"] - mx["peak_memory_bytes"]
    row["gpu_hours_per_million_tokens"] = mx["world_size"] / 3600 / max(mx["tokens_per_s"], 1e-9) * 1e6
    return row


def _families(est: list[Estimate], rejected: dict, rows: list[dict], objective: str, spec: PlanSpec) -> list[dict]:
    fams: dict[str, dict] = {}
    for reason, items in rejected.items():
        for fam, n in items:
            f = fams.setdefault(fam, {"family": fam, "candidates": 0, "fit": 0, "reasons": {}})
            f["candidates"] += n
            f["reasons"][reason] = f["reasons"].get(reason, 0) + n
    best: dict[str, Estimate] = {}
    worst_mem: dict[str, Estimate] = {}
    for e in est:
        fam = e.cand.family()
        f = fams.setdefault(fam, {"family": fam, "candidates": 0, "fit": 0, "reasons": {}})
        f["candidates"] += 1
        if e.fits:
            f["fit"] += 1
            if fam not in best or _estimate_score(e, objective, spec) < _estimate_score(best[fam], objective, spec):
                best[fam] = e
        elif fam not in worst_mem or e.peak_memory_bytes < worst_mem[fam].peak_memory_bytes:
            worst_mem[fam] = e
    winner = rows[0] if rows else None
    win_fam = None
    if winner:
        p = winner["parallel"]
        win_fam = f"tp{p['tp']} pp{p['pp']} cp{p['cp']}" + (f" ep{p['ep']}" if p["ep"] > 1 else "")
    cap = spec.hardware.device.usable_memory_bytes
    sim_best: dict[str, dict] = {}
    for r in rows:
        p = r["parallel"]
        fam = f"tp{p['tp']} pp{p['pp']} cp{p['cp']}" + (f" ep{p['ep']}" if p["ep"] > 1 else "")
        sim_best.setdefault(fam, r)  # rows are best first
    out = []
    for fam, f in fams.items():
        if fam == win_fam:
            f["status"] = "winner"
            f["why"] = f"{winner['key']}: {fmt_s(winner['step_time_s'])} per step (simulated)"
        elif fam in sim_best:
            r = sim_best[fam]
            f["status"] = "slower"
            f["best_prescreen_step_time_s"] = r["prescreen_step_time_s"]
            f["sort_s"] = r["step_time_s"]
            f["why"] = (f"best {r['key']}: {fmt_s(r['step_time_s'])} simulated "
                        f"({r['step_time_s'] / winner['step_time_s'] - 1:+.1%} vs the winner)")
        elif fam in best:
            e = best[fam]
            f["status"] = "slower"
            f["best_prescreen_step_time_s"] = e.step_time_s
            f["sort_s"] = 1e9 + e.step_time_s  # after the simulated ones
            ref = winner["prescreen_step_time_s"] if winner else e.step_time_s
            f["why"] = (f"best {e.cand.key()}: {fmt_s(e.step_time_s)} pre-screened "
                        f"({e.step_time_s / ref - 1:+.1%} vs the winner's pre-screen; not simulated)")
        elif fam in worst_mem:
            e = worst_mem[fam]
            f["status"] = "out of memory"
            f["why"] = (f"does not fit: smallest peak {fmt_b(e.peak_memory_bytes)} > {fmt_b(cap)} usable "
                        f"({e.cand.key()})")
        else:
            f["status"] = "illegal"
            f["why"] = "; ".join(f"{r} ({n})" for r, n in sorted(f["reasons"].items(), key=lambda kv: -kv[1])[:2])
        out.append(f)
    order = {"winner": 0, "slower": 1, "out of memory": 2, "illegal": 3}
    out.sort(key=lambda f: (order[f["status"]], f.get("sort_s", 0.0), f["family"]))
    return out


def _explain(rows: list[dict], est: list[Estimate], spec: PlanSpec) -> list[str]:
    if not rows:
        return ["No configuration fits in memory; see the rejected families."]
    w = rows[0]
    T = w["step_time_s"]
    b = w["breakdown_s"]
    axes = ", ".join(f"{k} {fmt_s(v)}" for k, v in w["exposed_comm_by_axis_s"].items() if v > 0) or "none"
    lines = [
        f"Winner {w['key']}: {fmt_s(T)} per step, {w['tokens_per_s']:,.0f} tokens/s, MFU {pct(w['mfu'])}."
        + (f" {fmt_s(w['time_to_train_s'])} and {fmt_n(w['gpu_hours'])} GPU-hours for {fmt_n(w['train_tokens'])} tokens"
           + (f" (cost {fmt_n(w['cost'])})" if "cost" in w else "") + "." if "time_to_train_s" in w else ""),
        f"Pipeline bubble {pct(w['bubble_fraction'])} of the step, idle {pct(w['idle_fraction'])} with exposed dp "
        f"communication; "
        f"exposed communication {fmt_s(w['exposed_comm_s'])} ({w['exposed_comm_s'] / T:.1%}: {axes}); "
        f"compute {fmt_s(b['compute'])}, recompute {fmt_s(b['recompute'])}.",
        f"Memory: peak {fmt_b(w['peak_memory_bytes'])} of {fmt_b(w['memory_capacity_bytes'])} usable, "
        f"headroom {fmt_b(w['memory_headroom_bytes'])}.",
    ]
    if len(rows) > 1:
        r = rows[1]
        diffs = []
        for label, k in (("bubble", "bubble"), ("compute", "compute"), ("recompute", "recompute"),
                         ("dp comm", "dp_comm"), ("pp comm", "pp_comm"), ("tp comm", "tp_comm"),
                         ("cp comm", "cp_comm"), ("optimizer", "optimizer")):
            d = r["breakdown_s"][k] - b[k]
            if abs(d) > 1e-3 * T:
                diffs.append((abs(d), f"{label} {'+' if d > 0 else '-'}{fmt_s(abs(d))}"))
        diffs.sort(reverse=True)
        lines.append(f"Runner-up {r['key']} is {r['step_time_s'] / T - 1:+.1%} slower; its step differs by "
                     + (", ".join(t for _, t in diffs[:3]) or "little") + ".")
    return lines


# ---------------------------------------------------------------------------- output

COLUMNS = ("rank", "dp", "tp", "pp", "cp", "ep", "vpp", "zero", "mbs", "schedule", "recompute",
           "step_time_s", "tokens_per_s", "mfu", "bubble_fraction", "idle_fraction", "exposed_comm_s",
           "peak_memory_GiB", "headroom_GiB", "fits_in_memory")
BUDGET_COLUMNS = ("time_to_train_s", "gpu_hours", "cost")
"""Added when the plan was given a token budget (``--train-tokens``; cost with ``--gpu-hour-price``)."""


def flat_row(r: dict) -> dict:
    p = r["parallel"]
    out = {"rank": r["rank"], **{k: p[k] for k in ("dp", "tp", "pp", "cp", "ep", "vpp", "zero")},
           "mbs": r["microbatch_size"], "schedule": r["schedule"], "recompute": r["recompute"],
           "step_time_s": round(r["step_time_s"], 4), "tokens_per_s": round(r["tokens_per_s"]),
           "mfu": round(r["mfu"], 4), "bubble_fraction": round(r["bubble_fraction"], 4),
           "idle_fraction": round(r["idle_fraction"], 4), "exposed_comm_s": round(r["exposed_comm_s"], 4),
           "peak_memory_GiB": round(r["peak_memory_bytes"] / 2**30, 2),
           "headroom_GiB": round(r["memory_headroom_bytes"] / 2**30, 2), "fits_in_memory": r["fits_in_memory"]}
    for k in BUDGET_COLUMNS:
        if k in r:
            out[k] = round(r[k], 1)
    return out


def _columns(res: PlanResult) -> tuple[str, ...]:
    extra = tuple(k for k in BUDGET_COLUMNS if res.rows and k in res.rows[0])
    return COLUMNS + extra


def to_csv(res: PlanResult) -> str:
    cols = _columns(res)
    lines = [",".join(cols)]
    for r in res.rows:
        fr = flat_row(r)
        lines.append(",".join(str(fr[c]) for c in cols))
    return "\n".join(lines) + "\n"


def to_json(res: PlanResult) -> list[dict]:
    return json_safe(res.rows)


def _header(res: PlanResult) -> str:
    s = res.spec
    return (f"{s.model.name} on {gpus_text(s.gpus, s.hardware.gpus_per_node, s.hardware.name)}, global batch "
            f"{s.global_batch:,} x seq {s.seq_len:,} = {s.global_batch * s.seq_len:,} tokens per step "
            f"({s.precision}); objective: {res.objective}")


def _human_rows(res: PlanResult) -> tuple[list[str], list[list[str]]]:
    """The ranked rows for people: three significant digits, one unit per column."""
    heads = ["#", "dp", "tp", "pp", "cp", "ep", "vpp", "zero", "mbs", "schedule", "recompute", "step (s)",
             "tokens/s", "MFU", "bubble", "idle", "exp. comm (s)", "peak (GiB)", "free (GiB)"]
    budget = res.rows and "time_to_train_s" in res.rows[0]
    if budget:
        heads += ["train (days)", "GPU-hours"] + (["cost"] if "cost" in res.rows[0] else [])
    rows = []
    for r in res.rows:
        p = r["parallel"]
        row = [r["rank"], *(p[k] for k in ("dp", "tp", "pp", "cp", "ep", "vpp", "zero")), r["microbatch_size"],
               r["schedule"], r["recompute"], sig3(r["step_time_s"]), f"{r['tokens_per_s']:,.0f}", pct(r["mfu"]),
               pct(r["bubble_fraction"]), pct(r["idle_fraction"]), sig3(r["exposed_comm_s"]),
               sig3(r["peak_memory_bytes"] / 2**30), sig3(r["memory_headroom_bytes"] / 2**30)]
        if budget:
            row += [sig3(r["time_to_train_s"] / 86400), f"{r['gpu_hours']:,.0f}"] + (
                [f"{r['cost']:,.0f}"] if "cost" in r else [])
        rows.append(row)
    return heads, rows


def _stated_overlap(spec: PlanSpec) -> dict:
    """The plan's ``[overlap]`` keys that are set (an unset one is left to the framework)."""
    return {k: v for k, v in asdict(spec.overlap).items() if v is not None}


def _overlap_text(spec: PlanSpec) -> str:
    return ", ".join(f"{k} = {str(v).lower()}" for k, v in _stated_overlap(spec).items())


def to_table(res: PlanResult) -> str:
    t = res.timings_s
    head = [_header(res),
            f"{res.n_candidates} configurations enumerated, {t.get('prescreened', 0)} pre-screened in "
            f"{t.get('prescreen', 0):.1f} s, {res.n_fit} fit in memory, top {res.n_simulated} confirmed by "
            f"simulation in {t.get('simulate', 0):.1f} s", ""]
    heads, rows = _human_rows(res)
    fam = ["", "families (tp, pp, cp):"]
    fam += ["  " + ln for ln in table([[f["family"], f["status"], f["why"]] for f in res.families[:25]],
                                      ["family", "status", "why"], align=["left"] * 3).splitlines()]
    if len(res.families) > 25:
        fam.append(f"  ... {len(res.families) - 25} more (see --format md)")
    return "\n".join(head + table(rows, heads).splitlines() + ["", *res.explanation] + fam)


def to_markdown(res: PlanResult, command: str | None = None, context: list[str] | None = None) -> str:
    """plan.md; ``context``: lines stated under the title (the parsim version, the measured fidelity)."""
    t = res.timings_s
    s = res.spec
    out = [f"# parsim plan: {s.model.name} on {gpus_text(s.gpus, s.hardware.gpus_per_node, s.hardware.name)}", "",
           _header(res) + ".", ""]
    for line in context or []:
        out += [line, ""]
    if command:
        out += ["Generated by:", "", "```bash", command, "```", ""]
    heads, rows = _human_rows(res)
    out += [f"{res.n_candidates} configurations enumerated; {t.get('prescreened', 0)} pre-screened analytically "
            f"in {t.get('prescreen', 0):.1f} s; {res.n_fit} fit in memory; the best {res.n_simulated} were "
            f"confirmed by the event simulation ({t.get('simulate', 0):.1f} s). Overlap settings: "
            f"{_overlap_text(s)}.", "", "## Ranked configurations (simulated)", "",
            table(rows, heads, markdown=True)]
    out += ["", "## Why the winner wins", ""] + [f"- {x}" for x in res.explanation]
    out += ["", "## Families (tp, pp, cp) and why the others lost or were rejected", "",
            table([[f["family"], f["candidates"], f["fit"], f["status"], f["why"]] for f in res.families],
                  ["family", "candidates", "fit", "status", "why"], markdown=True,
                  align=["left", "right", "right", "left", "left"])]
    return "\n".join(out) + "\n"


def _recompute_keys(mode: str) -> str:
    """``recompute`` (and ``recompute_modules`` for a ``selective:a+b`` mode) as TOML lines."""
    recompute, modules = split_recompute(mode)
    lines = f'recompute = "{recompute}"'
    if modules is not None:
        lines += "\nrecompute_modules = [" + ", ".join(f'"{m}"' for m in modules) + "]"
    return lines


def scenario_toml(spec: PlanSpec, row: dict) -> str:
    """A scenario file reproducing a plan row (``parsim simulate`` it)."""
    p = row["parallel"]
    model = f'preset = "{spec.model_ref}"' if "/" not in spec.model_ref and not spec.model_ref.endswith(".json") \
        else f'hf_config = "{spec.model_ref}"'
    ov = _stated_overlap(spec)
    return f"""name = "{spec.model.name}-plan-{row['key']}"
hardware = "{spec.hardware.name}"
gpus = {row['world_size']}

[model]
{model}

[training]
global_batch = {spec.global_batch}
seq_len = {spec.seq_len}
microbatch_size = {row['microbatch_size']}
precision = "{spec.precision}"
optimizer = "{spec.optimizer}"
{_recompute_keys(row['recompute'])}
{_attention_keys(spec.flash_attention, spec.dropout)}
[parallel]
dp = {p['dp']}
tp = {p['tp']}
pp = {p['pp']}
cp = {p['cp']}
ep = {p['ep']}
vpp = {p['vpp']}
zero = {p['zero']}
sequence_parallel = {str(p['sequence_parallel']).lower()}

[schedule]
name = "{row['schedule']}"

[overlap]
""" + "\n".join(f"{k} = {str(v).lower()}" for k, v in ov.items()) + "\n"


def _attention_keys(flash_attention: bool, dropout: bool | None) -> str:
    """The ``[training]`` lines of a non-default attention setting (each ending in a newline)."""
    return (("" if flash_attention else "flash_attention = false\n")
            + ("" if dropout is None else f"dropout = {str(dropout).lower()}\n"))
