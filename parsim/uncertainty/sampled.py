"""A cost table that draws: every action's duration is the model's, its parts each times a
lognormal factor from the profile's spread (``parsim.cluster.spread``).

Per sample: one model-discrepancy factor (``model``) on every duration; one device-speed
factor (``speed``) on all compute and memory work; one residual
factor per (stage, op, family) -- the same kernel shapes carry the same model error in every
microbatch; one factor per point-to-point link (its residual and repeat noise: the engine's
links are FIFO queues priced once). Per action: a fresh repeat-noise factor for each part of
it -- the op's compute kernels together (one draw: on the machines measured the noise of
consecutive kernels moves together), each exposed collective inside it (TP / CP / EP), the
data-parallel collectives and the optimizer step on their own.

The engine asks ``op_cost`` once per action when a table sets ``fresh_per_action``.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

from parsim.cluster.spread import Spread
from parsim.costs.stage import PIPELINE_OPS
from parsim.schedule.ir import Op
from parsim.sim.engine import OpCost

COLLECTIVE_OPS = frozenset({Op.REDUCE_GRAD, Op.UNSHARD})


class SampledCosts:
    """``base`` (a ModelCosts, or a wrapper of one that passes ``stage_costs`` through) with
    durations drawn from ``spread`` (one object = one sample)."""

    fresh_per_action = True

    def __init__(self, base, spread: Spread, rng: random.Random, model: float | None = None):
        self.base, self.spread, self.rng = base, spread, rng
        self.speed = self._draw(spread.speed)
        # the model-discrepancy factor: given (one stratum of the sample set's, band.model_factors),
        # else drawn
        self.model = self._draw(spread.model) if model is None else model
        self._residual: dict[tuple, float] = {}
        self._children: dict[int, SampledCosts] = {}
        if hasattr(base, "unit_cost"):  # token slices (TeraPipe): the engine asks per slice
            self.unit_cost = self._unit_cost

    def _draw(self, sigma: float) -> float:
        return math.exp(sigma * self.rng.gauss(0.0, 1.0)) if sigma > 0 else 1.0

    def _factor(self, stage: int, op: Op, family: str) -> float:
        """Residual (once per sample and (stage, op, family)) x repeat (every call) x model x speed
        (compute, memory)."""
        key = (stage, op, family)
        res = self._residual.get(key)
        if res is None:
            res = self._residual[key] = self._draw(self.spread.sigma(family, "residual"))
        f = res * self._draw(self.spread.sigma(family, "repeat")) * self.model
        return f * self.speed if family in ("compute", "memory") else f

    def op_cost(self, stage: int, op: Op) -> OpCost:
        c = self.base.op_cost(stage, op)
        if c.duration_s <= 0 and c.then_comm_s <= 0:
            return c
        if op in PIPELINE_OPS:
            stage_costs = getattr(self.base, "stage_costs", None)
            if stage_costs is None:  # a table without per-part seconds (token slices): all compute
                return replace(c, duration_s=c.duration_s * self._factor(stage, op, "compute"))
            p = stage_costs[stage].parts[op]
            comp = p.compute + p.recompute
            comm = {"tp": p.tp_comm, "cp": p.cp_comm, "ep": p.ep_comm}
            total = comp + sum(comm.values())
            if total <= 0:
                return c
            drawn = comp * self._factor(stage, op, "compute") + sum(
                v * self._factor(stage, (op, axis), "collective") for axis, v in comm.items() if v > 0)
            # the ratio first: undrawn factors (1.0) give exactly 1 and the cost back bit for bit
            return replace(c, duration_s=c.duration_s * (drawn / total))
        f = self._factor(stage, op, "collective" if op in COLLECTIVE_OPS else "memory")
        g = self._factor(stage, (op, "then"), "collective") if c.then_comm_s > 0 else 1.0
        return replace(c, duration_s=c.duration_s * f, lead_s=c.lead_s * f, tail_s=c.tail_s * f,
                       wait_s=None if c.wait_s is None else c.wait_s * f, then_comm_s=c.then_comm_s * g)

    def _unit_cost(self, stage: int, op: Op, unit: int) -> OpCost:
        """One token slice's compute, drawn as the whole op's compute is."""
        c = self.base.unit_cost(stage, op, unit)
        return replace(c, duration_s=c.duration_s * self._factor(stage, op, "compute"))

    def overlap_cost(self, f_stage: int, b_stage: int, b_op: Op) -> float:
        return self.base.overlap_cost(f_stage, b_stage, b_op) * self._factor(f_stage, Op.OVERLAP_F_B, "compute")

    def p2p_bytes(self, stage: int, op: Op) -> float:
        return self.base.p2p_bytes(stage, op)

    def for_replica(self, rep: int):
        """Full mode with replicas on other GPU types: that replica's table, drawn alike (same sample)."""
        fn = getattr(self.base, "for_replica", None)
        if fn is None:
            return self
        child = self._children.get(rep)
        if child is None:
            child = self._children[rep] = SampledCosts(fn(rep), self.spread, self.rng)
            child.speed, child.model, child._residual = self.speed, self.model, self._residual
        return child

    def __getattr__(self, name: str):  # stages, stage_costs ...: the base's (full mode reads them)
        if name in ("base", "spread", "rng", "speed", "model", "_residual", "_children", "unit_cost"):
            raise AttributeError(name)
        return getattr(self.base, name)

    def link_spec(self, src: int, dst: int) -> tuple[str, float, float]:
        name, bw, lat = self.base.link_spec(src, dst)
        f = self._factor(src, ("link", dst), "p2p")
        return name, bw / f, lat * f
