"""The one precision table: bytes per element of each number format, and what a training
precision implies for GEMM inputs/outputs, activations, weights and gradients.

Sources: IEEE 754 / bfloat16 / OCP FP8 (E4M3, E5M2) element sizes. FP8 training follows
Transformer Engine: GEMM inputs in fp8, GEMM outputs and activations between kernels in
bf16, weights and gradients kept in bf16 for the update path, fp32 master weights in the
optimizer state.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """What one training/compute precision stores, per element."""

    name: str
    """The key users type: bf16 | fp16 | fp32 | tf32 | fp8 | mxfp8 | nvfp4."""
    gemm_in_bytes: float
    """Bytes per element of a GEMM's inputs A and B (NVFP4: half a byte)."""
    gemm_out_bytes: int
    """Bytes per element of a GEMM's output C (fp8 GEMMs write bf16)."""
    activation_bytes: int
    """Bytes per element of activations kept between kernels (and sent between stages, TP/CP peers)."""
    weight_bytes: int
    """Bytes per parameter of the working weights (and of gradients). What travels between
    GPUs is ``activation_bytes`` (GEMM outputs, gradients, pipeline sends, K/V), except the
    inputs sequence parallelism all-gathers for an FP8 recipe's linears, which Transformer
    Engine gathers quantized (``parsim.costs.compute.tp_wire_bytes``)."""


PRECISION_TABLE: dict[str, Precision] = {p.name: p for p in (
    Precision("bf16", 2, 2, 2, 2),
    Precision("fp16", 2, 2, 2, 2),
    Precision("fp32", 4, 4, 4, 4),
    Precision("tf32", 4, 4, 4, 4),   # tensor-core GEMMs on fp32 tensors
    Precision("fp8", 1, 2, 2, 2),
    # OCP MX FP8 (Blackwell block-scaled GEMMs): fp8 elements plus one 8-bit scale per 32,
    # which the kernel model counts (parsim.cluster.kernels.INPUT_BYTES); elsewhere as fp8
    Precision("mxfp8", 1, 2, 2, 2),
    # NVFP4 (Blackwell block-scaled FP4, Transformer Engine ``NVFP4BlockScaling``): E2M1 elements
    # (half a byte) plus one E4M3 scale per 16, which the kernel model counts as it counts MXFP8's
    # (docs/features/low_precision_training/nvfp4); a GEMM precision only: the job trains with
    # ``precision = "fp8"``, ``fp8_recipe = "nvfp4"`` (TE runs it through its FP8 autocast),
    # activations and weights 16-bit as under FP8
    Precision("nvfp4", 0.5, 2, 2, 2),
)}
GEMM_PRECISIONS = tuple(PRECISION_TABLE)
"""Precisions a device profile may give a peak for (``<p>_tflops``)."""
TRAINING_PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
"""Precisions a scenario may train in (``training.precision``)."""
ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32",
           "float": "fp32", "float8": "fp8"}


def precision(name: str) -> Precision:
    """The table row of ``name`` (aliases accepted); ValueError for an unknown one."""
    p = ALIASES.get(name, name)
    if p not in PRECISION_TABLE:
        raise ValueError(f"unknown precision {name!r} (known: {', '.join(PRECISION_TABLE)})")
    return PRECISION_TABLE[p]
