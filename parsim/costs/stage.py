"""A stage (one model piece) for one microbatch: the sum of its blocks (``parsim.costs.layer``)
plus the embedding on the first stage and the LM head and loss on the last, recomputation,
and the pipeline ops' costs and memory rules (F/B/I/W ``OpCost``).

:func:`stage_cost` is a pure function of hashable inputs (:class:`LayerInputs`,
:class:`StageShape`), cached: stages with the same kinds of blocks in the same position
cost the same whatever their index, pipeline depth or data-parallel degree.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache
from operator import add

from parsim.cluster.collectives import bytes_sent_per_rank
from parsim.cluster.contention import async_beside, rewarm_s
from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.moe import for_moe_layer
from parsim.costs.compute import linear_precision, tp_wire_bytes
from parsim.costs.inputs import LayerInputs
from parsim.costs.layer import (
    activation_options,
    layer_cost,
    module_recompute,
    op_recompute_time,
    tp_collective_time,
)
from parsim.costs.memory import logits_bytes, state_bytes_per_param
from parsim.costs.memory_ops import loss_transient_bytes_per_logit, loss_work
from parsim.costs.parts import AxisBytes, Parts
from parsim.model import (
    ModelSpec,
    block_kind,
    embedding_params,
    head_gemm,
    head_params,
    is_moe_layer,
    mtp_block_kinds,
    mtp_join_params,
    uniform_model,
)
from parsim.schedule.ir import Op
from parsim.sim.engine import OpCost

PIPELINE_OPS = (Op.F, Op.I, Op.W, Op.B)


@dataclass(frozen=True)
class StageShape:
    """What a stage's cost depends on beyond the shard: its blocks' kinds and its position."""

    kinds: tuple[bool | int | str, ...]
    """Per block, in order: has a routed-expert (MoE) FFN; with one routing histogram per MoE
    layer, an MoE block's kind is its 1-based index among the MoE layers (:func:`block_inputs`);
    a hybrid model's layers are their symbols ("M", "*", "-", "E": ``ModelSpec.hybrid_pattern``),
    an MoE layer with its own routing its index as above."""
    first: bool
    """Holds the embedding (first stage of a model copy)."""
    last: bool
    """Holds the final norm, LM head and loss (last stage of a model copy)."""
    head_copy: bool
    """Tied embeddings split over stages: the last stage keeps its own copy of the matrix."""
    mtp: int = 0
    """Multi-token prediction depths on this stage (``model.mtp_layers`` on the last stage of a
    model copy: Megatron-Core's default placement, beside the loss)."""
    bf16: tuple[bool, ...] = ()
    """Per block (empty: none): kept in BF16 under an FP8 / NVFP4 recipe (``training.bf16_first_layers``,
    ``bf16_last_layers``: Megatron's ``--first-last-layers-bf16``), costed as a 16-bit block."""


@dataclass(frozen=True)
class StageCost:
    """Costs of one stage for one microbatch on one GPU (shared by equal stages: read only)."""

    n_layers: int
    """Transformer blocks on the stage."""
    moe_layers: int
    """Of which MoE blocks."""
    params: float
    """Parameters this GPU holds for the stage (after TP/EP sharding, before ZeRO)."""
    expert_params: float
    """Part of ``params`` in routed experts (sharded over ep; ZeRO shards them over dp*cp/ep)."""
    parts: dict[Op, Parts]
    """Seconds of F, I, W and B by part."""
    flops: dict[Op, float]
    """Hardware FLOPs executed per op (recompute included)."""
    bytes: dict[Op, AxisBytes]
    """Bytes this GPU sends inside F, I, W and B, by axis."""
    p2p_bytes: float
    """One activation (or its gradient) sent to the neighbouring stage."""
    activation_bytes: float
    """Stash of one microbatch from F until its backward."""
    weight_grad_stash_bytes: float
    """Part of the stash still needed after I, until W (split backward)."""
    recompute_transient_bytes: float
    """Extra bytes alive while B (or I) recomputes and back-propagates a block (full recompute)."""
    ops: dict[Op, OpCost]
    """What the engine runs for F, B, I and W (durations and memory rules)."""
    ends_activation_bytes: float = 0.0
    """Part of ``activation_bytes`` the embedding and the LM head / loss keep (the rest is the blocks')."""


@dataclass(frozen=True)
class StageLayout:
    """Which blocks each stage holds, and which stages are alike."""

    shapes: tuple[StageShape, ...]
    """The distinct stage shapes."""
    shape_of: tuple[int, ...]
    """Per stage: index of its shape in ``shapes``."""
    layers: tuple[tuple[int, ...], ...]
    """Per stage: global indices of its blocks."""


@lru_cache(maxsize=4096)
def stage_layout(model: ModelSpec, layers_per_stage: tuple[int, ...], chain_len: int,
                 per_layer_routing: bool = False, bf16_ends: tuple[int, int] = (0, 0)) -> StageLayout:
    """Blocks and shapes of every stage. ``chain_len``: stages per model copy (a two-copy
    schedule such as DualPipe or Chimera holds the whole model on each chain).
    ``per_layer_routing``: the scenario states each MoE layer's routing, so MoE blocks are told
    apart by their index among the MoE layers (``StageShape.kinds``). ``bf16_ends``: the
    model's first and last blocks kept in BF16 under a low-precision recipe (``StageShape.bf16``)."""
    moe_index = {li: j for j, li in enumerate(i for i in range(model.n_layers) if is_moe_layer(model, i))}
    n_stages = len(layers_per_stage)
    tied = model.tied_embeddings and n_stages > 1
    shapes: dict[StageShape, int] = {}
    shape_of, all_layers, first = [], [], 0
    for s, n in enumerate(layers_per_stage):
        if s % chain_len == 0:
            first = 0
        layers = tuple(range(first, first + n))
        first += n
        kinds = tuple(layer_kind(model, li, moe_index if per_layer_routing else None) for li in layers)
        last = s % chain_len == chain_len - 1
        lo, hi = bf16_ends[0], model.n_layers - bf16_ends[1]
        bf16 = tuple(not lo <= li < hi for li in layers) if any(bf16_ends) else ()
        shape = StageShape(kinds, s % chain_len == 0, last, tied and last, model.mtp_layers if last else 0,
                           bf16 if any(bf16) else ())
        shape_of.append(shapes.setdefault(shape, len(shapes)))
        all_layers.append(layers)
    return StageLayout(tuple(shapes), tuple(shape_of), tuple(all_layers))


def layer_kind(model: ModelSpec, li: int, moe_index: dict[int, int] | None = None) -> bool | int | str:
    """The kind :func:`block_inputs` costs block ``li`` as: its hybrid symbol, else whether it is
    MoE; with ``moe_index`` (one routing per MoE layer: layer -> its index among the MoE layers)
    an MoE block's 1-based index."""
    if moe_index is not None and li in moe_index:
        return moe_index[li] + 1
    if model.hybrid_pattern:
        return block_kind(model, li)
    return is_moe_layer(model, li)


def is_moe_kind(kind: bool | int | str) -> bool:
    """A block of this kind has routed experts."""
    return kind == "E" if isinstance(kind, str) else bool(kind)


# Running sums over a run of blocks, in block order, as one flat vector (cheap to add): params,
# expert params, F/I/W parts (5 each), F/I/W FLOPs, F/I bytes (5 each), stash, W's part of it.
_PARAMS, _EXPERT, _F, _I, _W, _FLOPS, _FB, _IB, _ACT, _WSTASH = 0, 1, 2, 7, 12, 17, 20, 25, 30, 31
_NONE = (0.0,) * 30 + (0, 0)


def _vector(lc) -> tuple:
    return (lc.params, lc.expert_params, *_parts(lc.forward), *_parts(lc.backward_input),
            *_parts(lc.backward_weight), lc.forward_flops, lc.backward_input_flops, lc.backward_weight_flops,
            *_sent(lc.forward_bytes), *_sent(lc.backward_input_bytes), lc.activation_bytes,
            lc.weight_grad_stash_bytes)


def _parts(p: Parts) -> tuple[float, ...]:
    return (p.compute, p.recompute, p.tp_comm, p.cp_comm, p.ep_comm)


def _sent(b: AxisBytes) -> tuple[float, ...]:
    return (b.tp, b.cp, b.ep, b.dp, b.pp)


def block_inputs(inp: LayerInputs, kind: bool | int | str) -> tuple[LayerInputs, bool]:
    """(inputs, is MoE) of a block of this kind: an MoE block with its own routing (kind = its
    1-based index among the MoE layers) gets that layer's histogram as the inputs' routing; a
    hybrid layer the model with every layer of its kind (``parsim.model.uniform_model``), so the
    block's costs read one kind of layer."""
    if isinstance(kind, str):
        return replace(inp, model=uniform_model(inp.model, kind)), kind == "E"
    if isinstance(kind, bool):
        return inp, kind
    inp = replace(inp, moe=for_moe_layer(inp.moe, kind - 1))
    if inp.model.hybrid_pattern:
        inp = replace(inp, model=uniform_model(inp.model, "E"))
    return inp, True


@lru_cache(maxsize=4096, typed=True)  # typed: an MoE layer's index 1 is not the kind True
def _layer_vector(inp: LayerInputs, kind: bool | int) -> tuple:
    return _vector(layer_cost(*block_inputs(inp, kind)))


@lru_cache(maxsize=65536, typed=True)
def _uniform_blocks(inp: LayerInputs, kind: bool | int, n: int) -> tuple:
    """Sums over n blocks of one kind, added one block at a time in block order (the sums
    :func:`_blocks` makes for a mixed stage; a loop, not recursion: a stage may hold thousands)."""
    b, v = _NONE, _layer_vector(inp, kind)
    for _ in range(n):
        b = tuple(map(add, b, v))
    return b


@lru_cache(maxsize=1024)
def bf16_inputs(inp: LayerInputs) -> LayerInputs:
    """The inputs of a block kept in BF16 under an FP8 / NVFP4 recipe: 16-bit GEMMs, no casts,
    16-bit saved inputs (what Megatron's ``--first-last-layers-bf16`` runs outside fp8_autocast)."""
    return replace(inp, options=replace(inp.options, precision="bf16", fp8_recipe=None))


def _block_inputs(inp: LayerInputs, bf16: tuple[bool, ...], j: int) -> LayerInputs:
    return bf16_inputs(inp) if bf16 and bf16[j] else inp


def _blocks(inp: LayerInputs, kinds: tuple[bool, ...], bf16: tuple[bool, ...] = ()) -> tuple:
    if not any(bf16) and kinds and all(k == kinds[0] for k in kinds):
        return _uniform_blocks(inp, kinds[0], len(kinds))
    b = _NONE
    for j, k in enumerate(kinds):  # in block order: the float sums are the same whatever the cache holds
        b = tuple(map(add, b, _layer_vector(_block_inputs(inp, bf16, j), k)))
    return b


@lru_cache(maxsize=16384)
def stage_cost(inp: LayerInputs, shape: StageShape) -> StageCost:
    """Cost of a stage of this shape under these inputs (modelled times). A multi-token
    prediction depth's block counts as one more block of the stage (its compute, recompute,
    stash, parameters); its projection, norms, embedding lookup and LM head pass are ends
    (:func:`mtp_cost`)."""
    n_blocks, moe_blocks = len(shape.kinds), sum(1 for k in shape.kinds if is_moe_kind(k))
    if shape.mtp:
        depth = mtp_block_kinds(inp.model)
        shape = replace(shape, kinds=shape.kinds + depth * shape.mtp,
                        bf16=shape.bf16 + (False,) * (len(depth) * shape.mtp) if shape.bf16 else ())
    bl = _blocks(inp, shape.kinds, shape.bf16)
    if shape.mtp > 1 and inp.model.mtp_shared:  # one set of MTP weights for every depth
        one = _blocks(inp, mtp_block_kinds(inp.model))
        extra = shape.mtp - 1
        bl = (bl[_PARAMS] - extra * one[_PARAMS], bl[_EXPERT] - extra * one[_EXPERT]) + bl[_EXPERT + 1:]
    params = _position_params(inp, shape, bl[_PARAMS])
    layers_f, layers_fb = Parts(*bl[_F:_I]), AxisBytes(*bl[_FB:_IB])
    f, i, w = layers_f, Parts(*bl[_I:_W]), Parts(*bl[_W:_FLOPS])
    ff, fi, fw = bl[_FLOPS:_FB]
    fb, ib = layers_fb, AxisBytes(*bl[_IB:_ACT])
    f, i, w, ff, fi, fw, fb, ib, act = _ends(inp, shape, f, i, w, ff, fi, fw, fb, ib, bl[_ACT])
    ends_act = act - bl[_ACT]
    o = inp.options
    recompute = "full" if o.remat else o.recompute
    transient = layer_cost(*block_inputs(inp, shape.kinds[0])).recompute_transient_bytes if shape.kinds else 0.0
    if inp.model.hybrid_pattern and shape.kinds:  # a hybrid stage's layers differ: the largest rebuild
        transient = max(layer_cost(*block_inputs(inp, k)).recompute_transient_bytes for k in set(shape.kinds))
    if recompute == "full" and not o.remat and o.recompute_method == "block":
        # Megatron's block method: the chunk's first k blocks are recomputed one by one, the
        # others keep everything they stash
        k = min(o.recompute_num_layers, len(shape.kinds))
        rb = _blocks(inp, shape.kinds[:k], shape.bf16[:k])
        kept = _blocks(_no_recompute(inp), shape.kinds[k:], shape.bf16[k:])
        i = i + Parts(recompute=Parts(*rb[_F:_I]).total)
        fi += rb[_FLOPS]
        ib = ib + AxisBytes(*rb[_FB:_IB])
        act += rb[_ACT] + kept[_ACT] - bl[_ACT]
        transient = transient if k else 0.0
    elif recompute == "full":
        i = i + Parts(recompute=layers_f.total)
        fi += bl[_FLOPS]
        ib = ib + layers_fb  # the rerun forward sends its collectives again
        k = min(o.recompute_num_layers, len(shape.kinds))
        if not o.remat and k > 1:
            # uniform units of k blocks: one input kept per unit; a unit's k blocks are rebuilt
            # together for its backward
            units = -(-len(shape.kinds) // k)
            act += (units - len(shape.kinds)) * bl[_ACT] / len(shape.kinds)
            transient *= k
    elif recompute == "selective":
        for j, kind in enumerate(shape.kinds):  # the rerun modules' forward, and the collectives they send again
            rerun, flops, sent = module_recompute(*block_inputs(_block_inputs(inp, shape.bf16, j), kind))
            i, fi, ib = i + rerun, fi + flops, ib + sent
    elif recompute == "op":
        i = i + Parts(recompute=sum(op_recompute_time(*block_inputs(_block_inputs(inp, shape.bf16, j), k))
                                    for j, k in enumerate(shape.kinds)))
    if not o.grad_accumulation_fusion:
        # unfused accumulation: grad += dW reads the gradient buffer and dW, writes the buffer
        # in place
        grad_bytes = state_bytes_per_param(o.optimizer, o.precision)[1]
        w = w + Parts(compute=inp.hardware.device.update_time(3 * params * grad_bytes))
    sh, m = inp.shard, inp.model
    p2p = sh.tokens * m.d_model * PRECISION_TABLE[o.precision].activation_bytes / (sh.tp if sh.sequence_parallel else 1)
    if shape.last:  # the loss's backward temporaries come before any block is recomputed
        transient = max(transient, head_cost(inp).transient_bytes)
    parts = {Op.F: f, Op.I: i, Op.W: w, Op.B: i + w}
    wstash = min(act, bl[_WSTASH])
    return StageCost(n_blocks, moe_blocks, params, bl[_EXPERT], parts,
                     {Op.F: ff, Op.I: fi, Op.W: fw, Op.B: fi + fw}, {Op.F: fb, Op.I: ib, Op.W: AxisBytes(), Op.B: ib},
                     p2p, act, wstash, transient, pipeline_ops(inp, parts, act, wstash, transient, p2p),
                     ends_activation_bytes=ends_act)


def _no_recompute(inp: LayerInputs) -> LayerInputs:
    """The same inputs with every activation kept (the blocks a block-method chunk does not recompute)."""
    return replace(inp, options=replace(inp.options, recompute="none"))


def _position_params(inp: LayerInputs, shape: StageShape, params: float) -> float:
    """Add the embedding (first stage) and the LM head (last stage) to the blocks' parameters."""
    m, tp = inp.model, inp.shard.tp
    if shape.first:
        params += embedding_params(m) / tp
    if shape.last:
        head = head_params(m)
        if shape.head_copy:
            head += m.vocab_size * m.d_model  # the last stage keeps its own copy of the tied matrix
        params += head / tp
    if shape.mtp:
        # the depths' projections and norms (their blocks are among the stage's blocks); away from
        # the first stage the MTP embedding lookups need the word embeddings there too, a copy
        # whose gradient joins the first stage's (Megatron-Core's embedding group), unless the
        # tied head's copy already is that matrix
        params += (1 if m.mtp_shared else shape.mtp) * mtp_join_params(m) / tp
        if not shape.first and not shape.head_copy:
            params += m.vocab_size * m.d_model / tp
    return params


@dataclass(frozen=True)
class EndCost:
    """What the embedding (first stage) or the LM head and loss (last stage) add to a stage."""

    forward: Parts
    """Seconds added to F."""
    backward_input: Parts
    """Seconds added to I."""
    backward_weight: Parts
    """Seconds added to W."""
    flops: float
    """FLOPs added to each of F, I and W."""
    forward_bytes: AxisBytes
    """Bytes sent in F (the embedding's vocabulary-parallel all-reduce)."""
    activation_bytes: float
    """Stash added (the head's fp32 logits and inputs)."""
    transient_bytes: float = 0.0
    """Bytes held for a moment in the backward beyond the stash (the loss's temporaries,
    ``memory_ops.loss_transient_bytes_per_logit``)."""
    backward_bytes: AxisBytes = field(default_factory=AxisBytes)
    """Bytes sent in the backward (the LM head's input-gradient all-reduce or reduce-scatter and
    its input gathered again; the embedding's output gradient gathered under sequence parallelism)."""

    def __add__(self, o: EndCost) -> EndCost:
        """Both ends' work in one pass (their transients are alive one after the other)."""
        return EndCost(self.forward + o.forward, self.backward_input + o.backward_input,
                       self.backward_weight + o.backward_weight, self.flops + o.flops,
                       self.forward_bytes + o.forward_bytes, self.activation_bytes + o.activation_bytes,
                       max(self.transient_bytes, o.transient_bytes), self.backward_bytes + o.backward_bytes)


@lru_cache(maxsize=4096)
def embedding_cost(inp: LayerInputs) -> EndCost:
    """The embedding lookup (memory-bound) and its vocabulary-parallel all-reduce (under
    sequence parallelism a reduce-scatter, and the backward's all-gather)."""
    m, sh, dev = inp.model, inp.shard, inp.hardware.device
    tokens = sh.tokens
    emb = dev.layer_memory_time(2 * tokens * m.d_model * 2)
    out_bytes = tokens * m.d_model * PRECISION_TABLE[inp.options.precision].activation_bytes
    # each rank looks up its vocabulary rows and zeroes the rest: the partial outputs are summed
    # over tp (Megatron's VocabParallelEmbedding), reduce-scattered along the sequence under
    # sequence parallelism
    tp, sent = _tp_collective(inp, "reduce_scatter" if sh.sequence_parallel else "all_reduce", out_bytes)
    # its conjugate in the backward: under sequence parallelism the output gradient all-gathered
    # (every rank's rows need every token's gradient), else Megatron's g: nothing
    tp_b, sent_b = _tp_collective(inp, "all_gather", out_bytes) if sh.sequence_parallel else (0.0, 0.0)
    # each blocking call leaves the compute after it to re-warm (a CPU rank; 0 on a GPU)
    warm_f = rewarm_s(dev, 1) if sh.tp > 1 else 0.0
    warm_b = rewarm_s(dev, 1) if sh.tp > 1 and sh.sequence_parallel else 0.0
    # the weight gradient: the tokens' output gradients scattered into their rows, into a dense
    # table of this rank's vocabulary rows that autograd allocates zeroed (torch's
    # embedding_dense_backward), then added into the gradient buffer (Megatron's DDP hook
    # main_grad.add_(grad); torch's AccumulateGrad): every row, every microbatch, however few
    # the tokens -- the embedding takes no part in gradient accumulation fusion
    rows = m.vocab_size / sh.tp
    w, g, _ = state_bytes_per_param(inp.options.optimizer, inp.options.precision)
    dense = dev.memory_time(rows * m.d_model * (2 * w + 2 * g))
    return EndCost(Parts(compute=emb + warm_f, tp_comm=tp), Parts(compute=warm_b, tp_comm=tp_b),
                   Parts(compute=dev.memory_time(tokens * m.d_model * 4) + dense),
                   0.0, AxisBytes(tp=sent), 0.0, backward_bytes=AxisBytes(tp=sent_b))


def _tp_collective(inp: LayerInputs, kind: str, nbytes: float) -> tuple[float, float]:
    """(seconds, bytes one GPU sends) of one ``kind`` collective of ``nbytes`` over the
    tensor-parallel group; nothing without tensor parallelism."""
    sh = inp.shard
    if sh.tp <= 1:
        return 0.0, 0.0
    return tp_collective_time(inp, kind, nbytes), bytes_sent_per_rank(kind, nbytes, sh.tp)


LOSS_ALL_REDUCES = 3
"""The vocabulary-parallel cross-entropy's fp32 all-reduces over tp in the forward, one number per
token each: the logits' max, the target logit, the sum of exponentials (Megatron's
``_VocabParallelCrossEntropy``; the torch runtime's loss makes the same three)."""


def head_tp_comm(inp: LayerInputs, dgrad_s: float = 0.0) -> tuple[float, float, AxisBytes, AxisBytes, float]:
    """(forward, backward seconds; forward, backward bytes sent; backward compute slowdown) of
    the LM head's tensor-parallel collectives, none of which Transformer Engine's userbuffers
    overlap (Megatron's output layer is a plain ColumnParallelLinear): the head input gathered
    along the sequence under sequence parallelism (else Megatron's f, free), its gradient
    all-reduced (reduce-scattered under sequence parallelism) in the backward; and the
    vocabulary-parallel cross-entropy's three fp32 all-reduces of one number per token (the
    logits' max, the target logit, the sum of exponentials: ``_VocabParallelCrossEntropy``) in
    the forward. Under sequence parallelism the layer keeps only its input's shard, as every
    sequence-parallel column layer does, and gathers it again in the backward for its weight
    gradient, beside its input-gradient GEMM (``dgrad_s``;
    ``parsim.cluster.contention.async_beside``)."""
    sh = inp.shard
    act = sh.tokens * inp.model.d_model * PRECISION_TABLE[inp.options.precision].activation_bytes  # the head runs BF16
    loss_s, loss_sent = _tp_collective(inp, "all_reduce", sh.tokens * 4.0)
    slow = 0.0
    if sh.sequence_parallel:
        gather_s, gather_sent = _tp_collective(inp, "all_gather", act)
        bwd, bwd_sent = _tp_collective(inp, "reduce_scatter", act)
        exposed, slow = async_beside(inp.hardware, gather_s, dgrad_s, sh.tp_group)
        bwd, bwd_sent = bwd + exposed, bwd_sent + gather_sent
    else:
        gather_s, gather_sent = 0.0, 0.0
        bwd, bwd_sent = _tp_collective(inp, "all_reduce", act)
    fwd, fwd_sent = LOSS_ALL_REDUCES * loss_s + gather_s, LOSS_ALL_REDUCES * loss_sent + gather_sent
    return fwd, bwd, AxisBytes(tp=fwd_sent), AxisBytes(tp=bwd_sent), slow


def head_tp_calls(inp: LayerInputs) -> tuple[int, int]:
    """Blocking tensor-parallel calls of the LM head and loss (:func:`head_tp_comm`) in the forward
    (the loss's three all-reduces, the input's gather under sequence parallelism) and the
    backward (the input gradient's all-reduce or reduce-scatter; the re-gather runs beside the
    input-gradient GEMM)."""
    if inp.shard.tp <= 1:
        return 0, 0
    return LOSS_ALL_REDUCES + (1 if inp.shard.sequence_parallel else 0), 1


@lru_cache(maxsize=4096)
def head_cost(inp: LayerInputs) -> EndCost:
    """The LM head GEMM, softmax, loss and its gradient."""
    m, sh, dev, prec = inp.model, inp.shard, inp.hardware.device, inp.options.precision
    prec = "bf16" if prec == "fp8" else prec  # Transformer Engine recipes keep the output layer in BF16
    tokens, b, seq = sh.tokens, sh.microbatch_size, sh.seq_len // sh.cp
    g = head_gemm(m, tokens, sh.tp)
    # the loss over this rank's vocabulary shard (parsim.costs.memory_ops.loss_work): bytes at
    # HBM bandwidth, and the launches when the host would be slower than they run
    o = inp.options
    logits, out_bytes = logits_bytes(m, seq, b, sh.tp) / 4.0, PRECISION_TABLE[prec].activation_bytes
    lf, lb = loss_work(logits, out_bytes, o.fused_kernels, o.cross_entropy_fusion)
    loss_f = max(dev.layer_memory_time(lf.bytes), lf.kernels * dev.kernel_launch_s)
    loss_b = max(dev.layer_memory_time(lb.bytes), lb.kernels * dev.kernel_launch_s)
    # fp32 logits for the loss, plus the final norm's input and the LM head's input
    # (two d_model activations per token; replicated over tp unless sequence parallel)
    head_inputs = 2 * tokens * m.d_model * activation_options(inp).bytes_per_element
    dgrad = dev.gemm_time(g.m, g.k, g.n, prec)
    tp_f, tp_b, sent_f, sent_b, slow = head_tp_comm(inp, dgrad)
    # each blocking call leaves the compute after it to re-warm (a CPU rank; 0 on a GPU)
    calls_f, calls_b = head_tp_calls(inp)
    return EndCost(Parts(compute=dev.gemm_time(g.m, g.n, g.k, prec) + loss_f + rewarm_s(dev, calls_f), tp_comm=tp_f),
                   Parts(compute=dgrad + loss_b + slow + rewarm_s(dev, calls_b), tp_comm=tp_b),
                   Parts(compute=dev.gemm_time(g.k, g.n, g.m, prec)), g.flops, sent_f,
                   logits_bytes(m, seq, b, sh.tp) + head_inputs / (sh.tp if sh.sequence_parallel else 1),
                   logits * loss_transient_bytes_per_logit(out_bytes, o.fused_kernels, o.cross_entropy_fusion),
                   sent_b)


@lru_cache(maxsize=4096)
def mtp_cost(inp: LayerInputs) -> EndCost:
    """What one multi-token prediction depth adds beside its block, as Megatron-Core's
    ``MultiTokenPredictionLayer`` runs it: the embedding of the shifted tokens (the model's
    own vocabulary-parallel lookup, again), two norms (``enorm`` on it, ``hnorm`` on the
    hidden state) and their concatenation, ``eh_proj`` (column-parallel, 2d -> d/tp; under
    sequence parallelism its input gathered along the sequence) with its output gathered over
    tp and scattered back along the sequence, the depth's final norm, and one more pass
    through the shared LM head and loss (:func:`head_cost`). Under FP8 ``eh_proj`` runs at the
    blocks' linear precision; its own quantization passes are not counted (one GEMM of 2d x d
    beside a block's dozen)."""
    m, sh, dev = inp.model, inp.shard, inp.hardware.device
    prec = inp.options.precision
    gemm_prec = linear_precision(inp)  # a TEColumnParallelLinear in Megatron-Core's MTP spec: as the blocks' linears
    tokens, d, tp = sh.tokens, m.d_model, sh.tp
    a = PRECISION_TABLE[prec].activation_bytes
    local = tokens / tp if sh.sequence_parallel else tokens  # the tokens a rank's norms see
    # enorm, hnorm (read d, write d each), the concatenation (read 2d, write 2d), the final
    # norm (read d, write d); the backward about twice the bytes
    norms = dev.layer_memory_time(local * d * a * (2 + 2 + 4 + 2))
    n = -(-d // tp)
    f_gemm = dev.gemm_time(tokens, n, 2 * d, gemm_prec)
    i_gemm = dev.gemm_time(tokens, 2 * d, n, gemm_prec)
    w_gemm = dev.gemm_time(2 * d, n, tokens, gemm_prec)
    q, wire = tp_wire_bytes(inp)  # the projection's gathered input quantized under FP8; the rest 16-bit
    out_gather, out_sent = _tp_collective(inp, "all_gather", tokens * d * wire)
    if sh.sequence_parallel:
        in_gather, in_sent = _tp_collective(inp, "all_gather", tokens * 2 * d * q)
        in_grad, in_grad_sent = _tp_collective(inp, "reduce_scatter", tokens * 2 * d * wire)
        out_grad, out_grad_sent = _tp_collective(inp, "all_gather", tokens * d * wire)  # the scatter's conjugate
    else:
        in_gather, in_sent = 0.0, 0.0
        in_grad, in_grad_sent = _tp_collective(inp, "all_reduce", tokens * 2 * d * wire)
        out_grad, out_grad_sent = 0.0, 0.0  # the gather's conjugate is a split
    proj = EndCost(Parts(compute=f_gemm + norms, tp_comm=in_gather + out_gather),
                   Parts(compute=i_gemm + 2 * norms, tp_comm=in_grad + out_grad),
                   Parts(compute=w_gemm), 2.0 * tokens * n * 2 * d,
                   AxisBytes(tp=in_sent + out_sent),
                   local * d * a * 4,  # the norms' inputs and the projection's input, kept for the backward
                   backward_bytes=AxisBytes(tp=in_grad_sent + out_grad_sent))
    return proj + embedding_cost(inp) + head_cost(inp)


def _ends(inp: LayerInputs, shape: StageShape, f, i, w, ff, fi, fw, fb, ib, act):
    """The embedding on the first stage, the LM head and loss on the last, and the multi-token
    prediction depths' ends where they sit (DESIGN §4: real work)."""
    ends = ((embedding_cost(inp),) if shape.first else ()) + ((head_cost(inp),) if shape.last else ())
    for end in ends + (mtp_cost(inp),) * shape.mtp:
        f, i, w = f + end.forward, i + end.backward_input, w + end.backward_weight
        ff, fi, fw = ff + end.flops, fi + end.flops, fw + end.flops
        fb, ib = fb + end.forward_bytes, ib + end.backward_bytes
        act += end.activation_bytes
    return f, i, w, ff, fi, fw, fb, ib, act


def pipeline_ops(inp: LayerInputs, parts: dict[Op, Parts], act: float, wstash: float, transient: float,
                 p2p: float) -> dict[Op, OpCost]:
    """F/B/I/W as the engine runs them: durations from the parts, the activation stash ``act``
    allocated by F and freed by the backward (I frees all but ``wstash``, what W still needs);
    ``transient``: what a fully recomputed block holds while B or I runs."""
    o, sh = inp.options, inp.shard
    if o.remat and o.recompute != "full":
        # GPipe re-materialization: F keeps the stage's input only; B holds the
        # recomputed activations of the whole stage while it runs
        transient, act = act, min(act, p2p * (sh.tp if sh.sequence_parallel else 1))
        wstash = min(wstash, act)
    return {
        Op.F: OpCost(parts[Op.F].total, stash_bytes=act),
        Op.B: OpCost(parts[Op.B].total, free_bytes=act, transient_bytes=transient),
        Op.I: OpCost(parts[Op.I].total, free_bytes=act - wstash, transient_bytes=transient),
        Op.W: OpCost(parts[Op.W].total, free_bytes=wstash),
    }


def with_measured_times(inp: LayerInputs, st: StageCost, forward_s: float, backward_s: float | None,
                        backward_input_s: float | None, backward_weight_s: float | None) -> StageCost:
    """The stage with a ``[costs]`` table's measured times in place of the modelled ones. A full
    backward only: I and W keep the model's proportion (for split schedules)."""
    if backward_s is not None:
        i_share = st.parts[Op.I].total / max(st.parts[Op.B].total, 1e-30)
        bi, bw = backward_s * i_share, backward_s * (1 - i_share)
        b = backward_s
    else:
        bi, bw = backward_input_s, backward_weight_s
        b = bi + bw
    rec = Parts(recompute=forward_s) if inp.options.remat else Parts()  # GPipeRemat: B reruns F
    parts = {Op.F: Parts(compute=forward_s), Op.I: Parts(compute=bi) + rec,
             Op.W: Parts(compute=bw), Op.B: Parts(compute=b) + rec}
    ops = pipeline_ops(inp, parts, st.activation_bytes, st.weight_grad_stash_bytes, st.recompute_transient_bytes,
                       st.p2p_bytes)
    return replace(st, parts=parts, ops=ops)


def with_added_compute(inp: LayerInputs, st: StageCost, seconds: dict[Op, float]) -> StageCost:
    """The stage with ``seconds`` more compute in the ops it names (work the framework runs on the
    compute stream around the blocks: FSDP2's copies, ``parsim.costs.dp.fsdp2_copy_bytes``)."""
    if not any(seconds.values()):
        return st
    parts = {op: p + Parts(compute=seconds.get(op, 0.0)) for op, p in st.parts.items()}
    ops = pipeline_ops(inp, parts, st.activation_bytes, st.weight_grad_stash_bytes, st.recompute_transient_bytes,
                       st.p2p_bytes)
    return replace(st, parts=parts, ops=ops)


def clear_caches() -> None:
    """Empty this module's caches (a cold start)."""
    for fn in (stage_layout, _layer_vector, _uniform_blocks, bf16_inputs, embedding_cost, head_cost, mtp_cost, stage_cost):
        fn.cache_clear()
