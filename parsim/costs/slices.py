"""Token-slice costs (TeraPipe): what F and B of one slice of a sequence cost on a stage.

A slice of ``l`` tokens after ``c`` tokens of context costs what the cost model gives a
sequence of ``l`` tokens (every GEMM, memory-bound kernel, collective and the causal
attention inside the slice, at the efficiency ``l`` tokens get), plus the attention of its
``l`` queries over the ``c`` earlier keys and values (the rectangle the causal mask keeps):
attention grows with the slice's position. That extra is costed by the same kernels the
block uses: the fused attention kernel where the device has one, else the unfused batched
GEMMs and the score tensor's HBM traffic (:func:`context_attention_s`). TeraPipe's own
latency model has the same shape (a per-length F+B table plus a fitted context term).

:class:`SlicedCosts` is the engine's cost table for a schedule with ``n_slices > 1``: its
``unit_cost``/``unit_p2p_bytes`` answer per (stage, op, unit); everything else (gradient
reduction, optimizer step, links, results' tables) is the whole-sequence cost model's.
"""
from __future__ import annotations

from dataclasses import replace

from parsim.config.scenario import Scenario
from parsim.costs.compute import _heads, attention_precision, has_attention_kernel
from parsim.costs.inputs import LayerInputs
from parsim.costs.layer import FLASH_BACKWARD_FLOP_RATIO, scores_pass_bytes
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.schedule.ir import Op
from parsim.sim.engine import OpCost

SLICED_OPS = (Op.F, Op.B, Op.I, Op.W)


def _unfused_s(inp: LayerInputs, sq: int, sk: int) -> tuple[float, float]:
    """(forward, backward) seconds of eager attention of ``sq`` queries over ``sk`` keys: the
    batched GEMMs and the score tensor's HBM passes (once forward, twice backward)."""
    dev, o, b = inp.hardware.device, inp.options, inp.shard.microbatch_size
    heads, _, hd = _heads(inp)
    bh = b * heads
    prec = attention_precision(o.precision) if o.precision == "fp8" else o.precision
    fwd = dev.gemm_time(sq, sk, hd, prec, bh) + dev.gemm_time(sq, hd, sk, prec, bh)
    bwd = (dev.gemm_time(sk, hd, sq, prec, bh) + dev.gemm_time(sq, sk, hd, prec, bh)
           + dev.gemm_time(sq, hd, sk, prec, bh) + dev.gemm_time(sk, hd, sq, prec, bh))
    scores = dev.layer_memory_time(scores_pass_bytes(bh, sq, sk, o.precision, o.dropout))
    return fwd + scores, bwd + 2 * scores


def context_attention_s(inp: LayerInputs, context: int) -> tuple[float, float]:
    """(forward, backward-for-inputs) seconds one block adds when its slice of
    ``inp.shard.seq_len`` tokens attends to ``context`` earlier tokens as well."""
    if context <= 0:
        return 0.0, 0.0
    dev, o, sh = inp.hardware.device, inp.options, inp.shard
    l = sh.seq_len
    heads, kv, hd = _heads(inp)
    if o.flash_attention and has_attention_kernel(inp):
        prec = attention_precision(o.precision)
        return (dev.attention_kernel_time(sh.microbatch_size, l, context, heads, kv, hd, False, False, prec),
                dev.attention_kernel_time(sh.microbatch_size, l, context, heads, kv, hd, False, True, prec))
    if dev.kernels is not None:  # eager attention: the rectangle l x (c + l) less the l x l the slice already pays
        f1, b1 = _unfused_s(inp, l, l + context)
        f0, b0 = _unfused_s(inp, l, l)
        return f1 - f0, b1 - b0
    # a profile without kernel facts: FLOPs through the calibrated attention efficiency
    flops = 4.0 * sh.microbatch_size * heads * l * context * hd
    ratio = FLASH_BACKWARD_FLOP_RATIO if o.flash_attention else 2.0
    extra = 0.0 if o.flash_attention else dev.layer_memory_time(
        scores_pass_bytes(sh.microbatch_size * heads, l, context, o.precision, o.dropout))
    return (dev.attention_time(flops, o.precision, o.flash_attention) + extra,
            dev.attention_time(flops * ratio, o.precision, o.flash_attention, backward=True) + 2 * extra)


def with_seq_len(sc: Scenario, seq_len: int) -> Scenario:
    """The scenario with sequences of ``seq_len`` tokens (one slice's token-linear work)."""
    return replace(sc, training=replace(sc.training, seq_len=seq_len))


class SliceCostModel:
    """Per-stage F/I/W/B costs of a slice of any length at any position (cached per length)."""

    def __init__(self, sc: Scenario, base: ModelCosts | None = None):
        self.scenario = sc
        self.base = base or ModelCosts.from_scenario(sc)
        self._by_len: dict[int, ModelCosts] = {sc.training.seq_len: self.base}
        self._extra: dict[tuple[int, int], tuple[float, float]] = {}

    def costs_of(self, length: int) -> ModelCosts:
        mc = self._by_len.get(length)
        if mc is None:
            mc = self._by_len[length] = ModelCosts.from_scenario(with_seq_len(self.scenario, length))
        return mc

    def extra(self, length: int, context: int) -> tuple[float, float]:
        """(F, I) seconds per block of attending to ``context`` earlier tokens."""
        key = (length, context)
        e = self._extra.get(key)
        if e is None:
            e = self._extra[key] = context_attention_s(self.costs_of(length).layer_inputs, context)
        return e

    def op_cost(self, stage: int, op: Op, length: int, context: int) -> OpCost:
        """The engine's cost of ``op`` of a slice of ``length`` tokens after ``context`` on ``stage``."""
        mc = self.costs_of(length)
        c = mc.op_cost(stage, op)
        n = mc.stage_costs[stage].n_layers
        f, i = self.extra(length, context)
        recompute = mc.inputs.training.recompute == "full"
        add = {Op.F: f, Op.I: i + (f if recompute else 0.0), Op.B: i + (f if recompute else 0.0)}.get(op, 0.0)
        return replace(c, duration_s=c.duration_s + n * add) if add else c

    def stage_time(self, length: int, context: int) -> float:
        """F + B of one slice on the slowest stage (the DP's ``t(l, c)``)."""
        mc = self.costs_of(length)
        return max(self.op_cost(s, Op.F, length, context).duration_s
                   + self.op_cost(s, Op.B, length, context).duration_s
                   for s in _distinct_stages(mc))

    def p2p_bytes(self, stage: int, length: int) -> float:
        return self.costs_of(length).stage_costs[stage].p2p_bytes


def _distinct_stages(mc: ModelCosts) -> list[int]:
    """One stage per distinct stage shape (equal shapes cost the same)."""
    seen: dict[int, int] = {}
    for s, shape in enumerate(mc.shape_of):
        seen.setdefault(shape, s)
    return list(seen.values())


class SlicedCosts:
    """The engine's cost table for a token-sliced schedule (unit u = slice u % K of microbatch u // K)."""

    def __init__(self, model: SliceCostModel, lengths: tuple[int, ...]):
        self.model = model
        self.base = model.base
        self.lengths = tuple(lengths)
        """Slice lengths in tokens, in sequence order."""
        offsets, c = [], 0
        for length in self.lengths:
            offsets.append(c)
            c += length
        self.offsets = tuple(offsets)
        """Tokens before each slice."""
        self._unit: dict[tuple[int, Op, int], OpCost] = {}
        self.blocking_p2p = self.base.blocking_p2p
        self.dp_core_share = self.base.dp_core_share

    def op_cost(self, stage: int, op: Op) -> OpCost:
        return self.base.op_cost(stage, op)

    def unit_cost(self, stage: int, op: Op, unit: int) -> OpCost:
        """Cost of ``op`` of the slice that action index ``unit`` names."""
        i = unit % len(self.lengths)
        key = (stage, op, i)
        c = self._unit.get(key)
        if c is None:
            c = self._unit[key] = (self.model.op_cost(stage, op, self.lengths[i], self.offsets[i])
                                   if op in SLICED_OPS else self.base.op_cost(stage, op))
        return c

    def p2p_bytes(self, stage: int, op: Op) -> float:
        return self.base.p2p_bytes(stage, op)

    def unit_p2p_bytes(self, stage: int, op: Op, unit: int) -> float:
        return self.model.p2p_bytes(stage, self.lengths[unit % len(self.lengths)])

    def link_spec(self, src: int, dst: int) -> tuple[str, float, float]:
        return self.base.link_spec(src, dst)

    def send_post_s(self, nbytes: float) -> float:
        return self.base.send_post_s(nbytes)

    def tables(self, stage_to_rank: tuple[int, ...]):
        """The whole-sequence cost model's tables (per-op rows are per sequence, not per slice)."""
        return self.base.tables(stage_to_rank)

    def weight_versions(self, rank: int) -> int:
        return self.base.weight_versions(rank)


def slice_grid(seq_len: int) -> int:
    """The DP's grid of slice lengths for a scenario: at most 64 cells (32 tokens at 2048;
    ``ceil(seq_len / 64)``, the last cell the remainder where that does not divide). Each pair
    of grid points is one cost-model evaluation (its attention GEMMs through the kernel model)
    and the DP's work grows with the square of their count, so the grid bounds the cost of
    ``"auto"`` for every length (a divisor of ``seq_len`` was once required: 2049 = 3 x 683
    then gave 683 cells and a five-minute run); ``parsim.schedule.terapipe.optimal_slicing``
    itself takes any grid (TeraPipe's own is 8 tokens: benchmarks/terapipe_dp.py)."""
    return max(1, -(-seq_len // 64))


def slice_lengths(sc: Scenario, model: SliceCostModel | None = None):
    """The scenario's token slices: (lengths, the DP's Slicing or None for a fixed K)."""
    from parsim.schedule.terapipe import optimal_slicing, uniform_lengths
    k = sc.schedule.token_slices
    seq = sc.training.seq_len
    if k is None or k != "auto":
        if k is not None and k > seq:
            raise ConfigError(sc.file, "schedule.token_slices", f"{k} slices of a {seq}-token sequence: at most {seq}")
        return uniform_lengths(seq, 1 if k is None else k), None
    model = model or SliceCostModel(sc)
    sol = optimal_slicing(seq, sc.parallel.pp, model.stage_time, grid=slice_grid(seq),
                          microbatches=sc.n_microbatches)
    return sol.lengths, sol
