"""Where an op's seconds go (:class:`Parts`) and what it puts on the wire, by axis (:class:`AxisBytes`)."""
from __future__ import annotations

from dataclasses import dataclass

PART_NAMES = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm")
AXES = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class Parts:
    """Seconds of one op, by what they are spent on."""

    compute: float = 0.0
    """GEMMs, attention, memory-bound kernels, kernel launches (and the optimizer update)."""
    recompute: float = 0.0
    """Forward work rerun inside the backward (full or selective recomputation)."""
    tp_comm: float = 0.0
    """Exposed tensor-parallel collectives inside the op."""
    cp_comm: float = 0.0
    """Exposed context-parallel K/V ring exchange inside the op."""
    ep_comm: float = 0.0
    """Exposed expert-parallel all-to-alls inside the op."""

    @property
    def total(self) -> float:
        return self.compute + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm

    def __add__(self, o: Parts) -> Parts:
        return Parts(self.compute + o.compute, self.recompute + o.recompute, self.tp_comm + o.tp_comm,
                     self.cp_comm + o.cp_comm, self.ep_comm + o.ep_comm)

    def scaled(self, k: float) -> Parts:
        return Parts(*(getattr(self, n) * k for n in PART_NAMES))


@dataclass(frozen=True)
class AxisBytes:
    """Bytes one GPU sends during one op, by parallel axis (nccl-tests' bus bytes for collectives:
    ring all-reduce 2(n-1)/n of the buffer, reduce-scatter / all-gather / all-to-all (n-1)/n)."""

    tp: float = 0.0
    """Tensor-parallel collectives (Megatron's f/g operators, the vocabulary-parallel embedding)."""
    cp: float = 0.0
    """Context-parallel ring: the K/V blocks passed to the next rank."""
    ep: float = 0.0
    """Expert-parallel dispatch and combine all-to-alls."""
    dp: float = 0.0
    """Data-parallel gradient reduction and parameter gathers."""
    pp: float = 0.0
    """Pipeline sends of activations and their gradients."""

    def __add__(self, o: AxisBytes) -> AxisBytes:
        return AxisBytes(self.tp + o.tp, self.cp + o.cp, self.ep + o.ep, self.dp + o.dp, self.pp + o.pp)
