"""One transformer block, one microbatch, one GPU: seconds, FLOPs, bytes on the wire, memory.

:func:`layer_cost` is a pure function of hashable inputs (:class:`LayerInputs`, the block's
kind), cached with ``functools.lru_cache``: every stage, scenario or planner candidate with
the same shard of the same model on the same hardware reuses it.

* F: the block's GEMMs through the device's shape-dependent GEMM model, the attention core
  through its FlashAttention efficiency, memory-bound ops through HBM bandwidth; plus the TP
  collectives (2 in forward, 2 in backward, Megatron's f/g operators) and context
  parallelism's ring (``parsim.costs.context``: per-block attention kernels, exposed K/V
  transfers; dK/dV travel back in the backward).
* I (backward for inputs): dX GEMMs, attention backward, memory-bound backward.
* W (backward for weights): dW GEMMs.
* MoE layers: the slowest EP rank's expert GEMMs and the dispatch/combine all-to-alls
  (``parsim.costs.moe``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import parsim.cluster.contention as _contention
import parsim.costs.compute as _compute
import parsim.costs.context as _context
import parsim.costs.memory_ops as _memory_ops
import parsim.costs.moe as _moe
from parsim.cluster.collectives import (
    at_gap,
    bytes_sent_per_rank,
    collective_time,
    in_pass_time,
    link_time,
)
from parsim.cluster.precision import PRECISION_TABLE
from parsim.costs.inputs import Cluster, LayerInputs, Ranks
from parsim.costs.memory import (
    ActivationOptions,
    layer_activation_bytes,
    layer_recompute_transient_bytes,
    selective_dropped_bytes,
)
from parsim.costs.parts import AxisBytes, Parts
from parsim.model import (
    ModelSpec,
    attention_core_flops,
    block_kind,
    has_attention,
    has_gdn,
    has_mamba,
    is_moe_layer,
    gdn_scan_flops,
    mamba_scan_flops,
    sublayers,
    layer_elementwise_bytes,
    layer_gemms,
    layer_params,
)

# FlashAttention backward runs 5 matmuls for the forward's 2 (it recomputes the scores):
# 2.5x the forward's FLOPs, against the 2x that model-FLOP conventions count.
FLASH_BACKWARD_FLOP_RATIO = 2.5


@dataclass(frozen=True)
class LayerCost:
    """One block for one microbatch on one GPU."""

    forward: Parts
    """Seconds of F by part."""
    backward_input: Parts
    """Seconds of I (backward for inputs) by part."""
    backward_weight: Parts
    """Seconds of W (backward for weights) by part."""
    forward_flops: float
    """FLOPs F executes (attention counted over the full causal square)."""
    backward_input_flops: float
    """FLOPs I executes."""
    backward_weight_flops: float
    """FLOPs W executes."""
    forward_bytes: AxisBytes
    """Bytes this GPU sends during F (TP collectives, K/V ring, expert all-to-alls)."""
    backward_input_bytes: AxisBytes
    """Bytes this GPU sends during I (the same collectives on the gradients)."""
    params: float
    """Parameters this GPU holds (after TP and EP sharding, before ZeRO)."""
    expert_params: float
    """Part of ``params`` in routed experts."""
    activation_bytes: float
    """Stash kept from F until the backward."""
    weight_grad_stash_bytes: float
    """Part of the stash W still needs after I (each linear's input and output gradient)."""
    recompute_transient_bytes: float
    """Extra bytes alive while the block is recomputed and back-propagated (full recompute)."""
    attention_forward: Parts = field(default_factory=Parts)
    """The attention core's forward within ``forward`` (kernel, and under context parallelism
    its exposed ring): what rerunning the core costs."""


def representative_layer(model: ModelSpec, moe: bool) -> int:
    """Index of the first block of a kind: a block's cost depends on its index only through
    its kind (:func:`parsim.model.is_moe_layer`)."""
    return next(i for i in range(model.n_layers) if is_moe_layer(model, i) == moe)


def activation_options(inp: LayerInputs) -> ActivationOptions:
    """How activations are kept under these inputs (``parsim.costs.memory``)."""
    o = inp.options
    return ActivationOptions(o.recompute, o.flash_attention, inp.shard.sequence_parallel, o.dropout,
                             bytes_per_element=PRECISION_TABLE[o.precision].activation_bytes,
                             # torchao's rowwise recipe keeps the 16-bit input: its weight gradient
                             # casts it again along the tokens (memory_ops.rowwise_cast_work)
                             fp8_linear_inputs=o.precision == "fp8" and o.fp8_recipe != "rowwise",
                             quantized_input_bytes=_memory_ops.saved_input_bytes(o.fp8_recipe),
                             recompute_modules=o.recompute_modules, eager_modules=not o.fused_kernels)


@lru_cache(maxsize=1024)
def moe_phase(inp: LayerInputs) -> _moe.MoEPhase:
    """Routing, expert GEMMs and all-to-all of one MoE layer (same for every MoE layer)."""
    sh = inp.shard
    # the grouped GEMMs run at the linear layers' precision (FP8 -> MXFP8 on Blackwell's recipe)
    gemm_prec = _compute.linear_precision(inp) if inp.hardware.device.kernels is not None else None
    blockwise = _compute.blockwise_fp8(inp)
    return _moe.moe_phase(inp.model, inp.hardware, inp.moe, inp.options.precision, sh.tokens, sh.ep_group,
                          sh.expert_tp, sh.tp, gemm_prec, blockwise)


@lru_cache(maxsize=65536)
def cached_collective_time(cluster: Cluster, kind: str, nbytes: float, group: Ranks) -> float:
    """``parsim.cluster.collectives.collective_time``, memoised (placement walks every rank)."""
    return collective_time(cluster.profile, kind, nbytes, group)


@lru_cache(maxsize=65536)
def cached_link_time(cluster: Cluster, kind: str, nbytes: float, group: Ranks) -> float:
    """``parsim.cluster.collectives.link_time`` (the formulas on the group's link, not the
    profile's measured NCCL lines), memoised."""
    return link_time(cluster.profile, kind, nbytes, group)


def block_gemms(inp: LayerInputs, moe_layer: bool) -> tuple:
    """The forward GEMMs one block's own cost counts: ``layer_gemms`` of its kind, less the router
    and the routed experts when ``parsim.costs.moe`` costs those (the tokens actually routed)."""
    m, sh = inp.model, inp.shard
    gemms = layer_gemms(m, sh.tokens, sh.tp, representative_layer(m, moe_layer))
    if moe_layer and inp.moe is not None:
        gemms = [g for g in gemms if not g.name.startswith("expert_") and g.name != "router"]
    return tuple(gemms)


def plain_forward_times(inp: LayerInputs, gemms: tuple) -> tuple[float, float]:
    """(GEMM, memory-bound) seconds of one block's forward on a profile without kernel facts
    (cpu-gloo): the calibrated two-knob GEMM model and the elementwise bytes at HBM bandwidth."""
    m, dev, sh, prec = inp.model, inp.hardware.device, inp.shard, inp.options.precision
    f_gemm = sum(dev.gemm_time(g.m, g.n, g.k, prec, g.count) for g in gemms)
    f_mem = dev.layer_memory_time(layer_elementwise_bytes(m, sh.tokens, sh.tp, sh.sequence_parallel,
                                                          PRECISION_TABLE[prec].activation_bytes))
    return f_gemm, f_mem


@lru_cache(maxsize=4096)
def layer_cost(inp: LayerInputs, moe_layer: bool) -> LayerCost:
    """Cost of one block of the given kind (``moe_layer``: it has a routed-expert FFN)."""
    m, dev, sh, o = inp.model, inp.hardware.device, inp.shard, inp.options
    prec = o.precision
    li = representative_layer(m, moe_layer)
    tokens = sh.tokens
    gemms = block_gemms(inp, moe_layer)
    ph = moe_phase(inp) if moe_layer and inp.moe is not None else None
    gemm_flops = sum(g.flops for g in gemms)
    # attention core: this rank's seq/cp queries against all keys of the sequence
    attn_flops = _attention_flops(inp) / sh.cp
    if dev.kernels is not None:  # every kernel through its own model (parsim.costs.compute)
        bc = _compute.block_compute(inp, gemms, moe_layer)
        f_gemm, i_gemm, w_gemm = bc.gemm
        f_attn, i_attn = attention_times(inp)
        f_mem, i_mem = bc.memory
        # the host issues each pass's kernels one by one (``kernel_launch_s`` each: Python
        # dispatch + the CUDA launch); when that takes longer than the GPU runs them, the GPU
        # waits (the excess is charged to the memory-bound part)
        host = dev.kernel_launch_s
        f_mem += max(0.0, bc.kernels[0] * host - (f_gemm + f_attn + f_mem))
        i_mem += max(0.0, bc.kernels[1] * host - (i_gemm + i_attn + i_mem))
        w_gemm = max(w_gemm, bc.kernels[2] * host)
    else:  # a profile without kernel facts (cpu-gloo): the calibrated two-knob models
        f_gemm, f_mem = plain_forward_times(inp, gemms)
        i_gemm = sum(dev.gemm_time(g.m, g.k, g.n, prec, g.count) for g in gemms)
        w_gemm = sum(dev.gemm_time(g.k, g.n, g.m, prec, g.count) for g in gemms)
        f_attn, i_attn = attention_times(inp)
        i_mem = 2 * f_mem
    act_elems = tokens * m.d_model
    tp_fwd, f_slow = tp_layer_comm(inp, act_elems, f_gemm, pass_s=f_gemm + f_attn + f_mem, memory_s=f_mem)
    tp_bwd, i_slow = tp_layer_comm(inp, act_elems, i_gemm, backward=True,
                                   regather_windows=regather_windows_s(inp, gemms),
                                   pass_s=i_gemm + i_attn + i_mem + w_gemm, memory_s=i_mem,
                                   wgrad_windows=wgrad_windows_s(inp, gemms))
    # context parallelism (parsim.costs.context): the K/V ring (or gather / all-to-all) and its
    # attention -- with the kernel model per-block kernels in place of the 1/cp share, without
    # it that share spread over the ring's steps, each later step paying its merge
    ca = _context.cp_attention(inp, (f_attn, i_attn)) if sh.cp > 1 and has_attention(m) else None
    if ca is not None:
        f_attn, i_attn = ca.forward_s, ca.backward_s
    cp_f, cp_i = (ca.forward_comm_s, ca.backward_comm_s) if ca is not None else (0.0, 0.0)
    mamba_cp = None
    if sh.cp > 1 and (has_mamba(m) or has_gdn(m)):
        mamba_cp = mamba_cp_exchange(inp) if has_mamba(m) else gdn_cp_exchange(inp)
    if mamba_cp is not None:  # a Mamba / DeltaNet layer's all-to-alls between sequence and head splits
        cp_f, cp_i = mamba_cp[0], mamba_cp[0]
    fwd = Parts(compute=f_gemm + f_attn + f_mem + f_slow, tp_comm=tp_fwd, cp_comm=cp_f)
    inp_parts = Parts(compute=i_gemm + i_attn + i_mem + i_slow, tp_comm=tp_bwd, cp_comm=cp_i)
    wgt = Parts(compute=w_gemm)
    cp_sent = ca.forward_bytes if ca is not None else (mamba_cp[1] if mamba_cp is not None else 0.0)
    sent_f = AxisBytes(tp=tp_layer_bytes(inp, act_elems), cp=cp_sent)
    sent_i = AxisBytes(tp=tp_layer_bytes(inp, act_elems, backward=True),
                       cp=ca.backward_bytes if ca is not None else cp_sent)  # dK/dV ride back too
    if ph is not None:
        if dev.eager_op_forward_s is not None and dev.eager_op_backward_s is not None:
            # a CPU rank runs the torch runtime's MoE block: its host time is the ops it dispatches
            # (the MoE kernels' launch gaps are not charged there: parsim.costs.moe.layer_kernels)
            ef, eb = eager_moe_extra_ops(m, m.n_experts // len(ph.group), len(ph.group), inp.moe.drop_tokens)
            fwd = fwd + Parts(compute=ef * dev.eager_op_forward_s)
            inp_parts = inp_parts + Parts(compute=eb * dev.eager_op_backward_s)
        fwd, inp_parts, wgt, gemm_flops = _moe_parts(inp, ph, fwd, inp_parts, wgt, gemm_flops)
        a2a = _moe.all_to_all_bytes(ph.routing, m.expert_width, PRECISION_TABLE[prec].activation_bytes)
        ep_sent = AxisBytes(ep=2 * float(a2a["send"]))  # dispatch + combine
        sent_f, sent_i = sent_f + ep_sent, sent_i + ep_sent
    expert = _expert_params(m, li)
    params = (layer_params(m, li) - expert) / sh.tp + expert / (sh.tp * sh.ep)
    act, wstash, transient = _layer_memory(inp, li, ph)
    core = Parts(compute=f_attn, cp_comm=cp_f) if has_attention(m) else Parts()
    return LayerCost(fwd, inp_parts, wgt, gemm_flops + attn_flops, gemm_flops + 2 * attn_flops, gemm_flops,
                     sent_f, sent_i, params, expert / (sh.tp * sh.ep), act, wstash, transient,
                     attention_forward=core)


def mamba_cp_exchange(inp: LayerInputs) -> tuple[float, float]:
    """(seconds, bytes this GPU sends) of one pass's all-to-alls of a Mamba-2 layer under context
    parallelism, as Megatron-Core's ``MambaContextParallel`` runs them: before the convolution and
    the scan, z, x, B, C and dt go from this rank's 1/cp of the sequence (all heads) to the whole
    sequence on 1/cp of the heads (``_all_to_all_cp2hp``, one call each; B and C repeated to cp
    copies when a rank's groups are fewer than cp), and after them y goes back
    (``_all_to_all_hp2cp``): six blocking all-to-alls over the cp group. The backward runs their
    conjugates, the same bytes. The reorder copies that undo and redo attention's load-balanced
    sequence split around them are not counted (memory-bound, one read and write of each tensor)."""
    m, sh, o = inp.model, inp.shard, inp.options
    a = PRECISION_TABLE[o.precision].activation_bytes
    inner = m.mamba_inner / sh.tp
    groups = m.mamba_groups / sh.tp
    bc = max(groups, float(sh.cp)) * m.mamba_state_dim  # B (or C) after the repeat
    widths = (inner, inner, bc, bc, m.mamba_heads / sh.tp, inner)  # z, x, B, C, dt; then y
    return _cp_all_to_alls(inp, [sh.tokens * w * a for w in widths])


def gdn_cp_exchange(inp: LayerInputs) -> tuple[float, float]:
    """(seconds, bytes this GPU sends) of one pass's all-to-alls of a Gated DeltaNet layer under
    context parallelism, as Megatron-Core's ``GatedDeltaNet`` runs them: the input projection's output
    (q, k, v, z, beta, alpha) from this rank's 1/cp of the sequence to the whole sequence on 1/cp of
    the heads (``a2a_cp_to_hp``), and after the gated norm the output back: two blocking all-to-alls
    over the cp group; the backward runs their conjugates, the same bytes."""
    m, sh, o = inp.model, inp.shard, inp.options
    a = PRECISION_TABLE[o.precision].activation_bytes
    widths = (m.gdn_in_proj_width / sh.tp, m.gdn_value_width / sh.tp)
    return _cp_all_to_alls(inp, [sh.tokens * w * a for w in widths])


def _cp_all_to_alls(inp: LayerInputs, sizes: list[float]) -> tuple[float, float]:
    """(seconds, bytes this GPU sends) of blocking all-to-alls over the cp group, one per size
    (bytes of the tensor on this rank)."""
    group, cp = inp.shard.cp_group, inp.shard.cp
    t = sum(cached_collective_time(inp.cluster, "all_to_all", n, group) for n in sizes)
    return t, sum(bytes_sent_per_rank("all_to_all", n, cp) for n in sizes)


def attention_times(inp: LayerInputs) -> tuple[float, float]:
    """(forward, backward) seconds of one block's attention core on this rank (its 1/cp share of
    the queries, before context parallelism's ring): with kernel facts the core's kernels
    (``parsim.costs.compute.attention_core_times``), else the calibrated FLOP model (causal
    blocks skipped when fused; the host's per-pass time added); plus the scores' and the head
    layout's traffic where the core is unfused."""
    dev, o = inp.hardware.device, inp.options
    if not has_attention(inp.model):  # a hybrid layer: a Mamba / DeltaNet layer's mixer, else nothing
        s_f, s_i, _, _ = _compute.mixer_scan_times(inp)
        return s_f, s_i
    if dev.kernels is not None:
        a_f, a_i = _compute.attention_core_times(inp)
        return a_f + scores_traffic(inp, 1.0) + head_layout_traffic(inp), a_i + scores_traffic(inp, 2.0)
    fused = o.flash_attention
    executed = _attention_flops(inp) / inp.shard.cp * (0.5 if fused else 1.0)  # causal blocks skipped
    bwd_ratio = FLASH_BACKWARD_FLOP_RATIO if fused else 2.0
    f = dev.attention_time(executed, o.precision, fused) + scores_traffic(inp, 1.0) + head_layout_traffic(inp)
    i = dev.attention_time(executed * bwd_ratio, o.precision, fused, backward=True) + scores_traffic(inp, 2.0)
    return f + launch_gaps(inp, 1), i + launch_gaps(inp, 2)


def _layer_memory(inp: LayerInputs, li: int, ph) -> tuple[float, float, float]:
    """(activation stash, part W still needs after I, full-recompute transient) of one block."""
    m, sh = inp.model, inp.shard
    seq = sh.seq_len // sh.cp
    opts = activation_options(inp)
    # MoE blocks stash the tokens their experts actually get (the slowest EP rank's)
    rows = ph.routed_rows if ph is not None else None
    etp = ph.expert_tp if ph is not None else None
    act = layer_activation_bytes(m, seq, sh.microbatch_size, sh.tp, opts, li, routed_rows=rows, expert_tp=etp)
    moe_rerun = opts.recompute == "selective" and "moe" in opts.recompute_modules
    if ph is not None and opts.recompute != "full" and not moe_rerun:  # routing map, probs, row ids
        act += ph.routing_stash_bytes
    wstash = _weight_grad_stash(m, sh.tokens, sh.tp, sh.sequence_parallel)
    transient = 0.0
    if inp.options.recompute in ("full", "op"):
        transient = layer_recompute_transient_bytes(m, seq, sh.microbatch_size, sh.tp, opts, li)
    elif opts.recompute == "selective":  # what the rerun modules rebuild lives until their backward
        transient = selective_dropped_bytes(m, seq, sh.microbatch_size, sh.tp, opts, li, rows, etp)
        if ph is not None and moe_rerun:
            transient += ph.routing_stash_bytes
    return act, wstash, transient


def _moe_parts(inp: LayerInputs, ph, fwd: Parts, bwd_in: Parts, wgt: Parts, flops: float):
    """Add the slowest EP rank's MoE kernels (router, permute/unpermute, grouped GEMMs,
    activation, FP8 casts: ``parsim.costs.moe``) and its dispatch + combine all-to-alls (2
    per pass; the forward's token-count exchange before them); with ``overlap.ep_comm`` only
    what exceeds the pass's compute is exposed, and the hidden part slows that compute by the
    SMs its kernels hold. The block's memory-bound model already counted
    the routed experts' activation, casts and permutations on the mean rank's tokens: that share
    comes back out (no double count)."""
    counted_f, counted_i = _routed_memory_counted(inp)
    fwd = fwd + Parts(compute=ph.forward_s - counted_f)
    bwd_in = bwd_in + Parts(compute=ph.backward_input_s - counted_i)
    wgt = wgt + Parts(compute=ph.backward_weight_s)
    hide = inp.options.overlap.ep_comm
    # the forward first exchanges the token counts that size its dispatch (the backward reuses
    # them); blocking, each call's in-situ price may depend on the compute before it (at_gap:
    # the pass's compute over its calls, on a profile that measured that dependence)
    a2a_f = a2a_i = ph.all_to_all_s
    counts = ph.count_exchange_s
    calls_f = 2 + (counts > 0)  # the forward's blocking calls: dispatch, combine (and the counts)
    if not hide:
        hw = inp.cluster.profile
        gap_f = fwd.compute / calls_f
        gap_i = (bwd_in.compute + wgt.compute) / 2
        a2a_f = at_gap(hw, "all_to_all", ph.group, a2a_f, gap_f)
        a2a_i = at_gap(hw, "all_to_all", ph.group, a2a_i, gap_i)
        if counts > 0:
            counts = at_gap(hw, "all_gather", ph.group, counts, gap_f)
    comm_f, comm_i = 2 * a2a_f + counts, 2 * a2a_i
    if not hide:  # blocking: the compute after each call re-warms (a CPU rank; 0 on a GPU)
        dev = inp.hardware.device
        warm_f, warm_i = _contention.rewarm_s(dev, calls_f), _contention.rewarm_s(dev, 2)
        return (fwd + Parts(compute=warm_f, ep_comm=comm_f), bwd_in + Parts(compute=warm_i, ep_comm=comm_i), wgt,
                flops + ph.forward_flops)
    # Megatron-Core's combined 1F1B (overlap_moe_expert_parallel_comm) runs one microbatch's
    # forward beside another's backward, layer by layer: each dispatch/combine hides under the
    # other pass's attention or expert MLP (models/common/model_chunk_schedule_plan.py). In the
    # steady state the total hidden is the same as each pass hiding under its own compute, which
    # is how it is booked here. The hidden all-to-alls hold their kernels' SMs, so the compute
    # beside them slows (parsim.cluster.contention), booked as compute as for TP overlap.
    dev = inp.hardware.device
    comp_i = bwd_in.compute + wgt.compute
    ep_f, ep_i = max(0.0, comm_f - fwd.compute), max(0.0, comm_i - comp_i)
    slow_f = _contention.slowdown_s(dev, ph.dispatcher_sms, comm_f - ep_f, fwd.compute)
    slow_i = _contention.slowdown_s(dev, ph.dispatcher_sms, comm_i - ep_i, comp_i)
    return (fwd + Parts(compute=slow_f, ep_comm=ep_f), bwd_in + Parts(compute=slow_i, ep_comm=ep_i), wgt,
            flops + ph.forward_flops)


def _routed_memory_counted(inp: LayerInputs) -> tuple[float, float]:
    """(forward, backward-input) seconds the block's memory-bound model gives the routed
    experts. That model is linear in the routed width top_k * d_ff_expert, so the share is
    the difference against a one-wide expert, scaled by D / (D - 1)."""
    m, sh, dev = inp.model, inp.shard, inp.hardware.device
    big = m.d_ff_expert_
    if big <= 1:
        return 0.0, 0.0
    small = replace(inp, model=replace(m, d_ff_expert=1))
    scale = big / (big - 1)
    if dev.kernels is not None:
        (f1, b1), (f0, b0) = _compute.memory_work(inp, True), _compute.memory_work(small, True)
        return (dev.layer_memory_time(max(0.0, f1.bytes - f0.bytes) * scale),
                dev.layer_memory_time(max(0.0, b1.bytes - b0.bytes) * scale))
    a = PRECISION_TABLE[inp.options.precision].activation_bytes
    e1 = layer_elementwise_bytes(m, sh.tokens, sh.tp, sh.sequence_parallel, a)
    e0 = layer_elementwise_bytes(small.model, sh.tokens, sh.tp, sh.sequence_parallel, a)
    t = dev.layer_memory_time(max(0.0, e1 - e0) * scale)
    return t, 2 * t


def tp_collective_time(inp: LayerInputs, kind: str, nbytes: float) -> float:
    """One ``kind`` collective of ``nbytes`` over the tensor-parallel group: NCCL's, or, with
    ``overlap.tp_comm`` under sequence parallelism, Transformer Engine's userbuffers ring exchange
    (point-to-point copies over NVLink, not NCCL: the formulas on the link, :func:`cached_link_time`)."""
    if inp.options.overlap.tp_comm and inp.shard.sequence_parallel:
        return cached_link_time(inp.cluster, kind, nbytes, inp.shard.tp_group)
    return cached_collective_time(inp.cluster, kind, nbytes, inp.shard.tp_group)


def in_pass_calls_time(inp: LayerInputs, kind: str, nbytes: float, calls: int, gap_s: float) -> float:
    """``calls`` blocking ``kind`` collectives over the tensor-parallel group inside one pass of a
    block, ``gap_s`` of its compute before each on average: :func:`~parsim.cluster.collectives.in_pass_time`
    on :func:`tp_collective_time` (a profile that measured how the in-situ cost grows with the
    compute before the call prices them at that gap, :func:`~parsim.cluster.collectives.at_gap`;
    the others at ``calls`` x the collective's time)."""
    return in_pass_time(inp.cluster.profile, kind, nbytes, inp.shard.tp_group, calls, gap_s,
                        tp_collective_time(inp, kind, nbytes))


def _site_gemms_s(inp: LayerInputs, gemms: tuple, weight: bool) -> tuple[float, ...]:
    """Seconds of each column-parallel site's input-gradient GEMMs (``weight`` false) or weight-gradient
    GEMMs (``weight`` true), by the sites of :data:`parsim.costs.compute.SEQUENCE_GATHERED_GEMMS` (a
    hybrid layer's one sub-layer: its own site only)."""
    dev = inp.hardware.device
    kernels = dev.kernels is not None

    def seconds(g) -> float:
        prec = _compute.gemm_precision(inp, g.name) if kernels else inp.options.precision
        m, n, k = (g.k, g.n, g.m) if weight else (g.m, g.k, g.n)
        return dev.gemm_time(m, n, k, prec, g.count)
    sites = _compute.SEQUENCE_GATHERED_GEMMS
    if inp.model.hybrid_pattern:  # one sub-layer: only its own site
        sites = tuple(site for site in sites if any(g.name in site for g in gemms))[:1]
    return tuple(sum(seconds(g) for g in gemms if g.name in site) for site in sites)


def regather_windows_s(inp: LayerInputs, gemms: tuple) -> tuple[float, ...]:
    """Seconds of each site's input-gradient GEMMs (:data:`parsim.costs.compute.SEQUENCE_GATHERED_GEMMS`): what
    Megatron's backward re-gather of that site's input runs beside."""
    return _site_gemms_s(inp, gemms, weight=False)


def wgrad_windows_s(inp: LayerInputs, gemms: tuple) -> tuple[float, ...]:
    """Seconds of each column-parallel site's weight-gradient GEMMs: what its input-gradient
    all-reduce (reduce-scatter under sequence parallelism) runs beside (``overlap.tp_grad_allreduce``)."""
    return _site_gemms_s(inp, gemms, weight=True)


def tp_layer_comm(inp: LayerInputs, act_elems: float, gemm_s: float, backward: bool = False,
                  regather_windows: tuple[float, ...] = (0.0, 0.0), pass_s: float = 0.0,
                  memory_s: float = 0.0, wgrad_windows: tuple[float, ...] = ()) -> tuple[float, float]:
    """(exposed TP communication, compute slowed by the hidden part) of one block in one pass
    (Megatron f/g operators).

    Without sequence parallelism: two all-reduces of the block's activation (after the
    attention projection and after FC2). With it: an all-gather before QKV/FC1 and a
    reduce-scatter after proj/FC2 -- the same ring bytes, norms sharded. The backward runs
    their conjugates (the reduce-scatters' all-gathers, the all-gathers' reduce-scatters) and,
    as Megatron-Core's ``LinearWithGradAccumulationAndAsyncCommunication`` keeps only this
    rank's sequence slice of QKV's and FC1's input (what the activation model counts), gathers
    that input again for their weight gradients: two more all-gathers. Megatron launches each
    re-gather asynchronously beside its layer's input-gradient GEMMs (``regather_windows``, one
    per site) and waits for it after them (``parsim.cluster.contention.async_beside``).

    With ``overlap.tp_comm`` the collectives (the backward's re-gathers among them) are split
    into tp chunks pipelined with the neighbouring GEMMs: the first chunk stays exposed, and
    whatever exceeds the GEMMs. The
    hidden chunks hold SMs the GEMMs lose (``parsim.cluster.contention``): with sequence
    parallelism Transformer Engine's userbuffers (forward: ring-exchange all-gathers and
    pipelined reduce-scatters; backward: ring-exchange and bulk overlaps, half each), else
    NCCL's CTAs.

    The backward's all-reduces (without sequence parallelism) or reduce-scatters (with it) are the
    column-parallel linears' input gradients; with ``overlap.tp_grad_allreduce`` (Megatron's default:
    its ``LinearWithGradAccumulationAndAsyncCommunication`` and Transformer Engine's ``Linear`` launch
    them with ``async_op=True``; ``TrainOptions.async_grad_reduce``) each runs beside its site's weight-gradient
    GEMMs (``wgrad_windows``) and is waited for after them, like the re-gathers above; else they
    block.

    ``pass_s``: the pass's compute, ``memory_s`` its memory-bound part, which the calls'
    in-situ price may depend on (:func:`in_pass_calls_time`, the blocking calls only): the two
    all-reduces each follow half the pass; under sequence parallelism the all-gathers follow
    the norms and residual adds (half the memory-bound part each) and the reduce-scatters the
    GEMMs and attention between them (half the rest each; in the backward the re-gathers
    split those GEMMs too: a quarter each).
    """
    sh = inp.shard
    if sh.tp <= 1:
        return 0.0, 0.0
    n = sublayers(inp.model)  # each sub-layer's pair of calls (a hybrid layer has one sub-layer)
    q, r = _compute.tp_wire_bytes(inp)
    # every all-gather feeds a GEMM, which Transformer Engine gathers quantized under FP8 (the
    # forward's inputs, the backward's output gradients -- ``grad_output_preprocess`` -- and the
    # inputs re-gathered for the weight gradients); every reduce-scatter or all-reduce sums a GEMM's
    # 16-bit output
    gather_bytes = act_elems * q
    gather = tp_collective_time(inp, "all_gather", gather_bytes) if sh.sequence_parallel else 0.0
    regathers = (gather,) * len(regather_windows) if backward else ()
    # the backward's column-parallel input gradients (an all-reduce each, a reduce-scatter under sequence
    # parallelism) launched beside the weight-gradient GEMMs instead of blocking
    async_grad = backward and inp.options.async_grad_reduce and bool(wgrad_windows)
    beside = ()
    if async_grad:
        t_grad = tp_collective_time(inp, "reduce_scatter" if sh.sequence_parallel else "all_reduce", act_elems * r)
        beside = tuple((t_grad, window) for window in wgrad_windows)
    if sh.sequence_parallel:
        comm = in_pass_calls_time(inp, "all_gather", gather_bytes, n, memory_s / n)
        if not async_grad:
            comm += in_pass_calls_time(inp, "reduce_scatter", act_elems * r, n,
                                       (pass_s - memory_s) / (n + len(regathers)))
    else:
        comm = 0.0 if async_grad else in_pass_calls_time(inp, "all_reduce", act_elems * r, n, pass_s / n)
    dev = inp.hardware.device
    if not inp.options.overlap.tp_comm:
        # each blocking call leaves the compute after it to re-warm (a CPU rank's core; 0 on a GPU);
        # the backward's re-gathers run beside their GEMMs instead (async_beside below)
        slow = _contention.rewarm_s(dev, 2 * n if sh.sequence_parallel else n)
        for t, window in tuple(zip(regathers, regather_windows)) + beside:
            exposed, hidden_cost = _contention.async_beside(inp.hardware, t, window, sh.tp_group)
            comm, slow = comm + exposed, slow + hidden_cost
        return comm, slow
    comm += sum(regathers)
    exposed = max(comm / sh.tp, comm - gemm_s)
    if sh.sequence_parallel:
        ub = _contention.USERBUFFERS_SMS
        sms = (ub["ring_exchange"] + (ub["bulk"] if backward else ub["pipeline"])) / 2
    else:
        sms = _contention.group_sms(inp.hardware, sh.tp_group)
    return exposed, _contention.slowdown_s(dev, sms, comm - exposed, gemm_s)


def tp_layer_bytes(inp: LayerInputs, act_elems: float, backward: bool = False) -> float:
    """Bytes one GPU sends in a block's TP collectives in one pass (those :func:`tp_layer_comm`
    times, each at its wire bytes: :func:`parsim.costs.compute.tp_wire_bytes`; the backward's
    re-gathers under sequence parallelism included)."""
    tp = inp.shard.tp
    if tp <= 1:
        return 0.0
    n = sublayers(inp.model)
    q, r = _compute.tp_wire_bytes(inp)
    if inp.shard.sequence_parallel:
        regather = n * bytes_sent_per_rank("all_gather", act_elems * q, tp) if backward else 0.0
        return n * (bytes_sent_per_rank("all_gather", act_elems * q, tp)
                    + bytes_sent_per_rank("reduce_scatter", act_elems * r, tp)) + regather
    return n * bytes_sent_per_rank("all_reduce", act_elems * r, tp)


def scores_traffic(inp: LayerInputs, passes: float) -> float:
    """Without FlashAttention the s x s scores go through HBM: the fused scale-mask-
    softmax reads and writes them, dropout reads them and writes them with a 1-byte
    mask, the PV batched GEMM reads them (forward; the backward does it twice)."""
    o, sh = inp.options, inp.shard
    if o.flash_attention or not has_attention(inp.model):
        return 0.0
    heads = max(1, inp.model.n_heads // sh.tp)
    return passes * inp.hardware.device.layer_memory_time(
        scores_pass_bytes(sh.microbatch_size * heads, sh.seq_len // sh.cp, sh.seq_len, o.precision, o.dropout,
                          o.causal_softmax_triangle))


def head_layout_traffic(inp: LayerInputs) -> float:
    """Without a fused attention kernel the forward moves Q, K and V into head-major
    (batch*heads, s, d_head) layout for the two batched GEMMs and the context back to
    token-major for the output projection: four transposing copies (read + write).
    Their backward is a view (the gradients flow back through the same strides): on the
    torch runtime B matched without them and F fell short by about these. Calibration's
    attention cases start from head-major tensors, so they are not in its efficiency."""
    o, sh, m = inp.options, inp.shard, inp.model
    if o.flash_attention or not has_attention(m):
        return 0.0
    q = m.n_heads * m.head_dim_ / sh.tp
    kv = m.n_kv_heads * m.head_dim_ / (sh.tp if m.n_kv_heads >= sh.tp else 1)
    return inp.hardware.device.layer_memory_time(
        2.0 * sh.tokens * (2 * q + 2 * kv) * PRECISION_TABLE[o.precision].activation_bytes)


def launch_gaps(inp: LayerInputs, passes: int) -> float:
    """Host time of one block per pass outside the kernels' own time. On a device that states
    the torch runtime's per-op host time (``eager_op_forward_s`` / ``eager_op_backward_s``:
    a CPU rank, where the host is the device and every op's Python module call, dispatch and
    autograd recording run serially with the compute) the runtime's own ops per pass
    (:func:`eager_block_ops`; an MoE layer adds :func:`eager_moe_extra_ops` in ``layer_cost``) at
    that time. Otherwise kernel launch gaps: ~12 kernels in a
    fused forward (2 norms, 4 GEMMs, attention, bias-gelu, 2 bias-dropout-adds, 2 TP
    collectives), +3 unfused attention kernels without FlashAttention; the backward launches
    twice as many."""
    dev = inp.hardware.device
    per_op = dev.eager_op_forward_s if passes == 1 else dev.eager_op_backward_s
    if per_op is not None:
        fwd, bwd = eager_block_ops(inp.model, inp.options.flash_attention)
        return (fwd if passes == 1 else bwd) * per_op
    n = 12 + (0 if inp.options.flash_attention else 3)
    return passes * n * dev.kernel_launch_s


def eager_block_ops(m: ModelSpec, flash: bool) -> tuple[int, int]:
    """(forward, backward) aten ops one dense block of the torch validation runtime
    (``parsim.validate.model.Block``, tp = cp = 1) dispatches, views included: counted with a
    ``TorchDispatchMode`` over every norm / FFN / bias / attention-kernel / GQA combination
    (``tests/test_eager_ops.py`` holds this to the count). The explicit attention core adds
    the head-major reshapes, two batched GEMMs, the mask add and the softmax (GQA: the mask
    repeated per grouped head); RMSNorm and SwiGLU are autograd Functions with their own
    elementwise ops; each biased linear adds a reduction (and its view) to the backward."""
    norm_rms, swiglu, gqa = m.norm != "layernorm", m.ffn == "swiglu", m.n_kv_heads < m.n_heads
    fwd = 32 + (0 if flash else 21 + 2 * gqa) + 10 * norm_rms + 5 * swiglu
    biased = (4 + swiglu) if m.bias else int(m.qkv_bias)
    bwd = 54 + (0 if flash else 22 + gqa) + 16 * norm_rms + 17 * swiglu + 2 * biased
    return fwd, bwd


def eager_moe_extra_ops(m: ModelSpec, n_local: int, ep_group: int, drop: bool) -> tuple[int, int]:
    """(forward, backward) aten ops the torch validation runtime's MoE block
    (``parsim.validate.experts.MoE``) dispatches beyond :func:`eager_block_ops`' dense block of
    the same model (whose FFN it replaces): the router and top-k (softmax, top-k, renormalise
    when top_k > 1), with ``drop`` the capacity bookkeeping (one-hot, cumsum, the masks), the sort
    by expert, the gathers and the weighted index_add of the combine, ``n_local`` experts' own
    FFNs (one loop iteration each), the shared expert, and with an EP group of ``ep_group`` > 1
    ranks the count exchange, the two all-to-alls and their splits. Counted with a
    ``TorchDispatchMode`` (calibration's ``op_counter``) over ffn, bias, experts per rank, top_k,
    dropping, shared experts and ep in {1, 2}, every expert given rows (``tests/test_eager_ops.py``
    holds it to the count)."""
    sw, bias = int(m.ffn == "swiglu"), int(m.bias)
    shared = int(m.n_shared_experts * m.d_ff_shared_ > 0)
    k2, ep = int(m.top_k > 1), int(ep_group > 1)
    per_f = 6 + 3 * sw                        # an expert's forward, with its output split
    per_b = 15 + 15 * sw + 4 * bias + 2 * sw * bias
    fwd = (20 - 5 * sw + per_f * (n_local + shared) + 15 * int(drop) + 2 * k2
           + ep * (10 + n_local + int(n_local > 1)))
    bwd = (16 - 17 * sw - 4 * bias - 2 * sw * bias + per_b * n_local + (per_b - 1) * shared
           + 2 * int(drop) + k2 + ep * (4 + 3 * n_local))
    return fwd, bwd


def _attention_flops(inp: LayerInputs) -> float:
    """Forward attention-core FLOPs of one block (Megatron's full-square convention), averaged
    over the model's blocks when they differ (sliding-window layers)."""
    m, sh = inp.model, inp.shard
    if has_mamba(m):  # a Mamba layer: its SSD scan's FLOPs in the core's place
        return mamba_scan_flops(m, sh.microbatch_size * sh.seq_len, sh.tp)
    if has_gdn(m):  # a Gated DeltaNet layer: its delta rule's
        return gdn_scan_flops(m, sh.microbatch_size * sh.seq_len, sh.tp)
    if m.layer_types is None:
        return attention_core_flops(m, sh.microbatch_size, sh.seq_len, sh.tp)
    return sum(attention_core_flops(m, sh.microbatch_size, sh.seq_len, sh.tp, li)
               for li in range(m.n_layers)) / m.n_layers


MLP_GEMMS = ("fc1", "fc2", "gate", "up", "down")
"""A dense block's MLP GEMMs (``parsim.model.shapes``)."""
MLA_UP_GEMMS = ("q_up", "kv_up")
"""MLA's up-projections (with ``q_lora_rank = 0`` the query's projection is a plain ``q`` on
the norm's output, outside Megatron's ``mla_up_proj`` checkpoint)."""


@lru_cache(maxsize=4096)
def module_recompute(inp: LayerInputs, moe_layer: bool) -> tuple[Parts, float, AxisBytes]:
    """(seconds, FLOPs, bytes sent) selective recomputation reruns of one block in its backward: the forward
    of each module in ``options.recompute_modules`` (``parsim.config.scenario.RECOMPUTE_MODULES``)
    that exists in a block of this kind, as Megatron-Core reruns it:

    * ``core_attn``: the attention core's forward (``LayerCost.attention_forward``): Megatron's
      ``_checkpointed_attention_forward`` reruns it in the backward even when the kernel is fused
      (FlashAttention keeps only Q, K, V, O and the log-sum-exp, so nothing is saved: NVIDIA's
      matched Moonlight-16B A/B measures -0.01% peak memory and +3.85% step time for it);
    * ``mlp`` (dense blocks): the MLP's GEMMs, its norm and activation, and its two TP
      collectives again (half the block's forward TP communication);
    * ``moe`` (MoE blocks): the whole MoE forward -- router, permutations, grouped GEMMs,
      activation, FP8 casts (``parsim.costs.moe``), the shared experts -- and its dispatch and
      combine all-to-alls (token-count exchange included), exposed: the rerun sits inside the
      backward, ahead of the layer's gradient;
    * ``moe_act``: the grouped experts' activation over the rows the slowest rank computes;
    * ``shared_experts``: their GEMMs and activation;
    * ``layernorm``: each norm that is its own module (MLA's input norm; an MoE block's pre-MLP norm);
    * ``mla_up_proj``: the Q and KV up-projections, rotary, and the copies that assemble the
      core's contiguous Q, K and V.
    """
    mods, m, sh, o, dev = inp.options.recompute_modules, inp.model, inp.shard, inp.options, inp.hardware.device
    gemms = block_gemms(inp, moe_layer)
    kernels = dev.kernels is not None
    a = PRECISION_TABLE[o.precision].activation_bytes
    pieces = _memory_ops.forward_pieces(m, sh.tokens, sh.tp, sh.sequence_parallel, a, o.fused_kernels, o.dropout,
                                        moe_layer)

    def gemm_s(names) -> tuple[float, float]:
        chosen = [g for g in gemms if g.name in names]
        if kernels:
            t = _compute.forward_gemm_time(inp, chosen)
        else:
            t = sum(dev.gemm_time(g.m, g.n, g.k, o.precision, g.count) for g in chosen)
        return t, float(sum(g.flops for g in chosen))

    def mem_s(*works) -> float:
        return sum(_memory_ops.work_time(dev, w) + (w.kernels * dev.kernel_launch_s if kernels else 0.0) for w in works)

    out, flops, sent = Parts(), 0.0, AxisBytes()
    if "core_attn" in mods and has_attention(m):  # Megatron's checkpoint reruns the core's forward, fused or not
        rerun = layer_cost(inp, moe_layer).attention_forward
        out += Parts(recompute=rerun.compute, cp_comm=rerun.cp_comm)
        flops += _attention_flops(inp) / sh.cp
    if "mlp" in mods and not moe_layer and block_kind(m) in ("T", "-"):
        t, f = gemm_s(MLP_GEMMS)
        act_elems = sh.tokens * m.d_model
        tp_f, slow = tp_layer_comm(inp, act_elems, t)
        n = sublayers(m)  # the MLP's share of the block's collectives: one sub-layer's
        out += Parts(recompute=t + slow / n + mem_s(pieces["norm"], pieces["activation"]), tp_comm=tp_f / n)
        flops += f
        sent += AxisBytes(tp=tp_layer_bytes(inp, act_elems) / n)
    ph = moe_phase(inp) if moe_layer and inp.moe is not None else None
    shared = tuple(g.name for g in gemms if g.name.startswith("shared_"))
    if moe_layer and ("moe" in mods or "shared_experts" in mods) and shared:
        # the shared experts' activation: the block's memory model counts it with the routed
        # experts' (``forward_pieces(moe=True)``) in proportion to their widths
        t, f = gemm_s(shared)
        share = m.n_shared_experts * m.d_ff_shared_ / (m.top_k * m.d_ff_expert_ + m.n_shared_experts * m.d_ff_shared_)
        out += Parts(recompute=t + share * mem_s(pieces["activation"]))
        flops += f
    if ph is not None and "moe" in mods:
        out += Parts(recompute=ph.forward_s, ep_comm=2 * ph.all_to_all_s + ph.count_exchange_s)
        flops += ph.forward_flops
        a2a = _moe.all_to_all_bytes(ph.routing, m.expert_width, a)
        sent += AxisBytes(ep=2 * float(a2a["send"]))
    elif ph is not None and "moe_act" in mods:
        out += Parts(recompute=ph.kernels.activation[0])
    if "layernorm" in mods:
        separate = int(m.is_mla) + int(moe_layer)  # the norms that are not fused into a linear
        out += Parts(recompute=separate * mem_s(pieces["norm"]))
    if "mla_up_proj" in mods and m.is_mla:
        t, f = gemm_s(MLA_UP_GEMMS)
        heads = max(1, m.n_heads // sh.tp)
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        copies = _memory_ops.MemoryWork(2.0 * sh.tokens * heads * (2 * qk + m.v_head_dim) * a, 3)
        out += Parts(recompute=t + mem_s(pieces["rotary"], copies))
        flops += f
    return out, flops, sent


OP_SAC_RECOMPUTED = ("attn_out", "fc2")
"""Of a four-matmul (GeLU) block under torchtitan's op-level checkpointing, the matmuls at an
even position of the per-block count (second and fourth): always recomputed."""


@lru_cache(maxsize=4096)
def op_recompute_time(inp: LayerInputs, moe_layer: bool) -> float:
    """Seconds torchtitan's op-level selective checkpointing reruns per block in the backward.

    The policy (``memory.op_checkpoint_bytes_per_token``) saves matmul and attention outputs and
    recomputes every other op, so the rerun is the block's memory-bound forward work (norms,
    rotary, activations, residual adds) plus the matmuls it did not save: of a SwiGLU block's
    seven (count odd) each one every other step, half the forward GEMM time on average; of a GeLU
    block's four, the second and fourth (the projection and FC2) every step. The attention core
    is saved, not rerun. Routed experts (MoE blocks) are not counted.
    """
    gemms = block_gemms(inp, moe_layer)
    share = 0.5 if inp.model.ffn == "swiglu" else (
        sum(g.flops for g in gemms if g.name in OP_SAC_RECOMPUTED) / max(1.0, sum(g.flops for g in gemms)))
    if inp.hardware.device.kernels is not None:
        bc = _compute.block_compute(inp, gemms, moe_layer)
        return share * bc.gemm[0] + bc.memory[0]
    f_gemm, f_mem = plain_forward_times(inp, gemms)
    return share * f_gemm + f_mem


def scores_pass_bytes(batch_heads: int, s_q: int, s_k: int, precision: str, dropout: bool = False,
                      triangle: bool = False) -> float:
    """Bytes one forward pass of unfused attention moves through memory for its s x s
    scores (:func:`scores_traffic`; the backward moves twice as many): the fused
    scale-mask-softmax reads and writes them, dropout reads them and writes them with a
    1-byte mask, the PV batched GEMM reads them. Calibration takes the same off. ``triangle``:
    the softmax reads only the causal half (Megatron's upper-triangular kernel,
    ``TrainOptions.causal_softmax_triangle``)."""
    per_pass = (1.5 if triangle else 2) + (2.5 if dropout else 0.0) + 1
    return per_pass * batch_heads * s_q * s_k * PRECISION_TABLE[precision].activation_bytes


def _expert_params(m: ModelSpec, li: int) -> float:
    if not m.is_moe or not is_moe_layer(m, li):
        return 0.0
    f = m.d_ff_expert or m.d_ff
    mats = 3 if m.ffn == "swiglu" else 2
    return m.n_experts * mats * m.expert_width * f


def _weight_grad_stash(m: ModelSpec, tokens: int, tp: int, sp: bool) -> float:
    """Bytes W still needs after I: each linear's input and output gradient (zb-formulas: 32sbh for GPT)."""
    h, q = m.d_model, m.n_heads * m.head_dim_
    kv = m.n_kv_heads * m.head_dim_
    f = m.d_ff
    rep = tp if sp else 1
    fc1_out = (4 * f if m.ffn == "swiglu" else 2 * f) / tp
    kind = block_kind(m)
    if kind == "M":  # the input projection's input and output gradient, the output projection's
        inputs = 2 * h / rep + 2 * m.mamba_inner / tp
        grads = 2 * m.mamba_in_proj_width / tp + 2 * h / rep
    elif kind == "G":
        inputs = 2 * h / rep + 2 * m.gdn_value_width / tp
        grads = 2 * m.gdn_in_proj_width / tp + 2 * h / rep
    elif kind == "*":
        gate = q if m.attn_output_gate else 0
        inputs, grads = 2 * h / rep + 2 * q / tp, 2 * (q + gate + 2 * kv) / tp + 2 * h / rep
    elif kind in ("-", "E"):
        inputs, grads = 2 * h / rep + 2 * f / tp, fc1_out + 2 * h / rep
    else:
        inputs = 2 * h / rep + 2 * q / tp + 2 * h / rep + 2 * f / tp
        grads = 2 * (q + 2 * kv) / tp + 2 * h / rep + fc1_out + 2 * h / rep
    return tokens * (inputs + grads)


def clear_caches() -> None:
    """Empty this module's caches (a cold start)."""
    for fn in (moe_phase, cached_collective_time, cached_link_time, layer_cost, op_recompute_time, module_recompute):
        fn.cache_clear()
    _context.clear_caches()
