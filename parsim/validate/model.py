"""Real torch models built from a :class:`parsim.model.ModelSpec`, split into pipeline stages.

The structure follows what ``parsim.model`` / ``parsim.memory`` count, tensor by tensor:
pre-norm blocks (LayerNorm or RMSNorm), one fused QKV projection, causal attention
(explicit scores + softmax when ``flash_attention`` is off, ``scaled_dot_product_attention``
otherwise), an output projection, then a GeLU MLP (fc1, fc2) or SwiGLU (gate, up, down).
The first stage holds the token (and learned position) embedding, the last the final
norm, the LM head and the cross-entropy loss. Dropout is not modelled (validation runs
are deterministic).

Where real frameworks run fused kernels, so does this model, and it keeps for the backward
what those kernels keep (what ``parsim.memory`` counts): RMSNorm saves its input and the
per-row 1/rms (:class:`RMSNorm`, like Apex/TE's fused norm), SwiGLU saves the gate and up
projections only and recomputes SiLU in the backward (:func:`swiglu`, like Megatron's
fused bias-SwiGLU), and grouped-query attention never materialises K/V repeated per query
head (SDPA's ``enable_gqa``; broadcasting in the explicit path).

Every linear layer is a ``SplitLinear`` (``parsim.validate.tensor_parallel``): its
backward can defer the weight gradient to W (zero-bubble I/W split). Norm scales and the
embedding table get their (memory-bound) gradients during I.

Parallelism inside a stage (``parsim.validate.shard`` cuts the full model's weights, so
every rank starts from the unsharded model's values): tensor parallelism (column-parallel
QKV / FC1 / gate / up by heads or hidden units, row-parallel projections with their bias
added after the reduction, Megatron's f/g operators or, with sequence parallelism, the
all-gather / reduce-scatter pair; a vocabulary-parallel embedding and LM head with the
parallel cross-entropy), context parallelism (ring attention, ``parsim.validate.ring``)
and expert parallelism (``parsim.validate.experts``). ``Stage.par`` (a :class:`Par`)
holds the groups; without it the stage is the single-process model.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from parsim.model import ModelSpec, is_moe_layer
from parsim.validate.comm import ReduceFromGroup, ScatterSeq
from parsim.validate.experts import MoE
from parsim.validate.ring import RingAttention
from parsim.validate.tensor_parallel import (
    NO_PAR,
    SplitLinear,
    _LinearFn,
    parallel_cross_entropy,
)


class _RMSNormFn(torch.autograd.Function):
    """Fused RMSNorm: saves x and 1/rms (one float per row), as fused kernels do."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, weight)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, dy):
        x, rstd, weight = ctx.saved_tensors
        xhat = x * rstd
        dxhat = dy * weight
        dx = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
        dw = (dy * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx, dw, None


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d, dtype=dtype))

    def forward(self, x):
        return _RMSNormFn.apply(x, self.weight, self.eps)


class _SwiGLUFn(torch.autograd.Function):
    """silu(gate) * up saving gate and up only; SiLU is recomputed in the backward."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        sig = torch.sigmoid(gate)
        silu = gate * sig
        return dy * up * (sig * (1 + gate * (1 - sig))), dy * silu


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _SwiGLUFn.apply(gate, up)


def _norm(spec: ModelSpec, dtype) -> nn.Module:
    if spec.norm == "layernorm":
        return nn.LayerNorm(spec.d_model, dtype=dtype)
    return RMSNorm(spec.d_model, dtype=dtype)


class Block(nn.Module):
    """One pre-norm transformer block (dense FFN, or a mixture of experts)."""

    def __init__(self, spec: ModelSpec, flash: bool, dtype, moe: bool = False):
        super().__init__()
        d, hd = spec.d_model, spec.head_dim_
        self.nh, self.nkv, self.hd, self.flash = spec.n_heads, spec.n_kv_heads, hd, flash
        self.par = NO_PAR
        self.recompute_modules: tuple[str, ...] = ()  # Megatron's selective recompute (set_recompute_modules)
        self.kv = None  # a token slice's K/V context (TeraPipe: parsim.validate.slices.SliceKV), else None
        bias = spec.bias
        self.norm1, self.norm2 = _norm(spec, dtype), _norm(spec, dtype)
        self.qkv = SplitLinear(d, (self.nh + 2 * self.nkv) * hd, bias=bias or spec.qkv_bias, dtype=dtype)
        self.proj = SplitLinear(self.nh * hd, d, bias=bias, dtype=dtype)
        self.swiglu = spec.ffn == "swiglu"
        self.moe = MoE(spec, dtype, SplitLinear, swiglu) if moe else None
        if moe:
            pass  # the routed (and shared) experts replace the dense FFN
        elif self.swiglu:
            self.gate = SplitLinear(d, spec.d_ff, bias=bias, dtype=dtype)
            self.up = SplitLinear(d, spec.d_ff, bias=bias, dtype=dtype)
            self.down = SplitLinear(spec.d_ff, d, bias=bias, dtype=dtype)
        else:
            self.fc1 = SplitLinear(d, spec.d_ff, bias=bias, dtype=dtype)
            self.fc2 = SplitLinear(spec.d_ff, d, bias=bias, dtype=dtype)

    def _row(self, layer: SplitLinear, x: torch.Tensor) -> torch.Tensor:
        """A row-parallel layer: partial products reduced over tp, then the (whole) bias."""
        if self.par.tp is None:
            return layer(x)
        y = self.par.leave(_LinearFn.apply(x, layer.weight, None))
        return y if layer.bias is None else y + layer.bias

    def attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        (qkv,) = self.par.column(x, self.qkv)
        b, s, _ = qkv.shape
        nkv = self.nkv * (qkv.shape[-1] // self.hd) // (self.nh + 2 * self.nkv)  # local heads (tp shards them)
        nh = qkv.shape[-1] // self.hd - 2 * nkv
        q, k, v = qkv.split([nh * self.hd, nkv * self.hd, nkv * self.hd], dim=-1)
        q = q.view(b, s, nh, self.hd).transpose(1, 2)
        k = k.view(b, s, nkv, self.hd).transpose(1, 2)
        v = v.view(b, s, nkv, self.hd).transpose(1, 2)
        first = 0
        if self.kv is not None:  # a token slice: attend to the earlier slices' keys and values too
            k, v, first = self.kv.extend(k, v)
        if "core_attn" in self.recompute_modules:  # Megatron's checkpointed core: kept q, k, v; rerun
            out = checkpoint(self.core, q, k, v, mask, first, use_reentrant=True)
        else:
            out = self.core(q, k, v, mask, first)
        return self._row(self.proj, out.transpose(1, 2).reshape(b, s, nh * self.hd))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, first: int) -> torch.Tensor:
        """The attention core: (b, heads, s, d) queries on the keys and values (``first``: the
        position of the first query in the keys, for token slices)."""
        b, nh, s, _ = q.shape
        nkv, sk = k.shape[1], k.shape[2]
        if self.par.cp is not None:
            return RingAttention.apply(q, k, v, self.par.cp)
        if self.flash and self.kv is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[first:first + s, :sk], enable_gqa=nkv != nh)
        if self.flash:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=nkv != nh)
        # explicit scores as Megatron's unfused core runs them: Q, K and V copied once into
        # head-major (batch * kv heads, rows, d) layout -- three of the four layout copies the cost
        # model counts (costs.layer.head_layout_traffic; the caller's context reshape is the
        # fourth) -- then (q/sqrt(d)) k^T + additive causal mask -> softmax -> @ v as batched
        # GEMMs on them (k^T a transposed view the GEMM reads as it is, no copy). With GQA the g
        # query heads of one group stack their rows against their K/V head (no repeated K/V).
        g = nh // nkv
        qh = q.reshape(b * nkv, g * s, self.hd)
        kh, vh = k.reshape(b * nkv, sk, self.hd), v.reshape(b * nkv, sk, self.hd)
        rows = mask[first:first + s, :sk]
        scores = (qh * (1.0 / math.sqrt(self.hd))) @ kh.transpose(1, 2) + (rows.repeat(g, 1) if g > 1 else rows)
        probs = torch.softmax(scores, dim=-1)
        return (probs @ vh).view(b, nh, s, self.hd)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe(h)
        if self.swiglu:
            gate, up = self.par.column(h, self.gate, self.up)
            return self._row(self.down, swiglu(gate, up))
        (h,) = self.par.column(h, self.fc1)
        return self._row(self.fc2, F.gelu(h))

    def _ffn(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm2(x))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)
        if self.moe is None and "mlp" in self.recompute_modules:  # keeps x (the norm's input) only
            return x + checkpoint(self._ffn, x, use_reentrant=True)
        if self.moe is not None and "moe" in self.recompute_modules:  # keeps the norm's output
            h = self.norm2(x)
            return x + checkpoint(self.mlp, h, use_reentrant=True)
        return x + self._ffn(x)


class Stage(nn.Module):
    """One pipeline stage: [embedding] + blocks + [final norm, LM head, loss]."""

    def __init__(self, spec: ModelSpec, blocks: list[Block], first: bool, last: bool, seq_len: int,
                 dtype, embed=None, head=None):
        super().__init__()
        self.first, self.last = first, last
        self.blocks = nn.ModuleList(blocks)
        self.embed, self.head = embed, head
        mask = torch.full((seq_len, seq_len), float("-inf"), dtype=dtype).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    recompute_units: tuple[tuple[int, int], ...] = ()
    """Block ranges [start, end) run under an activation checkpoint (:func:`set_recompute`)."""

    def _run_blocks(self, start: int, end: int, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks[start:end]:
            x = blk(x, self.mask)
        return x

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.first:
            x = self.embed(x)
        units = dict(self.recompute_units)
        i = 0
        while i < len(self.blocks):
            end = units.get(i)
            if end is None:
                x = self.blocks[i](x, self.mask)
                i += 1
            else:  # keeps the unit's input only; the backward reruns the unit's forward first
                x = checkpoint(self._run_blocks, i, end, x, use_reentrant=True)
                i = end
        if self.last:
            return self.head(x, targets)
        return x


def set_recompute(stage: Stage, method: str, k: int) -> Stage:
    """Checkpoint ``stage``'s blocks as Megatron's full recomputation does: ``uniform`` in units of
    ``k`` blocks (each unit keeps its input and reruns its forward ahead of its backward),
    ``block`` the first ``k`` blocks one by one (the rest keep everything). Reentrant checkpoints:
    the kept input is a saved tensor of the checkpoint's autograd node, which the memory probe
    (``saved_tensors_hooks``) sees as it sees every other stash."""
    n = len(stage.blocks)
    if method == "block":
        stage.recompute_units = tuple((i, i + 1) for i in range(min(k, n)))
    else:
        stage.recompute_units = tuple((i, min(i + k, n)) for i in range(0, n, k))
    return stage


def set_recompute_modules(stage: Stage, modules: tuple[str, ...]) -> Stage:
    """Megatron's selective recomputation in every block of ``stage``: of ``modules``, the ones
    the blocks build (``parsim.validate.scale.RUNTIME_RECOMPUTE_MODULES``: core_attn, mlp, moe)
    run under normal checkpoints, the module's input kept and its forward rerun."""
    for blk in stage.blocks:
        blk.recompute_modules = tuple(modules)
    return stage


class Embedding(nn.Module):
    """Token (+ learned position) embedding; vocabulary-parallel over tp when sharded
    (``vocab_start``: the first row this rank holds), positions ``positions`` (the tokens'
    places in the sequence: zig-zag under context parallelism, a slice under sequence parallelism)."""

    def __init__(self, spec: ModelSpec, dtype):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab_size, spec.d_model, dtype=dtype)
        self.pos = nn.Embedding(spec.max_seq_len, spec.d_model, dtype=dtype) if spec.position == "learned" else None
        self.par, self.vocab_start, self.positions = NO_PAR, 0, None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        par = self.par
        if par.tp is None:
            x = self.tok(tokens)
        else:
            local = tokens - self.vocab_start
            outside = (local < 0) | (local >= self.tok.weight.shape[0])
            x = F.embedding(local.masked_fill(outside, 0), self.tok.weight).masked_fill(outside[..., None], 0.0)
            x = ScatterSeq.apply(x, par.tp) if par.sp else ReduceFromGroup.apply(x, par.tp)
        if self.pos is not None:
            x = x + (self.pos.weight[: x.shape[1]] if self.positions is None else self.pos.weight[self.positions])
        return x


class Head(nn.Module):
    """Final norm, LM head and cross-entropy (vocabulary-parallel: Megatron's parallel cross-entropy)."""

    def __init__(self, spec: ModelSpec, dtype):
        super().__init__()
        self.norm = _norm(spec, dtype)
        self.out = SplitLinear(spec.d_model, spec.vocab_size, bias=False, dtype=dtype)
        self.par, self.vocab_start = NO_PAR, 0

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        (logits,) = self.par.column(self.norm(x), self.out)
        # fp32 logits for the loss (Megatron's upcast); no-op when training in fp32
        if self.par.tp is None:
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        return parallel_cross_entropy(logits.float().flatten(0, 1), targets.flatten(), self.vocab_start, self.par.tp)


def set_token_dropping(stage: Stage, drop: bool) -> Stage:
    """The scenario's ``[moe] drop_tokens`` on every MoE block of ``stage`` (false: dropless)."""
    for blk in stage.blocks:
        if blk.moe is not None:
            blk.moe.drop = drop
    return stage


def build_stages(spec: ModelSpec, layers_per_stage: tuple[int, ...], seq_len: int, flash: bool,
                 seed: int = 0, dtype=torch.float32, chain_len: int | None = None) -> list[Stage]:
    """The whole model, deterministically initialised from ``seed``, cut into stages.

    Every rank builds all stages (small models) and keeps its own, so all ranks and the
    single-process reference hold identical weights. ``chain_len``: stages per model copy
    (two-copy schedules: stage s holds piece s % chain_len of its own copy, both copies
    starting from the same weights).
    """
    import copy

    chain_len = chain_len or len(layers_per_stage)
    torch.manual_seed(seed)
    embed = Embedding(spec, dtype)
    blocks = [Block(spec, flash, dtype, is_moe_layer(spec, i)) for i in range(spec.n_layers)]
    head = Head(spec, dtype)
    with torch.no_grad():  # GPT-2 style small init keeps the logits tame
        for p in [*embed.parameters(), *(p for b in blocks for p in b.parameters()), *head.parameters()]:
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    if spec.tied_embeddings:  # one matrix: the LM head multiplies by the embedding table
        head.out.weight = embed.tok.weight
        embed.tok.weight.tied = True
    stages, first, n = [], 0, chain_len
    for s, k in enumerate(layers_per_stage):
        pos = s % n
        if pos == 0:
            first = 0
            if s:  # the next model copy: the same initial weights, its own tensors (a tie kept)
                embed, blocks, head = copy.deepcopy((embed, blocks, head))
        stages.append(Stage(spec, blocks[first:first + k], pos == 0, pos == n - 1, seq_len, dtype,
                            embed if pos == 0 else None, head if pos == n - 1 else None))
        first += k
    return stages


def microbatch_data(spec: ModelSpec, n: int, batch: int, seq_len: int, seed: int) -> list[tuple]:
    """``n`` (tokens, targets) microbatches, deterministic in ``seed``."""
    g = torch.Generator().manual_seed(1000 + seed)
    out = []
    for _ in range(n):
        t = torch.randint(0, spec.vocab_size, (batch, seq_len + 1), generator=g)
        out.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))
    return out
