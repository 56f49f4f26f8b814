"""The ``[offload]`` table (ZeRO-Offload / ZeRO-Infinity) and the ``[inference]`` table:
typed, strictly parsed (unknown keys and bad values refused in one line)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from parsim.errors import ConfigError

TIERS = ("none", "cpu", "nvme")
WEIGHT_BITS = (16, 8, 4)
KV_PLACES = ("gpu", "cpu")
LM_HEADS = ("sharded", "replicated")
"""Values of ``inference.lm_head``."""
ENGINES = ("fused", "deepspeed-0.7")
"""Values of ``inference.engine``."""
INFER_PRECISIONS = ("fp16", "bf16", "fp8", "fp32")


@dataclass(frozen=True, kw_only=True)
class OffloadConfig:
    """Where model states live when not on the GPU (DeepSpeed's offload_optimizer / offload_param)."""

    optimizer: str = "none"
    """fp32 master weights, gradients and optimizer moments: "none" (GPU), "cpu" (ZeRO-Offload:
    the update runs as CPU-Adam) or "nvme" (ZeRO-Infinity: swapped through host memory)."""
    params: str = "none"
    """16-bit parameters: "none", "cpu" or "nvme" (ZeRO-3 only: fetched layer by layer)."""
    activations: str = "none"
    """Activation checkpoints: "none" or "cpu" (copied to host after the forward, back for the backward)."""
    activation_layers: int | None = None
    """With ``activations = "cpu"``: the blocks of each stage whose stash goes to the host block by
    block, as Megatron-Core's ``--cpu-offloading-num-layers`` (Transformer Engine's CPU offload
    context: a block's activations leave while the next block computes and come back one block
    ahead of its backward; the other blocks keep theirs on the GPU); None: the stage's whole stash
    after its forward (DeepSpeed's checkpoint offload)."""
    optimizer_ratio: float = 1.0
    """Twin-Flow: the fraction of the optimizer states updated on the CPU (the rest stays on the GPU)."""
    delayed_update: bool = False
    """ZeRO-Offload's one-step delayed parameter update: the CPU step of step k overlaps step k+1's
    forward and backward (the update applies one step late)."""

    @property
    def active(self) -> bool:
        return self.optimizer != "none" or self.params != "none" or self.activations != "none"


@dataclass(frozen=True, kw_only=True)
class InferenceConfig:
    """What one generation request does."""

    batch: int
    """Sequences generated together by each model replica."""
    prompt_tokens: int
    """Tokens of each prompt (the prefill)."""
    generate_tokens: int
    """New tokens generated per sequence (the first comes out of the prefill)."""
    precision: str = "fp16"
    """Activations and KV cache: fp16 | bf16 | fp8 | fp32."""
    weight_bits: int = 16
    """Weight-only quantisation: 16, 8 or 4 bits per weight (dequantised in the GEMM)."""
    kv_cache: str = "gpu"
    """Where the KV cache lives: "gpu", or "cpu" (read back over PCIe each token)."""
    prefetch: bool = True
    """Offloaded weights: fetch layer i+1 while layer i computes (ZeRO-Inference's prefetch)."""
    lm_head: str = "sharded"
    """How tensor parallelism holds the embedding and LM head: "sharded" (vocabulary-parallel:
    each rank keeps and computes 1/tp of the vocabulary, Megatron's and most serving engines')
    or "replicated" (each rank keeps the whole table and computes every logit: DeepSpeed-Inference
    v0.7's kernel injection, whose checkpoint loader loads the embedding whole on every rank and
    ties ``lm_head`` to it, deepspeed/module_inject/load_checkpoint.py). Not given: the engine's
    ("replicated" under "deepspeed-0.7", "sharded" otherwise)."""
    engine: str = "fused"
    """Whose kernels and memory the request runs (:mod:`parsim.costs.inference`): "fused" (a
    serving engine: the KV cache preallocated and written in place, attention fused, the prefill's
    activations transient) or "deepspeed-0.7" (DeepSpeed-Inference v0.7 kernel injection under
    Hugging Face ``generate``, as the 2022 BLOOM benchmarks ran it: one workspace allocated for the
    first request's batch and 128 tokens; BLOOM's attention in PyTorch with the Hugging Face cache,
    grown by concatenation every step; the other models' KV cache inside the workspace, 128 tokens
    at most). Tensor parallelism only, weights resident, 16- or 8-bit weights, fp16 or fp32
    activations, KV cache on the GPU."""

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generate_tokens


def _check(table, cls, file: str, prefix: str) -> None:
    if not isinstance(table, dict):
        raise ConfigError(file, prefix.rstrip("."), f"must be a table ([{prefix.rstrip('.')}])")
    known = {f.name for f in fields(cls)}
    for k in table:
        if k not in known:
            raise ConfigError(file, prefix + k, f"unknown key (known: {', '.join(sorted(known))})")


def _choice(table, key, choices, default, file, prefix):
    v = table.get(key, default)
    if v not in choices or isinstance(v, bool):
        raise ConfigError(file, prefix + key, f"must be one of {', '.join(map(str, choices))}, got {v!r}")
    return v


def _int(table, key, file, prefix, minimum=1):
    if key not in table:
        raise ConfigError(file, prefix + key, "missing (required)")
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(file, prefix + key, f"must be an integer >= {minimum}, got {v!r}")
    return v


def _bool(table, key, default, file, prefix):
    v = table.get(key, default)
    if not isinstance(v, bool):
        raise ConfigError(file, prefix + key, f"expected true/false, got {v!r}")
    return v


def parse_offload(table, file: str, zero: int) -> OffloadConfig:
    """The ``[offload]`` table of a training scenario (``zero``: the scenario's ZeRO stage)."""
    p = "offload."
    _check(table, OffloadConfig, file, p)
    opt = _choice(table, "optimizer", TIERS, "none", file, p)
    params = _choice(table, "params", TIERS, "none", file, p)
    act = _choice(table, "activations", ("none", "cpu"), "none", file, p)
    ratio = table.get("optimizer_ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) \
            or not 0 <= ratio <= 1:
        raise ConfigError(file, p + "optimizer_ratio", f"must be a fraction in [0, 1], got {ratio!r}")
    delayed = _bool(table, "delayed_update", False, file, p)
    layers = table.get("activation_layers")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ConfigError(file, p + "activation_layers", f"expected a positive number of blocks, got {layers!r}")
    if layers is not None and act != "cpu":
        raise ConfigError(file, p + "activation_layers", "needs offload.activations = \"cpu\"")
    if params != "none" and zero != 3:
        raise ConfigError(file, p + "params", f"parameter offload needs parallel.zero = 3, got zero = {zero}")
    if params != "none" and opt == "none":
        raise ConfigError(file, p + "params", "parameter offload needs offload.optimizer = \"cpu\" or \"nvme\"")
    if opt != "none" and zero < 1:
        raise ConfigError(file, p + "optimizer", "optimizer offload needs parallel.zero >= 1 (ZeRO-Offload)")
    if delayed and opt == "none":
        raise ConfigError(file, p + "delayed_update", "needs offload.optimizer = \"cpu\" or \"nvme\"")
    return OffloadConfig(optimizer=opt, params=params, activations=act, optimizer_ratio=float(ratio),
                         delayed_update=delayed, activation_layers=layers)


MAX_GENERATE_TOKENS = 2 ** 15
"""Most new tokens a request may ask for (32,768: the longest outputs common serving limits allow):
every decode step is simulated and kept as spans (~0.8 ms and ~72 span rows a step for BLOOM-176B on
a 2-core VM: 32,768 steps take ~28 s and 800 MB; 131,072 ran past a minute)."""
MAX_STREAMED_GENERATE_TOKENS = 2 ** 10
"""Most new tokens when the weights stream in (``[offload] params``): every pass replays each
module's fetch and keeps ~2,400 span rows (OPT-175B: 1,024 steps take ~8 s and ~1.1 GB on a 2-core
VM, the span budget of MAX_GENERATE_TOKENS; ZeRO-Inference runs generate tens of tokens)."""
MAX_PROMPT_TOKENS = 2 ** 27
"""Longest prompt (134,217,728 tokens, as ``training.seq_len``'s bound)."""


def parse_inference(table, file: str) -> InferenceConfig:
    """The ``[inference]`` table."""
    p = "inference."
    _check(table, InferenceConfig, file, p)
    for key, most in (("generate_tokens", MAX_GENERATE_TOKENS), ("prompt_tokens", MAX_PROMPT_TOKENS)):
        v = table.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > most:
            raise ConfigError(file, p + key, f"{v:,} is more than parsim simulates ({most:,}: every decode step "
                              "is simulated)" if key == "generate_tokens" else f"{v:,} is more than parsim models "
                              f"({most:,} tokens)")
    engine = _choice(table, "engine", ENGINES, "fused", file, p)
    if engine == "deepspeed-0.7":
        # v0.7.3 deepspeed/inference/engine.py: supported_dtypes = [None, torch.half, torch.int8, torch.float]
        for key, bad, why in (("weight_bits", 4, "has no 4-bit weights (int8 only)"),
                              ("kv_cache", "cpu", "keeps the KV cache on the GPU"),
                              ("precision", "bf16", "runs fp16 or fp32 (its dtypes: half, int8, float)"),
                              ("precision", "fp8", "runs fp16 or fp32 (its dtypes: half, int8, float)")):
            if table.get(key) == bad:
                raise ConfigError(file, p + key, f"DeepSpeed-Inference v0.7 {why}; got {bad!r}")
    return InferenceConfig(
        batch=_int(table, "batch", file, p), prompt_tokens=_int(table, "prompt_tokens", file, p),
        generate_tokens=_int(table, "generate_tokens", file, p),
        precision=_choice(table, "precision", INFER_PRECISIONS, "fp16", file, p),
        weight_bits=_choice(table, "weight_bits", WEIGHT_BITS, 16, file, p),
        kv_cache=_choice(table, "kv_cache", KV_PLACES, "gpu", file, p),
        prefetch=_bool(table, "prefetch", True, file, p),
        lm_head=_choice(table, "lm_head", LM_HEADS, "replicated" if engine == "deepspeed-0.7" else "sharded",
                        file, p),
        engine=engine)


def parse_offload_inference(table, file: str) -> OffloadConfig:
    """``[offload]`` of an inference scenario: only ``params`` (where the weights live) applies."""
    p = "offload."
    _check(table, OffloadConfig, file, p)
    for k in table:
        if k != "params":
            raise ConfigError(file, p + k, "applies to training; inference reads only offload.params")
    return OffloadConfig(params=_choice(table, "params", TIERS, "none", file, p))
