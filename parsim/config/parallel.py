"""Parallel configuration, the rank grid and layer -> stage partitioning.

The rank grid orders the axes (dp, pp, cp, ep, tp) from slowest to fastest varying by
default, so the tensor-parallel group is made of consecutive global ranks and lands
inside one node (Megatron's default placement). ``order`` makes that configurable;
what crosses the node boundary follows from the placement, never from a flag.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from parsim.errors import ConfigError

AXES = ("dp", "pp", "cp", "ep", "tp")


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of each parallel axis and the sharding options around them."""

    dp: int = 1
    """Data-parallel degree (replicas of the model; with ep>1, experts are sharded inside it)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row sharding of every linear layer)."""
    pp: int = 1
    """Pipeline-parallel degree (pipeline ranks)."""
    cp: int = 1
    """Context-parallel degree (the sequence is split; K/V exchanged in a ring in attention)."""
    ep: int = 1
    """Expert-parallel degree (experts sharded over ep ranks inside dp*cp)."""
    vpp: int = 1
    """Virtual stages per pipeline rank (interleaved schedules); n_stages = pp * vpp."""
    zero: int = 0
    """ZeRO stage 0..3 over the data-parallel axis (3 = FSDP-style parameter sharding)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms/dropout sharded over tp; all-gather/reduce-scatter replace all-reduce."""
    dp_comm: str = "allreduce"
    """How data-parallel gradients are combined: "allreduce" (NCCL collectives; ZeRO's
    reduce-scatter/all-gather) or "parameter_server" (push to one server rank, pull back:
    the pre-all-reduce design, for comparison; needs zero = 0)."""
    order: tuple[str, ...] = field(default=AXES)
    """Axis order of the rank grid, slowest-varying first; the last axis is the innermost (consecutive ranks)."""

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def n_stages(self) -> int:
        return self.pp * self.vpp

    def stride(self, axis: str) -> int:
        """Distance in global rank between neighbours along ``axis``.

        ep is carved out of dp*cp (it does not multiply the world size); it gets
        the stride of the innermost of dp/cp so experts of one group sit close.
        """
        if axis == "ep":
            return self.stride("cp") if self.cp > 1 else self.stride("dp")
        s = 1
        for a in reversed(self.order):
            if a == axis:
                return s
            if a != "ep":
                s *= getattr(self, a)
        raise ValueError(axis)

    def group_ranks(self, axis: str, rank0: int = 0) -> list[int]:
        """Global ranks of the ``axis`` group that contains ``rank0``."""
        n = getattr(self, axis)
        st = self.stride(axis)
        base = rank0 - ((rank0 // st) % n) * st
        return [base + i * st for i in range(n)]

    def pipeline_ranks(self) -> list[int]:
        """Global ranks of the pipeline of the first replica (stage rank 0..pp-1)."""
        return self.group_ranks("pp", 0)


def check_parallel(par: ParallelConfig, gpus: int, file: str | None) -> None:
    """Divisibility and range rules; raise a ConfigError naming the key."""
    for axis in ("dp", "tp", "pp", "cp", "ep", "vpp"):
        v = getattr(par, axis)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(file, f"parallel.{axis}", f"must be a positive integer, got {v!r}")
    if par.zero not in (0, 1, 2, 3):
        raise ConfigError(file, "parallel.zero", f"must be 0, 1, 2 or 3, got {par.zero!r}")
    if par.dp_comm not in ("allreduce", "parameter_server"):
        raise ConfigError(file, "parallel.dp_comm", f"must be \"allreduce\" or \"parameter_server\", got {par.dp_comm!r}")
    if par.dp_comm == "parameter_server" and par.zero:
        raise ConfigError(file, "parallel.dp_comm", f"a parameter server keeps whole optimizer state: needs zero = 0, got {par.zero}")
    if par.world_size != gpus:
        raise ConfigError(
            file, "gpus",
            f"{gpus} GPUs but dp*tp*pp*cp = {par.dp}*{par.tp}*{par.pp}*{par.cp} = {par.world_size}",
        )
    if (par.dp * par.cp) % par.ep:
        raise ConfigError(file, "parallel.ep", f"ep={par.ep} must divide dp*cp={par.dp * par.cp}")
    if sorted(par.order) != sorted(AXES):
        raise ConfigError(file, "parallel.order", f"must be a permutation of {list(AXES)}, got {list(par.order)}")


def partition_layers(n_layers: int, n_stages: int, *, file: str | None = None,
                     interleaved: bool = False) -> tuple[int, ...]:
    """Transformer blocks per stage, as even as possible (earlier stages get the extra).

    Interleaved schedules need an exact split (Megatron's rule): every virtual stage
    carries the same number of layers.
    """
    if n_stages > n_layers:
        raise ConfigError(file, "parallel.pp",
                          f"{n_stages} stages (pp*vpp) but only {n_layers} layers")
    if interleaved and n_layers % n_stages:
        raise ConfigError(file, "parallel.vpp",
                          f"interleaving needs n_layers={n_layers} divisible by pp*vpp={n_stages}")
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if s < extra else 0) for s in range(n_stages))
