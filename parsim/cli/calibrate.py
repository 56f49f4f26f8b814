"""`parsim calibrate [--backend gloo|nccl]`: run microbenchmarks, fit, write a calibrated profile.
`parsim calibrate --validations DIR... [--profile FILE]`: fold validation records into a profile's
spread (``spread_model``, ``parsim.calibrate.records``); no benchmark runs.

Writes ``hardware_profiles/calibrated/<name>.toml`` under the working directory, or under
``--out-dir`` -- never into the installed package (every fitted number with its source,
a ``[calibration]`` table with the fit quality) and ``<name>.csv`` beside it: the
measured rows, each with the fitted model's prediction and relative error.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

from parsim.cli.common import INSTALL_HINT, torch_available
from parsim.cluster.hardware import CALIBRATED_DIR, dumps_profile, load_profile
from parsim.cluster.precision import GEMM_PRECISIONS
from parsim.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="microbenchmark this machine and fit a hardware profile")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    from parsim.cli.args import finite_positive, niceness, positive_int
    p.add_argument("--ranks", type=positive_int("--ranks"), default=2, help="processes (ranks) to run at once (default 2)")
    p.add_argument("--base", default=None, help="profile to start from (default cpu-gloo for gloo, dgx-h100 for nccl)")
    p.add_argument("--name", default=None, help="name of the calibrated profile (default: the base's name)")
    p.add_argument("--out-dir", default=str(CALIBRATED_DIR), help="where to write <name>.toml and <name>.csv (default: %(default)s under the working "
                        "directory; parsim finds profiles there by name)")
    p.add_argument("--precision", default=None, help="GEMM precision to benchmark (fp32 on gloo, bf16 on nccl)")
    p.add_argument("--quick", action="store_true", help="fewer shapes and sizes (tests)")
    p.add_argument("--passes", type=positive_int("--passes", 0, most=1000), default=0,
                   help="interleaved timing passes over the compute cases (default 7; more = a longer, "
                        "drift-averaged window)")
    p.add_argument("--nice", type=niceness("--nice"), default=0, help="niceness increment for the benchmark ranks (e.g. -10)")
    p.add_argument("--timeout", type=finite_positive("--timeout"), default=900.0, help="hard limit for the benchmark run, seconds")
    p.add_argument("--validations", nargs="+", metavar="DIR",
                   help="instead of benchmarking: the parsim validate records (comparison.json files, or directories "
                        "holding them) whose step errors give the profile's model discrepancy, spread_model")
    p.add_argument("--profile", metavar="FILE",
                   help="with --validations: the profile TOML to write spread_model into (default: the one file "
                        "every record names as its hardware_file)")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    if args.validations:
        return fold_validations(args)
    if args.profile:
        raise ConfigError("parsim calibrate", "--profile", "applies with --validations only")
    if not torch_available():
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    import pandas as pd

    from parsim.calibrate.fit import fit_profile
    from parsim.calibrate.spread import spread_table
    from parsim.validate.launch import launch, local_rank_limit

    if args.ranks > local_rank_limit():
        raise ConfigError("parsim calibrate", "--ranks", f"at most {local_rank_limit()} rank processes on this "
                          f"machine ({os.cpu_count()} cores, four ranks per core), got {args.ranks:,}")
    base = load_profile(args.base or ("cpu-gloo" if args.backend == "gloo" else "dgx-h100"))
    name = args.name or base.name
    precision = args.precision or ("fp32" if args.backend == "gloo" else "bf16")
    if precision not in GEMM_PRECISIONS:  # before any benchmark process starts
        raise ConfigError("parsim calibrate", "--precision", f"{precision!r} is not one of {', '.join(GEMM_PRECISIONS)}")
    job = {"backend": args.backend, "quick": args.quick, "precision": precision, "threads": 1, "nice": args.nice,
           "passes": args.passes}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="parsim-bench-") as tmp:
        ranks = launch(job, args.ranks, tmp, args.timeout, module="parsim.validate.bench")
    data = pd.DataFrame([row for r in ranks for row in r["rows"]])
    fit = fit_profile(base, data, name, precision, args.backend)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    quality = {f"median_abs_rel_error_{k}": round(v, 4) for k, v in fit.quality.items()}
    meta = {"backend": args.backend, "ranks": args.ranks, "precision": precision, "nice": args.nice,
            "passes": args.passes or "default",
            "base_profile": base.source_path or base.name, "data": f"{name}.csv",
            "load_average_1min_before": round(load_before, 2), "load_average_1min_after": round(os.getloadavg()[0], 2),
            **quality, **spread_table(fit.predictions), **fit.calibration_table()}
    (out / f"{name}.toml").write_text(dumps_profile(fit.profile, fit.sources, meta))
    fit.predictions.to_csv(out / f"{name}.csv", index=False)
    d, lk = fit.profile.device, fit.profile.nvlink
    update = d.memory_efficiency if d.update_efficiency is None else d.update_efficiency
    print(f"calibrated {name}: gemm_efficiency={d.gemm_efficiency:.3f} gemm_half_dim={d.gemm_half_dim:.1f} "
          f"memory_efficiency={d.memory_efficiency:.3f} update_efficiency={update:.3f} "
          f"attention_efficiency={d.attention_efficiency:.3f} kernel_launch={d.kernel_launch_s * 1e6:.1f}us "
          f"transport_core_share={d.transport_core_share or 0.0:.2f} link: {lk.latency_s * 1e6:.0f}us "
          f"{lk.effective_bandwidth / 1e9:.2f}GB/s"
          + (f" send posting: {fit.profile.send_post_latency_s * 1e6:.0f}us + S at "
             f"{fit.profile.send_post_bandwidth / 1e9:.2f}GB/s" if fit.profile.send_post_latency_s
             or fit.profile.send_post_bandwidth else ""))
    print("  fit quality (median |relative error|): " + ", ".join(f"{k}={v:.1%}" for k, v in fit.quality.items()))
    print(f"  wrote {out / (name + '.toml')} and {out / (name + '.csv')}")
    return 0


def fold_validations(args) -> int:
    """``--validations``: the records' model discrepancy written into the profile (atomically)."""
    from parsim.calibrate.records import (
        KEYS,
        find_records,
        fold,
        records_for,
        with_calibration,
    )
    from parsim.calibrate.spread import step_error
    from parsim.cli.common import write_text
    from parsim.validate.repredict import predicted_step

    records = find_records(args.validations)
    if args.profile:
        profile = Path(args.profile)
    else:
        named = sorted({r.profile for r in records})
        if len(named) != 1:
            raise ConfigError("parsim calibrate", "--profile",
                              f"the records name {len(named)} profiles ({', '.join(named)}): say which")
        profile = Path(named[0])
    if not profile.is_file():
        raise ConfigError(str(profile), None, "no such profile file")
    for r in records_for(records, profile):
        if r.oversubscribed:
            print(f"  {r.case:24s} set aside: its CPU ranks outnumbered the host's cores (no profile models that)")
    values, mine = fold(records, profile, predicted_step)
    write_text(profile, with_calibration(profile.read_text(), values, str(profile)))
    for r, pred, again in mine:
        print(f"  {r.case:24s} predicted {pred * 1e3:9.2f} ms{' (today)' if again else ' (record)'}  measured "
              f"median {statistics.median(r.measured_s) * 1e3:9.2f} ms  log error {step_error(pred, r.measured_s):+.3f}")
    print(f"wrote {', '.join(f'{k} = {values[k]}' for k in KEYS[:2])} into {profile}")
    return 0
