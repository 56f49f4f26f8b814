"""Hugging Face config.json -> ModelSpec fields for the classic GPT-style families:
gpt2, gpt_neox (Pythia, GPT-NeoX-20B), opt, bloom.

All four: LayerNorm (scale and shift), biases on every linear layer, a 2-matrix FFN of
width d_ff (GELU or ReLU: the same shapes, parsim's ffn = "gelu"), multi-head attention.
What differs, per family (from the Transformers model classes):

- gpt2: learned positions (n_positions rows), LM head tied to the embedding by default,
  d_ff = n_inner or 4 * n_embd.
- gpt_neox: rotary (partial, rotary_pct of each head: no weights either way), untied
  embed_out by default, attention and MLP in parallel (use_parallel_residual, default true).
- opt: learned positions with 2 extra rows (OPT's padding offset), tied head by default.
  OPT-350m's word_embed_proj_dim projections and post-LN layout are refused.
- bloom: ALiBi (no position weights), a LayerNorm on the embedding output, tied head,
  d_ff = 4 * hidden. BLOOM has no max_position_embeddings.

Values these classes would build differently (cross-attention, no biases, no final norm)
are refused with a one-line error naming the key.
"""
from __future__ import annotations

from parsim.model.hf_keys import HFKeys

CLASSIC = ("gpt2", "gpt_neox", "opt", "bloom")


def _gpt_style(d_model: int, n_layers: int, n_heads: int, d_ff: int, vocab: int, tied: bool) -> dict:
    return dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_heads, d_ff=d_ff,
                vocab_size=vocab, ffn="gelu", norm="layernorm", bias=True, tied_embeddings=tied)


def _gpt2(c: HFKeys, tied: bool) -> dict:
    c.expect("add_cross_attention", False, False, "parsim models decoder-only stacks")
    d = c.first_int("n_embd", "hidden_size")
    f = _gpt_style(d, c.first_int("n_layer", "num_hidden_layers"), c.first_int("n_head", "num_attention_heads"),
                   c.int("n_inner", default=4 * d), c.int("vocab_size"), tied)
    f.update(position="learned", max_seq_len=c.first_int("n_positions", "max_position_embeddings"),
             fused_qkv=True)  # GPT2Attention.c_attn
    return f


def _gpt_neox(c: HFKeys, tied: bool) -> dict:
    # attention_bias=false drops only the attention biases (the MLP keeps its own): not expressible
    c.expect("attention_bias", True, True, "GPT-NeoX without attention biases")
    f = _gpt_style(c.int("hidden_size"), c.int("num_hidden_layers"), c.int("num_attention_heads"),
                   c.int("intermediate_size"), c.int("vocab_size"), tied)
    f.update(position="rope", max_seq_len=c.int("max_position_embeddings", 2048),
             parallel_residual=c.bool("use_parallel_residual", True), fused_qkv=True)  # query_key_value
    return f


def _opt(c: HFKeys, tied: bool) -> dict:
    d = c.int("hidden_size")
    proj = c.int("word_embed_proj_dim", d)
    if proj != d:
        raise c.error("word_embed_proj_dim", f"{proj} != hidden_size {d} (OPT-350m's project_in/out) is not supported")
    c.expect("do_layer_norm_before", True, True, "post-LN OPT (350m) has no final norm")
    c.expect("_remove_final_layer_norm", False, False, "an OPT without its final norm")
    c.expect("enable_bias", True, True, "OPT without biases")
    c.expect("layer_norm_elementwise_affine", True, True, "LayerNorm without scale and shift")
    f = _gpt_style(d, c.int("num_hidden_layers"), c.int("num_attention_heads"), c.int("ffn_dim"),
                   c.int("vocab_size"), tied)
    # OPTLearnedPositionalEmbedding holds max_position_embeddings + 2 rows (ids shifted by 2)
    f.update(position="learned", max_seq_len=c.int("max_position_embeddings"), position_offset=2)
    return f


def _bloom(c: HFKeys, tied: bool) -> dict:
    d = c.first_int("n_embed", "hidden_size")
    f = _gpt_style(d, c.first_int("n_layer", "num_hidden_layers"), c.first_int("n_head", "num_attention_heads"),
                   4 * d, c.int("vocab_size"), tied)
    f.update(position="alibi", embedding_norm=True, fused_qkv=True)  # query_key_value
    return f


_BUILD = {"gpt2": _gpt2, "gpt_neox": _gpt_neox, "opt": _opt, "bloom": _bloom}
_TIED_DEFAULT = {"gpt2": True, "gpt_neox": False, "opt": True, "bloom": True}


def classic_fields(c: HFKeys, tied: bool | None) -> dict:
    """ModelSpec fields (all but name) of a gpt2 / gpt_neox / opt / bloom config.

    ``tied``: tie_word_embeddings from a wrapper around this config, or None to read it here
    (with the family's default).
    """
    if tied is None:
        tied = c.bool("tie_word_embeddings", _TIED_DEFAULT[c.model_type])
    return _BUILD[c.model_type](c, tied)
