"""Predicted vs measured for what the torch runtime newly runs: the schedules beyond the
synchronous single-copy ones (DualPipe, DualPipeV, Chimera, GPipeRemat, PipeDream,
PipeDream-2BW) and the parallel axes (data parallelism with the calibrated all-reduce and
ZeRO's reduce-scatter, tensor parallelism with and without sequence parallelism, context
parallelism, expert parallelism).

    python reports/validation/coverage.py [--rounds 3] [--repeat 2] [--steps 6] [--cases a,b]

The procedure is benchmarks/validate_gloo.py's (its functions run it): per round a fresh
``parsim calibrate`` (microbenchmarks only, collectives included, no case below), then every
case launched ``--repeat`` times round-robin; the median over all measured steps is compared
with the prediction. Writes ``reports/validation/coverage.md`` (+ ``coverage.json``) and, for
the last round, per-case reports and the calibrated profile under ``reports/validation/coverage/``.
Cases with more ranks than cores are reported, never gated. The 1-minute load average
before and after each case's launches is recorded: other engineers share this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import validate_gloo as vg  # noqa: E402

from parsim.validate.report import public  # noqa: E402

TINY, MOE = "scenarios/tiny-cpu.toml", "scenarios/tiny-moe-cpu.toml"
CASES = [
    ("dualpipe", TINY, ["schedule.name=DualPipe"]),
    ("dualpipev", TINY, ["schedule.name=DualPipeV"]),
    ("chimera", TINY, ["schedule.name=Chimera"]),
    ("gpipe-remat", TINY, ["schedule.name=GPipeRemat"]),
    ("pipedream", TINY, ["schedule.name=PipeDream"]),
    ("pipedream-2bw", TINY, ["schedule.name=PipeDream2BW"]),
    ("ampnet", TINY, ["schedule.name=AMPNet"]),
    ("ampnet-2-in-flight", TINY, ["schedule.name=AMPNet", "schedule.max_in_flight=2", "schedule.update_every=2"]),
    ("terapipe-k4", TINY, ["schedule.name=TeraPipe", "schedule.token_slices=4"]),
    ("zbv", TINY, ["schedule.name=ZBV"]),
    ("zbh2", TINY, ["schedule.name=ZBH2"]),
    ("naive", TINY, ["schedule.name=Naive"]),
    ("dp2", TINY, ["parallel.pp=1", "parallel.dp=2"]),
    ("dp2-zero1", TINY, ["parallel.pp=1", "parallel.dp=2", "parallel.zero=1"]),
    ("tp2", TINY, ["parallel.pp=1", "parallel.tp=2"]),
    ("tp2-sp", TINY, ["parallel.pp=1", "parallel.tp=2", "parallel.sequence_parallel=true"]),
    ("cp2", TINY, ["parallel.pp=1", "parallel.cp=2", "training.flash_attention=true"]),
    ("ep2", MOE, []),
    ("pp2-tp2-oversubscribed", TINY, ["gpus=4", "parallel.tp=2"]),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--cases", default=None)
    ap.add_argument("--passes", type=int, default=21)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    vg.CASES = CASES
    out = ROOT / "reports" / "validation" / "coverage"
    out.mkdir(parents=True, exist_ok=True)
    rounds_n, repeat, steps = (1, 1, 2) if args.quick else (args.rounds, args.repeat, args.steps)
    rounds, text, loads = [], [], []
    for k in range(rounds_n):
        print(f"== round {k + 1}/{rounds_n}", flush=True)
        before = os.getloadavg()[0]
        rows, shown = vg.one_round(args, out, repeat, steps, write=k == rounds_n - 1)
        loads.append((before, os.getloadavg()[0]))
        rounds.append(rows)
        meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "profile": shown,
                "repeat": repeat, "steps": steps}
        text.append(vg.markdown(rows, meta).replace("# Validation accuracy on this machine (gloo, CPU ranks)",
                                                    f"## Round {k + 1} of {rounds_n}")
                    + f"\n1-minute load average: {before:.2f} before the round, {os.getloadavg()[0]:.2f} after "
                      f"(2 cores; above 2 means other processes competed with the ranks).\n")
    head = ("# Validation accuracy of the schedules and parallel axes the runtime newly runs (gloo, CPU ranks)\n\n"
            f"`python reports/validation/coverage.py`: {rounds_n} independent round(s), each a fresh calibration "
            "(collectives fitted per size range) followed by every case. Per-case reports (per-action tables "
            "with the tp / cp / ep / dp communication, both Gantt charts) and the calibrated profile: the last "
            "round's, in `coverage/`. Load average (1 min) per round, before / after: "
            + ", ".join(f"{a:.2f} / {b:.2f}" for a, b in loads) + ".\n\n")
    (ROOT / "reports" / "validation" / "coverage.md").write_text(head + vg.summary(rounds) + "\n" + "\n".join(text))
    (ROOT / "reports" / "validation" / "coverage.json").write_text(
        json.dumps({"rounds": public({"r": rounds})["r"], "load_average_1min": loads}, indent=1))
    print("wrote reports/validation/coverage.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
