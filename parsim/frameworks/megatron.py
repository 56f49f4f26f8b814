"""Megatron-LM ``pretrain_gpt.py`` arguments -> a parsim scenario.

The flags and their defaults are Megatron-LM's (``megatron/training/arguments.py``,
``megatron/core/transformer/transformer_config.py``; facts only): an FFN of 4h, or
int(8h/3 / 64)*64 with ``--swiglu``; LayerNorm, linear biases, learned absolute
positions and tied embeddings unless told otherwise; dropout 0.1; the vocabulary padded
to a multiple of ``--make-vocab-size-divisible-by`` (128) times tp; dp = world / (tp*pp*cp);
global batch mbs*dp when not given; ``--recompute-activations`` = selective recompute.

Uneven pipelines: Megatron's ``--decoder-first/last-pipeline-num-layers`` count the whole
first/last pipeline *rank*, whose layers are split evenly over its vpp model chunks;
``--account-for-embedding/loss-in-pipeline-split`` count one layer slot in the split and
build one block fewer on the first/last chunk (``get_num_layers_to_build``). The
importer computes the blocks of every model chunk that way and writes the fewest
``[schedule]`` keys that give parsim the same split (``emit.stage_layout``).
"""
from __future__ import annotations

from parsim.errors import ConfigError
from parsim.frameworks.emit import Imported, stage_layout
from parsim.frameworks.megatron_args import SOURCE, linear_attention_layers, moe_layer_pattern, parse_args, window_layers

GPT2_BPE_VOCAB = 50257
"""GPT-2 BPE vocabulary (Radford et al. 2019; Megatron's GPT2BPETokenizer)."""
KNOWN_VOCAB = {"GPT2BPETokenizer": GPT2_BPE_VOCAB}
"""Megatron's tokenizers whose vocabulary is fixed (the others read it from their files)."""

def import_megatron(argv: list[str], hardware: str | None = None, gpus: int | None = None) -> Imported:
    """The scenario Megatron-LM would run with these ``pretrain_gpt.py`` arguments."""
    v, given, other = parse_args(argv)
    notes: list[str] = []
    segments = _hybrid_pattern(v, given, notes)
    for dest, flag in (("num_layers", "--num-layers"), ("hidden_size", "--hidden-size"),
                       ("num_attention_heads", "--num-attention-heads"), ("seq_length", "--seq-length")):
        if dest not in v:
            raise ConfigError(SOURCE, flag, "missing (Megatron requires it)")
    tp, pp, cp, ep = (v.get(k, 1) for k in ("tp", "pp", "cp", "ep"))
    if hardware is None:
        hardware = "dgx-h100"
        notes.append("hardware dgx-h100 (no --hardware given)")
    if gpus is None:
        gpus = tp * pp * cp
        notes.append(f"{gpus} GPUs = tp*pp*cp, one data-parallel replica (no --gpus given)")
    if gpus < 1 or gpus % (tp * pp * cp):
        raise ConfigError(SOURCE, "--gpus", f"{gpus} GPUs are not a multiple of tp*pp*cp = {tp}*{pp}*{cp} "
                                            f"= {tp * pp * cp} (Megatron's data-parallel size would not be whole)")
    dp = gpus // (tp * pp * cp)
    vpp = _vpp(v, given, pp) if len(segments) <= 1 else _segments_vpp(segments, pp, given)
    model = _model(v, tp, notes)
    if "G" in model.get("hybrid_pattern", ""):  # a block is two hybrid layers: per-rank layer counts double
        for k in ("first_layers", "last_layers"):
            if k in v:
                v[k] *= 2
        for k in ("account_embedding", "account_loss"):
            if v.get(k):
                raise ConfigError(SOURCE, given[k], "not modelled with Gated DeltaNet layers (their blocks are "
                                  "two hybrid layers each)")
    training = _training(v, dp, notes)
    parallel = {"dp": dp, "tp": tp, "pp": pp} | {k: x for k, x in (("cp", cp), ("ep", ep), ("vpp", vpp)) if x > 1}
    parallel["zero"] = _zero(v)
    parallel["sequence_parallel"] = bool(v.get("sequence_parallel")) and tp > 1  # Megatron drops it at tp=1
    parallel.update(_grad_conventions(v, parallel["zero"], training["precision"]))
    schedule = {"name": "Interleaved1F1B" if vpp > 1 else "1F1B"}
    if pp > 1 and len(segments) > 1:  # the pattern's | segments are the model chunks
        schedule.update(stage_layout(model["n_layers"], [len(s) for s in segments], vpp, schedule["name"]))
    elif pp > 1:
        per_stage = megatron_stage_layers(model["n_layers"], pp, vpp, v.get("first_layers"), v.get("last_layers"),
                                          bool(v.get("account_embedding")), bool(v.get("account_loss")))
        stated = {k: x for k, x in (("first_stage_layers", v.get("first_layers")),
                                    ("last_stage_layers", v.get("last_layers")),
                                    ("account_for_embedding", v.get("account_embedding")),
                                    ("account_for_loss", v.get("account_loss"))) if x is not None and x is not False}
        schedule.update(stage_layout(model["n_layers"], per_stage, vpp, schedule["name"], stated))
    elif any(k in v for k in ("first_layers", "last_layers")):
        raise ConfigError(SOURCE, given.get("first_layers") or given["last_layers"],
                          "needs --pipeline-model-parallel-size > 1")
    training["recompute"] = _recompute(v)
    if training["recompute"] == "full":
        training["recompute_method"] = v["recompute_method"]
        training["recompute_num_layers"] = v.get("recompute_num_layers", 1)
    if "recompute_modules" in v and training["recompute"] == "selective":  # else idle (listed)
        training["recompute_modules"] = v["recompute_modules"]
    overlap = {"grad_reduce": bool(v.get("overlap_grad_reduce")), "param_gather": bool(v.get("overlap_param_gather")),
               "tp_comm": bool(v.get("tp_comm_overlap")),
               # without --overlap-p2p-communication Megatron's _communicate waits on its pipeline
               # sends and synchronises the device: the sender blocks
               "p2p": bool(v.get("overlap_p2p"))}
    if "overlap_ep_comm" in v:
        overlap["ep_comm"] = True
    if v.get("no_async_tp_allreduce"):  # the input-gradient all-reduces block (overlap.tp_grad_allreduce)
        overlap["tp_grad_allreduce"] = False
    doc = {"name": "megatron-import", "hardware": hardware, "gpus": gpus, "model": model, "training": training,
           "parallel": parallel, "schedule": schedule, "overlap": overlap}
    if "num_experts" in v:
        doc["moe"] = _moe(v, tp)
    if v.get("cpu_offloading_weights"):
        raise ConfigError(SOURCE, "--cpu-offloading-weights", "offloading weights through Transformer Engine's "
                                                              "offload context is not modelled (activations are)")
    if v.get("cpu_offloading_num_layers"):  # > 0 turns --cpu-offloading on (Megatron's arguments.py)
        doc["offload"] = {"activations": "cpu", "activation_layers": v["cpu_offloading_num_layers"]}
    elif v.get("cpu_offloading"):
        notes.append("--cpu-offloading with --cpu-offloading-num-layers 0: Megatron offloads no block")
    return Imported(SOURCE, doc, tuple(other + _without_effect(v, given)), tuple(notes), _key_source(given))


def _hybrid_pattern(v: dict, given: dict, notes: list[str]) -> list[str]:
    """``--hybrid-layer-pattern`` (or the deprecated ``--hybrid-override-pattern``), as Megatron-LM
    reads it (arguments.py, ``parse_hybrid_pattern``): the layers' symbols, ``|`` between pipeline
    segments, ``/`` before the multi-token-prediction layers. Sets ``num_layers`` from it (Megatron
    overrides --num-layers) and keeps the symbols in ``v["hybrid_pattern"]``; returns the segments."""
    if "hybrid_pattern" not in v:
        for dest in ("hybrid_attention_ratio", "hybrid_mlp_ratio"):
            if v.get(dest):
                raise ConfigError(SOURCE, given[dest], "Megatron's ratio allocation of hybrid layers is not "
                                  "modelled: give --hybrid-layer-pattern")
        return []
    flag = given["hybrid_pattern"]
    main, *mtp = v["hybrid_pattern"].split("/")
    mtp = [x for x in mtp if x]
    if mtp:  # one pattern per MTP depth, all the same (Megatron's parse_hybrid_pattern)
        if len(set(mtp)) > 1:
            raise ConfigError(SOURCE, flag, f"its MTP depths differ ({', '.join(mtp)}): Megatron requires them equal")
        v["hybrid_mtp_pattern"] = mtp[0]
        v.setdefault("mtp_num_layers", len(mtp))
    segments = main.split("|")
    if any(not s for s in segments):
        raise ConfigError(SOURCE, flag, f"{v['hybrid_pattern']!r} has an empty pipeline segment")
    pattern = "".join(segments)
    if v.get("num_layers") not in (None, len(pattern)):
        notes.append(f"--num-layers {v['num_layers']} ignored: {flag} has {len(pattern)} layers (Megatron uses "
                     "the pattern's)")
    v["num_layers"], v["hybrid_pattern"] = len(pattern), pattern
    return segments


def _segments_vpp(segments: list[str], pp: int, given: dict) -> int:
    """Virtual stages per pipeline rank from the pattern's segments (Megatron: their count over pp)."""
    if len(segments) % pp:
        raise ConfigError(SOURCE, given["hybrid_pattern"], f"{len(segments)} pipeline segments are not divisible by "
                          f"--pipeline-model-parallel-size {pp} (Megatron's rule)")
    if "vpp" in given or "layers_per_virtual_stage" in given:
        raise ConfigError(SOURCE, given.get("vpp") or given["layers_per_virtual_stage"],
                          "not with a pipe-separated --hybrid-layer-pattern: its segments set the virtual stages")
    return len(segments) // pp


def _hybrid_model(v: dict, h: int, notes: list[str]) -> dict:
    """The hybrid fields of ``_model``: the pattern and the Mamba-2 mixer's sizes (Megatron-Core's
    defaults: head dim 64, state 128, 8 groups; heads from the inner width 2 x hidden when not given)."""
    head_dim = v.get("mamba_head_dim", 64)
    out = {"hybrid_pattern": v["hybrid_pattern"], "mamba_head_dim": head_dim,
           "mamba_heads": v.get("mamba_num_heads") or 2 * h // head_dim,
           "mamba_state_dim": v.get("mamba_state_dim", 128), "mamba_groups": v.get("mamba_num_groups", 8)}
    if v.get("mtp_num_layers"):  # the MTP block: the pattern's, else attention then MoE (Nemotron 3's)
        if "hybrid_mtp_pattern" not in v:
            notes.append("--mtp-num-layers on a hybrid model without an MTP pattern: its block taken as \"*E\" "
                         "(attention then MoE, Nemotron 3's)")
        out["mtp_pattern"] = v.get("hybrid_mtp_pattern", "*E")
        if v.get("mtp_repeated"):
            out["mtp_shared"] = True
    return out


def _without_effect(v: dict, given: dict) -> list[str]:
    """Flags read but without effect in this configuration (as in Megatron), listed as such."""
    idle = []
    if "num_experts" not in v:
        idle += [(d, "no --num-experts") for d in ("moe_router_topk", "moe_ffn_hidden_size", "moe_shared_size", "moe_latent_size",
                                                    "moe_layer_freq", "moe_capacity_factor", "etp", "overlap_ep_comm",
                                                    "moe_dispatcher", "moe_flex_backend", "moe_deepep_sms",
                                                    "moe_hybridep_sms")]
    elif v.get("moe_dispatcher") != "flex":
        idle += [(d, "no --moe-token-dispatcher-type flex") for d in ("moe_flex_backend", "moe_deepep_sms",
                                                                      "moe_hybridep_sms")]
    else:
        backend = v.get("moe_flex_backend", "deepep")
        idle += [(f"moe_{b}_sms", f"flex backend {backend}") for b in ("deepep", "hybridep") if b != backend]
    if not v.get("group_query_attention"):
        idle.append(("num_query_groups", "no --group-query-attention"))
    if "hybrid_pattern" not in v:
        idle += [(d, "no --hybrid-layer-pattern") for d in ("mamba_num_heads", "mamba_head_dim", "mamba_state_dim",
                                                             "mamba_num_groups", "is_hybrid_model", "hybrid_mtp_pattern")]
    if not v.get("mtp_num_layers"):
        idle.append(("mtp_repeated", "no --mtp-num-layers"))
    if v.get("recompute_granularity") != "full":
        idle += [(d, "no --recompute-granularity full") for d in ("recompute_method", "recompute_num_layers")]
    if v.get("recompute_granularity") != "selective" and not (v.get("recompute_granularity") is None
                                                              and v.get("recompute_activations")):
        idle.append(("recompute_modules", "no --recompute-granularity selective"))
    if v.get("optimizer") != "sgd":
        idle.append(("sgd_momentum", "not --optimizer sgd"))
    if not v.get("fp8_format"):
        idle.append(("fp8_recipe", "no --fp8-format"))
    if not v.get("fp4_format"):
        idle.append(("fp4_recipe", "no --fp4-format"))
    low = v.get("fp8_format") or v.get("fp4_format")
    if not low:
        idle.append(("first_last_bf16", "no --fp8-format or --fp4-format"))
    if not (low and v.get("first_last_bf16")):
        idle += [(d, "no --first-last-layers-bf16 under FP8 / FP4") for d in ("bf16_start", "bf16_end")]
    if "padded_vocab_size" in v:
        idle += [(d, "--padded-vocab-size given") for d in ("vocab_size", "vocab_divisible_by", "tokenizer_type")]
    out = []
    for dest, why in idle:
        if dest in v:
            val = v[dest]
            if isinstance(val, list):  # nargs="*": the values as written
                val = " ".join(val)
            shown = given[dest] if isinstance(val, bool) else f"{given[dest]} {val}"
            out.append(f"{shown} (ignored: {why})")
    return out


def _vpp(v: dict, given: dict, pp: int) -> int:
    if "layers_per_virtual_stage" in v and "vpp" in v:
        raise ConfigError(SOURCE, given["vpp"], "give it or --num-layers-per-virtual-pipeline-stage, not both")
    if "layers_per_virtual_stage" in v:
        per_rank, k = v["num_layers"] // pp, v["layers_per_virtual_stage"]
        if v["num_layers"] % pp or per_rank % k:
            raise ConfigError(SOURCE, "--num-layers-per-virtual-pipeline-stage",
                              f"{k} does not divide the {v['num_layers']}/{pp} layers of a pipeline rank")
        vpp = per_rank // k
    else:
        vpp = v.get("vpp", 1)
    if vpp > 1 and pp == 1:
        raise ConfigError(SOURCE, given.get("vpp", "--num-layers-per-virtual-pipeline-stage"),
                          "virtual pipeline stages need --pipeline-model-parallel-size > 1")
    return vpp


def megatron_stage_layers(n_layers: int, pp: int, vpp: int, first: int | None, last: int | None,
                          embedding: bool, loss: bool) -> list[int]:
    """Transformer blocks of every model chunk (model order: chunk c of rank r is stage
    c*pp + r), as Megatron's ``get_num_layers_to_build`` builds them."""
    if (first is not None or last is not None) and (embedding or loss):
        raise ConfigError(SOURCE, "--account-for-embedding-in-pipeline-split" if embedding
                          else "--account-for-loss-in-pipeline-split",
                          "Megatron refuses it together with --decoder-first/last-pipeline-num-layers")
    if first is not None or last is not None:
        rest = n_layers - (first or 0) - (last or 0)
        left = pp - (first is not None) - (last is not None)
        if rest < 0 or (left and rest % left) or (not left and rest):
            raise ConfigError(SOURCE, "--decoder-first-pipeline-num-layers" if first is not None
                              else "--decoder-last-pipeline-num-layers",
                              f"the other {left} pipeline ranks cannot share the remaining {rest} of "
                              f"{n_layers} layers evenly (Megatron's rule)")
        mid = rest // left if left else 0
        per_rank = [mid] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        slots = n_layers + embedding + loss
        if slots % pp:
            counted = " (embedding and loss slots counted)" if embedding or loss else ""
            raise ConfigError(SOURCE, "--num-layers", f"{slots} layers{counted} are not divisible by "
                                                      f"--pipeline-model-parallel-size {pp} (Megatron's even split)")
        per_rank = [slots // pp] * pp
    for r, k in enumerate(per_rank):
        if k % vpp:
            raise ConfigError(SOURCE, "--num-virtual-stages-per-pipeline-rank",
                              f"pipeline rank {r} holds {k} layers, not divisible over {vpp} virtual stages")
    stages = [per_rank[s % pp] // vpp for s in range(pp * vpp)]
    stages[0] -= embedding
    stages[-1] -= loss
    if min(stages) < 0:
        raise ConfigError(SOURCE, "--account-for-embedding-in-pipeline-split",
                          "leaves a model chunk with fewer than 0 layers")
    return stages


MLA_DEFAULTS = {"kv_lora_rank": 32, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64, "v_head_dim": 128}
"""Megatron-LM's multi-latent attention arguments' defaults (``_add_mla_args``); ``--q-lora-rank``
defaults to none: queries are projected without a down-projection."""


def _model(v: dict, tp: int, notes: list[str]) -> dict:
    h, heads = v["hidden_size"], v["num_attention_heads"]
    swiglu = bool(v.get("swiglu"))
    if swiglu and v.get("squared_relu"):
        raise ConfigError(SOURCE, "--squared-relu", "given together with --swiglu (one activation)")
    ffn = v.get("ffn_hidden_size", int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h)
    m = {"name": "megatron-gpt", "n_layers": v["num_layers"], "d_model": h, "n_heads": heads,
         "n_kv_heads": v.get("num_query_groups", 1) if v.get("group_query_attention") else heads,
         "d_ff": ffn, "vocab_size": _vocab(v, tp, notes), "ffn": "swiglu" if swiglu else "gelu"}
    if "kv_channels" in v and v["kv_channels"] * heads != h:
        m["head_dim"] = v["kv_channels"]
    m["tied_embeddings"] = not v.get("untie")
    pos = v.get("position_embedding_type", "learned_absolute")
    m["position"] = {"learned_absolute": "learned", "none": "none"}.get(pos, "rope")
    if pos == "relative":
        notes.append(f"--position-embedding-type {pos}: no position weights counted (parsim's \"rope\")")
    if "hybrid_pattern" in v:
        m.update(_hybrid_model(v, h, notes))
    m["max_seq_len"] = v.get("max_position_embeddings", v["seq_length"])
    m["norm"] = "rmsnorm" if v.get("normalization") == "RMSNorm" else "layernorm"
    m["bias"] = not v.get("disable_bias_linear")
    if v.get("add_qkv_bias"):
        m["qkv_bias"] = True
    if v.get("qk_layernorm"):  # a norm over each head's query and key (head_dim wide)
        m["qk_norm"] = True
    if "window_size" in v:  # sliding-window attention (TE's window: LEFT keys back and the query itself)
        keys, slides = window_layers(v["window_size"], v.get("window_skip_freq"), v["num_layers"])
        if any(slides):
            m["layer_types"] = ["sliding" if s else "full" for s in slides]
            m["sliding_window"] = keys
    elif "window_skip_freq" in v:
        notes.append("--window-attn-skip-freq without --window-size: not used")
    mla = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
    if v.get("mla"):  # DeepSeek's multi-latent attention: its own projections, a head per query head
        d = {k: v.get(k, MLA_DEFAULTS.get(k)) for k in mla}
        m.update(n_kv_heads=heads, q_lora_rank=d["q_lora_rank"] or 0, kv_lora_rank=d["kv_lora_rank"],
                 qk_nope_head_dim=d["qk_head_dim"], qk_rope_head_dim=d["qk_pos_emb_head_dim"],
                 v_head_dim=d["v_head_dim"])
        m.pop("head_dim", None)
    else:
        stray = next((k for k in mla if k in v), None)
        if stray is not None:
            notes.append(f"--{stray.replace('_', '-')} without --multi-latent-attention: not used")
    if "num_experts" in v:
        m.update(_moe_model(v, ffn))
    if v.get("mtp_num_layers"):  # Megatron-Core's default placement: the last pipeline stage
        m["mtp_layers"] = v["mtp_num_layers"]
    if v.get("attention_output_gate"):
        m["attn_output_gate"] = True
    if "attention_variant" in v:
        _gdn_model(v, m)
    return m


GDN_VARIANTS = ("gated_delta_net", "gdn")
"""``--experimental-attention-variant`` values that are Gated DeltaNet (``gated_delta_net`` is the
deprecated spelling of ``gdn``); ``gdn2`` and ``dsa`` are other layers."""


def _gdn_model(v: dict, m: dict) -> None:
    """A GPT model with Gated DeltaNet layers (Megatron-Core's ``--experimental-attention-variant
    gdn`` with ``--linear-attention-freq``): each block becomes two hybrid layers, its mixer ("G" or
    "*") and its FFN ("E" where ``--moe-layer-freq`` puts an MoE, else "-"); the DeltaNet's sizes from
    ``--linear-*`` (Megatron's defaults: 16 key and 32 value heads of 128, a convolution of 4)."""
    variant = v["attention_variant"]
    if variant not in GDN_VARIANTS:
        raise ConfigError(SOURCE, "--experimental-attention-variant", f"{variant!r} is not modelled (parsim models "
                          f"the Gated DeltaNet variant: {', '.join(GDN_VARIANTS)})")
    if "linear_attention_freq" not in v:
        raise ConfigError(SOURCE, "--linear-attention-freq", "missing: which layers are Gated DeltaNet "
                          "(e.g. 4: three in four)")
    if "window_size" in v or m.get("is_mla") or "q_lora_rank" in m:
        raise ConfigError(SOURCE, "--experimental-attention-variant", "with sliding windows or multi-latent "
                          "attention is not modelled")
    n = m["n_layers"]
    linear = linear_attention_layers(v["linear_attention_freq"], n)
    first, every = m.pop("first_dense_layers", 0), m.pop("moe_every", 1)
    moe = [bool(m.get("n_experts")) and i >= first and (i - first) % every == 0 for i in range(n)]
    m["hybrid_pattern"] = "".join(("G" if g else "*") + ("E" if e else "-") for g, e in zip(linear, moe))
    m["n_layers"] = 2 * n
    m.update(gdn_key_heads=v.get("linear_num_key_heads", 16), gdn_value_heads=v.get("linear_num_value_heads", 32),
             gdn_key_dim=v.get("linear_key_head_dim", 128), gdn_value_dim=v.get("linear_value_head_dim", 128),
             gdn_conv_kernel=v.get("linear_conv_kernel_dim", 4))
    if m.get("mtp_layers"):  # the MTP block: a softmax-attention block (Qwen3-Next's checkpoint), its FFN the last's
        m["mtp_pattern"] = "*" + ("E" if moe[-1] else "-")


def _vocab(v: dict, tp: int, notes: list[str]) -> int:
    if "padded_vocab_size" in v:
        return v["padded_vocab_size"]
    tok = v.get("tokenizer_type")
    if "vocab_size" in v:
        orig = v["vocab_size"]
    elif tok in KNOWN_VOCAB or (tok is None and "merge_file" in v):
        orig = GPT2_BPE_VOCAB
        if tok is None:
            notes.append(f"GPT-2 BPE vocabulary ({GPT2_BPE_VOCAB} tokens): --merge-file given without --tokenizer-type")
    else:
        raise ConfigError(SOURCE, "--tokenizer-type" if tok else "--vocab-size",
                          f"the vocabulary of {tok or 'this tokenizer'} is in its tokenizer files: give "
                          f"--vocab-size or --padded-vocab-size")
    multiple = v.get("vocab_divisible_by", 128) * tp  # Megatron's vocab_size_with_padding
    return -(-orig // multiple) * multiple


def _moe_model(v: dict, ffn: int) -> dict:
    m = {"n_experts": v["num_experts"], "top_k": v.get("moe_router_topk", 2),
         "d_ff_expert": v.get("moe_ffn_hidden_size", ffn)}
    if v.get("moe_latent_size"):
        m["moe_latent_size"] = v["moe_latent_size"]
    if "moe_shared_size" in v:
        m["n_shared_experts"] = 1
        m["d_ff_shared"] = v["moe_shared_size"]
    if "moe_capacity_factor" in v:
        m["capacity_factor"] = v["moe_capacity_factor"]
    if "moe_layer_freq" in v:
        first, every = moe_layer_pattern(v["moe_layer_freq"], v["num_layers"])
        m["first_dense_layers"], m["moe_every"] = first, every
    if v.get("moe_router_num_groups", 1) > 1:  # group-limited routing (DeepSeek-V3: 8 groups, 4 a token)
        m["expert_groups"] = v["moe_router_num_groups"]
        m["expert_groups_per_token"] = v.get("moe_router_group_topk", 0)
    return m


def _training(v: dict, dp: int, notes: list[str]) -> dict:
    mbs = v.get("micro_batch_size")
    if mbs is None:
        mbs = 1
        notes.append("--micro-batch-size 1 (not given)")
    recipe = None
    if v.get("fp8_format") and v.get("fp4_format"):
        raise ConfigError(SOURCE, "--fp4-format", "given together with --fp8-format (Megatron: choose one)")
    if v.get("fp4_format"):  # NVFP4 runs through Transformer Engine's FP8 path (NVFP4BlockScaling)
        precision, recipe = "fp8", "nvfp4"
    elif v.get("fp8_format"):
        # TransformerConfig.fp8_recipe defaults to "delayed"; Megatron's "tensorwise" is TE's current scaling
        precision, given = "fp8", v.get("fp8_recipe", "delayed")
        recipe = "current" if given == "tensorwise" else given
    elif v.get("bf16") and v.get("fp16"):
        raise ConfigError(SOURCE, "--bf16", "given together with --fp16")
    else:
        precision = "bf16" if v.get("bf16") else "fp16" if v.get("fp16") else "fp32"
    opt = v.get("optimizer", "adam")
    if opt == "sgd":
        opt = "momentum" if v.get("sgd_momentum", 0.9) > 0 else "sgd"  # Megatron's SGD: momentum 0.9
    backend = v.get("attention_backend", "flash" if v.get("use_flash_attn") else "auto")
    bf16_ends = {}
    if v.get("first_last_bf16") and precision == "fp8":  # TransformerConfig: 1 and 1 unless given
        bf16_ends = {"bf16_first_layers": v.get("bf16_start", 1), "bf16_last_layers": v.get("bf16_end", 1)}
    return {"global_batch": v.get("global_batch_size", mbs * dp), "microbatch_size": mbs,
            "seq_len": v["seq_length"], "precision": precision, **({"fp8_recipe": recipe} if recipe else {}),
            **bf16_ends,
            "optimizer": opt,
            "flash_attention": backend not in ("unfused", "local"),
            "dropout": v.get("attention_dropout", 0.1) > 0 or v.get("hidden_dropout", 0.1) > 0,
            "grad_accumulation_fusion": not v.get("no_grad_acc_fusion"),
            **({"persist_layer_norm": False} if v.get("no_persist_layer_norm") else {})}


def _grad_conventions(v: dict, zero: int, precision: str) -> dict:
    """``parallel.framework`` and ``grad_reduce_dtype`` of a Megatron job: its distributed optimizer
    (or plain DDP) keeps Megatron's memory layout; with --use-torch-fsdp2 it is FSDP2's. For bf16
    (and FP8, which runs with bf16 parameters) Megatron accumulates and reduces gradients in
    fp32 (arguments.py sets ``accumulate_allreduce_grads_in_fp32``) unless --grad-reduce-in-bf16."""
    out = {"framework": "fsdp" if zero == 3 else "megatron"}
    if v.get("grad_reduce_in_bf16") and precision in ("bf16", "fp8"):
        out["grad_reduce_dtype"] = "bf16"
    elif v.get("grads_in_fp32") or (zero == 3 and precision in ("bf16", "fp8")):
        out["grad_reduce_dtype"] = "fp32"
    return out


def _zero(v: dict) -> int:
    if v.get("fsdp"):
        return 3
    return 1 if v.get("distributed_optimizer") else 0


def _recompute(v: dict) -> str:
    gran = v.get("recompute_granularity")
    if gran is None:
        return "selective" if v.get("recompute_activations") else "none"
    if gran == "selective":
        return "selective"
    if v.get("recompute_method") is None:
        raise ConfigError(SOURCE, "--recompute-method", "missing: --recompute-granularity full needs uniform or "
                                                        "block (Megatron asserts it)")
    return "full"


def _moe(v: dict, tp: int) -> dict:
    moe = {"drop_tokens": "moe_capacity_factor" in v}  # Megatron is dropless without a capacity factor
    if "etp" in v and v["etp"] != tp:
        moe["expert_tp"] = v["etp"]
    if v.get("moe_dispatcher") == "allgather":
        raise ConfigError(SOURCE, "--moe-token-dispatcher-type", "allgather is not modelled (alltoall or flex)")
    if v.get("moe_dispatcher") == "flex":
        # Megatron-Core's flex dispatcher runs the backend given (its default: deepep)
        backend = v.get("moe_flex_backend", "deepep")
        moe["dispatcher"] = backend
        sms = v.get(f"moe_{backend}_sms")
        if sms is not None:
            moe["dispatcher_sms"] = sms
    return moe


def _key_source(given: dict) -> dict:
    """parsim keys -> the Megatron flag a problem with them goes back to."""
    flag = lambda dest, default: given.get(dest, default)
    return {
        "gpus": "--gpus", "parallel.dp": "--gpus", "hardware": "--hardware",
        "parallel.tp": flag("tp", "--tensor-model-parallel-size"),
        "parallel.pp": flag("pp", "--pipeline-model-parallel-size"),
        "parallel.cp": flag("cp", "--context-parallel-size"),
        "parallel.ep": flag("ep", "--expert-model-parallel-size"),
        "parallel.vpp": flag("vpp", given.get("layers_per_virtual_stage", "--num-virtual-stages-per-pipeline-rank")),
        "parallel.sequence_parallel": "--sequence-parallel",
        "training.global_batch": flag("global_batch_size", "--micro-batch-size"),
        "training.seq_len": "--seq-length", "schedule.n_microbatches": flag("global_batch_size", "--micro-batch-size"),
        "schedule.name": flag("pp", "--pipeline-model-parallel-size"),
        "schedule.layers_per_stage": flag("first_layers", flag("last_layers", "--pipeline-model-parallel-size")),
        "schedule.first_stage_layers": "--decoder-first-pipeline-num-layers",
        "schedule.last_stage_layers": "--decoder-last-pipeline-num-layers",
        "model.n_layers": "--num-layers", "model.d_model": "--hidden-size", "model.n_heads": "--num-attention-heads",
        "model.n_kv_heads": "--num-query-groups", "model.head_dim": "--kv-channels",
        "model.d_ff": "--ffn-hidden-size", "model.top_k": "--moe-router-topk", "model.n_experts": "--num-experts",
        "model.mtp_layers": "--mtp-num-layers", "model.expert_groups": "--moe-router-num-groups",
        "model.expert_groups_per_token": "--moe-router-group-topk",
        "moe.expert_tp": "--expert-tensor-parallel-size",
        "moe.dispatcher_sms": flag("moe_hybridep_sms", "--moe-deepep-num-sms"),
        "overlap.ep_comm": "--overlap-moe-expert-parallel-comm",
    }
