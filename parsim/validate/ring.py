"""Context parallelism: ring attention over the causal zig-zag split (Liu et al. 2023; the
zig-zag placement of Megatron-Core / ring-flash-attention).

The sequence is cut into 2*cp chunks; context-parallel rank i holds chunks i and
2cp-1-i (so every rank has the same causal work) and keeps its queries. The K/V blocks
travel round the ring (rank i sends to i+1, receives from i-1), the next block in flight
while the current one is attended to. With rank i holding the K/V of rank j:

* j == i: causal attention of the local queries on the local keys (the two chunks'
  positions increase, so the position-causal mask is the index-causal one);
* j < i: every local query sees the first chunk of j (earlier positions) and none of the second;
* j > i: only the second local chunk sees j, both of j's chunks, in full.

Each block runs the fused (FlashAttention-style) CPU kernel, returning its output and
log-sum-exp; the blocks merge by log-sum-exp. Only q, k, v, the output and the
log-sum-exp are kept for the backward, which passes K/V round the ring again; a chunk's
gradient starts at the first rank after its owner and travels one step behind it, each rank
adding its part, and reaches the owner, which kept its own part, after the last step (as
Transformer Engine's ring: K/V at the first step, K/V and dK/dV in between, dK/dV at the last,
``cp - 1`` transfers of each);
every block's backward uses the merged output and log-sum-exp, as FlashAttention's does.
Grouped-query K/V heads are expanded only inside a block call.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from parsim.validate.comm import Group, record

_FWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def zigzag_positions(seq_len: int, cp: int, index: int) -> torch.Tensor:
    """Token positions context-parallel rank ``index`` holds (chunks index and 2cp-1-index)."""
    c = seq_len // (2 * cp)
    a, b = index * c, (2 * cp - 1 - index) * c
    return torch.cat([torch.arange(a, a + c), torch.arange(b, b + c)])


def exchange(send, recv, nxt: int, prv: int, pg) -> list:
    """Post one ring step: every tensor of ``send`` to global rank ``nxt`` and every buffer of
    ``recv`` from ``prv``, each its own isend / irecv, all in one batch; the requests."""
    ops = []
    for t, b in zip(send, recv):
        ops.append(dist.P2POp(dist.isend, t.contiguous(), nxt, pg))
        ops.append(dist.P2POp(dist.irecv, b, prv, pg))
    return dist.batch_isend_irecv(ops)


class _Ring:
    """Non-blocking exchange with the ring neighbours on the cp group."""

    def __init__(self, g: Group):
        self.g = g
        self.next = g.ranks[(g.index + 1) % g.size]
        self.prev = g.ranks[(g.index - 1) % g.size]
        self.works: list = []

    def start(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        self.nbytes = sum(t.numel() * t.element_size() for t in tensors)
        bufs = [torch.empty_like(t) for t in tensors]
        self.works = exchange(tensors, bufs, self.next, self.prev, self.g.pg)
        return bufs

    def wait(self) -> None:
        t = time.perf_counter()
        for w in self.works:
            w.wait()
        self.works = []
        # the exposed part only: the transfer ran under the block's compute until ``t``
        record(self.g.stream, t, self.nbytes)


def _expand(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _fold(t: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return t
    b, h, s, d = t.shape
    return t.view(b, h // groups, groups, s, d).sum(2)


def _block(q, k, v, causal: bool, groups: int):
    out, lse = _FWD(q, _expand(k, groups), _expand(v, groups), 0.0, causal)
    return out, lse


def _merge(out, lse, o, l, rows):
    if out is None:
        return o.float(), l
    sl = slice(rows, None)
    new = torch.logaddexp(lse[:, :, sl], l)
    out[:, :, sl] = out[:, :, sl] * torch.exp(lse[:, :, sl] - new).unsqueeze(-1) + o * torch.exp(l - new).unsqueeze(-1)
    lse[:, :, sl] = new
    return out, lse


class RingAttention(torch.autograd.Function):
    """Causal attention of (b, h, s_local, d) q on the whole sequence's K/V, zig-zag placed."""

    @staticmethod
    def forward(ctx, q, k, v, g: Group):
        cp, i = g.size, g.index
        groups = q.shape[1] // k.shape[1]
        half = q.shape[2] // 2
        ring = _Ring(g)
        out = lse = None
        kv = (k.contiguous(), v.contiguous())
        for step in range(cp):
            nxt = ring.start(list(kv)) if step < cp - 1 else None
            j = (i - step) % cp
            if j == i:
                o, l_ = _block(q, kv[0], kv[1], True, groups)
                out, lse = _merge(out, lse, o, l_, 0)
            elif j < i:
                o, l_ = _block(q, kv[0][:, :, :half], kv[1][:, :, :half], False, groups)
                out, lse = _merge(out, lse, o, l_, 0)
            else:
                o, l_ = _block(q[:, :, half:], kv[0], kv[1], False, groups)
                out, lse = _merge(out, lse, o, l_, half)
            if nxt is not None:
                ring.wait()
                kv = tuple(nxt)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.g = g
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        g = ctx.g
        cp, i = g.size, g.index
        groups = q.shape[1] // k.shape[1]
        half = q.shape[2] // 2
        dout = dout.contiguous()
        dq = torch.zeros_like(q)
        kv_ring, dkv_ring = _Ring(g), _Ring(g)
        kv = (k.contiguous(), v.contiguous())
        own = dkv_in = None
        for step in range(cp):
            nxt = kv_ring.start(list(kv)) if step < cp - 1 else None
            j = (i - step) % cp
            dk, dv = torch.zeros_like(kv[0]), torch.zeros_like(kv[1])
            if j == i:
                bq, bk, bv = _BWD(dout, q, _expand(kv[0], groups), _expand(kv[1], groups), out, lse, 0.0, True)
                dq += bq
                dk += _fold(bk, groups)
                dv += _fold(bv, groups)
            elif j < i:
                kk, vv = kv[0][:, :, :half], kv[1][:, :, :half]
                bq, bk, bv = _BWD(dout, q, _expand(kk, groups), _expand(vv, groups), out, lse, 0.0, False)
                dq += bq
                dk[:, :, :half] += _fold(bk, groups)
                dv[:, :, :half] += _fold(bv, groups)
            else:
                sl = slice(half, None)
                bq, bk, bv = _BWD(dout[:, :, sl], q[:, :, sl].contiguous(), _expand(kv[0], groups),
                                  _expand(kv[1], groups), out[:, :, sl].contiguous(), lse[:, :, sl].contiguous(),
                                  0.0, False)
                dq[:, :, sl] += bq
                dk += _fold(bk, groups)
                dv += _fold(bv, groups)
            if step == 0:  # this rank's own chunk: its partial gradient stays here
                own = (dk, dv)
            else:  # the chunk's gradient so far (ranks before this one), then on to the next rank
                if dkv_in is not None:
                    dkv_ring.wait()
                    dk += dkv_in[0]
                    dv += dkv_in[1]
                dkv_in = dkv_ring.start([dk, dv])
            if nxt is not None:
                kv_ring.wait()
                kv = tuple(nxt)
        dkv_ring.wait()  # what the other ranks accumulated for this rank's own chunk
        return dq, own[0] + dkv_in[0], own[1] + dkv_in[1], None
