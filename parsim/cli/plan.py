"""`parsim plan`: what should I run on N GPUs? (see parsim.plan)."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from parsim.errors import ConfigError

FORMATS = ("table", "csv", "json", "md")


def register(sub) -> None:
    from parsim.cli.args import (
        GPU_HOUR_PRICE_RANGE,
        MAX_SAMPLES,
        TRAIN_TOKENS_RANGE,
        add_attention_flags,
        finite_positive,
        positive_int,
    )
    from parsim.scenario import MAX_GPUS, MAX_SEQ_LEN

    p = sub.add_parser("plan", help="what-if capacity planning: rank parallel configurations for N GPUs",
                       description="Rank parallel configurations (dp, tp, pp, cp, ep, schedule, ZeRO, recompute, "
                                   "microbatch) for a model on N GPUs: an analytical pre-screen of every legal one, "
                                   "the leaders confirmed by simulation.",
                       epilog="example: parsim plan --model llama3-70b --hardware dgx-h100 --gpus 1024 "
                              "--tokens 4e6 --seq-len 8192 --train-tokens 15e12 --gpu-hour-price 2.5")
    p.add_argument("--model", required=True, help="model preset name, or a Hugging Face config.json path")
    p.add_argument("--hardware", required=True, help="hardware profile name or path")
    p.add_argument("--gpus", type=positive_int("--gpus", most=MAX_GPUS), required=True, help="GPUs available")
    p.add_argument("--global-batch", type=positive_int("--global-batch"), help="sequences per optimizer step")
    p.add_argument("--tokens", type=finite_positive("--tokens"),
                   help="tokens per step instead of --global-batch (e.g. 4e6: rounded to a power-of-two batch)")
    p.add_argument("--seq-len", type=positive_int("--seq-len", most=MAX_SEQ_LEN), required=True,
                   help="tokens per sequence")
    p.add_argument("--schedules", help="comma-separated schedule names (default: every registered schedule)")
    p.add_argument("--recompute", help="comma-separated recompute modes (default: none,full; selective too without "
                                        "FlashAttention; selective:MOD+MOD for Megatron's recompute modules, e.g. "
                                        "selective:mla_up_proj+moe_act)")
    p.add_argument("--zero", help="comma-separated ZeRO stages (default: 0,1,2,3)")
    p.add_argument("--microbatch-sizes", help="comma-separated microbatch sizes (default: 1,2,4)")
    p.add_argument("--max-tp", type=positive_int("--max-tp", 0), default=0,
                   help="largest tensor-parallel degree (default: 0 = GPUs per node)")
    p.add_argument("--max-cp", type=positive_int("--max-cp"), default=8, help="largest context-parallel degree")
    p.add_argument("--precision", help="compute precision (bf16, fp16, fp8, fp32; default: bf16, or fp16 on a GPU "
                                       "without BF16 such as the V100)")
    p.add_argument("--optimizer", default="adam", help="optimizer (adam, sgd, ...)")
    add_attention_flags(p)
    p.add_argument("--objective", choices=("time", "mfu", "cost"), default="time",
                   help="time: shortest step; mfu: highest MFU; cost: fewest GPU-hours per token (tries N/2, N/4 GPUs too)")
    p.add_argument("--train-tokens", type=finite_positive("--train-tokens", *TRAIN_TOKENS_RANGE), metavar="T",
                   help="token budget (e.g. 15e12): adds time_to_train_s and gpu_hours to every row")
    p.add_argument("--gpu-hour-price", type=finite_positive("--gpu-hour-price", *GPU_HOUR_PRICE_RANGE), metavar="PRICE",
                   help="price of one GPU-hour (with --train-tokens): adds cost")
    p.add_argument("--top", type=positive_int("--top"), default=10, help="rows to print")
    p.add_argument("--samples", type=positive_int("--samples", most=MAX_SAMPLES), metavar="N",
                   help="add each ranked row's P5/P50/P95 step time (N Monte Carlo draws per row, as simulate --samples)")
    p.add_argument("--seed", type=positive_int("--seed", 0), default=0, help="random seed of --samples")
    p.add_argument("--confirm", type=positive_int("--confirm"),
                   help="pre-screen leaders confirmed by simulation (default max(2*top, 8))")
    p.add_argument("--format", choices=FORMATS, default="table", help="what to print")
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.add_argument("--out", metavar="DIR", help="also write plan.md, plan.csv, plan.json and winner.toml there")
    p.add_argument("--executor", choices=("local", "dask"), default="local", help="where simulations run")
    p.add_argument("--scheduler", metavar="ADDRESS", help="dask.distributed scheduler address (with --executor dask)")
    p.add_argument("--connect-timeout", type=finite_positive("--connect-timeout"), default=10.0, metavar="SECONDS",
                   help="give up on an unreachable dask scheduler after this long")
    p.add_argument("--workers", type=positive_int("--workers"), help="local worker processes (default: CPU count; 1 = in-process)")
    p.add_argument("--results", metavar="FILE", help="append simulation results here (JSON lines); a rerun resumes")
    p.set_defaults(func=cmd_plan)


def _ints(text: str | None, key: str, default):
    if text is None:
        return default
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError("parsim plan", key, f"expected comma-separated integers, got {text!r}") from None
    if not vals:
        raise ConfigError("parsim plan", key, "is empty")
    if key != "--zero" and any(v < 1 for v in vals):
        raise ConfigError("parsim plan", key, f"values must be positive, got {text!r}")
    return vals


def build_spec(args):
    from parsim.cli.common import default_precision
    from parsim.cluster.hardware import load_profile
    from parsim.config.scenario import (
        OPTIMIZERS,
        PRECISIONS,
        RECOMPUTE,
        RECOMPUTE_MODULES,
        TrainingConfig,
        check_attention_head_dim,
        check_recompute_modules,
        split_recompute,
    )
    from parsim.model import get_preset, model_from_hf_config
    from parsim.plan.space import PlanSpec, default_schedules, unsupported
    from parsim.schedule import lookup

    f = "parsim plan"
    ref = args.model
    model = model_from_hf_config(ref) if (ref.endswith(".json") or "/" in ref or Path(ref).is_dir()) else get_preset(ref)
    hw = load_profile(args.hardware)
    precision = args.precision if args.precision is not None else default_precision(hw.device)
    if args.gpus < 1:
        raise ConfigError(f, "--gpus", "must be positive")
    if args.seq_len < 1:
        raise ConfigError(f, "--seq-len", "must be positive")
    gb = args.global_batch
    if gb is None:
        if not args.tokens:
            raise ConfigError(f, "--global-batch", "give --global-batch (sequences) or --tokens")
        gb = 1  # the power-of-two batch nearest to the token budget (4e6 tokens, seq 8192 -> 512)
        while abs(gb * 2 * args.seq_len - args.tokens) < abs(gb * args.seq_len - args.tokens):
            gb *= 2
    if gb < 1:
        raise ConfigError(f, "--global-batch", "must be positive")
    if args.schedules:
        try:
            schedules = tuple(lookup(s.strip())[0] for s in args.schedules.split(",") if s.strip())
        except Exception as e:
            raise ConfigError(f, "--schedules", getattr(e, "problem", str(e))) from None
        for name in schedules:
            why = unsupported(name)
            if why:
                raise ConfigError(f, "--schedules", why + " (compare it with `parsim compare` instead)")
    else:
        schedules = default_schedules()
    rc = tuple(x.strip() for x in args.recompute.split(",")) if args.recompute else ("none", "full")
    for x in rc:
        mode, modules = split_recompute(x)
        if mode not in RECOMPUTE:
            raise ConfigError(f, "--recompute", f"{x!r} is not one of {', '.join(RECOMPUTE)} "
                                                "(or selective:MODULE+MODULE...)")
        for mod in modules or ():
            if mod not in RECOMPUTE_MODULES:
                raise ConfigError(f, "--recompute", f"{mod!r} in {x!r} is not one of {', '.join(RECOMPUTE_MODULES)}")
        if modules is not None and not modules:
            raise ConfigError(f, "--recompute", f"{x!r} names no module")
        try:  # what Megatron refuses for this model, as a scenario would be refused
            check_recompute_modules(TrainingConfig(1, 1, precision=precision, recompute=mode,
                                                   recompute_modules=modules), model, f)
        except ConfigError as e:
            raise ConfigError(f, "--recompute", f"{x!r}: {e.problem}") from None
    zero = _ints(args.zero, "--zero", (0, 1, 2, 3))
    if any(z not in (0, 1, 2, 3) for z in zero):
        raise ConfigError(f, "--zero", "stages are 0..3")
    if precision not in PRECISIONS:
        raise ConfigError(f, "--precision", f"{precision!r} is not one of {', '.join(PRECISIONS)}")
    try:  # a precision the GPU has no peak for (bf16 on a V100), given explicitly
        hw.device.peak(precision)
    except ValueError as e:
        raise ConfigError(f, "--precision", f"{precision!r} on {args.hardware}: {e}") from None
    if args.optimizer not in OPTIMIZERS:
        raise ConfigError(f, "--optimizer", f"{args.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    # a head dim the GPU's fused attention kernel does not take, as a scenario would be refused
    check_attention_head_dim(model, TrainingConfig(1, 1, flash_attention=args.flash_attention), hw, f, "--model",
                             "run with --no-flash-attention to cost unfused attention")
    worlds = (args.gpus,)
    if args.objective == "cost":
        worlds = tuple(w for w in (args.gpus, args.gpus // 2, args.gpus // 4) if w >= 1 and args.gpus % w == 0)
    return PlanSpec(model=model, model_ref=ref, hardware=hw, gpus=args.gpus, global_batch=gb, seq_len=args.seq_len,
                    schedules=schedules, recompute=rc, zero=zero,
                    microbatch_sizes=_ints(args.microbatch_sizes, "--microbatch-sizes", (1, 2, 4)),
                    max_tp=args.max_tp, max_cp=args.max_cp, world_sizes=worlds,
                    precision=precision, optimizer=args.optimizer, flash_attention=args.flash_attention,
                    dropout=args.dropout)


def cmd_plan(args) -> int:
    from parsim import __version__
    from parsim.cli.common import out_dir, out_file, write_text
    from parsim.plan.run import (
        run_plan,
        scenario_toml,
        to_csv,
        to_json,
        to_markdown,
        to_table,
    )
    from parsim.report.context import uncertainty_line

    if args.gpu_hour_price is not None and args.train_tokens is None:
        raise ConfigError("parsim plan", "--gpu-hour-price", "needs --train-tokens")
    spec = build_spec(args)
    out = out_dir(args.out) if args.out else None  # refused before the search, not after
    if args.results is not None:
        if args.results == "-":
            raise ConfigError(args.results, None, "--results must be a file (it is read back to resume)")
        out_file(args.results)  # a directory, or a path below a file: refused now, not mid-search
    res = run_plan(spec, args.objective, args.top, args.confirm, executor=args.executor, workers=args.workers,
                   scheduler=args.scheduler, results=args.results, connect_timeout=args.connect_timeout,
                   train_tokens=args.train_tokens, gpu_hour_price=args.gpu_hour_price)
    if args.samples:  # the band of each ranked row (parsim.uncertainty.band): N more simulations per row
        from parsim.uncertainty.band import plan_bands
        plan_bands(res.rows, lambda row: scenario_toml(spec, row), args.samples, args.seed)
    fmt = "json" if args.json else args.format
    command = "parsim " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["plan"] else None
    context = [f"parsim {__version__}.", uncertainty_line()]
    if fmt == "json":
        print(json.dumps(to_json(res), indent=1))
    elif fmt == "csv":
        sys.stdout.write(to_csv(res))
    elif fmt == "md":
        sys.stdout.write(to_markdown(res, command, context))
    else:
        print(to_table(res))
        if args.samples:
            from parsim.uncertainty.band import plan_band_lines
            print("\n".join(plan_band_lines(res.rows)))
    if out is not None:
        write_text(out / "plan.md", to_markdown(res, command, context))
        write_text(out / "plan.csv", to_csv(res))
        write_text(out / "plan.json", json.dumps(to_json(res), indent=1) + "\n")
        if res.rows:
            write_text(out / "winner.toml", scenario_toml(spec, res.rows[0]))
    return 0 if res.rows else 1
