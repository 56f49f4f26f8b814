"""TeraPipe's token slices on the torch runtime: the K/V a slice leaves for the later slices of
its sequence, and the K/V gradients those later slices send back.

Slice i of a microbatch runs each block's attention over the keys and values of slices 0..i
(:class:`SliceKV`, set as ``Block.kv`` while the slice's forward runs). The earlier slices' K/V
enter slice i's graph as *detached leaves*, so slice i's backward stops at them and leaves their
gradients in ``.grad``: they are added to what slice j < i owes (:meth:`SliceKV.collect`), and
slice j's backward later back-propagates its output gradient and that K/V gradient together
(:meth:`SliceKV.outputs`). That is the dependency the schedule orders (backwards in reverse
slice order on each stage, ``parsim.schedule.terapipe``); run out of order, a slice's backward
would miss a later slice's contribution and the gradients would differ from the unsliced step.
"""
from __future__ import annotations

import torch


class SliceKV:
    """One block's K/V over the slices of one microbatch on one stage."""

    def __init__(self) -> None:
        self.own: list[tuple[torch.Tensor, torch.Tensor]] = []
        """Per slice: its own K and V (in its forward graph)."""
        self.leaves: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        """Per slice: the earlier slices' K and V as it saw them (detached leaves), None for slice 0."""
        self.lengths: list[int] = []
        self.owed: dict[int, list[torch.Tensor]] = {}
        """Per slice: the gradient of its K and V accumulated from the later slices' backwards."""

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Slice i's forward: (K, V) of slices 0..i along the sequence, and slice i's first position."""
        first = sum(self.lengths)
        if self.own:
            pk = torch.cat([x[0].detach() for x in self.own], dim=2).requires_grad_(True)
            pv = torch.cat([x[1].detach() for x in self.own], dim=2).requires_grad_(True)
            self.leaves.append((pk, pv))
            full = (torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2))
        else:
            self.leaves.append(None)
            full = (k, v)
        self.own.append((k, v))
        self.lengths.append(k.shape[2])
        return full[0], full[1], first

    def outputs(self, i: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """What slice i's backward must also back-propagate: its K and V, with the gradient the
        later slices sent (nothing for the last slice)."""
        owed = self.owed.pop(i, None)
        if owed is None:
            return [], []
        return list(self.own[i]), owed

    def collect(self, i: int) -> None:
        """After slice i's backward: hand its gradient w.r.t. the earlier K/V to those slices."""
        leaves = self.leaves[i]
        if leaves is None:
            return
        for which, leaf in enumerate(leaves):
            if leaf.grad is None:
                continue
            for j, part in enumerate(leaf.grad.split(self.lengths[:i], dim=2)):
                acc = self.owed.setdefault(j, [None, None])
                acc[which] = part if acc[which] is None else acc[which] + part
        for j in range(i):
            acc = self.owed.get(j)
            if acc is not None:
                for which in (0, 1):
                    if acc[which] is None:
                        acc[which] = torch.zeros_like(self.own[j][which])
        self.leaves[i] = None
