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

Every linear layer is a :class:`SplitLinear`: its backward can *defer* the weight
gradient (zero-bubble I/W split). While a :class:`WeightGradStore` is active, backward
computes input gradients only and records ``(layer, input, grad_output)``; ``W`` later
runs the deferred ``dW = grad_out^T @ input`` GEMMs. Norm scales and the embedding
table get their (memory-bound) gradients during I.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from parsim.model import ModelSpec

_STORE: list | None = None  # the active deferral list (backward is synchronous: a global is safe)


class WeightGradStore:
    """Context manager: weight gradients of SplitLinear layers are deferred into ``self.items``."""

    def __init__(self):
        self.items: list[tuple] = []

    def __enter__(self):
        global _STORE
        _STORE = self.items
        return self

    def __exit__(self, *exc):
        global _STORE
        _STORE = None
        return False

    def flush(self) -> None:
        """Run the deferred weight-gradient GEMMs (the W action) and free the stash."""
        for weight, bias, x, g in self.items:
            x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
            dw = g2.t() @ x2
            weight.grad = dw if weight.grad is None else weight.grad.add_(dw)
            if bias is not None:
                db = g2.sum(0)
                bias.grad = db if bias.grad is None else bias.grad.add_(db)
        self.items = []


class _LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        ctx.bias = bias
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        dx = g @ weight
        if _STORE is not None:
            _STORE.append((weight, ctx.bias, x, g))
            return dx, None, None
        x2, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
        dw = g2.t() @ x2
        db = g2.sum(0) if ctx.has_bias else None
        return dx, dw, db


class SplitLinear(nn.Linear):
    """nn.Linear whose weight gradient can be deferred (see :class:`WeightGradStore`)."""

    def forward(self, x):
        return _LinearFn.apply(x, self.weight, self.bias)


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
    """One pre-norm transformer block."""

    def __init__(self, spec: ModelSpec, flash: bool, dtype):
        super().__init__()
        d, hd = spec.d_model, spec.head_dim_
        self.nh, self.nkv, self.hd, self.flash = spec.n_heads, spec.n_kv_heads, hd, flash
        bias = spec.bias
        self.norm1, self.norm2 = _norm(spec, dtype), _norm(spec, dtype)
        self.qkv = SplitLinear(d, (self.nh + 2 * self.nkv) * hd, bias=bias or spec.qkv_bias, dtype=dtype)
        self.proj = SplitLinear(self.nh * hd, d, bias=bias, dtype=dtype)
        self.swiglu = spec.ffn == "swiglu"
        if self.swiglu:
            self.gate = SplitLinear(d, spec.d_ff, bias=bias, dtype=dtype)
            self.up = SplitLinear(d, spec.d_ff, bias=bias, dtype=dtype)
            self.down = SplitLinear(spec.d_ff, d, bias=bias, dtype=dtype)
        else:
            self.fc1 = SplitLinear(d, spec.d_ff, bias=bias, dtype=dtype)
            self.fc2 = SplitLinear(spec.d_ff, d, bias=bias, dtype=dtype)

    def attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        qkv = self.qkv(x)
        q, k, v = qkv.split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(b, s, self.nh, self.hd).transpose(1, 2)
        k = k.view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = v.view(b, s, self.nkv, self.hd).transpose(1, 2)
        if self.flash:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.nkv != self.nh)
        else:
            # explicit scores: (q/sqrt(d)) k^T + additive causal mask -> softmax -> @ v; with GQA the
            # query heads of one group broadcast against their K/V head (no repeated copies)
            g = self.nh // self.nkv
            qg = (q * (1.0 / math.sqrt(self.hd))).view(b, self.nkv, g, s, self.hd)
            scores = qg @ k.unsqueeze(2).transpose(-2, -1)
            probs = torch.softmax(scores + mask[:s, :s], dim=-1)
            out = (probs @ v.unsqueeze(2)).view(b, self.nh, s, self.hd)
        return self.proj(out.transpose(1, 2).reshape(b, s, self.nh * self.hd))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)
        h = self.norm2(x)
        if self.swiglu:
            h = self.down(swiglu(self.gate(h), self.up(h)))
        else:
            h = self.fc2(F.gelu(self.fc1(h)))
        return x + h


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

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if self.first:
            x = self.embed(x)
        for blk in self.blocks:
            x = blk(x, self.mask)
        if self.last:
            return self.head(x, targets)
        return x


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec, dtype):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab_size, spec.d_model, dtype=dtype)
        self.pos = nn.Embedding(spec.max_seq_len, spec.d_model, dtype=dtype) if spec.position == "learned" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos.weight[: tokens.shape[1]]
        return x


class Head(nn.Module):
    def __init__(self, spec: ModelSpec, dtype):
        super().__init__()
        self.norm = _norm(spec, dtype)
        self.out = SplitLinear(spec.d_model, spec.vocab_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.out(self.norm(x))
        # fp32 logits for the loss (Megatron's upcast); no-op when training in fp32
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def build_stages(spec: ModelSpec, layers_per_stage: tuple[int, ...], seq_len: int, flash: bool,
                 seed: int = 0, dtype=torch.float32) -> list[Stage]:
    """The whole model, deterministically initialised from ``seed``, cut into stages.

    Every rank builds all stages (small models) and keeps its own, so all ranks and the
    single-process reference hold identical weights.
    """
    torch.manual_seed(seed)
    embed = Embedding(spec, dtype)
    blocks = [Block(spec, flash, dtype) for _ in range(spec.n_layers)]
    head = Head(spec, dtype)
    with torch.no_grad():  # GPT-2 style small init keeps the logits tame
        for p in [*embed.parameters(), *(p for b in blocks for p in b.parameters()), *head.parameters()]:
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
    stages, first, n = [], 0, len(layers_per_stage)
    for s, k in enumerate(layers_per_stage):
        stages.append(Stage(spec, blocks[first:first + k], s == 0, s == n - 1, seq_len, dtype,
                            embed if s == 0 else None, head if s == n - 1 else None))
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
