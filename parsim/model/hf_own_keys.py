"""Hugging Face config.json -> ModelSpec fields for families with their own key names:
dbrx, mpt, falcon (each as its Transformers model class builds it).

- dbrx (DBRX): ``d_model``, ``n_heads``, ``n_layers``, ``max_seq_len``, ``vocab_size``, with
  ``attn_config`` (``kv_n_heads``: grouped-query attention) and ``ffn_config``
  (``moe_num_experts`` routed experts of ``ffn_hidden_size``, ``moe_top_k``, GLU experts w1/v1/w2:
  SwiGLU's shapes). Every layer is MoE; no biases; LayerNorms with a scale only; untied head.
- mpt (MPT): ``d_model``, ``n_heads``, ``n_layers``, ``expansion_ratio`` (FFN width
  = ratio x d_model, up/down: GPT's two matrices), ``max_seq_len``, ``vocab_size``; ALiBi (the
  Transformers class builds no position table), fused Wqkv, no biases (``no_bias``, default
  true, also drops the LayerNorms' shift), the head tied to the embedding.
- falcon (also the legacy ``RefinedWeb`` type, the new architecture, and ``RefinedWebModel``,
  the old one): GeLU MLP of
  ``ffn_hidden_size`` (default 4 x hidden), attention and MLP side by side
  (``parallel_attn``), rotary positions (ALiBi when ``alibi``), tied head. Falcon-7B
  (``multi_query``): one key/value head and one LayerNorm per block; the new decoder
  architecture (40B, 180B): ``num_kv_heads`` key/value heads and two LayerNorms (ln_attn,
  ln_mlp) per block. ``bias`` puts biases on every linear layer.

Values these classes would build differently are refused with a one-line error naming the key.
"""
from __future__ import annotations

from parsim.model.hf_keys import HFKeys

OWN_KEYS = ("dbrx", "mpt", "falcon")
LEGACY_TYPES = {"RefinedWeb": "falcon", "RefinedWebModel": "falcon"}
"""Older model_type names that read as one of these families."""
ARCHITECTURES = {"DbrxForCausalLM": "dbrx", "MptForCausalLM": "mpt", "MPTForCausalLM": "mpt",
                 "FalconForCausalLM": "falcon", "RWForCausalLM": "falcon"}


def _nested(c: HFKeys, key: str) -> HFKeys:
    """A nested config object (DBRX's attn_config / ffn_config, MPT's attn_config): its keys
    read ``key.<name>`` in errors; absent: an empty one (every key takes its default)."""
    v = c.data.get(key)
    if v is None:
        v = {}
    if not isinstance(v, dict):
        raise c.error(key, f"expected a JSON object, got {v!r}")
    return HFKeys(v, c.file, c.model_type, f"{c.prefix}{key}.")


def _dbrx(c: HFKeys, tied: bool) -> dict:
    attn, ffn = _nested(c, "attn_config"), _nested(c, "ffn_config")
    d, heads = c.int("d_model"), c.int("n_heads")
    width = ffn.int("ffn_hidden_size", 3584)  # every layer is MoE: the experts' width
    return dict(n_layers=c.int("n_layers"), d_model=d, n_heads=heads, n_kv_heads=attn.int("kv_n_heads", 1),
                d_ff=width, vocab_size=c.int("vocab_size"), ffn="swiglu",
                norm="layernorm", norm_shift=False, bias=False, tied_embeddings=tied,
                max_seq_len=c.int("max_seq_len", 2048), n_experts=ffn.int("moe_num_experts", 4),
                top_k=ffn.int("moe_top_k", 1), d_ff_expert=width, fused_qkv=True)  # Wqkv


def _mpt(c: HFKeys, tied: bool) -> dict:
    attn = _nested(c, "attn_config")
    attn.expect("alibi", False, True, "the Transformers MPT class runs ALiBi only (no position table)")
    no_bias = c.bool("no_bias", True)
    d = c.int("d_model")
    ratio = c.int("expansion_ratio", 4)
    kv = attn.int("kv_n_heads", c.int("n_heads"))
    return dict(n_layers=c.int("n_layers"), d_model=d, n_heads=c.int("n_heads"), n_kv_heads=kv,
                d_ff=ratio * d, vocab_size=c.int("vocab_size"), ffn="gelu", norm="layernorm",
                norm_shift=not no_bias, bias=not no_bias, tied_embeddings=tied, position="alibi",
                max_seq_len=c.int("max_seq_len", 2048), fused_qkv=True)


def _falcon(c: HFKeys, tied: bool) -> dict:
    d = c.first_int("hidden_size", "n_embed")
    heads = c.first_int("num_attention_heads", "n_head")
    # the legacy "RefinedWeb" type is the new architecture (Falcon-40B's first config names no
    # new_decoder_architecture), "RefinedWebModel" the old one (Falcon-7B)
    new_arch = c.bool("new_decoder_architecture", c.data.get("model_type") == "RefinedWeb")
    if new_arch:
        kv = c.first_int("num_kv_heads", "n_head_kv", default=heads)
        norms = 2  # ln_attn and ln_mlp, both on the block's input
    else:
        kv = 1 if c.bool("multi_query", True) else heads
        norms = 1 if c.bool("parallel_attn", True) else 2
    if new_arch:
        c.expect("parallel_attn", True, True, "the new decoder architecture's blocks are parallel")
    return dict(n_layers=c.first_int("num_hidden_layers", "n_layer"), d_model=d, n_heads=heads, n_kv_heads=kv,
                d_ff=c.int("ffn_hidden_size", 4 * d), vocab_size=c.int("vocab_size"), ffn="gelu",
                norm="layernorm", bias=c.bool("bias", False), tied_embeddings=tied,
                position="alibi" if c.bool("alibi", False) else "rope",
                max_seq_len=c.int("max_position_embeddings", 2048), block_norms=norms,
                parallel_residual=c.bool("parallel_attn", True), fused_qkv=True)  # query_key_value


_BUILD = {"dbrx": _dbrx, "mpt": _mpt, "falcon": _falcon}
_TIED_DEFAULT = {"dbrx": False, "mpt": True, "falcon": True}


def own_keys_fields(c: HFKeys, tied: bool | None) -> dict:
    """ModelSpec fields (all but name) of a dbrx / mpt / falcon config. ``tied``: a wrapper's
    tie_word_embeddings, or None to read it here (with the family's default)."""
    if tied is None:
        tied = c.bool("tie_word_embeddings", _TIED_DEFAULT[c.model_type])
    return _BUILD[c.model_type](c, tied)
