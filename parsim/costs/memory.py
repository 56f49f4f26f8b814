"""Memory per GPU: model states (ZeRO stages x optimizer x precision) and activations.

Model states follow ZeRO (Rajbhandari et al. 2019): with Psi parameters on a GPU and
mixed precision, weights take 2*Psi bytes, gradients 2*Psi and the optimizer K*Psi
(K = 12 for Adam: fp32 master weights, momentum, variance). ZeRO-1 divides the K term
by the data-parallel degree N, ZeRO-2 also the gradients, ZeRO-3 everything.

Activations follow Korthikanti et al. 2022 ("Reducing activation recomputation"),
generalised here to grouped-query attention and SwiGLU by counting the same tensors:
per token and layer, 16-bit activations and 1-byte dropout masks,

  replicated over TP unless sequence parallel:  2 layer-norm inputs (4h), the QKV and
      FC1 inputs (4h), two dropout masks (2h, when dropout is on)      -> 10h for GPT
  sharded over TP:  Q, K, V (2q + 4kv), attention output (2q), MLP: GeLU input and
      FC2 input (4f) or SwiGLU gate, up and product (6f)               -> 24h for GPT
  attention scores (standard attention only): softmax 2as, its dropout mask as and
      output 2as                                                         -> 5as
      (without dropout only the softmax output, 2as, is kept)

Element sizes scale with the training precision (``ActivationOptions.bytes_per_element``:
4 for fp32 training doubles every 16-bit term; masks stay 1 byte).

which reproduces s*b*h*(34 + 5as/h) and its TP/SP/selective forms exactly for GPT.
FlashAttention (the default) never materialises the scores, so the 5as term is gone.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.parallel import grad_reduce_bytes
from parsim.config.scenario import DEFAULT_RECOMPUTE_MODULES
from parsim.model import ModelSpec

# Optimizer state bytes per parameter beyond weights and gradients (K in ZeRO's
# notation). Mixed precision keeps an fp32 master copy inside the optimizer state.
OPTIMIZER_STATE_BYTES_MIXED: dict[str, int] = {
    "sgd": 4,        # fp32 master weights
    "momentum": 8,   # master + momentum
    "adam": 12,      # master + m + v (ZeRO's K=12)
    "adamw": 12,
    "muon": 8,       # master + momentum (Muon keeps one buffer; orthogonalisation is transient)
    "adafactor": 4 + 1,  # master + factored second moment, ~1 byte/param amortised (documented estimate)
}
# Pure fp32 training: no master copy.
OPTIMIZER_STATE_BYTES_FP32: dict[str, int] = {
    "sgd": 0, "momentum": 4, "adam": 8, "adamw": 8, "muon": 4, "adafactor": 1,
}


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model state on one GPU."""

    params: float
    """Weights (in the compute precision; ZeRO-3: only this rank's shard)."""
    grads: float
    """Gradients (ZeRO-2/3: only this rank's shard)."""
    optimizer: float
    """Optimizer state incl. fp32 master weights (ZeRO-1/2/3: only this rank's shard)."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def state_bytes_per_param(optimizer: str, precision: str) -> tuple[int, int, int]:
    """(weight, gradient, optimizer) bytes per parameter."""
    w = PRECISION_TABLE[precision].weight_bytes  # fp8 training keeps bf16 weights/grads (Transformer Engine)
    table = OPTIMIZER_STATE_BYTES_FP32 if precision == "fp32" else OPTIMIZER_STATE_BYTES_MIXED
    return w, w, table[optimizer]


def model_state_bytes(n_params: float, dp: int, zero: int, optimizer: str = "adam",
                      precision: str = "bf16") -> ModelStates:
    """Per-GPU model states for ``n_params`` parameters held by this GPU before DP sharding."""
    w, g, k = state_bytes_per_param(optimizer, precision)
    p_w, p_g, p_k = n_params * w, n_params * g, n_params * k
    if zero >= 1:
        p_k /= dp
    if zero >= 2:
        p_g /= dp
    if zero >= 3:
        p_w /= dp
    return ModelStates(params=p_w, grads=p_g, optimizer=p_k)


@dataclass(frozen=True)
class ActivationOptions:
    """How activations are kept."""

    recompute: str = "none"
    """none | selective (the ``recompute_modules`` rerun) | op (torchtitan's op-level policy: block
    input, every other matmul output and the attention output kept) | full (only each layer's input kept)."""
    flash_attention: bool = True
    """FlashAttention-style kernel: the s x s scores are never stored."""
    sequence_parallel: bool = False
    """Norm/dropout activations sharded over tp (Korthikanti et al. 2022)."""
    dropout: bool = True
    """Dropout masks (1 byte per element) are stored; Llama-style training runs without dropout."""
    bytes_per_element: int = 2
    """Bytes of one stored activation element: 2 for 16-bit training (Korthikanti's setting),
    4 for fp32 training (every 16-bit term doubles; 1-byte dropout masks stay 1 byte)."""
    fp8_linear_inputs: bool = False
    """The linear layers keep their inputs for the weight gradient as the FP8 tensors their
    forward GEMM consumed, 1 byte per element (Transformer Engine under FP8: ``Linear`` saves
    the quantised ``inputmat``, ``LayerNormLinear`` its FP8 ``ln_out``; MXFP8 adds one 8-bit
    scale per 32 elements, neglected): the QKV and FC1 inputs, the projection's and FC2's."""
    quantized_input_bytes: float = 1.0
    """Bytes of one such saved element (1: FP8; NVFP4 keeps the column-wise 4-bit copy its weight
    gradient reads, half a byte and one E4M3 scale per 16: 0.5625)."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """Under ``recompute = "selective"``: the modules rerun (``parsim.config.scenario.RECOMPUTE_MODULES``; Megatron's
    default is the attention core alone)."""
    eager_modules: bool = False
    """The block runs as eager PyTorch modules (``training.fused_kernels = false``: Hugging Face's
    ``LlamaRMSNorm`` and ``act(gate) * up``), so autograd keeps what those ops save: each RMSNorm its
    fp32 upcast and its normalised output instead of the input alone (4 bytes a hidden element
    more), SwiGLU the SiLU output beside gate and up (one element of f more). Measured on an H200
    (reports/gpu/h200/accuracy.md): the eager Llama-3-8B and 70B TP-8 blocks keep exactly
    8 d + 2 f bytes a token more than the same blocks with fused-style saves."""


@dataclass(frozen=True)
class Stashed:
    """One tensor a block keeps from its forward for its backward, per token."""

    name: str
    """What it is (``attn_norm_in``, ``qkv``, ``mlp_act``, ...)."""
    bytes: float
    """Bytes per token before any tensor-parallel split."""
    split: str
    """How tensor parallelism divides it: ``sp`` (replicated over TP, sharded under sequence
    parallelism), ``tp`` (head- or FFN-sharded: always divided)."""
    dropped_by: tuple[str, ...] = ()
    """The recompute modules (``parsim.config.scenario.RECOMPUTE_MODULES``) that do not keep it."""


def block_stash(spec: ModelSpec, seq_len: int, opts: ActivationOptions, layer_index: int | None,
                routed: bool = True) -> tuple[Stashed, ...]:
    """The tensors one block keeps per token (Korthikanti et al.'s counting, tensor by tensor).

    Attention: the norm's input, its output (the QKV linear's input), Q/K/V, the attention output
    (the projection's input), with dropout a 1-byte mask; without FlashAttention the scores
    (softmax output 2as, with dropout its mask as and output 2as). MLA (Megatron's
    ``MLASelfAttention``): the separate input norm's output feeds the Q and KV down-projections;
    the latents and their norms' outputs (q_lora and kv_lora wide: the up-projections' inputs);
    the up-projected, rotated Q, K (heads x (nope + rope)) and V (heads x v) the core consumes;
    the attention output. MLP: the norm's input and output (FC1's input), the activation's
    input and output (SwiGLU: gate, up and their product, 3f; GeLU 2f), a mask with dropout.
    Sandwich norms (``block_norms`` 4) keep each sub-layer's output, their input; one norm shared
    by both branches (``block_norms`` 1) keeps nothing for the FFN's norm. An
    MoE block's pre-MLP norm is its own module (router and experts read its output); each token
    visits ``top_k`` routed experts (unless ``routed`` is false: the caller counts the dispatched
    rows) and the shared experts. Under FP8 the linear layers' inputs are their 1-byte copies.
    A hybrid layer keeps its one sub-layer's tensors (a Mamba-2 mixer: :func:`mamba_stash`).
    """
    from parsim.model import (
        block_kind,  # local: keeps import graph one-way at module load
        is_moe_layer,
    )

    h = spec.d_model
    e = opts.bytes_per_element
    lin = opts.quantized_input_bytes if opts.fp8_linear_inputs else e  # a linear layer's saved input, per element
    kind = block_kind(spec, layer_index)
    out: list[Stashed] = []
    if kind in ("T", "*"):
        out += _attention_stash(spec, seq_len, opts, lin)
    elif kind == "M":
        out += mamba_stash(spec, opts, lin)
    elif kind == "G":
        out += gdn_stash(spec, opts, lin)
    if kind in ("M", "G", "*", "T") and spec.block_norms == 4:  # sandwich norms (Gemma 2/3): each sub-layer's output normed before its add
        out.append(Stashed("post_attn_norm_in", e * h, "sp"))
    shared_norm = spec.block_norms == 1  # one norm feeds both branches: the FFN reads qkv_in's tensor
    if kind in ("T", "-", "E"):
        if not shared_norm:
            out.append(Stashed("mlp_norm_in", e * h, "sp"))
        moe = layer_index is not None and spec.is_moe and is_moe_layer(spec, layer_index)
        out += _ffn_stash(spec, opts, lin, moe, routed, shared_norm)
        if spec.block_norms == 4:
            out.append(Stashed("post_mlp_norm_in", e * h, "sp"))
        if opts.dropout:
            out.append(Stashed("mlp_mask", 1.0 * h, "sp"))
    if opts.eager_modules:
        # LlamaRMSNorm keeps its fp32 upcast (pow's and the scaling's input) and its normalised output
        # (the weight product's input) where a fused norm keeps the input: 4 bytes an element more
        # (under fp32 training the upcast is the input itself and the normalised output the extra)
        if spec.norm == "rmsnorm":
            out.append(Stashed("attn_norm_fp32" if kind != "-" and kind != "E" else "mlp_norm_fp32", 4.0 * h, "sp"))
            if kind == "T" and not shared_norm:
                out.append(Stashed("mlp_norm_fp32", 4.0 * h, "sp"))
            if spec.block_norms == 4:
                out.append(Stashed("post_norms_fp32", 2 * 4.0 * h, "sp"))
        gated = spec.ffn == "swiglu"
        moe = layer_index is not None and spec.is_moe and is_moe_layer(spec, layer_index)
        if gated and not moe and kind in ("T", "-"):  # act(gate) * up keeps act(gate) for the product's gradient
            out.append(Stashed("mlp_silu", e * spec.d_ff, "tp", ("mlp",)))
    return tuple(out)


def _attention_stash(spec: ModelSpec, seq_len: int, opts: ActivationOptions, lin: float) -> list[Stashed]:
    """The attention sub-layer's tensors (see :func:`block_stash`)."""
    h, e = spec.d_model, opts.bytes_per_element
    out: list[Stashed] = [Stashed("attn_norm_in", e * h, "sp")]
    if spec.is_mla:
        heads, qk = spec.n_heads, spec.qk_nope_head_dim + spec.qk_rope_head_dim
        out.append(Stashed("qkv_in", lin * h, "sp", ("layernorm",)))  # input norm is its own module
        latents = (spec.q_lora_rank + spec.kv_lora_rank) * (e + lin)  # down outputs, their norms' outputs
        out.append(Stashed("mla_latents", latents, "sp"))
        out.append(Stashed("qkv", e * heads * (2 * qk + spec.v_head_dim), "tp", ("mla_up_proj",)))
        out.append(Stashed("attn_out", lin * heads * spec.v_head_dim, "tp"))
    else:
        q = spec.n_heads * spec.head_dim_
        kv = spec.n_kv_heads * spec.head_dim_
        out.append(Stashed("qkv_in", lin * h, "sp"))  # norm fused into the QKV linear (TE LayerNormLinear)
        out.append(Stashed("qkv", e * (q + 2 * kv), "tp"))
        if spec.attn_output_gate:  # the gate's sigmoid input and the ungated output (the product's gradient)
            out.append(Stashed("attn_gate", 2 * e * q, "tp"))
        out.append(Stashed("attn_out", lin * q, "tp"))
    if opts.dropout:
        out.append(Stashed("attn_mask", 1.0 * h, "sp"))
    if not opts.flash_attention:
        # softmax output, plus with dropout its 1-byte mask and its output; without dropout the
        # softmax output is what the scores x V product keeps
        per_score = e + (1.0 + e if opts.dropout else 0.0)
        out.append(Stashed("scores", per_score * spec.n_heads * seq_len, "tp", ("core_attn",)))
    return out


def mamba_stash(spec: ModelSpec, opts: ActivationOptions, lin: float) -> list[Stashed]:
    """What a Mamba-2 layer keeps per token for its backward (Megatron-Core ``MambaMixer``, the
    default non-fused path): the pre-norm's input and output (the norm is fused into the input
    projection, Transformer Engine's ``LayerNormColumnParallelLinear``, which keeps both); the input
    projection's whole output -- z, x, B, C and dt are views of it and the gated norm, the
    convolution and the scan each keep one; the convolution's output (x, B, C after SiLU, which the
    scan keeps); the scan's fp32 cumulative decay ``dA_cumsum`` (one per head) and its output y;
    the gated norm's output (the output projection's input); a dropout mask with dropout."""
    h, e = spec.d_model, opts.bytes_per_element
    out = [Stashed("mamba_norm_in", e * h, "sp"),
           Stashed("mamba_in", lin * h, "sp"),
           Stashed("mamba_zxbcdt", e * spec.mamba_in_proj_width, "tp"),
           Stashed("mamba_conv_out", e * spec.mamba_conv_channels, "tp"),
           Stashed("mamba_scan", 4.0 * spec.mamba_heads + e * spec.mamba_inner, "tp"),
           Stashed("mamba_out_in", lin * spec.mamba_inner, "tp")]
    if opts.dropout:
        out.append(Stashed("mamba_mask", 1.0 * h, "sp"))
    return out


def gdn_stash(spec: ModelSpec, opts: ActivationOptions, lin: float) -> list[Stashed]:
    """What a Gated DeltaNet layer keeps per token for its backward (Megatron-Core ``GatedDeltaNet``
    with flash-linear-attention's kernels): the pre-norm's input and output (fused into the input
    projection, as a Mamba layer's); the input projection's whole output (q, k, v, z, beta and alpha
    are views of it; the convolution, the gates and the gated norm keep theirs); the convolution's
    output (q, k, v after SiLU) and the L2-normed q and k the kernel reads; the kernel's own saved
    tensors -- the fp32 gates (one a value head and token), beta, and the chunk's inverted
    triangular factor (C values a head and token) -- and its output; the gated norm's output (the
    output projection's input); a dropout mask with dropout."""
    h, e = spec.d_model, opts.bytes_per_element
    heads = spec.gdn_value_heads
    out = [Stashed("gdn_norm_in", e * h, "sp"),
           Stashed("gdn_in", lin * h, "sp"),
           Stashed("gdn_qkvzba", e * spec.gdn_in_proj_width, "tp"),
           Stashed("gdn_conv_out", e * (spec.gdn_conv_channels + 2 * spec.gdn_key_width), "tp"),
           Stashed("gdn_delta", heads * (4.0 + e + e * spec.gdn_chunk) + e * spec.gdn_value_width, "tp"),
           Stashed("gdn_out_in", lin * spec.gdn_value_width, "tp")]
    if opts.dropout:
        out.append(Stashed("gdn_mask", 1.0 * h, "sp"))
    return out


def _ffn_stash(spec: ModelSpec, opts: ActivationOptions, lin: float, moe: bool, routed: bool,
               shared_norm: bool) -> list[Stashed]:
    """The FFN sub-layer's tensors after its norm's input (see :func:`block_stash`)."""
    h, e = spec.d_model, opts.bytes_per_element
    gated = spec.ffn == "swiglu"
    out: list[Stashed] = []
    if not moe:
        f = spec.d_ff
        if not shared_norm:
            out.append(Stashed("mlp_in", lin * h, "sp", ("mlp",)))
        out.append(Stashed("mlp_act", (2 * f if gated else f) * e + f * lin, "tp", ("mlp",)))
    else:
        out.append(Stashed("moe_in", lin * h, "sp", ("layernorm",)))
        if spec.moe_latent_size:  # LatentMoE: the down projection's output and the up projection's input
            out.append(Stashed("moe_latent", (e + lin) * spec.moe_latent_size, "sp", ("moe",)))
        if routed:
            f = spec.d_ff_expert_
            out.append(Stashed("expert_fc1_out", spec.top_k * (2 * f if gated else f) * e, "tp", ("moe",)))
            out.append(Stashed("expert_act_out", spec.top_k * f * lin, "tp", ("moe", "moe_act")))
        if spec.n_shared_experts:
            f = spec.d_ff_shared_ * spec.n_shared_experts
            out.append(Stashed("shared_act", (2 * f if gated else f) * e + f * lin, "tp", ("moe", "shared_experts")))
    return out


def kept(t: Stashed, opts: ActivationOptions) -> bool:
    """Whether ``t`` stays in the stash under the options' recomputation."""
    return not (opts.recompute == "selective" and set(t.dropped_by) & set(opts.recompute_modules))


def _per_token(stash: tuple[Stashed, ...], tp: int, sp: bool) -> float:
    return sum(t.bytes / (tp if (t.split == "tp" or sp) else 1) for t in stash)


def layer_activation_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int = 1,
                           opts: ActivationOptions = ActivationOptions(),
                           layer_index: int | None = None, routed_rows: float | None = None,
                           expert_tp: int | None = None) -> float:
    """Activation bytes one layer stashes for one microbatch until its backward.

    ``seq_len`` is the sequence length this rank holds (divide by cp before calling).
    MoE layers: by default each token counts top_k routed experts sharded over tp (the
    balanced mean). With ``routed_rows`` (the token-expert assignments this rank's experts
    compute, e.g. the busiest expert-parallel rank's) the routed part is
    :func:`moe_dispatched_activation_bytes` of those rows instead. Selective recomputation
    leaves out what its modules rebuild (:func:`block_stash`'s ``dropped_by``).
    """
    tokens = seq_len * microbatch
    if opts.recompute == "full":
        per_token = opts.bytes_per_element * spec.d_model / (tp if opts.sequence_parallel else 1)
        return tokens * per_token
    routed = routed_rows is None
    if opts.recompute == "op":
        return tokens * op_checkpoint_bytes_per_token(spec, tp, opts, layer_index)
    stash = tuple(t for t in block_stash(spec, seq_len, opts, layer_index, routed) if kept(t, opts))
    out = tokens * _per_token(stash, tp, opts.sequence_parallel)
    if not routed and layer_index is not None and spec.is_moe and _is_moe(spec, layer_index):
        out += moe_dispatched_activation_bytes(spec, routed_rows, expert_tp or tp, opts)
    return out


def selective_dropped_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int, opts: ActivationOptions,
                            layer_index: int | None = None, routed_rows: float | None = None,
                            expert_tp: int | None = None) -> float:
    """Bytes of one layer's forward that selective recomputation did not keep and rebuilds in the
    backward (alive from the rerun until the layer's backward has consumed them)."""
    if opts.recompute != "selective":
        return 0.0
    none = replace(opts, recompute="none")
    return (layer_activation_bytes(spec, seq_len, microbatch, tp, none, layer_index, routed_rows, expert_tp)
            - layer_activation_bytes(spec, seq_len, microbatch, tp, opts, layer_index, routed_rows, expert_tp))


def op_checkpoint_bytes_per_token(spec: ModelSpec, tp: int, opts: ActivationOptions,
                                  layer_index: int | None = None) -> float:
    """Bytes per token one block keeps under torchtitan's op-level selective checkpointing.

    torchtitan (``parallelize_llama._apply_ac_to_transformer_block``, ``selective_ac_option = "op"``)
    wraps each block in ``checkpoint`` with a policy that saves the outputs of ``aten.mm`` and of
    the SDPA kernels (and ``abs``/``max`` for FP8 scales) and recomputes every other op; of the
    matmuls it saves only those at an odd position of a running per-block count. A Llama block
    runs seven (wq, wk, wv, wo, w1, w3, w2), so the saved set alternates between {wq, wv, w1, w2}
    and {wk, wo, w3} from one forward to the next; memory is the larger set. Kept: the block
    input (``checkpoint`` saves it), those matmul outputs, the attention output and its fp32
    log-sum-exp. A GeLU block (four matmuls: qkv, proj, fc1, fc2) saves qkv and fc1 each time.
    A routed-expert block (``layer_index`` one, as :func:`block_stash` decides) is counted as a
    dense block of the expert FFN width times the experts each token visits (the grouped expert
    GEMMs taken as matmuls); a MoE model's dense blocks keep their own FFN width.
    """
    h = spec.d_model
    q = spec.n_heads * spec.head_dim_ / tp
    kv = spec.n_kv_heads * spec.head_dim_ / tp
    if layer_index is not None and spec.is_moe and _is_moe(spec, layer_index):
        f = (spec.top_k * spec.d_ff_expert_ + spec.n_shared_experts * spec.d_ff_shared_) / tp
    else:
        f = spec.d_ff / tp
    e = opts.bytes_per_element
    if spec.ffn == "swiglu":
        saved = max(q + kv + f + h, kv + h + f)  # {wq, wv, w1, w2} vs {wk, wo, w3}
    else:
        saved = (q + 2 * kv) + f  # qkv, fc1: the first and third of four
    block_input = h / (tp if opts.sequence_parallel else 1)
    lse = 4.0 * spec.n_heads / tp  # fp32 log-sum-exp per head
    return e * (block_input + saved + q) + lse


def _is_moe(spec: ModelSpec, layer_index: int) -> bool:
    from parsim.model import is_moe_layer
    return is_moe_layer(spec, layer_index)


def moe_dispatched_activation_bytes(spec: ModelSpec, rows: float, expert_tp: int = 1,
                                    opts: ActivationOptions = ActivationOptions()) -> float:
    """Bytes the routed experts of one rank stash for ``rows`` dispatched token-expert assignments.

    Per assignment: the permuted expert input (d) and the expert output kept for the
    weighted combine's backward (d), plus the expert FFN's own tensors on its
    d_ff_expert / expert_tp shard (gelu 2f: activation input and FC2 input; swiglu 3f:
    gate, up and their product), all 16-bit elements (Korthikanti's counting). Selective
    recomputation of ``moe`` keeps none of them; of ``moe_act``, not FC2's input.
    """
    f = -(-spec.d_ff_expert_ // expert_tp)
    mlp = (3 * f if spec.ffn == "swiglu" else 2 * f)
    d = spec.expert_width  # LatentMoE: the experts' rows are latent-wide
    out = rows * (2 * d + mlp) * opts.bytes_per_element
    if opts.fp8_linear_inputs:  # the grouped GEMMs' inputs (permuted tokens, FC2's) kept in FP8
        out -= rows * (d + f) * (opts.bytes_per_element - opts.quantized_input_bytes)
    if opts.recompute == "selective" and "moe" in opts.recompute_modules:
        return 0.0  # the checkpointed MoE layer keeps only its input (counted with the block)
    if opts.recompute == "selective" and "moe_act" in opts.recompute_modules:
        out -= rows * f * (opts.quantized_input_bytes if opts.fp8_linear_inputs else opts.bytes_per_element)  # FC2's input
    return out


def layer_recompute_transient_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int,
                                    opts: ActivationOptions, layer_index: int | None = None) -> float:
    """Extra bytes alive while one layer is recomputed and back-propagated (full or op-level
    recompute: the block's whole forward set is rebuilt for its backward)."""
    if opts.recompute not in ("full", "op"):
        return 0.0
    return layer_activation_bytes(spec, seq_len, microbatch, tp, replace(opts, recompute="none"), layer_index)


def logits_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int) -> float:
    """The LM head's logits kept for the loss: fp32 upcast for a stable cross-entropy.

    Vocabulary-parallel over tp (Megatron); 4 bytes per logit.
    """
    return seq_len * microbatch * spec.vocab_size / tp * 4.0


def embedding_output_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int,
                           sequence_parallel: bool) -> float:
    """The embedding output (input of the first layer) kept on the first stage."""
    return 2.0 * seq_len * microbatch * spec.d_model / (tp if sequence_parallel else 1)


# ----------------------------------------------------------------------------- framework memory

ALLOCATOR_FRAGMENTATION = 0.15
"""Share of reserved memory the PyTorch caching allocator holds but cannot hand out
(1 - allocated/reserved). GMLake (Guo et al., ASPLOS 2024, "Efficient and Transparent GPU
Memory Defragmentation for Large-scale DNN Training with Virtual Memory Stitching") measures
this on eight LLM fine-tuning jobs on A100-80G and removes 15% of it on average (up to 33%)
by stitching virtual memory: we take that average as the fraction lost. Peak reserved
memory = peak allocated / (1 - ALLOCATOR_FRAGMENTATION)."""

NCCL_BUFFSIZE = 4 * 2**20
"""NCCL_BUFFSIZE's default (NCCL environment-variable docs): 4 MiB per channel and peer for
the Simple protocol."""
NCCL_CHANNELS = 16
"""Channels a communicator opens (NCCL picks 2-32 by topology; 16 is an estimate for an
NVLink ring on H100). Each channel of a ring holds a send and a receive buffer."""

DEEPSPEED_REDUCE_BUCKET = 5e8
"""DeepSpeed's ``reduce_bucket_size`` default (elements): ZeRO-1/2's gradient bucket."""


def nccl_buffer_bytes(n_communicators: int) -> float:
    """NCCL's buffers for ``n_communicators`` ring communicators (a send and a receive buffer
    per channel each)."""
    return n_communicators * 2 * NCCL_CHANNELS * NCCL_BUFFSIZE


def framework_states(framework: str, n_params: float, shard: int, zero: int, optimizer: str = "adam",
                     precision: str = "bf16", grad_per_microbatch: bool = False,
                     unit_params: float = 0.0, grad_dtype: str | None = None) -> dict[str, float]:
    """Per-GPU model states and state buffers, by kind, as each framework keeps them.

    ``n_params``: parameters this GPU holds before ZeRO sharding; ``shard``: the ranks ZeRO
    shards over (dp, or HSDP's dp_shard); ``unit_params``: the largest FSDP/ZeRO-3 unit
    (a block). Kinds: params, grads, optimizer, grad_buckets (gradients in flight to the
    reduction). Mixed precision with K optimizer bytes (12 for Adam: fp32 master, m, v):

    * ``zero`` -- the ZeRO paper's 2 + 2 + K per parameter, ZeRO dividing K (stage 1), the
      gradients (2) and the weights (3) by ``shard``; gradients reduced once per step are
      kept whole until then (zero >= 2 with ``grad_reduce = "step"``).
    * ``deepspeed`` -- DeepSpeed's estimator (docs "Memory Requirements"): ZeRO-1/2
      ``4 P + 16 P / N`` (16-bit weights and gradients, fp32 master, m, v and the fp32
      gradient partition), ZeRO-3 ``18 P / N + 4 L`` (with L the largest layer: its gathered
      16-bit parameters -- the unit buffers the UNSHARD actions hold -- and its 16-bit
      gradients, here grad_buckets).
    * ``megatron`` -- Megatron-LM with bf16: 16-bit weights, fp32 main gradients (its
      default for bf16; ``grad_reduce_bytes``, ``grad_dtype`` overriding), the distributed
      optimizer's fp32 main parameters, m and v divided by N (zero = 1): 6 + 12/N bytes per
      parameter (Megatron's distributed-optimizer docs).
    * ``fsdp`` -- FSDP2 with bf16 compute and fp32 reduction (torchtitan's default): fp32
      sharded parameters and gradients and Adam's m, v, all over N (16 P / N); the 16-bit
      gathered units are the UNSHARD actions' buffers; a unit's 16-bit gradient and its fp32
      reduce-scatter input are in flight per microbatch (grad_buckets); with gradients
      reduced per step the unsharded 16-bit gradients stay whole.
    """
    w, g, k = state_bytes_per_param(optimizer, precision)
    P, N = n_params, max(1, shard)
    if framework == "zero":
        ms = model_state_bytes(P, N, zero, optimizer, precision)
        grads = ms.grads if (zero < 2 or grad_per_microbatch) else P * g
        return {"params": ms.params, "grads": grads, "optimizer": ms.optimizer, "grad_buckets": 0.0}
    if framework == "deepspeed":
        if zero == 3:
            return {"params": w * P / N, "grads": 4 * P / N, "optimizer": k * P / N, "grad_buckets": g * unit_params}
        opt = k * P / N if zero >= 1 else k * P
        if zero >= 1:  # the fp32 gradient partition, and the 16-bit gradients (reduce buffer)
            return {"params": w * P, "grads": g * P + 4 * P / N, "optimizer": opt, "grad_buckets": 0.0}
        return {"params": w * P, "grads": g * P, "optimizer": opt, "grad_buckets": 0.0}
    if framework == "megatron":
        main = grad_reduce_bytes(framework, precision, grad_dtype)
        return {"params": w * P, "grads": main * P, "optimizer": k * P / (N if zero >= 1 else 1), "grad_buckets": 0.0}
    if framework == "fsdp":
        opt = max(0, k - 4)  # Adam's m and v: the fp32 master copy *is* the sharded parameter
        if grad_per_microbatch:
            bucket = (g + 4) * unit_params  # a unit's 16-bit gradient and its fp32 reduce-scatter input
            return {"params": 4 * P / N, "grads": 4 * P / N, "optimizer": opt * P / N, "grad_buckets": bucket}
        return {"params": 4 * P / N, "grads": 4 * P / N + g * P, "optimizer": opt * P / N, "grad_buckets": 0.0}
    raise ValueError(framework)
