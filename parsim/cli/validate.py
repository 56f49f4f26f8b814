"""`parsim validate SCENARIO [--backend gloo|nccl] [--json]`: simulate, run for real, compare.

The scenario is scaled down to fit the machine (:mod:`parsim.validate.scale`), simulated
with the calibrated profile (``hardware_profiles/calibrated/<profile>.toml`` when present,
or ``--profile``), executed by one process per rank (dp x tp x pp x cp ranks) through
:mod:`parsim.validate.launch`, and compared (:mod:`parsim.validate.compare`).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from parsim.cli.common import INSTALL_HINT, torch_available

MAX_STEPS = 10_000
"""Most measured (or warm-up) steps per launch: a tiny scenario's step takes ~0.2 s on a CPU rank."""
MAX_LAUNCHES = 1_000
"""Most independent launches (--repeat)."""


def register(sub) -> None:
    p = sub.add_parser("validate", help="run a scenario for real on torch.distributed and compare with the prediction")
    p.add_argument("scenario")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--profile", default=None, help="hardware profile for the prediction (default: calibrated one if present)")
    from parsim.cli.args import finite_positive, niceness, positive_int
    p.add_argument("--steps", type=positive_int("--steps", most=MAX_STEPS), default=5,
                   help="measured steps per launch (median reported)")
    p.add_argument("--repeat", type=positive_int("--repeat", most=MAX_LAUNCHES), default=1,
                   help="independent launches (fresh processes); the median is over the steps of all of them")
    p.add_argument("--warmup", type=positive_int("--warmup", 0, most=MAX_STEPS), default=2,
                   help="unmeasured steps before the measured ones, per launch (default 2)")
    p.add_argument("--timeout", type=finite_positive("--timeout"), default=300.0, help="hard limit for the real run, seconds")
    p.add_argument("--nice", type=niceness("--nice"), default=0,
                   help="niceness increment for the rank processes (e.g. -10 to win the cores from other jobs; needs privilege)")
    p.add_argument("--recv", choices=("early", "late"), default=None,
                   help="where receives are posted: all at the start of the step (early; gloo default) "
                        "or right before it (late; nccl, where early posting can deadlock)")
    p.add_argument("--json", action="store_true", help="print {predicted, measured, relative_error, ...}")
    p.add_argument("--out", metavar="DIR", help="write report.md, gantt.png, comparison.json, span CSVs")
    p.set_defaults(func=cmd_validate)


@dataclass
class ValidationRun:
    """A validation prepared but not yet run: the prediction, the job the ranks get, and
    the launches measured so far (``launch_once`` adds one; ``result`` compares)."""

    scenario: object
    """The scaled scenario both sides see."""
    predicted: object
    """The simulator's Result for it."""
    job: dict
    """What every rank process reads (parsim.validate.worker)."""
    world: int
    """Number of rank processes (dp x tp x pp x cp)."""
    launches: list = field(default_factory=list)
    """Rank results of each launch."""
    load_average_1min: list = field(default_factory=list)
    """Load average before the first launch and after the last."""


def plan_validation(scenario: str, overrides=None, backend: str = "gloo", profile: str | None = None,
                    steps: int = 5, warmup: int = 2, timeout: float = 300.0, nice: int = 0,
                    recv: str | None = None) -> ValidationRun:
    """Prepare (scale, re-profile), lower and simulate ``scenario``; nothing runs yet."""
    from parsim.errors import ConfigError
    from parsim.simulate import schedule_for, simulate
    from parsim.validate.scale import default_profile, early_recv, prepare, recv_mode

    job = {"scenario": str(scenario), "overrides": list(overrides or []), "backend": backend,
           "steps": steps, "warmup": warmup, "timeout": timeout, "threads": 1, "nice": nice,
           "recv": recv_mode(backend, recv)}
    if backend == "nccl" and job["recv"] == "early":
        raise ConfigError(str(scenario), "--recv", "early receive posting can deadlock NCCL p2p (posting order); use late")
    sc = prepare(scenario, overrides, backend, profile)
    from parsim.schedule.semantics import traits
    if backend == "nccl" and traits(sc.schedule.name).message_driven:
        raise ConfigError(str(scenario), "--backend", "AMPNet's message-driven receives run in threads beside the "
                          "compute, which one NCCL communicator does not allow; validate it on gloo")
    from parsim.validate.launch import local_rank_limit
    if sc.parallel.world_size > local_rank_limit():
        raise ConfigError(str(scenario), "gpus", f"the validation runtime starts one process per rank on this machine: "
                          f"{sc.parallel.world_size:,} ranks, at most {local_rank_limit()} here ({os.cpu_count()} cores, "
                          "four ranks per core); scale the layout down with --set (gpus, parallel.dp/tp/pp/cp)")
    job["profile"] = profile or default_profile(sc, backend)
    res = simulate(sc, schedule=schedule_for(sc, early_recv=early_recv(job)))  # the schedule the ranks run
    return ValidationRun(sc, res, job, sc.parallel.world_size)


def launch_once(run: ValidationRun, workdir: str | None = None) -> None:
    """One launch: fresh rank processes, warm-up and measured steps; results appended."""
    from parsim.validate.launch import launch

    if not run.load_average_1min:
        run.load_average_1min.append(os.getloadavg()[0])
    with tempfile.TemporaryDirectory(prefix="parsim-validate-") as tmp:
        out = Path(workdir or tmp) / f"launch{len(run.launches)}"
        run.launches.append(launch(run.job, run.world, out, run.job["timeout"]))
    run.load_average_1min[1:] = [os.getloadavg()[0]]


def _as_run(path: str) -> str:
    """A file named relative to the working directory when it lies under it (a record committed
    beside the scenario then finds it from any clone), else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except (OSError, ValueError):
        return path


def result(run: ValidationRun) -> dict:
    """The comparison over every launch so far (the ``parsim validate --json`` object)."""
    from parsim.validate.compare import compare, device_drift

    job = run.job
    c = compare(run.predicted, run.launches)
    sched = run.predicted.schedule
    loss_rank = sched.rank_of(sched.n_stages - 1)  # where the loss is computed (rank 0 in a V shape)
    c["device_drift"] = device_drift(c, job["profile"])
    # what ran, so that parsim calibrate --validations can predict the record again later
    c.update({"scenario_file": _as_run(job["scenario"]), "overrides": job["overrides"],
              "backend": job["backend"], "world": run.world, "warmup": job["warmup"], "cpu_count": os.cpu_count(),
              "nice": job["nice"], "recv": job["recv"], "launches": len(run.launches),
              "load_average_1min": run.load_average_1min,
              "losses": run.launches[-1][loss_rank]["steps"][-1]["losses"]})
    from parsim.validate.routing import predicted_with_routing, run_routing

    hist = run_routing(run.launches, sched.chain_len)
    if hist is not None:  # an MoE run: the routing its router produced, and the step predicted from it
        t = predicted_with_routing(run.predicted, hist)
        c["moe_routing"] = {"histogram": [list(row) for row in hist], "predicted_step_time_s": t,
                            "relative_error": t / c["measured"]["step_time_s"] - 1}
    return c


def run_validation(scenario: str, overrides=None, backend: str = "gloo", profile: str | None = None,
                   steps: int = 5, warmup: int = 2, timeout: float = 300.0, workdir: str | None = None,
                   nice: int = 0, recv: str | None = None, repeat: int = 1) -> dict:
    """Simulate and execute ``scenario`` (``repeat`` launches); return the comparison dict."""
    from parsim.errors import ConfigError

    if repeat < 1:
        raise ConfigError(str(scenario), "--repeat", f"must be >= 1, got {repeat}")
    run = plan_validation(scenario, overrides, backend, profile, steps, warmup, timeout, nice, recv)
    for _ in range(repeat):
        launch_once(run, workdir)
    return result(run)


def cmd_validate(args) -> int:
    from parsim.validate.scale import check_runnable

    check_runnable(args.scenario, args.set)  # torch-free: refuse what the runtime cannot run, before any rank starts
    if not torch_available():
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    from parsim.validate.report import markdown, public, write_report

    c = run_validation(args.scenario, args.set, args.backend, args.profile, args.steps, args.warmup, args.timeout,
                       nice=args.nice, recv=args.recv, repeat=args.repeat)
    if args.out:
        write_report(c, Path(args.out))
    if args.json:
        print(json.dumps(public(c), indent=1))
    else:
        print(markdown(c).split("\n\nPer-action")[0])
        if args.out:
            print(f"\nreport: {Path(args.out) / 'report.md'}")
    return 0
