"""Linear layers whose weight gradient can be deferred, and Megatron's tensor-parallel pieces.

* :class:`SplitLinear`: ``nn.Linear`` whose backward can *defer* the weight gradient
  (zero-bubble I/W split). While a :class:`WeightGradStore` is active, backward computes
  input gradients only and records ``(layer, input, grad_output)``; ``W`` later runs the
  deferred ``dW = grad_out^T @ input`` GEMMs.
* :class:`Par`: the groups a rank's stages run collectives on, with Megatron's f / g
  (``enter`` / ``leave``) and the column-parallel layers (``column``: under sequence
  parallelism the all-gather fused with them, keeping only this rank's sequence slice of
  the input for the backward, as Megatron does);
* :func:`parallel_cross_entropy`: the loss over a vocabulary split over tp.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from parsim.validate.comm import (
    CopyToGroup,
    GatherSeq,
    Group,
    ReduceFromGroup,
    ScatterSeq,
    all_reduce,
    gather_seq,
    scatter_seq,
)

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
        """Run the deferred weight-gradient GEMMs (the W action) and free the stash. Outside
        autograd (the stashed input requires grad; nothing differentiates a gradient), each
        adds into its parameter's ``.grad`` in place (a view of the gradient buffer)."""
        with torch.no_grad():
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


class _SeqParallelColumn(torch.autograd.Function):
    """All-gather along the sequence, then column-parallel linears on the gathered input; the
    backward gathers the input again (for the weight gradients, deferred under a
    :class:`WeightGradStore`) and reduce-scatters the input gradient."""

    @staticmethod
    def forward(ctx, x, g, *wb):
        full = gather_seq(x, g)
        ctx.g, ctx.n = g, len(wb) // 2
        ctx.save_for_backward(x, *[w for w in wb if w is not None])
        ctx.biases = [wb[2 * i + 1] for i in range(ctx.n)]
        return tuple(F.linear(full, wb[2 * i], wb[2 * i + 1]) for i in range(ctx.n))

    @staticmethod
    def backward(ctx, *dys):
        x, *ws = ctx.saved_tensors
        weights = [w for w in ws if w.dim() == 2]  # the biases saved beside them are 1-D
        full = gather_seq(x, ctx.g)
        dx = sum(dy @ w for dy, w in zip(dys, weights))
        grads = []
        for dy, w, bias in zip(dys, weights, ctx.biases):
            if _STORE is not None:
                _STORE.append((w, bias, full, dy))
                grads += [None, None]
                continue
            f2, g2 = full.reshape(-1, full.shape[-1]), dy.reshape(-1, dy.shape[-1])
            grads += [g2.t() @ f2, g2.sum(0) if bias is not None else None]
        return (scatter_seq(dx, ctx.g), None, *grads)


class SplitLinear(nn.Linear):
    """nn.Linear whose weight gradient can be deferred (see :class:`WeightGradStore`)."""

    def forward(self, x):
        return _LinearFn.apply(x, self.weight, self.bias)


@dataclass
class Par:
    """The groups one rank's stages run their collectives on (None: that axis is 1)."""

    tp: Group | None = None
    """Tensor-parallel group."""
    sp: bool = False
    """Sequence parallelism (activations outside attention/MLP sharded along the sequence over tp)."""
    cp: Group | None = None
    """Context-parallel group (the K/V ring, in ring order)."""
    ep: Group | None = None
    """Expert-parallel group."""

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        """Before a column-parallel layer: f, or the sequence all-gather."""
        if self.tp is None:
            return x
        return GatherSeq.apply(x, self.tp) if self.sp else CopyToGroup.apply(x, self.tp)

    def column(self, x: torch.Tensor, *layers: SplitLinear) -> list[torch.Tensor]:
        """Column-parallel ``layers`` on ``x``: f then each layer, or under sequence parallelism
        the all-gather fused with them, keeping only this rank's slice of ``x`` for the backward
        (Megatron gathers it again there: what the activation model counts)."""
        if self.tp is not None and self.sp:
            return list(_SeqParallelColumn.apply(x, self.tp, *[t for lyr in layers for t in (lyr.weight, lyr.bias)]))
        x = self.enter(x)
        return [lyr(x) for lyr in layers]

    def leave(self, x: torch.Tensor) -> torch.Tensor:
        """After a row-parallel layer: g, or the sequence reduce-scatter."""
        if self.tp is None:
            return x
        return ScatterSeq.apply(x, self.tp) if self.sp else ReduceFromGroup.apply(x, self.tp)


NO_PAR = Par()


def parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, start: int, g: Group) -> torch.Tensor:
    """Mean cross-entropy with the vocabulary split over ``g``: a max, the sum of exponentials
    and the target's logit reduced over the group (the last two differentiably)."""
    with torch.no_grad():
        m = all_reduce(logits.max(-1).values.clone(), g, dist.ReduceOp.MAX)
    shifted = logits - m[:, None]
    sumexp = ReduceFromGroup.apply(shifted.exp().sum(-1), g)
    local = targets - start
    inside = (local >= 0) & (local < logits.shape[-1])
    picked = _Pick.apply(shifted, local.clamp(0, logits.shape[-1] - 1)) * inside
    target = ReduceFromGroup.apply(picked, g)
    return (sumexp.log() - target).mean()


class _Pick(torch.autograd.Function):
    """``x[i, index[i]]`` keeping only the index for the backward (torch's gather keeps its
    whole input: a second copy of the logits that cross-entropy kernels do not keep)."""

    @staticmethod
    def forward(ctx, x, index):
        ctx.save_for_backward(index)
        ctx.shape = x.shape
        return x.gather(1, index[:, None]).squeeze(1)

    @staticmethod
    def backward(ctx, dy):
        (index,) = ctx.saved_tensors
        return torch.zeros(ctx.shape, dtype=dy.dtype, device=dy.device).scatter_(1, index[:, None], dy[:, None]), None
