"""`parsim compare`: a generated report with scenarios side by side (see parsim.report)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path

from parsim.errors import ConfigError

GRID_AXES = ("tp", "pp", "cp")


def register(sub) -> None:
    p = sub.add_parser("compare", help="simulate scenarios and write a side-by-side HTML + Markdown report",
                       description="Simulate scenarios and write a side-by-side report (report.html, report.md, PNGs).",
                       epilog="examples:\n  parsim compare scenarios/gpt3-175b-1f1b.toml --sweep parallel.pp=4,8,16 --out cmp\n"
                              "  parsim compare a.toml b.toml --baseline a.toml --out cmp")
    p.add_argument("scenarios", nargs="+", help="scenario TOML files (one BASE with --sweep / --variant)")
    p.add_argument("--out", required=True, metavar="DIR", help="report directory (report.html, report.md, PNGs)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override for every scenario")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="one scenario per value of KEY, one key per report (e.g. parallel.pp=2,4,8; sweeping tp/pp/cp keeps gpus by adjusting dp)")
    p.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=V[,KEY=V...]",
                   help="a labelled variant of BASE (repeatable), e.g. 'interleaved:schedule.name=Interleaved1F1B,parallel.vpp=2'")
    p.add_argument("--baseline", metavar="SCENARIO|LABEL",
                   help="what the others are compared with: a scenario file (simulated and listed first) or the "
                        "label of one of the compared scenarios (default: the first; deltas in %%, the scaling chart "
                        "as %% of it)")
    p.add_argument("--title", help="report title")
    p.set_defaults(func=cmd_compare)


def _split_values(text: str) -> tuple[str, list]:
    from parsim.scenario import parse_override
    if "=" not in text:
        raise ConfigError("--sweep", text, "expected KEY=V1,V2,...")
    key, raw = text.split("=", 1)
    parts = [v.strip() for v in raw.split(",")]
    if raw.strip() and not all(parts):  # "1,,2" was read as 1,2
        raise ConfigError("--sweep", key, f"an empty value in {raw!r}")
    vals = [parse_override(f"{key}={v}")[1] for v in parts if v]
    if not vals:
        raise ConfigError("--sweep", key, "no values")
    for v in vals:  # a swept value is one scalar: a table or list would replace a whole section
        if isinstance(v, (dict, list)):
            raise ConfigError("--sweep", key, f"values must be scalars, got {v!r}")
    return key.strip(), vals


def _grid_fix(base_path: str, base_set: list[str], key: str, value) -> list[str]:
    """Sweeping tp/pp/cp: keep the GPU count by recomputing dp (unless dp is set explicitly)."""
    from parsim.scenario import load_scenario
    section, _, axis = key.partition(".")
    if section != "parallel" or axis not in GRID_AXES or any(s.startswith("parallel.dp=") for s in base_set):
        return []
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return []  # not a degree: the scenario's own check refuses it, naming the key
    sc = load_scenario(base_path, base_set)
    par = sc.parallel
    denom = value
    for a in GRID_AXES:
        if a != axis:
            denom *= getattr(par, a)
    if isinstance(value, int) and sc.gpus % denom == 0:
        return [f"parallel.dp={sc.gpus // denom}"]
    return []


def _jobs(args) -> tuple[list[tuple[str, str, list[str]]], tuple[str, list] | None]:
    if (args.sweep or args.variant) and len(args.scenarios) != 1:
        raise ConfigError("parsim compare", "--sweep" if args.sweep else "--variant",
                          f"needs exactly one BASE scenario, got {len(args.scenarios)}")
    if args.sweep and args.variant:
        raise ConfigError("parsim compare", "--variant", "use --sweep or --variant, not both")
    if len(args.sweep) > 1:  # one axis per report; the last one silently replaced the others
        raise ConfigError("parsim compare", "--sweep", f"given {len(args.sweep)} times: a report sweeps one key "
                          "(use --variant LABEL:KEY=V,KEY=V for combinations)")
    if args.sweep:
        key, vals = _split_values(args.sweep[0])
        base = args.scenarios[0]
        jobs = []
        for v in vals:
            extra = _grid_fix(base, args.set, key, v)
            label = f"{key.split('.')[-1]}={v}" + (f" ({extra[0].split('.')[-1]})" if extra else "")
            jobs.append((label, base, args.set + extra + [f"{key}={v}"]))
        return jobs, (key, vals)
    if args.variant:
        jobs = []
        for text in args.variant:
            if ":" not in text:
                raise ConfigError("--variant", text, "expected LABEL:KEY=V[,KEY=V...]")
            label, rest = text.split(":", 1)
            label = label.strip()
            if not label or label in (j[0] for j in jobs):
                raise ConfigError("--variant", text, "each variant needs its own label before ':'"
                                  + (f" ({label!r} is given twice)" if label else ""))
            sets = [s.strip() for s in rest.split(",") if s.strip()]
            keys = [s.split("=", 1)[0].strip() for s in sets]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:  # the last one silently won
                raise ConfigError("--variant", text, f"{twice[0]} is set twice")
            jobs.append((label, args.scenarios[0], args.set + sets))
        return jobs, None
    jobs, seen = [], set()
    for path in args.scenarios:
        label = Path(path).stem
        while label in seen:
            label += "'"
        seen.add(label)
        jobs.append((label, path, list(args.set)))
    return jobs, None


def cmd_compare(args) -> int:
    from parsim import __version__
    from parsim.cli.common import out_dir, write_bytes
    from parsim.plan.sweep import Progress
    from parsim.report.compare import summary_table, write_report
    from parsim.results.summary import table
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate

    jobs, sweep = _jobs(args)
    out = out_dir(args.out)  # refused before minutes of simulation, not after
    baseline = None
    if args.baseline is not None:
        labels = [label for label, _, _ in jobs]
        if args.baseline in labels:
            baseline = labels.index(args.baseline)
        else:
            label = "baseline: " + Path(args.baseline).stem
            jobs.insert(0, (label, args.baseline, list(args.set)))
            baseline = 0
    items = []
    bar = Progress(len(jobs), "simulating")
    for label, path, sets in jobs:
        items.append((label, simulate(load_scenario(path, sets))))
        bar.update()
    bar.close()
    title = args.title or ("Comparison: " + ", ".join(label for label, _ in items))
    command = "parsim " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["compare"] else None

    out = out_dir(args.out, create=True)  # the runs succeeded: now the directory
    html_path, md_path = write_report(items, out, title, sweep, command, write_bytes, baseline, __version__)
    head, rows = summary_table(items, 0 if baseline is None else baseline)
    keep = [0, 3, 4, 6, 7, 8, 10, 11]  # label, step, delta, MFU, bubble, idle, peak, fits
    print(table([[r[i] for i in keep] for r in rows], [head[i] for i in keep]))
    print(f"report: {html_path} and {md_path}")
    return 0
