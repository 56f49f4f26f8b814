"""Hugging Face config.json -> ModelSpec: the families that use Llama's key names
(``hidden_size``, ``intermediate_size``, ``num_hidden_layers``, ...) but build their blocks
differently. ``parsim.model.hf`` reads the shared keys; this module says, per family, what
its Transformers model class does differently (each from that class's modules):

- gemma: GeGLU (gate/up/down, SwiGLU's shapes), RMSNorm, head_dim from the config (256 in
  Gemma 7B), LM head tied to the embedding unless told otherwise.
- gemma2: Gemma's block with four norms (input, post-attention, pre- and post-feedforward:
  ``block_norms`` 4) and sliding-window attention on every other layer starting with the
  first (``layer_types``, else the class's default pattern).
- gemma3_text (Gemma 3's language model; ``gemma3`` wraps it in text_config): Gemma 2's block
  with per-head q/k RMSNorms and five sliding layers to one full one
  (``sliding_window_pattern``, default 6).
- olmo2: post-norm blocks (two norms, on each sub-layer's output) with q/k RMSNorms over the
  whole q and k projections; olmoe: OLMo's MoE (pre-norm, the same q/k norms, routed experts
  only).
- phi3: Llama's shapes with fused qkv_proj / gate_up_proj (the same weights); a
  ``sliding_window`` is named in not_modelled as for Mistral.
- granite, granitemoe, granitemoeshared: Llama's shapes (the multipliers scale activations,
  no weights); the MoE ones with ``num_local_experts`` routed experts of ``intermediate_size``
  and, in the shared variant, one shared expert of ``shared_intermediate_size``.
- cohere (Command R): one LayerNorm with a scale only (no shift) feeding attention and MLP
  side by side, tied head; ``use_qk_norm`` adds per-head LayerNorms over q and k (Command R+).
- starcoder2: GeLU MLP (c_fc, c_proj: GPT's two matrices) and LayerNorm, biases on every
  linear layer (``use_bias``), tied head by default.
- nemotron: squared-ReLU MLP (up, down: two matrices), LayerNorm1P (scale and shift), no
  biases, partial rotary (no weights).
- glm4_moe (GLM-4.5): DeepSeek-V3's MoE layout (``first_k_dense_replace`` dense layers,
  routed + shared experts, multi-token prediction) on grouped-query attention with q/k/v
  biases and optional per-head q/k RMSNorms (``use_qk_norm``).
"""
from __future__ import annotations

from parsim.model.hf_keys import HFKeys

LLAMA_KEYED_DENSE = ("gemma", "gemma2", "gemma3_text", "olmo2", "phi3", "granite", "cohere", "starcoder2",
                     "nemotron")
"""Dense families with Llama's key names (beyond llama, mistral, qwen2, qwen3)."""
LLAMA_KEYED_MOE = ("olmoe", "granitemoe", "granitemoeshared", "glm4_moe")
"""Mixture-of-experts families with Llama's key names (beyond mixtral, qwen*_moe, deepseek*)."""

TIED_DEFAULT = {"gemma": True, "gemma2": True, "gemma3_text": True, "cohere": True, "starcoder2": True}
"""``tie_word_embeddings`` when a config leaves it out (the family's config class default);
every other family: false."""

ARCHITECTURES = {
    "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3_text",
    "Olmo2ForCausalLM": "olmo2", "OlmoeForCausalLM": "olmoe", "Phi3ForCausalLM": "phi3",
    "GraniteForCausalLM": "granite", "GraniteMoeForCausalLM": "granitemoe",
    "GraniteMoeSharedForCausalLM": "granitemoeshared", "CohereForCausalLM": "cohere",
    "Starcoder2ForCausalLM": "starcoder2", "NemotronForCausalLM": "nemotron", "Glm4MoeForCausalLM": "glm4_moe",
}
"""Model classes (``architectures``) of these families, for configs without a known model_type."""


def default_layer_types(c: HFKeys, n_layers: int) -> list[str] | None:
    """The family's sliding-window pattern when the config gives no ``layer_types`` (the
    config class's default), None for families without one."""
    if c.model_type == "gemma2":  # Gemma2Config: sliding on layers 0, 2, 4, ...
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    if c.model_type == "gemma3_text":  # Gemma3TextConfig: every sliding_window_pattern-th layer is full
        every = c.int("sliding_window_pattern", 6)
        if every <= 0:
            raise c.error("sliding_window_pattern", f"must be positive, got {every}")
        return ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n_layers)]
    return None


def family_fields(c: HFKeys, f: dict) -> dict:
    """What one of these families changes in the Llama-style fields ``f`` (a new dict)."""
    mt = c.model_type
    f = dict(f)
    if mt in ("gemma", "gemma2", "gemma3_text"):
        c.expect("attention_bias", False, False, "Gemma attention without biases")
        # GemmaConfig, Gemma2Config and Gemma3TextConfig default head_dim to 256, not hidden / heads
        f.update(bias=False, qkv_bias=False, head_dim=c.int("head_dim", 256))
        if mt != "gemma":
            f["block_norms"] = 4
        if mt == "gemma3_text":
            f["qk_norm"] = True  # q_norm / k_norm: RMSNorm(head_dim)
    elif mt in ("olmo2", "olmoe"):
        f.update(qk_norm=True, qk_norm_width="projection", bias=False, qkv_bias=False)
    elif mt == "cohere":
        f.update(norm="layernorm", norm_shift=False, block_norms=1, parallel_residual=True,
                 qk_norm=c.bool("use_qk_norm", False), qk_norm_width="projection")
    elif mt == "starcoder2":
        use_bias = c.bool("use_bias", True)
        f.update(ffn="gelu", norm="layernorm", bias=use_bias, qkv_bias=False)
    elif mt == "nemotron":
        f.update(ffn="gelu", norm="layernorm")  # relu2's up/down: the two-matrix shapes
    elif mt == "glm4_moe":
        # q/k/v biases (attention_bias), none on o_proj; optional per-head q/k RMSNorm
        f.update(qkv_bias=c.bool("attention_bias", False), bias=False, qk_norm=c.bool("use_qk_norm", False))
    return f


def moe_fields(c: HFKeys) -> dict | None:
    """Routed/shared expert fields of these MoE families; None for others."""
    mt = c.model_type
    if mt == "olmoe":  # every layer MoE, intermediate_size is one expert's
        return dict(n_experts=c.int("num_experts"), top_k=c.int("num_experts_per_tok"),
                    d_ff_expert=c.int("intermediate_size"))
    if mt in ("granitemoe", "granitemoeshared"):
        f = dict(n_experts=c.int("num_local_experts"), top_k=c.int("num_experts_per_tok"),
                 d_ff_expert=c.int("intermediate_size"))
        shared = c.int("shared_intermediate_size", 0) if mt == "granitemoeshared" else 0
        if shared:
            f.update(n_shared_experts=1, d_ff_shared=shared)
        return f
    return None
