"""`parsim simulate | schedule | ...` — the command line.

Bad input ends with one line on stderr naming the file, key (or option) and problem, exit
code 2, no traceback; Ctrl-C is one line and exit 130. Outputs go through
:func:`parsim.cli.common.atomic_write` (``-`` for stdout, the umask's mode, links and FIFOs
written through, nothing half-written).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading

from parsim import __version__
from parsim.cli import (autoplan, calibrate, collective, compare, estimate_memory, fl, goodput, importer, infer,
                        kernel, plan, validate)
from parsim.cli.args import (GPU_HOUR_PRICE_RANGE, MAX_SAMPLES, TRAIN_TOKENS_RANGE, HelpParser, finite_positive,
                             positive_int)
from parsim.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    STDOUT,
    atomic_write,
    out_dir,
    out_files,
)
from parsim.errors import ConfigError, ParsimError, ScheduleError

EXIT_INTERNAL = 70  # EX_SOFTWARE: a defect in parsim, not in the input
EXIT_TERMINATED = 128 + signal.SIGTERM  # the shell's status of a process ended by SIGTERM


def cmd_simulate(args) -> int:
    from parsim.report.gantt import plot_gantt
    from parsim.report.run import write_run_report
    from parsim.results.summary import json_safe, training_budget
    from parsim.results.trace import write_memory_timeline, write_trace
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate

    if args.gpu_hour_price is not None and args.train_tokens is None:
        raise ConfigError("parsim simulate", "--gpu-hour-price", "needs --train-tokens")
    if args.seed is not None and not args.samples:
        raise ConfigError("parsim simulate", "--seed", "needs --samples (the seed of the uncertainty band's draws)")
    # before the simulation: an unwritable place, or two outputs in one place, is refused at once
    outputs = out_files("parsim simulate", {"--trace": args.trace, "--timeline": args.timeline,
                                            "--memory-timeline": args.memory_timeline, "--plot": args.plot})
    if args.out:
        out = out_dir(args.out)
    sc = load_scenario(args.scenario, args.set)
    res = simulate(sc)
    mx = res.metrics
    if args.train_tokens is not None:
        mx.update(training_budget(mx, args.train_tokens, args.gpu_hour_price))
    if args.samples:
        from parsim.uncertainty.band import band
        mx.update(band(sc, mx, args.samples, args.seed or 0))
    if args.out:  # created once the run succeeded, before anything is printed or written
        out = out_dir(args.out, create=True)
    # a stream on stdout keeps it clean: the summary goes to stderr then
    human = sys.stderr if STDOUT in outputs else sys.stdout
    if args.json:
        print(json.dumps(json_safe(mx), indent=1), file=human)
    else:
        print(res.summary(), file=human)
    if args.trace:
        atomic_write(args.trace, lambda tmp: write_trace(res, tmp))
    if args.timeline:
        atomic_write(args.timeline, lambda tmp: res.timeline.to_csv(tmp, index=False))
    if args.memory_timeline:
        atomic_write(args.memory_timeline, lambda tmp: write_memory_timeline(res, tmp))
    if args.plot:
        def png(tmp):
            plot_gantt(res.timeline, tmp + ".png", sc.name)
            os.replace(tmp + ".png", tmp)
        atomic_write(args.plot, png)
    if args.out:
        write_run_report(res, out, atomic_write, __version__)
        if not args.json:
            print(f"  report            {out / 'report.md'} (result.json, timeline.csv, trace.json, "
                  "memory.csv, gantt.png)", file=human)
    return 0


def cmd_schedule(args) -> int:
    from parsim.config.scenario import MAX_SCHEDULE_ACTIONS, schedule_actions
    from parsim.schedule import build, lower
    from parsim.schedule.dryrun import format_timeline_grid
    from parsim.schedule.semantics import canonical_key

    actions = schedule_actions(args.microbatches, args.pp * args.vpp, args.token_slices or 1)
    if actions > MAX_SCHEDULE_ACTIONS:  # as a scenario's schedule is bounded (config.scenario.check_batch)
        raise ConfigError("parsim schedule", "--microbatches", f"~{actions:,} actions (microbatches x stages x F/B/W), "
                          f"more than parsim builds ({MAX_SCHEDULE_ACTIONS:,})")
    if args.token_slices is not None:
        if canonical_key(args.name) != "terapipe":
            raise ConfigError("parsim schedule", "--token-slices", "applies to schedule TeraPipe only")
        if args.vpp != 1:
            raise ConfigError("parsim schedule", "--vpp", "TeraPipe places one stage per rank: vpp must be 1")
        from parsim.schedule.terapipe import terapipe
        sched = terapipe(args.pp, args.microbatches, args.token_slices)
    else:
        sched = build(args.name, args.pp, args.microbatches, args.vpp)
    if args.lower:
        sched = lower(sched)
    if args.csv:
        sys.stdout.write(sched.to_csv())
    else:
        print(f"{sched.name}: pp={args.pp} microbatches={args.microbatches} vpp={sched.n_stages // sched.pp} "
              f"({sched.n_stages} stages{f', {sched.n_chains} chains' if sched.n_chains > 1 else ''}"
              f"{f'; {sched.n_slices} token slices per microbatch, unit u = slice u % {sched.n_slices} of microbatch u // {sched.n_slices}' if sched.n_slices > 1 else ''})")
        print(format_timeline_grid(sched) if not args.lower else sched.to_text())
    return 0


def _schedule_names() -> str:
    from parsim.schedule import BUILDERS
    return ", ".join(BUILDERS)


def _schedule_aliases() -> str:
    from parsim.schedule.semantics import ALIASES
    return ", ".join(f"{k} = {v}" for k, v in ALIASES.items())


def build_parser() -> HelpParser:
    p = HelpParser(prog="parsim", description="Predict distributed training step time, bubbles, memory and MFU.",
                   epilog="example: parsim simulate scenarios/gpt3-175b-1f1b.toml --train-tokens 300e9")
    p.add_argument("--version", action="version", version=f"parsim {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("simulate", help="simulate one optimizer step of a scenario",
                       description="Simulate one optimizer step of a scenario and print a summary.",
                       epilog="example: parsim simulate scenarios/gpt3-175b-1f1b.toml --train-tokens 300e9 "
                              "--gpu-hour-price 2.5 --trace trace.json")
    s.add_argument("scenario", help="scenario TOML file")
    s.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a scenario key (repeatable), e.g. --set parallel.pp=8")
    s.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    s.add_argument("--train-tokens", type=finite_positive("--train-tokens", *TRAIN_TOKENS_RANGE), metavar="T",
                   help="token budget (e.g. 300e9): adds time_to_train_s and gpu_hours")
    s.add_argument("--gpu-hour-price", type=finite_positive("--gpu-hour-price", *GPU_HOUR_PRICE_RANGE), metavar="PRICE",
                   help="price of one GPU-hour (with --train-tokens): adds cost")
    s.add_argument("--samples", type=positive_int("--samples", most=MAX_SAMPLES), metavar="N",
                   help="Monte Carlo over per-op duration draws from the profile's spread: adds the P5/P50/P95 of "
                        "step time and throughput (step_time_p5_s, step_time_p50_s, step_time_p95_s)")
    s.add_argument("--seed", type=positive_int("--seed", 0), default=None, help="random seed of --samples (default 0)")
    s.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace with memory counters ('-': stdout)")
    s.add_argument("--timeline", metavar="FILE", help="write the span rows as CSV ('-': stdout)")
    s.add_argument("--memory-timeline", metavar="FILE",
                   help="write the per-rank memory timeline as CSV ('-': stdout)")
    s.add_argument("--plot", metavar="FILE", help="write a pipeline Gantt chart (PNG)")
    s.add_argument("--out", metavar="DIR",
                   help="write a report directory (report.md, result.json, trace, timeline, memory, gantt)")
    s.set_defaults(func=cmd_simulate)

    names = _schedule_names()
    s = sub.add_parser("schedule", help="print a pipeline schedule (the IR) as a grid or CSV",
                       description=f"Print a pipeline schedule as a rank-by-step grid or CSV. Schedules: {names} "
                                   f"(also accepted, any case, dashes ignored: {_schedule_aliases()}).",
                       epilog="example: parsim schedule Interleaved1F1B --pp 4 --microbatches 8 --vpp 2")
    s.add_argument("name", metavar="NAME", help=f"schedule: one of {names}")
    s.add_argument("--pp", type=positive_int("--pp"), required=True, help="pipeline ranks")
    s.add_argument("--microbatches", type=positive_int("--microbatches"), required=True, help="microbatches per step")
    s.add_argument("--vpp", type=positive_int("--vpp"), default=1, help="virtual stages (chunks) per rank")
    s.add_argument("--token-slices", type=positive_int("--token-slices"), default=None,
                   help="TeraPipe: token slices per microbatch (actions index (microbatch, slice) units)")
    s.add_argument("--csv", action="store_true", help="PyTorch pipelining CSV (one row per rank)")
    s.add_argument("--lower", action="store_true", help="show the lowered schedule (SEND/RECV, REDUCE_GRAD, STEP)")
    s.set_defaults(func=cmd_schedule)

    for command in (plan, compare, validate, calibrate, kernel, importer, collective, fl, estimate_memory,
                    infer, autoplan, goodput):  # each module adds its sub-command
        command.register(sub)
    for name, parser in sub.choices.items():  # every --help ends with an example
        if not parser.epilog and name in EXAMPLES:
            parser.epilog = "example: " + EXAMPLES[name]
    return p


EXAMPLES = {
    "validate": "parsim validate scenarios/tiny-cpu.toml --backend gloo --out validation",
    "calibrate": "parsim calibrate --backend gloo --ranks 2",
    "kernel": "parsim kernel gemm 8192 8192 8192 --hardware dgx-h100",
    "import": "parsim import torchtitan llama3_8b.toml --hardware dgx-h100 --out llama3-8b.toml",
    "collective": "parsim collective all_reduce --size 1G --gpus 8 --hardware dgx-h100",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class Terminated(BaseException):
    """SIGTERM arrived (a job scheduler, ``timeout``, ``kill``): unwound like Ctrl-C, so what a
    command started (validation and calibration ranks) is stopped and nothing is half-written."""


def _terminated(signum, frame) -> None:
    raise Terminated


PATH_OPTIONS = ("out", "out_dir", "trace", "timeline", "memory_timeline", "plot", "results", "rounds_csv", "csv",
                "emit_scenario", "base", "scenario", "profile", "validations")
"""Options whose value is a file or directory: an empty one is refused (``Path("")`` is the current
directory, and ``if args.out`` would silently skip it)."""


def _no_empty_paths(args) -> None:
    for name in PATH_OPTIONS:
        v = getattr(args, name, None)
        if isinstance(v, str) and not v.strip():
            label = name if name == "scenario" else f"--{name.replace('_', '-')}"  # scenario: mostly positional
            raise ConfigError(label, None, "an empty path")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # --help and usage errors: SystemExit (0, or 2 after one line)
    # SIGTERM's default action ends the process at once, leaving any rank processes it launched
    # running; raised as an exception instead, the launcher's cleanup kills and reaps them
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        _no_empty_paths(args)
        return args.func(args)
    except KeyboardInterrupt:
        print("parsim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated:
        print("parsim: terminated", file=sys.stderr)
        return EXIT_TERMINATED
    except ScheduleError as e:
        print(f"parsim: error: {e.problem}", file=sys.stderr)
        if e.grid:
            print(e.grid, file=sys.stderr)
        return EXIT_BAD_INPUT
    except ParsimError as e:
        print(f"parsim: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # the reader went away (parsim ... | head): not an error; stop writing to the closed pipe
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 0
    except Exception as e:  # a defect in parsim: one line; PARSIM_TRACEBACK=1 shows where
        if os.environ.get("PARSIM_TRACEBACK"):
            raise
        print(f"parsim: internal error: {type(e).__name__}: {_one_line(e)} "
              "(a bug in parsim; rerun with PARSIM_TRACEBACK=1 and report it)", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
