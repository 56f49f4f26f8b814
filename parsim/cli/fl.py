"""`parsim fl SCENARIO [--json] [--out DIR]`: federated learning rounds on a virtual clock."""
from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("fl", help="simulate federated learning rounds (clients, links, selection, compression)",
                       description="Simulate federated learning rounds of a scenario with a [federated] table "
                                   "(and optional [compression] and [model]) on a virtual clock.",
                       epilog="example: parsim fl scenarios/fl-mobile.toml --json")
    p.add_argument("scenario", help="federated scenario TOML file")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a scenario key (repeatable), e.g. --set federated.mode=async")
    p.add_argument("--json", action="store_true",
                   help="one JSON object (round_time_s_p50, total_time_s, uplink_bits_per_param, dropped_fraction, ...)")
    p.add_argument("--rounds-csv", metavar="FILE", help="write the per-round rows as CSV ('-': stdout)")
    p.add_argument("--out", metavar="DIR", help="write a report directory (report.md, result.json, rounds.csv, "
                                                "round_times.png, time_to_rounds.png)")
    p.set_defaults(func=cmd_fl)


def cmd_fl(args) -> int:
    import sys

    from parsim import __version__
    from parsim.cli.common import STDOUT, atomic_write, out_dir, out_file
    from parsim.federated import load_fl_scenario, simulate_fl
    from parsim.report.federated import write_fl_report

    if args.rounds_csv:
        out_file(args.rounds_csv)  # refused before any work
    out = out_dir(args.out) if args.out else None
    sc = load_fl_scenario(args.scenario, args.set)
    res = simulate_fl(sc)
    if out is not None:  # the run succeeded: now the directory, before anything is printed or written
        out = out_dir(args.out, create=True)
    human = sys.stderr if args.rounds_csv == STDOUT else sys.stdout
    print(json.dumps(res.metrics, indent=1) if args.json else res.summary(), file=human)
    if args.rounds_csv:
        atomic_write(args.rounds_csv, lambda tmp: res.frame().to_csv(tmp, index=False))
    if out is not None:
        write_fl_report(res, out, atomic_write, __version__)
        if not args.json:
            print(f"  report            {out / 'report.md'} (result.json, rounds.csv, round_times.png, "
                  "time_to_rounds.png)", file=human)
    return 0
