"""Predicted vs measured on this machine: calibrate on microbenchmarks, then validate
scenarios the calibration never saw, on real torch.distributed (gloo) ranks.

    python benchmarks/validate_gloo.py [--out reports/validation] [--rounds 3] [--repeat 2]
                                       [--steps 6] [--profile P.toml] [--quick]

Everything below is one *round*; ``--rounds`` independent rounds are reported side by
side with, per case, the median error and how many rounds pass the gate: on this VM one
round is one draw from a noisy machine, not a verdict.

1. ``parsim calibrate --backend gloo --passes 21`` (unless ``--profile``): GEMM, streaming,
   attention, launch and p2p microbenchmarks with both ranks computing at once, in 21
   interleaved passes (~2 min), fitted into ``<out>/cpu-gloo.toml`` (+ the data CSV). This
   shared VM's speed drifts by +-10% and more from one minute to the next (the speed
   probe shows it); a long window calibrates the machine's typical speed, not a moment
   of it. No scenario below is run for the fit.
2. Every case is simulated with that profile and run for real ``--repeat`` times (fresh
   processes each, ``--steps`` measured steps after 2 warm-up steps), the launches taken
   round-robin over the cases so each case samples the whole run's window; the median
   over all its measured steps is compared with the prediction. A report per case
   (tables, both Gantt charts, device drift) goes to ``<out>/<case>/``.
3. ``<out>/accuracy.md`` (and ``accuracy.json``): per round, one row per case with step-time, per-rank
   busy-time, bubble and activation-memory errors, the launch-to-launch spread and
   whether the case meets the gate (step and busy time within 15%; activations within 5%).
   Cases with more ranks than cores are oversubscribed: reported, never gated.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.cli.validate import launch_once, plan_validation, result  # noqa: E402
from parsim.validate.report import public, write_report  # noqa: E402

STEP_GATE, BUSY_GATE, MEMORY_GATE = 0.15, 0.15, 0.05

# (case, scenario, overrides): held-out scenarios, none of them used by the calibration.
CASES = [
    ("tiny-cpu", "scenarios/tiny-cpu.toml", []),
    ("tiny-cpu-gpipe", "scenarios/tiny-cpu.toml", ["schedule.name=GPipe"]),
    ("tiny-cpu-interleaved", "scenarios/tiny-cpu.toml", ["schedule.name=Interleaved1F1B", "parallel.vpp=2"]),
    ("tiny-cpu-zbh1", "scenarios/tiny-cpu.toml", ["schedule.name=ZBH1"]),
    ("tiny-llama-cpu", "scenarios/tiny-llama-cpu.toml", []),
    ("tiny-cpu-pp4-oversubscribed", "scenarios/tiny-cpu.toml", ["gpus=4", "parallel.pp=4", "training.global_batch=16"]),
]


def calibrate(out: Path, quick: bool, passes: int) -> Path:
    cmd = [sys.executable, "-m", "parsim", "calibrate", "--backend", "gloo", "--out-dir", str(out)]
    cmd += ["--quick"] if quick else ["--passes", str(passes)]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)
    return out / "cpu-gloo.toml"


def row_of(case: str, c: dict) -> dict:
    e, m = c["relative_error"], c["measured"]
    gated = c["world"] <= (os.cpu_count() or 1)
    busy = [s["busy_s"] for s in e["stages"]]
    mem = [x for x in e["activation_bytes"] if x is not None]
    ok = (abs(e["step_time_s"]) <= STEP_GATE and all(abs(b) <= BUSY_GATE for b in busy)
          and all(abs(x) <= MEMORY_GATE for x in mem))
    launches = m.get("launch_step_time_s", [])
    d = c.get("device_drift") or {}
    return {"case": case, "schedule": c["schedule"], "model": c["model"], "world": c["world"],
            "predicted_step_s": c["predicted"]["step_time_s"], "measured_step_s": m["step_time_s"],
            "step_error": e["step_time_s"], "busy_errors": busy, "bubble_predicted": c["predicted"]["bubble_fraction"],
            "bubble_measured": m["bubble_fraction"], "activation_errors": mem,
            "launch_medians_s": launches, "steps": len(m["step_time_all_s"]),
            "gated": gated, "pass": ok if gated else None,
            "drift": None if not d else d["run_over_calibration"] - 1,
            "error_at_run_speed": None if not d else d["step_time_error_at_run_speed"]}


def markdown(rows: list[dict], meta: dict) -> str:
    pct = (lambda x: f"{x:+.1%}")
    lines = [
        "# Validation accuracy on this machine (gloo, CPU ranks)",
        "",
        f"On {meta['date']} ({meta['cpus']} CPUs; "
        f"profile `{meta['profile']}`, fitted on microbenchmarks only: no case below was used for the fit). "
        f"Each case: {meta['repeat']} launches x {meta['steps']} measured steps (after 2 warm-up steps), "
        "median over all of them. Error = (predicted - measured) / measured. Gate: step time and every "
        "rank's busy time within 15%, activation memory within 5%; oversubscribed cases (more ranks than "
        "cores) are reported, not gated. Device speed vs calibration: the speed probe (a GEMM timed between "
        "measured steps exactly as calibration timed it) during the run against at calibration; step error at "
        "run speed: the error had the prediction used that speed (a diagnostic of how much of the error is "
        "the VM's drift, not the gate).",
        "",
        "| case | schedule | ranks | predicted step (ms) | measured step (ms) | step error | busy error per rank "
        "| bubble pred / meas | activations error | per-launch medians (ms) | device speed vs calibration "
        "| step error at run speed | gate |",
        "|---|---|---:|---:|---:|---:|---|---|---|---|---:|---:|---|",
    ]
    failed = [r for r in rows if "error" in r]
    rows = [r for r in rows if "error" not in r]
    for r in rows:
        gate = "reported only" if not r["gated"] else ("pass" if r["pass"] else "FAIL")
        speed = "n/a" if r["drift"] is None else pct(1 / (1 + r["drift"]) - 1)  # probe time ratio -> speed
        lines.append(
            f"| {r['case']} | {r['schedule']} | {r['world']} | {r['predicted_step_s'] * 1e3:.1f} | "
            f"{r['measured_step_s'] * 1e3:.1f} | {pct(r['step_error'])} | "
            f"{', '.join(pct(b) for b in r['busy_errors'])} | {r['bubble_predicted']:.3f} / {r['bubble_measured']:.3f} | "
            f"{', '.join(pct(x) for x in r['activation_errors'])} | "
            f"{', '.join(f'{t * 1e3:.1f}' for t in r['launch_medians_s'])} | "
            f"{speed} | "
            f"{'n/a' if r['error_at_run_speed'] is None else pct(r['error_at_run_speed'])} | {gate} |")
    gated = [r for r in rows if r["gated"]]
    if gated:
        worst = max(abs(r["step_error"]) for r in gated)
        mean_abs = sum(abs(r["step_error"]) for r in gated) / len(gated)
        lines += ["", f"Gated cases: {sum(bool(r['pass']) for r in gated)} of {len(gated)} pass; step-time "
                  f"mean |error| {mean_abs:.1%}, worst {worst:.1%}."]
    for r in failed:
        lines.append(f"\nCase {r['case']} failed: {r['error']}")
    lines += ["", "Per-case reports (per-action durations, both Gantt charts, the calibrated profile and its data): "
              "the folders beside this file.", ""]
    return "\n".join(lines)


def one_round(args, out: Path, repeat: int, steps: int, write: bool) -> tuple[list[dict], str]:
    """Calibrate, then run every case ``repeat`` times round-robin; rows (+ reports if ``write``)."""
    wanted = set(args.cases.split(",")) if args.cases else None
    profile = Path(args.profile) if args.profile else calibrate(out, args.quick, args.passes)
    runs, failed = {}, {}
    for case, scenario, overrides in CASES:
        if not wanted or case in wanted:
            runs[case] = plan_validation(str(ROOT / scenario), overrides, "gloo", str(profile), steps=steps,
                                         warmup=2, timeout=600)
    for k in range(repeat):  # round-robin: each case's launches spread over the whole window
        for case, run in runs.items():
            if case in failed:
                continue
            t0 = time.monotonic()
            try:
                launch_once(run)
            except Exception as e:  # one failed case is a reported row, not a lost benchmark
                failed[case] = str(e)
                print(f"{case}: FAILED: {e}", flush=True)
                continue
            print(f"launch {k + 1}/{repeat} {case:30s} ({time.monotonic() - t0:.0f} s)", flush=True)
    rows = [{"case": case, "error": err} for case, err in failed.items()]
    for case, run in runs.items():
        if case in failed:
            continue
        c = result(run)
        c["scenario"] = case
        if write:
            write_report(c, out / case)
        row = row_of(case, c)
        rows.append(row)
        print(f"{case:30s} step {row['step_error']:+.1%}  busy {', '.join(f'{b:+.1%}' for b in row['busy_errors'])}"
              f"  launches {', '.join(f'{t * 1e3:.1f}' for t in row['launch_medians_s'])} ms", flush=True)
    shown = Path(args.profile or (out / "cpu-gloo.toml"))
    try:
        shown = shown.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return rows, str(shown)


def summary(rounds: list[list[dict]]) -> str:
    """Per case over the rounds: each round's step error and gate, the median, the pass count."""
    import statistics
    cases = [r["case"] for r in rounds[-1] if "error" not in r]
    lines = ["## Over all rounds", "",
             "| case | step error per round | median step error | median busy error (worst rank) "
             "| median step error at run speed | rounds passing the gate |", "|---|---|---:|---:|---:|---:|"]
    for case in cases:
        rs = [r for rnd in rounds for r in rnd if r.get("case") == case and "error" not in r]
        if not rs:
            continue
        steps = [r["step_error"] for r in rs]
        busy = [max(r["busy_errors"], key=abs) for r in rs]
        at_speed = [r["error_at_run_speed"] for r in rs if r.get("error_at_run_speed") is not None]
        gated = rs[0]["gated"]
        passing = f"{sum(bool(r['pass']) for r in rs)} of {len(rs)}" if gated else "reported only"
        lines.append(f"| {case} | {', '.join(f'{x:+.1%}' for x in steps)} | {statistics.median(steps):+.1%} | "
                     f"{statistics.median(busy):+.1%} | "
                     f"{'n/a' if not at_speed else f'{statistics.median(at_speed):+.1%}'} | {passing} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "validation"))
    ap.add_argument("--profile", default=None, help="use this calibrated profile instead of calibrating now")
    ap.add_argument("--rounds", type=int, default=3, help="independent rounds (calibration + all cases) to report")
    ap.add_argument("--repeat", type=int, default=2, help="launches per case per round")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--passes", type=int, default=21, help="calibration passes (parsim calibrate --passes)")
    ap.add_argument("--quick", action="store_true", help="quick calibration, 1 round of 1 launch x 2 steps (smoke test)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rounds_n, repeat, steps = (1, 1, 2) if args.quick else (args.rounds, args.repeat, args.steps)
    rounds, text = [], []
    for k in range(rounds_n):
        print(f"== round {k + 1}/{rounds_n}", flush=True)
        rows, shown = one_round(args, out, repeat, steps, write=k == rounds_n - 1)
        rounds.append(rows)
        meta = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "profile": shown,
                "repeat": repeat, "steps": steps}
        text.append(markdown(rows, meta).replace("# Validation accuracy on this machine (gloo, CPU ranks)",
                                                 f"## Round {k + 1} of {rounds_n}"))
    head = ("# Validation accuracy on this machine (gloo, CPU ranks)\n\n"
            f"`python benchmarks/validate_gloo.py`: {rounds_n} independent round(s), each a fresh calibration "
            "followed by every case. Per-case reports and the calibrated profile: the last round's.\n\n")
    (out / "accuracy.md").write_text(head + summary(rounds) + "\n" + "\n".join(text))
    (out / "accuracy.json").write_text(json.dumps({"rounds": public({"r": rounds})["r"]}, indent=1))
    print(f"wrote {out / 'accuracy.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
