"""The gloo validation with 4 and 8 ranks on a machine that has the cores for them (the GPU
machine's 16: no rank shares a core, unlike this project's 2-core VM, where such cases are
oversubscribed and only reported).

    python benchmarks/gpu/gloo_many_cores.py --out DIR [--budget-s 420] [--quick]

The procedure is ``benchmarks/validate_gloo.py``'s (its functions run it): one ``parsim calibrate
--backend gloo --ranks 4`` (microbenchmarks only; no case below is used by the fit), then every
case launched round-robin until ``--budget-s`` is spent, each launch fresh processes; per case the
median over all measured steps against the prediction. Cases: every registered schedule at pp 4
on tiny-cpu (8 layers, 8 microbatches), data parallelism 2 with and without ZeRO-1, tensor
parallelism 2 under pipelining, and at 8 ranks pp 8, pp 4 x dp 2 and pp 2 x tp 2 x dp 2. Writes
``DIR/accuracy.md`` and ``DIR/accuracy.json`` (``validate_gloo.row_of`` rows, the per-launch
medians inside) and per-case reports under ``DIR/<case>/``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import validate_gloo as vg  # noqa: E402

from parsim.cli.validate import launch_once, plan_validation, result  # noqa: E402
from parsim.schedule.builders import BUILDERS  # noqa: E402
from parsim.validate.report import public, write_report  # noqa: E402

TINY = "scenarios/tiny-cpu.toml"
PP4 = ["gpus=4", "parallel.pp=4", "model.n_layers=8", "training.global_batch=16"]
PP8 = ["gpus=8", "parallel.pp=8", "model.n_layers=8", "training.global_batch=16"]


def cases() -> list[tuple[str, str, list[str]]]:
    """The 8-rank cases first (the first round is the one every case is sure to get), then every
    registered schedule at pp 4, then data and tensor parallelism on 4 ranks."""
    eight = [
        ("pp8-1f1b", TINY, PP8),
        ("pp4-dp2", TINY, ["gpus=8", "parallel.pp=4", "parallel.dp=2", "model.n_layers=8", "training.global_batch=32"]),
        ("pp2-tp2-dp2", TINY, ["gpus=8", "parallel.tp=2", "parallel.dp=2", "training.global_batch=16"]),
        ("pp8-gpipe", TINY, PP8 + ["schedule.name=GPipe"]),
    ]
    schedules = [("pp4-" + name.lower(), TINY, PP4 + [f"schedule.name={name}"]
                  + (["parallel.vpp=2"] if name == "Interleaved1F1B" else [])) for name in BUILDERS]
    four = [
        ("pp2-dp2", TINY, ["gpus=4", "parallel.dp=2", "training.global_batch=16"]),
        ("dp4", TINY, ["gpus=4", "parallel.pp=1", "parallel.dp=4", "training.global_batch=16"]),
        ("dp4-zero1", TINY, ["gpus=4", "parallel.pp=1", "parallel.dp=4", "parallel.zero=1", "training.global_batch=16"]),
        ("pp2-tp2", TINY, ["gpus=4", "parallel.tp=2"]),
    ]
    return eight + schedules + four


def summarise(dirs: list[Path]) -> str:
    """One table over several runs' ``accuracy.json`` (same calibrated profile): per case, each
    launch's median step, the median over the launches, and its error against the prediction."""
    import statistics
    per: dict[str, dict] = {}
    for d in dirs:
        for r in json.loads((d / "accuracy.json").read_text())["rows"]:
            if "error" in r and "predicted_step_s" not in r:
                continue
            c = per.setdefault(r["case"], {"schedule": r["schedule"], "world": r["world"], "pred": set(), "launches": []})
            c["pred"].add(round(r["predicted_step_s"], 9))
            c["launches"] += r["launch_medians_s"]
    lines = ["| case | schedule | ranks | predicted step (ms) | per-launch medians (ms) | median over launches (ms) "
             "| step error | within 15% |", "|---|---|---:|---:|---|---:|---:|---|"]
    errs = []
    for case, c in per.items():
        (pred,) = c["pred"]  # one profile, one prediction
        med = statistics.median(c["launches"])
        e = pred / med - 1
        errs.append(e)
        lines.append(f"| {case} | {c['schedule']} | {c['world']} | {pred * 1e3:.1f} | "
                     f"{', '.join(f'{t * 1e3:.1f}' for t in c['launches'])} | {med * 1e3:.1f} | {e:+.1%} | "
                     f"{'yes' if abs(e) <= 0.15 else 'no'} |")
    lines += ["", f"{sum(abs(e) <= 0.15 for e in errs)} of {len(errs)} cases within 15%; mean |error| "
              f"{statistics.fmean(abs(e) for e in errs):.1%}, median error {statistics.median(errs):+.1%}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--summarise", nargs="+", metavar="DIR", help="instead of running: one table over these runs' "
                    "accuracy.json (written to --out/summary.md)")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--passes", type=int, default=3,
                    help="calibration passes (4 ranks x 7 passes took 283 s on the H200 machine's cores)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--profile", default=None, help="a calibrated profile to use instead of calibrating")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if args.summarise:
        text = summarise([Path(d) for d in args.summarise])
        Path(args.out, "summary.md").write_text(text)
        print(text)
        return 0
    t_start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        profile = Path(args.profile)
    else:
        cmd = [sys.executable, "-m", "parsim", "calibrate", "--backend", "gloo", "--ranks", "4", "--out-dir", str(out)]
        cmd += ["--quick"] if args.quick else ["--passes", str(args.passes)]
        print("$", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True, cwd=ROOT)
        profile = out / "cpu-gloo.toml"
    print(f"calibrated in {time.monotonic() - t_start:.0f} s", flush=True)
    wanted = set(args.cases.split(",")) if args.cases else None
    runs, failed, launches = {}, {}, {}
    for case, scenario, overrides in cases():
        if wanted and case not in wanted:
            continue
        try:
            runs[case] = plan_validation(str(ROOT / scenario), overrides, "gloo", str(profile), steps=args.steps,
                                         warmup=2, timeout=300)
        except Exception as e:  # noqa: BLE001 -- a refused case is a row
            failed[case] = f"{type(e).__name__}: {e}"
    load_before = os.getloadavg()[0]
    k = 0
    import random
    order = random.Random(0)  # each round in its own order: a machine that drifts over the minutes
    names = list(runs)        # (seen on the 16-core VM) spreads over every case, not onto the last ones
    while time.monotonic() - t_start < args.budget_s and k < (1 if args.quick else 3):
        if k:
            order.shuffle(names)
        for case, run in ((c, runs[c]) for c in names):
            if case in failed or time.monotonic() - t_start > args.budget_s:
                continue
            t0 = time.monotonic()
            try:
                launch_once(run)
                launches[case] = launches.get(case, 0) + 1
            except Exception as e:  # noqa: BLE001
                failed[case] = f"{type(e).__name__}: {e}"
                continue
            print(f"launch {k + 1} {case:24s} world {run.world} ({time.monotonic() - t0:.1f} s)", flush=True)
        k += 1
    rows = [{"case": c, "error": e} for c, e in failed.items()]
    for case, run in runs.items():
        if case in failed or not launches.get(case):
            continue
        c = result(run)
        c["scenario"] = case
        write_report(c, out / case)
        rows.append(vg.row_of(case, c))
        r = rows[-1]
        print(f"{case:24s} ranks {r['world']} step {r['step_error']:+.1%} launches "
              f"{', '.join(f'{t * 1e3:.1f}' for t in r['launch_medians_s'])} ms", flush=True)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "profile": str(profile.name),
            "repeat": "up to 3", "steps": args.steps}
    text = vg.markdown(rows, meta).replace("this machine (gloo, CPU ranks)", f"{os.cpu_count()} cores (gloo, CPU ranks, 4 and 8 ranks)")
    text += (f"\n1-minute load average {load_before:.2f} before the launches, {os.getloadavg()[0]:.2f} after "
             "(a GPU benchmark ran beside them, pinned to other cores).\n")
    (out / "accuracy.md").write_text(text)
    (out / "accuracy.json").write_text(json.dumps({"rows": public({"r": rows})["r"], "launches": launches}, indent=1))
    print(f"wrote {out / 'accuracy.md'} ({time.monotonic() - t_start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
