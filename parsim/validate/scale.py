"""The scenario a validation run executes: the user's, scaled down to fit the machine.

The ``[overlap]`` the runtime does not implement (bucketed gradient reduction during the
backward, overlapped parameter gathers, TP/EP communication pipelined with GEMMs) is set
off in the scaled scenario (:func:`runtime_overlap`), as are the dispatcher kernels it does not
have (:func:`runtime_moe`) and the recomputation it does not build (:func:`runtime_training`:
full recompute and the core_attn / mlp / moe modules run as checkpoints): the simulator
predicts what runs.

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
from parsim.schedule.coverage import ALL_OPS, Coverage, check_runs
from parsim.schedule.semantics import traits
from parsim.simulate import schedule_for

RUNTIME_COVERAGE = Coverage("torch runtime", ops=ALL_OPS)
"""What ``parsim.validate.runtime`` executes (declared here, torch-free, so that a schedule
is refused before any rank process starts): every op, OVERLAP_F_B as its F then its B on
one stream; two model chains (each rank holds its piece of each copy, the copies'
gradients summed across pipeline ranks r and p-1-r); weight stashing and asynchronous
updates as their stale-weight semantics (each step computes on the version the schedule's
staleness says, STEP updates the newest; steps run one after the other, as the simulator's
one-step timeline does); re-materialisation (F keeps the stage input only, B reruns F);
TeraPipe's token slices (each slice attends to the earlier slices' K/V, whose gradients the
later slices' backwards hand back: ``parsim.validate.slices``); message-driven AMPNet in
its own interpreter (``parsim.validate.messages``: the order is what the messages'
arrival makes it, each stage updating every ``update_every`` backwards on the weights of
now). Combinations the runtime does not build are refused by :func:`check_supported`."""


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


def recv_mode(backend: str, recv: str | None = None) -> str:
    """Where a validation run's receives are posted: ``recv`` if given, else "early"
    (``post_recvs_early``) on gloo and "late" on nccl (posting order matters there)."""
    return recv or ("early" if backend == "gloo" else "late")


def early_recv(job: dict) -> bool:
    """Whether the run ``job`` (its ``backend`` and ``recv``) posts its receives early: the
    schedule its ranks run and the one its prediction times (``schedule_for(early_recv=...)``)."""
    return recv_mode(job["backend"], job.get("recv")) == "early"


def check_supported(sc: Scenario) -> None:
    """Refuse, in one line, what the runtime does not build: the schedules beyond
    :data:`RUNTIME_COVERAGE`, MLA models, and the parallel combinations below."""
    par, m, tr, f = sc.parallel, sc.model, sc.training, sc.file
    if m.is_mla:
        raise ConfigError(f, "model", "the validation runtime builds multi-head / grouped-query attention, not MLA")
    if m.moe_latent_size:
        raise ConfigError(f, "model.moe_latent_size", "the validation runtime's experts work on d_model rows, not "
                          "LatentMoE's latent ones")
    if m.hybrid_pattern:
        raise ConfigError(f, "model.hybrid_pattern", "the validation runtime builds transformer blocks, not hybrid "
                          "(Mamba-2) layers")
    if sc.costs is not None:
        raise ConfigError(f, "costs", "a [costs] table replaces the cost model; validate needs the model")
    sem = traits(sc.schedule.name)
    if m.tied_embeddings and par.pp > 1 and (sem.n_chains > 1 or sem.weight_versions is not None or sem.message_driven):
        # the runtime sums the two ends' copies once a step, on the step's weights
        how = ("two model copies put both ends on each end rank" if sem.n_chains > 1 else
               "the two ends compute on different weight versions")
        raise ConfigError(f, "model.tied_embeddings", f"the validation runtime syncs a tied embedding's pipeline "
                          f"copies once a step; {sc.schedule.name}: {how}: set model.tied_embeddings = false")
    if m.is_moe and m.n_moe_layers and par.tp > 1:
        raise ConfigError(f, "parallel.tp", f"the validation runtime's experts are not tensor-parallel: MoE needs tp=1, got {par.tp}")
    if m.is_moe and m.n_moe_layers and par.cp > 1:
        raise ConfigError(f, "parallel.cp", f"the validation runtime routes whole sequences: MoE needs cp=1, got {par.cp}")
    if par.cp > 1 and not tr.flash_attention:
        raise ConfigError(f, "training.flash_attention", "context parallelism runs ring attention on the fused "
                          "(FlashAttention-style) kernel: set it to true")
    if getattr(par, "cp_comm", "p2p") != "p2p" and par.cp > 1:
        raise ConfigError(f, "parallel.cp_comm", f"the validation runtime runs the K/V ring (p2p), not {par.cp_comm}")
    if getattr(par, "dp_shard", None) is not None:
        raise ConfigError(f, "parallel.dp_shard", "the validation runtime shards ZeRO states over all dp ranks (no HSDP)")
    if par.zero >= 1 and (par.cp > 1 or sem.n_chains > 1):
        raise ConfigError(f, "parallel.zero", "the validation runtime shards ZeRO states over the data-parallel ranks "
                          "only: with context parallelism or two model copies it needs zero=0")
    if sem.weight_versions is not None and par.zero >= 1:
        raise ConfigError(f, "parallel.zero", f"weight stashing ({sc.schedule.name}) runs with whole optimizer "
                          f"state on each rank: needs zero=0, got {par.zero}")
    if sem.message_driven:
        _check_message_driven(sc)
    t = sc.schedule
    if t.stage_replication is not None or t.vertical_sync or not t.weight_stashing:
        key = ("stage_replication" if t.stage_replication is not None else
               "vertical_sync" if t.vertical_sync else "weight_stashing")
        raise ConfigError(f, f"schedule.{key}", "the validation runtime runs PipeDream with one worker per stage "
                          "and weight stashing (no replicated stages, no vertical sync)")
    if not sc.overlap.p2p:
        raise ConfigError(f, "overlap.p2p", "the validation runtime sends with isend (asynchronous): "
                                            "blocking sends (p2p = false) are not built")
    if sc.schedule.token_slices is not None and tr.recompute == "full":
        raise ConfigError(f, "training.recompute", "the validation runtime's token slices keep K/V caches in their "
                          "blocks: full recomputation is not built with schedule.token_slices")
    if sc.schedule.token_slices is not None and (par.cp > 1 or (par.sequence_parallel and par.tp > 1)):
        raise ConfigError(f, "schedule.token_slices", "the validation runtime slices whole sequences on each rank: "
                          "token slices need cp=1 and no sequence parallelism")
    try:
        check_runs(schedule_for(sc), RUNTIME_COVERAGE)
    except ScheduleError as e:
        raise ScheduleError(f"{sc.file}: schedule.name: {e.problem}") from None


def _check_message_driven(sc: Scenario) -> None:
    """AMPNet on the runtime: one stage per rank, one model replica, nothing else on the
    axes (a tensor-parallel group would have to agree on every message's order), whole
    optimizer state, no recomputation (a backward uses the weights of now; a recomputed
    forward would rerun on them and change the activations AMPNet's backward keeps)."""
    par, f = sc.parallel, sc.file
    for key, n in (("dp", par.dp), ("tp", par.tp), ("cp", par.cp), ("ep", par.ep), ("vpp", par.vpp)):
        if n != 1:
            raise ConfigError(f, f"parallel.{key}", f"the validation runtime runs AMPNet with one stage per rank and "
                              f"one model replica: needs {key}=1, got {n}")
    if par.zero >= 1:
        raise ConfigError(f, "parallel.zero", f"AMPNet updates whole stages on their ranks: needs zero=0, got {par.zero}")
    if sc.training.recompute != "none":
        raise ConfigError(f, "training.recompute", "AMPNet's backward runs on the weights of now: the validation "
                          "runtime keeps its forwards' activations (recompute = \"none\")")


def check_shapes(sc: Scenario) -> None:
    """The (scaled) model and sequence must split as the runtime cuts them: heads, hidden
    units and vocabulary over tp; the sequence into 2*cp zig-zag chunks, then over tp under
    sequence parallelism."""
    par, seq, m = sc.parallel, sc.training.seq_len, sc.model
    if par.tp > 1:
        for what, n in (("model.n_heads", m.n_heads), ("model.n_kv_heads", m.n_kv_heads), ("model.d_ff", m.d_ff),
                        ("model.vocab_size", m.vocab_size)):
            if n % par.tp:
                raise ConfigError(sc.file, what, f"{n} (after scaling to this machine) does not split over "
                                  f"tp={par.tp}: the runtime shards it")
    unit = (2 * par.cp if par.cp > 1 else 1) * (par.tp if par.sequence_parallel and par.tp > 1 else 1)
    if seq % unit:
        raise ConfigError(sc.file, "training.seq_len", f"{seq} tokens do not split into {unit} equal pieces "
                          f"(2*cp zig-zag chunks x tp sequence-parallel shards)")


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


def runtime_overlap(sc: Scenario):
    """The overlap the runtime actually has: it reduces a stage's gradients in one collective
    after the stage's last backward (the IR's REDUCE_GRAD: no buckets launched during the
    backward), gathers ZeRO-1/2 parameters right after STEP, and runs the tensor- and
    expert-parallel collectives between the GEMMs they feed. The scaled scenario says so, so
    the prediction is of the job that runs (bucket size and ZeRO-3 prefetch are kept)."""
    return dataclasses.replace(sc.overlap, grad_reduce=False, param_gather=False, tp_comm=False, ep_comm=False)


def runtime_moe(sc: Scenario):
    """The dispatcher the runtime actually has: its expert layers exchange tokens with the
    backend's all-to-all (gloo or NCCL), not DeepEP's or HybridEP's kernels, so the prediction
    of a validation run is costed that way."""
    return dataclasses.replace(sc.moe, dispatcher="alltoall", dispatcher_sms=None)


RUNTIME_RECOMPUTE_MODULES = ("core_attn", "mlp", "moe")
"""Megatron's recompute modules the runtime's blocks build (normal checkpoints: the module's input
kept, its forward rerun; ``parsim.validate.model.set_recompute_modules``); the output-discarding
ones (moe_act, layernorm, mla_up_proj) and shared_experts are not built."""


def runtime_training(tr, seq_len: int, precision: str):
    """The training the runtime actually runs: the scaled sequence and precision; full
    recomputation as stated (its blocks run under activation checkpoints, uniform or block) and
    selective recomputation of the modules it builds (:data:`RUNTIME_RECOMPUTE_MODULES`); the
    other modules and op-level recomputation are not built, so the prediction keeps what they
    would drop, as the run does."""
    out = dataclasses.replace(tr, seq_len=seq_len, precision=precision)
    if tr.recompute == "op":
        return dataclasses.replace(out, recompute="none", recompute_modules=None)
    if tr.recompute == "selective":
        built = tuple(m for m in tr.recompute_modules_ if m in RUNTIME_RECOMPUTE_MODULES)
        return dataclasses.replace(out, recompute_modules=built)
    return out


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
    t = traits(sc.schedule.name)
    chain_len = par.n_stages // t.n_chains
    model = scale_model(sc.model, chain_len, seq, lim)
    training = runtime_training(tr, seq, "fp32" if backend == "gloo" else tr.precision)
    hw_name = profile or default_profile(sc, backend)
    hardware = load_profile(hw_name) if hw_name else sc.hardware
    layers = sc.layers_per_stage if model is sc.model else partition_layers(
        model.n_layers, chain_len, file=sc.file, interleaved=par.vpp > 1 and t.stages_per_rank is None) * t.n_chains
    out = dataclasses.replace(sc, model=model, training=training, hardware=hardware, layers_per_stage=layers,
                              overlap=runtime_overlap(sc), moe=runtime_moe(sc))
    check_shapes(out)
    return out
