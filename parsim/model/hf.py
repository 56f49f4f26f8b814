"""Hugging Face ``config.json`` -> ModelSpec.

Supported key styles (``model_type``, or the class in ``architectures``): llama, mistral,
qwen2, qwen3 (dense); mixtral, qwen2_moe, qwen3_moe, deepseek_v2/deepseek_v3 (MoE, the
DeepSeek ones with MLA attention). All of these use a gated FFN (SwiGLU; GeGLU has the
same shapes), RMSNorm and RoPE. ``tie_word_embeddings`` defaults to false, as in these
model classes. Ignored: sliding windows, rope scaling, quantization, DeepSeek's
multi-token-prediction layers (``num_nextn_predict_layers``), Qwen2-MoE's shared-expert
gate (d_model weights per layer), router bias buffers.

Errors name the file and the HF key: ``.../config.json: num_hidden_layers: missing ...``.
"""
from __future__ import annotations

import json
from pathlib import Path

from parsim.errors import ConfigError
from parsim.model.spec import ModelSpec

_DENSE = ("llama", "mistral", "qwen2", "qwen3")
_MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
SUPPORTED = _DENSE + _MOE
_ARCH = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}


class _Cfg:
    """Typed, error-naming access to the JSON dict."""

    def __init__(self, data: dict, file: str, model_type: str):
        self.data, self.file, self.model_type = data, file, model_type

    def int(self, key: str, default: int | None = None, required: bool = True) -> int | None:
        v = self.data.get(key)
        if v is None:
            if default is not None or not required:
                return default
            raise ConfigError(self.file, key, f"missing (required for model_type {self.model_type!r})")
        if not isinstance(v, int) or isinstance(v, bool):
            raise ConfigError(self.file, key, f"expected an integer, got {v!r}")
        return v

    def bool(self, key: str, default: bool) -> bool:
        v = self.data.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ConfigError(self.file, key, f"expected true or false, got {v!r}")
        return v


def _model_type(data: dict, file: str) -> str:
    mt = data.get("model_type")
    if mt is None:
        archs = data.get("architectures") or []
        mt = next((_ARCH[a] for a in archs if a in _ARCH), None)
        if mt is None:
            raise ConfigError(file, "model_type", "missing (and no known class in 'architectures')")
    if mt not in SUPPORTED:
        raise ConfigError(file, "model_type", f"unsupported {mt!r} (supported: {', '.join(SUPPORTED)})")
    return mt


def _moe_fields(c: _Cfg, n_layers: int) -> dict:
    mt = c.model_type
    if mt == "mixtral":
        return dict(n_experts=c.int("num_local_experts"), top_k=c.int("num_experts_per_tok"),
                    d_ff_expert=c.int("intermediate_size"))
    if mt in ("qwen2_moe", "qwen3_moe"):
        step = c.int("decoder_sparse_step", 1)
        f = dict(n_experts=c.int("num_experts"), top_k=c.int("num_experts_per_tok"),
                 d_ff_expert=c.int("moe_intermediate_size"),
                 moe_every=step, first_dense_layers=step - 1)  # HF: MoE iff (i+1) % step == 0
        shared = c.int("shared_expert_intermediate_size", 0)
        if shared:
            f.update(n_shared_experts=1, d_ff_shared=shared)
        dense = sorted(c.data.get("mlp_only_layers") or [])
        if dense:
            if dense != list(range(len(dense))) or step != 1:
                raise ConfigError(c.file, "mlp_only_layers",
                                  "only a leading run of dense layers (0..k-1) with decoder_sparse_step=1 is supported")
            f["first_dense_layers"] = len(dense)
        return f
    # deepseek_v2 / deepseek_v3: MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0
    freq, first = c.int("moe_layer_freq", 1), c.int("first_k_dense_replace", 0)
    first = next((i for i in range(first, n_layers) if i % freq == 0), n_layers)
    return dict(n_experts=c.int("n_routed_experts"), top_k=c.int("num_experts_per_tok"),
                d_ff_expert=c.int("moe_intermediate_size"), n_shared_experts=c.int("n_shared_experts", 0),
                moe_every=freq, first_dense_layers=first)


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (Llama/Mistral/Qwen2/Qwen3/Mixtral/Qwen-MoE/DeepSeek-V2/V3)."""
    path = Path(path)
    file = str(path)
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(file, None, f"cannot read HF config: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(file, None, f"not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(data, dict):
        raise ConfigError(file, None, "expected a JSON object")
    mt = _model_type(data, file)
    c = _Cfg(data, file, mt)
    n_layers, n_heads = c.int("num_hidden_layers"), c.int("num_attention_heads")
    attention_bias = c.bool("attention_bias", False)
    mlp_bias = c.bool("mlp_bias", False)
    fields = dict(
        name=path.parent.name if path.name == "config.json" and path.parent.name else path.stem,
        n_layers=n_layers, d_model=c.int("hidden_size"), n_heads=n_heads,
        n_kv_heads=c.int("num_key_value_heads", n_heads), d_ff=c.int("intermediate_size"),
        vocab_size=c.int("vocab_size"), ffn="swiglu", position="rope", norm="rmsnorm",
        head_dim=c.int("head_dim", required=False),
        tied_embeddings=c.bool("tie_word_embeddings", False),
        max_seq_len=c.int("max_position_embeddings", 4096),
        bias=attention_bias and mlp_bias,
        # q/k/v biases: always in Qwen2(-MoE); Llama's attention_bias also biases o_proj (d params, not counted)
        qkv_bias=mt in ("qwen2", "qwen2_moe") or (attention_bias and not mlp_bias),
        qk_norm=mt in ("qwen3", "qwen3_moe"),
    )
    if mt.startswith("deepseek"):
        fields.update(head_dim=None, q_lora_rank=c.int("q_lora_rank", 0),
                      kv_lora_rank=c.int("kv_lora_rank"), qk_nope_head_dim=c.int("qk_nope_head_dim"),
                      qk_rope_head_dim=c.int("qk_rope_head_dim"), v_head_dim=c.int("v_head_dim"),
                      bias=False, qkv_bias=False)
    if mt in _MOE:
        fields.update(_moe_fields(c, n_layers))
    try:
        return ModelSpec(**fields)
    except ConfigError as err:
        raise ConfigError(file, err.key, err.problem) from None
