"""Uplink encodings of a client's update: exact bits sent and client operations added.

Konečný, McMahan, Yu, Richtárik, Suresh, Bacon 2016, "Federated Learning: Strategies for
Improving Communication Efficiency" (arXiv:1610.05492):

* structured updates (the client trains the update in a restricted space):
  - ``low_rank``: each d1 x d2 update is H = A B with A (d1 x k) drawn from a seed and only
    B (k x d2) trained and sent: k·d2 values instead of d1·d2 (ratio k/d1); a tensor with
    d1 <= k (a bias) is sent whole;
  - ``random_mask``: a random sparsity pattern drawn from a seed; ceil(f·n) values sent;
* sketched updates (the full update, compressed after training):
  - ``subsample``: a random subset of ceil(f·n) values, positions from a seed;
  - ``quantize``: b bits per value plus the tensor's min and max (two float32), stochastic
    rounding; with ``rotation`` a random Hadamard rotation (random signs from a seed, then a
    fast Walsh-Hadamard transform) first, which needs each tensor padded to a power of two,
    so b bits go on the padded length.

Every seed replacing a random object is one 32-bit integer per update. Steps chain in order
(e.g. ``["subsample", "quantize"]``: quantize the values the subsample kept). Client work is
counted in operations on values (one per random draw or arithmetic pass over a value):
low rank draws A (d1·k), a mask or subsample draws one number per candidate value,
quantization makes three passes (min/max, scale, stochastic rounding), the rotation one
sign pass and log2(n) butterfly passes over the padded length. Not modelled: the change in
local training cost of a factorised layer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from parsim.model import ModelSpec, layer_gemms, total_params

METHODS = ("none", "low_rank", "random_mask", "subsample", "quantize")
STRUCTURED = ("low_rank", "random_mask")
SEED_BITS = 32
FLOAT_BITS = 32
QUANTIZE_PASSES = 3


@dataclass(frozen=True)
class Tensor:
    """One tensor of the update (a d1 x d2 matrix, or 1 x n for a vector), ``count`` times."""

    rows: int
    """d1: the input dimension (1 for a vector)."""
    cols: int
    """d2: the output dimension (the length of a vector)."""
    count: int = 1
    """How many tensors of this shape."""

    @property
    def size(self) -> int:
        return self.rows * self.cols * self.count


@dataclass(frozen=True)
class Encoding:
    """What one client's compressed update costs."""

    bits: int
    """Bits sent up per update, seeds and per-tensor floats included."""
    bits_per_param: float
    """bits / parameters."""
    ops: float
    """Client operations the encoding adds (see the module docstring)."""
    values_sent: int
    """Values sent (before quantization's bits)."""


def check_chain(methods: tuple[str, ...]) -> str | None:
    """Why a chain of steps cannot be applied, or None."""
    if len(set(methods)) != len(methods):
        return f"a step appears twice in {list(methods)}"
    structured = [m for m in methods if m in STRUCTURED]
    if len(structured) > 1:
        return "low_rank and random_mask are two structures for the same update: choose one"
    if structured and methods[0] != structured[0]:
        return f"{structured[0]} (a structured update, fixed while training) must come first"
    if "quantize" in methods and methods[-1] != "quantize":
        return "quantize must be the last step"
    return None


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def encode(tensors: tuple[Tensor, ...], methods: tuple[str, ...], *, rank: int | None = None,
           keep_fraction: float | None = None, bits: int | None = None, rotation: bool = False,
           weight_bits: int = 32) -> Encoding:
    """The exact encoding of an update made of ``tensors`` by the steps ``methods``."""
    problem = check_chain(methods)
    if problem:
        raise ValueError(problem)
    params = sum(t.size for t in tensors)
    # state per tensor group: (values per tensor, count, rows, cols)
    state = [(t.rows * t.cols, t.count, t.rows, t.cols) for t in tensors]
    ops, seeds, total = 0.0, 0, None
    for m in methods:
        if m == "low_rank":
            seeds += 1
            ops += sum(r * min(rank, r) * c for _, c, r, _ in state)
            state = [(min(rank, r) * d2, c, min(rank, r), d2) for _, c, r, d2 in state]
        elif m in ("random_mask", "subsample"):
            seeds += 1
            ops += sum(v * c for v, c, _, _ in state)
            state = [(math.ceil(keep_fraction * v), c, 1, math.ceil(keep_fraction * v)) for v, c, _, _ in state]
        elif m == "quantize":
            seeds += 1 if rotation else 0
            ops += sum(QUANTIZE_PASSES * v * c for v, c, _, _ in state)
            if rotation:
                ops += sum(_pow2(v) * (math.log2(_pow2(v)) + 1) * c for v, c, _, _ in state)
            total = sum(((_pow2(v) if rotation else v) * bits + 2 * FLOAT_BITS) * c for v, c, _, _ in state)
    values = sum(v * c for v, c, _, _ in state)
    if total is None:
        total = values * weight_bits
    total += seeds * SEED_BITS
    return Encoding(bits=int(total), bits_per_param=total / params, ops=float(ops), values_sent=int(values))


def model_tensors(spec: ModelSpec) -> tuple[Tensor, ...]:
    """A transformer's update as tensors: each block's weight matrices (input x output features,
    experts with their multiplicity), the embedding table, an untied LM head, and one vector
    holding everything else (norms, biases, sinks) so that the sizes sum to total_params."""
    groups: dict[tuple[int, int], int] = {}
    for i in range(spec.n_layers):
        for g in layer_gemms(spec, 1, 1, layer_index=i if spec.is_moe else None):
            groups[(g.k, g.n)] = groups.get((g.k, g.n), 0) + g.count
    groups[(spec.vocab_size, spec.d_model)] = groups.get((spec.vocab_size, spec.d_model), 0) + 1
    if not spec.tied_embeddings:
        groups[(spec.d_model, spec.vocab_size)] = groups.get((spec.d_model, spec.vocab_size), 0) + 1
    out = [Tensor(rows=r, cols=c, count=n) for (r, c), n in groups.items()]
    rest = total_params(spec) - sum(t.size for t in out)
    if rest < 0:  # a layout the GEMM list over-counts: send the model as one vector instead
        return (Tensor(rows=1, cols=total_params(spec)),)
    if rest:
        out.append(Tensor(rows=1, cols=rest))
    return tuple(out)
