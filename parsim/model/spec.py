"""ModelSpec: what is trained, validated on construction (the fields and their checks)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from numbers import Integral, Real

from parsim.errors import ConfigError

FFN_KINDS = ("gelu", "swiglu")


POSITION_KINDS = ("rope", "learned", "alibi", "none")


ATTENTION_KINDS = ("full", "sliding", "chunked")


NORM_KINDS = ("rmsnorm", "layernorm")


QK_NORM_WIDTHS = ("head", "projection")


BLOCK_NORMS = (1, 2, 4)


HYBRID_SYMBOLS = {"M": "Mamba-2 mixer", "G": "Gated DeltaNet mixer", "*": "self-attention", "-": "MLP",
                  "E": "mixture of experts"}
"""The layers of a hybrid model (``ModelSpec.hybrid_pattern``), Megatron-Core's symbols
(``megatron/core/ssm/mamba_hybrid_layer_allocation.py``) and "G", parsim's for a Gated DeltaNet
linear-attention mixer (Megatron-Core builds those models as GPT blocks with
``--experimental-attention-variant gated_delta_net``; each such block is a "G" or "*" layer and its
FFN layer here): each is one pre-norm sub-layer with its residual add, not a whole transformer block."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (dense or mixture-of-experts). Validated on construction."""

    name: str
    """Human-readable name (preset name or the HF directory name)."""
    n_layers: int
    """Transformer blocks L."""
    d_model: int
    """Hidden size D."""
    n_heads: int
    """Query heads N."""
    n_kv_heads: int
    """Key/value heads K (== n_heads for MHA, fewer for GQA/MQA)."""
    d_ff: int
    """Hidden size F of a dense FFN (unused when every layer is MoE)."""
    vocab_size: int
    """Vocabulary V (embedding rows, LM-head outputs)."""
    ffn: str = "gelu"
    """"gelu" (2 matrices, GPT style) or "swiglu" (3 matrices gate/up/down; also stands for GeGLU)."""
    head_dim: int | None = None
    """Per-head dimension; default d_model // n_heads (MLA: qk_nope + qk_rope)."""
    tied_embeddings: bool = False
    """LM head shares the token-embedding matrix."""
    position: str = "rope"
    """"rope" or "alibi" (no weights; ALiBi is BLOOM's), "learned" (adds
    (max_seq_len + position_offset) * d_model to the embedding), or "none" (no position encoding:
    Nemotron-H's attention layers, Megatron ``--position-embedding-type none``)."""
    max_seq_len: int = 4096
    """Longest sequence (only sizes learned position tables; training seq_len is separate)."""
    norm: str = "rmsnorm"
    """"rmsnorm" (d params) or "layernorm" (2d params: scale and shift; d when norm_shift is false)."""
    bias: bool = False
    """Biases on every linear layer except the LM head (GPT-2/3, Megatron GPT)."""
    n_experts: int = 0
    """Routed experts per MoE layer; 0 = dense model."""
    top_k: int = 1
    """Routed experts each token goes to."""
    n_shared_experts: int = 0
    """Always-on shared experts per MoE layer (DeepSeek, Qwen-MoE)."""
    d_ff_expert: int | None = None
    """Hidden size of one routed expert; default d_ff."""
    moe_every: int = 1
    """Layer i >= first_dense_layers is MoE when (i - first_dense_layers) % moe_every == 0."""
    first_dense_layers: int = 0
    """Leading dense layers before the first MoE layer (DeepSeek first_k_dense_replace)."""
    capacity_factor: float = 1.25
    """Expert capacity factor (token dropping); kept for the cost model, not used in counts."""
    expert_groups: int = 0
    """Group-limited routing (DeepSeek-V3's node-limited routing; HF ``n_group``, Megatron-Core's
    ``--moe-router-num-groups``): the routed experts fall into this many equal groups of
    consecutive experts, and a token's top_k experts come from ``expert_groups_per_token`` of
    them. 0 or 1: no grouping."""
    expert_groups_per_token: int = 0
    """Groups a token's experts may come from (HF ``topk_group``, ``--moe-router-group-topk``;
    DeepSeek-V3: 4 of 8, so a token reaches at most 4 nodes when a group is a node)."""
    # --- additions beyond the shared brief (all neutral by default) ---
    qkv_bias: bool = False
    """Biases on q/k/v only (Qwen2 style); bias=True already implies them."""
    qk_norm: bool = False
    """A norm on q and on k before the attention core (Qwen3, Gemma 3, OLMo-2): its weights are
    ``qk_norm_width``'s; no GEMM."""
    fused_qkv: bool = False
    """The reference (Hugging Face) implementation projects q, k and v with one linear layer
    (BLOOM's and GPT-NeoX's ``query_key_value``, GPT-2's ``c_attn``) rather than three (OPT,
    Llama): the same parameters, but one module for frameworks that fetch weights module by
    module (DeepSpeed ZeRO-3's parameter fetch: ``parsim.infer.zero_fetch``)."""
    d_ff_shared: int | None = None
    """Hidden size of one shared expert; default d_ff_expert (Qwen2-MoE uses a separate size)."""
    moe_latent_size: int = 0
    """LatentMoE (Nemotron 3 Super / Ultra; HF and Megatron-Core ``moe_latent_size``): the routed
    experts work in a latent space of this width -- each token is projected down from d_model
    before the dispatch (``fc1_latent_proj``) and back up after the combine (``fc2_latent_proj``),
    so the all-to-alls carry latent-wide rows and each expert is latent x d_ff_expert. The router
    and the shared experts stay on d_model. 0: experts on d_model."""
    q_lora_rank: int = 0
    """MLA: rank of the query down-projection (0 = plain query projection)."""
    kv_lora_rank: int = 0
    """MLA: rank of the joint key/value down-projection; > 0 turns MLA on (DeepSeek-V2/V3)."""
    qk_nope_head_dim: int = 0
    """MLA: per-head query/key dimension without rotary embedding."""
    qk_rope_head_dim: int = 0
    """MLA: per-head query/key dimension with rotary embedding (the key part is shared by heads)."""
    v_head_dim: int = 0
    """MLA: per-head value dimension."""
    # --- per-layer attention and the families beyond Llama (all neutral by default) ---
    layer_types: tuple[str, ...] | None = None
    """Attention of each block, one entry per layer: "full"; "sliding" (a query sees the
    sliding_window most recent keys, itself included: GPT-OSS, Mistral-style); "chunked"
    (a query sees the keys of its own attention_chunk-token chunk: Llama 4). None = all full."""
    sliding_window: int = 0
    """Keys a query of a "sliding" layer sees (tokens, itself included); 0 when no layer slides."""
    attention_chunk: int = 0
    """Chunk length of "chunked" layers (tokens); 0 when no layer is chunked."""
    attention_sinks: bool = False
    """A learned sink logit per query head in each block's softmax (GPT-OSS): n_heads
    parameters per block, no GEMM."""
    embedding_norm: bool = False
    """A norm right after the token embedding (BLOOM's word_embeddings_layernorm)."""
    position_offset: int = 0
    """Rows of a learned position table beyond max_seq_len (OPT keeps 2 for its padding offset)."""
    parallel_residual: bool = False
    """Attention and MLP read the same block input and add into one residual (GPT-NeoX, GPT-J).
    Weights, GEMM shapes and FLOPs are those of the sequential block; recorded for the cost model."""
    block_norms: int = 2
    """Normalization layers per block: 2 (one before attention, one before the FFN); 4 for
    Gemma 2's and 3's sandwich norms (each sub-layer's output is normed again before its
    residual add); 1 where one norm feeds attention and FFN side by side (Falcon-7B's parallel
    block, Cohere's Command R). Weights, memory-bound work and stashed norm inputs follow it."""
    norm_shift: bool = True
    """A LayerNorm's additive shift (its bias, d weights): false for LayerNorm with a scale only
    (Cohere, DBRX, MPT's ``no_bias``). RMSNorm has none either way."""
    qk_norm_width: str = "head"
    """Weights of the q/k norms (when ``qk_norm``): "head", one head_dim-wide weight for all query
    heads and one for all key heads (Qwen3, Gemma 3), 2 * head_dim a block; "projection", over
    the whole q and k projections (OLMo-2, OLMoE; Cohere's per-head LayerNorms),
    (n_heads + n_kv_heads) * head_dim a block."""
    mtp_layers: int = 0
    """Multi-token prediction depths trained beside the model (DeepSeek-V3's MTP modules,
    Megatron-Core's ``--mtp-num-layers``, HF ``num_nextn_predict_layers``). Depth k joins the
    normed hidden state of depth k-1 with the normed embedding of the token k places ahead
    (``eh_proj``: 2 d_model -> d_model), runs one block of the last block's kind and predicts
    through the shared output head: per depth one more block, a projection, three norms, an
    embedding lookup and an LM head and loss pass. The embedding and head are shared, so
    ``total_params`` leaves MTP out (DeepSeek's 671B) and ``mtp_params`` counts it."""
    mtp_pattern: str = ""
    """A hybrid model's multi-token prediction block: its layers' symbols (Megatron-Core's
    ``mtp_hybrid_override_pattern``, HF ``mtp_layers_block_type``; Nemotron 3: "*E", an attention
    and an MoE layer). Each of the ``mtp_layers`` depths runs these layers in place of one block
    of the last block's kind. "" for transformer models."""
    mtp_shared: bool = False
    """The depths share one set of MTP weights, the same block run ``mtp_layers`` times
    (Megatron-Core's ``mtp_use_repeated_layer``; Nemotron 3 Super's recipe trains 2 depths on the
    checkpoint's one): compute and activations per depth, weights once."""
    hybrid_pattern: str = ""
    """Hybrid state-space models (Nemotron-H, Nemotron 3): one symbol per layer, Megatron-Core's
    ``--hybrid-override-pattern`` and Hugging Face's ``hybrid_override_pattern`` -- "M" a Mamba-2
    mixer, "*" self-attention, "-" an MLP (``d_ff``, ``ffn``), "E" an MoE layer (the ``n_experts``
    fields); each layer is a pre-norm, its one sub-layer and a residual add. "" (the default):
    every layer is a transformer block (attention and an FFN)."""
    mamba_heads: int = 0
    """Mamba-2 heads H of each "M" layer (Megatron ``--mamba-num-heads``, HF ``mamba_num_heads``);
    the mixer's inner width is ``mamba_heads * mamba_head_dim``."""
    mamba_head_dim: int = 64
    """Channels P per Mamba-2 head (``--mamba-head-dim``, HF ``mamba_head_dim``; Megatron's default 64)."""
    mamba_state_dim: int = 128
    """SSM state size N (``--mamba-state-dim``, HF ``ssm_state_size``; Megatron's default 128)."""
    mamba_groups: int = 8
    """Groups G sharing one B and one C projection (``--mamba-num-groups``, HF ``n_groups``;
    Megatron's default 8); divides ``mamba_heads``."""
    mamba_conv_kernel: int = 4
    """Width of the causal depthwise convolution over x, B and C (HF ``conv_kernel``; Megatron's
    ``d_conv`` 4)."""
    mamba_chunk: int = 128
    """Chunk length Q of the SSD scan kernels (HF ``chunk_size``; Megatron's ``chunk_size`` 128):
    quadratic attention-like work within a chunk, a state passed between chunks."""
    gdn_key_heads: int = 0
    """Query and key heads of each Gated DeltaNet ("G") layer (Megatron ``--linear-num-key-heads``,
    HF ``linear_num_key_heads``); repeated over the value heads they serve."""
    gdn_value_heads: int = 0
    """Value heads of each "G" layer (``--linear-num-value-heads``, HF ``linear_num_value_heads``): the
    heads the delta-rule kernel runs, each with a ``gdn_key_dim`` x ``gdn_value_dim`` state."""
    gdn_key_dim: int = 128
    """Channels of a query / key head (``--linear-key-head-dim``, HF ``linear_key_head_dim``; 128)."""
    gdn_value_dim: int = 128
    """Channels of a value head (``--linear-value-head-dim``, HF ``linear_value_head_dim``; 128)."""
    gdn_conv_kernel: int = 4
    """Width of the causal depthwise convolution over q, k and v (``--linear-conv-kernel-dim``,
    HF ``linear_conv_kernel_dim``; 4)."""
    gdn_chunk: int = 64
    """Chunk length of the chunked delta-rule kernels (flash-linear-attention's
    ``chunk_gated_delta_rule``: 64, which Megatron-Core and Transformers call)."""
    attn_output_gate: bool = False
    """Attention's output is gated, ``attn * sigmoid(gate)`` before the output projection, the gate
    projected beside the query (Qwen3-Next, Qwen3.5: HF ``attn_output_gate``, Megatron
    ``--attention-output-gate``): the query projection is twice as wide."""
    not_modelled: tuple[str, ...] = ()
    """Parts of the source architecture that the counts and FLOPs leave out, one line each
    (e.g. DeepSeek-V3.2's lightning indexer), so that reports can say so."""

    def __post_init__(self) -> None:
        # TOML and JSON give lists: store tuples so the spec stays hashable and comparable
        for key in ("layer_types", "not_modelled"):
            v = getattr(self, key)
            if isinstance(v, list):
                object.__setattr__(self, key, tuple(v))
        _validate(self)

    # ---- derived ----
    @property
    def head_dim_(self) -> int:
        """Effective head dimension (query/key dimension for MLA)."""
        if self.head_dim is not None:
            return self.head_dim
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.d_model // self.n_heads

    @property
    def kernel_head_dim(self) -> int:
        """Head dimension a fused-attention kernel runs at: MLA's is the mean of its QK and V dims
        (the FLOPs of QK^T and PV then match ``attention_core_flops``)."""
        if self.is_mla:
            return (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) // 2
        return self.head_dim_

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def d_ff_expert_(self) -> int:
        return self.d_ff_expert if self.d_ff_expert is not None else self.d_ff

    @property
    def expert_width(self) -> int:
        """Width of the token rows the routed experts read and write and the dispatch carries:
        ``moe_latent_size`` under LatentMoE, else d_model."""
        return self.moe_latent_size or self.d_model

    @property
    def d_ff_shared_(self) -> int:
        return self.d_ff_shared if self.d_ff_shared is not None else self.d_ff_expert_

    @property
    def n_moe_layers(self) -> int:
        return sum(is_moe_layer(self, i) for i in range(self.n_layers))

    @property
    def n_dense_layers(self) -> int:
        return self.n_layers - self.n_moe_layers

    @property
    def is_hybrid(self) -> bool:
        """Layers are single sub-layers named by ``hybrid_pattern`` (Nemotron-H)."""
        return bool(self.hybrid_pattern)

    @property
    def mamba_inner(self) -> int:
        """Inner width of a Mamba-2 mixer, heads x head dim (Megatron's ``d_inner``)."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_channels(self) -> int:
        """Channels of the causal convolution: x, B and C (``d_inner + 2 * ngroups * d_state``)."""
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state_dim

    @property
    def mamba_in_proj_width(self) -> int:
        """Output features of a Mamba-2 mixer's input projection: z, x, B, C and dt
        (``2 * d_inner + 2 * ngroups * d_state + nheads``, Megatron's ``MambaMixer.in_proj``)."""
        return 2 * self.mamba_inner + 2 * self.mamba_groups * self.mamba_state_dim + self.mamba_heads

    @property
    def gdn_key_width(self) -> int:
        """Width of a Gated DeltaNet layer's queries (and of its keys): key heads x key dim."""
        return self.gdn_key_heads * self.gdn_key_dim

    @property
    def gdn_value_width(self) -> int:
        """Width of a Gated DeltaNet layer's values (and of its output gate z): value heads x value dim."""
        return self.gdn_value_heads * self.gdn_value_dim

    @property
    def gdn_conv_channels(self) -> int:
        """Channels of a Gated DeltaNet layer's convolution: q, k and v (not z)."""
        return 2 * self.gdn_key_width + self.gdn_value_width

    @property
    def gdn_in_proj_width(self) -> int:
        """Output features of a Gated DeltaNet layer's input projection: q, k, v, z, beta and alpha
        (Megatron-Core's ``in_proj``, ``2 qk_dim + 2 v_dim + 2 Hv``; HF's in_proj_qkvz and in_proj_ba)."""
        return 2 * self.gdn_key_width + 2 * self.gdn_value_width + 2 * self.gdn_value_heads

    @property
    def ffn_matrices(self) -> int:
        """Weight matrices per FFN: 2 (gelu) or 3 (swiglu)."""
        return 3 if self.ffn == "swiglu" else 2


# ---------------------------------------------------------------- validation
_POS_INT = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size",
            "max_seq_len", "top_k", "moe_every", "block_norms", "mamba_head_dim", "mamba_state_dim",
            "mamba_groups", "mamba_conv_kernel", "mamba_chunk", "gdn_key_dim", "gdn_value_dim",
            "gdn_conv_kernel", "gdn_chunk")


MAX_LAYERS = 100_000
"""Most blocks a model may have: 100x the deepest published transformer (DeepNet, 1,000 layers);
the per-layer cost tables and stage partitions are sized by it."""


_OPT_POS_INT = ("head_dim", "d_ff_expert", "d_ff_shared")


MAX_MTP_LAYERS = 64
"""Most multi-token prediction depths a model may have (each is a whole block on the last stage)."""


MAX_WIDTH = 2**24
"""Widest dimension a model may have (d_model, FFN and expert widths, vocabulary, heads, head and
latent dimensions): 64x the largest published vocabulary (Gemma 3: 262,144) and 200x the widest FFN
(PaLM 540B: 73,728); beyond it the FLOP and byte counts describe no trainable model."""
MAX_POSITIONS = 2**27
"""Longest position table or attention window (the 2^27-token sequence a scenario may train)."""
_WIDTHS = ("d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "head_dim", "d_ff_expert", "d_ff_shared",
           "moe_latent_size",
           "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mamba_heads",
           "mamba_head_dim", "mamba_state_dim", "mamba_groups", "mamba_conv_kernel", "mamba_chunk", "gdn_key_heads",
           "gdn_value_heads", "gdn_key_dim", "gdn_value_dim", "gdn_conv_kernel", "gdn_chunk")


MAX_EXPERTS = 4096
"""Most routed experts a model may have (10x the largest production MoE, Kimi-K2's 384): the MoE
cost model walks every expert's rows (4,096: ~3 s a scenario; 65,536 took 43 s)."""
_NONNEG_INT = ("n_experts", "n_shared_experts", "first_dense_layers", "q_lora_rank",
               "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
               "sliding_window", "attention_chunk", "position_offset", "mtp_layers", "expert_groups",
               "expert_groups_per_token", "mamba_heads", "moe_latent_size", "gdn_key_heads", "gdn_value_heads")


_BOOL = ("tied_embeddings", "bias", "qkv_bias", "qk_norm", "attention_sinks", "embedding_norm",
         "parallel_residual", "fused_qkv", "norm_shift", "mtp_shared", "attn_output_gate")


_CHOICES = {"ffn": FFN_KINDS, "position": POSITION_KINDS, "norm": NORM_KINDS, "qk_norm_width": QK_NORM_WIDTHS,
            "block_norms": BLOCK_NORMS}


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(ModelSpec))


def _is_int(v: object) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


def _validate(s: ModelSpec) -> None:
    def bad(key: str, problem: str) -> ConfigError:
        return ConfigError(None, f"model.{key}", problem)

    if not isinstance(s.name, str) or not s.name:
        raise bad("name", f"expected a non-empty string, got {s.name!r}")
    for key in _POS_INT + _OPT_POS_INT + _NONNEG_INT:
        v = getattr(s, key)
        if v is None and key in _OPT_POS_INT:
            continue
        if not _is_int(v):
            raise bad(key, f"expected an integer, got {v!r}")
        if v < 0 or (v == 0 and key not in _NONNEG_INT):
            raise bad(key, f"must be {'>= 0' if key in _NONNEG_INT else 'positive'}, got {v}")
    for key in _WIDTHS:
        v = getattr(s, key)
        if v is not None and v > MAX_WIDTH:
            raise bad(key, f"{v:,} is more than parsim models ({MAX_WIDTH:,})")
    if s.n_shared_experts > MAX_EXPERTS:
        raise bad("n_shared_experts", f"{s.n_shared_experts:,} is more than parsim models ({MAX_EXPERTS:,})")
    for key in ("max_seq_len", "position_offset", "sliding_window", "attention_chunk"):
        if getattr(s, key) > MAX_POSITIONS:
            raise bad(key, f"{getattr(s, key):,} is more than parsim models ({MAX_POSITIONS:,} positions)")
    if s.mtp_layers > MAX_MTP_LAYERS:
        raise bad("mtp_layers", f"{s.mtp_layers} is more than parsim models ({MAX_MTP_LAYERS}; "
                  "DeepSeek-V3 trains 1)")
    if s.n_layers > MAX_LAYERS:
        raise bad("n_layers", f"{s.n_layers:,} blocks is more than parsim models ({MAX_LAYERS:,}; per-layer tables)")
    for key in _BOOL:
        if not isinstance(getattr(s, key), bool):
            raise bad(key, f"expected true or false, got {getattr(s, key)!r}")
    for key, allowed in _CHOICES.items():
        if getattr(s, key) not in allowed:
            raise bad(key, f"{getattr(s, key)!r} is not one of {', '.join(map(str, allowed))}")
    cf = s.capacity_factor
    if not isinstance(cf, Real) or isinstance(cf, bool) or not 0 < cf < math.inf:
        raise bad("capacity_factor", f"expected a positive finite number, got {cf!r}")
    if s.n_heads % s.n_kv_heads:
        raise bad("n_kv_heads", f"n_heads={s.n_heads} is not divisible by n_kv_heads={s.n_kv_heads}")
    if s.head_dim is None and not s.is_mla and s.d_model % s.n_heads:
        raise bad("n_heads", f"d_model={s.d_model} is not divisible by n_heads={s.n_heads} (give head_dim)")
    if s.q_lora_rank and not s.is_mla:  # the query down-projection is part of MLA; alone it was silently unused
        raise bad("q_lora_rank", f"{s.q_lora_rank} needs kv_lora_rank > 0 (multi-head latent attention)")
    if s.is_mla:
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(s, key) <= 0:
                raise bad(key, "must be positive when kv_lora_rank > 0 (MLA)")
    if s.n_experts > MAX_EXPERTS:
        raise bad("n_experts", f"{s.n_experts:,} is more than parsim models ({MAX_EXPERTS:,}: the grouped-GEMM model "
                  "costs every expert's rows)")
    if s.is_moe and s.top_k > s.n_experts:
        raise bad("top_k", f"top_k={s.top_k} exceeds n_experts={s.n_experts}")
    if s.expert_groups > 1:
        if not s.is_moe or s.n_experts % s.expert_groups:
            raise bad("expert_groups", f"{s.expert_groups} groups must divide n_experts={s.n_experts}")
        if not 1 <= s.expert_groups_per_token <= s.expert_groups:
            raise bad("expert_groups_per_token",
                      f"must be 1..expert_groups={s.expert_groups}, got {s.expert_groups_per_token}")
        if s.expert_groups_per_token * (s.n_experts // s.expert_groups) < s.top_k:
            raise bad("expert_groups_per_token", f"{s.expert_groups_per_token} groups of "
                      f"{s.n_experts // s.expert_groups} experts cannot hold top_k={s.top_k}")
    if s.moe_latent_size and not s.is_moe:
        raise bad("moe_latent_size", f"{s.moe_latent_size} needs routed experts (n_experts > 0)")
    if s.first_dense_layers > s.n_layers:
        raise bad("first_dense_layers", f"{s.first_dense_layers} exceeds n_layers={s.n_layers}")
    _validate_attention(s, bad)
    _validate_hybrid(s, bad)
    if not isinstance(s.not_modelled, tuple) or not all(isinstance(x, str) and x for x in s.not_modelled):
        raise bad("not_modelled", f"expected a list of non-empty strings, got {s.not_modelled!r}")


def _validate_attention(s: ModelSpec, bad) -> None:
    if s.attn_output_gate is True and s.is_mla:
        raise bad("attn_output_gate", "a gated attention output is modelled for multi-head / grouped-query "
                  "attention, not multi-latent attention")
    if s.layer_types is None:
        return
    if not isinstance(s.layer_types, tuple) or len(s.layer_types) != s.n_layers:
        raise bad("layer_types", f"expected a list of {s.n_layers} entries (one per layer), got {s.layer_types!r}")
    for i, kind in enumerate(s.layer_types):
        if kind not in ATTENTION_KINDS:
            raise bad("layer_types", f"entry {i} is {kind!r}, not one of {', '.join(ATTENTION_KINDS)}")
    if "sliding" in s.layer_types and s.sliding_window <= 0:
        raise bad("sliding_window", "must be positive when a layer is \"sliding\"")
    if "chunked" in s.layer_types and s.attention_chunk <= 0:
        raise bad("attention_chunk", "must be positive when a layer is \"chunked\"")


def _validate_hybrid(s: ModelSpec, bad) -> None:
    p = s.hybrid_pattern
    if not isinstance(p, str):
        raise bad("hybrid_pattern", f"expected a string of layer symbols, got {p!r}")
    if not isinstance(s.mtp_pattern, str):
        raise bad("mtp_pattern", f"expected a string of layer symbols, got {s.mtp_pattern!r}")
    if s.mtp_shared and not s.mtp_layers:
        raise bad("mtp_shared", "shares the weights of multi-token prediction depths: needs mtp_layers > 0")
    if not p:
        if s.mamba_heads:
            raise bad("mamba_heads", "Mamba-2 layers need hybrid_pattern (their \"M\" layers)")
        if s.gdn_value_heads or s.gdn_key_heads:
            raise bad("gdn_value_heads" if s.gdn_value_heads else "gdn_key_heads",
                      "Gated DeltaNet layers need hybrid_pattern (their \"G\" layers)")
        if s.mtp_pattern:
            raise bad("mtp_pattern", "names hybrid layers: needs hybrid_pattern")
        return
    if len(p) != s.n_layers:
        raise bad("hybrid_pattern", f"{len(p)} symbols for n_layers={s.n_layers} (one per layer)")
    odd = sorted(set(p) - set(HYBRID_SYMBOLS))
    if odd:
        raise bad("hybrid_pattern", f"symbol {odd[0]!r} is not one of "
                  + ", ".join(f"{k!r} ({v})" for k, v in HYBRID_SYMBOLS.items()))
    if "M" in p and s.mamba_heads <= 0:
        raise bad("mamba_heads", "must be positive when hybrid_pattern has Mamba (\"M\") layers")
    if s.mamba_heads and s.mamba_heads % s.mamba_groups:
        raise bad("mamba_groups", f"{s.mamba_groups} groups must divide mamba_heads={s.mamba_heads}")
    if "G" in p + s.mtp_pattern:
        for key in ("gdn_key_heads", "gdn_value_heads"):
            if getattr(s, key) <= 0:
                raise bad(key, "must be positive when hybrid_pattern has Gated DeltaNet (\"G\") layers")
        if s.gdn_value_heads % s.gdn_key_heads:
            raise bad("gdn_key_heads", f"{s.gdn_key_heads} key heads must divide gdn_value_heads={s.gdn_value_heads} "
                      "(each serves an equal run of value heads)")
    if "E" in p and not s.is_moe:
        raise bad("hybrid_pattern", "has MoE (\"E\") layers but n_experts is 0")
    odd = sorted(set(s.mtp_pattern) - set(HYBRID_SYMBOLS))
    if odd:
        raise bad("mtp_pattern", f"symbol {odd[0]!r} is not one of {', '.join(HYBRID_SYMBOLS)}")
    if s.mtp_layers and not s.mtp_pattern:
        raise bad("mtp_pattern", "a hybrid model's multi-token prediction block: give its layers (e.g. \"*E\")")
    if ("E" in s.mtp_pattern and not s.is_moe) or ("M" in s.mtp_pattern and s.mamba_heads <= 0):
        raise bad("mtp_pattern", f"{s.mtp_pattern!r} names layers the model has no sizes for")
    if s.is_moe and "E" not in p and len(set(p)) > 1:  # (one kind throughout: a layer of a mixed model, uniform_model)
        raise bad("n_experts", f"{s.n_experts} experts but hybrid_pattern has no MoE (\"E\") layer")
    # the pattern names every layer's kind: the fields that would name them otherwise must keep their defaults
    for key, default in (("moe_every", 1), ("first_dense_layers", 0), ("layer_types", None),
                         ("block_norms", 2), ("parallel_residual", False)):
        if getattr(s, key) != default:
            raise bad(key, f"not modelled with hybrid_pattern (each hybrid layer is one pre-norm sub-layer; "
                      f"{key} must stay {default!r})")


# ---------------------------------------------------------------- parameter counts
def block_kind(spec: ModelSpec, layer_index: int | None = None) -> str:
    """What layer ``layer_index`` is: "T" a transformer block (attention and an FFN, every layer of a
    model without ``hybrid_pattern``), else its hybrid symbol ("M", "G", "*", "-", "E"). None: layer 0."""
    if not spec.hybrid_pattern:
        return "T"
    if layer_index is None:
        return spec.hybrid_pattern[0]
    if not 0 <= layer_index < spec.n_layers:
        raise ValueError(f"layer_index {layer_index} out of range 0..{spec.n_layers - 1}")
    return spec.hybrid_pattern[layer_index]


def has_attention(spec: ModelSpec, layer_index: int | None = None) -> bool:
    """Layer ``layer_index`` runs self-attention (a transformer block or a hybrid "*" layer)."""
    return block_kind(spec, layer_index) in ("T", "*")


def has_ffn(spec: ModelSpec, layer_index: int | None = None) -> bool:
    """Layer ``layer_index`` runs an FFN, dense or MoE (a transformer block, a hybrid "-" or "E")."""
    return block_kind(spec, layer_index) in ("T", "-", "E")


def has_mamba(spec: ModelSpec, layer_index: int | None = None) -> bool:
    """Layer ``layer_index`` is a hybrid model's Mamba-2 mixer ("M")."""
    return block_kind(spec, layer_index) == "M"


def has_gdn(spec: ModelSpec, layer_index: int | None = None) -> bool:
    """Layer ``layer_index`` is a hybrid model's Gated DeltaNet mixer ("G")."""
    return block_kind(spec, layer_index) == "G"


def sublayers(spec: ModelSpec, layer_index: int | None = None) -> int:
    """Pre-norm sub-layers (each with a residual add and, under TP, its pair of collectives) of
    layer ``layer_index``: 2 in a transformer block, 1 in a hybrid layer."""
    return 2 if block_kind(spec, layer_index) == "T" else 1


def uniform_model(spec: ModelSpec, symbol: str) -> ModelSpec:
    """The hybrid model with every layer of kind ``symbol``: what a per-layer cost of that kind
    reads (``parsim.costs.stage.block_inputs``); the model itself when it is not hybrid."""
    if not spec.hybrid_pattern or spec.hybrid_pattern == symbol * spec.n_layers:
        return spec
    return dataclasses.replace(spec, hybrid_pattern=symbol * spec.n_layers)


def attention_kind(spec: ModelSpec, layer_index: int | None) -> str:
    """"full", "sliding" or "chunked" for block ``layer_index``; None stands for a full layer."""
    if layer_index is None or spec.layer_types is None:
        return "full"
    if not 0 <= layer_index < spec.n_layers:
        raise ValueError(f"layer_index {layer_index} out of range 0..{spec.n_layers - 1}")
    return spec.layer_types[layer_index]


def is_moe_layer(spec: ModelSpec, layer_index: int) -> bool:
    """True when block ``layer_index`` (0-based) has an MoE FFN."""
    if spec.hybrid_pattern:
        return block_kind(spec, layer_index) == "E"
    if not spec.is_moe or layer_index < spec.first_dense_layers:
        return False
    return (layer_index - spec.first_dense_layers) % spec.moe_every == 0
