"""Hugging Face ``config.json`` -> ModelSpec.

Supported key styles (``model_type``; an unknown ``model_type`` falls back to the first known
class in ``architectures``, so Kimi-K2's ``kimi_k2`` with ``DeepseekV3ForCausalLM`` reads as
DeepSeek-V3):

- llama, mistral, qwen2, qwen3 (dense); mixtral, qwen2_moe, qwen3_moe, deepseek_v2,
  deepseek_v3 (MoE, the DeepSeek ones with MLA attention): gated FFN (SwiGLU; GeGLU has the
  same shapes), RMSNorm, RoPE, ``tie_word_embeddings`` false unless given.
- deepseek_v32 (DeepSeek-V3.2): DeepSeek-V3 shapes; its lightning indexer and the sparse
  attention it selects are not modelled, which the spec's ``not_modelled`` says.
- gpt_oss (GPT-OSS): MoE with biases on attention, experts and router, a learned sink per
  head, and ``layer_types`` alternating 128-token sliding-window and full attention. Its
  clamped SwiGLU variant has SwiGLU's shapes.
- llama4 (Llama 4 text): MoE layers with a shared expert (``interleave_moe_layer_step`` or
  ``moe_layers``), dense layers of ``intermediate_size_mlp``, chunked attention on the RoPE
  layers (``attention_chunk_size``); its q/k L2 norm has no weights.
- gemma, gemma2, gemma3_text, olmo2, phi3, granite, cohere, starcoder2, nemotron (dense);
  olmoe, granitemoe, granitemoeshared, glm4_moe (MoE): Llama's key names, their own blocks,
  see parsim.model.hf_families.
- gpt2, gpt_neox, opt, bloom: see parsim.model.hf_classic; dbrx, mpt, falcon (their own key
  names): see parsim.model.hf_own_keys; nemotron_h (hybrid Mamba-2 / attention / MLP / MoE
  layers: Nemotron-H, Nemotron Nano 2, Nemotron 3): see parsim.model.hf_hybrid; qwen3_next, qwen3_5,
  qwen3_5_moe (Gated DeltaNet and gated attention blocks: Qwen3-Next, Qwen3.5): see parsim.model.hf_gdn.
- A wrapper whose language model sits in ``text_config`` (Llama 4, Qwen3-VL, Qwen3.5, Gemma 3,
  Mistral 3): the
  text model is imported (``tie_word_embeddings`` read from the wrapper when the text config
  lacks it) and ``not_modelled`` names the rest (vision encoder, projector).

``layer_types`` (full_attention / sliding_attention / chunked_attention) is honoured for every
family; any other kind is refused (Qwen3-Next's and Qwen3.5's linear_attention are their own family's). Ignored, and said so in
``not_modelled``: a Mistral/Qwen-style ``sliding_window`` given without ``layer_types``.
DeepSeek's multi-token-prediction modules (``num_nextn_predict_layers``) become
``mtp_layers``. Ignored silently (no weights, or not parsim's concern): rope scaling,
quantization, Qwen2-MoE's shared-expert gate
(d_model weights per layer), router bias buffers, activation clamps.

Errors name the file and the HF key: ``.../config.json: num_hidden_layers: missing ...``;
keys inside a wrapper read ``text_config.<key>``.
"""
from __future__ import annotations

import json
from pathlib import Path

from parsim.errors import ConfigError
from parsim.files import read_input_text
from parsim.model import hf_families as fam
from parsim.model.hf_classic import CLASSIC, classic_fields
from parsim.model.hf_gdn import ARCHITECTURES as GDN_ARCHITECTURES
from parsim.model.hf_gdn import GDN, gdn_fields
from parsim.model.hf_gdn import TEXT_TYPES as GDN_TEXT_TYPES
from parsim.model.hf_hybrid import ARCHITECTURES as HYBRID_ARCHITECTURES
from parsim.model.hf_hybrid import HYBRID, hybrid_fields
from parsim.model.hf_keys import HFKeys
from parsim.model.hf_own_keys import ARCHITECTURES as OWN_KEYS_ARCHITECTURES
from parsim.model.hf_own_keys import LEGACY_TYPES, OWN_KEYS, own_keys_fields
from parsim.model.spec import MAX_LAYERS, ModelSpec

_DENSE = ("llama", "mistral", "qwen2", "qwen3") + fam.LLAMA_KEYED_DENSE
_MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "deepseek_v32", "gpt_oss",
        "llama4") + fam.LLAMA_KEYED_MOE
SUPPORTED = _DENSE + _MOE + CLASSIC + OWN_KEYS + HYBRID + GDN
_ARCH = {
    "LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "mixtral", "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "DeepseekV32ForCausalLM": "deepseek_v32",
    "GptOssForCausalLM": "gpt_oss", "Llama4ForCausalLM": "llama4", "Llama4ForConditionalGeneration": "llama4",
    "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox", "OPTForCausalLM": "opt",
    "BloomForCausalLM": "bloom", **fam.ARCHITECTURES, **OWN_KEYS_ARCHITECTURES, **HYBRID_ARCHITECTURES,
    **GDN_ARCHITECTURES,
}
# the language model of a wrapper (its text_config's model_type) -> the family with its shapes
_TEXT_TYPES = {"llama4_text": "llama4", "qwen3_vl_text": "qwen3", "qwen3_vl_moe_text": "qwen3_moe",
               **GDN_TEXT_TYPES}
_LAYER_KINDS = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}
_STATE_SPACE = ("mamba", "mamba2", "jamba", "zamba", "zamba2", "bamba", "falcon_h1", "falcon_mamba",
                "granitemoehybrid", "minimax", "kimi_linear", "rwkv", "rwkv7", "lfm2", "plamo2",
                "recurrent_gemma", "xlstm")
"""Families whose mixers are state-space or linear-attention layers (alone or beside attention),
other than the hybrid families parsim models (``nemotron_h``'s Mamba-2 layers: ``parsim.model.hf_hybrid``;
Qwen3-Next's and Qwen3.5's Gated DeltaNet layers: ``parsim.model.hf_gdn``)."""
_NOT_DECODERS = ("t5", "mt5", "umt5", "bart", "mbart", "pegasus", "marian", "bert", "roberta", "deberta",
                 "deberta-v2", "electra", "albert", "distilbert", "whisper", "encoder-decoder")
"""Encoder-only and encoder-decoder families."""
WRAPPED_NOTE = ("everything outside text_config (e.g. a vision encoder and projector): "
                "only the language model is imported")
"""ModelSpec.not_modelled line of a model imported from a wrapper's text_config."""


def dsa_note(index_heads: int, index_head_dim: int, index_topk: int) -> str:
    """ModelSpec.not_modelled line of DeepSeek-V3.2 (DeepSeek Sparse Attention)."""
    return (f"DeepSeek-V3.2 lightning indexer ({index_heads} heads x {index_head_dim}, top-{index_topk} keys "
            "per query): its weights, its FLOPs and the sparse attention it selects; counts and FLOPs are DeepSeek-V3's")


def _model_type(data: dict, file: str, prefix: str = "") -> str | None:
    """The family of one config object: its model_type, else a known class in architectures."""
    mt = data.get("model_type")
    if mt is not None and not isinstance(mt, str):
        raise ConfigError(file, f"{prefix}model_type", f"expected a string, got {mt!r}")
    mt = _TEXT_TYPES.get(mt, LEGACY_TYPES.get(mt, mt))
    if mt in SUPPORTED:
        return mt
    if mt in _STATE_SPACE:
        raise ConfigError(file, f"{prefix}model_type", f"{mt!r} has state-space or linear-attention mixers "
                                                       "(Mamba, RWKV, linear attention) parsim does not model: it "
                                                       "models softmax-attention decoders, nemotron_h's hybrid "
                                                       "Mamba-2 layers and Qwen3-Next / Qwen3.5's Gated DeltaNet")
    if mt in _NOT_DECODERS:
        raise ConfigError(file, f"{prefix}model_type", f"{mt!r} is an encoder or encoder-decoder model: parsim "
                                                       "models decoder-only stacks")
    archs = data.get("architectures") or []
    if not isinstance(archs, list):
        raise ConfigError(file, f"{prefix}architectures", f"expected a list of class names, got {archs!r}")
    known = next((_ARCH[a] for a in archs if isinstance(a, str) and a in _ARCH), None)
    if known is not None or mt is None:
        return known
    raise ConfigError(file, f"{prefix}model_type", f"unsupported {mt!r} (and no known class in 'architectures'; "
                                                   f"supported: {', '.join(SUPPORTED)})")


def _language_model(data: dict, file: str) -> tuple[HFKeys, HFKeys | None]:
    """The config object of the language model (a wrapper's text_config) and the wrapper, if any."""
    inner = data.get("text_config")
    if inner is None:
        mt = _model_type(data, file)
        if mt is None:
            raise ConfigError(file, "model_type", "missing (and no known class in 'architectures')")
        return HFKeys(data, file, mt), None
    if not isinstance(inner, dict):
        raise ConfigError(file, "text_config", "expected a JSON object")
    mt = _model_type(inner, file, "text_config.") or _model_type(data, file)
    if mt is None:
        raise ConfigError(file, "text_config.model_type", "missing (and no known class in 'architectures')")
    return HFKeys(inner, file, mt, "text_config."), HFKeys(data, file, mt)


def _attention_layout(c: HFKeys, n_layers: int) -> dict:
    """layer_types / sliding_window / attention_chunk (none of them when every layer is full)."""
    kinds = c.str_list("layer_types") or fam.default_layer_types(c, n_layers)
    if kinds is None and c.model_type == "gpt_oss":  # GptOssConfig's default: sliding on even layers
        kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    if kinds is None and c.model_type == "llama4":  # Llama4TextConfig: chunked where RoPE is on
        every = c.int("no_rope_layer_interval", 4)
        if every <= 0:
            raise c.error("no_rope_layer_interval", f"must be positive, got {every}")
        rope = c.int_list("no_rope_layers") or [int((i + 1) % every != 0) for i in range(n_layers)]
        kinds = ["chunked_attention" if r else "full_attention" for r in rope]
    if kinds is None:
        return {}
    if len(kinds) != n_layers:
        raise c.error("layer_types", f"{len(kinds)} entries for num_hidden_layers={n_layers}")
    bad = next((k for k in kinds if k not in _LAYER_KINDS), None)
    if bad is not None:
        raise c.error("layer_types", f"{bad!r} layers are not supported (parsim models softmax attention: "
                                     f"{', '.join(_LAYER_KINDS)})")
    types = tuple(_LAYER_KINDS[k] for k in kinds)
    if set(types) == {"full"}:
        return {}
    out: dict = {"layer_types": types}
    if "sliding" in types:
        out["sliding_window"] = c.int("sliding_window")
    if "chunked" in types:
        out["attention_chunk"] = c.int("attention_chunk_size")
    return out


def _moe_layers(c: HFKeys, n_layers: int) -> dict:
    """Llama 4: moe_layers (or every interleave_moe_layer_step-th layer) as first_dense_layers + moe_every."""
    step = c.int("interleave_moe_layer_step", 1)
    layers = c.int_list("moe_layers")
    if layers is None:
        layers = list(range(step - 1, n_layers, step))
    every = layers[1] - layers[0] if len(layers) > 1 else 1
    if not layers or every <= 0 or layers != list(range(layers[0], n_layers, every)):
        raise c.error("moe_layers", "only evenly spaced MoE layers running to the last layer are supported")
    return dict(first_dense_layers=layers[0], moe_every=every)


def _moe_fields(c: HFKeys, n_layers: int) -> dict:
    mt = c.model_type
    own = fam.moe_fields(c)
    if own is not None:
        return own
    if mt in ("mixtral", "gpt_oss"):
        return dict(n_experts=c.int("num_local_experts"), top_k=c.first_int("num_experts_per_tok", "experts_per_token"),
                    d_ff_expert=c.int("intermediate_size"))
    if mt == "llama4":  # routed experts and the shared expert both have intermediate_size
        return dict(n_experts=c.int("num_local_experts"), top_k=c.int("num_experts_per_tok"),
                    d_ff_expert=c.int("intermediate_size"), n_shared_experts=1, **_moe_layers(c, n_layers))
    if mt in ("qwen2_moe", "qwen3_moe"):
        step = c.int("decoder_sparse_step", 1)
        if step < 1:
            raise c.error("decoder_sparse_step", f"must be at least 1 (every step-th layer is MoE), got {step}")
        f = dict(n_experts=c.int("num_experts"), top_k=c.int("num_experts_per_tok"),
                 d_ff_expert=c.int("moe_intermediate_size"),
                 moe_every=step, first_dense_layers=step - 1)  # HF: MoE iff (i+1) % step == 0
        shared = c.int("shared_expert_intermediate_size", 0)
        if shared:
            f.update(n_shared_experts=1, d_ff_shared=shared)
        dense = sorted(c.int_list("mlp_only_layers") or [])
        if dense:
            if dense != list(range(len(dense))) or step != 1:
                raise c.error("mlp_only_layers",
                              "only a leading run of dense layers (0..k-1) with decoder_sparse_step=1 is supported")
            f["first_dense_layers"] = len(dense)
        return f
    # deepseek_v2 / v3 / v32: MoE iff i >= first_k_dense_replace and i % moe_layer_freq == 0
    freq, first = c.int("moe_layer_freq", 1), c.int("first_k_dense_replace", 0)
    if freq < 1:
        raise c.error("moe_layer_freq", f"must be at least 1 (every freq-th layer is MoE), got {freq}")
    first = next((i for i in range(first, n_layers) if i % freq == 0), n_layers)
    return dict(n_experts=c.int("n_routed_experts"), top_k=c.int("num_experts_per_tok"),
                d_ff_expert=c.int("moe_intermediate_size"), n_shared_experts=c.int("n_shared_experts", 0),
                moe_every=freq, first_dense_layers=first)


def _notes(c: HFKeys, fields: dict) -> list[str]:
    """What this family's config holds that the spec leaves out (ModelSpec.not_modelled)."""
    notes = []
    window = c.int("sliding_window", required=False)
    # Phi-3 and StarCoder2 apply a given sliding_window to every layer (no use_sliding_window flag)
    if (window and "layer_types" not in fields and c.model_type not in ("gpt_oss", "llama4")
            and c.bool("use_sliding_window", c.model_type in ("mistral", "mixtral", "phi3", "starcoder2"))
            and window < fields["max_seq_len"]):
        notes.append(f"sliding_window={window}: every layer counted as full attention")
    if c.model_type == "deepseek_v32":
        notes.append(dsa_note(c.int("index_n_heads"), c.int("index_head_dim"), c.int("index_topk")))
    return notes


def _decoder_fields(c: HFKeys, tied: bool) -> dict:
    """ModelSpec fields (all but name) of a Llama-style family (everything but the classic ones)."""
    mt = c.model_type
    n_layers, n_heads = c.int("num_hidden_layers"), c.int("num_attention_heads")
    if not 0 < n_layers <= MAX_LAYERS:  # bounded before the per-layer lists below walk them
        raise c.error("num_hidden_layers", f"{n_layers:,} blocks: expected 1 to {MAX_LAYERS:,}")
    # the kind of attention first: a layer parsim cannot model is the error to report
    layout = _attention_layout(c, n_layers)
    c.expect("attn_output_gate", False, False, "a gated attention output is an extra projection parsim does not model")
    attention_bias, mlp_bias = c.bool("attention_bias", False), c.bool("mlp_bias", False)
    f = dict(
        n_layers=n_layers, d_model=c.int("hidden_size"), n_heads=n_heads,
        n_kv_heads=c.int("num_key_value_heads", n_heads), d_ff=c.int("intermediate_size"),
        vocab_size=c.int("vocab_size"), ffn="swiglu", position="rope", norm="rmsnorm",
        head_dim=c.int("head_dim", required=False), tied_embeddings=tied,
        max_seq_len=c.int("max_position_embeddings", 4096),
        bias=attention_bias and mlp_bias,
        # q/k/v biases: always in Qwen2(-MoE); Llama's attention_bias also biases o_proj (d params, not counted)
        qkv_bias=mt in ("qwen2", "qwen2_moe") or (attention_bias and not mlp_bias),
        qk_norm=mt in ("qwen3", "qwen3_moe"),
    )
    f.update(layout)
    f = fam.family_fields(c, f)
    if mt.startswith("deepseek"):
        f.update(head_dim=None, q_lora_rank=c.int("q_lora_rank", 0),
                 kv_lora_rank=c.int("kv_lora_rank"), qk_nope_head_dim=c.int("qk_nope_head_dim"),
                 qk_rope_head_dim=c.int("qk_rope_head_dim"), v_head_dim=c.int("v_head_dim"),
                 bias=False, qkv_bias=False)
    if mt.startswith("deepseek") or mt == "glm4_moe":
        # the checkpoint's multi-token-prediction modules (DeepSeek-V3, GLM-4.5: 1), trained
        # beside the model; ``mtp_layers = 0`` in the scenario's [model] leaves them out
        f["mtp_layers"] = c.int("num_nextn_predict_layers", 0)
        groups = c.int("n_group", 1)
        if groups > 1:  # group-limited routing (DeepSeek-V3: 8 groups, 4 a token; Kimi-K2: 1, none)
            f.update(expert_groups=groups, expert_groups_per_token=c.int("topk_group"))
    if mt == "gpt_oss":  # GptOssExperts and the router always carry biases; attention_bias adds q/k/v/o ones
        c.expect("attention_bias", True, True, "GPT-OSS experts and router always have biases; "
                                               "attention without them cannot be expressed")
        f.update(bias=True, qkv_bias=False, attention_sinks=True)
    if mt == "llama4":  # attention without biases (Llama4TextConfig forces it); L2 q/k norm: no weights
        dense = c.int("intermediate_size_mlp", required=False)
        f.update(d_ff=dense or f["d_ff"], bias=False, qkv_bias=False)
    if mt in _MOE:
        f.update(_moe_fields(c, n_layers))
    has_dense = mt == "llama4" and (f["first_dense_layers"] > 0 or f["moe_every"] > 1)
    if has_dense and not c.has("intermediate_size_mlp"):
        raise c.error("intermediate_size_mlp", "missing (required for the dense layers of model_type 'llama4')")
    notes = _notes(c, f)
    if notes:
        f["not_modelled"] = tuple(notes)
    return f


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (the families listed in this module's docstring)."""
    path = Path(path)
    file = str(path)
    try:
        data = json.loads(read_input_text(path))
    except OSError as e:
        raise ConfigError(file, None, f"cannot read HF config: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(file, None, f"not valid JSON: {e.msg} at line {e.lineno}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(file, None, f"not UTF-8 text (byte {e.start}): a config.json is JSON") from None
    except RecursionError:
        raise ConfigError(file, None, "nested too deeply to be a model config") from None
    if not isinstance(data, dict):
        raise ConfigError(file, None, "expected a JSON object")
    c, wrapper = _language_model(data, file)
    tied = None
    if wrapper is not None and not c.has("tie_word_embeddings"):
        tied = wrapper.bool("tie_word_embeddings", fam.TIED_DEFAULT.get(c.model_type, False))
    if c.model_type in CLASSIC:
        fields = classic_fields(c, tied)
    elif c.model_type in OWN_KEYS:
        fields = own_keys_fields(c, tied)
    elif c.model_type in HYBRID:
        fields = hybrid_fields(c, tied)
    elif c.model_type in GDN:
        fields = gdn_fields(c, tied)
    else:
        family_tied = fam.TIED_DEFAULT.get(c.model_type, False)
        fields = _decoder_fields(c, c.bool("tie_word_embeddings", family_tied) if tied is None else tied)
    if wrapper is not None:
        fields["not_modelled"] = fields.get("not_modelled", ()) + (WRAPPED_NOTE,)
    fields["name"] = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    try:
        return ModelSpec(**fields)
    except ConfigError as err:
        raise ConfigError(file, err.key, err.problem) from None
