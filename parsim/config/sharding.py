"""``[sharding]``: GSPMD/GShard-style annotations of a transformer's weights on a named device mesh.

A mesh names its axes (outer to inner: the last axis holds consecutive ranks) and their sizes.
Each weight of a layer type is annotated ``replicate`` or ``split(dim, axis)`` (weights are
``[in, out]``; experts ``[expert, in, out]``; the embedding ``[vocab, d]``, the LM head
``[d, vocab]``); activations are annotated by the axes their batch dim (``batch``) and their
sequence dim (``sequence``) are split over; ``fsdp`` names axes the weights are *stored* sharded
over (gathered for use). Propagation and costs live in ``parsim.autoplan.sharding``.

The engine and the torch runtime run Megatron-style axes, so a scenario's ``[sharding]`` must be
one of the annotations those axes are (:func:`to_parallel_table`): Megatron TP (qkv/up/gate
``split(1, t)``, out/down ``split(0, t)``, embedding ``split(0, t)``, LM head ``split(1, t)``),
SP (``sequence = t``), CP (``sequence`` on another axis), FSDP (``fsdp`` = the batch axes),
EP (experts ``split(0, e)`` with ``e`` a batch axis) and a ``pipeline`` axis.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from parsim.errors import ConfigError

WEIGHTS = ("qkv", "out", "up", "gate", "down", "experts", "embedding", "lm_head")
"""Annotated weights of a layer type (``[sharding.weights]`` keys)."""
MEGATRON_DIM = {"qkv": 1, "up": 1, "gate": 1, "out": 0, "down": 0, "embedding": 0, "lm_head": 1}
"""The weight dim Megatron's tensor parallelism splits (column: out features; row: in features;
the embedding and the LM head over the vocabulary)."""
KEYS = ("mesh", "batch", "sequence", "fsdp", "pipeline", "weights")
_SPLIT = re.compile(r"^\s*split\(\s*(\d+)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$")


@dataclass(frozen=True)
class Annotation:
    """One tensor's placement: replicated, or one dim split over one mesh axis."""

    dim: int | None = None
    """The split dim (None: replicated)."""
    axis: str | None = None
    """The mesh axis it is split over (None: replicated)."""

    def __str__(self) -> str:
        return "replicate" if self.axis is None else f"split({self.dim}, {self.axis})"


REPLICATE = Annotation()


@dataclass(frozen=True)
class ShardingConfig:
    """The ``[sharding]`` table."""

    mesh: tuple[tuple[str, int], ...]
    """(axis name, size), outer to inner (the last axis is the innermost: consecutive ranks)."""
    batch: tuple[str, ...] = ()
    """Axes the activations' batch dim is split over (data parallelism)."""
    sequence: str | None = None
    """Axis the activations' sequence dim is split over (the tensor axis: SP; another: CP)."""
    fsdp: tuple[str, ...] = ()
    """Axes the weights are stored sharded over and gathered for use (ZeRO-3/FSDP)."""
    pipeline: str | None = None
    """Axis the layers are split over in stages (pipeline parallelism)."""
    weights: tuple[tuple[str, Annotation], ...] = ()
    """(weight, annotation) of each annotated weight; unlisted weights are replicated."""

    def size(self, axis: str) -> int:
        return dict(self.mesh)[axis]

    def weight(self, name: str) -> Annotation:
        return dict(self.weights).get(name, REPLICATE)


def parse_annotation(text, file: str, key: str) -> Annotation:
    """``"replicate"`` or ``"split(dim, axis)"`` -> Annotation (ConfigError otherwise)."""
    if text == "replicate":
        return REPLICATE
    m = _SPLIT.match(text) if isinstance(text, str) else None
    if m is None:
        raise ConfigError(file, key, f"expected \"replicate\" or \"split(dim, axis)\", got {text!r}")
    return Annotation(int(m.group(1)), m.group(2))


def _axes_list(t: dict, key: str, names, file: str) -> tuple[str, ...]:
    v = t.get(key, [])
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(a, str) for a in v):
        raise ConfigError(file, f"sharding.{key}", f"expected a list of mesh axis names, got {v!r}")
    for a in v:
        if a not in names:
            raise ConfigError(file, f"sharding.{key}", f"{a!r} is not a mesh axis ({', '.join(names)})")
    if len(set(v)) != len(v):
        raise ConfigError(file, f"sharding.{key}", f"names an axis twice: {v!r}")
    return tuple(v)


def _axis(t: dict, key: str, names, file: str) -> str | None:
    v = t.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or v not in names:
        raise ConfigError(file, f"sharding.{key}", f"expected a mesh axis name ({', '.join(names)}), got {v!r}")
    return v


def sharding_from_table(t: dict, file: str) -> ShardingConfig:
    """The ``[sharding]`` table, strictly: unknown keys, axes or weights are refused."""
    for k in t:
        if k not in KEYS:
            raise ConfigError(file, f"sharding.{k}", f"unknown key (known: {', '.join(KEYS)})")
    mesh = t.get("mesh")
    if not isinstance(mesh, dict) or not mesh:
        raise ConfigError(file, "sharding.mesh", "missing or empty: a table of axis = size, outer to inner "
                                                 "(mesh = {dp = 2, tp = 4})")
    for a, n in mesh.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(file, f"sharding.mesh.{a}", f"expected a positive integer size, got {n!r}")
    names = tuple(mesh)
    w = t.get("weights", {})
    if not isinstance(w, dict):
        raise ConfigError(file, "sharding.weights", "must be a table ([sharding.weights])")
    weights = []
    for k, v in w.items():
        if k not in WEIGHTS:
            raise ConfigError(file, f"sharding.weights.{k}", f"unknown weight (known: {', '.join(WEIGHTS)})")
        a = parse_annotation(v, file, f"sharding.weights.{k}")
        if a.axis is not None and a.axis not in names:
            raise ConfigError(file, f"sharding.weights.{k}", f"{a.axis!r} is not a mesh axis ({', '.join(names)})")
        if a.dim is not None and a.dim > (2 if k == "experts" else 1):
            raise ConfigError(file, f"sharding.weights.{k}", f"dim {a.dim} out of range for a "
                                                             f"{3 if k == 'experts' else 2}-D weight")
        weights.append((k, a))
    return ShardingConfig(tuple(mesh.items()), _axes_list(t, "batch", names, file), _axis(t, "sequence", names, file),
                          _axes_list(t, "fsdp", names, file), _axis(t, "pipeline", names, file), tuple(weights))


def tensor_axis(sc: ShardingConfig, file: str) -> str | None:
    """The one axis the dense weights are split over, Megatron's way (None: all replicated)."""
    split = {k: a for k, a in sc.weights if a.axis is not None and k != "experts"}
    axes = {a.axis for a in split.values()}
    if not axes:
        return None
    if len(axes) > 1:
        raise ConfigError(file, "sharding.weights", f"the dense weights are split over several axes "
                                                    f"({', '.join(sorted(axes))}): the engine runs one tensor axis")
    t = axes.pop()
    for k in ("qkv", "out", "up", "down"):
        a = sc.weight(k)
        if a.axis != t or a.dim != MEGATRON_DIM[k]:
            raise ConfigError(file, f"sharding.weights.{k}", f"{a} does not pair with the other splits over {t!r}: "
                                                             f"the engine runs Megatron's pairs (qkv, up, gate "
                                                             f"split(1, {t}); out, down split(0, {t}))")
    for k, a in split.items():
        if a.dim != MEGATRON_DIM[k]:
            raise ConfigError(file, f"sharding.weights.{k}", f"{a} is not Megatron's split(" f"{MEGATRON_DIM[k]}, {t})")
    return t


def to_parallel_table(sc: ShardingConfig, gpus: int, file: str) -> dict:
    """The ``[parallel]`` table the annotations amount to (ConfigError where they are none of
    Megatron TP/SP, CP, FSDP, EP, DP and PP, which the engine and the runtime run)."""
    size = dict(sc.mesh)
    world = 1
    for n in size.values():
        world *= n
    if world != gpus:
        raise ConfigError(file, "sharding.mesh", f"the mesh holds {world} devices but gpus = {gpus}")
    t = tensor_axis(sc, file)
    ex = sc.weight("experts")
    ep_axis = ex.axis
    if ep_axis is not None and (ex.dim != 0 or ep_axis not in sc.batch):
        raise ConfigError(file, "sharding.weights.experts", f"{ex}: experts split over their expert dim (0) on a "
                                                            "batch axis are expert parallelism; nothing else runs")
    cp_axis = sc.sequence if sc.sequence is not None and sc.sequence != t else None
    roles = {"batch": sc.batch, "tensor": (t,) if t else (), "pipeline": (sc.pipeline,) if sc.pipeline else (),
             "sequence": (cp_axis,) if cp_axis else ()}
    seen: dict[str, str] = {}
    for role, axes in roles.items():
        for a in axes:
            if a in seen:
                raise ConfigError(file, "sharding", f"axis {a!r} is both a {seen[a]} and a {role} axis")
            seen[a] = role
    for a, n in size.items():
        if a not in seen and n > 1:
            raise ConfigError(file, "sharding.mesh", f"axis {a!r} (size {n}) is used by no annotation "
                                                     "(batch, sequence, pipeline or a weight split)")
    if sc.fsdp and set(sc.fsdp) != set(sc.batch):
        raise ConfigError(file, "sharding.fsdp", f"{list(sc.fsdp)}: the engine shards weights over all batch axes "
                                                 f"{list(sc.batch)} (ZeRO-3) or none")
    if len(sc.batch) > 1 and any(a != b for a, b in zip(sc.batch, [n for n in size if n in sc.batch])):
        raise ConfigError(file, "sharding.batch", "batch axes must be listed in mesh order")
    inner = [a for a in size if size[a] > 1]
    pos = [inner.index(a) for a in sc.batch if a in inner]
    if pos and pos[-1] - pos[0] != len(pos) - 1:
        raise ConfigError(file, "sharding.batch", f"{list(sc.batch)} are not neighbours in the mesh "
                                                  f"{list(size)}: the engine's data-parallel axis is one stride")
    role_axis = {"dp": list(sc.batch), "tp": [t] if t else [], "pp": [sc.pipeline] if sc.pipeline else [],
                 "cp": [cp_axis] if cp_axis else []}
    dp = 1
    for a in sc.batch:
        dp *= size[a]
    par = {"dp": dp, "tp": size[t] if t else 1, "pp": size[sc.pipeline] if sc.pipeline else 1,
           "cp": size[cp_axis] if cp_axis else 1, "ep": size[ep_axis] if ep_axis else 1,
           "sequence_parallel": sc.sequence is not None and sc.sequence == t}
    if sc.fsdp:  # ZeRO-1/2 shard optimizer state, not a weight layout: [parallel] zero may state them
        par["zero"] = 3
    # the rank grid's order (slowest first) follows the mesh's axis order; axes of size 1 anywhere
    placed = []
    for a in size:
        for role, axes in role_axis.items():
            if a in axes and role not in placed:
                placed.append(role)
    rest = [r for r in ("dp", "pp", "cp", "tp") if r not in placed]
    order = rest + placed
    order.insert(order.index("tp"), "ep")
    par["order"] = order
    return par
