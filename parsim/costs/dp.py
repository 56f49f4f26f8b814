"""Data-parallel and optimizer ops of one stage: gradient reduction (REDUCE_GRAD), the optimizer
update (STEP) with ZeRO-1/2's parameter all-gather after it, ZeRO-3's gathers (UNSHARD/RESHARD).

:func:`dp_ops` is a pure function of hashable inputs (:class:`DPInputs`); what does not depend
on the backward's length (the collectives, the update, ZeRO's gathers) is cached.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from parsim.cluster.collectives import (
    bucketed_time,
    bytes_sent_per_rank,
    grad_bucket_bytes,
    parameter_server_time,
)
from parsim.cluster.contention import group_sms, slowdown_s, transport_slowdown_s
from parsim.config.parallel import ParallelConfig
from parsim.config.scenario import OverlapConfig
from parsim.costs.inputs import CachedHash, Cluster, Ranks, rank_groups
from parsim.costs.layer import cached_collective_time
from parsim.costs.memory import state_bytes_per_param
from parsim.model.shapes import layer_gemms
from parsim.model.spec import ModelSpec, is_moe_layer
from parsim.schedule.ir import Op
from parsim.sim.engine import OpCost

PARAM_GATHER = "PARAM_GATHER"
"""The engine's name for the collective a STEP launches when it ends (ZeRO-1/2 all-gather)."""


@dataclass(frozen=True)
class DPSetting(CachedHash):
    """What every stage's data-parallel and optimizer ops of one job share."""

    cluster: Cluster
    """The cluster (collectives on the topology; HBM bandwidth for the update)."""
    parallel: ParallelConfig
    """Degrees, ZeRO stage, dp_comm and rank order (the dp and expert-dp groups)."""
    optimizer: str
    """Optimizer (state bytes per parameter)."""
    precision: str
    """Training precision (weight and gradient bytes)."""
    overlap: OverlapConfig
    """Whether gradient reduction and the parameter gather overlap with compute; the gradient bucket."""
    model: ModelSpec | None = None
    """The model (Muon's Newton-Schulz runs on its 2-D weights); None: no per-matrix optimizer work."""
    n_chains: int = 1
    """Model copies of the schedule (2: DualPipe, Chimera; each stage's gradients are summed with its twin's)."""


@dataclass(frozen=True)
class DPInputs:
    """What a stage's data-parallel and optimizer ops depend on."""

    setting: DPSetting
    """The job's data-parallel setting."""
    params: float
    """Parameters this GPU holds for the stage (before ZeRO)."""
    expert_params: float
    """Of which routed-expert parameters (reduced over the expert-dp group)."""
    backward_s: float
    """The stage's backward (B) seconds for one microbatch: what bucketed reduction hides under."""
    n_layers: int
    """Blocks of the stage (gradient buckets; ZeRO-3/FSDP units)."""
    forward_s: float = 0.0
    """The stage's forward (F) seconds for one microbatch: what ZeRO-3's prefetched gathers hide under."""
    moe_layers: int = 0
    """Of the stage's blocks, how many are MoE layers (Muon's matrices differ)."""
    tied_sync_s: float = 0.0
    """Seconds of the tied embedding's gradient all-reduce between the pipeline's first and last
    stage (:func:`tied_embedding_sync_s`; 0 on every other stage or without a copy)."""


@dataclass(frozen=True)
class DPOps:
    """A stage's data-parallel ops and the bytes each sends per execution."""

    ops: dict[Op, OpCost]
    """REDUCE_GRAD (dp > 1; one execution per step, or per microbatch with
    ``parallel.grad_per_microbatch``), STEP, UNSHARD/RESHARD (ZeRO-3, dp > 1; per execution:
    one gather of the stage's parameters): read only."""
    sent: dict[str, float]
    """Bytes one GPU sends per execution, by the engine's span name (REDUCE_GRAD, UNSHARD, PARAM_GATHER)."""


def dp_ops(inp: DPInputs) -> DPOps:
    """The stage's data-parallel and optimizer ops."""
    par0, ov = inp.setting.parallel, inp.setting.overlap
    needs_forward = par0.zero == 3 or (par0.zero in (1, 2) and ov.param_gather)
    reduce_s, grad_bytes, rest = _stage_dp(inp.setting, inp.params, inp.expert_params, inp.n_layers,
                                           inp.forward_s if needs_forward else 0.0, inp.moe_layers)
    if reduce_s is None:
        if inp.tied_sync_s > 0.0:  # no data parallelism: the tied copies' sync is the stage's only reduction
            return DPOps({Op.REDUCE_GRAD: OpCost(inp.tied_sync_s), **rest.ops}, rest.sent)
        return rest
    t = reduce_s
    par = inp.setting.parallel
    un = rest.ops.get(Op.UNSHARD)  # the part of ZeRO-3's re-gather still running once the backward starts
    regather = un.duration_s - (un.wait_s or 0.0) if un is not None and par.reshard_after_forward else 0.0
    if inp.setting.overlap.grad_reduce and inp.n_layers:
        # buckets of later layers reduce while earlier layers still run backward -- on the
        # dp stream, which ZeRO-3's re-gather for that backward occupies first
        n = inp.n_layers
        t = max(t - max(0.0, inp.backward_s - regather) * (n - 1) / n, t / n)
        # the hidden buckets held SMs the backward needed (or, on CPU ranks, the core's time):
        # it ends that much later
        dev, hidden = inp.setting.cluster.profile.device, reduce_s - t
        t += slowdown_s(dev, dp_sms(inp.setting), hidden, inp.backward_s)
        t += transport_slowdown_s(dev, hidden, inp.backward_s)
    if par.grad_per_microbatch:
        # per microbatch the dp stream carries the whole reduction: its first bucket may start
        # once the re-gather is done and the first block's backward has run (lead_s before the
        # backward ends), its last bucket once the backward ends (tail_s): reductions that
        # outlast the backwards queue on the stream
        lead, tail = 0.0, 0.0
        if inp.setting.overlap.grad_reduce and inp.n_layers:
            n = inp.n_layers
            lead = max(0.0, inp.backward_s - max(regather, inp.backward_s / n))
            tail = reduce_s / n
        return DPOps({Op.REDUCE_GRAD: OpCost(reduce_s, bytes=grad_bytes, lead_s=lead, tail_s=tail), **rest.ops},
                     rest.sent)
    # the tied copies sync after the data-parallel reduction has finished (finalize_model_grads)
    return DPOps({Op.REDUCE_GRAD: OpCost(t + inp.tied_sync_s, bytes=grad_bytes), **rest.ops}, rest.sent)


def tied_embedding_sync_s(cluster, model, par, precision: str, first: bool, head_copy: bool, tied_split: bool) -> float:
    """Seconds of the all-reduce that keeps a tied embedding's two copies equal when the
    pipeline splits them (the first stage's embedding, the last stage's LM head: ``tied_split``):
    Megatron's ``_allreduce_word_embedding_grads`` (megatron/core/distributed/finalize_model_grads.py,
    core_v0.8.0; Megatron-LM 2021's ``allreduce_word_embedding_grads`` in train_step) sums the two
    stages' gradients of the vocab x hidden / tp matrix, in the gradient buffer's dtype, over
    the embedding group (those two ranks), blocking, after the data-parallel reduction and
    before the optimizer step; DeepSpeed's pipeline engine reduces its tied modules' gradients
    the same way. 0 on the other stages, where the copies are not split, and where gradients
    are reduced per microbatch (FSDP's default; no pipeline framework of that kind splits them)."""
    if not tied_split or not (first or head_copy) or par.grad_per_microbatch:
        return 0.0
    pipe = rank_groups(par).pipeline
    nbytes = model.vocab_size * model.d_model / par.tp * par.grad_bytes(precision)
    return cached_collective_time(cluster, "all_reduce", nbytes, Ranks((pipe[0], pipe[-1])))


@lru_cache(maxsize=65536)
def _stage_dp(st: DPSetting, params: float, expert_params: float,
              n_layers: int, forward_s: float = 0.0, moe_layers: int = 0) -> tuple[float | None, float, DPOps]:
    """(gradient reduction seconds before overlap or None when dp x cp = 1, the gradient bytes,
    the other ops and the bytes of all): what does not depend on the backward's length.

    Gradients are summed over the dp x cp ranks (``parallel.grad_degree``, ``groups.dp``).
    ZeRO >= 1 shards over ``parallel.shard_degree`` ranks (all of them, or HSDP's dp_shard x cp):
    the gradient reduce-scatter and the parameter all-gathers run inside that shard group;
    with HSDP each rank's reduced shard is then all-reduced across the dp / dp_shard
    replicas (FSDP2's HSDP). Expert parameters shard over their expert-dp group as before.
    """
    hw, par = st.cluster, st.parallel
    groups = rank_groups(par)
    w, _, k = state_bytes_per_param(st.optimizer, st.precision)
    g = par.grad_bytes(st.precision)  # the dtype gradients are accumulated and reduced in (fp32 under Megatron's bf16)
    dense, expert = params - expert_params, expert_params
    n_g = par.grad_degree
    n_s = par.shard_degree if par.zero >= 1 else n_g
    shard_group = Ranks(groups.dp[:n_s]) if n_s < n_g else groups.dp
    replicas = Ranks(groups.dp[::n_s]) if n_s < n_g else Ranks()
    ops: dict[Op, OpCost] = {}
    sent: dict[str, float] = {}
    dev, sms = hw.profile.device, dp_sms(st)
    t = None
    if n_g > 1:
        kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
        if par.dp_comm == "parameter_server":  # push gradients to one rank, pull the update back
            t = parameter_server_time(hw.profile, dense * g, groups.dp)
        else:
            t = _bucketed(hw, kind, dense * g, shard_group, bucket_bytes(st))
        # a parameter server moves what a ring all-reduce moves, on average per rank: 2(n-1)/n
        sent["REDUCE_GRAD"] = bytes_sent_per_rank(kind, dense * g, n_s)
        if len(replicas) > 1:  # HSDP: the shard each rank reduced, all-reduced across replicas
            t += cached_collective_time(hw, "all_reduce", dense * g / n_s, replicas)
            sent["REDUCE_GRAD"] += bytes_sent_per_rank("all_reduce", dense * g / n_s, len(replicas))
        if expert:  # expert gradients reduce over the expert-data-parallel ranks
            t += _bucketed(hw, kind, expert * g, groups.edp, bucket_bytes(st))
            sent["REDUCE_GRAD"] += bytes_sent_per_rank(kind, expert * g, len(groups.edp))
    if st.n_chains == 2:
        # DualPipe / Chimera: the stage's twin (the same layers, on pipeline rank p-1-r) sums
        # gradients with it every step (DeepSeek's reference all-reduces across ranks r and
        # p-1-r); after the dp reduction each rank holds its shard, all-reduced with the twin's
        twin = Ranks((groups.dp[0], groups.dp[0] + groups.pipeline[-1] - groups.pipeline[0]))
        sharded = par.zero >= 1 and n_g > 1
        twin_bytes = g * (dense / (n_s if sharded else 1) + expert / (len(groups.edp) if sharded else 1))
        t = (t or 0.0) + _bucketed(hw, "all_reduce", twin_bytes, twin, bucket_bytes(st))
        sent["REDUCE_GRAD"] = sent.get("REDUCE_GRAD", 0.0) + bytes_sent_per_rank("all_reduce", twin_bytes, 2)
    shard = dense / (n_s if par.zero >= 1 else 1)
    shard += expert / (len(groups.edp) if par.zero >= 1 else 1)
    # the step reads and writes the optimizer state (under mixed precision with the fp32 master
    # weights), reads the gradients and writes the weights; pure fp32 training keeps no master
    # copy, so it also reads the weights it updates
    step_bytes = shard * (2 * k + g + (2 * w if st.precision == "fp32" else w))
    if par.framework == "megatron" and st.precision != "fp32":
        step_bytes += shard * megatron_step_extra_bytes(st.precision, g)
    then, then_bytes = 0.0, 0.0
    if par.zero in (1, 2) and n_g > 1 and n_s > 1:
        # ZeRO-1/2: all-gather of the updated parameter shards (reduce-scatter + all-gather
        # = the all-reduce's bytes); overlapped with the next step's forward when asked
        then_bytes = params * w
        sent[PARAM_GATHER] = bytes_sent_per_rank("all_gather", then_bytes, n_s)
        then = cached_collective_time(hw, "all_gather", then_bytes, shard_group)
        if st.overlap.param_gather:
            exposed = param_gather_exposed(then, then_bytes, bucket_bytes(st), forward_s)
            then = exposed + slowdown_s(dev, sms, then - exposed, forward_s)
    update_s = hw.profile.device.optimizer_time(step_bytes) + newton_schulz_s(st, n_layers, moe_layers)
    if par.zero < 3:
        # the step zeroes the persistent gradient buffer every backward adds into (Megatron-Core's
        # zero_grad_buffer; the torch runtime's FlatParams): a write of every local gradient, in place
        update_s += hw.profile.device.update_time(params * g)
    if par.framework == "megatron" and n_g > 1:
        update_s += hw.profile.device.update_time(megatron_grad_scaling_bytes(g) * params)
    ops[Op.STEP] = OpCost(update_s, then_comm_s=then, then_comm_bytes=then_bytes)
    if par.zero == 3 and n_g > 1 and n_s > 1:
        gathered = params * w
        gather = cached_collective_time(hw, "all_gather", gathered, shard_group)
        window, exposed = unit_buffers(par, st.overlap.prefetch, gathered, n_layers, gather, forward_s)
        exposed += slowdown_s(dev, sms, gather - exposed, forward_s)
        # the dp stream carries the whole gather; the stage's compute waits for the exposed part
        ops[Op.UNSHARD] = OpCost(gather, bytes=gathered, stash_bytes=window, mem_kind=UNIT_KIND, wait_s=exposed)
        ops[Op.RESHARD] = OpCost(0.0, free_bytes=window, mem_kind=UNIT_KIND)
        sent["UNSHARD"] = bytes_sent_per_rank("all_gather", gathered, n_s)
    return t, params * g, DPOps(ops, sent)


def fsdp2_copy_bytes(setting: DPSetting) -> dict[Op, float]:
    """Bytes per parameter (of the stage, unsharded) FSDP2 copies on the compute stream in each
    F, I, W and B of a microbatch (``framework = "fsdp"``, ZeRO-3, sharded over more than one
    rank; else none). torch.distributed.fsdp._fully_shard._fsdp_collectives:

    * ``foreach_all_gather_copy_out``: after each unshard the current (compute) stream waits for
      the all-gather, then ``split_with_sizes_copy`` copies the gathered flat buffer into every
      parameter's own unsharded tensor -- read and write the 16-bit weights (2 x ``w``). Once
      before the forward, again before the backward when units reshard after the forward.
    * ``foreach_reduce``: before each reduce-scatter ``_chunk_cat`` copies the unit's unsharded
      gradients (16-bit, the parameters' compute dtype) into the reduce-scatter input in the
      reduce dtype (``parallel.grad_reduce_dtype``; fp32 by default: a widening copy), on the
      current stream too -- read ``w``, write ``g`` -- after every backward whose gradients are
      reduced (per microbatch, the FSDP default), after the weight gradients (W) when the
      backward is split.

    What runs beside the compute is not counted: the all-gather input's copy-in (1/shard of the
    weights, on its own stream), the reduced shard's accumulation (1/shard)."""
    par = setting.parallel
    if par.framework != "fsdp" or par.zero != 3 or par.shard_degree <= 1:
        return {}
    w, _, _ = state_bytes_per_param(setting.optimizer, setting.precision)
    g = par.grad_bytes(setting.precision)
    gather = 2.0 * w
    regather = gather if par.reshard_after_forward else 0.0
    reduce = (w + g) if par.grad_per_microbatch else 0.0
    return {Op.F: gather, Op.I: regather, Op.W: reduce, Op.B: regather + reduce}


def megatron_grad_scaling_bytes(grad_bytes: int) -> int:
    """Bytes per local parameter Megatron's data-parallel gradient sync moves before its
    collective: the gradient buffer is scaled by 1/dp in place, so the collective sums
    (``ParamAndGradBucket.start_grad_sync``: ``grad_data *= gradient_scaling_factor``, core_r0.8.0,
    unless ``average_in_collective``; Megatron-LM v2.5's local DDP: ``buffer_.data /= dp``): a
    read and a write of every gradient, once per step over the whole buffer (not the shard).
    Counted in the step's time (it runs on the compute stream as each bucket's reduction starts).
    Megatron-LM's NaN check of the same buffer (``check_for_nan_in_grad``, on by default only in
    Megatron-LM's own training loop) is not counted."""
    return 2 * grad_bytes


def megatron_step_extra_bytes(precision: str, grad_bytes: int) -> int:
    """Bytes per parameter Megatron's mixed-precision optimizer moves beside the inner step's
    (``MixedPrecisionOptimizer.step`` / ``DistributedOptimizer``, megatron/core/optimizer,
    core_r0.8.0; the 2021-22 megatron/optimizer the same), each a pass of its own over the
    fp32 main gradients or parameters:

    * ``_copy_model_grads_to_main_grads``: ``main_grad.float()``, a copy when the gradient
      buffer is 16-bit (read ``grad_bytes``, write 4; the step then reads 4, not ``grad_bytes``),
      a view when it is fp32;
    * ``_unscale_main_grads_and_check_for_nan`` (fp16 only: bf16 runs without a grad scaler):
      read and write the fp32 gradients;
    * ``clip_grad_norm`` (``--clip-grad`` 1.0 by default): the norm reads the fp32 gradients
      (the rescale, only when the norm exceeds the clip, is not counted);
    * ``_copy_main_params_to_model_params``: reads the fp32 master (its 16-bit write is in the
      step's bytes already).
    """
    copy = 8 if grad_bytes < 4 else 0  # read g + write 4, and the step's read of g becomes 4: +8
    unscale = 8 if precision == "fp16" else 0
    return copy + unscale + 4 + 4


def param_gather_exposed(gather_s: float, nbytes: float, bucket: float, forward_s: float) -> float:
    """Seconds of ZeRO-1/2's overlapped parameter all-gather the next step's first forward waits for.

    Megatron's distributed optimizer (``--overlap-param-gather``) launches the gathers bucket by
    bucket when the next forward starts and waits for each in the pre-hook of the first module
    that uses it: bucket i+1 gathers under bucket i's share of the first microbatch's forward, so
    the wait is the first bucket, then whatever of each later bucket its predecessor's compute
    does not cover (``unit_buffers``' rule with buckets as units). With no forward to hide under
    (``forward_s = 0``) the whole gather waits.
    """
    n = max(1, math.ceil(nbytes / bucket)) if bucket > 0 else 1
    g, c = gather_s / n, forward_s / n
    return min(gather_s, g + (n - 1) * max(0.0, g - c))


def dp_sms(st: DPSetting) -> int:
    """SMs one of the job's data-parallel collectives holds (its group spans nodes or not)."""
    return group_sms(st.cluster.profile, rank_groups(st.parallel).dp)


def bucket_bytes(st: DPSetting) -> float:
    """The gradient bucket in bytes (``parsim.cluster.collectives.grad_bucket_bytes``)."""
    par = st.parallel
    return grad_bucket_bytes(st.overlap.bucket_bytes, par.grad_degree, par.grad_bytes(st.precision))


@lru_cache(maxsize=65536)
def _bucketed(hw: Cluster, kind: str, nbytes: float, group: Ranks, bucket: float) -> float:
    """``bucketed_time``'s seconds, memoised (placement walks every rank)."""
    return bucketed_time(hw.profile, kind, nbytes, list(group), bucket)[1]


NS_ITERATIONS = 5
"""Newton-Schulz iterations of Muon's orthogonalisation (Keller Jordan's reference: ``steps=5``)."""


def newton_schulz_matrices(model: ModelSpec, moe: bool, tp: int, ep: int) -> list[tuple[int, int, float]]:
    """(rows a, columns b, count) of the 2-D weights of one block on one GPU, a <= b: the TP
    shards of its matrices (Megatron's sharding), routed experts split over ``ep``. The
    embedding and the LM head are updated by AdamW in Muon's recipe, not orthogonalised."""
    layer = next(i for i in range(model.n_layers) if is_moe_layer(model, i) == moe)
    out = []
    for gm in layer_gemms(model, 1, tp, layer):
        count = gm.count / ep if gm.name.startswith("expert_") else gm.count
        out.append((min(gm.n, gm.k), max(gm.n, gm.k), count))
    return out


def newton_schulz_flops(a: int, b: int) -> float:
    """FLOPs of one quintic Newton-Schulz iteration on an a x b matrix (a <= b):
    A = X X^T (2a^2 b), B = c1 A + c2 A A (2a^3), X' = c0 X + B X (2a^2 b)."""
    return 4.0 * a * a * b + 2.0 * a ** 3


def newton_schulz_s(st: DPSetting, n_layers: int, moe_layers: int) -> float:
    """Seconds of Muon's orthogonalisation of the stage's matrices, as GEMMs (0 for other
    optimizers). Every DP rank orthogonalises its TP-local matrices whole (Moonlight's
    distributed Muon gathers the shard's matrix, computes, keeps its part)."""
    if st.optimizer != "muon" or st.model is None or n_layers <= 0:
        return 0.0
    dev, par = st.cluster.profile.device, st.parallel
    # the iteration runs in bf16 (Muon's reference casts the update to bfloat16); a GPU without
    # bf16 tensor cores (V100) runs those matmuls on its CUDA cores: the fp32 rate
    prec = "bf16" if "bf16" in dev.peak_flops else "fp32"
    t = 0.0
    for moe, layers in ((False, n_layers - moe_layers), (True, moe_layers)):
        if layers <= 0:
            continue
        for a, b, count in newton_schulz_matrices(st.model, moe, par.tp, par.ep):
            one = dev.gemm_time(a, a, b, prec) + dev.gemm_time(a, a, a, prec) + dev.gemm_time(a, b, a, prec)
            t += layers * count * NS_ITERATIONS * one
    return t


UNIT_KIND = "param_units"
"""Memory kind of ZeRO-3/FSDP's gathered (unsharded) parameter buffers."""


def unit_buffers(par: ParallelConfig, prefetch: int, gathered: float, n_units: int, gather_s: float,
                 forward_s: float) -> tuple[float, float]:
    """(bytes gathered while a stage computes, seconds its compute waits per UNSHARD).

    Resharding after forward (per-microbatch UNSHARDs): the stage is FSDP units of one block
    each; the unit computing and ``prefetch`` units gathered ahead are alive (FSDP2 frees a
    unit after its pass; DeepSpeed's prefetch bucket likewise). Gathering unit i+1 hides under
    unit i's compute: the pass waits for the first unit's gather, then for whatever of each
    later unit's gather the unit before it did not cover, g + (n-1) max(0, g - c) with g and
    c a unit's gather and compute (the forward's compute: the backward's is longer, so this
    is the larger of the two waits). Without prefetch nothing hides: the whole gather waits.
    Kept gathered (reshard_after_forward = false): the whole stage, gathered once per window.
    """
    n = max(1, n_units)
    if not par.reshard_after_forward:
        return gathered, gather_s
    live = min(n, 1 + prefetch)
    if prefetch == 0:
        return gathered * live / n, gather_s
    g, c = gather_s / n, forward_s / n
    return gathered * live / n, g + (n - 1) * max(0.0, g - c)


def clear_caches() -> None:
    """Empty this module's caches (a cold start)."""
    _stage_dp.cache_clear()
    _bucketed.cache_clear()
