"""The op graph of a transformer block on a mesh, every op's sharding strategies and their costs.

Ops (a chain, the residual stream through the norms): ``ln1`` (norm + residual add + dropout),
``qkv``, ``attn`` (the attention core), ``out``, ``ln2``, ``up`` (FC1, or gate and up under
SwiGLU), ``down``; the first stage adds ``embedding``, the last ``lm_head`` (final norm, head,
loss). A strategy gives every mesh axis a role:

* linear ops (weight ``[in, out]``): ``B`` batch (tokens split, weight replicated: its gradient
  is all-reduced once a step), ``Z`` batch with the weight stored sharded (FSDP/ZeRO-3: gathered
  in the forward and again in the backward, gradient reduce-scattered every microbatch), ``C``
  column (weight split over ``out``), ``R`` row (weight split over ``in``: partial sums out),
  ``X`` replicated compute;
* ``attn``: ``B`` (whole sequences split), ``H`` (heads split), ``X``;
* norms: ``T`` (tokens split: data parallel, or Megatron's sequence parallelism), ``X``;
* ``embedding`` / ``lm_head``: ``B``, ``Z``, ``V`` (vocabulary split: Megatron's vocab-parallel
  embedding and cross-entropy), ``X``;
* ``experts`` (an MoE block's router and routed experts, in place of ``up``/``down``): ``E``
  (experts split over the axis, tokens too: GShard's expert parallelism), ``B``, ``X``.

Costs are parsim's own: each GEMM through ``Device.gemm_time`` at its local shape, the attention
core and memory-bound ops as ``parsim.costs.layer`` costs them, the embedding and the head by
``parsim.costs.stage``, collectives by ``parsim.cluster.collectives`` on the mesh's groups. What
is not modelled here (the engine has it when the plan is simulated): launch-bound excess,
overlap of TP communication, FP8 casts, context parallelism, MLA, shared experts, expert TP.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import parsim.costs.compute as _compute
import parsim.costs.layer as _layer
from parsim.autoplan.mesh import Layout, Mesh, collective, reshard_steps, reshard_time
from parsim.cluster.contention import async_beside
from parsim.cluster.hardware import HardwareProfile
from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.scenario import OverlapConfig, dropout_enabled
from parsim.costs.inputs import LayerInputs, Ranks, Shard, TrainOptions, cluster_of
from parsim.costs.memory import state_bytes_per_param
from parsim.costs.stage import embedding_cost, head_cost
from parsim.model import ModelSpec, layer_elementwise_bytes, layer_gemms

LINEAR_ROLES = ("B", "Z", "C", "R", "X")
BLOCK_OPS = ("ln1", "qkv", "attn", "out", "ln2", "up", "down")
COLUMN = {"qkv": "qkv", "up": "fc1"}
ROW = {"out": "attn_out", "down": "fc2"}


@dataclass(frozen=True)
class Strategy:
    """One way to run an op on the mesh."""

    roles: tuple[str, ...]
    """The op's role on each mesh axis (module docstring)."""
    inp: Layout
    """Layout the op needs its input in."""
    out: Layout
    """Layout the op produces its output in (``P``: partial sums)."""
    grad_in: Layout
    """Layout of the input's gradient the backward produces."""
    forward_s: float
    """Seconds of the op's forward compute (one microbatch)."""
    backward_s: float
    """Seconds of its backward compute (input and weight gradients)."""
    comm_s: float
    """Seconds of collectives inside the op per microbatch (FSDP gathers and reduce-scatters)."""
    step_comm_s: float
    """Seconds of collectives once per step (the all-reduce of replicated weights' gradients)."""
    state_bytes: float
    """Weights, gradients and optimizer states this op keeps per device."""
    stash_bytes: float
    """Activations the op keeps from its forward to its backward, per microbatch."""
    family: tuple[str, ...] | None
    """The Megatron-style axes family this strategy belongs to (None: none of them)."""
    a2a_s: float = 0.0
    """Seconds of the expert dispatch + combine all-to-alls of one forward (the backward runs as
    many again), exposed (``overlap.ep_comm`` off)."""
    counts_s: float = 0.0
    """Seconds of the forward's tokens-per-expert count exchange before its dispatch (the
    backward reuses the counts): ``parsim.costs.moe.MoEPhase.count_exchange_s``."""
    transient_bytes: float = 0.0
    """Bytes alive only while the op runs: FSDP's gathered weight (and its gradient before the
    reduce-scatter), on top of everything kept at that liveness point."""
    dgrad_s: float = 0.0
    """Seconds of its input-gradient GEMMs (linear ops), part of ``backward_s``: what a
    column-parallel layer's backward re-gather of a sequence-sharded input runs beside."""


@dataclass(frozen=True)
class Op:
    """One op of the graph and its strategies."""

    name: str
    kind: str
    """linear | attn | norm | embedding | lm_head."""
    in_width: int
    """Features per token of the op's input."""
    strategies: tuple[Strategy, ...]


@dataclass(frozen=True)
class Graph:
    """A chain of ops; ``edges`` are (src index, dst index, features per token of the tensor)."""

    ops: tuple[Op, ...]
    edges: tuple[tuple[int, int, int], ...]
    mesh: Mesh
    tokens: int
    """Tokens of one microbatch on the whole mesh."""
    act_bytes: float
    """Bytes per activation element on the wire."""
    n_experts: int = 0
    """Routed experts per MoE block (0: a dense graph); picks the axes families (:func:`families`)."""



@dataclass(frozen=True)
class Setting:
    """What a block's costs depend on besides the mesh."""

    model: ModelSpec
    hardware: HardwareProfile
    microbatch: int
    """Sequences in one microbatch on the whole mesh (split by its batch axes)."""
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adam"
    recompute: str = "none"
    """none | full (the backward reruns the forward; only the block's input is kept)."""
    flash_attention: bool = True
    dropout: bool | None = None
    """Dropout masks (None: on for GeLU models, as ``training.dropout``'s default)."""


def _inputs(st: Setting, mbs: int, tp: int, sp: bool, group: tuple[int, ...] = (0,)) -> LayerInputs:
    """LayerInputs of one device's piece: ``mbs`` local sequences, ``tp``-way head/feature split."""
    m = st.model
    shard = Shard(max(1, mbs), st.seq_len, tp, 1, 1, sp, Ranks(group), Ranks((group[0],)), Ranks(), 1)
    opts = TrainOptions(st.precision, st.flash_attention, dropout_enabled(m, st.dropout), st.recompute, False, True,
                        st.optimizer, OverlapConfig())
    return LayerInputs(m, cluster_of(st.hardware), shard, opts, None)


def _prod(mesh: Mesh, roles: tuple[str, ...], letters: str) -> int:
    out = 1
    for r, n in zip(roles, mesh.sizes):
        if r in letters:
            out *= n
    return out


def _axes(mesh: Mesh, roles: tuple[str, ...], letters: str) -> tuple[str, ...]:
    return tuple(a for a, r in zip(mesh.names, roles) if r in letters)


def _role_sets(mesh: Mesh, choices: tuple[str, ...]):
    """Every assignment of a role to each axis (axes of size 1 get ``X`` only)."""
    per = [choices if n > 1 else ("X",) for n in mesh.sizes]
    return itertools.product(*per)


def _gemm_prec(inp: LayerInputs) -> str:
    return _compute.linear_precision(inp) if inp.hardware.device.kernels is not None else inp.options.precision


def _states(st: Setting, params: float) -> float:
    w, g, k = state_bytes_per_param(st.optimizer, st.precision)
    return params * (w + g + k)


def _weight_comm(st: Setting, mesh: Mesh, roles, params_local: float) -> tuple[float, float]:
    """(per-microbatch, per-step) seconds of a weight's collectives: FSDP all-gathers (forward
    and backward) and reduce-scatter over the Z axes, the gradient all-reduce over the B axes."""
    w, g, _ = state_bytes_per_param(st.optimizer, st.precision)
    hw = st.hardware
    z = _axes(mesh, roles, "Z")
    b = _axes(mesh, roles, "B")
    per_mb = 0.0
    if z:
        grp = mesh.group(z)
        per_mb = 2 * collective(hw, "all_gather", params_local * w, grp) + collective(hw, "reduce_scatter",
                                                                                      params_local * g, grp)
    nz = _prod(mesh, roles, "Z")
    step = collective(hw, "all_reduce", params_local * g / nz, mesh.group(b)) if b else 0.0
    return per_mb, step


def _gathered(st: Setting, params_local: float, z: int) -> float:
    """FSDP: the full weight and its full gradient alive while the op runs (z > 1), else nothing."""
    if z <= 1:
        return 0.0
    w, g, _ = state_bytes_per_param(st.optimizer, st.precision)
    return params_local * (w + g)


def _fam_linear(name: str, roles) -> tuple[str, ...] | None:
    """Family of a linear strategy: Megatron's (C for column ops, R for row ops) on a T axis."""
    mega = "C" if name in COLUMN else "R"
    out = []
    for r in roles:
        if r in "BZX":
            out.append(r)
        elif r == mega:
            out.append("T")
        else:
            return None
    return tuple(out)


def linear_op(st: Setting, mesh: Mesh, name: str, only: frozenset | None = None) -> Op:
    """qkv / up (column-type in Megatron) or out / down (row-type): every role assignment."""
    m = st.model
    gname = COLUMN.get(name) or ROW[name]
    swiglu = m.ffn == "swiglu"
    names = ("gate", "up") if (name == "up" and swiglu) else ("down",) if (name == "down" and swiglu) else (gname,)
    full = {g.name: g for g in layer_gemms(m, 1, 1)}
    K, N = full[names[0]].k, sum(full[x].n for x in names)
    tokens = st.microbatch * st.seq_len
    strategies = []
    for roles in _role_sets(mesh, LINEAR_ROLES):
        if only is not None and _fam_linear(name, roles) not in only:
            continue
        c, r, bz = _prod(mesh, roles, "C"), _prod(mesh, roles, "R"), _prod(mesh, roles, "BZ")
        heads_split = c if name == "qkv" else r if name == "out" else 1
        if name in ("qkv", "out") and (m.n_heads % heads_split or (m.n_kv_heads % heads_split and heads_split % m.n_kv_heads)):
            continue
        if (name in COLUMN and c > 1 and name != "qkv" and N % c) or (name in ROW and r > 1 and name != "out" and K % r):
            continue
        if (name in COLUMN and r > 1 and K % r) or (name in ROW and c > 1 and N % c) or tokens % bz:
            continue
        mt = tokens // bz
        cg = {g.name: g for g in layer_gemms(m, mt, c)}
        rg = {g.name: g for g in layer_gemms(m, mt, r)}
        inp = _inputs(st, st.microbatch // bz, max(c, r), False)
        prec = _gemm_prec(inp)
        dev = st.hardware.device
        f = i = w = 0.0
        params = 0.0
        for gn in names:
            g = full[gn]
            n_loc = cg[gn].n if name in COLUMN else g.n // c
            k_loc = rg[gn].k if name in ROW else g.k // r
            f += dev.gemm_time(mt, n_loc, k_loc, prec)
            i += dev.gemm_time(mt, k_loc, n_loc, prec)
            w += dev.gemm_time(k_loc, n_loc, mt, prec)
            params += n_loc * k_loc + (n_loc if m.bias else 0)
        per_mb, step = _weight_comm(st, mesh, roles, params)
        z = _prod(mesh, roles, "Z")
        inp_l = Layout(tuple("T" if x in "BZ" else "F" if x == "R" else "-" for x in roles))
        out_l = Layout(tuple("T" if x in "BZ" else "F" if x == "C" else "P" if x == "R" else "-" for x in roles))
        gin = Layout(tuple("T" if x in "BZ" else "F" if x == "R" else "P" if x == "C" else "-" for x in roles))
        stash = tokens / bz * K / r * st_act_bytes(st)
        strategies.append(Strategy(tuple(roles), inp_l, out_l, gin, f, i + w, per_mb, step,
                                   _states(st, params) / z, stash, _fam_linear(name, roles),
                                   transient_bytes=_gathered(st, params, z), dgrad_s=i))
    return Op(name, "linear", K, tuple(strategies))


def st_act_bytes(st: Setting) -> float:
    return PRECISION_TABLE[st.precision].activation_bytes


def _attn_stash(st: Setting, inp: LayerInputs, heads: int) -> float:
    """q, k, v and the output per local head (plus the scores without FlashAttention)."""
    m, sh = st.model, inp.shard
    a = st_act_bytes(st)
    tokens = sh.microbatch_size * st.seq_len
    out = tokens * 4 * heads * m.head_dim_ * a
    if not st.flash_attention:
        out += sh.microbatch_size * heads * st.seq_len ** 2 * (a + (1 if inp.options.dropout else 0))
    return out


def attention_op(st: Setting, mesh: Mesh, only: frozenset | None = None) -> Op:
    m = st.model
    out = []
    qkv_w = (m.n_heads + 2 * m.n_kv_heads) * m.head_dim_
    for roles in _role_sets(mesh, ("B", "H", "X")):
        if only is not None and tuple("T" if x == "H" else x for x in roles) not in only:
            continue
        b, h = _prod(mesh, roles, "B"), _prod(mesh, roles, "H")
        if st.microbatch % b or m.n_heads % h or (m.n_kv_heads % h and h % m.n_kv_heads):
            continue
        inp = _inputs(st, st.microbatch // b, h, False)
        f, i = _layer.attention_times(inp)
        lay = Layout(tuple("T" if x == "B" else "F" if x == "H" else "-" for x in roles))
        fam = tuple("T" if x == "H" else x for x in roles)
        out.append(Strategy(tuple(roles), lay, lay, lay, f, i, 0.0, 0.0, 0.0,
                            _attn_stash(st, inp, m.n_heads // h), fam))
    return Op("attn", "attn", qkv_w, tuple(out))


def memory_bound_bytes(st: Setting, tokens: int, tp: int, moe: bool = False) -> tuple[float, float]:
    """(residual-stream part at full width, the rest at ``tp``) forward HBM bytes of a block's
    memory-bound ops for ``tokens`` local tokens: the norms, residual adds and dropout act on
    d_model (split over tp only with sequence parallelism); rotary and the activation on the
    tp-split widths. Both from ``parsim.costs`` (the block total is linear in the norms' width)."""
    def total(t: int, sp: bool) -> float:
        inp = _inputs(st, 1, t, sp)
        if st.hardware.device.kernels is not None:
            return _compute.memory_work(inp, moe)[0].bytes / st.seq_len * tokens
        return layer_elementwise_bytes(st.model, tokens, t, sp, st_act_bytes(st))
    d_part = 2 * (total(2, False) - total(2, True))
    return d_part, total(tp, False) - d_part


def norm_op(st: Setting, mesh: Mesh, name: str) -> Op:
    """A norm with its residual add and dropout; ``up`` carries the rest of the memory-bound work."""
    m, dev = st.model, st.hardware.device
    tokens = st.microbatch * st.seq_len
    out = []
    for roles in _role_sets(mesh, ("T", "X")):
        t = _prod(mesh, roles, "T")
        if tokens % t:
            continue
        d_part, _ = memory_bound_bytes(st, tokens // t, 1)
        f = dev.layer_memory_time(d_part / 2)
        lay = Layout(tuple("T" if x == "T" else "-" for x in roles))
        params = (2 if m.norm == "layernorm" and m.norm_shift else 1) * m.d_model  # scale (and shift)
        stash = tokens // t * m.d_model * st_act_bytes(st)
        # the norm's weights are replicated: their gradients are all-reduced over every T axis once a step
        _, step = _weight_comm(st, mesh, tuple("B" if x == "T" else x for x in roles), params)
        out.append(Strategy(tuple(roles), lay, lay, lay, f, 2 * f, 0.0, step, _states(st, params), stash, None))
    return Op(name, "norm", m.d_model, tuple(out))


def serves(op: Op, s: Strategy, fam: tuple[str, ...]) -> bool:
    """Whether strategy ``s`` of ``op`` is what the axes family ``fam`` (:func:`families`) runs:
    linear ops Megatron's column/row pair on the T axis, attention its heads, norms their tokens
    over the batch axes (and over the T axis under sequence parallelism), the ends the vocabulary."""
    roles, sp = fam[:-1], fam[-1] == "sp"
    if op.kind == "experts":
        return s.roles == _expert_roles(roles)
    roles = _dense(roles)
    if op.kind == "norm":
        return all((r == "T" and (f in "BZ" or (f == "T" and sp))) or (r == "X" and (f == "X" or (f == "T" and not sp)))
                   for r, f in zip(s.roles, roles))
    if op.kind == "attn":
        return s.family == tuple("B" if r == "Z" else r for r in roles)
    return s.family == roles


def end_op(st: Setting, mesh: Mesh, kind: str, only: frozenset | None = None) -> Op:
    """The embedding (first stage) or the final norm, LM head and loss (last stage), as
    ``parsim.costs.stage`` costs them at the local shard (vocabulary split over the V axes)."""
    m = st.model
    out = []
    for roles in _role_sets(mesh, ("B", "Z", "V", "X")):
        if only is not None and tuple("T" if x == "V" else x for x in roles) not in only:
            continue
        bz, v = _prod(mesh, roles, "BZ"), _prod(mesh, roles, "V")
        if st.microbatch % bz or m.vocab_size % v:
            continue
        inp = _inputs(st, st.microbatch // bz, v, False, mesh.group(_axes(mesh, roles, "V")) if v > 1 else (0,))
        ec = embedding_cost(inp) if kind == "embedding" else head_cost(inp)
        params = m.vocab_size * m.d_model / v
        per_mb, step = _weight_comm(st, mesh, roles, params)
        z = _prod(mesh, roles, "Z")
        lay = Layout(tuple("T" if x in "BZ" else "-" for x in roles))
        # the head's input gradient is a partial sum over the vocabulary split (Megatron's f)
        gin = Layout(tuple("T" if x in "BZ" else "P" if x == "V" else "-" for x in roles)) if kind == "lm_head" else lay
        f = ec.forward.total
        b = ec.backward_input.total + ec.backward_weight.total
        fam = tuple("T" if x == "V" else x for x in roles)
        out.append(Strategy(tuple(roles), lay, lay, gin, f, b, per_mb, step, _states(st, params) / z,
                            ec.activation_bytes, fam, transient_bytes=_gathered(st, params, z)))
    return Op(kind, kind, m.d_model, tuple(out))


def edge_matrices(hw: HardwareProfile, g: Graph, e: int):
    """(forward, backward) matrices [s][t] of resharding seconds on edge ``e`` (source strategy
    s, destination strategy t): the activation into the consumer's input layout, its gradient
    back into the producer's output layout. Computed once per graph (kept on it)."""
    memo = g.__dict__.setdefault("_edges", {})
    key = (id(hw), e)
    if key not in memo:
        memo[key] = _edge_matrix(hw, g, e)
    return memo[key]


def _edge_matrix(hw: HardwareProfile, g: Graph, e: int):
    src, dst, width = g.edges[e]
    full = g.tokens * width * g.act_bytes
    a, b = g.ops[src], g.ops[dst]
    seen: dict = {}

    def t(x: Layout, y: Layout) -> float:
        if (x, y) not in seen:
            seen[(x, y)] = reshard_time(hw, x, y, full, g.mesh)
        return seen[(x, y)]
    fwd = tuple(tuple(t(s.out, d.inp) for d in b.strategies) for s in a.strategies)
    bwd = tuple(tuple(t(d.grad_in, s.out.without_partial()) + sum(regather(hw, g, e, s, d)) for d in b.strategies)
                for s in a.strategies)
    return fwd, bwd


def regather(hw: HardwareProfile, g: Graph, e: int, s: Strategy, d: Strategy) -> tuple[float, float]:
    """(exposed seconds, compute slowdown) of the backward re-gather on edge ``e`` (source
    strategy ``s``, destination ``d``): a column-parallel linear whose input arrives sharded
    along the tokens and is only all-gathered (Megatron's sequence parallelism) keeps the
    shard and gathers it again for its weight gradient, launched beside its input-gradient
    GEMMs (``parsim.cluster.contention.async_beside``, as ``parsim.costs.layer`` books it)."""
    _, dst, width = g.edges[e]
    if g.ops[dst].kind != "linear" or g.ops[dst].name not in COLUMN or s.out == d.inp:
        return 0.0, 0.0
    steps = reshard_steps(s.out, d.inp, g.tokens * width * g.act_bytes, g.mesh)
    if not steps or any(k != "all_gather" for k, _, _ in steps):
        return 0.0, 0.0
    t = sum(collective(hw, k, b, grp) for k, b, grp in steps)
    return async_beside(hw, t, d.dgrad_s, [r for _, _, grp in steps for r in grp])


def op_time(s: Strategy, recompute: str, n_microbatches: int) -> float:
    """Seconds an op strategy adds per microbatch: forward, backward, the forward again under
    full recomputation, the per-step collectives spread over the microbatches, and what its FSDP
    gathers and reduce-scatters do not hide behind that compute (the engine prefetches the next
    unit's parameters while one computes: ``overlap.prefetch = 1``, FSDP2's default)."""
    again = recompute == "full"
    work = s.forward_s + s.backward_s + (s.forward_s if again else 0.0)
    a2a = s.a2a_s * (3 if again else 2) + s.counts_s * (2 if again else 1)
    return work + max(0.0, s.comm_s - work) + a2a + s.step_comm_s / n_microbatches


def families(mesh: Mesh, n_experts: int = 0) -> list[tuple[str, ...]]:
    """Megatron-style axes families the engine runs: per axis B, Z or T (at most one T; Z on all
    batch axes or none), plus ``sp``/``nosp`` (sequence parallelism, with a T axis). With routed
    experts (``n_experts``) one batch axis may also split the experts (EP): E (a B axis that
    does) or Y (a Z axis that does), its size dividing the experts."""
    out = []
    for roles in _role_sets(mesh, ("B", "Z", "T", "E", "Y") if n_experts else ("B", "Z", "T")):
        data = [r for r in roles if r in "BZEY"]
        if roles.count("T") > 1 or (any(r in "ZY" for r in data) and any(r in "BE" for r in data)):
            continue
        ep = [i for i, r in enumerate(roles) if r in "EY"]
        if len(ep) > 1 or (ep and n_experts % mesh.sizes[ep[0]]):
            continue
        for sp in (("sp", "nosp") if "T" in roles else ("nosp",)):
            out.append(tuple(roles) + (sp,))
    return out


def _dense(roles) -> tuple[str, ...]:
    """A family's roles as the dense ops see them (an EP axis is a batch axis to them)."""
    return tuple("B" if r == "E" else "Z" if r == "Y" else r for r in roles)


def _expert_roles(roles) -> tuple[str, ...]:
    """A family's roles as the experts op sees them (a ZeRO-3 EP axis splits the experts; their
    states are sharded over the other batch axes, as ZeRO-3 shards them over expert-data-parallel)."""
    return tuple({"Y": "E"}.get(r, r) for r in roles)
