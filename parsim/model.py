"""Model description: ModelSpec, parameter counts, GEMM shapes, FLOPs and bytes per layer.

Conventions
-----------
- Parameter counts are exact integers of the weights a framework would allocate
  (matrices, biases, norm scales/shifts). Not counted: RoPE/ALiBi (no weights), the
  DeepSeek-V3 multi-token-prediction module, router bias buffers, Qwen2-MoE's
  one-column shared-expert gate.
- GEMM shapes are per microbatch on ONE tensor-parallel rank with Megatron sharding:
  column-parallel layers (qkv, fc1, gate, up, MLA up-projections) shard their output
  features n by tp; row-parallel layers (attn_out, fc2, down) shard their input
  features k by tp. Shards round up (ceil) when tp does not divide; the router and
  MLA down-projections are replicated on every TP rank (as in Megatron-Core).
- Attention-core FLOPs count the full s x s score matrix (no causal halving), which is
  the convention of Megatron's MFU formula and of published TFLOP/s numbers.

Presets live in ``parsim.model_presets`` and the Hugging Face importer in
``parsim.hf_import``; both are re-exported here (``PRESETS``, ``get_preset``,
``model_from_hf_config``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from numbers import Integral, Real
from pathlib import Path

from .errors import ConfigError

FFN_KINDS = ("gelu", "swiglu")
POSITION_KINDS = ("rope", "learned")
NORM_KINDS = ("rmsnorm", "layernorm")


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
    """"rope" (no weights) or "learned" (adds max_seq_len * d_model to the embedding)."""
    max_seq_len: int = 4096
    """Longest sequence (only sizes learned position tables; training seq_len is separate)."""
    norm: str = "rmsnorm"
    """"rmsnorm" (d params) or "layernorm" (2d params: scale and shift)."""
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
    # --- additions beyond the shared brief (all neutral by default) ---
    qkv_bias: bool = False
    """Biases on q/k/v only (Qwen2 style); bias=True already implies them."""
    qk_norm: bool = False
    """RMSNorm over head_dim on q and k (Qwen3 style): 2*head_dim params per layer."""
    d_ff_shared: int | None = None
    """Hidden size of one shared expert; default d_ff_expert (Qwen2-MoE uses a separate size)."""
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

    def __post_init__(self) -> None:
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
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def d_ff_expert_(self) -> int:
        return self.d_ff_expert if self.d_ff_expert is not None else self.d_ff

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
    def ffn_matrices(self) -> int:
        """Weight matrices per FFN: 2 (gelu) or 3 (swiglu)."""
        return 3 if self.ffn == "swiglu" else 2


# ---------------------------------------------------------------- validation
_POS_INT = ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size",
            "max_seq_len", "top_k", "moe_every")
_OPT_POS_INT = ("head_dim", "d_ff_expert", "d_ff_shared")
_NONNEG_INT = ("n_experts", "n_shared_experts", "first_dense_layers", "q_lora_rank",
               "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
_BOOL = ("tied_embeddings", "bias", "qkv_bias", "qk_norm")
_CHOICES = {"ffn": FFN_KINDS, "position": POSITION_KINDS, "norm": NORM_KINDS}
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
    for key in _BOOL:
        if not isinstance(getattr(s, key), bool):
            raise bad(key, f"expected true or false, got {getattr(s, key)!r}")
    for key, allowed in _CHOICES.items():
        if getattr(s, key) not in allowed:
            raise bad(key, f"{getattr(s, key)!r} is not one of {', '.join(allowed)}")
    cf = s.capacity_factor
    if not isinstance(cf, Real) or isinstance(cf, bool) or not cf > 0:
        raise bad("capacity_factor", f"expected a positive number, got {cf!r}")
    if s.n_heads % s.n_kv_heads:
        raise bad("n_kv_heads", f"n_heads={s.n_heads} is not divisible by n_kv_heads={s.n_kv_heads}")
    if s.head_dim is None and not s.is_mla and s.d_model % s.n_heads:
        raise bad("n_heads", f"d_model={s.d_model} is not divisible by n_heads={s.n_heads} (give head_dim)")
    if s.is_mla:
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(s, key) <= 0:
                raise bad(key, "must be positive when kv_lora_rank > 0 (MLA)")
    if s.is_moe and s.top_k > s.n_experts:
        raise bad("top_k", f"top_k={s.top_k} exceeds n_experts={s.n_experts}")
    if s.first_dense_layers > s.n_layers:
        raise bad("first_dense_layers", f"{s.first_dense_layers} exceeds n_layers={s.n_layers}")


# ---------------------------------------------------------------- parameter counts
def is_moe_layer(spec: ModelSpec, layer_index: int) -> bool:
    """True when block ``layer_index`` (0-based) has an MoE FFN."""
    if not spec.is_moe or layer_index < spec.first_dense_layers:
        return False
    return (layer_index - spec.first_dense_layers) % spec.moe_every == 0


def _pick_layer(spec: ModelSpec, layer_index: int | None) -> bool:
    """MoE-ness of the requested layer; None = layer 0 for dense models, first MoE layer otherwise."""
    if layer_index is None:
        return spec.is_moe and spec.n_moe_layers > 0
    if not 0 <= layer_index < spec.n_layers:
        raise ValueError(f"layer_index {layer_index} out of range 0..{spec.n_layers - 1}")
    return is_moe_layer(spec, layer_index)


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
    return d * (nh + 2 * spec.n_kv_heads) * hd + nh * hd * d


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
        n += 2 * spec.head_dim_
    return n


def _mlp_params(spec: ModelSpec, d_ff: int) -> int:
    matrices = spec.ffn_matrices * spec.d_model * d_ff
    biases = ((spec.ffn_matrices - 1) * d_ff + spec.d_model) if spec.bias else 0
    return matrices + biases


def _norm_params(spec: ModelSpec) -> int:
    return spec.d_model * (2 if spec.norm == "layernorm" else 1)


def _ffn_params(spec: ModelSpec, moe: bool, active: bool) -> int:
    if not moe:
        return _mlp_params(spec, spec.d_ff)
    routed = spec.top_k if active else spec.n_experts
    return (spec.d_model * spec.n_experts  # router (always touched)
            + routed * _mlp_params(spec, spec.d_ff_expert_)
            + spec.n_shared_experts * _mlp_params(spec, spec.d_ff_shared_))


def layer_params(spec: ModelSpec, layer_index: int | None = None) -> int:
    """Parameters of one block: attention + FFN or MoE (router, all experts) + 2 norms.

    ``layer_index=None`` means layer 0 for a dense model and the first MoE layer for an MoE model.
    """
    moe = _pick_layer(spec, layer_index)
    return (_attention_matrices(spec) + _attention_other(spec) + 2 * _norm_params(spec)
            + _ffn_params(spec, moe, active=False))


def _layer_active_params(spec: ModelSpec, layer_index: int) -> int:
    moe = is_moe_layer(spec, layer_index)
    return (_attention_matrices(spec) + _attention_other(spec) + 2 * _norm_params(spec)
            + _ffn_params(spec, moe, active=True))


def embedding_params(spec: ModelSpec) -> int:
    """Token embedding, plus the learned position table when position == "learned"."""
    pos = spec.max_seq_len * spec.d_model if spec.position == "learned" else 0
    return spec.vocab_size * spec.d_model + pos


def head_params(spec: ModelSpec) -> int:
    """Final norm + LM-head matrix (the matrix is 0 when tied to the embedding)."""
    return _norm_params(spec) + (0 if spec.tied_embeddings else spec.vocab_size * spec.d_model)


def total_params(spec: ModelSpec) -> int:
    n_moe = spec.n_moe_layers
    blocks = n_moe * layer_params(spec, _first(spec, True)) if n_moe else 0
    if spec.n_layers - n_moe:
        blocks += (spec.n_layers - n_moe) * layer_params(spec, _first(spec, False))
    return embedding_params(spec) + blocks + head_params(spec)


def active_params(spec: ModelSpec) -> int:
    """Parameters touched per token: routed top_k + shared experts + router, embeddings included."""
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


def _mlp_gemms(spec: ModelSpec, prefix: str, m: int, d_ff: int, tp: int, count: int = 1) -> list[Gemm]:
    d, f = spec.d_model, _shard(d_ff, tp)
    if spec.ffn == "swiglu":
        names = ("gate", "up", "down")
        return [Gemm(prefix + names[0], m, f, d, count), Gemm(prefix + names[1], m, f, d, count),
                Gemm(prefix + names[2], m, d, f, count)]
    return [Gemm(prefix + "fc1", m, f, d, count), Gemm(prefix + "fc2", m, d, f, count)]


def _attention_gemms(spec: ModelSpec, m: int, tp: int) -> list[Gemm]:
    d, nh = spec.d_model, spec.n_heads
    if not spec.is_mla:
        hd = spec.head_dim_
        qkv = _shard(nh * hd, tp) + 2 * hd * _shard(spec.n_kv_heads, tp)
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


def layer_gemms(spec: ModelSpec, tokens: int, tp: int = 1,
                layer_index: int | None = None) -> tuple[Gemm, ...]:
    """Forward GEMMs of one block for ``tokens`` tokens on one TP rank (see module docstring).

    MoE layers (first approximation, dropless): the router, then each of n_experts runs
    its FFN on ceil(tokens*top_k/n_experts) rows (count=n_experts), then the shared experts
    on all tokens. Expert parallelism is not applied here.
    """
    moe = _pick_layer(spec, layer_index)
    g = _attention_gemms(spec, tokens, tp)
    if not moe:
        return tuple(g + _mlp_gemms(spec, "", tokens, spec.d_ff, tp))
    g.append(Gemm("router", tokens, spec.n_experts, spec.d_model))
    rows = _shard(tokens * spec.top_k, spec.n_experts)
    g += _mlp_gemms(spec, "expert_", rows, spec.d_ff_expert_, tp, count=spec.n_experts)
    if spec.n_shared_experts:
        g += _mlp_gemms(spec, "shared_", tokens, spec.n_shared_experts * spec.d_ff_shared_, tp)
    return tuple(g)


def attention_core_flops(spec: ModelSpec, batch: float, seq_len: int, tp: int = 1) -> float:
    """Forward QK^T and scores x V FLOPs on one TP rank: 4*b*s^2*n_heads*head_dim/tp.

    Counts the full s x s matrix (Megatron's MFU convention, as in its 96Bslh^2(1+s/6h)
    formula), not the causal half that FlashAttention actually computes. MLA uses its
    query/key dim for QK^T and v_head_dim for the second product.
    """
    if spec.is_mla:
        per_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim
    else:
        per_head = 2 * spec.head_dim_
    return 2.0 * batch * seq_len * seq_len * spec.n_heads * per_head / tp


def layer_elementwise_bytes(spec: ModelSpec, tokens: int, tp: int = 1, sp: bool = False,
                            bytes_per_el: int = 2) -> float:
    """HBM bytes read + written by one block's memory-bound forward ops (an estimate).

    Per token, in elements: two norms (read d, write d), two residual adds (read 2d,
    write d) -- split over tp only with sequence parallelism; RoPE on q and k (read +
    write); the FFN activation (gelu: read f, write f; swiglu: read 2f, write f) on the
    local f = d_ff/tp shard; for MoE layers the token dispatch and combine permutations
    (4*top_k*d). Dropout is assumed off; GEMM epilogues (bias adds) and the fused
    flash-attention kernel are left out. Counts the first MoE layer when layer_index is None.
    """
    d = spec.d_model
    replicated = (2 * 2 * d + 2 * 3 * d) / (tp if sp else 1)
    rope_dim = spec.qk_rope_head_dim if spec.is_mla else spec.head_dim_
    kv_heads = 1 if spec.is_mla else spec.n_kv_heads
    rope = 2 * (spec.n_heads + kv_heads) * rope_dim / tp
    act = 3 if spec.ffn == "swiglu" else 2
    if spec.is_moe and spec.n_moe_layers:
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
    """FLOPs of one block on one TP rank: F = G + A, B = G + 2A, W = G (G: GEMMs, A: attention core)."""
    gemm = float(sum(g.flops for g in layer_gemms(spec, batch * seq_len, tp, layer_index)))
    attn = attention_core_flops(spec, batch, seq_len, tp)
    return PassFlops(gemm + attn, gemm + 2 * attn, gemm)


def head_flops(spec: ModelSpec, batch: int, seq_len: int, tp: int = 1) -> PassFlops:
    """LM-head logits on one TP rank (the final norm and loss are memory-bound, not counted)."""
    f = float(head_gemm(spec, batch * seq_len, tp).flops)
    return PassFlops(f, f, f)


def _layer_matmul_weights(spec: ModelSpec, layer_index: int) -> int:
    """Weights a token multiplies in one block (active experts only, no biases or norms)."""
    if is_moe_layer(spec, layer_index):
        ffn = (spec.d_model * spec.n_experts
               + spec.ffn_matrices * spec.d_model * (spec.top_k * spec.d_ff_expert_
                                                     + spec.n_shared_experts * spec.d_ff_shared_))
    else:
        ffn = spec.ffn_matrices * spec.d_model * spec.d_ff
    return _attention_matrices(spec) + ffn


def model_flops_per_step(spec: ModelSpec, tokens: int, seq_len: int) -> float:
    """Model FLOPs of one optimizer step over ``tokens`` tokens (the MFU numerator).

    3 x forward (forward + backward, no recompute) of every block and the LM head,
    full s^2 attention; MoE layers count top_k routed + shared experts. Exact (no
    rounding of expert rows). Equals the Megatron formula without recompute for GPT models.
    """
    weights = sum(_layer_matmul_weights(spec, i) for i in range(spec.n_layers))
    weights += spec.vocab_size * spec.d_model  # LM head
    attn = spec.n_layers * attention_core_flops(spec, tokens / seq_len, seq_len)
    return 3.0 * (2.0 * tokens * weights + attn)


def megatron_flops_per_step(spec: ModelSpec, batch: int, seq_len: int, recompute: bool) -> float:
    """Narayanan et al. 2021 eq. 3: 96*B*s*l*h^2*(1 + s/(6h) + V/(16*l*h)) with full recompute.

    Without recompute the blocks run 3 passes instead of 4 and the LM head is unchanged
    (it is never recomputed): 72*B*s*l*h^2*(1 + s/(6h)) + 6*B*s*h*V. Uses l, h, V only
    (assumes d_ff = 4h and MHA, as the paper does).
    """
    b, s, l, h, v = batch, seq_len, spec.n_layers, spec.d_model, spec.vocab_size
    passes = 4 if recompute else 3
    return 24.0 * passes * b * s * l * h * h * (1 + s / (6 * h)) + 6.0 * b * s * h * v


# ---------------------------------------------------------------- loading
# Implemented in model_presets.py / hf_import.py (they import ModelSpec, hence the lazy imports).
def get_preset(name: str) -> ModelSpec:
    """A preset by its user-facing name; ConfigError listing the known names otherwise."""
    from .model_presets import get_preset as _get
    return _get(name)


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json (see parsim.hf_import)."""
    from .hf_import import model_from_hf_config as _load
    return _load(path)


def model_from_table(table: dict, file: str) -> ModelSpec:
    """The scenario's [model] table -> ModelSpec (see parsim.model_presets.model_from_table)."""
    from .model_presets import model_from_table as _load
    return _load(table, file)


def __getattr__(name: str):  # PEP 562: PRESETS without a circular import at load time
    if name == "PRESETS":
        from .model_presets import PRESETS
        return PRESETS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ModelSpec", "Gemm", "PassFlops", "PRESETS", "get_preset", "model_from_table",
    "model_from_hf_config", "layer_params", "embedding_params", "head_params", "total_params",
    "active_params", "is_moe_layer", "layer_gemms", "attention_core_flops",
    "layer_elementwise_bytes", "head_gemm", "layer_flops", "head_flops",
    "model_flops_per_step", "megatron_flops_per_step",
]
