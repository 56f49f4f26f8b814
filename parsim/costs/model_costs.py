"""Action -> seconds and bytes: the simulator's only cost input.

For every stage, one microbatch, one GPU (its tensor- and context-parallel shard):

* F: the stage's transformer blocks (GEMMs through the device's shape-dependent GEMM
  model, the attention core through its FlashAttention efficiency, memory-bound ops
  through HBM bandwidth), the embedding on the first stage, the LM head and loss on
  the last; plus the TP collectives of each block (2 in forward, 2 in backward,
  Megatron's f/g operators) and the context-parallel K/V ring exchange.
* I (backward for inputs): dX GEMMs, attention backward, memory-bound backward.
* W (backward for weights): dW GEMMs. B = I + W (+ recomputation).
* Recompute: full -> the whole forward again inside B; selective -> the attention core.
* REDUCE_GRAD / UNSHARD / STEP: DP collectives and the optimizer update.

Each op's time is kept as parts (compute, recompute, tp_comm, cp_comm, ep_comm) so
results can say where step time goes. A ``[costs]`` table replaces the times.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import parsim.costs.moe as _moe
from parsim.cluster.collectives import (
    collective_time,
    group_path,
    parameter_server_time,
)
from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.scenario import Scenario
from parsim.costs.memory import (
    ActivationOptions,
    layer_activation_bytes,
    layer_recompute_transient_bytes,
    logits_bytes,
    model_state_bytes,
    state_bytes_per_param,
)
from parsim.model import (
    ModelSpec,
    attention_core_flops,
    embedding_params,
    head_gemm,
    head_params,
    is_moe_layer,
    layer_elementwise_bytes,
    layer_gemms,
    layer_params,
)
from parsim.schedule.ir import Op
from parsim.schedule.semantics import traits as schedule_traits
from parsim.schedule.semantics import weight_versions as schedule_weight_versions
from parsim.sim.engine import OpCost

PART_NAMES = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm")
# FlashAttention backward runs 5 matmuls for the forward's 2 (it recomputes the scores):
# 2.5x the forward's FLOPs, against the 2x that model-FLOP conventions count.
FLASH_BACKWARD_FLOP_RATIO = 2.5


@dataclass(frozen=True)
class Parts:
    """Seconds of one op, by what they are spent on."""

    compute: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm

    def __add__(self, o: "Parts") -> "Parts":
        return Parts(*(getattr(self, n) + getattr(o, n) for n in PART_NAMES))

    def scaled(self, k: float) -> "Parts":
        return Parts(*(getattr(self, n) * k for n in PART_NAMES))


@dataclass
class StageCost:
    """Costs of one stage (one model piece) for one microbatch."""

    stage: int
    layers: tuple[int, ...]
    """Global indices of the transformer blocks on this stage."""
    params: float
    """Parameters this GPU holds for the stage (after TP/EP sharding, before ZeRO)."""
    expert_params: float = 0.0
    """Part of ``params`` in routed experts (sharded over ep; ZeRO shards them over dp*cp/ep)."""
    parts: dict[Op, Parts] = field(default_factory=dict)
    flops: dict[Op, float] = field(default_factory=dict)
    """Hardware FLOPs executed per op (recompute included)."""
    ops: dict[Op, OpCost] = field(default_factory=dict)
    p2p_bytes: float = 0.0
    activation_bytes: float = 0.0
    """Stash of one microbatch from F until its backward."""
    weight_grad_stash_bytes: float = 0.0
    """Part of the stash still needed after I, until W (split backward)."""


class ModelCosts:
    """CostTable for the engine, built from a Scenario."""

    def __init__(self, sc: Scenario):
        self.sc = sc
        self.hw = sc.hardware
        self.dev = sc.hardware.device
        self.prec = sc.training.precision
        self.act_opts = ActivationOptions(sc.training.recompute, sc.training.flash_attention,
                                          sc.parallel.sequence_parallel, sc.dropout,
                                          bytes_per_element=PRECISION_TABLE[self.prec].activation_bytes)
        par = sc.parallel
        self.pipeline_ranks = par.pipeline_ranks()
        self.tp_group = par.group_ranks("tp", 0)
        self.cp_group = par.group_ranks("cp", 0)
        self.dp_group = par.group_ranks("dp", 0)
        # MoE: one layer's routing, expert GEMMs and all-to-all on the slowest EP rank (parsim.moe)
        self.moe = _moe.moe_phase(sc, self._tokens()[2]) if sc.model.n_moe_layers else None
        self.edp_group = _moe.expert_dp_ranks(par) if par.ep > 1 else self.dp_group
        self.traits = schedule_traits(sc.schedule.name)
        self.chain_len = par.n_stages // self.traits.n_chains  # stages per model copy
        self.stages = self._build_stages()

    # ---- CostTable protocol -------------------------------------------------
    def op_cost(self, stage: int, op: Op) -> OpCost:
        return self.stages[stage].ops.get(op) or OpCost(0.0)

    def p2p_bytes(self, stage: int, op: Op) -> float:
        return self.stages[stage].p2p_bytes

    def link_spec(self, src: int, dst: int) -> tuple[str, float, float]:
        if self.sc.costs is not None:
            return ("measured", 0.0, self.sc.costs.p2p_s)
        a, b = self.pipeline_ranks[src], self.pipeline_ranks[dst]
        link = self.hw.link_between(a, b)
        return (link.name, link.effective_bandwidth, link.latency_s)

    # ---- construction ------------------------------------------------------
    def _build_stages(self) -> list[StageCost]:
        sc = self.sc
        out, first = [], 0
        for s, n in enumerate(sc.layers_per_stage):
            if s % self.chain_len == 0:
                first = 0  # a two-copy schedule (DualPipe, Chimera): each chain holds the whole model
            st = StageCost(stage=s, layers=tuple(range(first, first + n)), params=0.0)
            first += n
            self._stage_params(st)
            self._stage_times(st)
            self._stage_memory(st)
            out.append(st)
        if sc.costs is not None:
            self._apply_measured(out)
        for st in out:
            self._stage_ops(st)
        return out

    def _tokens(self) -> tuple[int, int, int]:
        tr, par = self.sc.training, self.sc.parallel
        seq = tr.seq_len // par.cp
        return tr.microbatch_size, seq, tr.microbatch_size * seq

    def _is_first(self, st: StageCost) -> bool:
        return st.stage % self.chain_len == 0

    def _is_last(self, st: StageCost) -> bool:
        return st.stage % self.chain_len == self.chain_len - 1

    def _stage_params(self, st: StageCost) -> None:
        m, par = self.sc.model, self.sc.parallel
        total = 0.0
        for li in st.layers:
            expert = _expert_params(m, li)
            total += (layer_params(m, li) - expert) / par.tp + expert / (par.tp * par.ep)
            st.expert_params += expert / (par.tp * par.ep)
        if self._is_first(st):
            total += embedding_params(m) / par.tp
        if self._is_last(st):
            head = head_params(m)
            if m.tied_embeddings and par.n_stages > 1:
                head += m.vocab_size * m.d_model  # the last stage keeps its own copy of the tied matrix
            total += head / par.tp
        st.params = total

    def _tp_allreduce(self, nbytes: float) -> float:
        return collective_time(self.hw, "all_reduce", nbytes, self.tp_group)

    def _layer_times(self, li: int) -> tuple[Parts, Parts, Parts, float, float, float]:
        """(F, I, W parts; F, I, W flops) of one block for one microbatch."""
        sc, dev, prec = self.sc, self.dev, self.prec
        m, par = sc.model, sc.parallel
        b, seq, tokens = self._tokens()
        gemms = layer_gemms(m, tokens, par.tp, li)
        moe = self.moe if is_moe_layer(m, li) else None
        if moe is not None:  # routed experts are costed by parsim.moe (tokens actually routed)
            gemms = tuple(g for g in gemms if not g.name.startswith("expert_"))
        f_gemm = sum(dev.gemm_time(g.m, g.n, g.k, prec, g.count) for g in gemms)
        i_gemm = sum(dev.gemm_time(g.m, g.k, g.n, prec, g.count) for g in gemms)
        w_gemm = sum(dev.gemm_time(g.k, g.n, g.m, prec, g.count) for g in gemms)
        gemm_flops = sum(g.flops for g in gemms)
        # attention core: this rank's seq/cp queries against all keys of the sequence
        attn_flops = attention_core_flops(m, b, sc.training.seq_len, par.tp) / par.cp
        executed = attn_flops * (0.5 if sc.training.flash_attention else 1.0)  # causal blocks skipped
        fused = sc.training.flash_attention
        f_attn = dev.attention_time(executed, prec, fused)
        bwd_ratio = FLASH_BACKWARD_FLOP_RATIO if fused else 2.0
        i_attn = dev.attention_time(executed * bwd_ratio, prec, fused)
        f_attn = f_attn + self._scores_traffic(1.0) + self._head_layout_traffic()
        i_attn = i_attn + self._scores_traffic(2.0)
        clock = dev.sustained_fraction
        f_gemm, i_gemm, w_gemm = f_gemm / clock, i_gemm / clock, w_gemm / clock
        f_attn, i_attn = f_attn / clock + self._launch(1), i_attn / clock + self._launch(2)
        elem = dev.memory_time(layer_elementwise_bytes(m, tokens, par.tp, par.sequence_parallel,
                                                       PRECISION_TABLE[prec].activation_bytes))
        act_bytes = tokens * m.d_model * PRECISION_TABLE[prec].wire_bytes
        tp_fwd = self._tp_layer_comm(act_bytes, f_gemm)
        tp_bwd = self._tp_layer_comm(act_bytes, i_gemm)
        cp_fwd = self._cp_exchange(f_attn)
        fwd = Parts(compute=f_gemm + f_attn + elem, tp_comm=tp_fwd, cp_comm=cp_fwd)
        inp = Parts(compute=i_gemm + i_attn + 2 * elem, tp_comm=tp_bwd, cp_comm=cp_fwd)
        wgt = Parts(compute=w_gemm)
        if moe is not None:
            fwd, inp, wgt, gemm_flops = self._moe_parts(moe, fwd, inp, wgt, gemm_flops)
        return fwd, inp, wgt, gemm_flops + attn_flops, gemm_flops + 2 * attn_flops, gemm_flops

    def _moe_parts(self, ph, fwd: Parts, inp: Parts, wgt: Parts, flops: float):
        """Add the slowest EP rank's expert GEMMs and its dispatch + combine all-to-alls
        (2 per pass); with ``overlap.ep_comm`` only what exceeds the pass's compute is exposed."""
        clock = self.dev.sustained_fraction
        fwd = fwd + Parts(compute=ph.forward_s / clock)
        inp = inp + Parts(compute=ph.backward_input_s / clock)
        wgt = wgt + Parts(compute=ph.backward_weight_s / clock)
        a2a = 2 * ph.all_to_all_s
        ep_f = max(0.0, a2a - fwd.compute) if self.sc.overlap.ep_comm else a2a
        ep_i = max(0.0, a2a - inp.compute - wgt.compute) if self.sc.overlap.ep_comm else a2a
        return (fwd + Parts(ep_comm=ep_f), inp + Parts(ep_comm=ep_i), wgt, flops + ph.forward_flops)

    def _tp_layer_comm(self, act_bytes: float, gemm_s: float) -> float:
        """Exposed TP communication of one block in one pass (Megatron f/g operators).

        Without sequence parallelism: two all-reduces of the block's activation (after the
        attention projection and after FC2). With it: an all-gather before QKV/FC1 and a
        reduce-scatter after proj/FC2 -- the same ring bytes, norms sharded. With
        ``overlap.tp_comm`` the collectives are split into tp chunks pipelined with the
        neighbouring GEMMs: the first chunk stays exposed, and whatever exceeds the GEMMs.
        """
        par = self.sc.parallel
        if par.tp <= 1:
            return 0.0
        if par.sequence_parallel:
            comm = 2 * (collective_time(self.hw, "all_gather", act_bytes, self.tp_group)
                        + collective_time(self.hw, "reduce_scatter", act_bytes, self.tp_group))
        else:
            comm = 2 * self._tp_allreduce(act_bytes)
        if not self.sc.overlap.tp_comm:
            return comm
        return max(comm / par.tp, comm - gemm_s)

    def _scores_traffic(self, passes: float) -> float:
        """Without FlashAttention the s x s scores go through HBM: the fused scale-mask-
        softmax reads and writes them, dropout reads them and writes them with a 1-byte
        mask, the PV batched GEMM reads them (forward; the backward does it twice)."""
        sc, par = self.sc, self.sc.parallel
        if sc.training.flash_attention:
            return 0.0
        b, seq, _ = self._tokens()
        heads = max(1, sc.model.n_heads // par.tp)
        return passes * self.dev.memory_time(
            scores_pass_bytes(b * heads, seq, sc.training.seq_len, self.prec, sc.dropout))

    def _head_layout_traffic(self) -> float:
        """Without a fused attention kernel the forward moves Q, K and V into head-major
        (batch*heads, s, d_head) layout for the two batched GEMMs and the context back to
        token-major for the output projection: four transposing copies (read + write).
        Their backward is a view (the gradients flow back through the same strides): on the
        torch runtime B matched without them and F fell short by about these. Calibration's
        attention cases start from head-major tensors, so they are not in its efficiency."""
        sc, par = self.sc, self.sc.parallel
        if sc.training.flash_attention:
            return 0.0
        m = sc.model
        _, _, tokens = self._tokens()
        q = m.n_heads * m.head_dim_ / par.tp
        kv = m.n_kv_heads * m.head_dim_ / (par.tp if m.n_kv_heads >= par.tp else 1)
        return self.dev.memory_time(2.0 * tokens * (2 * q + 2 * kv) * PRECISION_TABLE[self.prec].activation_bytes)

    def _launch(self, passes: int) -> float:
        """Kernel launch gaps of one block per pass: ~12 kernels in a fused forward (2 norms,
        4 GEMMs, attention, bias-gelu, 2 bias-dropout-adds, 2 TP collectives), +3 unfused
        attention kernels without FlashAttention; the backward launches twice as many."""
        n = 12 + (0 if self.sc.training.flash_attention else 3)
        return passes * n * self.dev.kernel_launch_s

    def _cp_exchange(self, attn_time: float) -> float:
        """Exposed part of the ring K/V exchange: cp-1 steps, each overlapping one attention block."""
        par, m = self.sc.parallel, self.sc.model
        if par.cp <= 1:
            return 0.0
        b, seq, _ = self._tokens()
        kv_bytes = 2 * b * seq * m.n_kv_heads * m.head_dim_ * 2 / max(1, par.tp if m.n_kv_heads >= par.tp else 1)
        path = group_path(self.hw, self.cp_group)
        step = kv_bytes / path.bandwidth + path.latency_s
        per_block = attn_time / par.cp
        return (par.cp - 1) * max(0.0, step - per_block)

    def _stage_times(self, st: StageCost) -> None:
        sc, dev, prec = self.sc, self.dev, self.prec
        m, par = sc.model, sc.parallel
        b, seq, tokens = self._tokens()
        f = i = w = Parts()
        ff = fi = fw = 0.0
        for li in st.layers:
            lf, lin, lw, a, bi, c = self._layer_times(li)
            f, i, w, ff, fi, fw = f + lf, i + lin, w + lw, ff + a, fi + bi, fw + c
        layers_fwd, layers_fwd_flops = f, ff
        if self._is_first(st):  # embedding lookup (memory-bound) and its vocab-parallel all-reduce
            emb = dev.memory_time(2 * tokens * m.d_model * 2)
            tp = self._tp_allreduce(tokens * m.d_model * 2) if par.tp > 1 else 0.0
            f = f + Parts(compute=emb, tp_comm=tp)
            w = w + Parts(compute=dev.memory_time(tokens * m.d_model * 4))
        if self._is_last(st):
            g = head_gemm(m, tokens, par.tp)
            loss = dev.memory_time(3 * logits_bytes(m, seq, b, par.tp))  # softmax + loss + its gradient
            f = f + Parts(compute=dev.gemm_time(g.m, g.n, g.k, prec) + loss / 3)
            i = i + Parts(compute=dev.gemm_time(g.m, g.k, g.n, prec) + 2 * loss / 3)
            w = w + Parts(compute=dev.gemm_time(g.k, g.n, g.m, prec))
            ff, fi, fw = ff + g.flops, fi + g.flops, fw + g.flops
        recompute = "full" if self.traits.remat else sc.training.recompute
        if recompute == "full":
            i = i + Parts(recompute=layers_fwd.total)
            fi += layers_fwd_flops
        elif recompute == "selective":
            i = i + Parts(recompute=self._selective_recompute_time(len(st.layers)))
        if not sc.training.grad_accumulation_fusion:
            # unfused accumulation: grad += dW reads the gradient buffer and dW, writes the buffer
            grad_bytes = state_bytes_per_param(sc.training.optimizer, prec)[1]
            w = w + Parts(compute=dev.memory_time(3 * st.params * grad_bytes))
        st.parts = {Op.F: f, Op.I: i, Op.W: w, Op.B: i + w}
        st.flops = {Op.F: ff, Op.I: fi, Op.W: fw, Op.B: fi + fw}
        st.p2p_bytes = tokens * m.d_model * PRECISION_TABLE[prec].wire_bytes / (par.tp if par.sequence_parallel else 1)

    def _selective_recompute_time(self, n_layers: int) -> float:
        sc, par = self.sc, self.sc.parallel
        b, _, _ = self._tokens()
        flops = attention_core_flops(sc.model, b, sc.training.seq_len, par.tp) / par.cp
        if sc.training.flash_attention:
            return 0.0  # FlashAttention already recomputes the scores inside its backward
        return n_layers * self.dev.attention_time(flops, self.prec, fused=False)

    def _stage_memory(self, st: StageCost) -> None:
        m, par = self.sc.model, self.sc.parallel
        b, seq, tokens = self._tokens()
        rows = self.moe.routed_rows if self.moe is not None else None
        etp = self.moe.expert_tp if self.moe is not None else None
        act = sum(layer_activation_bytes(m, seq, b, par.tp, self.act_opts, li, routed_rows=rows, expert_tp=etp)
                  for li in st.layers)
        if self._is_last(st):
            # fp32 logits for the loss, plus the final norm's input and the LM head's input
            # (two d_model activations per token; replicated over tp unless sequence parallel)
            head_inputs = 2 * tokens * m.d_model * self.act_opts.bytes_per_element
            act += logits_bytes(m, seq, b, par.tp) + head_inputs / (par.tp if par.sequence_parallel else 1)
        st.activation_bytes = act
        # W needs each linear's input and output-gradient; the rest is freed by I
        st.weight_grad_stash_bytes = min(act, sum(_weight_grad_stash(m, tokens, par.tp, par.sequence_parallel, li)
                                                  for li in st.layers))

    def _apply_measured(self, stages: list[StageCost]) -> None:
        mc = self.sc.costs
        for st in stages:
            s = st.stage
            if mc.backward_s is not None:
                # a full backward only: keep I and W in the model's proportion for split schedules
                i_share = st.parts[Op.I].total / max(st.parts[Op.B].total, 1e-30)
                bi, bw = mc.backward_s[s] * i_share, mc.backward_s[s] * (1 - i_share)
                b = mc.backward_s[s]
            else:
                bi, bw = mc.backward_input_s[s], mc.backward_weight_s[s]
                b = bi + bw
            rec = Parts(recompute=mc.forward_s[s]) if self.traits.remat else Parts()  # GPipeRemat: B reruns F
            st.parts = {Op.F: Parts(compute=mc.forward_s[s]), Op.I: Parts(compute=bi) + rec,
                        Op.W: Parts(compute=bw), Op.B: Parts(compute=b) + rec}

    def _stage_ops(self, st: StageCost) -> None:
        sc, par = self.sc, self.sc.parallel
        transient = 0.0
        if sc.training.recompute == "full" and st.layers:
            b, seq, _ = self._tokens()
            transient = layer_recompute_transient_bytes(sc.model, seq, b, par.tp, self.act_opts, st.layers[0])
        act, wstash = st.activation_bytes, st.weight_grad_stash_bytes
        if self.traits.remat and sc.training.recompute != "full":
            # GPipe re-materialization: F keeps the stage's input only; B holds the
            # recomputed activations of the whole stage while it runs
            transient, act = act, min(act, st.p2p_bytes * (par.tp if par.sequence_parallel else 1))
            wstash = min(wstash, act)
        st.ops = {
            Op.F: OpCost(st.parts[Op.F].total, stash_bytes=act),
            Op.B: OpCost(st.parts[Op.B].total, free_bytes=act, transient_bytes=transient),
            Op.I: OpCost(st.parts[Op.I].total, free_bytes=act - wstash, transient_bytes=transient),
            Op.W: OpCost(st.parts[Op.W].total, free_bytes=wstash),
        }
        if sc.costs is not None:
            return  # measured costs: pipeline only, no DP/optimizer time
        st.ops.update(self._dp_ops(st))

    def _dp_ops(self, st: StageCost) -> dict[Op, OpCost]:
        sc, par, hw = self.sc, self.sc.parallel, self.hw
        w, g, k = state_bytes_per_param(sc.training.optimizer, self.prec)
        grad_bytes = st.params * g
        ops: dict[Op, OpCost] = {}
        if par.dp > 1:
            kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
            if par.dp_comm == "parameter_server":  # push gradients to one rank, pull the update back
                t = parameter_server_time(hw, (st.params - st.expert_params) * g, self.dp_group)
            else:
                t = collective_time(hw, kind, (st.params - st.expert_params) * g, self.dp_group)
            if st.expert_params:  # expert gradients reduce over the expert-data-parallel ranks
                t += collective_time(hw, kind, st.expert_params * g, self.edp_group)
            if sc.overlap.grad_reduce and st.layers:
                # buckets of later layers reduce while earlier layers still run backward
                bwd = st.parts[Op.B].total
                n = len(st.layers)
                t = max(t - bwd * (n - 1) / n, t / n)
            ops[Op.REDUCE_GRAD] = OpCost(t, bytes=grad_bytes)
        shard = (st.params - st.expert_params) / (par.dp if par.zero >= 1 else 1)
        shard += st.expert_params / (len(self.edp_group) if par.zero >= 1 else 1)
        step_bytes = shard * (2 * k + g + w)  # read+write optimizer state, read grads, write weights
        then, then_bytes = 0.0, 0.0
        if par.zero in (1, 2) and par.dp > 1:
            # ZeRO-1/2: all-gather of the updated parameter shards (reduce-scatter + all-gather
            # = the all-reduce's bytes); overlapped with the next step's forward when asked
            then_bytes = st.params * w
            if not sc.overlap.param_gather:
                then = collective_time(hw, "all_gather", then_bytes, self.dp_group)
        ops[Op.STEP] = OpCost(self.dev.memory_time(step_bytes), then_comm_s=then,
                              then_comm_bytes=then_bytes)
        if par.zero == 3 and par.dp > 1:
            gather = collective_time(hw, "all_gather", st.params * w, self.dp_group)
            window = 2 * st.params * w / max(1, len(st.layers))  # two blocks gathered at a time
            ops[Op.UNSHARD] = OpCost(gather, bytes=st.params * w, stash_bytes=window, mem_kind="other")
            ops[Op.RESHARD] = OpCost(0.0, free_bytes=window, mem_kind="other")
        return ops

    # ---- static memory -----------------------------------------------------
    def rank_model_states(self, rank: int, stage_to_rank: tuple[int, ...]) -> dict[str, float]:
        """Model-state bytes of a pipeline rank (all its stages)."""
        par, tr = self.sc.parallel, self.sc.training
        n = sum(st.params for st in self.stages if stage_to_rank[st.stage] == rank)
        ne = sum(st.expert_params for st in self.stages if stage_to_rank[st.stage] == rank)
        ms = model_state_bytes(n - ne, par.dp, par.zero, tr.optimizer, tr.precision)
        # experts: ZeRO shards them over the ranks that hold the same experts (dp*cp/ep)
        me = model_state_bytes(ne, len(self.edp_group), par.zero, tr.optimizer, tr.precision)
        extra = self.weight_versions(rank) - 1  # PipeDream / 2BW stashed weight versions (16-bit copies)
        stash = extra * n * PRECISION_TABLE[tr.precision].weight_bytes
        return {"params": ms.params + me.params + stash, "grads": ms.grads + me.grads,
                "optimizer": ms.optimizer + me.optimizer}

    def weight_versions(self, rank: int) -> int:
        """Weight versions a pipeline rank holds (1 unless PipeDream / PipeDream-2BW)."""
        return schedule_weight_versions(self.traits, self.sc.parallel.pp, self.sc.n_microbatches, rank)

    def overlap_cost(self, f_stage: int, b_stage: int, b_op: Op) -> float:
        """Duration of an OVERLAP_F_B pair: ``[costs] overlap_f_b_s`` of the F's stage when
        given; otherwise F + B minus the communication each hides under the other's compute
        (TP/CP/EP collectives inside the ops; with measured costs and no key: F + B)."""
        mc = self.sc.costs
        if mc is not None and mc.overlap_f_b_s is not None:
            return mc.overlap_f_b_s[f_stage]
        f, b = self.stages[f_stage].parts[Op.F], self.stages[b_stage].parts[b_op]
        comm = lambda p: p.tp_comm + p.cp_comm + p.ep_comm  # noqa: E731
        hidden = min(comm(f), b.compute + b.recompute) + min(comm(b), f.compute + f.recompute)
        return f.total + b.total - hidden


def scores_pass_bytes(batch_heads: int, s_q: int, s_k: int, precision: str, dropout: bool = False) -> float:
    """Bytes one forward pass of unfused attention moves through memory for its s x s
    scores (``ModelCosts._scores_traffic``; the backward moves twice as many): the fused
    scale-mask-softmax reads and writes them, dropout reads them and writes them with a
    1-byte mask, the PV batched GEMM reads them. Calibration takes the same off."""
    per_pass = 2 + (2.5 if dropout else 0.0) + 1
    return per_pass * batch_heads * s_q * s_k * PRECISION_TABLE[precision].activation_bytes


def _expert_params(m: ModelSpec, li: int) -> float:
    if not m.is_moe or not is_moe_layer(m, li):
        return 0.0
    f = m.d_ff_expert or m.d_ff
    mats = 3 if m.ffn == "swiglu" else 2
    return m.n_experts * mats * m.d_model * f


def _weight_grad_stash(m: ModelSpec, tokens: int, tp: int, sp: bool, li: int) -> float:
    """Bytes W still needs after I: each linear's input and output gradient (zb-formulas: 32sbh for GPT)."""
    h, q = m.d_model, m.n_heads * m.head_dim_
    kv = m.n_kv_heads * m.head_dim_
    f = m.d_ff
    rep = tp if sp else 1
    inputs = 2 * h / rep + 2 * q / tp + 2 * h / rep + 2 * f / tp
    fc1_out = (4 * f if m.ffn == "swiglu" else 2 * f) / tp
    grads = 2 * (q + 2 * kv) / tp + 2 * h / rep + fc1_out + 2 * h / rep
    return tokens * (inputs + grads)
