"""What is trained: the model spec, its shapes (parameters, GEMMs, FLOPs, bytes), presets and
the Hugging Face config importer."""
from parsim.model.hf import SUPPORTED as HF_MODEL_TYPES
from parsim.model.hf import model_from_hf_config
from parsim.model.presets import PRESETS, get_preset, model_from_table
from parsim.model.shapes import (
                                 gdn_mixer_params,
                                 gdn_scan_flops,
                                 mamba_mixer_params,
                                 mamba_scan_flops,
                                 megatron_hybrid_flops,
                                 Gemm,
                                 PassFlops,
                                 active_params,
                                 attention_core_flops,
                                 causal_pairs,
                                 embedding_params,
                                 head_flops,
                                 head_gemm,
                                 head_params,
                                 layer_elementwise_bytes,
                                 layer_flops,
                                 layer_gemms,
                                 layer_params,
                                 megatron_flops_per_step,
                                 model_flops_per_step,
                                 mtp_block_is_moe,
                                 mtp_block_kinds,
                                 mtp_join_params,
                                 mtp_params,
                                 total_params,
                                 trained_params,
)
from parsim.model.spec import (
                                 ATTENTION_KINDS,
                                 FFN_KINDS,
                                 FIELD_NAMES,
                                 NORM_KINDS,
                                 POSITION_KINDS,
                                 ModelSpec,
                                 HYBRID_SYMBOLS,
                                 attention_kind,
                                 block_kind,
                                 has_attention,
                                 has_ffn,
                                 has_gdn,
                                 has_mamba,
                                 is_moe_layer,
                                 sublayers,
                                 uniform_model,
)

__all__ = [
    "ModelSpec", "FFN_KINDS", "FIELD_NAMES", "NORM_KINDS", "POSITION_KINDS", "ATTENTION_KINDS", "is_moe_layer",
    "attention_kind", "causal_pairs",
    "Gemm", "PassFlops", "PRESETS", "get_preset", "model_from_table", "model_from_hf_config", "HF_MODEL_TYPES",
    "layer_params", "embedding_params", "head_params", "total_params", "mtp_params", "mtp_join_params", "mtp_block_is_moe", "mtp_block_kinds", "trained_params",
    "active_params", "layer_gemms",
    "attention_core_flops", "layer_elementwise_bytes", "head_gemm", "layer_flops", "head_flops",
    "model_flops_per_step", "megatron_flops_per_step", "megatron_hybrid_flops",
    "HYBRID_SYMBOLS", "block_kind", "has_attention", "has_ffn", "has_mamba", "has_gdn", "sublayers", "uniform_model",
    "mamba_mixer_params", "mamba_scan_flops", "gdn_mixer_params", "gdn_scan_flops",
]
