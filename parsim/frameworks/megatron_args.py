"""Megatron-LM's command line as the importer reads it: the flags it knows (destination and
kind), their allowed values, and the parse (values, the flag each came as, and everything else
as written). Flags and choices are Megatron-LM's (``megatron/training/arguments.py`` and the
config dataclasses its argument groups are built from); facts only.
"""
from __future__ import annotations

from parsim.errors import ConfigError

SOURCE = "megatron arguments"
"""How messages name the input."""

# flag -> (destination, kind); kind: "int" | "float" | "str" | "list" (nargs="*" of str) |
# "true" (store_true) | "false" (store_false)
FLAGS: dict[str, tuple[str, str]] = {
    "--num-layers": ("num_layers", "int"),
    "--hidden-size": ("hidden_size", "int"),
    "--num-attention-heads": ("num_attention_heads", "int"),
    "--num-query-groups": ("num_query_groups", "int"),
    "--group-query-attention": ("group_query_attention", "true"),
    "--kv-channels": ("kv_channels", "int"),
    "--ffn-hidden-size": ("ffn_hidden_size", "int"),
    "--seq-length": ("seq_length", "int"),
    "--max-position-embeddings": ("max_position_embeddings", "int"),
    "--micro-batch-size": ("micro_batch_size", "int"),
    "--global-batch-size": ("global_batch_size", "int"),
    "--tensor-model-parallel-size": ("tp", "int"),
    "--pipeline-model-parallel-size": ("pp", "int"),
    "--context-parallel-size": ("cp", "int"),
    "--expert-model-parallel-size": ("ep", "int"),
    "--expert-tensor-parallel-size": ("etp", "int"),
    "--num-layers-per-virtual-pipeline-stage": ("layers_per_virtual_stage", "int"),
    "--num-virtual-stages-per-pipeline-rank": ("vpp", "int"),
    "--virtual-pipeline-model-parallel-size": ("vpp", "int"),  # the older spelling
    "--sequence-parallel": ("sequence_parallel", "true"),
    "--use-distributed-optimizer": ("distributed_optimizer", "true"),
    "--use-torch-fsdp2": ("fsdp", "true"),
    "--recompute-granularity": ("recompute_granularity", "str"),
    "--recompute-method": ("recompute_method", "str"),
    "--recompute-num-layers": ("recompute_num_layers", "int"),
    "--recompute-activations": ("recompute_activations", "true"),
    "--recompute-modules": ("recompute_modules", "list"),
    "--cpu-offloading": ("cpu_offloading", "true"),
    "--cpu-offloading-num-layers": ("cpu_offloading_num_layers", "int"),
    "--cpu-offloading-weights": ("cpu_offloading_weights", "true"),
    "--bf16": ("bf16", "true"),
    "--fp16": ("fp16", "true"),
    "--fp8-format": ("fp8_format", "str"),
    "--fp8-recipe": ("fp8_recipe", "str"),
    "--fp4-format": ("fp4_format", "str"),
    "--fp4-recipe": ("fp4_recipe", "str"),
    "--first-last-layers-bf16": ("first_last_bf16", "true"),
    "--num-layers-at-start-in-bf16": ("bf16_start", "int"),
    "--num-layers-at-end-in-bf16": ("bf16_end", "int"),
    "--swiglu": ("swiglu", "true"),
    "--normalization": ("normalization", "str"),
    "--position-embedding-type": ("position_embedding_type", "str"),
    "--untie-embeddings-and-output-weights": ("untie", "true"),
    "--disable-bias-linear": ("disable_bias_linear", "true"),
    "--add-qkv-bias": ("add_qkv_bias", "true"),
    "--multi-latent-attention": ("mla", "true"),
    "--q-lora-rank": ("q_lora_rank", "int"),
    "--kv-lora-rank": ("kv_lora_rank", "int"),
    "--qk-head-dim": ("qk_head_dim", "int"),
    "--qk-pos-emb-head-dim": ("qk_pos_emb_head_dim", "int"),
    "--v-head-dim": ("v_head_dim", "int"),
    "--qk-layernorm": ("qk_layernorm", "true"),
    "--experimental-attention-variant": ("attention_variant", "str"),
    "--linear-attention-type": ("attention_variant", "str"),  # the Megatron-Core dev branch's spelling (Megatron-MoE-ModelZoo)
    "--linear-attention-freq": ("linear_attention_freq", "str"),
    "--linear-conv-kernel-dim": ("linear_conv_kernel_dim", "int"),
    "--linear-key-head-dim": ("linear_key_head_dim", "int"),
    "--linear-value-head-dim": ("linear_value_head_dim", "int"),
    "--linear-num-key-heads": ("linear_num_key_heads", "int"),
    "--linear-num-value-heads": ("linear_num_value_heads", "int"),
    "--attention-output-gate": ("attention_output_gate", "true"),
    "--squared-relu": ("squared_relu", "true"),
    "--window-size": ("window_size", "str"),
    "--window-attn-skip-freq": ("window_skip_freq", "str"),
    "--hybrid-layer-pattern": ("hybrid_pattern", "str"),
    "--hybrid-override-pattern": ("hybrid_pattern", "str"),  # the deprecated spelling
    "--hybrid-attention-ratio": ("hybrid_attention_ratio", "float"),
    "--hybrid-mlp-ratio": ("hybrid_mlp_ratio", "float"),
    "--is-hybrid-model": ("is_hybrid_model", "true"),
    "--mamba-num-heads": ("mamba_num_heads", "int"),
    "--mamba-head-dim": ("mamba_head_dim", "int"),
    "--mamba-state-dim": ("mamba_state_dim", "int"),
    "--mamba-num-groups": ("mamba_num_groups", "int"),
    "--moe-latent-size": ("moe_latent_size", "int"),
    "--mtp-use-repeated-layer": ("mtp_repeated", "true"),
    "--mtp-hybrid-override-pattern": ("hybrid_mtp_pattern", "str"),  # deprecated: the pattern's "/" parts
    "--num-experts": ("num_experts", "int"),
    "--moe-router-topk": ("moe_router_topk", "int"),
    "--moe-ffn-hidden-size": ("moe_ffn_hidden_size", "int"),
    "--moe-shared-expert-intermediate-size": ("moe_shared_size", "int"),
    "--moe-layer-freq": ("moe_layer_freq", "str"),
    "--mtp-num-layers": ("mtp_num_layers", "int"),
    "--moe-router-num-groups": ("moe_router_num_groups", "int"),
    "--moe-router-group-topk": ("moe_router_group_topk", "int"),
    "--moe-expert-capacity-factor": ("moe_capacity_factor", "float"),
    "--overlap-grad-reduce": ("overlap_grad_reduce", "true"),
    "--overlap-param-gather": ("overlap_param_gather", "true"),
    "--tp-comm-overlap": ("tp_comm_overlap", "true"),
    "--no-async-tensor-model-parallel-allreduce": ("no_async_tp_allreduce", "true"),
    "--overlap-p2p-communication": ("overlap_p2p", "true"),
    "--overlap-moe-expert-parallel-comm": ("overlap_ep_comm", "true"),
    "--moe-token-dispatcher-type": ("moe_dispatcher", "str"),
    "--moe-flex-dispatcher-backend": ("moe_flex_backend", "str"),
    "--moe-deepep-num-sms": ("moe_deepep_sms", "int"),
    "--moe-hybridep-num-sms": ("moe_hybridep_sms", "int"),
    "--decoder-first-pipeline-num-layers": ("first_layers", "int"),
    "--decoder-last-pipeline-num-layers": ("last_layers", "int"),
    "--account-for-embedding-in-pipeline-split": ("account_embedding", "true"),
    "--account-for-loss-in-pipeline-split": ("account_loss", "true"),
    "--vocab-size": ("vocab_size", "int"),
    "--padded-vocab-size": ("padded_vocab_size", "int"),
    "--make-vocab-size-divisible-by": ("vocab_divisible_by", "int"),
    "--tokenizer-type": ("tokenizer_type", "str"),
    "--merge-file": ("merge_file", "str"),
    "--use-flash-attn": ("use_flash_attn", "true"),
    "--attention-backend": ("attention_backend", "str"),
    "--attention-dropout": ("attention_dropout", "float"),
    "--hidden-dropout": ("hidden_dropout", "float"),
    "--optimizer": ("optimizer", "str"),
    "--sgd-momentum": ("sgd_momentum", "float"),
    "--no-gradient-accumulation-fusion": ("no_grad_acc_fusion", "true"),
    "--no-persist-layer-norm": ("no_persist_layer_norm", "true"),
    "--grad-reduce-in-bf16": ("grad_reduce_in_bf16", "true"),
    "--accumulate-allreduce-grads-in-fp32": ("grads_in_fp32", "true"),
}

CHOICES = {
    "--recompute-granularity": ("full", "selective"),
    "--recompute-method": ("uniform", "block"),
    "--fp8-format": ("e4m3", "hybrid"),
    "--fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise"),  # 'custom' quantizers: not modelled
    "--fp4-format": ("e2m1",),
    "--fp4-recipe": ("nvfp4",),
    "--normalization": ("LayerNorm", "RMSNorm"),
    "--position-embedding-type": ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"),
    "--attention-backend": ("auto", "flash", "fused", "unfused", "local"),
    "--optimizer": ("adam", "sgd", "muon"),
    "--moe-token-dispatcher-type": ("allgather", "alltoall", "flex"),
    "--moe-flex-dispatcher-backend": ("deepep", "hybridep"),
}


def parse_args(argv: list[str]) -> tuple[dict, dict, list[str]]:
    """Megatron flags -> (values by destination, the flag each destination was given as,
    the arguments the importer does not read, as written)."""
    values: dict = {}
    given: dict = {}
    other: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if not tok.startswith("--"):
            other.append(tok)
            continue
        flag, eq, inline = tok.partition("=")
        if flag not in FLAGS:
            vals = [inline] if eq else []
            while not eq and i < len(argv) and not argv[i].startswith("--"):
                vals.append(argv[i])
                i += 1
            other.append(" ".join([flag] + vals))
            continue
        dest, kind = FLAGS[flag]
        if dest in given and given[dest] != flag:
            raise ConfigError(SOURCE, flag, f"given together with {given[dest]} (they say the same thing)")
        given[dest] = flag
        if kind in ("true", "false"):
            if eq:
                raise ConfigError(SOURCE, flag, f"takes no value, got {inline!r}")
            values[dest] = kind == "true"
            continue
        if kind == "list":  # nargs="*": every value up to the next flag
            vals = [inline] if eq else []
            while not eq and i < len(argv) and not argv[i].startswith("--"):
                vals.append(argv[i])
                i += 1
            values[dest] = vals
            continue
        if eq:
            raw = inline
        elif i < len(argv) and not argv[i].startswith("--"):
            raw = argv[i]
            i += 1
        else:
            raise ConfigError(SOURCE, flag, "needs a value")
        values[dest] = _convert(flag, kind, raw)
    return values, given, other


ZERO_OK = ("--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16")
"""Integer flags for which 0 is a value Megatron accepts."""


def _convert(flag: str, kind: str, raw: str):
    try:
        v = int(raw) if kind == "int" else float(raw) if kind == "float" else raw
    except ValueError:
        raise ConfigError(SOURCE, flag, f"expected {'an integer' if kind == 'int' else 'a number'}, got {raw!r}") from None
    if flag in CHOICES and v not in CHOICES[flag]:
        raise ConfigError(SOURCE, flag, f"{raw!r} is not one of {', '.join(CHOICES[flag])}")
    zero_ok = flag.startswith("--decoder-") or flag in ZERO_OK
    if kind == "int" and v < (0 if zero_ok else 1):
        raise ConfigError(SOURCE, flag, f"must be {'>= 0' if zero_ok else 'positive'}, got {v}")
    if kind == "float" and v < 0:
        raise ConfigError(SOURCE, flag, f"must be >= 0, got {v}")
    return v


def layer_flags(text: str, flag: str, example: str) -> list[int]:
    """A per-layer 0/1 list as Megatron's ``moe_freq_type`` arguments spell it (terms such as
    ``[0]*3+[1]*58``, added), read without evaluating it."""
    pattern: list[int] = []
    for term in text.replace(" ", "").split("+"):
        body, _, times = term.partition("*")
        if not (body.startswith("[") and body.endswith("]")) or (times and not times.isdigit()):
            raise ConfigError(SOURCE, flag, f"cannot read {text!r}: give an integer or terms like {example}")
        items = [x for x in body[1:-1].split(",") if x]
        if not all(x in ("0", "1") for x in items):
            raise ConfigError(SOURCE, flag, f"cannot read {text!r}: list entries must be 0 or 1")
        pattern += [int(x) for x in items] * (int(times) if times else 1)
    return pattern


def moe_layer_pattern(text: str, n_layers: int) -> tuple[int, int]:
    """``--moe-layer-freq`` (an integer N: every N-th layer from layer 0; or a list such as
    ``[0]*3+[1]*58``) -> (first_dense_layers, moe_every) of parsim's ModelSpec."""
    flag = "--moe-layer-freq"
    if text.strip().isdigit():
        return 0, max(1, int(text))
    pattern = layer_flags(text, flag, "[0]*3+[1]*58")
    if len(pattern) != n_layers or 1 not in pattern:
        raise ConfigError(SOURCE, flag, f"has {len(pattern)} entries ({sum(pattern)} MoE), the model {n_layers} layers")
    first = pattern.index(1)
    for every in range(1, n_layers - first + 1):
        if all(p == int((i - first) % every == 0) for i, p in enumerate(pattern[first:], first)):
            return first, every
    raise ConfigError(SOURCE, flag, f"{text!r} is not dense layers followed by every k-th layer MoE, "
                                    "the shapes parsim models")


def linear_attention_layers(text: str, n_layers: int) -> list[bool]:
    """``--linear-attention-freq`` -> per layer, whether it is a linear-attention (Gated DeltaNet)
    layer, as Megatron-Core reads it: an integer N, N - 1 linear layers then one softmax-attention
    layer, repeated (layer i linear unless (i + 1) % N == 0); or a list of 1 (linear) and 0 (softmax),
    spelled as Megatron's list arguments (``[1]*3+[0]*1``, a whole such sum in parentheses times k)."""
    flag = "--linear-attention-freq"
    t = text.replace(" ", "")
    if t.isdigit():
        every = int(t)
        if every < 1:
            raise ConfigError(SOURCE, flag, f"must be positive, got {every}")
        return [(i + 1) % every != 0 for i in range(n_layers)]
    times = 1
    if t.startswith("(") and ")*" in t and t.rsplit(")*", 1)[1].isdigit():
        t, times = t[1:].rsplit(")*", 1)[0], int(t.rsplit(")*", 1)[1])
    pattern = layer_flags(t, flag, "([1]*3+[0]*1)*12") * times
    if len(pattern) != n_layers:
        raise ConfigError(SOURCE, flag, f"has {len(pattern)} entries, the model {n_layers} layers")
    return [bool(p) for p in pattern]


def window_layers(window: str, skip: str | None, n_layers: int) -> tuple[int, list[bool]]:
    """``--window-size L,R`` with ``--window-attn-skip-freq`` -> (the keys a sliding query sees,
    itself included: L + 1; which layers slide). Megatron (``is_layer_window_attention``, layers
    counted from 1): no skip frequency, every layer slides; an integer N, every layer but each
    N-th; a list, the layers whose entry is 1."""
    parts = window.strip().strip("()").split(",")
    if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        raise ConfigError(SOURCE, "--window-size", f"cannot read {window!r}: give LEFT,RIGHT, e.g. 128,0")
    left, right = (int(p) for p in parts)
    if left < 0 or right != 0:
        raise ConfigError(SOURCE, "--window-size", f"({left}, {right}): parsim models causal windows "
                                                    "(LEFT >= 0 keys back, RIGHT 0)")
    if skip is None:
        return left + 1, [True] * n_layers
    if skip.strip().isdigit():
        every = int(skip)
        if every <= 0:
            raise ConfigError(SOURCE, "--window-attn-skip-freq", f"must be positive, got {every}")
        return left + 1, [(i + 1) % every != 0 for i in range(n_layers)]
    flags = layer_flags(skip, "--window-attn-skip-freq", "[1,1,1,0]*3")
    if len(flags) != n_layers:
        raise ConfigError(SOURCE, "--window-attn-skip-freq", f"has {len(flags)} entries, the model {n_layers} layers")
    return left + 1, [bool(f) for f in flags]
