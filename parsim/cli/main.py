"""`parsim simulate | schedule | ...` — the command line.

Bad input ends with one line on stderr naming the file, key and problem, exit code 2,
no traceback. Outputs are written to a temporary name and renamed, so an interrupted
run never leaves a half-written file.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from parsim import __version__
from parsim.cli import calibrate, collective, compare, importer, kernel, plan, validate
from parsim.cli.common import EXIT_BAD_INPUT, atomic_write
from parsim.errors import ParsimError, ScheduleError


def cmd_simulate(args) -> int:
    from parsim.report.gantt import plot_gantt
    from parsim.report.run import write_run_report
    from parsim.results.result import json_safe
    from parsim.results.trace import write_trace
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate

    sc = load_scenario(args.scenario, args.set)
    res = simulate(sc)
    metrics = json_safe(res.to_json())
    if args.json:
        print(json.dumps(metrics, indent=1))
    else:
        print(res.summary())
    if args.trace:
        atomic_write(args.trace, lambda tmp: write_trace(res.timeline, tmp))
    if args.timeline:
        atomic_write(args.timeline, lambda tmp: res.timeline.to_csv(tmp, index=False))
    if args.plot:
        atomic_write(args.plot, lambda tmp: plot_gantt(res.timeline, tmp + ".png", sc.name) or os.replace(tmp + ".png", tmp))
    if args.out:
        out = Path(args.out)
        write_run_report(res, out, atomic_write)
        if not args.json:
            print(f"  report            {out / 'report.md'} (result.json, timeline.csv, trace.json, gantt.png)")
    return 0


def cmd_schedule(args) -> int:
    from parsim.schedule import build, lower
    from parsim.schedule.dryrun import format_timeline_grid

    sched = build(args.name, args.pp, args.microbatches, args.vpp)
    if args.lower:
        sched = lower(sched)
    if args.csv:
        sys.stdout.write(sched.to_csv())
    else:
        print(f"{sched.name}: pp={args.pp} microbatches={args.microbatches} vpp={sched.n_stages // sched.pp} "
              f"({sched.n_stages} stages{f', {sched.n_chains} chains' if sched.n_chains > 1 else ''})")
        print(format_timeline_grid(sched) if not args.lower else sched.to_text())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="parsim", description="Predict distributed training step time, bubbles, memory and MFU.")
    p.add_argument("--version", action="version", version=f"parsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("simulate", help="simulate one optimizer step of a scenario")
    s.add_argument("scenario", help="scenario TOML file")
    s.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a scenario key")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace")
    s.add_argument("--timeline", metavar="FILE", help="write the span rows as CSV")
    s.add_argument("--plot", metavar="FILE", help="write a pipeline Gantt chart (PNG)")
    s.add_argument("--out", metavar="DIR", help="write a report directory (report.md, result.json, trace, timeline, gantt)")
    s.set_defaults(func=cmd_simulate)

    s = sub.add_parser("schedule", help="print a pipeline schedule (the IR) as a grid or CSV")
    s.add_argument("name")
    s.add_argument("--pp", type=int, required=True)
    s.add_argument("--microbatches", type=int, required=True)
    s.add_argument("--vpp", type=int, default=1)
    s.add_argument("--csv", action="store_true", help="PyTorch pipelining CSV (one row per rank)")
    s.add_argument("--lower", action="store_true", help="show the lowered schedule (SEND/RECV, REDUCE_GRAD, STEP)")
    s.set_defaults(func=cmd_schedule)

    for command in (plan, compare, validate, calibrate, kernel, importer, collective):  # each module adds its sub-command
        command.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ScheduleError as e:
        print(f"parsim: error: {e.problem}", file=sys.stderr)
        if e.grid:
            print(e.grid, file=sys.stderr)
        return EXIT_BAD_INPUT
    except ParsimError as e:
        print(f"parsim: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
