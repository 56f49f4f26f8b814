"""Data-parallel and optimizer ops of one stage: gradient reduction (REDUCE_GRAD), the optimizer
update (STEP) with ZeRO-1/2's parameter all-gather after it, ZeRO-3's gathers (UNSHARD/RESHARD).

:func:`dp_ops` is a pure function of hashable inputs (:class:`DPInputs`); what does not depend
on the backward's length (the collectives, the update, ZeRO's gathers) is cached.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from parsim.cluster.collectives import bytes_sent_per_rank, parameter_server_time
from parsim.config.parallel import ParallelConfig
from parsim.config.scenario import OverlapConfig
from parsim.costs.inputs import CachedHash, Cluster, rank_groups
from parsim.costs.layer import cached_collective_time
from parsim.costs.memory import state_bytes_per_param
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
    """Whether gradient reduction and the parameter gather overlap with compute."""


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
    """Blocks of the stage (gradient buckets; ZeRO-3 gathers two blocks at a time)."""


@dataclass(frozen=True)
class DPOps:
    """A stage's data-parallel ops and the bytes each sends per execution."""

    ops: dict[Op, OpCost]
    """REDUCE_GRAD (dp > 1), STEP, UNSHARD/RESHARD (ZeRO-3, dp > 1): read only."""
    sent: dict[str, float]
    """Bytes one GPU sends per execution, by the engine's span name (REDUCE_GRAD, UNSHARD, PARAM_GATHER)."""


def dp_ops(inp: DPInputs) -> DPOps:
    """The stage's data-parallel and optimizer ops."""
    reduce_s, grad_bytes, rest = _stage_dp(inp.setting, inp.params, inp.expert_params, inp.n_layers)
    if reduce_s is None:
        return rest
    t = reduce_s
    if inp.setting.overlap.grad_reduce and inp.n_layers:
        # buckets of later layers reduce while earlier layers still run backward
        n = inp.n_layers
        t = max(t - inp.backward_s * (n - 1) / n, t / n)
    return DPOps({Op.REDUCE_GRAD: OpCost(t, bytes=grad_bytes), **rest.ops}, rest.sent)


@lru_cache(maxsize=65536)
def _stage_dp(st: DPSetting, params: float, expert_params: float,
              n_layers: int) -> tuple[float | None, float, DPOps]:
    """(gradient reduction seconds before overlap or None when dp = 1, the gradient bytes,
    the other ops and the bytes of all): what does not depend on the backward's length."""
    hw, par = st.cluster, st.parallel
    groups = rank_groups(par)
    w, g, k = state_bytes_per_param(st.optimizer, st.precision)
    dense, expert = params - expert_params, expert_params
    ops: dict[Op, OpCost] = {}
    sent: dict[str, float] = {}
    t = None
    if par.dp > 1:
        kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
        if par.dp_comm == "parameter_server":  # push gradients to one rank, pull the update back
            t = parameter_server_time(hw.profile, dense * g, groups.dp)
        else:
            t = cached_collective_time(hw, kind, dense * g, groups.dp)
        # a parameter server moves what a ring all-reduce moves, on average per rank: 2(n-1)/n
        sent["REDUCE_GRAD"] = bytes_sent_per_rank(kind, dense * g, par.dp)
        if expert:  # expert gradients reduce over the expert-data-parallel ranks
            t += cached_collective_time(hw, kind, expert * g, groups.edp)
            sent["REDUCE_GRAD"] += bytes_sent_per_rank(kind, expert * g, len(groups.edp))
    shard = dense / (par.dp if par.zero >= 1 else 1)
    shard += expert / (len(groups.edp) if par.zero >= 1 else 1)
    step_bytes = shard * (2 * k + g + w)  # read+write optimizer state, read grads, write weights
    then, then_bytes = 0.0, 0.0
    if par.zero in (1, 2) and par.dp > 1:
        # ZeRO-1/2: all-gather of the updated parameter shards (reduce-scatter + all-gather
        # = the all-reduce's bytes); overlapped with the next step's forward when asked
        then_bytes = params * w
        sent[PARAM_GATHER] = bytes_sent_per_rank("all_gather", then_bytes, par.dp)
        if not st.overlap.param_gather:
            then = cached_collective_time(hw, "all_gather", then_bytes, groups.dp)
    ops[Op.STEP] = OpCost(hw.profile.device.memory_time(step_bytes), then_comm_s=then, then_comm_bytes=then_bytes)
    if par.zero == 3 and par.dp > 1:
        gathered = params * w
        gather = cached_collective_time(hw, "all_gather", gathered, groups.dp)
        window = 2 * params * w / max(1, n_layers)  # two blocks gathered at a time
        ops[Op.UNSHARD] = OpCost(gather, bytes=gathered, stash_bytes=window, mem_kind="other")
        ops[Op.RESHARD] = OpCost(0.0, free_bytes=window, mem_kind="other")
        sent["UNSHARD"] = bytes_sent_per_rank("all_gather", gathered, par.dp)
    return t, params * g, DPOps(ops, sent)


def clear_caches() -> None:
    """Empty this module's caches (a cold start)."""
    _stage_dp.cache_clear()
