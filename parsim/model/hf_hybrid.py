"""Hugging Face config.json -> ModelSpec fields for NVIDIA's hybrid Mamba-2 models, ``nemotron_h``
(Nemotron-H, Nemotron Nano 2, Nemotron 3), as Transformers' ``NemotronHConfig`` reads them.

- The layers: ``hybrid_override_pattern`` (one symbol a layer: "M" Mamba-2, "*" attention, "-" MLP,
  "E" MoE; ``ModelSpec.hybrid_pattern``) or, in newer files, ``layers_block_type`` (a list of
  "mamba" / "linear_attention", "attention" / "full_attention", "mlp", "moe");
  ``num_hidden_layers``, when given, must agree with it.
- Attention: ``num_attention_heads``, ``num_key_value_heads``, ``head_dim`` (older files:
  ``attention_head_dim``; the class's default 128); no position encoding (Megatron-Core builds these
  models with ``position_embedding_type = "none"``).
- Mamba-2: ``mamba_num_heads`` x ``mamba_head_dim`` (the mixer's inner width: ``expand`` sizes
  nothing once the heads are given), ``ssm_state_size``, ``n_groups``, ``conv_kernel``, ``chunk_size``.
- MLP: ``intermediate_size`` up and down with ``mlp_hidden_act`` relu2 (two matrices); MoE:
  ``n_routed_experts`` of ``moe_intermediate_size``, ``num_experts_per_tok``, ``n_shared_experts`` of
  ``moe_shared_expert_intermediate_size``, group-limited routing (``n_group``, ``topk_group``).
- RMSNorm, untied head by default, ``use_bias`` / ``mlp_bias`` / ``attention_bias`` /
  ``mamba_proj_bias`` all one way (biases on every linear layer, or none).

- LatentMoE (Nemotron 3 Super, Ultra): ``moe_latent_size``, the width the routed experts work in.
- Multi-token prediction: ``num_nextn_predict_layers`` depths (``mtp_layers``) of the block
  ``mtp_hybrid_override_pattern`` (or ``mtp_layers_block_type``; the class's default: attention
  then MoE, "*E") names (``mtp_pattern``).

Refused in one line naming the key: a gated MLP activation, biases on some linear layers only.
"""
from __future__ import annotations

from parsim.model.hf_keys import HFKeys

HYBRID = ("nemotron_h",)
ARCHITECTURES = {"NemotronHForCausalLM": "nemotron_h"}
_BLOCK_TYPES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
                "moe": "E"}
"""``layers_block_type`` names (the current and the legacy ones) -> hybrid symbols."""
_NON_GATED = ("relu2", "relu", "gelu", "silu", "gelu_pytorch_tanh")


def _pattern(c: HFKeys) -> str:
    if c.has("hybrid_override_pattern"):
        p = c.data["hybrid_override_pattern"]
        if not isinstance(p, str) or not p:
            raise c.error("hybrid_override_pattern", f"expected a non-empty string of layer symbols, got {p!r}")
        return p
    types = c.str_list("layers_block_type")
    if not types:
        raise c.error("hybrid_override_pattern", "missing (and no layers_block_type list): the layers' kinds")
    odd = next((t for t in types if t not in _BLOCK_TYPES), None)
    if odd is not None:
        raise c.error("layers_block_type", f"{odd!r} is not one of {', '.join(_BLOCK_TYPES)}")
    return "".join(_BLOCK_TYPES[t] for t in types)


def _bias(c: HFKeys) -> bool:
    keys = ("use_bias", "mlp_bias", "attention_bias", "mamba_proj_bias")
    values = {k: c.bool(k, False) for k in keys}
    if len(set(values.values())) > 1:
        on = ", ".join(k for k, v in values.items() if v)
        raise c.error(on.split(",")[0], f"biases on some linear layers only ({on}) are not modelled: parsim puts "
                      "them on every linear layer or none")
    return values["use_bias"]


def hybrid_fields(c: HFKeys, tied: bool | None) -> dict:
    """ModelSpec fields (all but name) of a ``nemotron_h`` config. ``tied``: a wrapper's
    tie_word_embeddings, or None to read it here (the class's default: false)."""
    pattern = _pattern(c)
    n = c.int("num_hidden_layers", len(pattern))
    if n != len(pattern):
        raise c.error("num_hidden_layers", f"{n} layers, but the layer pattern names {len(pattern)}")
    act = c.data.get("mlp_hidden_act", "relu2")
    if act not in _NON_GATED:
        raise c.error("mlp_hidden_act", f"{act!r} is not modelled (NemotronH's MLP is an up and a down "
                      f"projection with one of {', '.join(_NON_GATED)})")
    d = c.int("hidden_size")
    heads = c.int("num_attention_heads", 32)
    f = dict(n_layers=n, d_model=d, n_heads=heads, n_kv_heads=c.int("num_key_value_heads", 8),
             head_dim=c.first_int("head_dim", "attention_head_dim", default=128),
             d_ff=c.int("intermediate_size", 21504), vocab_size=c.int("vocab_size", 131072), ffn="gelu",
             norm="rmsnorm", position="none", bias=_bias(c),
             tied_embeddings=c.bool("tie_word_embeddings", False) if tied is None else tied,
             max_seq_len=c.int("max_position_embeddings", 4096), hybrid_pattern=pattern,
             mamba_heads=c.int("mamba_num_heads", 128), mamba_head_dim=c.int("mamba_head_dim", 64),
             mamba_state_dim=c.int("ssm_state_size", 128), mamba_groups=c.int("n_groups", 8),
             mamba_conv_kernel=c.int("conv_kernel", 4), mamba_chunk=c.int("chunk_size", 128))
    if "E" in pattern:
        f.update(n_experts=c.int("n_routed_experts", 8), top_k=c.int("num_experts_per_tok", 2),
                 d_ff_expert=c.int("moe_intermediate_size", 7688))
        shared = c.int("n_shared_experts", 1)
        if shared:
            f.update(n_shared_experts=shared, d_ff_shared=c.int("moe_shared_expert_intermediate_size", 7688))
        groups = c.int("n_group", 1)
        if groups > 1:
            f.update(expert_groups=groups, expert_groups_per_token=c.int("topk_group", 1))
        if c.has("moe_latent_size"):
            f["moe_latent_size"] = c.int("moe_latent_size")
    mtp = c.int("num_nextn_predict_layers", 0)
    if mtp:
        f.update(mtp_layers=mtp, mtp_pattern=_mtp_pattern(c))
    return f


def _mtp_pattern(c: HFKeys) -> str:
    """The MTP block's layers: ``mtp_hybrid_override_pattern`` or ``mtp_layers_block_type`` (the class's
    default: attention then MoE)."""
    if c.has("mtp_hybrid_override_pattern"):
        p = c.data["mtp_hybrid_override_pattern"]
        if not isinstance(p, str) or not p:
            raise c.error("mtp_hybrid_override_pattern", f"expected a non-empty string of layer symbols, got {p!r}")
        return p
    types = c.str_list("mtp_layers_block_type") or ["attention", "moe"]
    odd = next((t for t in types if t not in _BLOCK_TYPES), None)
    if odd is not None:
        raise c.error("mtp_layers_block_type", f"{odd!r} is not one of {', '.join(_BLOCK_TYPES)}")
    return "".join(_BLOCK_TYPES[t] for t in types)
