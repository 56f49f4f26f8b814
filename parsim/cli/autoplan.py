"""`parsim autoplan`: automatic parallelization (see parsim.autoplan): the plan, its simulated
step, and ``parsim plan``'s best grid configuration beside it."""
from __future__ import annotations

import json
from pathlib import Path

from parsim.errors import ConfigError

FILE = "parsim autoplan"


def register(sub) -> None:
    from parsim.cli.args import add_attention_flags, positive_int
    from parsim.scenario import MAX_GPUS, MAX_SEQ_LEN

    p = sub.add_parser("autoplan", help="automatic parallelization: Alpa-style intra-op ILP + stage DP, simulated",
                       description="Search sharding (Megatron TP/SP, DP, FSDP, EP as annotations on a device mesh) with "
                                   "an integer linear program per stage and cut the layers into pipeline stages with "
                                   "Alpa's DP; the leaders are simulated and the fastest that fits is printed, with "
                                   "parsim plan's best grid configuration beside it.",
                       epilog="example: parsim autoplan --model alpa-gpt-2.6b --hardware aws-p3.16xlarge --gpus 8 "
                              "--global-batch 32 --seq-len 1024 --emit-scenario plan.toml")
    p.add_argument("--model", required=True, help="model preset name, or a Hugging Face config.json path")
    p.add_argument("--hardware", required=True, help="hardware profile name or path")
    p.add_argument("--gpus", type=positive_int("--gpus", most=MAX_GPUS), required=True, help="GPUs available")
    # 2^20 sequences: ~13 s of search on a 2-core machine; 10^8 took 47 s and 10^12 did not finish
    p.add_argument("--global-batch", type=positive_int("--global-batch", most=2 ** 20), required=True,
                   help="sequences per step (at most 1,048,576)")
    p.add_argument("--seq-len", type=positive_int("--seq-len", most=MAX_SEQ_LEN), required=True,
                   help="tokens per sequence")
    p.add_argument("--precision", help="compute precision (default: bf16, fp16 where the GPU has no bf16)")
    p.add_argument("--optimizer", default="adam", help="optimizer (adam, sgd, ...)")
    add_attention_flags(p)
    p.add_argument("--recompute", default="none,full", help="comma-separated recompute modes among none, full")
    p.add_argument("--confirm", type=positive_int("--confirm"), default=4, help="leaders simulated (default 4)")
    p.add_argument("--no-grid", action="store_true", help="skip parsim plan's grid search beside the plan")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--emit-scenario", metavar="FILE", help="write the plan as a scenario TOML ([sharding])")
    p.set_defaults(func=cmd_autoplan)


def build_spec(args):
    from parsim.autoplan.run import AutoplanSpec
    from parsim.cli.common import default_precision
    from parsim.cluster.hardware import load_profile
    from parsim.config.scenario import (
        OPTIMIZERS,
        PRECISIONS,
        TrainingConfig,
        check_attention_head_dim,
    )
    from parsim.model import get_preset, model_from_hf_config

    ref = args.model
    model = model_from_hf_config(ref) if (ref.endswith(".json") or "/" in ref or Path(ref).is_dir()) else get_preset(ref)
    hw = load_profile(args.hardware)
    prec = args.precision
    if prec is not None and prec not in PRECISIONS:  # what a scenario's training.precision takes
        raise ConfigError(FILE, "--precision", f"{prec!r} is not one of {', '.join(PRECISIONS)}")
    if prec is None:
        prec = default_precision(hw.device)
    try:
        hw.device.peak(prec)
    except ValueError as e:
        raise ConfigError(FILE, "--precision", f"{prec!r} on {args.hardware}: {e}") from None
    if args.optimizer not in OPTIMIZERS:
        raise ConfigError(FILE, "--optimizer", f"{args.optimizer!r} is not one of {', '.join(OPTIMIZERS)}")
    rc = tuple(x.strip() for x in args.recompute.split(",") if x.strip())
    if not rc or any(x not in ("none", "full") for x in rc):
        raise ConfigError(FILE, "--recompute", f"expected a comma-separated list of none, full; got {args.recompute!r}")
    if model.hybrid_pattern:
        raise ConfigError(FILE, "--model", f"{model.name}: the op graph covers transformer blocks, not hybrid "
                                           "(Mamba-2) layers: rank its layouts with parsim plan")
    if model.is_mla or (model.is_moe and (model.n_shared_experts or model.first_dense_layers or model.moe_every != 1)):
        raise ConfigError(FILE, "--model", f"{model.name}: the op graph covers dense MHA/GQA blocks and blocks of "
                                           "routed experts only (no MLA, shared experts or dense layers between)")
    # a head dim the GPU's fused attention kernel does not take, as a scenario would be refused
    check_attention_head_dim(model, TrainingConfig(1, 1, flash_attention=args.flash_attention), hw, FILE, "--model",
                             "run with --no-flash-attention to cost unfused attention")
    # one synchronous job: its slowest chip sets the compute clock (HardwareProfile.paced)
    return AutoplanSpec(model, ref, hw.paced(args.gpus), args.gpus, args.global_batch, args.seq_len, prec, args.optimizer, rc,
                        args.confirm, flash_attention=args.flash_attention, dropout=args.dropout)


def _grid(spec) -> dict | None:
    """parsim plan's best configuration for the same question (one worker, no progress bar)."""
    from parsim.plan.run import run_plan
    from parsim.plan.space import PlanSpec, default_schedules
    ps = PlanSpec(model=spec.model, model_ref=spec.model_ref, hardware=spec.hardware, gpus=spec.gpus,
                  global_batch=spec.global_batch, seq_len=spec.seq_len, schedules=default_schedules(),
                  recompute=spec.recompute, precision=spec.precision, optimizer=spec.optimizer,
                  flash_attention=spec.flash_attention, dropout=spec.dropout)
    res = run_plan(ps, "time", top=1, confirm=4, workers=1, progress=False)
    if not res.rows:
        return None
    r = res.rows[0]
    return {"parallel": r["parallel"], "schedule": r["schedule"], "recompute": r["recompute"],
            "microbatch_size": r["microbatch_size"], "step_time_s": r["step_time_s"]}


def cmd_autoplan(args) -> int:
    from parsim.autoplan.ilp import EXTRA_HINT
    try:
        import scipy.optimize  # noqa: F401  (HiGHS: the ILP's solver)
    except ImportError:
        raise ConfigError(FILE, None, EXTRA_HINT) from None
    from parsim.autoplan.run import autoplan, to_json, to_toml
    from parsim.cli.common import out_file, write_text

    if args.emit_scenario:
        out_file(args.emit_scenario)  # refused before the search
    spec = build_spec(args)
    res = autoplan(spec)
    grid = None if args.no_grid else _grid(spec)
    out = to_json(res)
    out["grid_best"] = grid
    if args.emit_scenario and res.doc is not None:
        header = (f"parsim autoplan --model {spec.model_ref} --hardware {spec.hardware.name} --gpus {spec.gpus} "
                  f"--global-batch {spec.global_batch} --seq-len {spec.seq_len}\n"
                  f"predicted step {res.metrics['step_time_s']:.4g} s (the stage DP's estimate {res.best.estimate_s:.4g} s)")
        write_text(args.emit_scenario, to_toml(res.doc, header))
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print(_human(res, out, grid))
    return 0 if res.best is not None else 1


def _human(res, out: dict, grid: dict | None) -> str:
    from parsim.results.summary import fmt_b, fmt_s
    s = res.spec
    head = (f"autoplan: {s.model.name} on {s.gpus} GPUs of {s.hardware.name}, {s.global_batch} x {s.seq_len} "
            f"tokens per step ({s.precision})")
    lines = [head]
    if res.best is None:
        lines.append(f"  no plan fits ({res.n_plans} considered)")
        return "\n".join(lines)
    p = res.best
    sh = out["sharding"]
    mesh = " x ".join(f"{a}={n}" for a, n in sh["mesh"].items())
    tensor = next((a for (a, _), r in zip(p.mesh, p.family[:-1]) if r == "T"), None)
    roles = [f"batch {', '.join(sh['batch'])}" if sh.get("batch") else "",
             f"weights stored sharded over {', '.join(sh['fsdp'])} (FSDP)" if sh.get("fsdp") else "",
             f"tensor {tensor}" + (" + sequence parallel" if sh.get("sequence") else "") if tensor else "",
             f"experts {sh['weights']['experts']} (EP)" if "experts" in sh.get("weights", {}) else ""]
    stages = "1 stage" if p.pp == 1 else f"{p.pp} stages"
    lines.append(f"  plan          {stages} of {s.gpus // p.pp} GPUs; mesh {mesh} ({'; '.join(r for r in roles if r)})")
    n_mb = p.n_microbatches
    lines.append(f"                {n_mb} microbatch{'es' if n_mb > 1 else ''} of {out['training']['microbatch_size']} "
                 f"sequences per data rank, 1F1B, recompute={p.recompute}")
    d = s.gpus // p.pp
    lines.append(f"  stages        layers {', '.join(str(st['layers']) for st in out['stages'])}; stage i on GPUs "
                 f"{d}i .. {d}i+{d - 1}" if p.pp > 1 else f"  stages        {s.model.n_layers} layers on GPUs 0-{d - 1}")
    w = sh.get("weights", {})
    lines.append("  weights       " + (", ".join(f"{k} {v}" for k, v in w.items()) or "replicated over the stage"
                                       + (" (stored sharded, gathered for use)" if sh.get("fsdp") else "")))
    lines.append(f"  step time     {fmt_s(out['step_time_s'])} simulated (stage DP estimate {fmt_s(p.estimate_s)}); "
                 f"MFU {100 * out['mfu']:.1f}%, peak memory {fmt_b(out['peak_memory_bytes'])}")
    if grid is not None:
        g = grid["parallel"]
        rel = out["step_time_s"] / grid["step_time_s"] - 1
        lines.append(f"  grid search   parsim plan's best: dp={g['dp']} tp={g['tp']} pp={g['pp']} zero={g['zero']} "
                     f"{grid['schedule']} recompute={grid['recompute']}: {fmt_s(grid['step_time_s'])} "
                     f"(autoplan {100 * rel:+.1f}%)")
    lines.append(f"  searched      {res.n_plans} plans, {res.stats['ilps']} ILPs, {len(res.confirmed)} simulated, "
                 f"{res.elapsed_s:.1f} s")
    return "\n".join(lines)
