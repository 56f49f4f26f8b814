"""Action -> seconds and bytes: the simulator's only cost input.

:class:`ModelCosts` assembles a job's stages from the cached pure parts -- a block
(``parsim.costs.layer``), a stage (``parsim.costs.stage``), the data-parallel and optimizer
ops (``parsim.costs.dp``) -- from typed inputs (:class:`parsim.costs.inputs.CostInputs`),
and answers the engine's questions (``op_cost``, ``p2p_bytes``, ``link_spec``,
``overlap_cost``). Results get its :meth:`ModelCosts.tables`, never the object.

Each op's time is kept as parts (compute, recompute, tp_comm, cp_comm, ep_comm) so
results can say where step time goes, and its bytes by axis. A ``[costs]`` table
replaces the times.
"""
from __future__ import annotations

from dataclasses import dataclass

import parsim.cluster.contention as _contention
import parsim.costs.compute as _compute
import parsim.costs.dp as _dp
import parsim.costs.inputs as _inputs
import parsim.costs.layer as _layer
import parsim.costs.offload_ops as _offload_ops
import parsim.costs.stage as _stage
from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.moe import layer_histograms
from parsim.config.scenario import Scenario
from parsim.costs.dp import DPInputs, DPOps, DPSetting, dp_ops, dp_sms, fsdp2_copy_bytes, tied_embedding_sync_s
from parsim.costs.inputs import (
    CostInputs,
    cost_inputs,
    layer_inputs,
    rank_groups,
    schedule_traits_of,
)
from parsim.costs.layer import moe_phase
from parsim.costs.memory import framework_states, nccl_buffer_bytes
from parsim.costs.memory_ops import fp8_weight_copy_bytes, non_tn_fp8_gemms
from parsim.costs.moe import all_to_all_bytes
from parsim.costs.parts import AxisBytes, Parts
from parsim.costs.stage import (
    PIPELINE_OPS,
    StageCost,
    stage_cost,
    stage_layout,
    with_added_compute,
    with_measured_times,
)
from parsim.costs.tables import CostTables, MoEFigures, OpRow, RankStatic, StageRow
from parsim.schedule.ir import Op
from parsim.schedule.semantics import weight_versions as schedule_weight_versions
from parsim.sim.engine import OpCost

_NO_OP = OpCost(0.0)


@dataclass(frozen=True)
class Stage:
    """One stage of a job: its index, blocks and costs (attributes of ``cost`` read through)."""

    stage: int
    """Stage index."""
    layers: tuple[int, ...]
    """Global indices of its transformer blocks."""
    cost: StageCost
    """Its costs for one microbatch."""
    ops: dict[Op, OpCost]
    """Every op it runs: F/B/I/W and the data-parallel and optimizer ops."""

    def __getattr__(self, name: str):
        if name == "cost":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.cost, name)


class ModelCosts:
    """The engine's cost table for one job, built from :class:`CostInputs`."""

    def __init__(self, inputs: CostInputs):
        self.inputs = inputs
        par = inputs.parallel
        self.layer_inputs = layer_inputs(inputs)
        """What every block's cost depends on (the key of the cached layer and stage costs)."""
        self.traits = schedule_traits_of(inputs.schedule)
        self.groups = rank_groups(par)
        self.chain_len = par.n_stages // self.traits.n_chains  # stages per model copy
        per_layer = inputs.moe is not None and layer_histograms(inputs.moe) is not None
        tr = inputs.training
        layout = stage_layout(inputs.model, inputs.layers_per_stage, self.chain_len, per_layer,
                              (tr.bf16_first_layers, tr.bf16_last_layers))
        self.layers = layout.layers
        """Per stage: global indices of its transformer blocks."""
        self.shape_of = layout.shape_of
        """Per stage: which of the distinct stage shapes it has (equal index: equal costs)."""
        self.shapes = layout.shapes
        """The distinct stage shapes (``parsim.costs.stage.StageShape``: blocks' kinds, position)."""
        mc = inputs.measured
        self.tied_sync: tuple[float, ...] = (0.0,) * len(layout.shape_of)
        """Per stage: its tied-embedding gradient sync, seconds (:meth:`tied_sync_s`; 0 with measured costs)."""
        if mc is None:  # equal stages share one StageCost and one DPOps
            shared = [stage_cost(self.layer_inputs, sh) for sh in layout.shapes]
            tr = inputs.training
            setting = DPSetting(inputs.cluster, par, tr.optimizer, tr.precision, inputs.overlap,
                                inputs.model, self.traits.n_chains)
            self.dp_setting: DPSetting | None = setting
            """The job's data-parallel setting (None with measured costs)."""
            copies = fsdp2_copy_bytes(setting)  # FSDP2's copies on the compute stream, per parameter
            if copies:
                dev = inputs.hardware.device
                shared = [with_added_compute(self.layer_inputs, st, {op: dev.memory_time(b * st.params)
                                                                     for op, b in copies.items()})
                          for st in shared]
            tied_split = any(sh.head_copy for sh in layout.shapes)
            tied = [tied_embedding_sync_s(inputs.cluster, inputs.model, par, tr.precision, sh.first, sh.head_copy,
                                          tied_split) for sh in layout.shapes]
            self.tied_sync = tuple(tied[i] for i in layout.shape_of)
            dp = [self._dp_of(setting, st, t) for st, t in zip(shared, tied)]
            costs = [shared[i] for i in layout.shape_of]
            self.dp_ops: tuple[DPOps | None, ...] = tuple(dp[i] for i in layout.shape_of)
            """Per stage: data-parallel and optimizer ops (None with measured costs: pipeline only)."""
        else:
            costs = [with_measured_times(self.layer_inputs, stage_cost(self.layer_inputs, layout.shapes[i]),
                                         mc.forward_s[s], _at(mc.backward_s, s), _at(mc.backward_input_s, s),
                                         _at(mc.backward_weight_s, s)) for s, i in enumerate(layout.shape_of)]
            self.dp_ops = (None,) * len(costs)
            self.dp_setting = None
        self.stage_costs: tuple[StageCost, ...] = tuple(costs)
        """Per stage: its costs for one microbatch (equal stages share one object)."""
        self._ops: dict[int, dict[Op, OpCost]] = {}
        self._pairs: dict[tuple[int, int, Op], float] = {}
        self._stages: list[Stage] | None = None
        self.blocking_p2p = not inputs.overlap.p2p
        """Sends hold the sender's compute until they arrive (``[overlap] p2p = false``)."""
        self.dp_core_share = inputs.hardware.device.transport_core_share or 0.0
        """Compute runs at ``1 - dp_core_share`` while its rank's dp stream is busy (a CPU rank's
        gloo threads share its core: ``Device.transport_core_share``; 0 on GPUs)."""

    @classmethod
    def from_scenario(cls, sc: Scenario) -> ModelCosts:
        """The cost model of a scenario (``ModelCosts(cost_inputs(sc))``)."""
        return cls(cost_inputs(sc))

    def _dp_of(self, setting: DPSetting, st: StageCost, tied_sync_s: float = 0.0) -> DPOps:
        return dp_ops(DPInputs(setting, st.params, st.expert_params, st.parts[Op.B].total, st.n_layers,
                               st.parts[Op.F].total, moe_layers=st.moe_layers, tied_sync_s=tied_sync_s))

    def tied_sync_s(self, stage: int) -> float:
        """Seconds of ``stage``'s tied-embedding gradient all-reduce with the other end of its
        pipeline (``parsim.costs.dp.tied_embedding_sync_s``), inside its REDUCE_GRAD: the full
        engine, which times the data-parallel part as flows, adds it after them."""
        return self.tied_sync[stage]

    # ---- CostTable protocol (the engine's questions) -------------------------
    def stage_ops(self, stage: int) -> dict[Op, OpCost]:
        """Every op ``stage`` runs, with its cost."""
        ops = self._ops.get(stage)
        if ops is None:
            dp = self.dp_ops[stage]
            ops = {**self.stage_costs[stage].ops, **(dp.ops if dp is not None else {})}
            if self.inputs.offload.active and self.inputs.measured is None:  # [offload]: parsim.costs.offload_ops
                ops = _offload_ops.stage_ops(self, stage, ops)
            self._ops[stage] = ops
        return ops

    def op_cost(self, stage: int, op: Op) -> OpCost:
        return self.stage_ops(stage).get(op) or _NO_OP

    def p2p_bytes(self, stage: int, op: Op) -> float:
        return self.stage_costs[stage].p2p_bytes

    def send_post_s(self, nbytes: float) -> float:
        """Seconds the sender's compute waits while it posts a send of ``nbytes``
        (``HardwareProfile.send_post_time``: gloo's ``isend`` on a CPU rank; 0 on GPU profiles
        and with measured costs, whose p2p time is one number)."""
        return 0.0 if self.inputs.measured is not None else self.inputs.hardware.send_post_time(nbytes)

    def dp_collective_sms(self) -> int:
        """SMs one of the job's data-parallel collectives holds (``parsim.costs.dp.dp_sms``)."""
        return dp_sms(self.dp_setting) if self.dp_setting is not None else 0

    def link_spec(self, src: int, dst: int) -> tuple[str, float, float]:
        mc = self.inputs.measured
        if mc is not None:
            return ("measured", 0.0, mc.p2p_s)
        pr = self.groups.pipeline
        link = self.inputs.hardware.link_between(pr[src], pr[dst])
        return (link.name, link.effective_bandwidth, link.latency_s)

    def overlap_cost(self, f_stage: int, b_stage: int, b_op: Op) -> float:
        """Duration of an OVERLAP_F_B pair: ``[costs] overlap_f_b_s`` of the F's stage when
        given; otherwise F + B minus the communication each hides under the other's compute
        (TP/CP/EP collectives inside the ops; with measured costs and no key: F + B)."""
        mc = self.inputs.measured
        if mc is not None and mc.overlap_f_b_s is not None:
            return mc.overlap_f_b_s[f_stage]
        key = (f_stage, b_stage, b_op)
        dur = self._pairs.get(key)  # the engines ask once per composite action: same stages, same answer
        if dur is None:
            f, b = self.stage_costs[f_stage].parts[Op.F], self.stage_costs[b_stage].parts[b_op]
            if self.inputs.ep_pairs:
                dur = f.total + b.total - self._ep_pair_saving(f, b, f_stage, b_stage, b_op)
            else:
                comm = lambda p: p.tp_comm + p.cp_comm + p.ep_comm
                dur = f.total + b.total - min(comm(f), b.compute + b.recompute) - min(comm(b), f.compute + f.recompute)
            self._pairs[key] = dur
        return dur

    @property
    def pair_releases_first(self) -> bool:
        """Megatron's combined-1F1B pairs run block by block: the backward frees each block's
        activations as the forward stashes the next (the engine frees the backward's stash when
        the pair starts); DualPipe's composites keep both stashes for the pair."""
        return self.inputs.ep_pairs

    def _ep_pair_saving(self, f: Parts, b: Parts, f_stage: int, b_stage: int, b_op: Op) -> float:
        """Seconds a Megatron combined-1F1B pair saves: the halves run block by block in three
        segments, the expert all-to-alls on the communication stream beside the compute the
        other stream runs then (megatron/core/models/common/model_chunk_schedule_plan.py,
        ``run``'s diagram: "comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd | combine_fwd",
        "comp_stream: pre_dispatch_fwd | mlp_bwd->mlp_bwd_dw->mlp_fwd | pre_dispatch_bwd"): the
        backward's combine beside the forward's attention (the block's non-expert work), both
        dispatches beside both passes' experts, the forward's combine beside the backward's
        attention. Each segment hides at most its compute: an all-to-all longer than its segment
        shows the rest. TP and CP collectives stay on the compute stream; the SMs the dispatch
        kernels hold slow the compute beside them (``parsim.cluster.contention``)."""
        li = self.layer_inputs
        if li.moe is None:
            return 0.0
        ph = moe_phase(li)
        dev = self.inputs.hardware.device
        n_f, n_b = self.stage_costs[f_stage].moe_layers, self.stage_costs[b_stage].moe_layers
        b_expert = ph.backward_input_s + (ph.backward_weight_s if b_op == Op.B else 0.0)
        f_work, b_work = f.compute + f.recompute, b.compute + b.recompute
        f_exp = min(f_work, n_f * ph.forward_s)
        b_exp = min(b_work, n_b * b_expert)
        pieces = ((b.ep_comm / 2, f_work - f_exp), (f.ep_comm / 2 + b.ep_comm / 2, f_exp + b_exp),
                  (f.ep_comm / 2, b_work - b_exp))
        saving = 0.0
        for comm, work in pieces:
            hidden = min(comm, work)
            saving += hidden - _contention.slowdown_s(dev, ph.dispatcher_sms, hidden, work)
        return max(0.0, saving)

    @property
    def stages(self) -> list[Stage]:
        """Per stage: index, blocks and costs (built on first use)."""
        if self._stages is None:
            self._stages = [Stage(s, self.layers[s], st, self.stage_ops(s)) for s, st in enumerate(self.stage_costs)]
        return self._stages

    # ---- static memory -------------------------------------------------------
    def rank_model_states(self, rank: int, stage_to_rank: tuple[int, ...]) -> dict[str, float]:
        """Model-state bytes of a pipeline rank (all its stages)."""
        return self.model_states([s for s in range(len(self.stage_costs)) if stage_to_rank[s] == rank], rank)

    def model_states(self, stages: list[int], rank: int) -> dict:
        """Model-state bytes of pipeline rank ``rank`` holding ``stages`` (ascending): params,
        grads, optimizer, and ``buffers`` ((kind, bytes) pairs: parsim.costs.memory's
        framework buffers, all zero under ``parallel.framework = "zero"``)."""
        par, tr = self.inputs.parallel, self.inputs.training
        n = sum(self.stage_costs[s].params for s in stages)
        ne = sum(self.stage_costs[s].expert_params for s in stages)
        unit = max((self.stage_costs[s].params / max(1, self.stage_costs[s].n_layers) for s in stages), default=0.0)
        per_mb = par.grad_degree > 1 and par.grad_per_microbatch
        ms = framework_states(par.framework, n - ne, par.shard_degree, par.zero, tr.optimizer, tr.precision,
                              per_mb, unit, par.grad_reduce_dtype)
        # experts: ZeRO shards them over the ranks that hold the same experts (dp*cp/ep)
        me = framework_states(par.framework, ne, len(self.groups.edp), par.zero, tr.optimizer, tr.precision, per_mb,
                              grad_dtype=par.grad_reduce_dtype)
        extra = self.weight_versions(rank) - 1  # PipeDream / 2BW stashed weight versions (16-bit copies)
        stash = extra * n * PRECISION_TABLE[tr.precision].weight_bytes
        buffers = {"grad_buckets": ms["grad_buckets"] + me["grad_buckets"]}
        if par.framework != "zero":
            comms = sum(getattr(par, a) > 1 for a in ("tp", "pp", "cp", "ep", "dp"))
            comms += par.zero >= 1 and par.shard_degree < par.grad_degree  # HSDP: a shard and a replica communicator
            buffers["comm_buffers"] = nccl_buffer_bytes(comms)
            if tr.precision == "fp8" and par.framework != "fsdp":
                # Transformer Engine's FP8 weight copies beside the 16-bit weight (and its
                # transpose where the GPU's FP8 GEMMs need one): memory_ops.fp8_weight_copy_bytes
                recipe = _compute.fp8_recipe(self.layer_inputs)
                copies = fp8_weight_copy_bytes(recipe, non_tn_fp8_gemms(self.inputs.hardware.device))
                buffers["fp8_weights"] = copies * sum(self._low_precision_params(s) for s in stages)
        out = {"params": ms["params"] + me["params"] + stash, "grads": ms["grads"] + me["grads"],
               "optimizer": ms["optimizer"] + me["optimizer"],
               "buffers": tuple((k, v) for k, v in buffers.items() if v)}
        return _offload_ops.model_states(self, stages, out) if self.inputs.offload.active else out

    def _low_precision_params(self, stage: int) -> float:
        """Parameters of the stage's blocks that run FP8 / NVFP4 (those its shape keeps in BF16,
        ``StageShape.bf16``, have no low-precision copies; the stage's parameters are spread
        evenly over its blocks)."""
        kept = self.shapes[self.shape_of[stage]].bf16
        sc = self.stage_costs[stage]
        return sc.params * (1.0 - sum(kept) / len(kept)) if kept else sc.params

    def weight_versions(self, rank: int) -> int:
        """Weight versions a pipeline rank holds (1 unless PipeDream / PipeDream-2BW)."""
        return schedule_weight_versions(self.traits, self.inputs.parallel.pp, self.inputs.n_microbatches, rank)

    # ---- what results get ----------------------------------------------------
    def tables(self, stage_to_rank: tuple[int, ...]) -> CostTables:
        """The cost model's figures as values (``stage_to_rank``: the schedule's placement)."""
        ops, stages = [], []
        for s, st in enumerate(self.stage_costs):
            for op in PIPELINE_OPS:
                ops.append(OpRow(s, op.value, st.parts[op], st.flops[op], st.bytes[op]))
            for name in ("SEND_F", "SEND_B"):
                ops.append(OpRow(s, name, Parts(), 0.0, AxisBytes(pp=st.p2p_bytes)))
            dp = self.dp_ops[s]
            for name, sent in (dp.sent.items() if dp is not None else ()):
                ops.append(OpRow(s, name, Parts(), 0.0, AxisBytes(dp=sent)))
            stages.append(StageRow(s, st.n_layers, st.moe_layers, st.params, st.expert_params, st.activation_bytes,
                                   st.weight_grad_stash_bytes, st.p2p_bytes))
        pp = self.inputs.parallel.pp
        static = tuple(RankStatic(r, **self.rank_model_states(r, stage_to_rank)) for r in range(pp))
        return CostTables(tuple(ops), tuple(stages), static, tuple(self.weight_versions(r) for r in range(pp)),
                          self._moe_figures())

    def _moe_figures(self) -> MoEFigures | None:
        if self.layer_inputs.moe is None:
            return None
        ph = moe_phase(self.layer_inputs)
        r = ph.routing
        b = all_to_all_bytes(r, self.inputs.model.expert_width,
                             PRECISION_TABLE[self.inputs.training.precision].activation_bytes)
        return MoEFigures(r.group_size, ph.expert_tp, r.tokens_per_rank, tuple(float(x) for x in r.received),
                          r.imbalance, r.capacity, r.dropped_fraction, *ph.kernels.grouped_gemm,
                          ph.all_to_all_s, float(b["send"]), float(max(b["recv"])), ph.kernels.by_piece(),
                          self.layer_inputs.moe.dispatcher, ph.dispatcher_sms)


def clear_caches() -> None:
    """Empty every cache of the cost model's pure parts (a cold start, for benchmarks and tests)."""
    for module in (_inputs, _compute, _layer, _stage, _dp):
        module.clear_caches()


def _at(values: tuple[float, ...] | None, s: int) -> float | None:
    return None if values is None else values[s]
