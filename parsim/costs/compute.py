"""A block's compute from kernel physics: every GEMM, the attention core and the memory-bound
ops, each through the kernel that runs it, with no end-to-end factor.

* GEMMs: each linear layer's forward ``(tokens x k) @ (k x n)``, its input gradient
  ``(tokens x n) @ (n x k)`` and its weight gradient ``(k x tokens) @ (tokens x n)`` through
  :meth:`~parsim.cluster.hardware.Device.gemm_time` (the kernel model of
  :mod:`parsim.cluster.kernels`: tiles, waves, Stream-K, the MAMF-calibrated main loop). Under
  FP8 the linear layers run at FP8 (MXFP8 on Blackwell's block-scaled path); the router and the
  LM head stay BF16 (Transformer Engine recipes).
* Attention: the device's fused kernel (FlashAttention-2 on A100, FlashAttention-3 on Hopper,
  FlashAttention-4 on Blackwell: ``device.attention_kernel``) with the real batch, sequence,
  heads and KV heads per TP rank, head dim and causal mask, forward and backward separately
  (:meth:`~parsim.cluster.hardware.Device.attention_kernel_time`); BF16 even under FP8 training.
  A sliding-window block costs the full causal kernel times the share of query-key pairs its
  window keeps (the kernel skips the blocks outside it, as it skips those above the diagonal).
  Under context parallelism each rank does 1/cp of the (load-balanced) causal work here;
  the ring's per-block kernels are ``parsim.costs.context``'s. Without FlashAttention the
  core is its batched GEMMs (QK^T, PV; four in the backward) through the GEMM model, the
  scores' HBM traffic costed by the caller.
* Memory-bound ops: :mod:`parsim.costs.memory_ops` (fused or eager; FP8 casts per recipe) at
  ``memory_bandwidth * memory_efficiency``, plus ``kernel_launch_s`` per kernel.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from parsim.cluster.precision import PRECISION_TABLE
from parsim.costs.inputs import LayerInputs
from parsim.costs.memory_ops import (
    MemoryWork,
    block_forward_work,
    default_fp8_recipe,
    fp8_cast_work,
    fp8_gemm_precision,
    fp8_promotion_time,
    legacy_layer_norm_work,
    non_tn_fp8_gemms,
    work_time,
)
from parsim.costs.gdn import DeltaShape, delta_times
from parsim.costs.ssd import ScanShape, scan_times
from parsim.model import attention_kind, causal_pairs, has_attention, has_gdn, has_mamba, sublayers

SEQUENCE_GATHERED_GEMMS = (("qkv", "q", "q_down", "kv_down", "mamba_in_proj"),
                           ("fc1", "gate", "up", "shared_fc1", "shared_gate", "shared_up"))
"""The column-parallel GEMMs whose input is sequence parallelism's all-gathered activation, by
site (the attention's, the MLP's; ``parsim.model.shapes`` names): in the backward Megatron
gathers each site's input again for its weight gradients, beside its input-gradient GEMMs."""
ROW_PARALLEL_GEMMS = ("attn_out", "fc2", "down", "shared_fc2", "shared_down", "mamba_out_proj")
"""The row-parallel GEMMs, whose output sequence parallelism reduce-scatters (their input
gradient runs on the all-gathered output gradient)."""
_GATHERED = frozenset(name for site in SEQUENCE_GATHERED_GEMMS for name in site)
BF16_ONLY = ("router",)
"""GEMMs kept in BF16 under FP8 training (the MoE router: Megatron computes it unquantised)."""
ATTENTION_BACKWARD_KERNELS = 3
"""FlashAttention's backward launches three kernels: ``D = rowsum(dO * O)``, the main loop, dQ's conversion."""


@dataclass(frozen=True)
class BlockCompute:
    """Compute seconds of one block, one microbatch, one GPU, by pass and kind of work."""

    gemm: tuple[float, float, float]
    """F, I, W seconds of the block's GEMMs."""
    attention: tuple[float, float]
    """F, I seconds of the attention core."""
    memory: tuple[float, float]
    """F, I seconds of memory-bound ops (FP8 casts included)."""
    kernels: tuple[int, int, int]
    """Kernel launches of F, I, W."""


def linear_precision(inp: LayerInputs) -> str:
    """Precision the block's linear GEMMs run at."""
    prec = inp.options.precision
    if prec != "fp8":
        return prec
    dev = inp.hardware.device
    return fp8_gemm_precision(fp8_recipe(inp), dev.peak_flops)


def gemm_precision(inp: LayerInputs, name: str) -> str:
    """Precision one of the block's GEMMs runs at (``BF16_ONLY`` ones stay 16-bit under FP8)."""
    if name in BF16_ONLY and inp.options.precision == "fp8":
        return "bf16"
    return linear_precision(inp)


def forward_gemm_time(inp: LayerInputs, gemms) -> float:
    """Seconds of these GEMMs' forward on the device's kernel model."""
    dev = inp.hardware.device
    return sum(dev.gemm_time(g.m, g.n, g.k, gemm_precision(inp, g.name), g.count) for g in gemms)


def fp8_recipe(inp: LayerInputs) -> str:
    """The FP8 recipe in force (the scenario's, else the device's default)."""
    return inp.options.fp8_recipe or default_fp8_recipe(inp.hardware.device.peak_flops)


def blockwise_fp8(inp: LayerInputs) -> bool:
    """FP8 training under the blockwise recipe (1x128 / 128x128 scales), whose every GEMM, the
    forward's too, promotes its partial sums on Hopper (:func:`~parsim.costs.memory_ops.fp8_promotion_time`)."""
    return inp.options.precision == "fp8" and fp8_recipe(inp) == "blockwise"


GATHERED_INPUT_BYTES: dict[str, float | None] = {
    "delayed": 1.0, "current": 1.0,       # per-tensor FP8: one byte, one fp32 scale per tensor
    "blockwise": 1.0 + 4.0 / 128,         # FP8 with one fp32 scale per 128 elements
    "mxfp8": 1.0 + 1.0 / 32,              # FP8 with one E8M0 scale per 32
    "nvfp4": 0.5 + 1.0 / 16,              # E2M1 (half a byte) with one E4M3 scale per 16
    "rowwise": None,                      # torchao.float8: casts after the gather (no quantized all-gather)
}
"""Bytes per element of a column-parallel linear's input as sequence parallelism all-gathers it
under each FP8 recipe: Transformer Engine quantizes the input before the gather and gathers the
quantized tensor with its scales (``transformer_engine/pytorch/distributed.py``:
``gather_along_first_dim`` has per-tensor FP8, FP8-blockwise, MXFP8 and NVFP4 all-gathers);
None: the gather moves the 16-bit activation."""


def tp_wire_bytes(inp: LayerInputs) -> tuple[float, float]:
    """(bytes per element of a sequence-parallel all-gather of a linear layer's input, bytes per
    element of every other tensor-parallel collective: the reduce-scatters and all-reduces of
    GEMM outputs, the backward's gradient collectives, the pipeline's and embedding's sends).
    Only the gathered inputs of the FP8 linears travel quantized; the GEMMs' outputs and every
    gradient are 16-bit (``activation_bytes``) under FP8 training too."""
    o = inp.options
    a = PRECISION_TABLE[o.precision].activation_bytes
    if o.precision != "fp8":
        return float(a), float(a)
    q = GATHERED_INPUT_BYTES.get(fp8_recipe(inp))
    return (float(a) if q is None else q), float(a)


def attention_precision(precision: str) -> str:
    """Attention runs in BF16 unless the job is FP16 (FP8 attention is not the recipes' default)."""
    return "fp16" if precision == "fp16" else "bf16"


def has_attention_kernel(inp: LayerInputs) -> bool:
    """The device names a fused attention kernel the model can cost (sm80 and later)."""
    kf = inp.hardware.device.kernels
    return kf is not None and kf.attention_kernel is not None


def _heads(inp: LayerInputs) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) per TP rank; MLA's head dim is the mean of its QK and V dims
    (the FLOPs of QK^T and PV then match ``attention_core_flops``)."""
    m, tp = inp.model, inp.shard.tp
    heads = max(1, m.n_heads // tp)
    kv = heads if m.is_mla else max(1, m.n_kv_heads // tp)  # MLA's up-projected K and V: a head per query head
    return heads, min(kv, heads), m.kernel_head_dim


@lru_cache(maxsize=4096)
def fused_attention_times(inp: LayerInputs) -> tuple[float, float]:
    """(forward, backward) seconds of one block's fused attention, averaged over the model's
    blocks (full and sliding-window blocks alternate in GPT-OSS; the mean is exact per model)."""
    m, sh, dev = inp.model, inp.shard, inp.hardware.device
    heads, kv, hd = _heads(inp)
    prec = attention_precision(inp.options.precision)
    s = sh.seq_len
    full = s * (s + 1) // 2
    out = [0.0, 0.0]
    for back in (False, True):
        t_full = dev.attention_kernel_time(sh.microbatch_size, s, s, heads, kv, hd, True, back, prec,
                                           inp.options.attention_kernel)
        shares = [causal_pairs(m, s, li) / full if attention_kind(m, li) != "full" else 1.0
                  for li in _distinct_layers(m)]
        out[back] = t_full * sum(shares) / len(shares) / sh.cp
    return out[0], out[1]


def _distinct_layers(m) -> range:
    return range(m.n_layers if m.layer_types is not None else 1)


def unfused_attention_gemms(inp: LayerInputs, backward: bool) -> float:
    """Seconds of the unfused attention core's batched GEMMs (the full s x s scores: eager
    attention masks, it does not skip): QK^T and PV forward; dV, dP, dQ, dK backward."""
    sh, dev = inp.shard, inp.hardware.device
    heads, _, hd = _heads(inp)
    prec = attention_precision(inp.options.precision) if inp.options.precision == "fp8" else inp.options.precision
    sq, sk, bh = sh.seq_len // sh.cp, sh.seq_len, sh.microbatch_size * heads
    fwd = dev.gemm_time(sq, sk, hd, prec, bh) + dev.gemm_time(sq, hd, sk, prec, bh)
    if not backward:
        return fwd
    return (dev.gemm_time(sk, hd, sq, prec, bh) + dev.gemm_time(sq, sk, hd, prec, bh)
            + dev.gemm_time(sq, hd, sk, prec, bh) + dev.gemm_time(sk, hd, sq, prec, bh))


def memory_work(inp: LayerInputs, moe_layer: bool) -> tuple[MemoryWork, MemoryWork]:
    """(forward, backward) memory-bound work of one block: norms, rotary, activation, residuals,
    dropout (fused or eager), and the FP8 casts of its linear layers."""
    m, sh, o = inp.model, inp.shard, inp.options
    a = PRECISION_TABLE[o.precision].activation_bytes
    fwd = block_forward_work(m, sh.tokens, sh.tp, sh.sequence_parallel, a, o.fused_kernels, o.dropout, moe_layer)
    bwd = fwd.scaled(2)
    if not o.persist_layer_norm and m.norm == "layernorm" and o.fused_kernels:  # Apex's earlier kernels
        lf, lb = legacy_layer_norm_work(m, sh.tokens, sh.tp, sh.sequence_parallel, a)
        fwd, bwd = fwd + lf, bwd + lb
    if o.precision == "fp8":
        cf, cb = fp8_cast_work(m, sh.tokens, sh.tp, fp8_recipe(inp), a, moe_layer, non_tn_fp8_gemms(inp.hardware.device))
        fwd, bwd = fwd + cf, bwd + cb
    return fwd, bwd


def attention_core_times(inp: LayerInputs) -> tuple[float, float]:
    """(forward, backward) kernel seconds of one block's attention core: the fused kernel where
    FlashAttention is on and the device names one, else the unfused core's batched GEMMs; none in a
    hybrid layer without attention."""
    if not has_attention(inp.model):
        return 0.0, 0.0
    if inp.options.flash_attention and has_attention_kernel(inp):
        return fused_attention_times(inp)
    return unfused_attention_gemms(inp, False), unfused_attention_gemms(inp, True)


@lru_cache(maxsize=4096)
def mamba_scan_times(inp: LayerInputs) -> tuple[float, float, int, int]:
    """(forward, backward seconds, forward, backward kernels) of one Mamba-2 layer's SSD scan on
    this rank (its heads and groups over tensor parallelism): :mod:`parsim.costs.ssd`; none in a
    layer without one."""
    m, sh = inp.model, inp.shard
    if not has_mamba(m):
        return 0.0, 0.0, 0, 0
    # under context parallelism the scan runs the whole sequence on this rank's 1/cp of the heads
    # (Megatron-Core's MambaContextParallel; a group's B and C repeated when cp exceeds the groups)
    split = sh.tp * sh.cp
    shape = ScanShape(sh.tokens * sh.cp, max(1, m.mamba_heads // split), m.mamba_head_dim, m.mamba_state_dim,
                      max(1, m.mamba_groups // split), m.mamba_chunk)
    return scan_times(inp.hardware.device, shape, inp.options.precision)


@lru_cache(maxsize=4096)
def gdn_delta_times(inp: LayerInputs) -> tuple[float, float, int, int]:
    """(forward, backward seconds, forward, backward kernels) of one Gated DeltaNet layer's delta
    rule on this rank (its value heads over tensor parallelism): :mod:`parsim.costs.gdn`; none in a
    layer without one. Under context parallelism the kernels run whole sequences on this rank's
    1/cp of the heads (Megatron-Core's GatedDeltaNet all-to-alls)."""
    m, sh = inp.model, inp.shard
    if not has_gdn(m):
        return 0.0, 0.0, 0, 0
    shape = DeltaShape(sh.microbatch_size, sh.seq_len, max(1, m.gdn_value_heads // (sh.tp * sh.cp)),
                       m.gdn_key_dim, m.gdn_value_dim, m.gdn_chunk)
    return delta_times(inp.hardware.device, shape, inp.options.precision)


def mixer_scan_times(inp: LayerInputs) -> tuple[float, float, int, int]:
    """A hybrid layer's recurrent mixer in the attention core's place: a Mamba-2 layer's SSD scan
    (:func:`mamba_scan_times`), a Gated DeltaNet layer's delta rule (:func:`gdn_delta_times`), else none."""
    if has_gdn(inp.model):
        return gdn_delta_times(inp)
    return mamba_scan_times(inp)


def overlap_chunks(inp: LayerInputs, name: str) -> tuple[tuple[int, int], tuple[int, int]]:
    """((chunks, streams) of the forward, (chunks, streams) of the input gradient) the block's
    GEMM ``name`` runs as: its overlapped sequence-parallel collective's chunks and how many of
    them run at once (``LayerInputs.options.tp_overlap_splits``), else one whole kernel."""
    sp = inp.options.tp_overlap_splits
    gather, scatter = (sp.gather, sp.gather_streams), (sp.scatter, sp.scatter_streams)
    if name in _GATHERED:
        return gather, (sp.scatter_dgrad, sp.scatter_streams)
    if name in ROW_PARALLEL_GEMMS:
        return scatter, gather
    return (1, 1), (1, 1)


def chunked_gemm_time(dev, m: int, n: int, k: int, precision: str, count: int, chunks: int,
                      streams: int = 1) -> float:
    """Seconds of ``count`` GEMMs ``(m x k) @ (k x n)`` run as ``chunks`` kernels over row blocks
    of ``m`` (when ``chunks`` does not divide ``m``, the last chunks take one row more each),
    ``streams`` of them in flight at once: each round of concurrent chunks fills the SMs as one
    GEMM over their rows would (their tiles share the waves; one kernel latency per round)."""
    if chunks <= 1 or m < chunks:
        return dev.gemm_time(m, n, k, precision, count)
    rows, rest = divmod(m, chunks)
    sizes = [rows + (i >= chunks - rest) for i in range(chunks)]
    s = max(1, streams)
    return sum(dev.gemm_time(sum(sizes[i:i + s]), n, k, precision, count) for i in range(0, chunks, s))


@lru_cache(maxsize=4096)
def block_compute(inp: LayerInputs, gemms: tuple, moe_layer: bool) -> BlockCompute:
    """Compute of one block from its GEMMs (``parsim.model.layer_gemms``, routed experts
    removed) and the device's kernels."""
    dev, o = inp.hardware.device, inp.options
    g_f = g_i = g_w = 0.0
    n_f = n_i = 0
    blockwise = blockwise_fp8(inp)
    for g in gemms:
        p = gemm_precision(inp, g.name)
        (c_f, s_f), (c_i, s_i) = overlap_chunks(inp, g.name)
        g_f += chunked_gemm_time(dev, g.m, g.n, g.k, p, g.count, c_f, s_f)
        g_i += chunked_gemm_time(dev, g.m, g.k, g.n, p, g.count, c_i, s_i)
        g_w += dev.gemm_time(g.k, g.n, g.m, p, g.count)
        if p == "fp8":  # split accumulation on Hopper: the gradients' GEMMs, and every blockwise one
            g_i += fp8_promotion_time(dev, g.m, g.k, g.n, g.count)
            g_w += fp8_promotion_time(dev, g.k, g.n, g.m, g.count)
            if blockwise:
                g_f += fp8_promotion_time(dev, g.m, g.n, g.k, g.count)
        n_f, n_i = n_f + c_f, n_i + c_i
    n_gemm = len(gemms)
    a_f, a_i = attention_core_times(inp)
    k_attn = (1, ATTENTION_BACKWARD_KERNELS) if o.flash_attention and has_attention_kernel(inp) else (2, 4)
    if not has_attention(inp.model):  # a hybrid layer: no attention core; a Mamba / DeltaNet mixer in its place
        s_f, s_i, k_f, k_i = mixer_scan_times(inp)
        a_f, a_i, k_attn = s_f, s_i, (k_f, k_i)
    mf, mb = memory_work(inp, moe_layer)
    # two TP collectives per pass (one per sub-layer) launch kernels too (NCCL), counted with the block's gaps
    tp_kernels = sublayers(inp.model) if inp.shard.tp > 1 else 0
    kernels = (n_f + k_attn[0] + mf.kernels + tp_kernels, n_i + k_attn[1] + mb.kernels + tp_kernels, n_gemm)
    return BlockCompute((g_f, g_i, g_w), (a_f, a_i), (work_time(dev, mf), work_time(dev, mb)), kernels)


def clear_caches() -> None:
    """Empty this module's caches (a cold start)."""
    for fn in (fused_attention_times, block_compute, mamba_scan_times, gdn_delta_times):
        fn.cache_clear()
