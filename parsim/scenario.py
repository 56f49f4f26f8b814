"""Scenario TOML -> Scenario, with ``--set section.key=value`` overrides.

Strict: an unknown table or key, a wrong type, degrees that do not divide, heads not
divisible by tp — each is a ConfigError naming the file and the dotted key.
"""
from __future__ import annotations

import math
import tomllib
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from parsim.cluster.attention_kernels import (
    IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS,
)
from parsim.cluster.attention_kernels import resolve as resolve_attention
from parsim.cluster.hardware import load_profile
from parsim.config.faults import faults_from_table
from parsim.config.moe import MoEConfig, check_moe, moe_from_table
from parsim.config.parallel import (
    AXES,
    ParallelConfig,
    check_parallel,
    partition_layers,
)
from parsim.config.scenario import (
    OPTIMIZERS,
    PRECISIONS,
    RECOMPUTE,
    RECOMPUTE_METHODS,
    RECOMPUTE_MODULES,
    SIM_MODES,
    MeasuredCosts,
    OverlapConfig,
    Scenario,
    ScheduleConfig,
    SimulationConfig,
    TrainingConfig,
    check_attention_head_dim,
    check_hybrid,
    check_batch,
    check_model_parallel,
    check_recompute_modules,
)
from parsim.config.sharding import sharding_from_table, to_parallel_table
from parsim.config.stragglers import check_stragglers, stragglers_from_table
from parsim.costs.memory_ops import FP8_RECIPES
from parsim.errors import ConfigError
from parsim.files import read_input_text
from parsim.model import ModelSpec, model_from_table

# the types live in parsim.config.scenario (below the cost model); re-exported for users of the loader
__all__ = ["load_scenario", "scenario_from_dict", "apply_overrides", "parse_override", "Scenario", "TrainingConfig",
           "ScheduleConfig", "OverlapConfig", "SimulationConfig", "MeasuredCosts", "PRECISIONS", "OPTIMIZERS",
           "RECOMPUTE", "SIM_MODES", "TOP_KEYS"]


TOP_KEYS = {"name", "hardware", "gpus", "model", "training", "parallel", "schedule", "costs", "overlap", "description", "moe",
            "simulation", "offload", "inference", "sharding", "faults", "stragglers"}


def _check_keys(table: dict, allowed, file: str, prefix: str) -> None:
    for k in table:
        if k not in allowed:
            raise ConfigError(file, f"{prefix}{k}", f"unknown key (known: {', '.join(sorted(allowed))})")


def _kind(v) -> str:
    """What a misplaced TOML value is, for the one-line error."""
    if isinstance(v, list):
        return "an array" + (" of tables" if v and all(isinstance(x, dict) for x in v) else "")
    if isinstance(v, dict):
        return "a table"
    return f"{v!r}"


def _typed(table: dict, key: str, typ, file: str, prefix: str, default=None, required=False):
    if key not in table:
        if required:
            raise ConfigError(file, f"{prefix}{key}", "missing (required)")
        return default
    v = table[key]
    ok = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v, ok = float(v), True
    if not ok:
        want = getattr(typ, "__name__", str(typ))
        raise ConfigError(file, f"{prefix}{key}", f"expected {want}, got {v!r}")
    if typ is float and not math.isfinite(v):
        raise ConfigError(file, f"{prefix}{key}", f"must be a finite number, got {v!r}")
    if typ in (int, float) and v <= 0 and key not in ("zero", "p2p_s", "bf16_first_layers", "bf16_last_layers"):
        raise ConfigError(file, f"{prefix}{key}", f"must be positive, got {v!r}")
    return v


def _choice(v, choices, file, key):
    if v not in choices:
        raise ConfigError(file, key, f"{v!r} is not one of {', '.join(choices)}")
    return v


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` -> (["section", "key"], typed value); value parsed as TOML."""
    if "=" not in text:
        raise ConfigError("--set", text, "expected section.key=value")
    path, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # bare strings: --set schedule.name=ZBH1
    return path.strip().split("."), value


def apply_overrides(doc: dict, overrides: list[str]) -> dict:
    for text in overrides:
        keys, value = parse_override(text)
        node = doc
        for k in keys[:-1]:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError("--set", text, f"{k} is not a table")
        node[keys[-1]] = value
    return doc


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read a scenario file; ``overrides`` are ``section.key=value`` strings."""
    doc, file = read_scenario_doc(path, overrides)
    return scenario_from_dict(doc, file, base_dir=Path(path).parent)


def read_scenario_doc(path: str | Path, overrides: list[str] | None = None) -> tuple[dict, str]:
    """(the TOML document with ``overrides`` applied, the file name); one clean ConfigError line
    for a missing, unreadable, non-UTF-8 or invalid file (any kind of scenario: parsim fl too)."""
    path = Path(path)
    file = str(path)
    try:
        doc = tomllib.loads(read_input_text(path))  # UTF-8; a leading BOM (Windows editors) skipped
    except FileNotFoundError:
        raise ConfigError(file, None, "no such scenario file") from None
    except IsADirectoryError:
        raise ConfigError(file, None, "is a directory, not a scenario file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(file, None, f"not UTF-8 text (byte {e.start}): a scenario is a TOML file") from None
    except OSError as e:
        raise ConfigError(file, None, f"cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(file, None, f"not valid TOML: {' '.join(str(e).split())}") from None
    return apply_overrides(doc, overrides or []), file


TABLES = ("model", "training", "parallel", "schedule", "costs", "overlap", "moe", "simulation", "sharding", "faults",
          "stragglers")


def scenario_from_dict(doc: dict, file: str, base_dir: Path | None = None) -> Scenario:
    if "federated" in doc:
        raise ConfigError(file, "federated", "a federated-learning scenario: run it with `parsim fl`")
    _check_keys(doc, TOP_KEYS, file, "")
    for key in TABLES:  # a scalar or an array of tables ([[parallel]], --set parallel=5) where a table goes
        if key in doc and not isinstance(doc[key], dict):
            raise ConfigError(file, key, f"must be a table ([{key}]), got {_kind(doc[key])}")
    name = _typed(doc, "name", str, file, "", default=Path(file).stem)
    hw_name = _typed(doc, "hardware", str, file, "", required=True)
    try:
        hardware = load_profile(hw_name, base_dir=base_dir)
    except ConfigError as e:
        raise ConfigError(e.file or file, e.key if e.file else "hardware", e.problem) from None
    gpus = _typed(doc, "gpus", int, file, "", required=True)
    if gpus > MAX_GPUS:
        raise ConfigError(file, "gpus", f"at most {MAX_GPUS:,} GPUs, got {gpus:,}")
    if "model" not in doc or not isinstance(doc["model"], dict):
        raise ConfigError(file, "model", "missing [model] table (preset = \"...\" or explicit fields)")
    model = model_from_table(doc["model"], file)
    if "inference" in doc and "training" not in doc:
        raise ConfigError(file, "training", "missing: an [inference] scenario runs with `parsim infer`")
    training = _training(doc.get("training", {}), file)
    try:  # a device without this precision's tensor cores (V100: no bf16) cannot run it; bf16 is the default
        hardware.device.peak(training.precision)
    except ValueError as e:
        raise ConfigError(file, "training.precision", f"{training.precision!r} on {hw_name}: {e}") from None
    block_scaled = training.fp8_recipe in ("mxfp8", "nvfp4")
    if block_scaled and training.precision == "fp8" and training.fp8_recipe not in hardware.device.peak_flops:
        # Transformer Engine refuses MXFP8BlockScaling and NVFP4BlockScaling below sm100: the
        # block-scaled MMA is Blackwell's
        raise ConfigError(file, "training.fp8_recipe",
                          f"{training.fp8_recipe!r} needs block-scaled ({training.fp8_recipe.upper()}) tensor cores, "
                          f"which {hardware.device.name} lacks (Blackwell has them); use 'current', 'delayed', "
                          "'blockwise' or 'rowwise'")
    if training.attention_kernel is not None:
        kf = hardware.device.kernels
        if kf is None or resolve_attention(training.attention_kernel, kf.mma_style) is None:
            raise ConfigError(file, "training.attention_kernel",
                              f"{training.attention_kernel!r} has no kernel model on {hardware.device.name} "
                              f"(modelled: fa2 on Ampere and Hopper, fa3 and cudnn on Hopper, fa4 on Blackwell)")
    check_attention_head_dim(model, training, hardware, file)
    sharding, parallel_table = _sharding(doc, file, gpus)
    parallel = _parallel(parallel_table, file, gpus)
    schedule = _schedule(doc.get("schedule", {}), file)
    overlap = _simple(OverlapConfig, doc.get("overlap", {}), file, "overlap.")
    parallel = _schedule_shape(parallel, schedule, file)
    check_parallel(parallel, gpus, file)
    check_model_parallel(model, training, parallel, file)
    check_hybrid(model, training, parallel, hardware, file)
    check_recompute_modules(training, model, file)
    if training.bf16_first_layers + training.bf16_last_layers > model.n_layers:
        raise ConfigError(file, "training.bf16_last_layers", f"bf16_first_layers + bf16_last_layers = "
                          f"{training.bf16_first_layers + training.bf16_last_layers} exceeds the model's "
                          f"{model.n_layers} blocks")
    layers = _layers(model, parallel, schedule, file)
    costs = _costs(doc["costs"], file, parallel.n_stages) if "costs" in doc else None
    moe = moe_from_table(doc["moe"], file) if "moe" in doc else MoEConfig()
    if "moe" in doc and not model.is_moe:
        raise ConfigError(file, "moe", f"model {model.name} has no experts")
    check_moe(moe, model, parallel, file)
    kf = hardware.device.kernels
    if moe.dispatcher_sms is not None and kf is not None and kf.sm_count and moe.dispatcher_sms >= kf.sm_count:
        raise ConfigError(file, "moe.dispatcher_sms", f"{moe.dispatcher_sms} SMs for the dispatcher, but "
                          f"{hardware.device.name} has {kf.sm_count}: it must leave the compute at least one")
    _check_megatron_ep_overlap(overlap, parallel, training, model, file)
    simulation = _simulation(doc.get("simulation", {}), file)
    faults = faults_from_table(doc["faults"], file) if "faults" in doc else None
    stragglers = stragglers_from_table(doc["stragglers"], file) if "stragglers" in doc else None
    if stragglers is not None:
        check_stragglers(stragglers, gpus, hardware.gpus_per_node, hardware.nics_per_node, parallel.pp, file,
                         parallel.dp * parallel.cp)
    sc = Scenario(name, file, hardware, gpus, model, training, parallel, schedule, overlap, costs, layers, moe,
                  simulation, sharding=sharding, faults=faults, stragglers=stragglers)
    if "offload" in doc:  # ZeRO-Offload / ZeRO-Infinity (parsim.config.offload)
        from parsim.config.offload import parse_offload
        sc = replace(sc, offload=parse_offload(doc["offload"], file, parallel.zero))
        if sc.offload.active and hardware.host is None:
            raise ConfigError(file, "offload", f"hardware profile {hardware.name} has no [host] table (host "
                                               "memory, CPU, NVMe): offload cannot be costed on it")
        if sc.offload.active and simulation.mode == "full":
            raise ConfigError(file, "offload", "offload runs in the fast engine only (simulation.mode = \"fast\")")
        _check_megatron_activation_offload(sc, file)
    check_batch(sc)
    if stragglers is not None and stragglers.rank_hardware and stragglers.balance and schedule.layers_per_stage is None:
        from parsim.costs.mixed import (
            speed_balanced_layers,  # ranks on other GPUs: layers to each one's speed
        )
        return replace(sc, layers_per_stage=speed_balanced_layers(sc))
    if schedule.partition == "balanced" and schedule.layers_per_stage is None:
        from parsim.costs.partition import (
            balanced_layers,  # needs the cost model, which needs a Scenario
        )
        sc = replace(sc, layers_per_stage=balanced_layers(sc))
    return sc


def _sharding(doc: dict, file: str, gpus: int):
    """``[sharding]`` (GSPMD-style annotations, ``parsim.config.sharding``) stands in for
    ``[parallel]``: the annotations become the parallel table they amount to (merged with
    ``[parallel]``, where ``--set parallel.KEY`` may still tune what they do not say).
    Returns (the annotations or None, the parallel table)."""
    if "sharding" not in doc:
        return None, doc.get("parallel", {})
    sh = sharding_from_table(doc["sharding"], file)
    derived = to_parallel_table(sh, gpus, file)
    given = doc.get("parallel", {})
    clash = sorted(k for k in given if k in derived)
    if clash:
        raise ConfigError(file, f"parallel.{clash[0]}", "is decided by [sharding]; give the axes in one of them")
    return sh, {**given, **derived}


def _schedule_shape(par: ParallelConfig, schedule: ScheduleConfig, file: str) -> ParallelConfig:
    """V-shaped and bidirectional schedules hold two stages per rank: their vpp is 2."""
    from parsim.schedule.semantics import traits
    t = traits(schedule.name)
    if t.stages_per_rank is None or par.vpp == t.stages_per_rank:
        return par
    if par.vpp != 1:
        raise ConfigError(file, "parallel.vpp", f"schedule {schedule.name} places {t.stages_per_rank} stages "
                                                f"per rank: vpp must be {t.stages_per_rank} (or left out), got {par.vpp}")
    return replace(par, vpp=t.stages_per_rank)


def _layers(model: ModelSpec, par: ParallelConfig, schedule: ScheduleConfig, file: str) -> tuple[int, ...]:
    """Transformer blocks per stage: explicit, or even (per chain for two-copy schedules),
    with the first/last chunk stated or the embedding/loss counted (partition_layers)."""
    from parsim.schedule.semantics import traits
    t = traits(schedule.name)
    n = par.n_stages
    per_chain = n // t.n_chains
    stated = ([k for k in ("first_stage_layers", "last_stage_layers") if getattr(schedule, k) is not None]
              + [k for k in ("account_for_embedding", "account_for_loss") if getattr(schedule, k)])
    if stated and (schedule.layers_per_stage is not None or schedule.partition == "balanced"):
        other = "layers_per_stage" if schedule.layers_per_stage is not None else 'partition = "balanced"'
        raise ConfigError(file, f"schedule.{stated[0]}", f"shapes the even split; {other} already decides it "
                                                         "(give one of them)")
    if schedule.layers_per_stage is not None:
        lps = schedule.layers_per_stage
        ends = {0, per_chain - 1}  # a chain's first/last chunk may hold only the embedding / the loss
        copies = [lps[i:i + per_chain] for i in range(0, len(lps), per_chain)]  # each holds the whole model
        if (len(lps) not in (n, per_chain) or any(sum(c) != model.n_layers for c in copies)
                or any(k < (0 if s % per_chain in ends else 1) for s, k in enumerate(lps))):
            raise ConfigError(file, "schedule.layers_per_stage",
                              f"needs {per_chain} (or pp*vpp = {n}) counts in model order summing to "
                              f"n_layers={model.n_layers} per model copy, positive except on the first and "
                              f"last chunk, got {list(lps)}")
        return tuple(lps) * (n // len(lps))
    interleaved = par.vpp > 1 and t.stages_per_rank is None
    return partition_layers(model.n_layers, per_chain, file=file, interleaved=interleaved,
                            first=schedule.first_stage_layers, last=schedule.last_stage_layers,
                            embedding=schedule.account_for_embedding, loss=schedule.account_for_loss) * t.n_chains


def _check_megatron_ep_overlap(overlap, parallel, training, model, file: str) -> None:
    """What Megatron-Core refuses with --overlap-moe-expert-parallel-comm
    (transformer_config.py): pp > 1 without a virtual pipeline, and full recomputation."""
    if not (overlap.ep_comm and parallel.framework == "megatron" and model.is_moe):
        return
    if parallel.pp > 1 and parallel.vpp == 1:
        raise ConfigError(file, "overlap.ep_comm", "Megatron-Core's EP overlap needs a virtual pipeline when pp > 1 "
                          "(parallel.vpp > 1, Interleaved1F1B)")
    if training.recompute == "full":
        raise ConfigError(file, "overlap.ep_comm", "Megatron-Core's EP overlap refuses full recomputation "
                          "(training.recompute = \"full\"; selective is allowed)")
    if training.recompute == "selective" and "moe" in training.recompute_modules_:
        raise ConfigError(file, "overlap.ep_comm", "Megatron-Core's EP overlap refuses recomputing the whole MoE "
                          "layer (training.recompute_modules has \"moe\"; moe_act is allowed)")


def _check_megatron_activation_offload(sc, file: str) -> None:
    """What Megatron-Core refuses with --cpu-offloading (transformer_config.py): pipeline
    parallelism, activation recomputation, and offloading as many blocks as the model has."""
    layers = sc.offload.activation_layers
    if layers is None or sc.parallel.framework != "megatron":
        return
    key = "offload.activation_layers"
    if sc.parallel.pp > 1:
        raise ConfigError(file, key, "Megatron-Core's CPU offloading does not support pipeline parallelism (pp > 1)")
    if sc.training.recompute != "none":
        raise ConfigError(file, key, "Megatron-Core's CPU offloading does not work with activation recomputation "
                          f"(training.recompute = {sc.training.recompute!r})")
    if layers >= sc.model.n_layers:
        raise ConfigError(file, key, f"Megatron-Core offloads fewer blocks than the model has ({sc.model.n_layers}), "
                          f"got {layers}")


def _simulation(t: dict, file: str) -> SimulationConfig:
    if not isinstance(t, dict):
        raise ConfigError(file, "simulation", "must be a table ([simulation])")
    _check_keys(t, {f.name for f in fields(SimulationConfig)}, file, "simulation.")
    mode = _choice(_typed(t, "mode", str, file, "simulation.", "fast"), SIM_MODES, file, "simulation.mode")
    return SimulationConfig(mode=mode)


def _simple(cls, table: dict, file: str, prefix: str):
    names = {f.name for f in fields(cls)}
    _check_keys(table, names, file, prefix)
    ints = {f.name for f in fields(cls) if isinstance(f.default, int) and not isinstance(f.default, bool)}
    for k, v in table.items():
        if k in ints:  # a count (overlap.prefetch): a non-negative integer
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(file, f"{prefix}{k}", f"expected a non-negative integer, got {v!r}")
        elif not isinstance(v, bool):
            raise ConfigError(file, f"{prefix}{k}", f"expected true/false, got {v!r}")
    return cls(**table)


def _precision(v: str, file: str, key: str) -> str:
    """``training.precision``; FP4 is a recipe of the FP8 path (TE's ``NVFP4BlockScaling``), so the
    refusal says how to ask for it."""
    if v in ("fp4", "nvfp4", "mxfp4"):
        raise ConfigError(file, key, f"{v!r} is not a training precision: NVFP4 training is "
                          "precision = \"fp8\" with fp8_recipe = \"nvfp4\" (Blackwell)")
    return _choice(v, PRECISIONS, file, key)


MAX_GPUS = 2 ** 20
"""Most GPUs a scenario (or a search) may ask for (1,048,576, ~10x the largest clusters built):
rank lists and groups are sized by it (2^20 simulates in seconds; 10^9 ran for ever)."""


MAX_SEQ_LEN = 2 ** 27
"""Longest training sequence a scenario may ask for (134,217,728 tokens, ~100x the longest
context-parallel runs published): the attention kernel model walks a sequence in 128-token tiles,
~8 s at this length (a 2^40-token sequence would run for hours)."""


def _training(t: dict, file: str) -> TrainingConfig:
    p = "training."
    _check_keys(t, {f.name for f in fields(TrainingConfig)}, file, p)
    tc = TrainingConfig(
        global_batch=_typed(t, "global_batch", int, file, p, required=True),
        seq_len=_typed(t, "seq_len", int, file, p, required=True),
        microbatch_size=_typed(t, "microbatch_size", int, file, p, 1),
        precision=_precision(_typed(t, "precision", str, file, p, "bf16"), file, p + "precision"),
        optimizer=_choice(_typed(t, "optimizer", str, file, p, "adam"), OPTIMIZERS, file, p + "optimizer"),
        recompute=_choice(_typed(t, "recompute", str, file, p, "none"), RECOMPUTE, file, p + "recompute"),
        flash_attention=_typed(t, "flash_attention", bool, file, p, True),
        grad_accumulation_fusion=_typed(t, "grad_accumulation_fusion", bool, file, p, True),
        dropout=_typed(t, "dropout", bool, file, p, None),
        fused_kernels=_typed(t, "fused_kernels", bool, file, p, True),
        cross_entropy_fusion=_typed(t, "cross_entropy_fusion", bool, file, p, False),
        attention_kernel=(None if t.get("attention_kernel") is None else
                          _choice(_typed(t, "attention_kernel", str, file, p, None), ATTENTION_IMPLEMENTATIONS,
                                  file, p + "attention_kernel")),
        fp8_recipe=(None if t.get("fp8_recipe") is None else
                    _choice(_typed(t, "fp8_recipe", str, file, p, None), FP8_RECIPES, file, p + "fp8_recipe")),
        recompute_modules=_recompute_modules(t, file),
        recompute_method=(None if t.get("recompute_method") is None else
                          _choice(_typed(t, "recompute_method", str, file, p, None), RECOMPUTE_METHODS, file,
                                  p + "recompute_method")),
        recompute_num_layers=_typed(t, "recompute_num_layers", int, file, p, None),
        bf16_first_layers=_typed(t, "bf16_first_layers", int, file, p, 0),
        bf16_last_layers=_typed(t, "bf16_last_layers", int, file, p, 0),
        persist_layer_norm=_typed(t, "persist_layer_norm", bool, file, p, True),
    )
    if tc.seq_len > MAX_SEQ_LEN:
        raise ConfigError(file, p + "seq_len", f"{tc.seq_len:,} tokens is more than parsim models ({MAX_SEQ_LEN:,}: "
                          "the attention kernel model walks the sequence tile by tile)")
    for key in ("recompute_method", "recompute_num_layers"):
        if getattr(tc, key) is not None and tc.recompute != "full":
            raise ConfigError(file, p + key, f"only with recompute = \"full\" (Megatron's --recompute-granularity "
                              f"full), got recompute = {tc.recompute!r}")
    if tc.recompute_num_layers is not None and tc.recompute_method is None:
        raise ConfigError(file, p + "recompute_num_layers", "needs training.recompute_method (uniform or block), "
                          "as Megatron's --recompute-num-layers needs --recompute-method")
    for key in ("bf16_first_layers", "bf16_last_layers"):
        n = getattr(tc, key)
        if n < 0:
            raise ConfigError(file, p + key, f"must be >= 0, got {n}")
        if n and tc.precision != "fp8":
            raise ConfigError(file, p + key, f"only under precision = \"fp8\" (the other blocks run FP8 or NVFP4), "
                              f"got precision = {tc.precision!r}")
        if n and tc.fp8_recipe == "delayed":
            raise ConfigError(file, p + key, "not with fp8_recipe = \"delayed\" (Megatron: delayed scaling does not "
                              "support first / last layers in BF16)")
    if tc.recompute_modules is not None and tc.recompute != "selective":
        raise ConfigError(file, p + "recompute_modules", f"only with recompute = \"selective\" (Megatron's "
                          f"--recompute-granularity selective), got recompute = {tc.recompute!r}")
    return tc


MEGATRON_MODULES_NOT_MODELLED = ("gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc")
"""Megatron-Core ``recompute_modules`` choices for architectures parsim does not model (Gated
DeltaNet/DeltaProduct attention, hyper-connections)."""


def _recompute_modules(t: dict, file: str) -> tuple[str, ...] | None:
    key = "training.recompute_modules"
    if "recompute_modules" not in t:
        return None
    v = t["recompute_modules"]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(file, key, f"expected an array of module names, got {v!r}")
    for x in v:
        if x in MEGATRON_MODULES_NOT_MODELLED:
            raise ConfigError(file, key, f"{x!r} recomputes a part of an architecture parsim does not model")
        _choice(x, RECOMPUTE_MODULES, file, key)
    return tuple(dict.fromkeys(v))  # in order, once each


def _parallel(t: dict, file: str, gpus: int) -> ParallelConfig:
    p = "parallel."
    _check_keys(t, {f.name for f in fields(ParallelConfig)}, file, p)
    kw = {}
    for axis in ("tp", "pp", "cp", "ep", "vpp", "dp"):
        kw[axis] = _typed(t, axis, int, file, p, 1)
    if "dp" not in t:  # inferred: the GPUs left over (ep is carved out of dp*cp, it does not count here)
        model_parallel = kw["tp"] * kw["pp"] * kw["cp"]
        if gpus % model_parallel:
            raise ConfigError(file, p + "dp", f"not given, and gpus={gpus} is not divisible by tp*pp*cp = "
                                              f"{kw['tp']}*{kw['pp']}*{kw['cp']} = {model_parallel}")
        kw["dp"] = gpus // model_parallel
    zero = t.get("zero", 0)
    if isinstance(zero, bool) or not isinstance(zero, int):
        raise ConfigError(file, p + "zero", f"expected an integer 0..3, got {zero!r}")
    kw["zero"] = zero
    kw["sequence_parallel"] = _typed(t, "sequence_parallel", bool, file, p, False)
    kw["dp_comm"] = _typed(t, "dp_comm", str, file, p, "allreduce")
    kw["cp_comm"] = _typed(t, "cp_comm", str, file, p, "p2p")
    kw["reshard_after_forward"] = _typed(t, "reshard_after_forward", bool, file, p, True)
    kw["grad_reduce"] = _typed(t, "grad_reduce", str, file, p, None)
    kw["dp_shard"] = _typed(t, "dp_shard", int, file, p, None)
    kw["framework"] = _typed(t, "framework", str, file, p, "zero")
    kw["grad_reduce_dtype"] = _typed(t, "grad_reduce_dtype", str, file, p, None)
    if "order" in t:
        order = t["order"]
        if not isinstance(order, list) or sorted(order) != sorted(AXES):
            raise ConfigError(file, p + "order", f"must be a permutation of {list(AXES)}")
        kw["order"] = tuple(order)
    return ParallelConfig(**kw)


def _schedule(t: dict, file: str) -> ScheduleConfig:
    p = "schedule."
    _check_keys(t, {f.name for f in fields(ScheduleConfig)}, file, p)
    lps = t.get("layers_per_stage")
    if lps is not None and (not isinstance(lps, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                  for x in lps)):
        raise ConfigError(file, p + "layers_per_stage", f"expected a list of integers, got {lps!r}")
    return ScheduleConfig(
        name=_typed(t, "name", str, file, p, "1F1B"),
        n_microbatches=_typed(t, "n_microbatches", int, file, p, None),
        partition=_choice(_typed(t, "partition", str, file, p, "even"), ("even", "balanced"), file, p + "partition"),
        layers_per_stage=tuple(lps) if lps is not None else None,
        first_stage_layers=_count(t, "first_stage_layers", file, p),
        last_stage_layers=_count(t, "last_stage_layers", file, p),
        account_for_embedding=_typed(t, "account_for_embedding", bool, file, p, False),
        account_for_loss=_typed(t, "account_for_loss", bool, file, p, False),
        **_async_and_token_keys(t, file, p),
    )


def _async_and_token_keys(t: dict, file: str, p: str) -> dict:
    """``token_slices`` (TeraPipe) and ``max_in_flight`` / ``update_every`` (AMPNet): checked
    against the schedule they belong to."""
    from parsim.schedule.semantics import canonical_key
    name = canonical_key(t.get("name", "1F1B")) if isinstance(t.get("name", "1F1B"), str) else ""
    out = {}
    if "token_slices" in t:
        v = t["token_slices"]
        if name != "terapipe":
            raise ConfigError(file, p + "token_slices", "applies to schedule TeraPipe only")
        if not (v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)):
            raise ConfigError(file, p + "token_slices", f'expected an integer >= 1 or "auto", got {v!r}')
        out["token_slices"] = v
    if "stage_replication" in t:
        v = t["stage_replication"]
        if name != "pipedream":
            raise ConfigError(file, p + "stage_replication", "applies to schedule PipeDream only")
        ok = v == "auto" or (isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool)
                                                                and x >= 1 for x in v))
        if not ok:
            raise ConfigError(file, p + "stage_replication", f'expected a list of integers >= 1 or "auto", got {v!r}')
        out["stage_replication"] = v if v == "auto" else tuple(v)
    for key in ("weight_stashing", "vertical_sync"):
        if key in t:
            if name != "pipedream":
                raise ConfigError(file, p + key, "applies to schedule PipeDream only")
            out[key] = _typed(t, key, bool, file, p, None)
    for key in ("max_in_flight", "update_every"):
        if key in t:
            v = t[key]
            if name != "ampnet":
                raise ConfigError(file, p + key, "applies to schedule AMPNet only")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(file, p + key, f"expected an integer >= 1, got {v!r}")
            out[key] = v
    return out


def _count(t: dict, key: str, file: str, prefix: str) -> int | None:
    """A layer count that may be 0 (a chunk holding only the embedding or the loss)."""
    v = t.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
        raise ConfigError(file, prefix + key, f"expected a non-negative integer, got {v!r}")
    return v


MEASURED_COST_RANGE_S = (1e-9, 1e6)
"""Range of a non-zero ``[costs]`` time (one pass of one stage on one microbatch, one transfer):
1 ns (under any kernel launch) to 10^6 s (11.6 days). Beyond it a step overflows to infinity
(1e308 s) or prints hundreds of zeros (1e-300 s): a unit slip, not a measurement."""


def _measured_seconds(x, key: str, file: str) -> None:
    lo, hi = MEASURED_COST_RANGE_S
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        raise ConfigError(file, f"costs.{key}", f"expected non-negative finite seconds, got {x!r}")
    if x and not lo <= x <= hi:
        raise ConfigError(file, f"costs.{key}", f"{x!r} s is outside {lo:g} to {hi:g} s (0 is allowed): "
                          "a measured time in seconds")


def _per_stage(t: dict, key: str, file: str, n_stages: int) -> tuple[float, ...] | None:
    if key not in t:
        return None
    v = t[key]
    vals = v if isinstance(v, list) else [v]
    for x in vals:
        _measured_seconds(x, key, file)
    if isinstance(v, list):
        if len(v) != n_stages:
            raise ConfigError(file, f"costs.{key}", f"has {len(v)} values but there are {n_stages} stages (pp*vpp)")
        return tuple(float(x) for x in v)
    return (float(v),) * n_stages


def _costs(t: dict, file: str, n_stages: int) -> MeasuredCosts:
    _check_keys(t, {f.name for f in fields(MeasuredCosts)}, file, "costs.")
    fwd = _per_stage(t, "forward_s", file, n_stages)
    if fwd is None:
        raise ConfigError(file, "costs.forward_s", "missing (required in a [costs] table)")
    b = _per_stage(t, "backward_s", file, n_stages)
    bi = _per_stage(t, "backward_input_s", file, n_stages)
    bw = _per_stage(t, "backward_weight_s", file, n_stages)
    if b is None and (bi is None or bw is None):
        raise ConfigError(file, "costs.backward_s", "missing: give backward_s, or backward_input_s and backward_weight_s")
    if b is not None and (bi is not None or bw is not None):
        raise ConfigError(file, "costs.backward_s", "give backward_s or the input/weight split, not both")
    p2p = t.get("p2p_s", 0.0)
    _measured_seconds(p2p, "p2p_s", file)
    ov = _per_stage(t, "overlap_f_b_s", file, n_stages)
    if sum(fwd) + sum(b or ()) + sum(bi or ()) + sum(bw or ()) <= 0:  # a step of no work has no timeline to show
        raise ConfigError(file, "costs.forward_s", "every measured compute time is zero")
    return MeasuredCosts(fwd, b, bi, bw, float(p2p), ov)


