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

from dataclasses import dataclass, field, replace

from .collectives import collective_time, group_path
from .memory import (ActivationOptions, layer_activation_bytes, layer_recompute_transient_bytes,
                     logits_bytes, model_state_bytes, state_bytes_per_param, PRECISION_BYTES)
from .model import (ModelSpec, attention_core_flops, embedding_params, head_gemm, head_params,
                    is_moe_layer, layer_elementwise_bytes, layer_gemms, layer_params)
from .schedule.ir import Op
from .scenario import Scenario
from .sim.engine import OpCost

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
                                          sc.parallel.sequence_parallel, sc.dropout)
        par = sc.parallel
        self.pipeline_ranks = par.pipeline_ranks()
        self.tp_group = par.group_ranks("tp", 0)
        self.cp_group = par.group_ranks("cp", 0)
        self.dp_group = par.group_ranks("dp", 0)
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
        return st.stage == 0

    def _is_last(self, st: StageCost) -> bool:
        return st.stage == self.sc.parallel.n_stages - 1

    def _stage_params(self, st: StageCost) -> None:
        m, par = self.sc.model, self.sc.parallel
        total = 0.0
        for li in st.layers:
            expert = _expert_params(m, li)
            total += (layer_params(m, li) - expert) / par.tp + expert / (par.tp * par.ep)
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
        f_gemm = sum(dev.gemm_time(g.m, g.n, g.k, prec, g.count) for g in gemms)
        i_gemm = sum(dev.gemm_time(g.m, g.k, g.n, prec, g.count) for g in gemms)
        w_gemm = sum(dev.gemm_time(g.k, g.n, g.m, prec, g.count) for g in gemms)
        gemm_flops = sum(g.flops for g in gemms)
        # attention core: this rank's seq/cp queries against all keys of the sequence
        attn_flops = attention_core_flops(m, b, sc.training.seq_len, par.tp) / par.cp
        executed = attn_flops * (0.5 if sc.training.flash_attention else 1.0)  # causal blocks skipped
        f_attn = dev.attention_time(executed, prec)
        bwd_ratio = FLASH_BACKWARD_FLOP_RATIO if sc.training.flash_attention else 2.0
        i_attn = dev.attention_time(executed * bwd_ratio, prec)
        elem = dev.memory_time(layer_elementwise_bytes(m, tokens, par.tp, par.sequence_parallel))
        act_bytes = tokens * m.d_model * PRECISION_BYTES.get(prec, 2)
        tp_fwd = 2 * self._tp_allreduce(act_bytes)
        cp_fwd = self._cp_exchange(f_attn)
        fwd = Parts(compute=f_gemm + f_attn + elem, tp_comm=tp_fwd, cp_comm=cp_fwd)
        inp = Parts(compute=i_gemm + i_attn + 2 * elem, tp_comm=tp_fwd, cp_comm=cp_fwd)
        wgt = Parts(compute=w_gemm)
        return fwd, inp, wgt, gemm_flops + attn_flops, gemm_flops + 2 * attn_flops, gemm_flops

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
        recompute = sc.training.recompute
        if recompute == "full":
            i = i + Parts(recompute=layers_fwd.total)
            fi += layers_fwd_flops
        elif recompute == "selective":
            i = i + Parts(recompute=self._selective_recompute_time(len(st.layers)))
        st.parts = {Op.F: f, Op.I: i, Op.W: w, Op.B: i + w}
        st.flops = {Op.F: ff, Op.I: fi, Op.W: fw, Op.B: fi + fw}
        st.p2p_bytes = tokens * m.d_model * PRECISION_BYTES.get(prec, 2) / (par.tp if par.sequence_parallel else 1)

    def _selective_recompute_time(self, n_layers: int) -> float:
        sc, par = self.sc, self.sc.parallel
        b, _, _ = self._tokens()
        flops = attention_core_flops(sc.model, b, sc.training.seq_len, par.tp) / par.cp
        if sc.training.flash_attention:
            return 0.0  # FlashAttention already recomputes the scores inside its backward
        return n_layers * self.dev.attention_time(flops, self.prec)

    def _stage_memory(self, st: StageCost) -> None:
        sc, m, par = self.sc, self.sc.model, self.sc.parallel
        b, seq, tokens = self._tokens()
        act = sum(layer_activation_bytes(m, seq, b, par.tp, self.act_opts, li) for li in st.layers)
        if self._is_last(st):
            act += logits_bytes(m, seq, b, par.tp)
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
            st.parts = {Op.F: Parts(compute=mc.forward_s[s]), Op.I: Parts(compute=bi),
                        Op.W: Parts(compute=bw), Op.B: Parts(compute=b)}

    def _stage_ops(self, st: StageCost) -> None:
        sc, par = self.sc, self.sc.parallel
        transient = 0.0
        if sc.training.recompute == "full" and st.layers:
            b, seq, _ = self._tokens()
            transient = layer_recompute_transient_bytes(sc.model, seq, b, par.tp, self.act_opts, st.layers[0])
        act, wstash = st.activation_bytes, st.weight_grad_stash_bytes
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
            t = collective_time(hw, kind, grad_bytes, self.dp_group)
            if sc.overlap.grad_reduce and st.layers:
                # buckets of later layers reduce while earlier layers still run backward
                bwd = st.parts[Op.B].total
                n = len(st.layers)
                t = max(t - bwd * (n - 1) / n, t / n)
            ops[Op.REDUCE_GRAD] = OpCost(t, bytes=grad_bytes)
        shard = st.params / (par.dp if par.zero >= 1 else 1)
        step_bytes = shard * (2 * k + g + w)  # read+write optimizer state, read grads, write weights
        then = 0.0
        if par.zero in (1, 2) and par.dp > 1 and not sc.overlap.param_gather:
            then = collective_time(hw, "all_gather", st.params * w, self.dp_group)
        ops[Op.STEP] = OpCost(self.dev.memory_time(step_bytes), then_comm_s=then,
                              then_comm_bytes=st.params * w if then else 0.0)
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
        ms = model_state_bytes(n, par.dp, par.zero, tr.optimizer, tr.precision)
        return {"params": ms.params, "grads": ms.grads, "optimizer": ms.optimizer}


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
