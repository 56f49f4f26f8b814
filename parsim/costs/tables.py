"""The small tables the cost model hands to results: per (stage, op) seconds by part, FLOPs
and bytes by axis; per stage its size and memory; per pipeline rank its static memory and
weight versions; the MoE figures. Values only -- never the cost model itself
(built by :meth:`parsim.costs.ModelCosts.tables`)."""
from __future__ import annotations

from dataclasses import dataclass

from parsim.costs.parts import AxisBytes, Parts


@dataclass(frozen=True)
class OpRow:
    """One op of one stage, for one execution (one microbatch for F/B/I/W)."""

    stage: int
    """Stage index (model piece)."""
    op: str
    """The engine's span name: F, I, W, B, STEP, REDUCE_GRAD, UNSHARD, PARAM_GATHER, SEND_F, SEND_B."""
    parts: Parts
    """Seconds by part (compute, recompute, tp/cp/ep communication); zero for communication-stream ops."""
    flops: float
    """Hardware FLOPs executed (recompute included)."""
    sent: AxisBytes
    """Bytes one GPU sends during the op, by axis."""


@dataclass(frozen=True)
class StageRow:
    """One stage's size and activation memory."""

    stage: int
    """Stage index."""
    layers: int
    """Transformer blocks on the stage."""
    moe_layers: int
    """Of which MoE blocks."""
    params: float
    """Parameters one GPU holds for the stage (after TP/EP sharding, before ZeRO)."""
    expert_params: float
    """Of which routed-expert parameters."""
    activation_bytes: float
    """Activation stash of one microbatch from F until its backward."""
    weight_grad_stash_bytes: float
    """Part of the stash still needed after I, until W."""
    p2p_bytes: float
    """One activation (or gradient) sent to the neighbouring stage."""


@dataclass(frozen=True)
class RankStatic:
    """Model-state bytes of one pipeline rank (all its stages), allocated for the whole step."""

    rank: int
    """Pipeline rank."""
    params: float
    """Weights (ZeRO-3: the shard), plus stashed weight versions (PipeDream, 2BW)."""
    grads: float
    """Gradients (ZeRO-2/3: the shard)."""
    optimizer: float
    """Optimizer state incl. fp32 master weights (ZeRO-1/2/3: the shard)."""
    buffers: tuple[tuple[str, float], ...] = ()
    """The framework's other step-long buffers, (kind, bytes): grad_buckets (gradients in
    flight to their reduction), comm_buffers (NCCL), fp8_weights (FP8 weight copies)."""


@dataclass(frozen=True)
class MoEFigures:
    """One MoE layer, one microbatch, on the EP group of rank 0 (``parsim.costs.moe``)."""

    ep_group_size: int
    """Ranks of the EP group (ep x tp / expert_tp)."""
    expert_tp: int
    """Tensor-parallel degree of the routed experts."""
    tokens_per_rank: float
    """Tokens each rank routes."""
    routed_tokens_per_rank: tuple[float, ...]
    """Assignments each EP rank's experts compute."""
    imbalance: float
    """Busiest rank's assignments over the mean."""
    capacity_tokens_per_expert: float | None
    """Assignments one expert can take (None: dropless)."""
    dropped_fraction: float
    """Share of the routed assignments dropped at capacity."""
    forward_s: float
    """Expert GEMMs of one forward on the slowest rank."""
    backward_input_s: float
    """Expert GEMMs of one backward-for-inputs on the slowest rank."""
    backward_weight_s: float
    """Expert GEMMs of one backward-for-weights on the slowest rank."""
    all_to_all_s: float
    """One dispatch (or combine) all-to-all as the slowest rank sees it."""
    all_to_all_send_bytes: float
    """Bytes one rank sends in one dispatch (or combine)."""
    all_to_all_recv_max_bytes: float
    """Bytes the busiest rank receives in one dispatch (or combine)."""
    kernels_s: tuple[tuple[str, float], ...] = ()
    """One MoE layer, one microbatch, forward + backward on the slowest rank, seconds by piece
    (router, permute, grouped_gemm, activation, quantize: ``parsim.costs.moe.MoEKernels``)."""
    dispatcher: str = "alltoall"
    """How tokens reach their experts (``[moe] dispatcher``)."""
    dispatcher_sms: int = 0
    """SMs the dispatch/combine kernels hold (what hidden all-to-alls take from the compute)."""


@dataclass(frozen=True)
class CostTables:
    """Everything results need from the cost model, as values."""

    ops: tuple[OpRow, ...]
    """Per (stage, op): seconds by part, FLOPs, bytes by axis."""
    stages: tuple[StageRow, ...]
    """Per stage: size and activation memory."""
    static_memory: tuple[RankStatic, ...]
    """Per pipeline rank: model-state bytes."""
    weight_versions: tuple[int, ...]
    """Per pipeline rank: weight versions held (1 unless PipeDream / PipeDream-2BW)."""
    moe: MoEFigures | None = None
    """MoE figures (None for dense models)."""

    def op(self, stage: int, op: str) -> OpRow | None:
        """The row of ``op`` on ``stage`` (None when the stage does not run it)."""
        for r in self.ops:
            if r.stage == stage and r.op == op:
                return r
        return None
