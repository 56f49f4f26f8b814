"""Model shapes: parameter counts, GEMM shapes, FLOPs and bytes per layer of a ModelSpec.

Conventions
-----------
- Parameter counts are exact integers of the weights a framework would allocate
  (matrices, biases, norm scales/shifts, GPT-OSS attention sinks). Not counted in
  ``total_params``: the multi-token-prediction modules (``mtp_params`` counts them), RoPE/ALiBi
  (no weights), router bias buffers,
  Qwen2-MoE's one-column shared-expert gate, and whatever a spec lists in not_modelled.
- GEMM shapes are per microbatch on ONE tensor-parallel rank with Megatron sharding:
  column-parallel layers (qkv, fc1, gate, up, MLA up-projections) shard their output
  features n by tp; row-parallel layers (attn_out, fc2, down) shard their input
  features k by tp. Shards round up (ceil) when tp does not divide; the router and
  MLA down-projections are replicated on every TP rank (as in Megatron-Core).
- Attention-core FLOPs count the full s x s score matrix (no causal halving), which is
  the convention of Megatron's MFU formula and of published TFLOP/s numbers. Sliding-window
  and chunked layers count their exact causal query-key pairs P in the same convention,
  2P - s (a full layer has P = s(s+1)/2, hence s^2): see attention_core_flops.

The spec itself is ``parsim.model.spec``; presets ``parsim.model.presets``; the Hugging
Face importer ``parsim.model.hf``. ``parsim.model`` re-exports all four.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.model.spec import (
    ModelSpec,
    attention_kind,
    block_kind,
    has_attention,
    has_ffn,
    is_moe_layer,
)


def _pick_layer(spec: ModelSpec, layer_index: int | None) -> bool:
    """MoE-ness of the requested layer; None = layer 0 for dense models, first MoE layer otherwise
    (a hybrid model: layer 0)."""
    if layer_index is None:
        if spec.hybrid_pattern:
            return block_kind(spec) == "E"
        return spec.is_moe and spec.n_moe_layers > 0
    if not 0 <= layer_index < spec.n_layers:
        raise ValueError(f"layer_index {layer_index} out of range 0..{spec.n_layers - 1}")
    return is_moe_layer(spec, layer_index)


def _uniform(spec: ModelSpec, kind: str) -> ModelSpec:
    """The hybrid model with every layer of ``kind`` (``parsim.model.spec.uniform_model``)."""
    from parsim.model.spec import uniform_model
    return uniform_model(spec, kind)


def _layer_index(spec: ModelSpec, layer_index: int | None) -> int | None:
    """The layer a None index stands for in a hybrid model (layer 0), else the index as given."""
    return 0 if layer_index is None and spec.hybrid_pattern else layer_index


def _attention_matrices(spec: ModelSpec) -> int:
    """Weights in the attention's linear layers (no biases)."""
    d, nh = spec.d_model, spec.n_heads
    if spec.is_mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        q = d * spec.q_lora_rank + spec.q_lora_rank * nh * qk if spec.q_lora_rank else d * nh * qk
        kv = d * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        kv += spec.kv_lora_rank * nh * (spec.qk_nope_head_dim + spec.v_head_dim)
        return q + kv + nh * spec.v_head_dim * d
    hd = spec.head_dim_
    gate = nh * hd if spec.attn_output_gate else 0  # the output gate, projected beside the query
    return d * (nh + 2 * spec.n_kv_heads) * hd + d * gate + nh * hd * d


def _attention_other(spec: ModelSpec) -> int:
    """Attention biases and inner norms (MLA latent norms, Qwen3 q/k norms)."""
    n = 0
    if spec.is_mla:
        n += spec.q_lora_rank + spec.kv_lora_rank  # RMSNorm on each latent
    else:
        qkv_out = (spec.n_heads + 2 * spec.n_kv_heads) * spec.head_dim_
        n += qkv_out if (spec.bias or spec.qkv_bias) else 0
    if spec.bias:
        n += spec.d_model  # output projection bias
    if spec.qk_norm:
        n += (2 if spec.qk_norm_width == "head" else spec.n_heads + spec.n_kv_heads) * spec.head_dim_
    if spec.attention_sinks:
        n += spec.n_heads  # one sink logit per query head
    return n


def _mlp_params(spec: ModelSpec, d_ff: int, width: int | None = None) -> int:
    d = width or spec.d_model  # the rows it reads and writes (a LatentMoE expert: the latent width)
    matrices = spec.ffn_matrices * d * d_ff
    biases = ((spec.ffn_matrices - 1) * d_ff + d) if spec.bias else 0
    return matrices + biases


def _latent_params(spec: ModelSpec) -> int:
    """LatentMoE's down and up projections around the routed experts (d x latent each)."""
    return 2 * spec.d_model * spec.moe_latent_size if spec.moe_latent_size else 0


def _norm_params(spec: ModelSpec) -> int:
    return spec.d_model * (2 if spec.norm == "layernorm" and spec.norm_shift else 1)


def mamba_mixer_params(spec: ModelSpec) -> int:
    """Weights of one Mamba-2 mixer (Megatron-Core ``MambaMixer``): the input projection to z, x,
    B, C and dt (``mamba_in_proj_width`` x d, biased only with ``bias``), the depthwise causal
    convolution over x, B and C (``mamba_conv_kernel`` taps and a bias per channel), ``dt_bias``,
    ``A_log`` and ``D`` (one per head), the gated RMSNorm over the inner width and the output
    projection (d x inner, biased with ``bias``). The layer's pre-norm is not the mixer's."""
    d, inner, conv = spec.d_model, spec.mamba_inner, spec.mamba_conv_channels
    n = d * spec.mamba_in_proj_width + inner * d
    if spec.bias:
        n += spec.mamba_in_proj_width + d
    return n + conv * (spec.mamba_conv_kernel + 1) + 3 * spec.mamba_heads + inner


def gdn_mixer_params(spec: ModelSpec) -> int:
    """Weights of one Gated DeltaNet mixer (Megatron-Core ``GatedDeltaNet``, Transformers'
    ``Qwen3NextGatedDeltaNet``): the input projection to q, k, v, z, beta and alpha
    (``gdn_in_proj_width`` x d), the depthwise causal convolution over q, k and v
    (``gdn_conv_kernel`` taps, no bias: both frameworks' default), ``dt_bias`` and ``A_log`` (one per
    value head), the gated RMSNorm over one value head (its scale shared by the heads) and the output
    projection (d x value width); biases on both projections only with ``bias``. The layer's pre-norm
    is not the mixer's."""
    d, width = spec.d_model, spec.gdn_in_proj_width
    n = d * width + spec.gdn_value_width * d
    if spec.bias:
        n += width + d
    return n + spec.gdn_conv_channels * spec.gdn_conv_kernel + 2 * spec.gdn_value_heads + spec.gdn_value_dim


def _ffn_params(spec: ModelSpec, moe: bool, active: bool) -> int:
    if not moe:
        return _mlp_params(spec, spec.d_ff)
    routed = spec.top_k if active else spec.n_experts
    router = spec.n_experts * (spec.d_model + (1 if spec.bias else 0))  # the router is a linear layer too
    return (router  # always touched
            + _latent_params(spec)
            + routed * _mlp_params(spec, spec.d_ff_expert_, spec.expert_width)
            + spec.n_shared_experts * _mlp_params(spec, spec.d_ff_shared_))


def layer_params(spec: ModelSpec, layer_index: int | None = None) -> int:
    """Parameters of one block: attention + FFN or MoE (router, all experts) + its norms
    (``block_norms``, usually 2); a hybrid layer: its one sub-layer and its pre-norm.

    ``layer_index=None`` means layer 0 for a dense model and the first MoE layer for an MoE model
    (layer 0 of a hybrid model).
    """
    if spec.hybrid_pattern:
        return _hybrid_params(spec, block_kind(spec, layer_index), active=False)
    moe = _pick_layer(spec, layer_index)
    return (_attention_matrices(spec) + _attention_other(spec) + spec.block_norms * _norm_params(spec)
            + _ffn_params(spec, moe, active=False))


def _hybrid_params(spec: ModelSpec, kind: str, active: bool) -> int:
    """One hybrid layer of ``kind``: its pre-norm and its sub-layer."""
    if kind == "M":
        body = mamba_mixer_params(spec)
    elif kind == "G":
        body = gdn_mixer_params(spec)
    elif kind == "*":
        body = _attention_matrices(spec) + _attention_other(spec)
    else:
        body = _ffn_params(spec, kind == "E", active)
    return _norm_params(spec) + body


def _layer_active_params(spec: ModelSpec, layer_index: int) -> int:
    if spec.hybrid_pattern:
        return _hybrid_params(spec, block_kind(spec, layer_index), active=True)
    moe = is_moe_layer(spec, layer_index)
    return (_attention_matrices(spec) + _attention_other(spec) + spec.block_norms * _norm_params(spec)
            + _ffn_params(spec, moe, active=True))


def embedding_params(spec: ModelSpec) -> int:
    """Token embedding, plus the learned position table when position == "learned" and the
    embedding norm (BLOOM) when embedding_norm."""
    pos = (spec.max_seq_len + spec.position_offset) * spec.d_model if spec.position == "learned" else 0
    norm = _norm_params(spec) if spec.embedding_norm else 0
    return spec.vocab_size * spec.d_model + pos + norm


def head_params(spec: ModelSpec) -> int:
    """Final norm + LM-head matrix (the matrix is 0 when tied to the embedding)."""
    return _norm_params(spec) + (0 if spec.tied_embeddings else spec.vocab_size * spec.d_model)


def total_params(spec: ModelSpec) -> int:
    if spec.hybrid_pattern:
        blocks = sum(spec.hybrid_pattern.count(k) * _hybrid_params(spec, k, active=False)
                     for k in set(spec.hybrid_pattern))
        return embedding_params(spec) + blocks + head_params(spec)
    n_moe = spec.n_moe_layers
    blocks = n_moe * layer_params(spec, _first(spec, True)) if n_moe else 0
    if spec.n_layers - n_moe:
        blocks += (spec.n_layers - n_moe) * layer_params(spec, _first(spec, False))
    return embedding_params(spec) + blocks + head_params(spec)


def mtp_block_is_moe(spec: ModelSpec) -> bool:
    """An MTP depth's block is of the last block's kind (Megatron-Core builds it from the
    decoder's layer spec; DeepSeek-V3's is an MoE block); a hybrid model's holds an MoE layer
    when its ``mtp_pattern`` does."""
    if spec.hybrid_pattern:
        return "E" in spec.mtp_pattern
    return is_moe_layer(spec, spec.n_layers - 1)


def mtp_block_kinds(spec: ModelSpec) -> tuple:
    """The layers one MTP depth runs, as the stage costs them (``parsim.costs.stage.layer_kind``):
    a hybrid model's ``mtp_pattern`` symbols, else one block of the last block's kind."""
    if spec.hybrid_pattern:
        return tuple(spec.mtp_pattern)
    return (mtp_block_is_moe(spec),)


def mtp_weight_copies(spec: ModelSpec) -> int:
    """Sets of MTP weights: one per depth, or one for all (``mtp_shared``)."""
    return min(1, spec.mtp_layers) if spec.mtp_shared else spec.mtp_layers


def mtp_params(spec: ModelSpec) -> int:
    """Weights of the multi-token-prediction modules (``spec.mtp_layers`` depths): per depth
    one block of the last block's kind, the 2d -> d projection ``eh_proj`` and three norms
    (the embedding's, the hidden state's, the depth's final one). The embedding and the output
    head are the model's own (shared), so they are not counted again."""
    if not spec.mtp_layers:
        return 0
    if spec.hybrid_pattern:
        block = sum(_hybrid_params(spec, k, active=False) for k in spec.mtp_pattern)
    else:
        block = layer_params(spec, spec.n_layers - 1)
    return mtp_weight_copies(spec) * (block + mtp_join_params(spec))


def mtp_join_params(spec: ModelSpec) -> int:
    """One multi-token prediction depth's weights beside its block: ``eh_proj`` (2d x d) and the
    three norms (the embedding's, the hidden state's, the depth's final one)."""
    return 2 * spec.d_model * spec.d_model + 3 * _norm_params(spec)


def trained_params(spec: ModelSpec) -> int:
    """Every weight training updates: the model and its multi-token-prediction modules."""
    return total_params(spec) + mtp_params(spec)


def active_params(spec: ModelSpec) -> int:
    """Parameters touched per token: routed top_k + shared experts + router, embeddings included."""
    if spec.hybrid_pattern:
        blocks = sum(spec.hybrid_pattern.count(k) * _hybrid_params(spec, k, active=True)
                     for k in set(spec.hybrid_pattern))
    else:
        blocks = sum(_layer_active_params(spec, i) for i in range(spec.n_layers))
    return embedding_params(spec) + blocks + head_params(spec)


def _first(spec: ModelSpec, moe: bool) -> int:
    return next(i for i in range(spec.n_layers) if is_moe_layer(spec, i) == moe)


# ---------------------------------------------------------------- GEMMs and FLOPs
@dataclass(frozen=True)
class Gemm:
    """One forward matrix multiply (m x k) @ (k x n) on one TP rank."""

    name: str
    """"qkv", "attn_out", "fc1", "fc2", "gate", "up", "down", "router", "expert_*", "shared_*", MLA "q_down"...."""
    m: int
    """Rows of the activation (tokens)."""
    n: int
    """Output features on this TP rank."""
    k: int
    """Input features on this TP rank."""
    count: int = 1
    """Identical GEMMs (e.g. one per expert)."""

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.count


def _shard(x: int, tp: int) -> int:
    return -(-x // tp)


def _mlp_gemms(spec: ModelSpec, prefix: str, m: int, d_ff: int, tp: int, count: int = 1,
               width: int | None = None) -> list[Gemm]:
    d, f = width or spec.d_model, _shard(d_ff, tp)
    if spec.ffn == "swiglu":
        names = ("gate", "up", "down")
        return [Gemm(prefix + names[0], m, f, d, count), Gemm(prefix + names[1], m, f, d, count),
                Gemm(prefix + names[2], m, d, f, count)]
    return [Gemm(prefix + "fc1", m, f, d, count), Gemm(prefix + "fc2", m, d, f, count)]


def _attention_gemms(spec: ModelSpec, m: int, tp: int) -> list[Gemm]:
    d, nh = spec.d_model, spec.n_heads
    if not spec.is_mla:
        hd = spec.head_dim_
        qkv = _shard(nh * hd, tp) * (2 if spec.attn_output_gate else 1) + 2 * hd * _shard(spec.n_kv_heads, tp)
        return [Gemm("qkv", m, qkv, d), Gemm("attn_out", m, d, _shard(nh * hd, tp))]
    qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    heads = _shard(nh, tp)
    if spec.q_lora_rank:
        g = [Gemm("q_down", m, spec.q_lora_rank, d), Gemm("q_up", m, heads * qk, spec.q_lora_rank)]
    else:
        g = [Gemm("q", m, heads * qk, d)]
    return g + [
        Gemm("kv_down", m, spec.kv_lora_rank + spec.qk_rope_head_dim, d),
        Gemm("kv_up", m, heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank),
        Gemm("attn_out", m, d, heads * spec.v_head_dim),
    ]


def _mamba_gemms(spec: ModelSpec, m: int, tp: int) -> tuple[Gemm, ...]:
    """A Mamba-2 mixer's two linear layers on one TP rank: the column-parallel input projection
    (z, x, B, C and dt of this rank's heads and groups) and the row-parallel output projection
    (Megatron-Core ``MambaMixer``: ``in_proj`` and ``out_proj``)."""
    d = spec.d_model
    heads, groups = _shard(spec.mamba_heads, tp), _shard(spec.mamba_groups, tp)
    inner = heads * spec.mamba_head_dim
    width = 2 * inner + 2 * groups * spec.mamba_state_dim + heads
    return (Gemm("mamba_in_proj", m, width, d), Gemm("mamba_out_proj", m, d, inner))


def mamba_scan_flops(spec: ModelSpec, tokens: float, tp: int = 1) -> float:
    """Forward FLOPs of one Mamba-2 layer's SSD scan on one TP rank, as its chunked algorithm runs
    them (Dao & Gu 2024, "Transformers are SSMs", Sec. 6; ``mamba_chunk_scan_combined``): per chunk
    of Q tokens, C B^T per group (2 Q^2 N), within-chunk outputs (CB x X, 2 Q^2 P a head), chunk
    states (B^T X, 2 Q N P a head) and the outputs' state part (C x state, 2 Q N P a head) --
    per token 2 Q N G + 2 Q P H + 4 N P H. Full chunks (the causal mask is applied, not skipped)."""
    q, n, p = spec.mamba_chunk, spec.mamba_state_dim, spec.mamba_head_dim
    h, g = spec.mamba_heads / tp, max(1.0, spec.mamba_groups / tp)
    return tokens * (2 * q * n * g + 2 * q * p * h + 4 * n * p * h)


def _gdn_gemms(spec: ModelSpec, m: int, tp: int) -> tuple[Gemm, ...]:
    """A Gated DeltaNet mixer's two linear layers on one TP rank: the column-parallel input
    projection (q, k, v, z, beta, alpha of this rank's heads) and the row-parallel output projection
    (Megatron-Core ``GatedDeltaNet``: ``in_proj`` and ``out_proj``)."""
    kh, vh = _shard(spec.gdn_key_heads, tp), _shard(spec.gdn_value_heads, tp)
    key, value = kh * spec.gdn_key_dim, vh * spec.gdn_value_dim
    return (Gemm("gdn_in_proj", m, 2 * key + 2 * value + 2 * vh, spec.d_model),
            Gemm("gdn_out_proj", m, spec.d_model, value))


def gdn_scan_flops(spec: ModelSpec, tokens: float, tp: int = 1) -> float:
    """Forward FLOPs of one Gated DeltaNet layer's delta-rule kernels on one TP rank, as the chunked
    algorithm runs them (Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule",
    Sec. 3; flash-linear-attention's ``chunk_gated_delta_rule``), per value head and chunk of C
    tokens with key dim K and value dim V: K K^T (2 C^2 K), the triangular inverse (C^3 / 3), the
    WY factors w and u (2 C^2 K + 2 C^2 V), the state pass (u - w h, then h += k^T v: 4 C K V) and
    the outputs (q h, q k^T, its product with v: 2 C K V + 2 C^2 K + 2 C^2 V) -- per token
    6 C K + 4 C V + 6 K V + C^2 / 3 a head (:mod:`parsim.costs.gdn` counts them kernel by kernel)."""
    c, k, v = spec.gdn_chunk, spec.gdn_key_dim, spec.gdn_value_dim
    heads = spec.gdn_value_heads / tp
    return tokens * heads * (6 * c * k + 4 * c * v + 6 * k * v + c * c / 3)


def layer_gemms(spec: ModelSpec, tokens: int, tp: int = 1,
                layer_index: int | None = None) -> tuple[Gemm, ...]:
    """Forward GEMMs of one block for ``tokens`` tokens on one TP rank (see module docstring).

    MoE layers (first approximation, dropless): the router, then each of n_experts runs
    its FFN on ceil(tokens*top_k/n_experts) rows (count=n_experts), then the shared experts
    on all tokens. Expert parallelism is not applied here.
    """
    moe = _pick_layer(spec, layer_index)
    kind = block_kind(spec, layer_index)
    if kind == "M":
        return _mamba_gemms(spec, tokens, tp)
    if kind == "G":
        return _gdn_gemms(spec, tokens, tp)
    g = _attention_gemms(spec, tokens, tp) if has_attention(spec, layer_index) else []
    if not has_ffn(spec, layer_index):
        return tuple(g)
    if not moe:
        return tuple(g + _mlp_gemms(spec, "", tokens, spec.d_ff, tp))
    g.append(Gemm("router", tokens, spec.n_experts, spec.d_model))
    if spec.moe_latent_size:  # LatentMoE: replicated like the router, on every token
        g.append(Gemm("latent_down", tokens, spec.moe_latent_size, spec.d_model))
        g.append(Gemm("latent_up", tokens, spec.d_model, spec.moe_latent_size))
    rows = _shard(tokens * spec.top_k, spec.n_experts)
    g += _mlp_gemms(spec, "expert_", rows, spec.d_ff_expert_, tp, count=spec.n_experts, width=spec.expert_width)
    if spec.n_shared_experts:
        g += _mlp_gemms(spec, "shared_", tokens, spec.n_shared_experts * spec.d_ff_shared_, tp)
    return tuple(g)


def causal_pairs(spec: ModelSpec, seq_len: int, layer_index: int | None = None) -> int:
    """Query-key pairs a causal mask keeps in block ``layer_index`` for one sequence (exact).

    Full: s(s+1)/2. Sliding window w: query i sees min(i+1, w) keys, so w(w+1)/2 + (s-w)w
    when s > w. Chunked c: each chunk of length n is causal within itself, n(n+1)/2, over
    s // c full chunks and one of s % c. A window or chunk of s or more is a full layer.
    """
    s, kind = seq_len, attention_kind(spec, layer_index)
    if kind == "sliding" and spec.sliding_window < s:
        w = spec.sliding_window
        return w * (w + 1) // 2 + (s - w) * w
    if kind == "chunked" and spec.attention_chunk < s:
        full, rest = divmod(s, spec.attention_chunk)
        c = spec.attention_chunk
        return full * c * (c + 1) // 2 + rest * (rest + 1) // 2
    return s * (s + 1) // 2


def attention_core_flops(spec: ModelSpec, batch: float, seq_len: int, tp: int = 1,
                         layer_index: int | None = None) -> float:
    """Forward QK^T and scores x V FLOPs on one TP rank: 4*b*s^2*n_heads*head_dim/tp.

    Counts the full s x s matrix (Megatron's MFU convention, as in its 96Bslh^2(1+s/6h)
    formula), not the causal half that FlashAttention actually computes. MLA uses its
    query/key dim for QK^T and v_head_dim for the second product.

    ``layer_index`` picks the block's attention (spec.layer_types); None counts a full layer,
    as before. A sliding-window or chunked block counts its exact causal pairs P
    (causal_pairs) in the same convention as a full block, 2P - s score entries: a full
    block's P = s(s+1)/2 gives s^2, a window of one key gives s, and a window or chunk of
    s or more gives s^2 again, so the count never jumps at the boundary.
    """
    if not has_attention(spec, layer_index):
        return 0.0
    if spec.is_mla:
        per_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim
    else:
        per_head = 2 * spec.head_dim_
    if attention_kind(spec, layer_index) == "full":  # the expression every existing number came from
        return 2.0 * batch * seq_len * seq_len * spec.n_heads * per_head / tp
    entries = 2 * causal_pairs(spec, seq_len, layer_index) - seq_len
    return 2.0 * batch * entries * spec.n_heads * per_head / tp


def layer_elementwise_bytes(spec: ModelSpec, tokens: int, tp: int = 1, sp: bool = False,
                            bytes_per_el: int = 2, layer_index: int | None = None) -> float:
    """HBM bytes read + written by one block's memory-bound forward ops (an estimate).

    Per token, in elements: two norms (read d, write d), two residual adds (read 2d,
    write d) -- split over tp only with sequence parallelism; RoPE on q and k (read +
    write; rotary models only: learned or ALiBi positions rotate nothing); the FFN activation (gelu: read f, write f; swiglu: read 2f, write f) on the
    local f = d_ff/tp shard; for MoE layers the token dispatch and combine permutations
    (4*top_k*d). Dropout is assumed off; GEMM epilogues (bias adds) and the fused
    flash-attention kernel are left out. Counts the first MoE layer when layer_index is None.
    A hybrid layer counts its one norm and residual add and its sub-layer's own work (a Mamba-2
    mixer: the convolution over x, B and C, read and written, and the gated norm, reading y and z
    and writing its output, on this rank's heads).
    """
    d = spec.d_model
    kind = block_kind(spec, layer_index)
    subs = 2 if kind == "T" else 1
    replicated = subs * (2 * d + 3 * d) / (tp if sp else 1)
    rope_dim = spec.qk_rope_head_dim if spec.is_mla else spec.head_dim_
    kv_heads = 1 if spec.is_mla else spec.n_kv_heads
    rope = 0.0
    if has_attention(spec, layer_index) and spec.position == "rope":
        rope = 2 * (spec.n_heads + kv_heads) * rope_dim / tp
    if has_attention(spec, layer_index) and spec.attn_output_gate:  # sigmoid(gate) * attn: read two, write one
        rope += 3 * spec.n_heads * spec.head_dim_ / tp
    act = 3 if spec.ffn == "swiglu" else 2
    if kind == "M":
        ffn = (2 * spec.mamba_conv_channels + 3 * spec.mamba_inner) / tp
    elif kind == "G":  # conv over q, k, v; the q and k L2 norms; the gated norm (read o and z, write)
        ffn = (2 * spec.gdn_conv_channels + 4 * spec.gdn_key_width + 3 * spec.gdn_value_width) / tp
    elif not has_ffn(spec, layer_index):
        ffn = 0.0
    elif spec.is_moe and (kind == "E" or (kind == "T" and spec.n_moe_layers)):
        f_local = (spec.top_k * spec.d_ff_expert_ + spec.n_shared_experts * spec.d_ff_shared_) / tp
        ffn = act * f_local + 4 * spec.top_k * d
    else:
        ffn = act * spec.d_ff / tp
    return tokens * (replicated + rope + ffn) * bytes_per_el


def head_gemm(spec: ModelSpec, tokens: int, tp: int = 1) -> Gemm:
    """LM-head logits GEMM on one TP rank (vocabulary sharded by tp)."""
    return Gemm("lm_head", tokens, _shard(spec.vocab_size, tp), spec.d_model)


@dataclass(frozen=True)
class PassFlops:
    """FLOPs of one microbatch through a piece of the model."""

    forward: float
    backward_input: float
    """Gradient w.r.t. activations (the zero-bubble "B")."""
    backward_weight: float
    """Gradient w.r.t. weights (the zero-bubble "W")."""

    @property
    def backward(self) -> float:
        return self.backward_input + self.backward_weight


def layer_flops(spec: ModelSpec, batch: int, seq_len: int, tp: int = 1,
                layer_index: int | None = None) -> PassFlops:
    """FLOPs of one block on one TP rank: F = G + A, B = G + 2A, W = G (G: GEMMs, A: attention core).

    The attention core is that of block ``layer_index`` (a full block when None).
    """
    gemm = float(sum(g.flops for g in layer_gemms(spec, batch * seq_len, tp, layer_index)))
    attn = attention_core_flops(spec, batch, seq_len, tp, layer_index)
    if block_kind(spec, layer_index) == "M":  # the SSD scan: its backward runs about twice its forward
        attn = mamba_scan_flops(spec, batch * seq_len, tp)
    elif block_kind(spec, layer_index) == "G":  # the delta rule's chunked kernels, likewise
        attn = gdn_scan_flops(spec, batch * seq_len, tp)
    return PassFlops(gemm + attn, gemm + 2 * attn, gemm)


def head_flops(spec: ModelSpec, batch: int, seq_len: int, tp: int = 1) -> PassFlops:
    """LM-head logits on one TP rank (the final norm and loss are memory-bound, not counted)."""
    f = float(head_gemm(spec, batch * seq_len, tp).flops)
    return PassFlops(f, f, f)


def _layer_matmul_weights(spec: ModelSpec, layer_index: int) -> int:
    """Weights a token multiplies in one block (active experts only, no biases or norms)."""
    kind = block_kind(spec, layer_index)
    if kind == "M":
        return spec.d_model * spec.mamba_in_proj_width + spec.mamba_inner * spec.d_model
    if kind == "G":
        return spec.d_model * spec.gdn_in_proj_width + spec.gdn_value_width * spec.d_model
    attention = _attention_matrices(spec) if has_attention(spec, layer_index) else 0
    if not has_ffn(spec, layer_index):
        return attention
    if is_moe_layer(spec, layer_index):
        ffn = (spec.d_model * spec.n_experts + _latent_params(spec)
               + spec.ffn_matrices * spec.expert_width * spec.top_k * spec.d_ff_expert_
               + spec.ffn_matrices * spec.d_model * spec.n_shared_experts * spec.d_ff_shared_)
    else:
        ffn = spec.ffn_matrices * spec.d_model * spec.d_ff
    return attention + ffn


def model_flops_per_step(spec: ModelSpec, tokens: int, seq_len: int) -> float:
    """Model FLOPs of one optimizer step over ``tokens`` tokens (the MFU numerator).

    3 x forward (forward + backward, no recompute) of every block and the LM head,
    full s^2 attention (sliding-window and chunked blocks: their own count, see
    attention_core_flops); MoE layers count top_k routed + shared experts. Exact (no
    rounding of expert rows). Equals the Megatron formula without recompute for GPT models.
    Each multi-token-prediction depth adds a block of the last block's kind, its 2d x d
    projection and another pass through the LM head (Megatron-Core's count, training.py
    ``num_floating_point_operations``; it also counts the norms, which are not matmuls here).
    """
    last = spec.n_layers - 1
    weights = sum(_layer_matmul_weights(spec, i) for i in range(spec.n_layers))
    weights += spec.vocab_size * spec.d_model  # LM head
    if spec.hybrid_pattern:
        mtp_block = sum(_layer_matmul_weights(_uniform(spec, k), 0) for k in spec.mtp_pattern)
    else:
        mtp_block = _layer_matmul_weights(spec, last)
    weights += spec.mtp_layers * (mtp_block + 2 * spec.d_model * spec.d_model + spec.vocab_size * spec.d_model)
    b = tokens / seq_len
    if spec.hybrid_pattern:  # attention layers' cores, and the Mamba layers' SSD scans
        pattern = spec.hybrid_pattern + spec.mtp_pattern * spec.mtp_layers
        attn = pattern.count("*") * attention_core_flops(_uniform(spec, "*"), b, seq_len)
        attn += pattern.count("M") * mamba_scan_flops(spec, tokens)
        attn += pattern.count("G") * gdn_scan_flops(spec, tokens)
    elif spec.layer_types is None:  # every block full: the product every existing number came from
        attn = (spec.n_layers + spec.mtp_layers) * attention_core_flops(spec, b, seq_len)
    else:
        attn = sum(attention_core_flops(spec, b, seq_len, layer_index=i) for i in range(spec.n_layers))
        attn += spec.mtp_layers * attention_core_flops(spec, b, seq_len, layer_index=last)
    return 3.0 * (2.0 * tokens * weights + attn)


def megatron_flops_per_step(spec: ModelSpec, batch: int, seq_len: int, recompute: bool) -> float:
    """Narayanan et al. 2021 eq. 3: 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) with full recompute.

    Without recompute the blocks run 3 passes instead of 4 and the LM head is unchanged
    (it is never recomputed): 72*B*s*l*h^2*(1 + s/(6h)) + 6*B*s*h*V. Uses l, h, V only
    (assumes d_ff = 4h and MHA, as the paper does).
    """
    if spec.hybrid_pattern:
        return megatron_hybrid_flops(spec, batch, seq_len)
    b, s, l, h, v = batch, seq_len, spec.n_layers, spec.d_model, spec.vocab_size
    passes = 4 if recompute else 3
    return 24.0 * passes * b * s * l * h * h * (1 + s / (6 * h)) + 6.0 * b * s * h * v


def megatron_hybrid_flops(spec: ModelSpec, batch: int, seq_len: int) -> float:
    """Megatron-Core's FLOP count of a hybrid model's step (``megatron/training/training.py``,
    ``num_floating_point_operations`` -> ``hybrid_flops``: what Megatron and the Megatron-Bridge
    performance tables report as model TFLOP/s): 3 x the forward, recomputation never counted.
    Per token, forward: an attention layer 4 h p (h + h g/n) + 2 s h p (p = heads x head dim / h,
    g/n the KV-head share; the causal half and the FMA's 2 cancel); an MLP layer 4 f h (x 3/2
    gated); a Mamba layer 2 h (2 d_in + 2 G N + H) + 7 d_in N + 2 d_in h with d_in = 2h as Megatron
    writes it (whatever the heads give); a Gated DeltaNet layer (``gdn_layer_flops``) 2 (h w_in + k c
    + 4 H_v d_v^2 + h w_v), w_in its input projection's width, c its convolution's channels, the
    delta rule counted as four d_v x d_v products a head; an attention output gate adds its projection
    (2 h p h); an MoE layer 4 h f_e top_k (+ 4 h f_shared), x 3/2 gated;
    the logits 2 h V."""
    t, s, h, v = batch * seq_len, seq_len, spec.d_model, spec.vocab_size
    pattern = spec.hybrid_pattern + spec.mtp_pattern * spec.mtp_layers  # the MTP depths' layers counted too
    gate = 1.5 if spec.ffn == "swiglu" else 1.0
    p = spec.head_dim_ * spec.n_heads / h
    attn = 4 * t * h * p * (h + h * spec.n_kv_heads / spec.n_heads) + 2 * t * s * h * p
    if spec.attn_output_gate:  # the gate's projection, counted with the query's (--attention-output-gate)
        attn += 2 * t * h * p * h
    mlp = 4 * gate * t * spec.d_ff * h
    d_in, n, g = 2 * h, spec.mamba_state_dim, spec.mamba_groups
    mamba = 2 * t * h * (2 * d_in + 2 * g * n + spec.mamba_heads) + 7 * t * d_in * n + 2 * t * d_in * h
    moe = 4 * gate * t * (spec.expert_width * spec.d_ff_expert_ * spec.top_k + h * spec.n_shared_experts * spec.d_ff_shared_)
    moe += 4 * t * h * spec.moe_latent_size  # LatentMoE's down and up projections
    gdn = 2 * t * (h * spec.gdn_in_proj_width + spec.gdn_conv_kernel * spec.gdn_conv_channels
                   + 4 * spec.gdn_value_heads * spec.gdn_value_dim ** 2 + h * spec.gdn_value_width)
    fwd = (pattern.count("*") * attn + pattern.count("-") * mlp + pattern.count("M") * mamba + pattern.count("G") * gdn
           + pattern.count("E") * moe + 2 * t * h * v * (1 + spec.mtp_layers))
    return 3.0 * fwd
