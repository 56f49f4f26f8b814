"""The planner's search space: what is asked (PlanSpec), one configuration (Candidate),
and the enumeration of every configuration the scenario rules allow.

Legality is never re-implemented: :func:`make_scenario` runs the scenario loader's own
checks (degrees, heads over tp, layers over pp*vpp, batch over dp*microbatch), and
schedules are built by the registered builders (a ScheduleError rejects the pair).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import parsim.config.scenario as _scn
from parsim.cluster.hardware import HardwareProfile
from parsim.config.parallel import ParallelConfig, check_parallel, partition_layers
from parsim.config.scenario import (
    OverlapConfig,
    Scenario,
    ScheduleConfig,
    TrainingConfig,
    split_recompute,
)
from parsim.errors import ConfigError, ScheduleError
from parsim.model import ModelSpec
from parsim.schedule import BUILDERS, build
from parsim.schedule.ir import Schedule
from parsim.schedule.semantics import closed_form, traits

PLAN_FILE = "parsim plan"


@dataclass(frozen=True)
class PlanSpec:
    """The question: a model on a cluster, a batch, and the search space."""

    model: ModelSpec
    """The model (a preset or an imported HF config)."""
    model_ref: str
    """How the user named it: a preset name or a config.json path (for scenario files)."""
    hardware: HardwareProfile
    """The cluster profile."""
    gpus: int
    """GPUs available."""
    global_batch: int
    """Sequences per optimizer step."""
    seq_len: int
    """Tokens per sequence."""
    schedules: tuple[str, ...]
    """Registered schedule names to consider."""
    recompute: tuple[str, ...] = ("none", "selective", "full")
    """Recompute modes to consider (``"selective:a+b"``: selective recomputation of those Megatron
    modules, ``parsim.config.scenario.split_recompute``)."""
    zero: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages to consider."""
    microbatch_sizes: tuple[int, ...] = (1, 2, 4)
    """Microbatch sizes to consider."""
    vpps: tuple[int, ...] = (2, 4)
    """Virtual stages per rank tried for interleaved schedules."""
    max_tp: int = 0
    """Largest tensor-parallel degree (0: one node)."""
    max_cp: int = 8
    """Largest context-parallel degree."""
    world_sizes: tuple[int, ...] = ()
    """GPU counts to try (default: all ``gpus``; the cost objective also tries fewer)."""
    precision: str = "bf16"
    """Compute precision."""
    flash_attention: bool = True
    """``training.flash_attention`` of every candidate (false: the unfused s x s attention core)."""
    dropout: bool | None = None
    """``training.dropout`` of every candidate (None: the model family's default)."""
    optimizer: str = "adam"
    """Optimizer (sets the optimizer-state bytes)."""
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    """Overlap settings every candidate runs with (stated in the output)."""


@dataclass(frozen=True, order=True)
class Candidate:
    """One configuration of the search space."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    vpp: int
    zero: int
    microbatch_size: int
    schedule: str
    recompute: str

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def key(self) -> str:
        """Canonical key (sweep files are keyed by it)."""
        return (f"dp{self.dp}-tp{self.tp}-pp{self.pp}-cp{self.cp}-ep{self.ep}-vpp{self.vpp}-"
                f"zero{self.zero}-mbs{self.microbatch_size}-{self.schedule}-{self.recompute}")

    def family(self) -> str:
        """The (tp, pp, cp) family a candidate belongs to, for rejection summaries."""
        return f"tp{self.tp} pp{self.pp} cp{self.cp}" + (f" ep{self.ep}" if self.ep > 1 else "")

    def parallel_dict(self) -> dict:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep,
                "vpp": self.vpp, "zero": self.zero, "sequence_parallel": self.tp > 1}


def make_scenario(spec: PlanSpec, c: Candidate) -> Scenario:
    """The Scenario of a candidate, checked by the scenario loader's own rules (ConfigError)."""
    par = ParallelConfig(dp=c.dp, tp=c.tp, pp=c.pp, cp=c.cp, ep=c.ep, vpp=c.vpp, zero=c.zero,
                         sequence_parallel=c.tp > 1)
    recompute, modules = split_recompute(c.recompute)
    tr = TrainingConfig(spec.global_batch, spec.seq_len, c.microbatch_size, spec.precision,
                        spec.optimizer, recompute, flash_attention=spec.flash_attention, dropout=spec.dropout,
                        recompute_modules=modules)
    check_parallel(par, c.world, PLAN_FILE)
    _scn.check_model_parallel(spec.model, tr, par, PLAN_FILE)
    _scn.check_hybrid(spec.model, tr, par, spec.hardware, PLAN_FILE)  # e.g. no cp over Mamba layers
    _scn.check_recompute_modules(tr, spec.model, PLAN_FILE)
    layers = partition_layers(spec.model.n_layers, par.n_stages, file=PLAN_FILE, interleaved=c.vpp > 1)
    sc = Scenario(c.key(), PLAN_FILE, spec.hardware, c.world, spec.model, tr, par,
                  ScheduleConfig(c.schedule), spec.overlap, None, layers)
    _scn.check_batch(sc)
    return sc


# ---------------------------------------------------------------------------- enumeration

def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@lru_cache(maxsize=None)
def schedule_vpps(name: str) -> tuple[bool, bool]:
    """(accepts vpp=1, accepts vpp>1) of a registered schedule, found by building tiny cases
    (only placements of pp*vpp stages, stage s on rank s % pp, count)."""
    ok = []
    for vpp in (1, 2):
        try:
            s = build(name, 2, 4, vpp)
            ok.append(s.n_stages == 2 * vpp and tuple(s.stage_to_rank) == tuple(i % 2 for i in range(2 * vpp)))
        except (ScheduleError, ValueError, TypeError):
            ok.append(False)
    return ok[0], ok[1]


def unsupported(name: str) -> str | None:
    """Why the planner cannot pre-screen a registered schedule (None: it can)."""
    t = traits(name)
    for attr, why in (("stages_per_rank", "a fixed V/bidirectional stage placement"),
                      ("remat", "re-materialisation semantics"), ("weight_versions", "weight stashing"),
                      ("asynchronous", "asynchronous (no flush) semantics"),
                      ("overlap_f_b", "composite overlapped F&B actions")):
        if getattr(t, attr):
            return f"{name} has {why}, which the planner's pre-screen does not model yet"
    if t.n_chains != 1:
        return f"{name} runs two model copies, which the planner's pre-screen does not model yet"
    if not any(schedule_vpps(name)):
        return f"{name} places stages other than stage s on rank s % pp"
    return None


def default_schedules() -> tuple[str, ...]:
    """Registered schedules with a closed-form bubble the pre-screen models (read from the
    registry at run time; closed forms: parsim.schedule.semantics). Other supported ones
    are dry-run when asked for by name."""
    return tuple(n for n in BUILDERS if unsupported(n) is None and closed_form(n) is not None)


def enumerate_candidates(spec: PlanSpec) -> tuple[list[Candidate], dict[str, list]]:
    """All candidates that pass the divisibility rules; rejections as reason -> [family, ...]."""
    m = spec.model
    rejected: dict[str, list] = {}
    out: list[Candidate] = []
    max_tp = spec.max_tp or spec.hardware.gpus_per_node
    worlds = spec.world_sizes or (spec.gpus,)

    def reject(reason: str, fam: str, n: int = 1) -> None:
        rejected.setdefault(reason, []).append((fam, n))

    per_family = len(spec.schedules) * len(spec.recompute) * len(spec.zero) * len(spec.microbatch_sizes)
    for world in worlds:
        for tp in _pow2_upto(min(max_tp, world)):
            for cp in _pow2_upto(min(spec.max_cp, world // tp)):
                for pp in _divisors(world // (tp * cp)):
                    dp = world // (tp * cp * pp)
                    base = Candidate(dp, tp, pp, cp, 1, 1, 0, 1, "1F1B", "none")
                    try:
                        make_scenario(spec, replace(base, microbatch_size=1, zero=0))
                    except ConfigError as e:
                        if "global_batch" not in (e.key or ""):
                            reject(e.problem, base.family(), per_family)
                            continue
                    for ep in (_divisors(dp * cp) if m.is_moe else [1]):
                        if m.is_moe and m.n_experts % ep:
                            continue
                        out += _expand(spec, replace(base, ep=ep), reject)
    return out, rejected


def _expand(spec: PlanSpec, base: Candidate, reject) -> list[Candidate]:
    out = []
    fam = base.family()
    for mbs in spec.microbatch_sizes:
        if spec.global_batch % (base.dp * mbs):
            reject(f"global_batch={spec.global_batch} is not divisible by dp*microbatch_size", fam)
            continue
        m = spec.global_batch // (base.dp * mbs)
        single = "1F1B" if "1F1B" in spec.schedules else spec.schedules[0]
        for name in spec.schedules:
            if base.pp == 1 and name != single:
                continue  # no pipeline: every schedule is the same single stage
            one, many = schedule_vpps(name)
            vpps = ([1] if one else []) + ([v for v in spec.vpps] if many and base.pp > 1 else [])
            for vpp in vpps:
                n_stages = base.pp * vpp
                if n_stages > spec.model.n_layers or (vpp > 1 and spec.model.n_layers % n_stages):
                    reject(f"{name}: n_layers={spec.model.n_layers} not divisible by pp*vpp", fam)
                    continue
                actions = _scn.schedule_actions(m, n_stages)
                if actions > _scn.MAX_SCHEDULE_ACTIONS:  # the scenario loader's bound, checked before building
                    reject(f"{m:,} microbatches make ~{actions:,} schedule actions, more than parsim simulates "
                           f"({_scn.MAX_SCHEDULE_ACTIONS:,})", fam)
                    continue
                if _schedule(name, base.pp, m, vpp) is None:
                    reject(f"{name} cannot run pp={base.pp} with {m} microbatches (vpp={vpp})", fam)
                    continue
                for zero in spec.zero:
                    if zero > 0 and base.dp == 1:
                        continue  # ZeRO shards over dp: nothing to shard
                    for rc in spec.recompute:
                        out.append(replace(base, vpp=vpp, zero=zero, microbatch_size=mbs,
                                           schedule=name, recompute=rc))
    return out


@lru_cache(maxsize=4096)
def _schedule(name: str, pp: int, m: int, vpp: int) -> Schedule | None:
    try:
        return build(name, pp, m, vpp)
    except (ScheduleError, ValueError):
        return None
