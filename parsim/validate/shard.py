"""Cut a rank's stages out of the full (unsharded) model: tensor-, context- and expert-parallel.

Every rank builds the whole model from the same seed (``parsim.validate.model.build_stages``)
and keeps its shard of each weight, so the sharded run starts from exactly the weights of
the single-process reference. Each kept slice is recorded on its parameter as
``param.shard = (dim, index)`` (rows/columns of the full tensor it holds): the gradient
parity check cuts the reference's gradients the same way.

* tensor parallelism: QKV by heads (this rank's query heads, then its K and V heads),
  FC1 / gate / up by hidden units (rows), the attention and FFN output projections by
  columns (bias whole, added after the reduction), the embedding table and the LM head
  by vocabulary rows;
* sequence parallelism: parameters that see only this rank's slice of the sequence (norms,
  the row-parallel biases, the position table) get ``param.partial = "tp"``: their gradient
  is summed over tp before the data-parallel reduction;
* expert parallelism: each rank keeps its experts (``E / ep`` contiguous), marked
  ``param.expert = True`` (reduced over the expert-data-parallel group);
* a tied embedding (``model.tied_embeddings``): a rank holding both ends (in one stage, or as
  a V-shaped schedule's first and last) keeps one matrix (a dense parameter, claimed by the first
  of its stages); with the ends on different pipeline ranks each keeps its copy,
  marked ``param.tied = True`` (reduced over both ends' data-parallel ranks at once:
  ``parsim.validate.layout``'s ``tied`` group).
"""
from __future__ import annotations

import torch
from torch import nn

from parsim.validate.model import Block, Stage
from parsim.validate.ring import zigzag_positions
from parsim.validate.tensor_parallel import Par


def _keep(module: nn.Module, name: str, dim: int, index: torch.Tensor, memo: dict | None = None) -> None:
    """Replace ``module.name`` by its slice along ``dim``; a parameter another module shares
    (``memo``: original id -> kept slice, over a rank's stages) gets the same kept slice."""
    p = getattr(module, name)
    if p is None:
        return
    if memo is not None and id(p) in memo:
        setattr(module, name, memo[id(p)])
        return
    kept = nn.Parameter(p.detach().index_select(dim, index).clone())
    kept.shard = (dim, index)
    kept.tied = getattr(p, "tied", False)
    if memo is not None:
        memo[id(p)] = kept
    setattr(module, name, kept)


def _span(n: int, parts: int, i: int) -> torch.Tensor:
    k = n // parts
    return torch.arange(i * k, (i + 1) * k)


def _mark_partial(*params) -> None:
    for p in params:
        if p is not None:
            p.partial = "tp"


def _shard_block(blk: Block, par: Par) -> None:
    blk.par = par
    if par.tp is not None:
        tp, i, hd = par.tp.size, par.tp.index, blk.hd
        q = _span(blk.nh * hd, tp, i)
        k = blk.nh * hd + _span(blk.nkv * hd, tp, i)
        v = (blk.nh + blk.nkv) * hd + _span(blk.nkv * hd, tp, i)
        rows = torch.cat([q, k, v])
        _keep(blk.qkv, "weight", 0, rows)
        _keep(blk.qkv, "bias", 0, rows)
        _keep(blk.proj, "weight", 1, q)
        cols = ("gate", "up") if blk.swiglu else ("fc1",)
        out = "down" if blk.swiglu else "fc2"
        if blk.moe is None:
            for name in cols:
                layer = getattr(blk, name)
                f = _span(layer.weight.shape[0], tp, i)
                _keep(layer, "weight", 0, f)
                _keep(layer, "bias", 0, f)
            layer = getattr(blk, out)
            _keep(layer, "weight", 1, _span(layer.weight.shape[1], tp, i))
        if par.sp:
            _mark_partial(*blk.norm1.parameters(), *blk.norm2.parameters(), blk.proj.bias,
                          None if blk.moe is not None else getattr(blk, out).bias)
    if blk.moe is not None:
        blk.moe.ep = par.ep
        mine = set(blk.moe.local_experts())
        for key in list(blk.moe.experts):
            if int(key) not in mine:
                del blk.moe.experts[key]
        for p in blk.moe.experts.parameters():
            p.expert = True


def shard_stage(stage: Stage, par: Par, seq_len: int, memo: dict | None = None) -> Stage:
    """Keep this rank's shard of ``stage`` (in place) and wire its collectives to ``par``;
    ``memo`` (shared over a rank's stages) keeps a tied embedding one matrix where both ends
    are on the rank (:func:`dense_local_ties` then makes it a dense parameter)."""
    memo = {} if memo is None else memo
    for blk in stage.blocks:
        _shard_block(blk, par)
    tp = par.tp
    for end in (stage.embed, stage.head):
        if end is None:
            continue
        end.par = par
        if tp is not None:
            table = end.tok if end is stage.embed else end.out
            rows = _span(table.weight.shape[0], tp.size, tp.index)
            _keep(table, "weight", 0, rows, memo)
            end.vocab_start = int(rows[0])
    if stage.embed is not None:
        pos = torch.arange(seq_len)
        if par.cp is not None:
            pos = zigzag_positions(seq_len, par.cp.size, par.cp.index)
        if tp is not None and par.sp:
            pos = pos.view(tp.size, -1)[tp.index]
            if stage.embed.pos is not None:
                _mark_partial(stage.embed.pos.weight)
        stage.embed.positions = None if par.cp is None and not (tp is not None and par.sp) else pos
    if stage.head is not None and tp is not None and par.sp:
        _mark_partial(*stage.head.norm.parameters())
    return stage


def shard_descriptor(stage: Stage, params: list) -> list[tuple[str, int | None, list[int] | None]]:
    """(name, dim, kept indices) of each of ``params`` (parameters of ``stage``), in that order."""
    names = {id(p): name for name, p in stage.named_parameters()}
    out = []
    for p in params:
        dim, idx = getattr(p, "shard", (None, None))
        out.append((names[id(p)], dim, None if idx is None else idx.tolist()))
    return out


def dense_local_ties(stages) -> None:
    """A tied embedding whose two ends are both among ``stages`` (one rank's: one stage holding
    both, or the first and last of a V-shaped schedule) is one parameter there: its gradient sums
    both uses in place, so it is reduced as a dense parameter, not with another rank's copy."""
    ends = [st.embed.tok.weight for st in stages if st.embed is not None]
    heads = {id(st.head.out.weight) for st in stages if st.head is not None}
    for p in ends:
        if getattr(p, "tied", False) and id(p) in heads:
            p.tied = False
