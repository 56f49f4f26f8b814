"""The cost model's inputs, typed and hashable: what a Scenario hands the cost model.

:func:`cost_inputs` is the one place a :class:`~parsim.config.scenario.Scenario` becomes
cost-model input. :func:`layer_inputs` narrows that to what one transformer block's cost
depends on (the model, the hardware, one GPU's shard, the training options): the key of
the cached per-layer and per-stage functions (``parsim.costs.layer``, ``parsim.costs.stage``).
Everything here is a frozen dataclass of values, so equal inputs give equal costs and a
cache may serve them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache
from typing import NamedTuple

from parsim.cluster.hardware import HardwareProfile
from parsim.config.moe import MoEConfig, default_expert_gemm
from parsim.config.offload import OffloadConfig
from parsim.config.parallel import ParallelConfig
from parsim.config.scenario import (
    DEFAULT_RECOMPUTE_MODULES,
    MeasuredCosts,
    OverlapConfig,
    Scenario,
    TrainingConfig,
)
from parsim.costs.moe import ep_group_ranks, expert_dp_ranks
from parsim.model import ModelSpec
from parsim.schedule.semantics import ScheduleTraits, canonical_key
from parsim.schedule.semantics import traits as schedule_traits


class CachedHash:
    """Frozen dataclasses used as cache keys: the hash of their (deep) fields is computed once
    per object, not at every lookup (a hardware profile or a model spec hashes dozens of fields)."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h


class Ranks(tuple):
    """Global ranks of a communication group: a tuple whose hash is computed once (cache keys
    hold data-parallel groups of up to thousands of ranks)."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h


@dataclass(frozen=True)
class Cluster(CachedHash):
    """A hardware profile as a cache key (hashed once: a profile has dozens of nested fields)."""

    profile: HardwareProfile
    """The cluster (device, links, network)."""


@lru_cache(maxsize=64)
def cluster_of(hw: HardwareProfile) -> Cluster:
    """The one Cluster of a profile (equal profiles, one key object)."""
    return Cluster(hw)


@dataclass(frozen=True)
class CostInputs:
    """Everything the cost model reads about one job (built from a Scenario by :func:`cost_inputs`)."""

    model: ModelSpec
    """The model trained."""
    cluster: Cluster
    """The cluster (device, links, network), as a cache key."""
    training: TrainingConfig
    """Batch, sequence, precision, optimizer, recomputation, attention kernel."""
    parallel: ParallelConfig
    """Degrees of every parallel axis, ZeRO stage, rank order."""
    overlap: OverlapConfig
    """Which communication overlaps with compute."""
    moe: MoEConfig
    """Routing and expert sharding (MoE models)."""
    schedule: str
    """Registered schedule name: its traits (re-materialisation, weight versions, two chains) matter."""
    n_microbatches: int
    """Microbatches per step and pipeline."""
    layers_per_stage: tuple[int, ...]
    """Transformer blocks on each stage (pp * vpp entries)."""
    dropout: bool
    """Dropout masks kept (resolved from the training table and the model's FFN)."""
    measured: MeasuredCosts | None = None
    """A ``[costs]`` table: measured per-microbatch times replacing the modelled ones."""
    offload: OffloadConfig = OffloadConfig()
    """The ``[offload]`` table (``parsim.costs.offload``)."""
    ep_pairs: bool = False
    """Megatron-Core's combined 1F1B (:func:`pairs_forward_with_backward`): the expert
    all-to-alls hide in the schedule's composite F&B actions, not inside each op."""

    @property
    def hardware(self) -> HardwareProfile:
        return self.cluster.profile


def pairs_forward_with_backward(sc: Scenario) -> bool:
    """Whether ``sc`` runs Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``):
    ``overlap.ep_comm`` under ``parallel.framework = "megatron"`` on an MoE model whose expert
    group has more than one rank, with 1F1B at pp = 1 or interleaved 1F1B (Megatron asserts a
    virtual pipeline when pp > 1), and modelled costs. Elsewhere ``overlap.ep_comm`` hides each
    pass's all-to-alls under that pass's own compute (DualPipe-style)."""
    par = sc.parallel
    group = par.ep * par.tp // (sc.moe.expert_tp or par.tp)
    key = canonical_key(sc.schedule.name)
    return (sc.overlap.ep_comm and par.framework == "megatron" and sc.model.is_moe and group > 1
            and sc.costs is None and sc.schedule.token_slices is None
            and ((key == canonical_key("1F1B") and par.pp == 1) or key == canonical_key("Interleaved1F1B")))


def paced_gpus(sc: Scenario) -> int:
    """GPUs whose slowest chip sets the job's compute clock (``HardwareProfile.paced``): all of
    them -- every step's data-parallel reduction, pipeline sends and tensor-parallel lockstep make
    each wait on the others -- unless ``stragglers.gpu_sigma`` draws every GPU's own speed (then
    those draws are the chip-to-chip spread, and the mean chip is the base)."""
    st = sc.stragglers
    return 1 if st is not None and st.gpu_sigma > 0 else sc.gpus


def cost_inputs(sc: Scenario) -> CostInputs:
    """The cost model's view of a scenario."""
    pairs = pairs_forward_with_backward(sc)
    overlap = replace(sc.overlap, ep_comm=False) if pairs else sc.overlap  # the composites hide them
    moe = replace(sc.moe, expert_gemm=default_expert_gemm(sc.moe, sc.parallel.framework))
    return CostInputs(sc.model, cluster_of(sc.hardware.paced(paced_gpus(sc))), sc.training, sc.parallel, overlap, moe, sc.schedule.name,
                      sc.n_microbatches, tuple(sc.layers_per_stage), sc.dropout, sc.costs, offload=sc.offload,
                      ep_pairs=pairs)


@dataclass(frozen=True)
class Shard:
    """One GPU's piece of a transformer block: its tensor/context split, groups and microbatch."""

    microbatch_size: int
    """Sequences per microbatch."""
    seq_len: int
    """Tokens per sequence (the whole sequence; this GPU holds seq_len / cp of them)."""
    tp: int
    """Tensor-parallel degree."""
    cp: int
    """Context-parallel degree."""
    ep: int
    """Expert-parallel degree (routed experts sharded over ep ranks)."""
    sequence_parallel: bool
    """Norms and dropout sharded over tp; all-gather + reduce-scatter replace all-reduce."""
    tp_group: Ranks
    """Global ranks of the first tensor-parallel group (where its collectives run)."""
    cp_group: Ranks
    """Global ranks of the first context-parallel group (the K/V ring)."""
    ep_group: Ranks
    """Global ranks of the first expert-parallel group, folded TP ranks included (empty: dense model)."""
    expert_tp: int
    """Tensor-parallel degree of the routed experts (MoE models; 1 for a dense model)."""
    cp_comm: str = "p2p"
    """How context-parallel attention communicates: p2p ring | all_gather | a2a (``parsim.costs.context``)."""

    @property
    def tokens(self) -> int:
        """Tokens of one microbatch on this GPU (after the context split)."""
        return self.microbatch_size * (self.seq_len // self.cp)


class OverlapSplits(NamedTuple):
    """Chunks of a block's GEMMs under an overlapped sequence-parallel TP collective."""

    gather: int
    """The GEMMs on an all-gathered input: the column-parallel forwards (QKV, FC1) and the
    row-parallel input gradients (attention projection, FC2: on the gathered output gradient)."""
    scatter: int
    """The row-parallel forwards, whose output is reduce-scattered."""
    scatter_dgrad: int
    """The column-parallel input gradients, whose output is reduce-scattered."""
    gather_streams: int = 1
    """Chunk GEMMs on the all-gather side in flight at once: Transformer Engine launches them
    round-robin on ``min(3, chunks)`` compute streams of their own (``_NUM_MAX_UB_STREAMS = 3``;
    a ring-exchange chunk waits only for its own slice of the input); PyTorch's async TP
    alternates its chunk matmuls between the current stream and one backend stream (2)."""
    scatter_streams: int = 1
    """The same on the reduce-scatter side: TE's pipeline chunks on ``min(3, chunks)`` streams,
    none waiting for another; PyTorch's async TP makes each chunk's stream wait for the previous
    chunk and its barrier (1: one after another)."""


WHOLE = OverlapSplits(1, 1, 1)
"""Every GEMM one kernel."""


@dataclass(frozen=True)
class TrainOptions:
    """The training options a block's cost depends on."""

    precision: str
    """Training precision (a row of ``parsim.cluster.precision.PRECISION_TABLE``)."""
    flash_attention: bool
    """FlashAttention-style attention kernel."""
    dropout: bool
    """Dropout masks kept."""
    recompute: str
    """Configured activation recomputation: none | selective | op | full."""
    remat: bool
    """The schedule re-materialises (GPipe remat): B reruns the whole forward."""
    grad_accumulation_fusion: bool
    """Weight gradients accumulate inside the dW GEMM (false: a separate memory-bound add)."""
    optimizer: str
    """Optimizer (gradient and state bytes per parameter)."""
    overlap: OverlapConfig
    """Overlap of TP collectives and expert all-to-alls with compute."""
    fused_kernels: bool = True
    """Memory-bound ops as fused kernels (Megatron/TE) or eager PyTorch op by op."""
    fp8_recipe: str | None = None
    """FP8 scaling recipe (None: the device's default)."""
    cross_entropy_fusion: bool = False
    """The loss as fused kernels (else Megatron's op-by-op vocabulary-parallel cross-entropy)."""
    attention_kernel: str | None = None
    """The fused-attention implementation (None: the device's own)."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """Under selective recomputation: the Megatron modules rerun (``parsim.config.scenario.RECOMPUTE_MODULES``)."""
    recompute_method: str = "uniform"
    """Under full recomputation: uniform (every block, ``recompute_num_layers`` a unit) or block
    (the first ``recompute_num_layers`` blocks of each chunk)."""
    recompute_num_layers: int = 1
    """Blocks a uniform unit holds, or blocks a chunk recomputes (block)."""
    tp_overlap_splits: OverlapSplits = WHOLE
    """The chunks each GEMM next to an overlapped sequence-parallel collective runs as
    (:func:`tp_overlap_splits`)."""
    async_grad_reduce: bool = False
    """The backward's column-parallel input-gradient all-reduces (reduce-scatters under sequence
    parallelism) run beside the weight-gradient GEMMs (``overlap.tp_grad_allreduce``, resolved by
    :func:`async_grad_reduce`)."""
    causal_softmax_triangle: bool = False
    """The unfused attention's softmax reads only the causal triangle of the scores (forward and
    backward) and writes the whole rows: Megatron's fused ``scaled_upper_triang_masked_softmax``
    kernel (:func:`causal_softmax_triangle`)."""
    persist_layer_norm: bool = True
    """A LayerNorm model's fused norms as the persistent kernel (false: Apex's earlier
    ``FusedLayerNorm``, ``training.persist_layer_norm``)."""


@dataclass(frozen=True)
class LayerInputs(CachedHash):
    """What the cost of one block (and of a stage of blocks) depends on: the cache key."""

    model: ModelSpec
    """The model."""
    cluster: Cluster
    """Device (GEMM, attention, memory models) and links (TP/CP/EP collectives)."""
    shard: Shard
    """This GPU's piece."""
    options: TrainOptions
    """Training options."""
    moe: MoEConfig | None = None
    """Routing of the MoE layers (None for dense models)."""

    @property
    def hardware(self) -> HardwareProfile:
        return self.cluster.profile


@dataclass(frozen=True)
class RankGroups:
    """The communication groups of global rank 0 (the representative replica)."""

    tp: Ranks
    """Tensor-parallel group."""
    cp: Ranks
    """Context-parallel group."""
    dp: Ranks
    """Gradient-reduction group: the data-parallel ranks times the context-parallel ranks
    (``ParallelConfig.grad_group_ranks``; the dp axis alone when cp = 1)."""
    edp: Ranks
    """Ranks holding the same experts (expert data parallel; the dp group without ep)."""
    pipeline: Ranks
    """Global rank of each pipeline rank of the first replica."""


def rank_groups(par: ParallelConfig) -> RankGroups:
    """Groups of rank 0 under ``par`` (cached by the grid's shape: ZeRO stage or sequence
    parallelism do not move ranks)."""
    return _rank_groups(par.dp, par.tp, par.pp, par.cp, par.ep, par.order)


@lru_cache(maxsize=4096)
def _rank_groups(dp: int, tp: int, pp: int, cp: int, ep: int, order: tuple[str, ...]) -> RankGroups:
    par = ParallelConfig(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, order=order)
    dp_group = Ranks(par.grad_group_ranks(0))
    edp = Ranks(expert_dp_ranks(par)) if par.ep > 1 else dp_group
    return RankGroups(Ranks(par.group_ranks("tp", 0)), Ranks(par.group_ranks("cp", 0)), dp_group, edp,
                      Ranks(par.pipeline_ranks()))


def layer_inputs(ci: CostInputs) -> LayerInputs:
    """The per-block view of a job (the key of the cached layer and stage costs)."""
    par, tr, m = ci.parallel, ci.training, ci.model
    groups = rank_groups(par)
    ep_group, etp = Ranks(), 1
    has_moe = m.is_moe and m.n_moe_layers > 0
    if has_moe:
        etp = ci.moe.expert_tp or par.tp
        ep_group = Ranks(ep_group_ranks(par, etp))
    shard = Shard(tr.microbatch_size, tr.seq_len, par.tp, par.cp, par.ep, par.sequence_parallel, groups.tp, groups.cp,
                  ep_group, etp, par.cp_comm)
    opts = TrainOptions(tr.precision, tr.flash_attention, ci.dropout, tr.recompute, _remat(ci.schedule),
                        tr.grad_accumulation_fusion, tr.optimizer, ci.overlap, tr.fused_kernels, tr.fp8_recipe,
                        tr.cross_entropy_fusion, tr.attention_kernel,
                        recompute_modules=tr.recompute_modules_, recompute_method=tr.recompute_method or "uniform",
                        recompute_num_layers=tr.recompute_num_layers or 1,
                        tp_overlap_splits=tp_overlap_splits(par.framework, par.tp, par.sequence_parallel,
                                                            ci.overlap.tp_comm),
                        causal_softmax_triangle=causal_softmax_triangle(par.framework, tr.seq_len, par.cp),
                        async_grad_reduce=async_grad_reduce(par.framework, ci.overlap),
                        persist_layer_norm=tr.persist_layer_norm)
    return LayerInputs(m, ci.cluster, shard, opts, ci.moe if has_moe else None)


def async_grad_reduce(framework: str, overlap: OverlapConfig) -> bool:
    """Whether the backward's column-parallel input-gradient reductions run beside the weight-gradient
    GEMMs: ``overlap.tp_grad_allreduce`` when stated, else Megatron's default (on) and DTensor's (off),
    and never where ``overlap.tp_comm`` pipelines the TP collectives instead."""
    if overlap.tp_comm:
        return False
    if overlap.tp_grad_allreduce is not None:
        return overlap.tp_grad_allreduce
    return framework == "megatron"


MEGATRON_TRIANGLE_SOFTMAX_KEYS = (16, 4096)
"""Key lengths (exclusive, inclusive) for which Megatron's ``FusedScaleMaskSoftmax`` runs the
causal mask through its fused upper-triangular kernel (``megatron/core/fusions/fused_softmax.py``:
``16 < sk <= 4096``; 2,048 in the 2021 code, ``megatron/model/fused_softmax.py`` at b1a8337)."""


def causal_softmax_triangle(framework: str, seq_len: int, cp: int) -> bool:
    """Whether the unfused attention's softmax is Megatron's fused upper-triangular one: its
    forward loads only the ``row + 1`` scores a causal row keeps and writes the whole row (zeros
    past the diagonal), its backward loads the gradient and the output of those same elements
    (``scaled_upper_triang_masked_softmax.h``); it needs the query and key lengths equal (no
    context parallelism) and a key length in :data:`MEGATRON_TRIANGLE_SOFTMAX_KEYS`."""
    lo, hi = MEGATRON_TRIANGLE_SOFTMAX_KEYS
    return framework == "megatron" and cp == 1 and lo < seq_len <= hi


TE_UB_STREAMS = 3
"""Compute streams Transformer Engine's userbuffers overlaps spread their chunk GEMMs over
(``transformer_engine.pytorch.module.base._NUM_MAX_UB_STREAMS``)."""
TE_PIPELINE_SPLITS = 4
"""Chunks of a GEMM whose output Transformer Engine's userbuffers reduce-scatter as it goes (the
"pipeline" method: TE's ``initialize_ub`` default ``num_splits = 4``; Megatron-Core uses TE's
defaults unless ``--tp-comm-overlap-cfg`` names others)."""


def tp_overlap_splits(framework: str, tp: int, sequence_parallel: bool, tp_comm: bool) -> OverlapSplits:
    """The chunks of the GEMMs an overlapped TP collective runs beside: a GEMM overlapped this
    way is several smaller kernels, each on the part of the activation that has arrived (or is
    about to leave), so it pays each chunk's waves and fixed latency.

    * Megatron-Core (``--tp-comm-overlap``: Transformer Engine's userbuffers with TE's default
      methods): QKV's and FC1's forward and the attention projection's and FC2's input
      gradients are "ring_exchange" overlaps, one GEMM per TP rank's slice of the gathered
      sequence (tp chunks); the projection's and FC2's forward are "pipeline" overlaps
      (:data:`TE_PIPELINE_SPLITS` chunks); QKV's and FC1's input and weight gradients are
      "bulk" overlaps, the whole GEMM beside a whole collective.
      TE launches the chunks on up to :data:`TE_UB_STREAMS` streams, so they overlap one
      another.
    * PyTorch's asynchronous TP (``torch.distributed._symmetric_memory``'s fused
      all-gather-matmul and matmul-reduce-scatter, torchtitan's async TP): one chunk per TP
      rank wherever a GEMM meets a collective, forward and input gradients alike; the
      all-gather side's chunks alternate between two streams, the reduce-scatter side's run one
      after another.

    Without sequence parallelism, or without the overlap, every GEMM runs whole.
    """
    if not tp_comm or not sequence_parallel or tp <= 1:
        return WHOLE
    if framework == "megatron":
        return OverlapSplits(tp, TE_PIPELINE_SPLITS, 1, TE_UB_STREAMS, TE_UB_STREAMS)
    return OverlapSplits(tp, tp, tp, 2, 1)


@lru_cache(maxsize=256)
def schedule_traits_of(schedule: str) -> ScheduleTraits:
    """``parsim.schedule.semantics.traits``, memoised (names are normalised at every call)."""
    return schedule_traits(schedule)


def _remat(schedule: str) -> bool:
    return schedule_traits_of(schedule).remat


def clear_caches() -> None:
    """Empty this module's caches (a cold start)."""
    for fn in (_rank_groups, cluster_of, schedule_traits_of):
        fn.cache_clear()
