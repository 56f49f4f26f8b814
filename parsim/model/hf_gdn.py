"""Hugging Face config.json -> ModelSpec fields for the Gated DeltaNet hybrids: Qwen3-Next
(``qwen3_next``) and Qwen3.5 (``qwen3_5`` / ``qwen3_5_moe``, their language model in ``text_config``),
as Transformers' ``Qwen3NextConfig`` / ``Qwen3_5MoeTextConfig`` read them.

- Blocks: ``num_hidden_layers``, each a mixer and an FFN. The mixer is named by ``layer_types``
  ("linear_attention": a Gated DeltaNet, "full_attention": gated softmax attention) or, without the
  list, by ``full_attention_interval`` (the classes' default: every 4th block full). Each block
  becomes two hybrid layers (``ModelSpec.hybrid_pattern``): "G" or "*", then "E" (MoE) or "-" (a
  dense SwiGLU MLP of ``intermediate_size``: Qwen3.5's dense models, Qwen3-Next's
  ``mlp_only_layers`` and its ``decoder_sparse_step``).
- Gated DeltaNet: ``linear_num_key_heads`` x ``linear_key_head_dim`` queries and keys,
  ``linear_num_value_heads`` x ``linear_value_head_dim`` values, ``linear_conv_kernel_dim``; the
  kernels' chunk of 64 (flash-linear-attention's ``chunk_gated_delta_rule``).
- Attention: ``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, q/k RMSNorm over a head,
  the output gate (``attn_output_gate``, always on in Qwen3-Next), RoPE (only a
  ``partial_rotary_factor`` of each head is rotated: the rotary work is counted over the whole head).
- MoE: ``num_experts`` of ``moe_intermediate_size``, ``num_experts_per_tok``, one shared expert of
  ``shared_expert_intermediate_size``; its one-column sigmoid gate is not counted (as Qwen2-MoE's).
- Multi-token prediction: ``mtp_num_hidden_layers`` (Qwen3.5) depths of a gated-attention block
  ("*E" or "*-"); Qwen3-Next's config does not say (its checkpoints carry one depth that
  Transformers ignores): none unless the scenario's ``[model] mtp_layers`` asks.
- RMSNorm (zero-centred, the same weights), untied head unless ``tie_word_embeddings``.

Refused in one line naming the key: a layer kind other than the two, an activation other than SiLU.
"""
from __future__ import annotations

from parsim.model.hf_keys import HFKeys

GDN = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
ARCHITECTURES = {"Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5ForConditionalGeneration": "qwen3_5",
                 "Qwen3_5ForCausalLM": "qwen3_5", "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
                 "Qwen3_5MoeForCausalLM": "qwen3_5_moe"}
TEXT_TYPES = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe_text": "qwen3_5_moe"}
"""A Qwen3.5 wrapper's text_config model_type -> its family here."""
_MIXERS = {"linear_attention": "G", "full_attention": "*"}
GDN_CHUNK = 64
"""flash-linear-attention's ``chunk_gated_delta_rule`` chunk (the config does not carry it)."""


def _mixers(c: HFKeys, n: int) -> str:
    kinds = c.str_list("layer_types")
    if kinds is None:
        every = c.int("full_attention_interval", 4)
        if every <= 0:
            raise c.error("full_attention_interval", f"must be positive, got {every}")
        kinds = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)]
    if len(kinds) != n:
        raise c.error("layer_types", f"{len(kinds)} entries for num_hidden_layers={n}")
    odd = next((k for k in kinds if k not in _MIXERS), None)
    if odd is not None:
        raise c.error("layer_types", f"{odd!r} is not one of {', '.join(_MIXERS)} (this family's two mixers)")
    return "".join(_MIXERS[k] for k in kinds)


def _ffns(c: HFKeys, n: int) -> str:
    """Per block "E" (MoE) or "-" (dense), as the family's decoder layer decides."""
    if c.model_type == "qwen3_5":
        return "-" * n
    if c.model_type == "qwen3_5_moe":
        return "E" * n
    step = c.int("decoder_sparse_step", 1)
    if step < 1:
        raise c.error("decoder_sparse_step", f"must be at least 1 (every step-th layer is MoE), got {step}")
    dense = set(c.int_list("mlp_only_layers") or [])
    experts = c.int("num_experts", 512)
    return "".join("E" if experts > 0 and i not in dense and (i + 1) % step == 0 else "-" for i in range(n))


def gdn_fields(c: HFKeys, tied: bool | None) -> dict:
    """ModelSpec fields (all but name) of a Qwen3-Next / Qwen3.5 config. ``tied``: a wrapper's
    tie_word_embeddings, or None to read it here (the classes' default: false)."""
    n = c.int("num_hidden_layers")
    if not 0 < n <= 50_000:  # two hybrid layers a block
        raise c.error("num_hidden_layers", f"{n:,} blocks: expected 1 to 50,000")
    mixers, ffns = _mixers(c, n), _ffns(c, n)
    act = c.data.get("hidden_act", "silu")
    if act != "silu":
        raise c.error("hidden_act", f"{act!r} is not modelled (this family's MLPs and experts are SwiGLU)")
    heads = c.int("num_attention_heads", 16)
    f = dict(n_layers=2 * n, d_model=c.int("hidden_size"), n_heads=heads,
             n_kv_heads=c.int("num_key_value_heads", 2), head_dim=c.int("head_dim", 256),
             d_ff=c.int("intermediate_size", 5632), vocab_size=c.int("vocab_size"), ffn="swiglu",
             norm="rmsnorm", position="rope", qk_norm=True,
             attn_output_gate=c.bool("attn_output_gate", True),
             bias=c.bool("attention_bias", False),
             tied_embeddings=c.bool("tie_word_embeddings", False) if tied is None else tied,
             max_seq_len=c.int("max_position_embeddings", 32768),
             hybrid_pattern="".join(m + e for m, e in zip(mixers, ffns)),
             gdn_key_heads=c.int("linear_num_key_heads", 16), gdn_value_heads=c.int("linear_num_value_heads", 32),
             gdn_key_dim=c.int("linear_key_head_dim", 128), gdn_value_dim=c.int("linear_value_head_dim", 128),
             gdn_conv_kernel=c.int("linear_conv_kernel_dim", 4), gdn_chunk=GDN_CHUNK)
    if f["gdn_key_heads"] <= 0 or f["gdn_value_heads"] % f["gdn_key_heads"]:
        raise c.error("linear_num_key_heads", f"{f['gdn_key_heads']} key heads must divide linear_num_value_heads="
                      f"{f['gdn_value_heads']} (each serves an equal run of value heads)")
    if "E" in ffns:
        f.update(n_experts=c.int("num_experts", 512), top_k=c.int("num_experts_per_tok", 10),
                 d_ff_expert=c.int("moe_intermediate_size", 512))
        shared = c.int("shared_expert_intermediate_size", 0)
        if shared:
            f.update(n_shared_experts=1, d_ff_shared=shared)
    mtp = c.int("mtp_num_hidden_layers", 0)
    if mtp:
        f.update(mtp_layers=mtp, mtp_pattern="*" + ("E" if "E" in ffns else "-"))
    return f
