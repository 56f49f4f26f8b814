"""Whole op graphs: a dense block (norms, QKV, attention, projection, FC1, FC2) or an MoE block
(the FFN replaced by the router and routed experts), with the embedding before the first and
the head after the last block of a stage (ops and strategies: ``parsim.autoplan.graph``)."""
from __future__ import annotations

from dataclasses import replace

import parsim.costs.layer as _layer
from parsim.autoplan.graph import (
    Graph,
    Layout,
    Op,
    Setting,
    Strategy,
    _axes,
    _dense,
    _expert_roles,
    _gathered,
    _inputs,
    _prod,
    _role_sets,
    _states,
    _weight_comm,
    attention_op,
    end_op,
    families,
    linear_op,
    memory_bound_bytes,
    norm_op,
    st_act_bytes,
)
from parsim.autoplan.mesh import Mesh, collective
from parsim.cluster.precision import PRECISION_TABLE
from parsim.costs.inputs import Ranks
from parsim.costs.memory import state_bytes_per_param
from parsim.errors import ConfigError


def block_graph(st: Setting, mesh: Mesh, first: bool = False, last: bool = False, runnable: bool = False) -> Graph:
    """The block's op chain (with the embedding before it / the head after it), cyclic: the
    block's output feeds the next block's ``ln1`` (every block of a stage runs alike).
    ``runnable``: only the strategies of the axes families the engine runs (:func:`families`)."""
    m = st.model
    if m.is_mla or (m.is_moe and (m.n_shared_experts or m.first_dense_layers or m.moe_every != 1)):
        raise ConfigError("parsim autoplan", "model", f"{m.name}: the op graph covers dense MHA/GQA blocks and "
                                                      "blocks of routed experts only (no MLA, shared experts or "
                                                      "dense layers between MoE ones)")
    if m.is_moe:
        return _moe_graph(st, mesh, first, last, runnable)
    fams = [f[:-1] for f in families(mesh)] if runnable else None
    lin = frozenset(fams) if runnable else None
    att = frozenset(tuple("B" if r == "Z" else r for r in f) for f in fams) if runnable else None
    qkv_w = (m.n_heads + 2 * m.n_kv_heads) * m.head_dim_
    f_w = m.d_ff
    ops = [norm_op(st, mesh, "ln1"), linear_op(st, mesh, "qkv", lin), attention_op(st, mesh, att),
           linear_op(st, mesh, "out", lin), norm_op(st, mesh, "ln2"), linear_op(st, mesh, "up", lin),
           linear_op(st, mesh, "down", lin)]
    ops[5] = _with_activation(st, mesh, ops[5])
    widths = [m.d_model, qkv_w, m.n_heads * m.head_dim_, m.d_model, m.d_model, f_w]
    edges = [(i, i + 1, w) for i, w in enumerate(widths)]
    edges.append((6, 0, m.d_model))
    _add_ends(st, mesh, lin, ops, edges, first, last, 6)
    tokens = st.microbatch * st.seq_len
    return Graph(tuple(ops), tuple(edges), mesh, tokens, PRECISION_TABLE[st.precision].activation_bytes)


def _with_activation(st: Setting, mesh: Mesh, up: Op) -> Op:
    """Add the block's other memory-bound work (activation, rotary) to FC1 at its shard."""
    tokens = st.microbatch * st.seq_len
    out = []
    for s in up.strategies:
        c = _prod(mesh, s.roles, "C")
        bz = _prod(mesh, s.roles, "BZ")
        _, rest = memory_bound_bytes(st, tokens // bz, c)
        t = st.hardware.device.layer_memory_time(rest)
        out.append(replace(s, forward_s=s.forward_s + t, backward_s=s.backward_s + 2 * t))
    return replace(up, strategies=tuple(out))


def experts_op(st: Setting, mesh: Mesh, only: frozenset | None = None) -> Op:
    """The router and the routed experts (``parsim.costs.moe``: routing, grouped GEMMs, permutes,
    dispatch and combine all-to-alls on the slowest EP rank), as ``parsim.costs.layer`` adds them
    to a block; the block's other memory-bound work at the routed widths rides along. Roles: ``E``
    experts split over the axis (tokens split over it too, GShard), ``B`` tokens split with the
    experts replicated, ``T`` every expert split over the axis as Megatron splits an MLP
    (expert TP = the tensor axis: partial sums out, reduced on the edge), ``X``."""
    from parsim.config.moe import MoEConfig
    m, dev = st.model, st.hardware.device
    out = []
    tokens = st.microbatch * st.seq_len
    f_e = m.d_ff_expert_
    for roles in _role_sets(mesh, ("B", "Z", "E", "T", "X")):
        if only is not None and tuple(roles) not in only:
            continue
        e, bz, t = _prod(mesh, roles, "E"), _prod(mesh, roles, "BZE"), _prod(mesh, roles, "T")
        if m.n_experts % e or st.microbatch % bz or f_e % t:
            continue
        group = mesh.group(_axes(mesh, roles, "E"))
        base = _inputs(st, st.microbatch // bz, t, False, mesh.group(_axes(mesh, roles, "T")))
        inp = replace(base, shard=replace(base.shard, ep=e, ep_group=Ranks(group), expert_tp=t),
                      moe=MoEConfig())
        ph = _layer.moe_phase(inp)
        counted_f, counted_i = _layer._routed_memory_counted(inp)
        _, rest = memory_bound_bytes(st, tokens // bz, t, moe=True)
        mem = dev.layer_memory_time(rest)
        f = mem + ph.forward_s - counted_f
        b = 2 * mem + ph.backward_input_s - counted_i + ph.backward_weight_s
        expert = m.n_experts * m.ffn_matrices * m.d_model * f_e / (e * t)
        router = m.d_model * m.n_experts
        g = state_bytes_per_param(st.optimizer, st.precision)[1]
        # the experts' weights: gradients all-reduced over B, stored sharded and gathered over Z (FSDP)
        per_mb, step = _weight_comm(st, mesh, roles, expert)
        step += collective(st.hardware, "all_reduce", router * g, mesh.group(_axes(mesh, roles, "BZE")))
        z = _prod(mesh, roles, "Z")
        lay = Layout(tuple("T" if x in "BZE" else "-" for x in roles))
        part = Layout(tuple("T" if x in "BZE" else "P" if x == "T" else "-" for x in roles))
        stash = ph.routed_rows * (m.d_model + m.ffn_matrices * f_e / t) * st_act_bytes(st)
        out.append(Strategy(tuple(roles), lay, part, part, f, b, per_mb, step,
                            _states(st, expert) / z + _states(st, router), stash, None, 2 * ph.all_to_all_s,
                            transient_bytes=_gathered(st, expert, z), counts_s=ph.count_exchange_s))
    return Op("experts", "experts", m.d_model, tuple(out))


def _add_ends(st: Setting, mesh: Mesh, lin, ops: list, edges: list, first: bool, last: bool, block_out: int) -> None:
    """Append the embedding (feeding the block's first op, 0) on the first stage and the LM head
    (fed by the block's output op ``block_out``) on the last, with their edges, in place."""
    d = st.model.d_model
    if first:
        ops.append(end_op(st, mesh, "embedding", lin))
        edges.append((len(ops) - 1, 0, d))
    if last:
        ops.append(end_op(st, mesh, "lm_head", lin))
        edges.append((block_out, len(ops) - 1, d))


def _moe_graph(st: Setting, mesh: Mesh, first: bool, last: bool, runnable: bool = False) -> Graph:
    """ln1 -> qkv -> attn -> out -> ln2 -> experts (-> the next block's ln1)."""
    m = st.model
    fams = [f[:-1] for f in families(mesh, m.n_experts)] if runnable else None
    lin = frozenset(_dense(f) for f in fams) if runnable else None
    att = frozenset(tuple("B" if r == "Z" else r for r in _dense(f)) for f in fams) if runnable else None
    exp = frozenset(_expert_roles(f) for f in fams) if runnable else None
    ops = [norm_op(st, mesh, "ln1"), linear_op(st, mesh, "qkv", lin), attention_op(st, mesh, att),
           linear_op(st, mesh, "out", lin), norm_op(st, mesh, "ln2"), experts_op(st, mesh, exp)]
    widths = [m.d_model, (m.n_heads + 2 * m.n_kv_heads) * m.head_dim_, m.n_heads * m.head_dim_, m.d_model, m.d_model]
    edges = [(i, i + 1, w) for i, w in enumerate(widths)] + [(5, 0, m.d_model)]
    _add_ends(st, mesh, lin, ops, edges, first, last, 5)
    return Graph(tuple(ops), tuple(edges), mesh, st.microbatch * st.seq_len, PRECISION_TABLE[st.precision].activation_bytes,
                 m.n_experts)
