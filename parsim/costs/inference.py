"""Inference costs: one forward pass of one pipeline stage on one GPU, for the prefill (the
prompt's tokens at once) and for one decode step (one new token per sequence, attending to
the KV cache), from the same kernel models as training.

Per transformer block on one tensor-parallel rank:

* GEMMs (``parsim.model.shapes.layer_gemms``) with ``tokens`` rows: the device's GEMM model
  at 16-bit weights; with ``weight_bits`` 8 or 4 (weight-only quantisation, dequantised in
  the kernel) a roofline of the same FLOPs and the smaller weight bytes. A decode step has
  a few rows per GEMM, so it is bound by reading the weights from HBM;
* attention: prefill is FlashAttention over the prompt (causal); a decode step reads the
  cached K and V of every earlier token (``2 · context · kv_heads · head_dim`` elements per
  sequence) at streaming bandwidth;
* tensor parallelism: two all-reduces of the block's activations (Megatron's row/column
  split), on the topology's collective model;
* kernel launches: the device's launch overhead per kernel (decode at small batch is
  launch- and latency-bound).

Engines (``inference.engine``): "fused" is the above. "deepspeed-0.7" is DeepSpeed-Inference v0.7
kernel injection under Hugging Face ``generate`` (v0.7.3, the 2022 BLOOM benchmarks' release):

* BLOOM (ALiBi; ``config.bigscience_bloom``) runs its attention in PyTorch
  (``backup_attention`` in deepspeed/ops/transformer/inference/transformer_inference.py) with the
  Hugging Face cache: every decode step ``torch.cat`` copies each block's past K and V into a new
  tensor one token longer (a read of the past and a write of the new cache, besides the read by
  the attention), and ``generate`` holds the previous step's cache until the forward returns, so
  two caches are alive at the step's end. Other models' KV cache lives in the workspace;
* one workspace (``allocate_workspace`` in csrc/transformer/inference/csrc/pt_binding.cpp) of
  ``16 · d_model · batch · 128 + n · batch · 128 · d_model · 2`` elements (128: ``MAX_OUT_TOKES``;
  ``n`` = 1 for BLOOM, whose QKV GEMM passes ``num_layers`` 1, else every block: the KV cache),
  allocated at the first call with that call's batch and the full hidden size;
* kernels per block from the source (:data:`DS07_KERNELS`);
* its int8 GEMMs first write a 16-bit copy of the weight (``quantized_gemm``); its decode GEMMs
  stream the weight and then add their math at the device's ``ds07_decode_gemm_flops`` (a
  documented fit on published decode times, ``benchmarks/fit_ds07_gemm.py``; the device's GEMM
  model where a profile does not give it).

The embedding lookup is free; the LM head runs for one position per sequence (the next
token's logits), on the last stage. KV cache per GPU: ``2 · layers_on_stage · kv_heads/tp ·
head_dim · context · batch`` elements.

Hybrid models (``ModelSpec.hybrid_pattern``): only the attention layers cache K and V; a Mamba-2
layer keeps a fixed-size state per sequence instead (:func:`mamba_state_bytes`), whatever the
context. Its prefill runs the SSD scan over the prompt (``parsim.costs.ssd``); a decode step
updates the state in place (mamba_ssm's ``selective_state_update``: read and write the SSM state
and the convolution's window, memory-bound). A hybrid layer has one sub-layer: one all-reduce
under tensor parallelism and half a block's kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.cluster.collectives import fitted_line, ring_time, select_algorithm
from parsim.cluster.hardware import HardwareProfile
from parsim.costs.ssd import ScanShape, scan_times
from parsim.costs.gdn import DeltaShape, delta_times
from parsim.model import ModelSpec, has_attention, has_gdn, has_mamba, sublayers
from parsim.model.shapes import (
    attention_core_flops,
    embedding_params,
    head_gemm,
    head_params,
    layer_gemms,
    layer_params,
)

KERNELS_PER_LAYER = 12
"""Kernels one block launches at inference: norms, QKV, attention, out-projection, residual
adds, two or three FFN GEMMs, activation (documented estimate for fused inference engines)."""


DS07_MAX_TOKENS = 128
"""DeepSpeed-Inference v0.7's ``MAX_OUT_TOKES``: the tokens its workspace is sized for
(csrc/transformer/inference/includes/inference_cuda_layers.h, v0.7.3)."""

DS07_KERNELS = {"alibi": 21, "fused": 14}
"""Kernels one block launches per pass under DeepSpeed-Inference v0.7 (all-reduces apart), counted
in v0.7.3's transformer_inference.py and pt_binding.cpp. Both: QKV (layer norm, cuBLAS GEMM, bias:
3), attention output GEMM (1), MLP (residual layer norm, GEMM, bias-GELU: 3), down GEMM (1),
residual add (1). BLOOM's PyTorch attention: three ``contiguous`` chunks of the QKV split, three
transpose-reshape copies, two ``torch.cat`` of the cache, QK^T, DeepSpeed's ALiBi softmax, PV and
the context transpose (12). The fused ``softmax_context``: bias-add transform, QK^T, softmax, PV,
transform (5)."""


def engine_kernels(engine: str, model: ModelSpec) -> int:
    """Kernels one block launches per pass under ``engine``."""
    if engine == "deepspeed-0.7":
        return DS07_KERNELS["alibi" if model.position == "alibi" else "fused"]
    return KERNELS_PER_LAYER


def kv_concat(engine: str, model: ModelSpec) -> bool:
    """Whether the KV cache grows by concatenation (a new cache each step, the old one alive until
    the step ends): BLOOM under DeepSpeed-Inference v0.7."""
    return engine == "deepspeed-0.7" and model.position == "alibi"


def ds07_workspace_bytes(model: ModelSpec, batch: int, precision: str) -> float:
    """DeepSpeed-Inference v0.7's workspace on one GPU for ``batch`` sequences (``allocate_workspace``,
    v0.7.3): 16 activation buffers and the KV cache area (one block's for BLOOM, every block's
    otherwise), each for :data:`DS07_MAX_TOKENS` tokens at the full hidden size."""
    blocks = 1 if model.position == "alibi" else model.n_layers
    return (16 + 2 * blocks) * model.d_model * batch * DS07_MAX_TOKENS * act_bytes(precision)


@dataclass(frozen=True, kw_only=True)
class PassCost:
    """One forward pass of one stage on one GPU."""

    layer_s: tuple[float, ...]
    """Seconds per block of the stage (compute, attention, TP communication, launches)."""
    head_s: float
    """The LM head's seconds (last stage only, else 0)."""
    tp_comm_s: float
    """Of the total, tensor-parallel all-reduces."""
    weight_bytes: tuple[float, ...]
    """Weight bytes per block on this GPU (what streaming from CPU/NVMe must move)."""
    embedding_bytes: float
    """The embedding's weight bytes (first stage; what streaming fetches before the first block)."""
    head_bytes: float
    """The LM head's weight bytes (last stage; tied to the embedding or not, streaming fetches it
    again for the head: ZeRO-3 gathers a module's parameters for each module that uses them)."""
    resident_head_bytes: float
    """Embedding and head bytes this GPU keeps when the weights are resident (a tied pair once)."""

    @property
    def total_s(self) -> float:
        return sum(self.layer_s) + self.head_s


def act_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else (1 if precision == "fp8" else 2)


def _gemm_s(hw: HardwareProfile, m: int, n: int, k: int, count: int, precision: str, weight_bits: int,
            ds07: bool = False, decode: bool = False) -> float:
    """One GEMM of ``m`` rows over a ``k x n`` weight. ``ds07``: as DeepSpeed-Inference v0.7 runs
    it (pt_binding.cpp, v0.7.3): its int8 (``quantized_gemm``) first has a kernel write a 16-bit
    copy of the weight (reading the int8, writing the copy) for the 16-bit GEMM to read; and, for
    a ``decode`` step on a device that gives ``ds07_decode_gemm_flops``, the GEMM streams the
    weight, then adds its math at that rate (:attr:`~parsim.cluster.hardware.Device.ds07_decode_gemm_flops`)."""
    dev = hw.device
    gp = "fp16" if precision in ("fp8", "fp32") and "fp16" in dev.peak_flops else precision
    if "bf16" not in dev.peak_flops and gp == "bf16":
        gp = "fp16"
    if ds07:
        bw = dev.effective_memory_bandwidth
        copy = count * k * n * (weight_bits / 8 + 2) / bw + dev.kernel_launch_s if weight_bits < 16 else 0.0
        if decode and dev.ds07_decode_gemm_flops:
            stream = count * (2 * k * n + act_bytes(precision) * (m * k + m * n)) / bw  # 16-bit weight, input, output
            return copy + stream + 2.0 * m * n * k * count / dev.ds07_decode_gemm_flops + dev.kernel_launch_s
        return copy + dev.gemm_time(m, n, k, gp, count)
    if weight_bits == 16:
        return dev.gemm_time(m, n, k, gp, count)
    flops = 2.0 * m * n * k * count
    nbytes = count * (k * n * weight_bits / 8 + (m * k + m * n) * 2)
    return max(flops / (dev.peak(gp) * dev.gemm_efficiency), nbytes / dev.effective_memory_bandwidth)


SERVING_ALLREDUCE_MAX_BYTES = 8 * 2 ** 20
"""The largest all-reduce a serving engine runs through its own NVLink kernel (vLLM's
``CustomAllreduce(max_size=8192 * 1024)``; larger ones go through NCCL)."""
SERVING_ALLREDUCE_SIZES = (2, 4, 6, 8)
"""Tensor-parallel sizes that kernel serves (vLLM's ``CustomAllreduce._SUPPORTED_WORLD_SIZES``)."""


def tp_allreduce_s(hw: HardwareProfile, nbytes: float, tp: int, engine: str = "fused") -> float:
    """One all-reduce of ``nbytes`` over the first ``tp`` GPUs of a node. A serving engine
    (``engine = "fused"``) runs the small ones through its own NVLink kernel, captured in the
    decode's CUDA graph: priced by the profile's measured lines of it
    (``[calibration] collective_custom_all_reduce_<n>``: vLLM's CustomAllreduce,
    ``benchmarks/fit_nccl_intranode.py``) in the all-reduce ring formula, where the profile has
    them, the group fits in a node and is a size that kernel serves; everything else through NCCL
    (DeepSpeed-Inference v0.7 calls ``torch.distributed.all_reduce``)."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    if (engine == "fused" and tp in SERVING_ALLREDUCE_SIZES and tp <= hw.gpus_per_node
            and nbytes <= SERVING_ALLREDUCE_MAX_BYTES):
        line = fitted_line(hw, "custom_all_reduce", nbytes, tp)
        if line is not None:
            return ring_time("all_reduce", nbytes, tp, line)
    return select_algorithm(hw, "all_reduce", nbytes, list(range(tp)), concurrent=1)[1]


def _memo(cache: dict | None, key: tuple, compute):
    """``compute()``, kept in ``cache`` under ``key`` when a cache is given."""
    if cache is None:
        return compute()
    if key not in cache:
        cache[key] = compute()
    return cache[key]


def pass_cost(*, hw: HardwareProfile, model: ModelSpec, layers: tuple[int, ...], last_stage: bool,
              first_stage: bool, batch: int, new_tokens: int, context: int, tp: int, precision: str,
              weight_bits: int, kv_on_host: bool = False, cache: dict | None = None,
              replicated_head: bool = False, engine: str = "fused") -> PassCost:
    """A forward pass over ``layers`` for ``batch`` sequences of ``new_tokens`` new tokens each,
    attending to ``context`` tokens (prefill: new_tokens = context = the prompt; decode: 1 new
    token over the cache so far). ``cache``: a dict one generation request passes to every pass
    (the caller's state): the GEMMs' and all-reduces' times, which depend on the shapes only, are
    then computed once, not again for every layer of every decode step. ``replicated_head``: every
    tensor-parallel rank keeps the whole embedding and LM head and computes every logit
    (``inference.lm_head = "replicated"``). ``engine``: ``inference.engine`` (its kernel count and
    how its KV cache grows)."""
    dev = hw.device
    kernels = engine_kernels(engine, model)
    concat = kv_concat(engine, model)
    ds07 = engine == "deepspeed-0.7"  # its GEMMs: int8 dequantised first; decode GEMMs' own law
    decode = new_tokens == 1
    a = act_bytes(precision)
    tokens = batch * new_tokens
    out, wb = [], []
    tp_total = 0.0
    kv_elems = 2 * max(1, model.n_kv_heads // tp) * model.head_dim_
    for li in layers:
        if model.hybrid_pattern:
            out.append(_hybrid_layer_s(hw, model, li, batch, new_tokens, context, tp, precision, weight_bits,
                                       kv_on_host, cache, kernels))
            tp_total += sublayers(model, li) * _memo(cache, ("all_reduce", tokens * model.d_model * a, tp),
                                                      lambda: tp_allreduce_s(hw, tokens * model.d_model * a, tp))
            wb.append(_memo(cache, ("params", li), lambda li=li: layer_params(model, li)) / tp * weight_bits / 8)
            continue
        shapes = _memo(cache, ("shapes", li, tokens, tp),
                       lambda li=li: tuple((x.m, x.n, x.k, x.count) for x in layer_gemms(model, tokens, tp, li)))
        g = _memo(cache, ("gemms", shapes, precision, weight_bits, ds07, decode),
                  lambda shapes=shapes: sum(_gemm_s(hw, m, n, k, c, precision, weight_bits, ds07, decode)
                                            for m, n, k, c in shapes))
        if new_tokens > 1:  # prefill: fused causal attention over the prompt (half the s x s pairs)
            att = dev.attention_time(attention_core_flops(model, batch, new_tokens, tp, li) / 2, _fp(hw, precision))
        else:  # decode: read every cached K and V once
            kv = batch * context * kv_elems * a
            att = kv / (hw.pcie.effective_bandwidth if kv_on_host else dev.effective_memory_bandwidth)
            flops = 4.0 * batch * context * (model.n_heads / tp) * model.head_dim_  # QK^T and PV
            att += flops / (dev.peak(_fp(hw, precision)) * dev.attention_efficiency)
            if concat:  # torch.cat reads the past (context - 1 tokens) and writes the new cache
                att += batch * (2 * context - 1) * kv_elems * a / dev.effective_memory_bandwidth
        comm = 2 * _memo(cache, ("all_reduce", tokens * model.d_model * a, tp),
                         lambda: tp_allreduce_s(hw, tokens * model.d_model * a, tp, engine))
        tp_total += comm
        out.append(g + att + comm + kernels * dev.kernel_launch_s)
        wb.append(_memo(cache, ("params", li), lambda li=li: layer_params(model, li)) / tp * weight_bits / 8)
    head_tp = 1 if replicated_head else tp  # ranks sharing the vocabulary
    # DeepSpeed-Inference v0.7 quantises the blocks it injects; the embedding and head stay 16-bit
    head_bits = 16 if ds07 else weight_bits
    head = 0.0
    if last_stage:
        h = head_gemm(model, batch, head_tp)  # the next token's logits only
        head = _memo(cache, ("gemms", ((h.m, h.n, h.k, h.count),), precision, head_bits),
                     lambda: _gemm_s(hw, h.m, h.n, h.k, h.count, precision, head_bits)) + 2 * dev.kernel_launch_s
    wbytes = head_bits / 8 / head_tp
    emb = embedding_params(model) * wbytes  # token (+ position) table
    matrix = model.vocab_size * model.d_model * wbytes
    head_own = head_params(model) * wbytes  # final norm (+ the head matrix when untied)
    head_use = head_own + (matrix if model.tied_embeddings else 0.0)  # what the head gathers to run
    resident = (emb if first_stage else 0.0) + (head_own if last_stage else 0.0)
    if last_stage and not first_stage and model.tied_embeddings:
        resident += matrix  # the last stage keeps its own copy of the tied matrix
    return PassCost(layer_s=tuple(out), head_s=head, tp_comm_s=tp_total, weight_bytes=tuple(wb),
                    embedding_bytes=emb if first_stage else 0.0, head_bytes=head_use if last_stage else 0.0,
                    resident_head_bytes=resident)


def _hybrid_layer_s(hw: HardwareProfile, model: ModelSpec, li: int, batch: int, new_tokens: int, context: int,
                    tp: int, precision: str, weight_bits: int, kv_on_host: bool, cache: dict | None,
                    kernels: int) -> float:
    """Seconds of hybrid layer ``li`` in one pass (module docstring): its GEMMs, its attention (an
    attention layer) or its scan / state update (a Mamba layer), its one all-reduce, half a block's
    launches."""
    dev = hw.device
    a = act_bytes(precision)
    tokens = batch * new_tokens
    shapes = _memo(cache, ("shapes", li, tokens, tp),
                   lambda: tuple((x.m, x.n, x.k, x.count) for x in layer_gemms(model, tokens, tp, li)))
    t = _memo(cache, ("gemms", shapes, precision, weight_bits, False, new_tokens == 1),
              lambda: sum(_gemm_s(hw, m, n, k, c, precision, weight_bits) for m, n, k, c in shapes))
    if has_attention(model, li):
        if new_tokens > 1:
            t += dev.attention_time(attention_core_flops(model, batch, new_tokens, tp, li) / 2, _fp(hw, precision))
        else:
            kv = batch * context * 2 * max(1, model.n_kv_heads // tp) * model.head_dim_ * a
            t += kv / (hw.pcie.effective_bandwidth if kv_on_host else dev.effective_memory_bandwidth)
            t += 4.0 * batch * context * (model.n_heads / tp) * model.head_dim_ / (
                dev.peak(_fp(hw, precision)) * dev.attention_efficiency)
    elif has_mamba(model, li):
        if new_tokens > 1:  # the SSD scan over the prompt
            shape = ScanShape(tokens, max(1, model.mamba_heads // tp), model.mamba_head_dim, model.mamba_state_dim,
                              max(1, model.mamba_groups // tp), model.mamba_chunk)
            t += _memo(cache, ("scan", shape, precision), lambda: scan_times(dev, shape, precision)[0])
        else:  # the state update reads and writes each sequence's state in place
            t += 2 * batch * mamba_state_bytes(model, tp, precision) / dev.effective_memory_bandwidth
    elif has_gdn(model, li):
        if new_tokens > 1:  # the chunked delta rule over the prompt
            shape = DeltaShape(batch, new_tokens, max(1, model.gdn_value_heads // tp), model.gdn_key_dim,
                               model.gdn_value_dim, model.gdn_chunk)
            t += _memo(cache, ("delta", shape, precision), lambda: delta_times(dev, shape, precision)[0])
        else:  # fused_recurrent_gated_delta_rule: each sequence's state read and written in place
            t += 2 * batch * gdn_state_bytes(model, tp, precision) / dev.effective_memory_bandwidth
    comm = sublayers(model, li) * _memo(cache, ("all_reduce", tokens * model.d_model * a, tp),
                                        lambda: tp_allreduce_s(hw, tokens * model.d_model * a, tp))
    return t + comm + kernels / 2 * dev.kernel_launch_s


MAMBA_STATE_BYTES = 4
"""Bytes per element of a Mamba-2 layer's cached SSM state: fp32 (Hugging Face ``NemotronHConfig``'s
``mamba_ssm_cache_dtype = "float32"``; the state accumulates over the whole context)."""


def _recurrent_state_bytes(heads: int, per_head: int, conv_channels: int, conv_kernel: int, tp: int,
                           precision: str) -> float:
    """One sequence's recurrent state in one layer on one GPU: ``per_head`` fp32 elements for each of
    this rank's heads (of ``heads``) and the causal convolution's window (this rank's channels x
    ``conv_kernel - 1`` past inputs, at the activations' precision)."""
    state = max(1, heads // tp) * per_head * MAMBA_STATE_BYTES
    return state + conv_channels / tp * (conv_kernel - 1) * act_bytes(precision)


def mamba_state_bytes(model: ModelSpec, tp: int, precision: str) -> float:
    """The state one sequence keeps in one Mamba-2 layer on one GPU: the SSM state (this rank's heads
    x head dim x state size, fp32) and the causal convolution's window."""
    return _recurrent_state_bytes(model.mamba_heads, model.mamba_head_dim * model.mamba_state_dim,
                                  model.mamba_conv_channels, model.mamba_conv_kernel, tp, precision)


def gdn_state_bytes(model: ModelSpec, tp: int, precision: str) -> float:
    """The state one sequence keeps in one Gated DeltaNet layer on one GPU: a key dim x value dim
    matrix per value head (fp32, as Mamba's: Qwen3.5's ``mamba_ssm_dtype = "float32"``) and the
    convolution's window over q, k and v."""
    return _recurrent_state_bytes(model.gdn_value_heads, model.gdn_key_dim * model.gdn_value_dim,
                                  model.gdn_conv_channels, model.gdn_conv_kernel, tp, precision)


def cache_bytes_per_sequence(model: ModelSpec, layers: tuple[int, ...], tp: int, context: int,
                             precision: str) -> float:
    """What one sequence of ``context`` tokens caches on one GPU holding ``layers``: K and V in each
    attention layer (:func:`kv_bytes_per_sequence`) and, in a hybrid model, each Mamba-2 layer's
    fixed-size state (:func:`mamba_state_bytes`) and each Gated DeltaNet layer's (:func:`gdn_state_bytes`)."""
    if not model.hybrid_pattern:
        return kv_bytes_per_sequence(model, len(layers), tp, context, precision)
    attention = sum(1 for li in layers if has_attention(model, li))
    mamba = sum(1 for li in layers if has_mamba(model, li))
    gdn = sum(1 for li in layers if has_gdn(model, li))
    return (kv_bytes_per_sequence(model, attention, tp, context, precision)
            + mamba * mamba_state_bytes(model, tp, precision) + gdn * gdn_state_bytes(model, tp, precision))


def _fp(hw: HardwareProfile, precision: str) -> str:
    if precision == "bf16" and "bf16" in hw.device.peak_flops:
        return "bf16"
    return "fp16" if "fp16" in hw.device.peak_flops else "bf16"


def kv_bytes_per_sequence(model: ModelSpec, layers: int, tp: int, context: int, precision: str) -> float:
    """KV-cache bytes one sequence of ``context`` tokens keeps on one GPU holding ``layers`` blocks."""
    kv_heads = max(1, model.n_kv_heads // tp)
    return 2.0 * layers * kv_heads * model.head_dim_ * context * act_bytes(precision)


def workspace_bytes(model: ModelSpec, tp: int, batch: int, prompt: int, precision: str,
                    replicated_head: bool = False) -> float:
    """Transient activations of the prefill on one GPU: one block's widest tensors (the FFN's
    hidden, Q/K/V and the residual stream) for the prompt's tokens, plus the next-token logits
    (fp32; every logit on every rank with a replicated head)."""
    a = act_bytes(precision)
    tokens = batch * prompt
    widest = model.d_ff // tp + 3 * model.n_heads * model.head_dim_ // tp
    if model.mamba_heads:  # a Mamba layer's input projection and convolution outputs
        widest = max(widest, (model.mamba_in_proj_width + model.mamba_conv_channels) // tp)
    if model.gdn_value_heads:  # a DeltaNet layer's input projection and convolution outputs
        widest = max(widest, (model.gdn_in_proj_width + model.gdn_conv_channels) // tp)
    block = tokens * (widest + 2 * model.d_model) * a
    return block + batch * model.vocab_size / (1 if replicated_head else tp) * 4
