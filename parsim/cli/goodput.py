"""`parsim goodput SCENARIO --train-tokens T`: the whole training run under failures (``[faults]``)."""
from __future__ import annotations

import json

from parsim.cli.args import (
    MAX_SAMPLES,
    TRAIN_TOKENS_RANGE,
    finite_positive,
    positive_int,
)


def register(sub) -> None:
    p = sub.add_parser("goodput", help="simulate a whole training run under failures: ETTR, time to train, "
                                       "best checkpoint interval",
                       description="Simulate the whole training run with the scenario's [faults] table: failures as a "
                                   "Poisson process, lost work since the last checkpoint, restarts. Reports ETTR, "
                                   "expected failures, time to train with its band, the simulated best checkpoint "
                                   "interval and Young's and Daly's closed forms.",
                       epilog="example: parsim goodput scenarios/llama3-405b-16k-faults.toml --train-tokens 2e12")
    p.add_argument("scenario", help="scenario TOML file with a [faults] table")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a scenario key (repeatable), e.g. --set faults.restart_s=300")
    p.add_argument("--train-tokens", type=finite_positive("--train-tokens", *TRAIN_TOKENS_RANGE), required=True, metavar="T",
                   help="tokens to train on (e.g. 15e12)")
    p.add_argument("--samples", type=positive_int("--samples", most=MAX_SAMPLES), default=200, help="simulated runs")
    p.add_argument("--seed", type=positive_int("--seed", 0), default=0, help="random seed (same seed, same numbers)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    p.set_defaults(func=cmd_goodput)


def cmd_goodput(args) -> int:
    from parsim.goodput.run import format_goodput, goodput
    from parsim.results.summary import json_safe
    from parsim.scenario import load_scenario

    sc = load_scenario(args.scenario, args.set)
    g = goodput(sc, args.train_tokens, args.samples, args.seed)
    print(json.dumps(json_safe(g), indent=1) if args.json else format_goodput(g))
    return 0
