"""Pipeline ranks on different GPU types (``[stragglers] rank_hardware``): each rank's stages
costed with its own profile, and the layers apportioned to each rank's speed.

One stage per rank (``vpp = 1``, one chain): stage s runs on pipeline rank s. A rank's ops
(compute, its TP collectives, its DP gradient reduction) come from the cost model of the
scenario on that rank's profile; the point-to-point links between ranks stay the job's.
Results read the base profile's cost tables (FLOPs, bytes, memory); the timeline is the mixed job's.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from parsim.cluster.hardware import HardwareProfile, load_profile
from parsim.config.scenario import Scenario
from parsim.costs.inputs import cost_inputs
from parsim.costs.layer import layer_cost
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.costs.stage import block_inputs, layer_kind
from parsim.schedule.ir import Op


def rank_profiles(sc: Scenario, key: str = "rank_hardware") -> dict[int, HardwareProfile]:
    """Pipeline rank (or, ``key = "replica_hardware"``, DP replica) -> its profile, for those named."""
    base = Path(sc.file).parent if sc.file else None
    out = {}
    for i, name in getattr(sc.stragglers, key):
        try:
            out[i] = load_profile(name, base_dir=base)
        except ConfigError as e:
            raise ConfigError(sc.file, f"stragglers.{key}", e.problem) from None
    return out


def check_mixed(sc: Scenario) -> None:
    if sc.parallel.vpp != 1:
        raise ConfigError(sc.file, "stragglers.rank_hardware", "needs one stage per pipeline rank (vpp = 1)")


class MixedCosts:
    """The job's cost table with some pipeline ranks' stages from another profile's cost model."""

    def __init__(self, sc: Scenario, base: ModelCosts):
        check_mixed(sc)
        self.base = base
        self.of_rank = {r: ModelCosts(cost_inputs(replace(sc, hardware=hw))) for r, hw in rank_profiles(sc).items()}

    def _at(self, stage: int) -> ModelCosts:
        return self.of_rank.get(stage, self.base)  # vpp = 1: stage s on rank s

    def op_cost(self, stage: int, op: Op):
        return self._at(stage).op_cost(stage, op)

    def overlap_cost(self, f_stage: int, b_stage: int, b_op: Op) -> float:
        return self._at(f_stage).overlap_cost(f_stage, b_stage, b_op)

    def p2p_bytes(self, stage: int, op: Op) -> float:
        return self.base.p2p_bytes(stage, op)

    def link_spec(self, src: int, dst: int):
        return self.base.link_spec(src, dst)

    def __getattr__(self, name: str):  # stages, stage_costs, tables ...: the base's
        if name in ("base", "of_rank"):
            raise AttributeError(name)
        return getattr(self.base, name)


def _block_times(sc: Scenario) -> list[float]:
    """F + B (+ recompute) seconds of every transformer block on ``sc``'s hardware."""
    inp = ModelCosts(cost_inputs(sc)).layer_inputs
    out = []
    for li in range(sc.model.n_layers):
        lc = layer_cost(*block_inputs(inp, layer_kind(sc.model, li)))
        rec = lc.forward.total if sc.training.recompute == "full" else 0.0
        out.append(lc.forward.total + lc.backward_input.total + lc.backward_weight.total + rec)
    return out


def speed_balanced_layers(sc: Scenario) -> tuple[int, ...]:
    """Blocks per pipeline rank minimising the slowest rank, each rank's blocks timed on its own
    profile, the embedding on rank 0 and the LM head and loss on the last (on theirs). A dynamic
    program over contiguous splits (at least one block per rank)."""
    check_mixed(sc)
    pp, n = sc.parallel.pp, sc.model.n_layers
    profiles = rank_profiles(sc)
    times = {}
    for r in range(pp):
        hw = profiles.get(r, sc.hardware)
        if hw.name not in times:
            times[hw.name] = (_block_times(replace(sc, hardware=hw)), hw)
    per = [times[profiles.get(r, sc.hardware).name][0] for r in range(pp)]
    extra = [0.0] * pp
    for r in {0, pp - 1}:
        hw = profiles.get(r, sc.hardware)
        st = ModelCosts(cost_inputs(replace(sc, hardware=hw))).stages[r]
        blocks = sum(times[hw.name][0][li] for li in st.layers)
        extra[r] += max(0.0, st.parts[Op.F].total + st.parts[Op.B].total - blocks)
    prefix = [[0.0] * (n + 1) for _ in range(pp)]
    for r in range(pp):
        for li in range(n):
            prefix[r][li + 1] = prefix[r][li] + per[r][li]
    INF = float("inf")
    best = [[INF] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for s in range(1, pp + 1):
        for j in range(s, n - (pp - s) + 1):
            for i in range(s - 1, j):
                if best[s - 1][i] == INF:
                    continue
                cost = max(best[s - 1][i], prefix[s - 1][j] - prefix[s - 1][i] + extra[s - 1])
                if cost < best[s][j]:
                    best[s][j], cut[s][j] = cost, i
    out, j = [], n
    for s in range(pp, 0, -1):
        out.append(j - cut[s][j])
        j = cut[s][j]
    return tuple(reversed(out))


class ReplicaCosts:
    """The job's cost table (``run``: replica 0's) and, for each DP replica on another GPU type
    (``[stragglers] replica_hardware``, full mode), the cost model on that replica's profile."""

    def __init__(self, sc: Scenario, run):
        self.run = run
        self.replicas = {rep: ModelCosts(cost_inputs(replace(sc, hardware=hw)))
                         for rep, hw in rank_profiles(sc, "replica_hardware").items()}

    def for_replica(self, rep: int):
        return self.replicas.get(rep, self.run)

    def busy_ratio(self, stage_to_rank: tuple[int, ...]) -> dict[tuple[int, int], float]:
        """(replica, pipeline rank) -> that rank's F + B time over replica 0's, for the other replicas."""
        out = {}
        for rep, table in self.replicas.items():
            for rank in sorted(set(stage_to_rank)):
                stages = [s for s, r in enumerate(stage_to_rank) if r == rank]
                mine = sum(table.op_cost(s, op).duration_s for s in stages for op in (Op.F, Op.B))
                base = sum(self.run.op_cost(s, op).duration_s for s in stages for op in (Op.F, Op.B))
                if base > 0:
                    out[(rep, rank)] = mine / base
        return out

    def op_cost(self, stage: int, op: Op):
        return self.run.op_cost(stage, op)

    def overlap_cost(self, f_stage: int, b_stage: int, b_op: Op) -> float:
        return self.run.overlap_cost(f_stage, b_stage, b_op)

    def p2p_bytes(self, stage: int, op: Op) -> float:
        return self.run.p2p_bytes(stage, op)

    def link_spec(self, src: int, dst: int):
        return self.run.link_spec(src, dst)

    def __getattr__(self, name: str):
        if name in ("run", "replicas"):
            raise AttributeError(name)
        return getattr(self.run, name)
