"""A logical device mesh with named axes, tensor layouts on it, and the collectives that turn
one layout into another (GSPMD's resharding), costed by ``parsim.cluster.collectives``.

A layout says, per mesh axis, what a tensor ``[tokens, features]`` is on that axis: split over
tokens (``T``), split over features (``F``), a partial sum (``P``) or replicated (absent).
Turning layout ``src`` into ``dst`` goes axis by axis: a split that ``dst`` adds is a free slice;
``P`` to a split is a reduce-scatter, ``P`` to replicated an all-reduce; a split to replicated
an all-gather; a split of one dim to a split of the other an all-to-all.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from parsim.cluster.collectives import collective_time
from parsim.cluster.hardware import HardwareProfile


@dataclass(frozen=True)
class Mesh:
    """A logical mesh on consecutive global ranks ``offset ..``: axes outer to inner."""

    axes: tuple[tuple[str, int], ...]
    """(name, size), outer to inner (the last axis holds consecutive ranks)."""
    offset: int = 0
    """Global rank of the mesh's first device (a pipeline stage's submesh starts past the others)."""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.axes)

    @property
    def n_devices(self) -> int:
        out = 1
        for n in self.sizes:
            out *= n
        return out

    def size(self, axis: str) -> int:
        return dict(self.axes)[axis]

    def group(self, axes: tuple[str, ...]) -> tuple[int, ...]:
        """Global ranks of the group spanning ``axes`` that holds the mesh's first device."""
        strides, s = {}, 1
        for name, n in reversed(self.axes):
            strides[name] = s
            s *= n
        ranks = [self.offset]
        for a in axes:
            ranks = [r + i * strides[a] for r in ranks for i in range(self.size(a))]
        return tuple(sorted(ranks))


@dataclass(frozen=True)
class Layout:
    """What a ``[tokens, features]`` tensor is on each mesh axis: ``T``, ``F``, ``P`` or ``-``."""

    roles: tuple[str, ...]
    """One letter per mesh axis: T (tokens split), F (features split), P (partial sum), - (replicated)."""

    def split_factor(self, mesh: Mesh) -> int:
        out = 1
        for r, n in zip(self.roles, mesh.sizes):
            if r in "TF":
                out *= n
        return out

    def without_partial(self) -> Layout:
        return Layout(tuple("-" if r == "P" else r for r in self.roles))


@lru_cache(maxsize=65536)
def _coll(hw: HardwareProfile, kind: str, nbytes: float, ranks: tuple[int, ...]) -> float:
    return collective_time(hw, kind, nbytes, list(ranks))


def reshard_steps(src: Layout, dst: Layout, full_bytes: float, mesh: Mesh) -> list[tuple[str, float, tuple[int, ...]]]:
    """The collectives (kind, nccl-tests bytes, group) turning ``src`` into ``dst``, axis by axis
    (free slices first, so every collective moves the smallest buffer it can)."""
    local = full_bytes / src.split_factor(mesh)
    steps = []
    for (a, n), s, d in zip(mesh.axes, src.roles, dst.roles):
        if s == "-" and d in "TF":
            local /= n  # slicing a replicated tensor: free
    for (a, n), s, d in zip(mesh.axes, src.roles, dst.roles):
        if s == d or n == 1 or s == "-":
            continue
        group = mesh.group((a,))
        if s == "P":
            if d in "TF":
                steps.append(("reduce_scatter", local, group))
                local /= n
            else:
                steps.append(("all_reduce", local, group))
        elif d in "TF":
            steps.append(("all_to_all", local, group))
        else:
            local *= n
            steps.append(("all_gather", local, group))
    return steps


def reshard_time(hw: HardwareProfile, src: Layout, dst: Layout, full_bytes: float, mesh: Mesh) -> float:
    """Seconds to turn ``src`` into ``dst`` (0 when equal or only slicing)."""
    if src == dst:
        return 0.0
    return sum(_coll(hw, k, b, g) for k, b, g in reshard_steps(src, dst, full_bytes, mesh))


def collective(hw: HardwareProfile, kind: str, nbytes: float, ranks: tuple[int, ...]) -> float:
    """``parsim.cluster.collectives.collective_time`` on a group of global ranks (memoised)."""
    if len(ranks) <= 1 or nbytes <= 0:
        return 0.0
    return _coll(hw, kind, float(nbytes), tuple(ranks))


def clear_caches() -> None:
    _coll.cache_clear()
