"""A stage's parameters as the runtime reduces, shards, updates and versions them.

* :class:`FlatParams`: one reduction group's parameters of a stage (the dense ones over
  the data x context parallel ranks, and the other model copy's with two chains; routed
  experts over their expert-data-parallel ranks) seen as one flat buffer, padded to a
  multiple of the group size, with its optimizer (ZeRO >= 1: on this rank's shard only).
  Their gradients live in one persistent flat buffer, every ``.grad`` a view of it, as
  Megatron-Core's DDP grad buffer (and PyTorch DDP's ``gradient_as_bucket_view``) keeps
  them: every microbatch's backward adds into it in place, the step's reduction runs on it
  with no flattening copy, and the step zeroes it (Megatron's ``zero_grad_buffer``) -- what
  the cost model charges (``parsim.costs.stage``'s accumulation, ``parsim.costs.dp``'s step);
* :class:`Versions`: weight stashing (PipeDream, PipeDream-2BW). The step's forwards and
  backwards run on the version ``delay`` updates old, kept from when it was current;
  STEP updates the newest version in place (a fresh copy of it: the old one stays
  stashed) with gradients computed on the stale one. ``delay`` = p - s - 1 for
  PipeDream's stage s, 1 for PipeDream-2BW: W(t+1) = W(t) - lr * grad(W(t - delay)).
"""
from __future__ import annotations

from collections import deque

import torch

REDUCTION_GROUP = {"dense": "grad", "expert": "edp", "tied": "tied"}
"""Parameter kind -> the group its gradients are reduced over (``parsim.validate.layout``): the
dense ones over the data x context parallel ranks, routed experts over their expert-data-parallel
ranks, a tied embedding's copy at either end of the pipeline over both ends' data x context
parallel ranks (one collective sums the two copies' gradients and the replicas')."""


def kind_of(p) -> str:
    """The reduction kind of one parameter (:data:`REDUCTION_GROUP`)."""
    if getattr(p, "expert", False):
        return "expert"
    return "tied" if getattr(p, "tied", False) else "dense"


def params_by_kind(stage, claimed: set | None = None) -> dict[str, list]:
    """A stage's trainable parameters by kind (:data:`REDUCTION_GROUP`; kinds without any left
    out), each list in the module's order: the layout of that kind's flat buffer. ``claimed``
    (ids, updated): parameters an earlier stage of the rank holds already are left out."""
    ps = [p for p in stage.parameters() if p.requires_grad]
    if claimed is not None:
        ps = [p for p in ps if id(p) not in claimed]
        claimed.update(id(p) for p in ps)
    out = {kind: [p for p in ps if kind_of(p) == kind] for kind in REDUCTION_GROUP}
    return {k: v for k, v in out.items() if v}


class FlatParams:
    """Parameters reduced over one group, as one flat buffer (padded to a multiple of its size)."""

    def __init__(self, params: list, group, size: int, index: int, zero: int, opt_factory, kind: str = "dense"):
        self.params = params
        self.kind = kind
        self.numel = sum(p.numel() for p in params)
        self.padded = -(-self.numel // size) * size
        self.shard = self.padded // size
        self.group, self.size, self.index, self.zero = group, size, index, zero
        self._factory = opt_factory
        p0 = params[0]
        self.dtype, self.device = p0.dtype, p0.device
        self.grads = torch.zeros(self.padded, dtype=self.dtype, device=self.device)
        """The persistent gradient buffer (padding included); every parameter's ``.grad`` views it."""
        self._attach_grads()
        if zero >= 1:
            lo = index * self.shard
            self.master = torch.nn.Parameter(self.flat_params()[lo:lo + self.shard].clone())
            self.opt = opt_factory([self.master])
        else:
            self.opt = opt_factory(params)

    def update_unversioned(self) -> None:
        """Let the optimizer update the parameters' storage through aliases with their own
        version counters (AMPNet: no weight stashing). A backward whose forward ran before an
        update then computes with the updated weights -- the weights of now, as the
        asynchronous update means -- where an in-place step on the parameters themselves would
        fail autograd's saved-tensor version check. Zero-0 only (the whole stage on this rank)."""
        if self.zero >= 1:
            raise ValueError("unversioned updates need the whole optimizer state on this rank (zero=0)")
        self.aliases = [torch.nn.Parameter(p.data) for p in self.params]  # p.data: own version counter
        for a, p in zip(self.aliases, self.params):
            a.grad = p.grad  # the same view of the persistent gradient buffer
        self.opt = self._factory(self.aliases)

    def flat_params(self) -> torch.Tensor:
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        return torch.nn.functional.pad(flat, (0, self.padded - self.numel))

    def _attach_grads(self) -> None:
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = self.grads[off:off + n].view_as(p)
            off += n

    def flat_grads(self) -> torch.Tensor:
        """The gradient buffer itself (a step's reduction runs on it in place)."""
        return self.grads

    def take_grads(self) -> torch.Tensor:
        """A copy of the gradients so far, the buffer zeroed: a per-microbatch reduction runs
        on the copy while the next microbatch's backward adds into the buffer."""
        out = self.grads.clone()
        self.grads.zero_()
        return out

    def my_shard(self, flat: torch.Tensor) -> torch.Tensor:
        return flat[self.index * self.shard:(self.index + 1) * self.shard]

    def load_flat(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            off = 0
            for p in self.params:
                n = p.numel()
                p.copy_(flat[off:off + n].view_as(p))
                off += n

    def point_at(self, flat: torch.Tensor) -> None:
        """Make the parameters views of ``flat`` (a gathered buffer) without writing into them:
        autograd keeps the tensors a forward saved, so their backward stays valid."""
        off = 0
        for p in self.params:
            n = p.numel()
            p.data = flat[off:off + n].view_as(p)
            off += n

    def set_grads(self, flat: torch.Tensor) -> None:
        """The gradients become ``flat`` (the reduced sum of per-microbatch parts)."""
        if flat is not self.grads:
            self.grads.copy_(flat)

    def clear_grads(self) -> None:
        """Zero the buffer for the next step (the views stay the parameters' ``.grad``)."""
        self.grads.zero_()


def sum_partial_grads(params: list, all_reduce) -> None:
    """Sum over tensor parallelism the gradients of parameters that saw one sequence slice
    each (sequence parallelism's norms and biases): one flat all-reduce."""
    if not params:
        return
    flat = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype)
                      for p in params])
    all_reduce(flat)
    off = 0
    for p in params:
        n = p.numel()
        part = flat[off:off + n].view_as(p)
        if p.grad is None:
            p.grad = part.clone()
        else:  # in place: the grad may be a view of its FlatParams buffer
            p.grad.copy_(part)
        off += n


class Versions:
    """Stashed weight versions of some parameters (see the module doc)."""

    def __init__(self, params: list, delay: int):
        self.params, self.delay = params, delay
        self.history: deque = deque([[p.data for p in params]], maxlen=delay + 1)

    def use_stale(self) -> None:
        """Point the parameters at the version the coming step computes with."""
        for p, t in zip(self.params, self.history[0]):
            p.data = t

    def begin_update(self) -> None:
        """Point the parameters at a fresh copy of the newest version (STEP updates it in place)."""
        fresh = [t.clone() for t in self.history[-1]]
        for p, t in zip(self.params, fresh):
            p.data = t
        self.history.append(fresh)

    @property
    def count(self) -> int:
        """Versions held now."""
        return len(self.history)
