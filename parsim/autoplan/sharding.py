"""From ``[sharding]`` annotations to a strategy per op (propagation), and back.

Propagation (GSPMD's, for the block's chain): a linear op's role on an axis follows its weight's
annotation (``split(out)`` column, ``split(in)`` row, replicate), or the batch axes (``B``, ``Z``
where the weights are stored sharded); the ops between inherit it: attention splits heads on the
axis that QKV splits columns on; norms split tokens over the batch axes and, with
``sequence`` on the tensor axis, over it too (Megatron's sequence parallelism); the embedding
and the head split the vocabulary where their weights do. The collectives each choice implies
and the resharding between ops are then those of ``parsim.autoplan.graph`` / ``mesh``.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.autoplan.graph import Graph, edge_matrices, regather
from parsim.autoplan.mesh import Mesh
from parsim.cluster.hardware import HardwareProfile
from parsim.config.sharding import REPLICATE, Annotation, ShardingConfig
from parsim.errors import ConfigError

FILE = "[sharding]"
WEIGHT_OF = {"qkv": "qkv", "out": "out", "up": "up", "down": "down", "embedding": "embedding", "lm_head": "lm_head"}


def stage_mesh(sc: ShardingConfig, offset: int = 0) -> Mesh:
    """The mesh one pipeline stage runs on (the pipeline axis taken out)."""
    return Mesh(tuple((a, n) for a, n in sc.mesh if a != sc.pipeline), offset)


def _linear_role(sc: ShardingConfig, op: str, axis: str) -> str:
    if axis in sc.batch:
        return "Z" if axis in sc.fsdp else "B"
    a = sc.weight(WEIGHT_OF[op])
    if a.axis != axis:
        return "X"
    column = a.dim == 1
    return "C" if column else "R"


def roles_of(sc: ShardingConfig, op: str, kind: str, mesh: Mesh) -> tuple[str, ...]:
    """The op's role on each axis of ``mesh`` under the annotations."""
    qkv = sc.weight("qkv")
    out = []
    for a in mesh.names:
        if a == sc.sequence and a not in (qkv.axis,) and mesh.size(a) > 1:
            raise ConfigError(FILE, "sharding.sequence", "context parallelism is not in the op graph yet")
        if kind == "linear":
            out.append(_linear_role(sc, op, a))
        elif kind == "attn":
            out.append("B" if a in sc.batch else "H" if qkv.axis == a and qkv.dim == 1 else "X")
        elif kind == "norm":
            out.append("T" if a in sc.batch or a == sc.sequence else "X")
        elif kind == "experts":
            ex = sc.weight("experts")
            out.append(("E" if ex.axis == a and ex.dim == 0 else "Z" if a in sc.fsdp else "B") if a in sc.batch else
                       "T" if qkv.axis == a else "X")
        else:
            w = sc.weight(WEIGHT_OF[kind])
            vocab_dim = 0 if kind == "embedding" else 1
            out.append(("Z" if a in sc.fsdp else "B") if a in sc.batch else
                       "V" if (w.axis == a and w.dim == vocab_dim) else "X")
    return tuple("X" if n == 1 else r for r, n in zip(out, mesh.sizes))


def propagate(g: Graph, sc: ShardingConfig) -> tuple[int, ...]:
    """Strategy index per op of ``g`` that the annotations amount to."""
    choice = []
    for op in g.ops:
        want = roles_of(sc, op.name, op.kind, g.mesh)
        idx = [i for i, s in enumerate(op.strategies) if s.roles == want]
        if not idx:
            raise ConfigError(FILE, f"sharding.weights.{op.name}", f"roles {''.join(want)} on mesh "
                                                                   f"{dict(g.mesh.axes)} do not divide the op")
        choice.append(idx[0])
    return tuple(choice)


def annotations_of(g: Graph, choice: tuple[int, ...]) -> dict[str, str]:
    """Weight annotations (``replicate`` / ``split(dim, axis)``) of a strategy choice, per weight."""
    out = {}
    for op, s in zip(g.ops, choice):
        roles = op.strategies[s].roles
        if op.kind == "linear":
            ann = REPLICATE
            for a, r in zip(g.mesh.names, roles):
                if r in "CR":
                    ann = Annotation(1 if r == "C" else 0, a)
            out[op.name] = str(ann)
        elif op.kind == "experts":  # EP splits the expert dim; expert TP splits each expert's MLP as Megatron's
            for a, r in zip(g.mesh.names, roles):
                if r == "E":
                    out["experts"] = str(Annotation(0, a))
                elif r == "T":
                    out["up"], out["down"] = str(Annotation(1, a)), str(Annotation(0, a))
        elif op.kind in ("embedding", "lm_head"):
            ann = REPLICATE
            for a, r in zip(g.mesh.names, roles):
                if r == "V":
                    ann = Annotation(0 if op.kind == "embedding" else 1, a)
            out[op.name] = str(ann)
    return out


@dataclass(frozen=True)
class Breakdown:
    """One block (and ends) under a strategy choice, one microbatch."""

    forward_s: float
    """Compute of the forward."""
    backward_s: float
    """Compute of the backward (input and weight gradients; slowed by what it hides)."""
    forward_comm_s: float
    """Resharding collectives of the forward (Megatron's g: all-reduce / reduce-scatter, all-gather)."""
    backward_comm_s: float
    """Resharding collectives of the backward (Megatron's f)."""
    weight_comm_s: float
    """FSDP's gathers and reduce-scatters per microbatch."""
    step_comm_s: float
    """Gradient all-reduce once per step."""
    state_bytes: float
    """Weights, gradients and optimizer states per device."""


def breakdown(hw: HardwareProfile, g: Graph, choice: tuple[int, ...]) -> Breakdown:
    ss = [op.strategies[s] for op, s in zip(g.ops, choice)]
    fc = bc = slow = 0.0
    for e, (u, v, _) in enumerate(g.edges):
        fwd, bwd = edge_matrices(hw, g, e)
        _, hidden_cost = regather(hw, g, e, ss[u], ss[v])  # the edge's cost holds it: compute, not comm
        fc += fwd[choice[u]][choice[v]]
        bc += bwd[choice[u]][choice[v]] - hidden_cost
        slow += hidden_cost
    a2a = sum(s.a2a_s for s in ss)  # the experts' dispatch + combine, once per pass
    counts = sum(s.counts_s for s in ss)  # the forward's count exchange before its dispatch
    return Breakdown(sum(s.forward_s for s in ss), sum(s.backward_s for s in ss) + slow, fc + a2a + counts, bc + a2a,
                     sum(s.comm_s for s in ss), sum(s.step_comm_s for s in ss), sum(s.state_bytes for s in ss))
