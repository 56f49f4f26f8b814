"""Stragglers in the engines: per-GPU slowdown factors -> per (replica, pipeline rank) factors
-> a cost table whose compute actions take that much longer. No model knowledge: it scales the
durations the cost table gives.

A pipeline rank of one replica is ``tp`` GPUs in lockstep (the TP collectives inside every F/B
synchronise them): its factor is the largest of its GPUs'. Only compute actions (F, B, I, W,
STEP, OVERLAP_F_B) stretch; communication is the network's business (slow and failed NICs:
``parsim.sim.network.Topology``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from parsim.config.parallel import ParallelConfig
from parsim.config.stragglers import StragglerConfig
from parsim.schedule.ir import Op
from parsim.sim.engine import OpCost

COMPUTE = frozenset({Op.F, Op.B, Op.I, Op.W, Op.STEP})


def gpu_slowdowns(st: StragglerConfig, gpus_per_node: int, world: int = 0) -> dict[int, float]:
    """Global GPU -> slowdown (its own draw x slow GPU x throttled node), for the GPUs that have
    one; ``world``: the job's GPUs, for the ``gpu_sigma`` draws (seeded)."""
    out = dict(st.gpus)
    if st.gpu_sigma > 0 and world:
        draws = np.exp(st.gpu_sigma * np.random.default_rng(st.seed).standard_normal(world))
        for g, f in enumerate(draws.tolist()):
            out[g] = out.get(g, 1.0) * f
    for node, f in st.nodes:
        for g in range(node * gpus_per_node, (node + 1) * gpus_per_node):
            out[g] = out.get(g, 1.0) * f
    return out


def rank_gpus(par: ParallelConfig, rep: int, rank: int) -> list[int]:
    """Every global GPU of pipeline rank ``rank`` in replica ``rep`` (= d * cp + c): its TP group."""
    d, c = divmod(rep, par.cp)
    return par.group_ranks("tp", d * par.stride("dp") + rank * par.stride("pp") + c * par.stride("cp"))


def rank_factors(par: ParallelConfig, slow: dict[int, float]) -> dict[tuple[int, int], float]:
    """(replica, pipeline rank) -> the slowest of its GPUs' factors, for those not at 1."""
    out: dict[tuple[int, int], float] = {}
    for g, f in slow.items():
        coord = {a: (g // par.stride(a)) % getattr(par, a) for a in ("dp", "pp", "cp")}
        key = (coord["dp"] * par.cp + coord["cp"], coord["pp"])
        out[key] = max(out.get(key, 1.0), f)
    return {k: f for k, f in out.items() if f != 1.0}


class SlowedCosts:
    """``base`` with the compute actions of some stages ``factor`` times as long."""

    def __init__(self, base, factor_of_stage: dict[int, float]):
        self.base, self.factor = base, factor_of_stage
        if hasattr(base, "unit_cost"):  # token slices (TeraPipe): the engine asks per slice
            self.unit_cost = self._unit_cost

    def _unit_cost(self, stage: int, op: Op, unit: int) -> OpCost:
        c = self.base.unit_cost(stage, op, unit)
        f = self.factor.get(stage, 1.0)
        return replace(c, duration_s=c.duration_s * f) if f != 1.0 and op in COMPUTE else c

    def op_cost(self, stage: int, op: Op) -> OpCost:
        c = self.base.op_cost(stage, op)
        f = self.factor.get(stage, 1.0)
        return replace(c, duration_s=c.duration_s * f) if f != 1.0 and op in COMPUTE else c

    def overlap_cost(self, f_stage: int, b_stage: int, b_op: Op) -> float:
        fn = getattr(self.base, "overlap_cost", None)
        base = fn(f_stage, b_stage, b_op) if fn is not None else (
            self.base.op_cost(f_stage, Op.F).duration_s + self.base.op_cost(b_stage, b_op).duration_s)
        return base * self.factor.get(f_stage, 1.0)

    def p2p_bytes(self, stage: int, op: Op) -> float:
        return self.base.p2p_bytes(stage, op)

    def link_spec(self, src: int, dst: int):
        return self.base.link_spec(src, dst)

    def __getattr__(self, name: str):  # stages, stage_costs, ...: the base's
        if name in ("base", "factor", "unit_cost"):
            raise AttributeError(name)
        return getattr(self.base, name)


def slowed(base, stage_to_rank: tuple[int, ...], factors: dict[tuple[int, int], float], rep: int = 0):
    """``base`` as replica ``rep`` runs it (``base`` itself when none of its ranks is slow)."""
    per_stage = {s: factors[(rep, r)] for s, r in enumerate(stage_to_rank) if (rep, r) in factors}
    return SlowedCosts(base, per_stage) if per_stage else base


def fast_stragglers(sc, schedule, costs):
    """The cost table fast mode runs: replica 0's slow ranks stretched. Fast mode simulates one
    replica and the network analytically: a straggler in another replica, or a NIC entry, needs
    full mode (one line naming the key)."""
    st = sc.stragglers
    if st is None:
        return costs
    from parsim.errors import ConfigError
    if st.nics or st.failed_nics:
        raise ConfigError(sc.file, "stragglers.nics" if st.nics else "stragglers.failed_nics",
                          'slow and failed NICs change the network: they need [simulation] mode = "full"')
    if st.replica_hardware:
        raise ConfigError(sc.file, "stragglers.replica_hardware", 'replicas on other GPUs need [simulation] mode = "full" '
                                                                  "(fast mode simulates replica 0 only)")
    factors = rank_factors(sc.parallel, gpu_slowdowns(st, sc.hardware.gpus_per_node, sc.gpus))
    elsewhere = sorted(k for k in factors if k[0] != 0)
    if elsewhere:
        rep, rank = elsewhere[0]
        raise ConfigError(sc.file, "stragglers", f"a slow GPU in replica {rep} (pipeline rank {rank}): fast mode "
                                                 'simulates replica 0 only; use [simulation] mode = "full"')
    return slowed(costs, schedule.stage_to_rank, factors)


def nic_changes(st: StragglerConfig | None, hw) -> dict:
    """Topology keyword arguments of ``[stragglers]``: degraded NICs' bandwidth fractions, and
    for each failed NIC the node's next healthy NIC (cyclically) its GPUs use instead."""
    if st is None or not (st.nics or st.failed_nics):
        return {}
    down, per = set(st.failed_nics), hw.nics_per_node
    reroute = {}
    for nic in st.failed_nics:
        node, local = divmod(nic, per)
        reroute[nic] = next(node * per + (local + k) % per for k in range(1, per + 1)
                            if node * per + (local + k) % per not in down)
    return {"nic_scale": dict(st.nics), "nic_reroute": reroute}
