"""The scenario a validation run executes: the user's, scaled down to fit the machine.

Torch-free (the launcher and the comparison use it without importing torch). Same
structure, smaller numbers: fewer layers, a smaller hidden size (head_dim capped, same
GQA ratio and d_ff/d_model ratio), a shorter sequence and a smaller vocabulary. The
scaled scenario is what both the simulator and the real run see, so prediction and
measurement are of the same job. On CPU (gloo) training runs in fp32.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from parsim.cluster.hardware import find_calibrated, load_profile
from parsim.config.parallel import partition_layers
from parsim.config.scenario import Scenario
from parsim.errors import ConfigError, ScheduleError
from parsim.model import ModelSpec, total_params
from parsim.scenario import load_scenario
from parsim.schedule.coverage import ALL_OPS, Coverage, Trait, check_runs
from parsim.schedule.ir import Op
from parsim.simulate import schedule_for

RUNTIME_COVERAGE = Coverage(
    "torch runtime",
    ops=ALL_OPS - {Op.OVERLAP_F_B},
    refuses=frozenset(Trait),
)
"""What ``parsim.validate.runtime`` executes (declared here, torch-free, so that a schedule
is refused before any rank process starts): every op but the composite OVERLAP_F_B
(DualPipe, DualPipeV); one chain of stages (not Chimera's or DualPipe's two); one
weight version, a flush every step and the forward's activations kept for B (not
PipeDream's or PipeDream-2BW's stashing, nor GPipeRemat's re-materialisation)."""


@dataclass(frozen=True)
class Limits:
    """Largest model a validation run builds."""

    max_params: float = 30e6
    """Parameters above this trigger scaling."""
    d_model: int = 256
    """Hidden size after scaling."""
    max_head_dim: int = 64
    """Head dimension cap after scaling."""
    max_layers_per_stage: int = 2
    """Blocks per stage after scaling."""
    max_seq_len: int = 256
    """Sequence length cap."""
    max_vocab: int = 4096
    """Vocabulary cap."""


GPU_LIMITS = Limits(max_params=400e6, d_model=1024, max_head_dim=128, max_layers_per_stage=2,
                    max_seq_len=1024, max_vocab=32768)


def check_supported(sc: Scenario) -> None:
    """The runtime executes dense models with pipeline and data parallelism (tp = cp = ep = 1)
    and the schedules :data:`RUNTIME_COVERAGE` declares; anything else is one line, here."""
    par = sc.parallel
    for axis in ("tp", "cp", "ep"):
        if getattr(par, axis) != 1:
            raise ConfigError(sc.file, f"parallel.{axis}",
                              f"the validation runtime runs pp x dp only; {axis}={getattr(par, axis)} is not supported")
    if sc.model.is_moe or sc.model.is_mla:
        raise ConfigError(sc.file, "model", "the validation runtime builds dense (non-MoE, non-MLA) models only")
    if sc.costs is not None:
        raise ConfigError(sc.file, "costs", "a [costs] table replaces the cost model; validate needs the model")
    try:
        check_runs(schedule_for(sc), RUNTIME_COVERAGE)
    except ScheduleError as e:
        raise ScheduleError(f"{sc.file}: schedule.name: {e.problem}") from None


def check_runnable(path: str, overrides: list[str] | None = None) -> None:
    """Load ``path`` and refuse what the runtime cannot run: torch-free, before anything starts."""
    check_supported(load_scenario(path, overrides))


def scale_model(m: ModelSpec, n_stages: int, seq_len: int, lim: Limits) -> ModelSpec:
    """A smaller ModelSpec of the same structure (unchanged when it is already small)."""
    if total_params(m) <= lim.max_params and m.d_model <= lim.d_model * 4:
        return m  # already fits: run it as it is
    n_layers = min(m.n_layers, n_stages * lim.max_layers_per_stage)
    n_layers = max(n_stages, n_layers - n_layers % n_stages)
    hd = min(m.head_dim_, lim.max_head_dim)
    heads = max(1, lim.d_model // hd)
    group = max(1, m.n_heads // m.n_kv_heads)
    while heads % group:
        group //= 2
    d_ff = max(8, int(round(m.d_ff * lim.d_model / m.d_model / 8)) * 8)
    return dataclasses.replace(
        m, name=f"{m.name}-scaled", n_layers=n_layers, d_model=heads * hd, n_heads=heads,
        n_kv_heads=heads // group, head_dim=None if heads * hd == lim.d_model else hd, d_ff=d_ff,
        vocab_size=min(m.vocab_size, lim.max_vocab), max_seq_len=max(seq_len, min(m.max_seq_len, seq_len)))


def default_profile(sc: Scenario, backend: str) -> str | None:
    """The calibrated profile validation uses when present (``calibrated/<hardware>.toml``)."""
    name = "cpu-gloo" if backend == "gloo" else sc.hardware.name
    path = find_calibrated(name)
    return str(path) if path is not None else None


def prepare(path: str, overrides: list[str] | None, backend: str, profile: str | None = None,
            limits: Limits | None = None) -> Scenario:
    """Load, check, scale down and re-profile the scenario a validation run executes."""
    sc = load_scenario(path, overrides)
    check_supported(sc)
    lim = limits or (Limits() if backend == "gloo" else GPU_LIMITS)
    tr, par = sc.training, sc.parallel
    seq = min(tr.seq_len, lim.max_seq_len)
    model = scale_model(sc.model, par.n_stages, seq, lim)
    training = dataclasses.replace(tr, seq_len=seq, precision="fp32" if backend == "gloo" else tr.precision)
    hw_name = profile or default_profile(sc, backend)
    hardware = load_profile(hw_name) if hw_name else sc.hardware
    layers = partition_layers(model.n_layers, par.n_stages, file=sc.file, interleaved=par.vpp > 1)
    return dataclasses.replace(sc, model=model, training=training, hardware=hardware, layers_per_stage=layers)
