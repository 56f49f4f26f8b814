"""Model presets (the names users type in ``[model] preset = "..."``) and the [model] table loader.

Each preset names its source. Published parameter counts the presets reproduce are
checked in tests/test_model.py. ``parsim.model`` re-exports PRESETS, get_preset and
model_from_table.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from parsim.errors import ConfigError
from parsim.model.hf import WRAPPED_NOTE, dsa_note, model_from_hf_config
from parsim.model.spec import FIELD_NAMES, ModelSpec


def _gpt(name: str, n_layers: int, d_model: int, n_heads: int, vocab_size: int = 51200,
         max_seq_len: int = 2048) -> ModelSpec:
    """GPT-2/3 / Megatron GPT: MHA, gelu with d_ff = 4h, LayerNorm, biases, learned
    positions, LM head tied to the embedding. Params = 12lh^2 + 13lh + (V+s)h + 2h,
    the formula behind Narayanan et al. 2021 Table 1."""
    return ModelSpec(name, n_layers, d_model, n_heads, n_heads, 4 * d_model, vocab_size,
                     ffn="gelu", tied_embeddings=True, position="learned",
                     max_seq_len=max_seq_len, norm="layernorm", bias=True)


def _mcore(name: str, n_layers: int, d_model: int, n_heads: int) -> ModelSpec:
    """Megatron-Core GPT of the H100 weak-scaling table (Megatron-LM README, r0.8.0):
    vocab 131072, seq 4096. Megatron GPT defaults: gelu with d_ff = 4h, LayerNorm,
    linear biases, untied embeddings. We choose RoPE (no position weights): the
    names' sizes (7.1B, 70B, 177B, 462B) match 12lh^2 + 2Vh, i.e. untied and no
    learned position table worth counting."""
    return ModelSpec(name, n_layers, d_model, n_heads, n_heads, 4 * d_model, 131072,
                     ffn="gelu", tied_embeddings=False, position="rope", max_seq_len=4096,
                     norm="layernorm", bias=True)


def _llama(name: str, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int,
           vocab_size: int, max_seq_len: int) -> ModelSpec:
    """Llama family: SwiGLU, RMSNorm, RoPE, no biases, untied head."""
    return ModelSpec(name, n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab_size,
                     ffn="swiglu", max_seq_len=max_seq_len)


def _opt(name: str, n_layers: int, d_model: int, n_heads: int) -> ModelSpec:
    """OPT: Zhang et al. 2022 (arXiv:2205.01068) Table 1 (layers, heads, d_model; FFN 4 x d_model,
    2048-token context) with facebook/opt-* config.json's vocabulary (50272) and the HF class's
    layout: learned positions with 2 offset rows, LayerNorm, biases, ReLU FFN, head tied."""
    return ModelSpec(name, n_layers, d_model, n_heads, n_heads, 4 * d_model, 50272, ffn="gelu",
                     tied_embeddings=True, position="learned", max_seq_len=2048, position_offset=2,
                     norm="layernorm", bias=True)


def _gpt_oss(name: str, n_layers: int, n_experts: int) -> ModelSpec:
    """GPT-OSS: openai/gpt-oss-{20b,120b} config.json (shipped in tests/data/hf): d 2880, 64 query
    heads x 64, 8 KV heads, 201088 vocabulary, top-4 experts of width 2880 with biases, a learned
    sink per head, layers alternating a 128-token sliding window (even) and full attention (odd)."""
    types = tuple("sliding" if i % 2 == 0 else "full" for i in range(n_layers))
    return ModelSpec(name, n_layers, 2880, 64, 8, 2880, 201088, ffn="swiglu", head_dim=64,
                     max_seq_len=131072, bias=True, n_experts=n_experts, top_k=4, d_ff_expert=2880,
                     layer_types=types, sliding_window=128, attention_sinks=True)


_DEEPSEEK_V3 = ModelSpec("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, ffn="swiglu", max_seq_len=163840,
                         n_experts=256, top_k=8, n_shared_experts=1, d_ff_expert=2048, first_dense_layers=3,
                         q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                         v_head_dim=128, expert_groups=8, expert_groups_per_token=4)


def _nemotron_h(name: str, pattern: str, d_model: int, d_ff: int, n_heads: int, n_kv_heads: int,
                mamba_heads: int, mamba_head_dim: int = 64, mamba_state_dim: int = 128,
                max_seq_len: int = 8192, **moe) -> ModelSpec:
    """NVIDIA's hybrid Mamba-2 models (Hugging Face ``nemotron_h``), as Megatron-Bridge's recipes build
    them (src/megatron/bridge/recipes/nemotronh/h100/{nemotronh,nemotron_nano_v2,nemotron_3_nano}.py at
    067f987df: ``HybridModelProvider``): one symbol a layer (``hybrid_layer_pattern``), squared-ReLU MLPs
    of two matrices, RMSNorm, no biases, no position encoding (``position_embedding_type = "none"``),
    untied head, 131072 vocabulary, 8 Mamba groups, 128-dimensional attention heads."""
    return ModelSpec(name, len(pattern), d_model, n_heads, n_kv_heads, d_ff, 131072, ffn="gelu", head_dim=128,
                     position="none", max_seq_len=max_seq_len, hybrid_pattern=pattern, mamba_heads=mamba_heads,
                     mamba_head_dim=mamba_head_dim, mamba_state_dim=mamba_state_dim, **moe)


def _qwen_gdn(name: str, blocks: int, d_model: int, n_heads: int, gdn_value_heads: int, n_experts: int,
              top_k: int, d_ff_expert: int, vocab_size: int, d_ff: int, **extra) -> ModelSpec:
    """Qwen3-Next / Qwen3.5 MoE (Hugging Face ``qwen3_next`` / ``qwen3_5_moe``; :mod:`parsim.model.hf_gdn`):
    blocks of a Gated DeltaNet (three in four) or a gated attention (every fourth) mixer and an MoE
    FFN with one shared expert as wide as a routed one, each block two hybrid layers; 16 key heads and
    128-channel key and value heads; 2 KV heads of 256; RMSNorm, SwiGLU, RoPE, untied head. ``d_ff``: the
    config's dense width (no block uses it)."""
    pattern = "".join(("*" if (i + 1) % 4 == 0 else "G") + "E" for i in range(blocks))
    return ModelSpec(name, 2 * blocks, d_model, n_heads, 2, d_ff, vocab_size, ffn="swiglu", head_dim=256,
                     qk_norm=True, attn_output_gate=True, max_seq_len=262144, hybrid_pattern=pattern,
                     gdn_key_heads=16, gdn_value_heads=gdn_value_heads, n_experts=n_experts, top_k=top_k,
                     d_ff_expert=d_ff_expert, n_shared_experts=1, d_ff_shared=d_ff_expert, **extra)


_NEMOTRON_H_52 = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
_NEMOTRON_H_47B = ("M-M-M-M-M-M-M-M-M*-M-M-M-M-M-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-M-M---MM---M-M*"
                   "-M-M-M-M-M-")
_NEMOTRON_H_56B = ("M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*"
                   "-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-")


_LIST: list[ModelSpec] = [
    # GPT-3 175B: Brown et al. 2020 Table 2.1 (96 layers, d 12288, 96 heads, ctx 2048);
    # BPE vocab 50257 (GPT-2 tokenizer). Published 174.6B.
    _gpt("gpt3-175b", 96, 12288, 96, vocab_size=50257),
    # Narayanan et al. 2021 (arXiv:2104.04473) Table 1; published.json megatron21-table1-*.
    _gpt("megatron-1.7b", 24, 2304, 24),
    _gpt("megatron-3.6b", 30, 3072, 32),
    _gpt("megatron-7.5b", 36, 4096, 32),
    _gpt("megatron-18b", 40, 6144, 48),
    _gpt("megatron-39b", 48, 8192, 64),
    _gpt("megatron-76b", 60, 10240, 80),
    _gpt("megatron-145b", 80, 12288, 96),
    _gpt("megatron-310b", 96, 16384, 128),
    _gpt("megatron-530b", 105, 20480, 128),
    _gpt("megatron-1t", 128, 25600, 160),
    # Alpa's quick benchmark GPT (alpa-projects/alpa benchmark/alpa/README.md, GPTModelConfig(seq_len=1024,
    # hidden_size=2560, num_layers=32, num_heads=32, vocab_size=51200); Alpa reports 2.649B parameters).
    _gpt("alpa-gpt-2.6b", 32, 2560, 32, max_seq_len=1024),
    # Megatron-LM README H100 weak scaling; published.json megatron-core-h100-weak-*.
    _mcore("mcore-gpt-1.7b", 24, 2048, 16),
    _mcore("mcore-gpt-7.1b", 30, 4096, 32),
    _mcore("mcore-gpt-16b", 32, 6144, 48),
    _mcore("mcore-gpt-32b", 48, 7168, 56),
    _mcore("mcore-gpt-70b", 84, 8192, 64),
    _mcore("mcore-gpt-119b", 92, 10240, 80),
    _mcore("mcore-gpt-177b", 96, 12288, 96),
    _mcore("mcore-gpt-314b", 96, 16384, 128),
    _mcore("mcore-gpt-462b", 112, 18432, 144),
    # Llama 2: Touvron et al. 2023 + meta-llama/Llama-2-{7b,70b}-hf config.json.
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    # Llama 3 / 3.1: meta-llama/Meta-Llama-3-{8B,70B} and Llama-3.1-405B config.json
    # (Llama 3 paper Table 3 for 405B: 126 layers, d 16384, 128 heads, 8 KV heads, FFN 53248).
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 131072),
    # Mixtral 8x7B: mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024 (46.7B / 12.9B active).
    ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, ffn="swiglu", max_seq_len=32768,
              n_experts=8, top_k=2, d_ff_expert=14336),
    # Mixtral 8x22B: mistralai/Mixtral-8x22B-v0.1 config.json (56 layers, d 6144, 48 heads, 8 KV
    # heads, expert FFN 16384, 8 experts top-2, vocabulary 32768, 65536 positions); the block shapes
    # as Megatron-Core's MoE model zoo sets them (yanring/Megatron-MoE-ModelZoo
    # model_configs/benchmarking/Mixtral-8x22B.yaml). Mistral AI: 141B total / 39B active.
    ModelSpec("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, ffn="swiglu", max_seq_len=65536,
              n_experts=8, top_k=2, d_ff_expert=16384),
    # DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json; tech report arXiv:2412.19437
    # (671B total / 37B active, excluding the 14B multi-token-prediction module).
    # MLA attention; layers 0-2 dense (d_ff 18432), 58 MoE layers of 256 routed + 1 shared expert.
    _DEEPSEEK_V3,
    # DeepSeek-V3.2: deepseek-ai/DeepSeek-V3.2 config.json (shipped): DeepSeek-V3's shapes plus the
    # lightning indexer of DeepSeek Sparse Attention, which is not modelled (see not_modelled).
    dataclasses.replace(_DEEPSEEK_V3, name="deepseek-v3.2", not_modelled=(dsa_note(64, 128, 2048),)),
    # Kimi K2: moonshotai/Kimi-K2-Instruct config.json (shipped; model_type kimi_k2, class
    # DeepseekV3ForCausalLM): DeepSeek-V3 layout with 64 heads, 384 experts, one dense layer,
    # 163840 vocabulary. Model card: 1T total / 32B activated.
    ModelSpec("kimi-k2", 61, 7168, 64, 64, 18432, 163840, ffn="swiglu", max_seq_len=131072,
              n_experts=384, top_k=8, n_shared_experts=1, d_ff_expert=2048, first_dense_layers=1,
              q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
              v_head_dim=128),
    # GPT-OSS (OpenAI model card, arXiv:2508.10925: 20.9B / 3.6B active, 116.8B / 5.1B active).
    _gpt_oss("gpt-oss-20b", 24, 32),
    _gpt_oss("gpt-oss-120b", 36, 128),
    # Llama 4 Scout, the text model: meta-llama/Llama-4-Scout-17B-16E-Instruct config.json's
    # text_config (shipped): 48 MoE layers of 16 routed experts (top-1) + 1 shared expert, width
    # 8192; 40 heads x 128, 8 KV heads; chunked attention (8192) on the RoPE layers, full
    # attention on every 4th (NoPE) layer. Meta: 109B total / 17B active with the vision encoder.
    ModelSpec("llama4-scout", 48, 5120, 40, 8, 16384, 202048, ffn="swiglu", head_dim=128,
              max_seq_len=10485760, n_experts=16, top_k=1, n_shared_experts=1, d_ff_expert=8192,
              layer_types=tuple("full" if (i + 1) % 4 == 0 else "chunked" for i in range(48)),
              attention_chunk=8192, not_modelled=(WRAPPED_NOTE,)),
    # Qwen3 MoE: Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json; Qwen3 tech report
    # (arXiv:2505.09388) Table 2: 30.5B/3.3B and 235B/22B; q/k RMSNorm, head_dim 128, no shared experts.
    ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, ffn="swiglu", head_dim=128,
              max_seq_len=40960, n_experts=128, top_k=8, d_ff_expert=768, qk_norm=True),
    ModelSpec("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, ffn="swiglu", head_dim=128,
              max_seq_len=40960, n_experts=128, top_k=8, d_ff_expert=1536, qk_norm=True),
    # Classic MoE families as decoder-only stacks (parsim models decoders; the originals'
    # encoder-decoder cross-attention, < 0.5% of their weights, is left out). MoE replaces
    # every other FFN (moe_every=2, first MoE at layer 1); gelu stands for ReLU/GeLU FFNs.
    # Switch-Base-128 (top-1): Fedus et al. 2021 (arXiv:2101.03961) Table 9: T5-Base d 768,
    # d_ff 3072, 12 heads, 12+12 layers, 128 experts, capacity factor 1.25; 7.4B params.
    ModelSpec("switch-base-128", 24, 768, 12, 12, 3072, 32128, ffn="gelu", tied_embeddings=True,
              max_seq_len=512, n_experts=128, top_k=1, moe_every=2, first_dense_layers=1,
              capacity_factor=1.25),
    # GShard MoE(2048E, 36L) (top-2): Lepikhin et al. 2020 (arXiv:2006.16668) Table 3: d 1024,
    # d_ff 8192, 16 heads, 36 layers, 2048 experts, capacity 2N/E (capacity_factor 1.0 here,
    # where capacity = factor * tokens * top_k / n_experts); "600B" (this stack counts 619B).
    ModelSpec("gshard-600b", 36, 1024, 16, 16, 8192, 32000, ffn="gelu", tied_embeddings=True,
              max_seq_len=1024, n_experts=2048, top_k=2, moe_every=2, first_dense_layers=1,
              capacity_factor=1.0),
    # GLaM (top-2): Du et al. 2022 (arXiv:2112.06905) Table 4. 64B/64E: 64 layers, d 8192,
    # d_ff 32768, 128 heads x 128, 64 experts every other layer, 256K vocabulary: 1.162T total
    # (this stack: 1.153T), 96.6B activated (this stack counts 88.0B: the paper's activated
    # figure is not reproducible from Table 4 together with its total; see tests/test_moe.py).
    # 8B/64E: 32 layers, d 4096, d_ff 16384, 32 heads: 143B total, 8.7B activated (here 9.6B).
    ModelSpec("glam-64e", 64, 8192, 128, 128, 32768, 256000, ffn="gelu", head_dim=128,
              tied_embeddings=True, max_seq_len=1024, n_experts=64, top_k=2, moe_every=2,
              first_dense_layers=1, capacity_factor=2.0),
    ModelSpec("glam-8b-64e", 32, 4096, 32, 32, 16384, 256000, ffn="gelu", head_dim=128,
              tied_embeddings=True, max_seq_len=1024, n_experts=64, top_k=2, moe_every=2,
              first_dense_layers=1, capacity_factor=2.0),
]

_LIST += [
    # GPT-2 small: openai-community/gpt2 config.json (shipped): 12 layers, d 768, 12 heads,
    # 1024 positions, vocabulary 50257; 124M parameters.
    dataclasses.replace(_gpt("gpt2", 12, 768, 12, vocab_size=50257, max_seq_len=1024),
                        fused_qkv=True),  # GPT2Attention.c_attn
    # GPT-NeoX-20B: EleutherAI/gpt-neox-20b config.json (shipped) and Black et al. 2022
    # (arXiv:2204.06745): 44 layers, d 6144, 64 heads, FFN 24576, rotary on 25% of each head,
    # parallel attention + MLP, untied, vocabulary padded to 50432. Model card: 20,554,567,680.
    ModelSpec("gpt-neox-20b", 44, 6144, 64, 64, 24576, 50432, ffn="gelu", max_seq_len=2048,
              norm="layernorm", bias=True, parallel_residual=True, fused_qkv=True),  # query_key_value
    # OPT: Zhang et al. 2022 Table 1; facebook/opt-66b config.json shipped (OPT-175B's weights
    # and config are not on the Hub: its row is the paper's).
    _opt("opt-30b", 48, 7168, 56),
    _opt("opt-66b", 64, 9216, 72),
    _opt("opt-175b", 96, 12288, 96),
    # BLOOM: BigScience 2022 (arXiv:2211.05100) Table 3 and the bigscience/bloom model card:
    # 70 layers, d 14336, 112 heads, vocabulary 250880 (padded), ALiBi, LayerNorm after the
    # embedding, tied head, 2048-token training sequences; 176,247,271,424 parameters.
    ModelSpec("bloom-176b", 70, 14336, 112, 112, 4 * 14336, 250880, ffn="gelu", tied_embeddings=True,
              position="alibi", max_seq_len=2048, norm="layernorm", bias=True, embedding_norm=True,
              fused_qkv=True),  # BloomAttention.query_key_value
]

def _alternating(n_layers: int, every: int) -> tuple[str, ...]:
    """Sliding-window layers with a full-attention one every ``every``-th (Gemma 2: 2, Gemma 3: 6;
    the first layer slides)."""
    return tuple("full" if (i + 1) % every == 0 else "sliding" for i in range(n_layers))


# Widely benchmarked models, each from its Hub config.json (shipped in tests/data/hf; where each
# copy comes from: tests/data/hf/SOURCES.md); tests/test_hf_families.py imports every file and
# checks it gives the preset, and the counts against published or exact weight totals.
_LIST += [
    # Llama 2 13B, Llama 3.1 8B / 70B (the Llama 3 shapes with 131072 positions), Llama 3.2 1B / 3B
    # (tied heads), Llama 4 Maverick's text model (128 routed experts, top-1, + a shared expert on
    # every other layer; dense FFN of 16384 between; chunked attention off every 4th layer).
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
    _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
    dataclasses.replace(_llama("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, 131072), head_dim=64,
                        tied_embeddings=True),
    dataclasses.replace(_llama("llama3.2-3b", 28, 3072, 24, 8, 8192, 128256, 131072), head_dim=128,
                        tied_embeddings=True),
    ModelSpec("llama4-maverick", 48, 5120, 40, 8, 16384, 202048, ffn="swiglu", head_dim=128,
              max_seq_len=1048576, n_experts=128, top_k=1, n_shared_experts=1, d_ff_expert=8192, moe_every=2,
              first_dense_layers=1, layer_types=tuple("full" if (i + 1) % 4 == 0 else "chunked" for i in range(48)),
              attention_chunk=8192, not_modelled=(WRAPPED_NOTE,)),
    # Mistral NeMo 12B (head_dim 128 < 5120 / 32) and Mistral Small 3.1's language model (24B with
    # its vision encoder).
    dataclasses.replace(_llama("mistral-nemo-12b", 40, 5120, 32, 8, 14336, 131072, 128000), head_dim=128),
    dataclasses.replace(_llama("mistral-small-24b", 40, 5120, 32, 8, 32768, 131072, 131072), head_dim=128,
                        not_modelled=(WRAPPED_NOTE,)),
    # Mistral 7B v0.1 (its 4096-token sliding window counted as full attention), Qwen2 7B and
    # Qwen1.5-MoE-A2.7B (60 routed experts of 1408, top-4, one shared expert of 5632): their Hub
    # configs, shipped since the importer's first tests.
    dataclasses.replace(_llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000, 32768),
                        not_modelled=("sliding_window=4096: every layer counted as full attention",)),
    dataclasses.replace(_llama("qwen2-7b", 28, 3584, 28, 4, 18944, 152064, 131072), qkv_bias=True),
    ModelSpec("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 5632, 151936, ffn="swiglu", max_seq_len=8192, n_experts=60,
              top_k=4, n_shared_experts=1, d_ff_expert=1408, d_ff_shared=5632, qkv_bias=True),
    # Qwen2.5 (q/k/v biases) and Qwen3 dense (q/k RMSNorm; Qwen3-32B's head_dim 128 > 5120 / 64).
    dataclasses.replace(_llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 131072), qkv_bias=True),
    dataclasses.replace(_llama("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 32768), qkv_bias=True),
    dataclasses.replace(_llama("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, 40960), head_dim=128, qk_norm=True),
    dataclasses.replace(_llama("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 40960), head_dim=128, qk_norm=True),
    # DeepSeek-V2 (236B / 21B active) and V2-Lite (15.7B): MLA (V2-Lite without the query
    # down-projection), one dense layer, 160 (64) routed + 2 shared experts, top-6.
    ModelSpec("deepseek-v2", 60, 5120, 128, 128, 12288, 102400, ffn="swiglu", max_seq_len=163840,
              n_experts=160, top_k=6, n_shared_experts=2, d_ff_expert=1536, first_dense_layers=1,
              expert_groups=8, expert_groups_per_token=3, q_lora_rank=1536, kv_lora_rank=512,
              qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    ModelSpec("deepseek-v2-lite", 27, 2048, 16, 16, 10944, 102400, ffn="swiglu", max_seq_len=163840,
              n_experts=64, top_k=6, n_shared_experts=2, d_ff_expert=1408, first_dense_layers=1,
              kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
    # Gemma 2 9B / 27B (GeGLU, four norms a block, 4096-token windows on every other layer, tied)
    # and Gemma 3 1B (q/k norms, five 512-token window layers to one full one).
    ModelSpec("gemma2-9b", 42, 3584, 16, 8, 14336, 256000, ffn="swiglu", head_dim=256, tied_embeddings=True,
              max_seq_len=8192, block_norms=4, layer_types=_alternating(42, 2), sliding_window=4096),
    ModelSpec("gemma2-27b", 46, 4608, 32, 16, 36864, 256000, ffn="swiglu", head_dim=128, tied_embeddings=True,
              max_seq_len=8192, block_norms=4, layer_types=_alternating(46, 2), sliding_window=4096),
    ModelSpec("gemma3-1b", 26, 1152, 4, 1, 6912, 262144, ffn="swiglu", head_dim=256, tied_embeddings=True,
              max_seq_len=32768, block_norms=4, qk_norm=True, layer_types=_alternating(26, 6), sliding_window=512),
    # Phi-3-mini (3.8B; its 2047-token sliding window is counted as full attention).
    dataclasses.replace(_llama("phi3-mini", 32, 3072, 32, 32, 8192, 32064, 4096),
                        not_modelled=("sliding_window=2047: every layer counted as full attention",)),
    # OLMo-2 7B (post-norm; q/k RMSNorms over the whole projections) and OLMoE (64 experts, top-8).
    dataclasses.replace(_llama("olmo2-7b", 32, 4096, 32, 32, 11008, 100352, 4096), qk_norm=True,
                        qk_norm_width="projection"),
    ModelSpec("olmoe-1b-7b", 16, 2048, 16, 16, 1024, 50304, ffn="swiglu", n_experts=64, top_k=8, d_ff_expert=1024,
              qk_norm=True, qk_norm_width="projection"),
    # Falcon 7B (multi-query, one norm per parallel block), 40B and 180B (8 KV heads, two norms);
    # GeLU MLP 4x, LayerNorm, no linear biases, rotary, tied head.
    ModelSpec("falcon-7b", 32, 4544, 71, 1, 18176, 65024, tied_embeddings=True, max_seq_len=2048, norm="layernorm",
              block_norms=1, parallel_residual=True, fused_qkv=True),
    ModelSpec("falcon-40b", 60, 8192, 128, 8, 32768, 65024, tied_embeddings=True, max_seq_len=2048,
              norm="layernorm", parallel_residual=True, fused_qkv=True),
    ModelSpec("falcon-180b", 80, 14848, 232, 8, 59392, 65024, tied_embeddings=True, max_seq_len=2048,
              norm="layernorm", parallel_residual=True, fused_qkv=True),
    # DBRX (132B / 36B active): 16 GLU experts, top-4, LayerNorm with a scale only.
    ModelSpec("dbrx", 40, 6144, 48, 8, 10752, 100352, ffn="swiglu", max_seq_len=32768, norm="layernorm",
              norm_shift=False, n_experts=16, top_k=4, d_ff_expert=10752, fused_qkv=True),
    # GLM-4.5-Air (106B / 12B active): one dense layer, 128 routed + 1 shared expert, top-8, q/k/v
    # biases (its multi-token-prediction module: ``mtp_layers = 1`` in a scenario's [model] trains it).
    ModelSpec("glm-4.5-air", 46, 4096, 96, 8, 10944, 151552, ffn="swiglu", head_dim=128, max_seq_len=131072,
              n_experts=128, top_k=8, n_shared_experts=1, d_ff_expert=1408, first_dense_layers=1, qkv_bias=True),
    # MPT 7B / 30B: ALiBi, no biases (LayerNorms with a scale only), GeLU 4x, tied head.
    ModelSpec("mpt-7b", 32, 4096, 32, 32, 16384, 50432, tied_embeddings=True, position="alibi", max_seq_len=2048,
              norm="layernorm", norm_shift=False, fused_qkv=True),
    ModelSpec("mpt-30b", 48, 7168, 64, 64, 28672, 50432, tied_embeddings=True, position="alibi", max_seq_len=8192,
              norm="layernorm", norm_shift=False, fused_qkv=True),
    # Nemotron-4 15B (Parmar et al. 2024, arXiv:2402.16819, Table 1) and 340B (NVIDIA 2024,
    # arXiv:2406.11704, Table 1): 32 / 96 layers, hidden 6144 / 18432, 48 / 96 heads, 8 KV heads,
    # 4096-token sequences, 256,000 vocabulary; squared-ReLU MLP of 4x hidden (two matrices),
    # LayerNorm (NeMo's layernorm1p: scale and shift), RoPE, no biases, untied embeddings.
    ModelSpec("nemotron4-15b", 32, 6144, 48, 8, 24576, 256000, ffn="gelu", norm="layernorm", max_seq_len=4096),
    ModelSpec("nemotron4-340b", 96, 18432, 96, 8, 73728, 256000, ffn="gelu", norm="layernorm", max_seq_len=4096),
    # Nemotron-H 4B / 8B / 47B / 56B (arXiv:2504.03624; 56B: 54 Mamba-2, 54 MLP and 10 attention
    # layers), Nemotron Nano 2 9B / 12B (arXiv:2508.14444; 12B: "12.31B"), Nemotron 3 Nano 30B-A3B
    # (31.6B total, 3.2B active, 3.6B with embeddings: 23 Mamba-2, 23 MoE of 128 experts top-6 with
    # a shared expert, 6 attention layers; its HF config.json in tests/data/hf).
    _nemotron_h("nemotron-h-4b", _NEMOTRON_H_52, 3072, 12288, 32, 8, 112),
    _nemotron_h("nemotron-h-8b", _NEMOTRON_H_52, 4096, 21504, 32, 8, 128),
    _nemotron_h("nemotron-h-47b", _NEMOTRON_H_47B, 8192, 30720, 64, 8, 256, mamba_state_dim=256),
    _nemotron_h("nemotron-h-56b", _NEMOTRON_H_56B, 8192, 32768, 64, 8, 256, mamba_state_dim=256),
    _nemotron_h("nemotron-nano-9b-v2", "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-", 4480, 15680,
                40, 8, 128, mamba_head_dim=80, max_seq_len=131072),
    _nemotron_h("nemotron-nano-12b-v2", "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-", 5120,
                20480, 40, 8, 128, mamba_head_dim=80, max_seq_len=131072),
    _nemotron_h("nemotron-3-nano-30b-a3b", "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", 2688, 1856, 32, 2,
                64, max_seq_len=262144, n_experts=128, top_k=6, d_ff_expert=1856, n_shared_experts=1,
                d_ff_shared=3712),
    # Nemotron 3 Super 120B-A12B and Ultra 550B-A55B (their HF config.json in tests/data/hf): LatentMoE,
    # 512 experts top-22 working in a 1024- / 2048-wide latent space, a shared expert on d_model; 40 / 48
    # Mamba-2, 40 / 48 MoE and 8 / 12 attention layers; their MTP block ("*E") is a scenario's choice.
    _nemotron_h("nemotron-3-super-120b-a12b", "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*"
                "EMEMEMEM*EMEMEMEME", 4096, 2688, 32, 2, 128, max_seq_len=262144, n_experts=512, top_k=22,
                d_ff_expert=2688, n_shared_experts=1, d_ff_shared=5376, moe_latent_size=1024),
    _nemotron_h("nemotron-3-ultra-550b-a55b", "MEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEM*EMEMEM*"
                "EMEMEMEM*EMEMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME", 8192, 5120, 64, 2, 256, max_seq_len=262144,
                n_experts=512, top_k=22, d_ff_expert=5120, n_shared_experts=1, d_ff_shared=10240, moe_latent_size=2048),
    # Qwen3-Next-80B-A3B ("80B total parameters, 3B active"; 48 blocks, 512 experts of 512, top-10)
    # and Qwen3.5-397B-A17B ("397B total, 17B activated"; 60 blocks, 512 experts of 1024, top-10,
    # one MTP depth in its config): their HF configs in tests/data/hf (Qwen3-Coder-Next, the same
    # shapes as the 80B; Qwen3.5-397B-A17B's text_config).
    _qwen_gdn("qwen3-next-80b-a3b", 48, 2048, 16, 32, 512, 10, 512, 151936, 5120),
    _qwen_gdn("qwen3.5-397b-a17b", 60, 4096, 32, 64, 512, 10, 1024, 248320, 5632, mtp_layers=1, mtp_pattern="*E"),
    # Granite 3.1 3B-A800M: 40 experts of 512, top-8, tied head.
    ModelSpec("granite3-3b-a800m", 32, 1536, 24, 8, 512, 49155, ffn="swiglu", tied_embeddings=True,
              max_seq_len=131072, n_experts=40, top_k=8, d_ff_expert=512),
]

PRESETS: dict[str, ModelSpec] = {m.name: m for m in _LIST}


def get_preset(name: str) -> ModelSpec:
    """A preset by its user-facing name."""
    if name not in PRESETS:
        raise ConfigError(None, "model.preset", f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    return PRESETS[name]


_REQUIRED = ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size")


def model_from_table(table: dict, file: str) -> ModelSpec:
    """The scenario's [model] table -> ModelSpec.

    Either ``preset = "..."`` or ``hf_config = "path"`` (relative to the scenario file's
    directory), each with optional field overrides, or explicit fields (n_layers,
    d_model, n_heads, d_ff, vocab_size required; n_kv_heads defaults to n_heads, name
    to "custom"). Unknown keys and bad values raise ConfigError naming file and key.
    """
    if not isinstance(table, dict):
        raise ConfigError(file, "model", "expected a table")
    known = ("preset", "hf_config") + FIELD_NAMES
    for key in table:
        if key not in known:
            raise ConfigError(file, f"model.{key}", f"unknown key (known: {', '.join(known)})")
    preset, hf = table.get("preset"), table.get("hf_config")
    fields = {k: v for k, v in table.items() if k not in ("preset", "hf_config")}
    try:
        if preset is not None and hf is not None:
            raise ConfigError(None, "model.hf_config", "give either preset or hf_config, not both")
        if preset is not None:
            if not isinstance(preset, str):
                raise ConfigError(None, "model.preset", f"expected a string, got {preset!r}")
            return dataclasses.replace(get_preset(preset), **fields)
        if hf is not None:
            if not isinstance(hf, str):
                raise ConfigError(None, "model.hf_config", f"expected a path string, got {hf!r}")
            p = Path(hf)
            if not p.is_absolute():
                p = Path(file).parent / p
            return dataclasses.replace(model_from_hf_config(p), **fields)
        missing = [k for k in _REQUIRED if k not in fields]
        if missing:
            raise ConfigError(None, f"model.{missing[0]}",
                              "missing (give preset=..., hf_config=... or all of: " + ", ".join(_REQUIRED) + ")")
        fields.setdefault("name", "custom")
        fields.setdefault("n_kv_heads", fields["n_heads"])
        return ModelSpec(**fields)
    except ConfigError as err:
        if err.file is None:
            raise ConfigError(file, err.key, err.problem) from None
        raise
