"""A top-k mixture-of-experts FFN with expert parallelism (dispatch/combine all-to-all).

The router (replicated) scores every token, softmax over the experts, keeps the top k and
renormalises their weights (Mixtral). Capacity (GShard/Switch), when tokens are dropped:
each expert takes at most ceil(capacity_factor * T * k / E) of the T tokens this rank
routes (GShard's per-group capacity, the group being the rank's tokens), first choices
before second ones, earlier tokens first; the rest are dropped (the token keeps its
residual only). Kept assignments are sorted by expert; with ep > 1 the counts are
all-gathered (a few bytes), then the dispatch all-to-all sends each expert's rows to the rank holding it
(experts sharded contiguously, ``E / ep`` per rank), the experts run on what they
received, the combine all-to-all returns the rows, and each token sums its experts'
outputs times their weights. Routed experts are kept in a ``ModuleDict`` keyed by their
global index, so a parameter's name is the same on every rank and in the unsharded model.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from parsim.model import ModelSpec
from parsim.validate.comm import AllToAll, Group, exchange_counts


class Expert(nn.Module):
    """One FFN (GeLU: fc1, fc2; SwiGLU: gate, up, down) of hidden size ``f``."""

    def __init__(self, spec: ModelSpec, f: int, dtype, linear):
        super().__init__()
        d, bias = spec.d_model, spec.bias
        self.swiglu = spec.ffn == "swiglu"
        if self.swiglu:
            self.gate = linear(d, f, bias=bias, dtype=dtype)
            self.up = linear(d, f, bias=bias, dtype=dtype)
            self.down = linear(f, d, bias=bias, dtype=dtype)
        else:
            self.fc1 = linear(d, f, bias=bias, dtype=dtype)
            self.fc2 = linear(f, d, bias=bias, dtype=dtype)

    def forward(self, x, swiglu_fn=None):
        if self.swiglu:
            return self.down(swiglu_fn(self.gate(x), self.up(x)))
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """Router + routed experts (+ shared experts) of one MoE block."""

    def __init__(self, spec: ModelSpec, dtype, linear, swiglu_fn):
        super().__init__()
        self.n_experts, self.top_k = spec.n_experts, spec.top_k
        self.capacity_factor = spec.capacity_factor
        self.drop = True
        self.ep: Group | None = None
        self.swiglu_fn = swiglu_fn
        self.router = linear(spec.d_model, spec.n_experts, bias=False, dtype=dtype)
        self.experts = nn.ModuleDict({str(e): Expert(spec, spec.d_ff_expert_, dtype, linear)
                                      for e in range(spec.n_experts)})
        shared = spec.n_shared_experts * spec.d_ff_shared_
        self.shared = Expert(spec, shared, dtype, linear) if shared else None
        self.routed: list[torch.Tensor] = []
        """Per forward call (recomputation included), the expert of each of this rank's top-k
        assignments before capacity dropping: the routing the run produced (the simulator's
        ``[moe] histogram`` means the same, and drops by capacity itself)."""

    def local_experts(self) -> list[int]:
        g = self.ep
        if g is None or g.size == 1:
            return list(range(self.n_experts))
        n = self.n_experts // g.size
        return list(range(g.index * n, (g.index + 1) * n))

    def route(self, h: torch.Tensor):
        """(expert, token, weight) of every kept assignment, sorted by expert (stable)."""
        T, E, k = h.shape[0], self.n_experts, self.top_k
        probs = torch.softmax(self.router(h).float(), dim=-1)
        w, idx = probs.topk(k, dim=-1)
        w = (w / w.sum(-1, keepdim=True)).to(h.dtype)
        e = idx.t().reshape(-1)                 # first choices of every token, then second ...
        tok = torch.arange(T, device=h.device).repeat(k)
        self.routed.append(e)  # counted after the step (routed_counts): no op added inside it
        wt = w.t().reshape(-1)
        if self.drop:
            cap = math.ceil(self.capacity_factor * T * k / E)
            onehot = F.one_hot(e, E)
            pos = (onehot.cumsum(0) - 1).gather(1, e[:, None]).squeeze(1)
            keep = pos < cap
            e, tok, wt = e[keep], tok[keep], wt[keep]
        order = torch.argsort(e, stable=True)
        return e[order], tok[order], wt[order]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = x.reshape(b * s, d)
        e, tok, wt = self.route(h)
        counts = torch.bincount(e, minlength=self.n_experts)
        rows = h[tok]
        g = self.ep
        if g is not None and g.size > 1:
            per = counts.view(g.size, -1)
            recv = exchange_counts(per, g)                  # (source rank, local expert)
            send_rows, recv_rows = per.sum(1).tolist(), recv.sum(1).tolist()
            got = AllToAll.apply(rows, recv_rows, send_rows, g)
            out = AllToAll.apply(self._run(got, recv), send_rows, recv_rows, g)
        else:
            out = self._run(rows, counts.view(1, -1))
        y = torch.zeros_like(h).index_add(0, tok, out * wt[:, None])
        if self.shared is not None:
            y = y + self.shared(h, self.swiglu_fn)
        return y.view(b, s, d)

    def _run(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Each local expert on its rows; ``rows`` grouped by source, then by local expert."""
        n_src, n_local = counts.shape
        sizes = counts.reshape(-1).tolist()
        parts = list(rows.split(sizes))
        outs: list = [None] * len(parts)
        for j, e in enumerate(self.local_experts()):
            mine = [parts[src * n_local + j] for src in range(n_src)]
            n = [t.shape[0] for t in mine]
            if sum(n) == 0:
                for src in range(n_src):
                    outs[src * n_local + j] = mine[src]
                continue
            y = self.experts[str(e)](torch.cat(mine) if n_src > 1 else mine[0], self.swiglu_fn)
            for src, piece in enumerate(y.split(n)):
                outs[src * n_local + j] = piece
        return torch.cat(outs) if outs else rows
