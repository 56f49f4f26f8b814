"""Held-out fidelity: parsim against 239 published training runs not used to fit it (9 flagged rows excepted).

    python benchmarks/fidelity_heldout.py [--markdown reports/fidelity-heldout.md] [--json]

Every row of ``benchmarks/data/heldout_runs.json`` goes through ``scenario_for(row)``: one
rule set, the same for every row, no per-row knob. It returns a scenario document (the
TOML tables as a dict) or ``Skip(kind, reason)`` when the row cannot be expressed; skipped
rows are listed with their reason, never dropped. Each scenario is simulated in parsim's
default (fast) mode through the public API only (``scenario_from_dict``, ``simulate``,
``Result.to_json``).

Comparison. Predicted tokens/s per GPU (``tokens_per_s / world_size``) against the published
tokens/s per GPU when the row gives one (``tokens_per_sec_per_gpu``, else the row's
``..._derived`` or ``..._assumed`` value); otherwise predicted model TFLOP/s per GPU
(``tflops_per_gpu``: 3 x forward FLOPs, full s^2 attention, no recompute -- the counting of
Megatron/NeMo's and llm-foundry's MFU formulas) against the published model TFLOP/s per GPU.
The table says which metric each row uses. Error = (predicted - published) / published;
MAPE and the signed mean (bias; + = parsim too fast) per ``category`` and overall.

Rules
-----

* Hardware, from the GPU string (each profile is loaded at run time; a row whose profile
  does not load is skipped with that reason): the H100 96GB HBM2e at its 500 W limit
  (torchtitan's Grand Teton hosts) -> ``grand-teton-h100``; other power-capped parts (a B200
  whose limit is not stated) have no profile -> not expressible; GB300 ->
  ``gb300-nvl72``; GB200 -> ``gb200-nvl72``; B300 -> ``dgx-b300``; B200 -> ``dgx-b200`` when it loads, else
  ``hgx-b200``; H800 -> ``dgx-h800``; H200 -> ``dgx-h200``; H100 (SXM/DGX/80GB/unqualified)
  -> ``dgx-h100``; A100 80GB -> ``dgx-a100-80g``; A100 40GB -> ``dgx-a100-40g``; "Ampere GPUs" with the SKU unnamed
  (MegaScale: A100-class by the implied 312 TFLOP/s peak) -> ``dgx-a100-80g``, marked as an
  assumption. A row without a GPU count is skipped.
* Model: a parsim preset when the row names a model parsim has (checked against
  ``parsim.model.PRESETS`` at run time) and the row's architecture numbers (layers, hidden,
  heads, KV heads, FFN, vocabulary, experts -- those it gives) agree with the preset; else
  explicit fields from the row: MPT -> gelu FFN 4h, LayerNorm, linear biases, tied
  embeddings, learned positions sized to the training sequence (the llm-foundry tables'
  NumParams column grows by exactly (seq_len - 2048) x d_model and parsim reproduces it to
  the parameter with these choices; ALiBi without biases falls 0.03-0.14% short); GPT ->
  gelu FFN 4h, LayerNorm, biases, learned positions, tied embeddings (Megatron GPT
  defaults); Llama/Mixtral -> SwiGLU, RMSNorm, RoPE, untied (Mixtral adds its experts);
  other architectures (MLA, unnamed models) -> not expressible. Nemotron 3 Nano, Super and Ultra ->
  their presets (hybrid Mamba-2 / attention / MoE models, ``hybrid_pattern``; Super and Ultra with
  LatentMoE); Nemotron 3.5 Lightning -> the Nano preset (its backbone). Nemotron 3 rows train the
  recipes' multi-token prediction: 2 depths of one shared "*E" block (``mtp_pattern``, ``mtp_shared``).
  Qwen3-Next-80B-A3B -> its preset (Gated DeltaNet / gated attention blocks, each two hybrid layers).
  Rows from Megatron-MoE-ModelZoo's best-practice tables carry what their scripts set in a
  ``stated`` block (``_stated_settings``: dispatcher, EP overlap, ``--recompute-modules``, MTP).
  DeepSeek-V3's multi-token-prediction modules (``model.mtp_layers``, on the last pipeline
  stage) when the run trains them: its table or id says so, or Megatron-Bridge's recipes (which
  set ``mtp_num_layers = 1``) or DeepSeek's own report ran it (``mtp_trained``); a run that does
  not say (NeMo AutoModel, Megatron-LM's guide) trains none, noted on the row. Routing: the
  model's own (DeepSeek-V3's group-limited routing, 4 of 8 groups, from its preset: Megatron's
  forced load balancing draws random logits and keeps it); a run with NeMo AutoModel's fake
  balanced gate gives each token ``top_k`` consecutive experts, i.e. one of ``E / top_k`` groups.
* Precision: fp8 whenever the row trains in FP8 of any recipe (current/delayed scaling,
  tensorwise/rowwise, blockwise) -- including partial FP8 (torchtitan's Float8 linears,
  MXFP8 on routed experts only), with the scaling recipe the row states as
  ``training.fp8_recipe`` (current / mxfp8 / blockwise / delayed: ``fp8_recipe_for``; unstated:
  the device's default, MXFP8 on Blackwell, current scaling on Hopper); NVFP4 rows run fp8 with
  ``fp8_recipe = "nvfp4"`` (Transformer Engine's NVFP4BlockScaling, the 4-bit recipe of its FP8
  path); bf16 otherwise (also when unstated, noted).
* Parallel layout as published: tp, pp, cp, ep, vpp (missing -> 1);
  dp = GPUs / (tp x pp x cp) (a row whose stated dp disagrees is skipped; no layout -> skipped).
  Sharding: FSDP / FULL_SHARD / FSDP2 (a Megatron FSDP column > 0, torchtitan, llm-foundry,
  AutoModel) -> ``zero = 3``, except FSDP that keeps parameters gathered after the forward
  (``reshard_after_forward = never``, Llama 3's "do not reshard after forward") -> ``zero = 2``,
  as a stated ZeRO-2 (MegaScale) is; a stated ZeRO-1 / distributed optimizer -> 1;
  Megatron-family rows (Megatron-LM/Core, NeMo, Megatron-Bridge, MegaScale) otherwise ->
  ``zero = 1`` (the distributed optimizer of the perf recipes); others -> 0. HSDP would be
  noted (no row has it). ``sequence_parallel = true`` when tp > 1 for Megatron-family rows,
  else as the row says. MoE rows route balanced and dropless (``[moe] routing = "balanced"``,
  ``drop_tokens = false``): the Megatron-Bridge tables force-balance and are dropless,
  AutoModel runs a fake balanced gate; assumed for the rest. Expert tensor parallelism is 1
  (every Megatron-Bridge MoE recipe sets expert_tensor_parallel_size = 1): the published EP
  is the whole expert-parallel group, carved out of tp x dp x cp, which parsim writes as
  ``ep = EP / tp`` with ``[moe] expert_tp = 1`` (the same group; tp = 1 rows are unchanged).
  Token dispatch: the row's Megatron-Bridge perf recipe where its layout matches (below); a row
  whose stated kernels name DeepEP (AutoModel's "TE + DeepEP") -> ``[moe] dispatcher = "deepep"``;
  else NCCL all-to-all (Megatron-Core's default).
* Rank order (which groups share a node): the row's stated order (Llama 3: TP, CP, PP, DP
  innermost to outermost); else Megatron's default tp-cp-ep-dp-pp, innermost first, which
  torchtitan's and AutoModel's device meshes share (pipeline outermost; in parsim's
  slowest-first ``parallel.order``: pp, dp, ep, cp, tp).
* Batch: global batch as published (missing, or a ramp instead of one number -> skipped);
  microbatch as published, else global / (dp x microbatches) when the row gives the
  microbatch count, else, for a torchtitan pipeline (pp > 1) with the local batch given,
  torchtitan's default of pp microbatches (``TITAN_STAGES_PER_RANK``'s note), else 1
  (Megatron's default; noted). Sequence length as published, else
  from a "32K"-style label (K = 1024, noted), else the row's inferred default (noted).
* Schedule: ``Interleaved1F1B`` with the given vpp when vpp > 1 (a torchtitan row naming a
  looped schedule without its stages per rank: torchtitan's default 2), else ``1F1B``. Layer split,
  in this order: even over pp x vpp stages; else with the embedding and the loss each counted
  as one layer (Megatron's --account-for-embedding/loss-in-pipeline-split, which the 405B
  recipes set; it also gives Llama 3's 7, 8 x 14, 7 on pp 16); else the loss alone; else, interleaved only, every middle stage takes ceil(layers / stages) blocks and
  the first and last chunks share the rest (Megatron's custom ``pp_layout`` for DeepSeek-V3:
  1, 2 x 30, 0); vpp = 1 falls back to parsim's as-even-as-possible split. Megatron-Bridge's
  DeepSeek-V3 rows first take the recipes' own layout where it has the row's (pp, vpp)
  (``MB_DSV3_LAYOUTS``: the MTP layers and the loss ride with the last stage's few blocks).
* Recompute: as stated (full / selective / none; "activation checkpointing ON" is full,
  torchtitan's per-op SAC is ``op``: its policy, not Megatron's selective). Not stated: NeMo AutoModel rows -> ``full`` (its
  benchmark YAMLs set activation_checkpointing: true); every other row -> ``none``. For the
  Megatron-family rows this is the perf recipes' setting
  (Megatron-Bridge scripts/performance/configs/*/..._workload_base_configs.py set no full
  recompute for Llama 3 70B/405B and Qwen3). The exceptions are applied from the recipes: Llama 3 8B
  H100 FP8-CS recomputes the first 5 of 32 blocks (``recompute_method = "block"``), GPT-OSS and
  DeepSeek-V3 recompute modules (``recompute_modules``: layernorm + moe_act; mla_up_proj, with
  mlp on some); the GB200 FSDP 70B FP8 recipe offloads the activations of 40 of its 80 blocks to
  the host (``[offload] activations = "cpu"``, ``activation_layers = 40``). Either way noted on the row.
* Overlap: Megatron-family rows ``grad_reduce = param_gather = tp_comm = true`` (the perf
  recipes' --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap); FSDP-family
  rows ``grad_reduce = param_gather = true`` (FSDP's reduce-scatter and prefetched gathers as
  parsim models them: ZeRO-3 gathers each stage's parameters asynchronously ahead of its
  first forward) and ``tp_comm`` = the row's async-TP flag.
* Optimizer: Adam (LAMB keeps the same two moments: counted as Adam, noted).
* Kernels: torchtitan rows its tables call eager (no torch.compile) run the memory-bound ops
  unfused (``training.fused_kernels = false``, noted); compiled and other rows fused.

Rows from the Megatron-LM README weak-scaling table (``megatronlm-weakscale-*``) are the same
runs as ``tests/data/published.json``'s ``megatron-core-h100-weak-*``, on which dgx-h100's
``sustained_fraction`` was fitted: they are flagged "calibration" and the summary gives the
MAPE with and without them.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.errors import ConfigError
from parsim.model import PRESETS
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate

DATA = ROOT / "benchmarks" / "data" / "heldout_runs.json"
MB_MOE_RECIPES = ROOT / "benchmarks" / "data" / "megatron_bridge_moe_recipes.json"
"""Megatron-Bridge perf-recipe MoE communication settings per row (dispatcher, EP overlap, TP
overlap), read from the recipes; applied only where the recipe's layout matches the row."""

CALIBRATION_PREFIX = "megatronlm-weakscale-"
"""Rows of the table dgx-h100's sustained_fraction was fitted on (see the docstring)."""


@dataclass(frozen=True)
class Skip:
    """A row parsim cannot express: ``kind`` (a short tag, for the tally) and why."""

    kind: str
    reason: str


# --------------------------------------------------------------------------- loading
def load_rows(path: Path = DATA) -> list[dict]:
    return json.loads(Path(path).read_text())


PROFILE_ERRORS: dict[str, str] = {}
"""Why a profile did not load, by name (filled by :func:`profile_loads`)."""


@cache
def profile_loads(name: str) -> bool:
    """Whether parsim loads hardware profile ``name`` (probed through the scenario loader)."""
    probe = {"name": "probe", "hardware": name, "gpus": 8, "model": {"preset": "llama3-8b"},
             "training": {"global_batch": 8, "seq_len": 1024}, "parallel": {"dp": 8}}
    try:
        scenario_from_dict(probe, f"<profile probe {name}>")
    except ConfigError as err:  # missing (key "hardware") or broken: either way not usable
        PROFILE_ERRORS[name] = "not found" if err.key == "hardware" else err.line()
        return False
    return True


# --------------------------------------------------------------------------- helpers
def _int(v) -> int | None:
    """An integer from a JSON value ('8', 8, 8.0); None for None/'' and non-numbers."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return int(v) if float(v).is_integer() else None
    if isinstance(v, str) and re.fullmatch(r"\s*\d+\s*", v):
        return int(v)
    return None


def _num(v) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = v.replace(",", "").strip()
        if re.fullmatch(r"\d+(\.\d+)?", s):
            return float(s)
    return None


TITAN_STAGES_PER_RANK = 2
"""torchtitan's pipeline defaults at the commit its 2024 tables cite (9dec370, 2024-12-26): a looped
schedule (``PipelineScheduleMulti``: Interleaved 1F1B, LoopedBFS, ...) without split points gets
``num_stages_per_rank = 2`` (``generate_split_points``), and ``--experimental.
pipeline_parallel_microbatches`` unset means as many microbatches as the pipeline degree
(``build_pipeline_schedule``: ``n_microbatches = pipeline_parallel_degree``), each rank's local
batch split into them. ``parsim import`` applies the same to 2024 torchtitan files
(``parsim.frameworks.torchtitan``)."""


def _looped(schedule) -> bool:
    """A multi-stage (looped) pipeline schedule by its published name."""
    name = str(schedule or "").lower().replace(" ", "").replace("-", "").replace("_", "")
    return any(k in name for k in ("interleaved", "looped", "zbv", "dualpipe"))


def family(row: dict) -> str:
    """The framework family: ``megatron`` (Megatron-LM/Core, NeMo, Megatron-Bridge, MegaScale),
    ``fsdp`` (torchtitan, llm-foundry/Composer, NeMo AutoModel, Meta's FSDP-based stack) or ``other``."""
    fw = row["framework"]["name"].lower()
    if "automodel" in fw or "torchtitan" in fw or "composer" in fw or "llm-foundry" in fw or "fsdp" in fw:
        return "fsdp"
    if "megatron" in fw or "nemo" in fw or "megascale" in fw:
        return "megatron"
    if "meta internal" in fw:
        return "fsdp"
    return "other"


# --------------------------------------------------------------------------- hardware
def hardware_for(gpu: str) -> tuple[str | None, Skip | None, list[str]]:
    """(profile, None, notes) or (None, Skip, notes) for a GPU string."""
    g = gpu.lower()
    notes: list[str] = []
    capped = "power-limited" in g or "power limit" in g or "power limited" in g
    if capped and "h100" in g and "hbm2e" in g and "500w" in g.replace(" ", ""):
        # torchtitan's Grand Teton hosts: H100 96GB HBM2e at the 500 W default limit
        return "grand-teton-h100", None, notes
    if capped:
        return None, Skip("hardware: power-limited GPU",
                          f"{gpu!r}: a power-capped part, no parsim profile for it"), notes
    if "gb300" in g:
        want = ["gb300-nvl72"]
    elif "gb200" in g:
        want = ["gb200-nvl72"]
    elif "b300" in g:
        want = ["dgx-b300"]
    elif "b200" in g:
        want = ["dgx-b200", "hgx-b200"]
    elif "h800" in g:
        want = ["dgx-h800"]
    elif "h200" in g:
        want = ["dgx-h200"]
    elif "h100" in g:
        want = ["dgx-h100"]
        if "implied" in g:
            notes.append("GPU not named by the source (H100 implied)")
    elif "a100" in g and "40gb" in g:
        want = ["dgx-a100-40g"]
    elif "a100" in g:
        want = ["dgx-a100-80g"]
    elif "ampere" in g:
        want = ["dgx-a100-80g"]
        notes.append("Ampere SKU unnamed: A100 80GB DGX assumed (A100-class by the implied peak)")
    else:
        return None, Skip("hardware: unknown GPU", f"{gpu!r}: no rule maps it to a profile"), notes
    for name in want:
        if profile_loads(name):
            if name != want[0]:
                notes.append(f"{want[0]} not available: {name} used")
            return name, None, notes
    why = "; ".join(f"{n}: {PROFILE_ERRORS.get(n, 'not found')}" for n in want)
    return None, Skip(f"hardware: no profile {want[0]}",
                      f"{gpu!r} needs profile {' or '.join(want)}, which parsim does not load ({why})"), notes


# --------------------------------------------------------------------------- model
PRESET_RULES: tuple[tuple[str, str], ...] = (
    (r"llama ?2\b.*\b7b\b", "llama2-7b"),
    (r"llama ?2\b.*\b70b\b", "llama2-70b"),
    (r"llama ?3\b.*\b405b\b", "llama3-405b"),
    (r"llama ?3\b.*\b70b\b", "llama3-70b"),
    (r"llama ?3\b.*\b8b\b", "llama3-8b"),
    (r"llama ?4 ?scout", "llama4-scout"),
    (r"deepseek-v3\b", "deepseek-v3"),
    (r"qwen3-235b", "qwen3-235b-a22b"),
    (r"qwen3-30b", "qwen3-30b-a3b"),
    (r"gpt-oss-120b", "gpt-oss-120b"),
    (r"gpt-oss-20b", "gpt-oss-20b"),
    (r"mixtral-8x7b", "mixtral-8x7b"),
    (r"mixtral-8x22b", "mixtral-8x22b"),
    (r"gpt-3 175b", "gpt3-175b"),
    (r"^gpt \((\d+(?:\.\d+)?)b\)", "mcore-gpt-{0}b"),  # Megatron-Core weak-scaling GPTs
    (r"\bmpt-(\d+)b\b", "mpt-{0}b"),
    (r"^nemotron-3-nano-30b-a3b$", "nemotron-3-nano-30b-a3b"),
    (r"^nemotron-3\.5-lightning-30b-a3b$", "nemotron-3-nano-30b-a3b"),  # the Nano backbone (its MTP: the row's)
    (r"^nemotron-3-super-120b-a12b$", "nemotron-3-super-120b-a12b"),
    (r"^nemotron-3-ultra-550b-a55b$", "nemotron-3-ultra-550b-a55b"),
    (r"^qwen3-next-80b-a3b$", "qwen3-next-80b-a3b"),
)
"""(pattern on the lower-cased model name, preset name) -- first match wins."""

ARCH_FIELDS = (("layers", "n_layers"), ("hidden", "d_model"), ("heads", "n_heads"),
               ("kv_heads", "n_kv_heads"), ("vocab", "vocab_size"), ("experts", "n_experts"))


def _preset_name(name: str) -> str | None:
    n = name.lower()
    for pat, preset in PRESET_RULES:
        m = re.search(pat, n)
        if m:
            return preset.format(*m.groups())
    return None


def _arch_mismatch(m: dict, spec) -> list[str]:
    out = []
    for key, field in ARCH_FIELDS:
        v = _int(m.get(key))
        if v is not None and v != getattr(spec, field):
            out.append(f"{key} {v} vs {getattr(spec, field)}")
    ffn = _int(m.get("ffn"))
    if ffn is not None and not spec.n_experts and ffn != spec.d_ff:
        out.append(f"ffn {ffn} vs {spec.d_ff}")
    return out


def model_for(row: dict, seq_len: int) -> tuple[dict | None, Skip | None, list[str]]:
    """The [model] table for a row (preset or explicit fields), or a Skip."""
    m = row["model"]
    name = m["name"]
    notes: list[str] = []
    preset = _preset_name(name)
    if preset is not None and preset in PRESETS:
        bad = _arch_mismatch(m, PRESETS[preset])
        if not bad:
            if all(m.get(k) is None for k, _ in ARCH_FIELDS):
                notes.append(f"architecture not in the row: preset {preset} by name")
            return {"preset": preset}, None, notes
        notes.append(f"row differs from preset {preset} ({', '.join(bad)}): explicit fields")
    n = name.lower()
    L, D, H = _int(m.get("layers")), _int(m.get("hidden")), _int(m.get("heads"))
    V, F = _int(m.get("vocab")), _int(m.get("ffn"))
    K = _int(m.get("kv_heads")) or H
    if None in (L, D, H, V):
        return None, Skip("model: architecture not given",
                          f"{name!r}: no parsim preset and the row lacks layers/hidden/heads/vocab"), notes
    if "mla" in str(m.get("attention", "")).lower():
        return None, Skip("model: not expressible", f"{name!r}: MLA attention without a parsim preset"), notes
    base = {"name": re.sub(r"[^a-z0-9.]+", "-", n).strip("-")[:40], "n_layers": L, "d_model": D,
            "n_heads": H, "n_kv_heads": K, "vocab_size": V}
    if n.startswith("mpt"):
        return {**base, "d_ff": F or 4 * D, "ffn": "gelu", "norm": "layernorm", "bias": True,
                "tied_embeddings": True, "position": "learned", "max_seq_len": seq_len}, None, notes
    if "gpt" in n:
        return {**base, "d_ff": F or 4 * D, "ffn": "gelu", "norm": "layernorm", "bias": True,
                "tied_embeddings": True, "position": "learned", "max_seq_len": seq_len}, None, notes
    if "llama" in n or "mixtral" in n:
        if F is None:
            return None, Skip("model: architecture not given", f"{name!r}: FFN size not given"), notes
        spec = {**base, "d_ff": F, "ffn": "swiglu", "norm": "rmsnorm", "position": "rope",
                "max_seq_len": max(seq_len, 4096)}
        E, k = _int(m.get("experts")), _int(m.get("top_k"))
        if E:
            spec.update(n_experts=E, top_k=k or 1, d_ff_expert=_int(m.get("expert_ffn")) or F)
            if _int(m.get("shared_experts")):
                spec["n_shared_experts"] = _int(m["shared_experts"])
        return spec, None, notes
    return None, Skip("model: not expressible", f"{name!r}: no parsim preset and no family rule"), notes


# --------------------------------------------------------------------------- precision
def fp8_recipe_for(row: dict) -> str | None:
    """The FP8 scaling recipe the row states (``training.fp8_recipe``), None where it does not
    (the device's default then: MXFP8 on Blackwell, current scaling on Hopper): Transformer
    Engine's current scaling ("FP8-CS") and torchao's tensorwise dynamic scaling are per-tensor
    scales from the current step; "FP8-MX" / mxfp8 is MXFP8; DeepSeek's 1x128 / 128x128 tiles are
    blockwise; an amax history is delayed scaling; torchao's rowwise scaling is ``rowwise``."""
    p = row["precision"]
    # the recipe of the published value (Megatron-Bridge rows give "A (B)": the primary A first)
    text = str(p.get("recipe") or "").lower().split("parenthesised")[0]
    if "nvfp4" in text or "nvfp4" in str(p.get("dtype") or "").lower():
        return "nvfp4"  # Transformer Engine's NVFP4BlockScaling (Megatron-Bridge bf16_with_nvfp4_mixed)
    if "mxfp8" in text or "fp8-mx" in text:
        return "mxfp8"
    if "rowwise" in text or "row-wise" in text:  # torchao.float8's rowwise recipe
        return "rowwise"
    if "current scaling" in text or "fp8-cs" in text or "tensorwise" in text or "tensor-wise" in text:
        return "current"
    if "128x128" in text or "1x128" in text or "blockwise" in text or "block-wise" in text:
        return "blockwise"
    if "amax-history" in text or "delayed" in text:
        return "delayed"
    return None


def precision_for(row: dict) -> tuple[str, list[str]]:
    p = row["precision"]
    dtype = str(p.get("dtype") or "").lower()
    notes: list[str] = []
    if "nvfp4" in dtype:  # Blackwell's 4-bit recipe rides TE's FP8 path: precision fp8, fp8_recipe nvfp4
        return "fp8", notes
    if "fp8" in dtype or "float8" in dtype:
        prec = "fp8"
        if "bf16 params" in dtype or "on routed experts" in dtype or "nn.linear" in dtype or "linears" in dtype:
            notes.append("FP8 on part of the GEMMs only; parsim runs every GEMM in fp8")
        if "inferred" in dtype:
            notes.append("FP8 inferred by the data set, not stated by the source")
        return prec, notes
    if "bf16" in dtype or "bfloat16" in dtype:
        return "bf16", notes
    notes.append("precision not stated: bf16 assumed")
    return "bf16", notes


# --------------------------------------------------------------------------- recompute
HOPPER_PROFILES = ("dgx-h100", "dgx-h200", "dgx-h800", "grand-teton-h100")


def attention_for(row: dict, fam: str, profile: str) -> tuple[str | None, list[str]]:
    """The fused-attention implementation the row's framework calls (``training.attention_kernel``).

    Only on Hopper does the choice matter here (Ampere has FA2 only; Blackwell rows keep the
    device's FA4): Megatron-family stacks call Transformer Engine's DotProductAttention, whose
    FusedAttention (cuDNN) backend is the one TE picks on sm90 -> ``cudnn``; torchtitan's SDPA
    dispatches to PyTorch's built-in FlashAttention-2 kernels -> ``fa2``. llm-foundry's benchmark
    tables ran ``attn_impl: triton`` (its submit_benchmarks.py default then) -> ``triton``, on A100
    and H100 alike. Other stacks keep the device's FA3.
    """
    fw = row["framework"]["name"].lower()
    if ("llm-foundry" in fw or "composer" in fw) and (profile in HOPPER_PROFILES or "a100" in profile):
        # the benchmark tables' runs: scripts/train/benchmarking/submit_benchmarks.py defaults
        # --attn_impl to triton (at the commits that added the A100 and H100 tables) and sweep.sh
        # does not override it; the pretrain yamls say attn_impl: triton too
        return "triton", ["attention: llm-foundry attn_impl triton (flash_attn_triton.py)"]
    if profile not in HOPPER_PROFILES:
        return None, []
    if fam == "megatron":
        return "cudnn", ["attention: TE FusedAttention (cuDNN)"]
    if "torchtitan" in fw:
        return "fa2", ["attention: FlashAttention-2 (SDPA)"]
    return None, []


def recompute_for(row: dict, fam: str) -> tuple[str, list[str]]:
    r = row["training"].get("recompute")
    if r is None:
        if "automodel" in row["framework"]["name"].lower():
            return "full", ["recompute not stated: full (AutoModel benchmark YAMLs checkpoint activations)"]
        if fam == "megatron":
            return "none", ["recompute not stated: none (Megatron-Bridge perf-recipe default)"]
        return "none", ["recompute not stated: none"]
    t = r.lower()
    notes = ["recompute inferred by the data set, not verified"] if ("not verified" in t or "inferred" in t) else []
    if "torchtitan" in row["framework"]["name"].lower() and "selective" in t and ("per-op" in t or "op policy" in t):
        # torchtitan's selective_ac_option = "op": matmul and SDPA outputs saved, every second
        # matmul and all other ops rerun (parsim's recompute = "op")
        return "op", notes
    if "disabled" in t or re.search(r"\boff\b", t) or "mode: none" in t or t.startswith("none"):
        return "none", notes
    if "selective" in t:
        return "selective", notes
    if "full" in t or re.search(r"\bon\b", t):
        return "full", notes
    return "none", notes + [f"recompute {r!r} not understood: none"]


# --------------------------------------------------------------------------- sharding
def zero_for(row: dict, fam: str) -> tuple[int, list[str]]:
    p = row["parallel"]
    fsdp, zs = p.get("fsdp"), p.get("zero_stage")
    text = f"{fsdp or ''} {zs or ''}".lower()
    notes: list[str] = []
    if p.get("hsdp_shard"):
        notes.append(f"HSDP (shard group {p['hsdp_shard']}) modelled as ZeRO over all of dp")
    fsdp_n = _int(fsdp)
    is_fsdp = (fsdp_n is not None and fsdp_n > 0) or any(w in text for w in ("fsdp", "full_shard", "shards"))
    if fam == "fsdp" and fsdp_n == 0:
        is_fsdp = False
    if fam == "fsdp" and fsdp is None and zs is None:
        is_fsdp = True
    if "never" in text or "do not reshard" in text or "not reshard" in text:
        return 2, notes + ["FSDP without resharding after the forward: ZeRO-2"]
    if is_fsdp:
        return 3, notes
    if "zero-2" in text or "zero2" in text:
        return 2, notes
    if zs == 1 or "distributed optimizer" in text or "zero-1" in text:
        return 1, notes
    if fam == "megatron":
        return 1, notes
    return 0, notes


# --------------------------------------------------------------------------- rank order
FRAMEWORK_ORDER = ("pp", "dp", "ep", "cp", "tp")
"""Slowest-varying axis first: Megatron's default rank order tp-cp-ep-dp-pp (innermost first),
which torchtitan's and AutoModel's device meshes (pp, dp, cp, tp) share: pipeline outermost."""


def order_for(row: dict) -> tuple[list[str], list[str]]:
    """``parallel.order`` (slowest first): the row's stated order, else FRAMEWORK_ORDER."""
    text = str(row["parallel"].get("order") or "").lower()
    axes = re.findall(r"\b(tp|cp|pp|dp|ep)\b", text)
    if len(set(axes)) >= 3 and len(axes) == len(set(axes)):
        # written innermost first (Megatron's notation) unless the row says otherwise
        inner_first = axes[::-1] if "outermost to innermost" in text else list(axes)
        for a in ("tp", "cp", "ep", "dp", "pp"):
            if a not in inner_first:  # an axis the row leaves out goes just inside dp (ep) or innermost
                inner_first.insert(inner_first.index("dp") if "dp" in inner_first else 0, a)
        return inner_first[::-1], [f"rank order as stated: {row['parallel']['order']}"]
    return list(FRAMEWORK_ORDER), []


# --------------------------------------------------------------------------- layer split
MB_DSV3_LAYOUTS = {(4, 1): (16, 13), (8, 1): (8, 5), (4, 2): (8, 5), (16, 1): (4, 1), (8, 2): (4, 1), (4, 4): (4, 1)}
"""(pp, vpp) -> decoder layers of DeepSeek-V3's first and last (virtual) stage in Megatron-Bridge's
recipes (recipes/deepseek/h100/deepseek_v3.py ``_get_deepseek_v3_pipeline_layout``, HEAD 067f987df:
the embedding with the first stage's blocks, the MTP layers and the loss with the last's, the
others even), the layout every DeepSeek-V3 perf recipe sets; other (pp, vpp): not in the map."""


def split_for(layers: int, pp: int, vpp: int, recipe: dict | None = None) -> tuple[dict, list[str]]:
    """[schedule] keys that shape the layer split (see the Rules); ``recipe``: the framework's own
    (pp, vpp) -> (first, last) layout for this model, used where it has one."""
    if recipe and (pp, vpp) in recipe:
        first, last = recipe[(pp, vpp)]
        return {"first_stage_layers": first, "last_stage_layers": last}, \
            [f"the recipe's layout: first {'chunk' if vpp > 1 else 'stage'} {first} blocks, last {last}"]
    stages = pp * vpp
    if stages == 1 or layers % stages == 0:
        return {}, []
    if (layers + 2) % stages == 0:
        return {"account_for_embedding": True, "account_for_loss": True}, \
            ["embedding and loss each counted as a layer in the pipeline split"]
    if (layers + 1) % stages == 0:
        return {"account_for_loss": True}, ["loss counted as a layer in the pipeline split"]
    if vpp > 1 and stages > 2:
        k = math.ceil(layers / stages)
        rest = layers - k * (stages - 2)
        if 0 <= rest <= 2 * k:
            first = min(k, rest - rest // 2)
            return {"first_stage_layers": first, "last_stage_layers": rest - first}, \
                [f"uneven interleaved split: first chunk {first}, last {rest - first}, others {k}"]
    return {}, ["uneven split: parsim's as-even-as-possible rule"]


# --------------------------------------------------------------------------- the rule set
def _seq_len(t: dict) -> tuple[int | None, list[str]]:
    if _int(t.get("seq_len")):
        return _int(t["seq_len"]), []
    label = t.get("seq_len_label")
    if isinstance(label, str):
        m = re.fullmatch(r"\s*(\d+)\s*[kK]\s*", label)
        if m:
            return int(m.group(1)) * 1024, [f"sequence length from the label {label!r} (K = 1024)"]
    if _int(t.get("seq_len_inferred_default")):
        return _int(t["seq_len_inferred_default"]), ["sequence length not stated: the framework default inferred"]
    return None, []


def published_metric(row: dict) -> tuple[str, float, str] | None:
    """(metric, value, published key): tokens/s/GPU when given, else model TFLOP/s/GPU."""
    pub = row["published"]
    for key in ("tokens_per_sec_per_gpu", "tokens_per_sec_per_gpu_derived", "tokens_per_sec_per_gpu_assumed"):
        v = _num(pub.get(key))
        if v:
            return "tokens/s/GPU", v, key
    for key in ("model_tflops_per_sec_per_gpu", "tflops_per_gpu", "per_gpu_tflops", "with_cp_tflops_per_gpu"):
        v = _num(pub.get(key))
        if v:
            return "TFLOP/s/GPU", v, key
    return None


def mtp_trained(row: dict) -> str | bool | None:
    """Whether a row whose model has multi-token prediction modules (``mtp_depth``) trains them:
    why it does (a string), False when its source says not, None when it does not say.
    ``mtp_depth`` is the architecture's (DeepSeek-V3: 1), not the run's."""
    table = str(row["model"].get("table_name") or "").lower()
    if "w/o mtp" in table or "nomtp" in row["id"]:
        return False
    if "w/ mtp" in table or "mtp1" in row["id"]:
        return "the run says so"
    if "megatron bridge" in row["framework"]["name"].lower():
        # Megatron-Bridge's DeepSeek-V3 recipes set it (recipes/deepseek/h100/deepseek_v3.py:
        # cfg.model.mtp_num_layers = 1), and their pipeline layouts place it with the loss
        return "Megatron-Bridge's DeepSeek-V3 recipes: mtp_num_layers = 1"
    if (row.get("stated") or {}).get("mtp_trained"):
        return row["stated"]["mtp_trained"]
    if "hai-llm" in row["framework"]["name"].lower():
        return "the DeepSeek-V3 report: MTP depth 1 in training"
    return None


def scenario_for(row: dict) -> dict | Skip:
    """The scenario document (the TOML tables as a dict) for one published row, or ``Skip``
    with the reason. The assumptions each row needed come from :func:`convert`."""
    return convert(row)[0]


def convert(row: dict) -> tuple[dict | Skip, list[str]]:
    """(scenario document or Skip, notes on the assumptions taken).

    Checks run in a fixed order (GPU count, hardware, model, published metric, layout,
    sequence, batch): a row that fails several is reported under the first.
    """
    notes: list[str] = []
    fam = family(row)
    hw, p, t = row["hardware"], row["parallel"], row["training"]
    gpus = _int(hw.get("count"))
    if not gpus:
        return Skip("no GPU count", "the source does not give the number of GPUs"), notes
    if hw.get("count_note"):  # the data set corrected the source's GPU count (and says why)
        notes.append(f"GPU count {gpus}, not the page's {hw.get('count_published')}: {hw['count_note']}")
    profile, skip, n = hardware_for(hw["gpu"])
    notes += n
    if skip:
        return skip, notes
    seq, seq_notes = _seq_len(t)
    model, skip, n = model_for(row, seq or 2048)
    notes += n
    if skip:
        return skip, notes
    spec = PRESETS[model["preset"]] if "preset" in model else None
    n_layers = spec.n_layers if spec else model["n_layers"]
    n_experts = spec.n_experts if spec else model.get("n_experts", 0)
    if published_metric(row) is None:
        given = ", ".join(k for k, v in row["published"].items() if v not in (None, "") and k != "table_row")
        return Skip("no per-GPU throughput published",
                    f"neither tokens/s/GPU nor model TFLOP/s/GPU in the row (it gives: {given})"), notes
    tp, pp = _int(p.get("tp")), _int(p.get("pp"))
    if tp is None and pp is None:
        return Skip("no parallel layout", "tp/pp/cp not stated"), notes
    tp, pp = tp or 1, pp or 1
    cp, ep, vpp = _int(p.get("cp")) or 1, _int(p.get("ep")) or 1, _int(p.get("vp")) or 1
    if p.get("ep_note"):
        notes.append("expert parallelism inferred by the data set, not verified")
    if gpus % (tp * pp * cp):
        return Skip("layout does not divide", f"{gpus} GPUs over tp*pp*cp = {tp * pp * cp}"), notes
    dp = gpus // (tp * pp * cp)
    stated = _int(p.get("dp")) or _int(p.get("dp_derived"))
    if stated is not None and stated != dp:
        return Skip("layout inconsistent", f"stated dp {stated} but GPUs/(tp*pp*cp) = {dp}"), notes
    moe = None
    if n_experts:
        # Megatron's EP is the whole expert-parallel group, carved out of tp*dp*cp with expert
        # tensor parallelism 1 (every Megatron-Bridge MoE recipe sets it); parsim's ep is carved
        # out of dp*cp and folds tp/expert_tp into the group: ep_parsim = EP / tp, expert_tp = 1
        moe = {"routing": "balanced", "drop_tokens": False}
        if tp > 1:
            if ep % tp:
                return Skip("layout does not divide", f"EP {ep} is not a multiple of tp {tp} (expert TP 1)"), notes
            ep //= tp
            moe["expert_tp"] = 1
            notes.append(f"EP {ep * tp} with expert TP 1: parsim ep {ep} x tp {tp}")
    notes += seq_notes
    if not seq:
        return Skip("no sequence length", "sequence length not stated"), notes
    gb_raw = t.get("global_batch_seqs")
    gbs = _int(gb_raw)
    if gb_raw is None:
        return Skip("no global batch", "global batch not stated"), notes
    if gbs is None:
        return Skip("global batch not one number", f"global batch {gb_raw!r} (a ramp, not one step's batch)"), notes
    if n_experts and "fake balanced gate" in json.dumps(row).lower():
        # NeMo AutoModel's FakeBalancedGate (noise 0) gives token i the top_k consecutive experts
        # from i * top_k (mod E): one of E / top_k groups of consecutive experts, uniformly over
        # the tokens -- balanced loads, and a token's experts on one GPU's or node's block
        k = spec.top_k if spec else model.get("top_k", 1)
        if n_experts % k == 0:
            model = {**model, "expert_groups": n_experts // k, "expert_groups_per_token": 1}
            notes.append(f"the run's fake balanced gate: each token's {k} experts consecutive "
                         f"(one of {n_experts // k} groups of {k})")
    mtp = _int(row["model"].get("mtp_depth"))
    if mtp:
        trains = mtp_trained(row)
        if trains:
            model = {**model, "mtp_layers": mtp}  # Megatron-Core's default placement: the last stage
            if row["model"].get("mtp_pattern"):  # a hybrid model's MTP block, one set of weights or one a depth
                model.update(mtp_pattern=row["model"]["mtp_pattern"], mtp_shared=bool(row["model"].get("mtp_shared")))
                trains = row["model"].get("mtp_source") or trains
            notes.append(f"multi-token prediction: {mtp} depth(s) on the last pipeline stage ({trains})")
        elif trains is None:
            notes.append("multi-token prediction: the run does not say it trains the model's MTP module; none")
    titan_pp = pp > 1 and "torchtitan" in row["framework"]["name"].lower()
    if titan_pp and vpp == 1 and _looped(p.get("pp_schedule")):
        vpp = TITAN_STAGES_PER_RANK
        notes.append(f"{p['pp_schedule']} with stages per rank not stated: torchtitan's default, {vpp}")
    mbs = _int(t.get("micro_batch"))
    if mbs is None:
        nmb = _int(t.get("microbatches"))
        local = _int(t.get("local_batch"))
        if nmb is None and titan_pp and local and local % pp == 0:
            nmb = pp  # torchtitan's pipeline_parallel_microbatches default (see TITAN_STAGES_PER_RANK)
            notes.append(f"pipeline microbatches not stated: torchtitan's default, pp = {pp} "
                         f"(microbatch {local // pp})")
        if nmb and gbs % (dp * nmb) == 0:
            mbs = gbs // (dp * nmb)
        else:
            mbs = 1
            notes.append("microbatch not stated: 1")
    precision, n = precision_for(row)
    notes += n
    recompute, n = recompute_for(row, fam)
    notes += n
    zero, n = zero_for(row, fam)
    notes += n
    attention, n = attention_for(row, fam, profile)
    notes += n
    fw_name = row["framework"]["name"].lower()
    # NeMo 2.0's GPTConfig and Megatron-Bridge's model providers default cross_entropy_loss_fusion
    # to True; Megatron-LM's --cross-entropy-loss-fusion is off unless given
    ce_fusion = "bridge" in fw_name or "nemo 2" in fw_name or "nemo framework" in fw_name
    # torchtitan's tables name eager runs (no torch.compile): the norms, rotary and SwiGLU then
    # run op by op (the others compile, which fuses them)
    eager = "torchtitan" in fw_name and "eager" in row["id"]
    if eager:
        notes.append("eager PyTorch: memory-bound ops unfused")
    if "lamb" in str(t.get("optimizer") or "").lower():
        notes.append("LAMB counted as Adam (same optimizer state)")
    sp = tp > 1 and (fam == "megatron" or bool(p.get("sequence_parallel")))
    dsv3_mb = "megatron bridge" in row["framework"]["name"].lower() and model.get("preset") == "deepseek-v3"
    split, n = split_for(n_layers, pp, vpp, MB_DSV3_LAYOUTS if dsv3_mb else None)
    notes += n
    order, n = order_for(row)
    notes += n
    if fam == "megatron":
        # pipeline sends block: Megatron's _communicate waits on its batch_isend_irecv requests and
        # synchronises ("to protect against race condition when using batch_isend_irecv()")
        overlap = {"grad_reduce": True, "param_gather": True, "tp_comm": True, "p2p": False}
        if row["id"].startswith("megascale-") and row["framework"]["name"] == "Megatron-LM":
            # MegaScale's baseline: Megatron-LM without the overlaps MegaScale's Table 3 ablation
            # adds one by one (data-parallel, pipeline, tensor-parallel communication)
            overlap = {"grad_reduce": False, "param_gather": False, "tp_comm": False, "p2p": False}
            notes.append("MegaScale baseline: no communication overlap (Table 3)")
    else:
        overlap = {"grad_reduce": True, "param_gather": True, "tp_comm": bool(p.get("async_tp"))}
    doc = {
        "name": row["id"],
        "hardware": profile,
        "gpus": gpus,
        "model": model,
        "training": {"global_batch": gbs, "microbatch_size": mbs, "seq_len": seq, "precision": precision,
                     "optimizer": "adam", "recompute": recompute,
                     **({"fp8_recipe": fp8_recipe_for(row)} if precision == "fp8" and fp8_recipe_for(row) else {}),
                     **({"attention_kernel": attention} if attention else {}),
                     **({"cross_entropy_fusion": True} if ce_fusion else {}),
                     **({"fused_kernels": False} if eager else {})},
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "zero": zero,
                     "sequence_parallel": sp, "order": order,
                     # Megatron-family ZeRO-2 (MegaScale, Fig. 1 and Sec. 3.1): the reduce-scatter runs
                     # once, after the last microbatch's backward, not after every microbatch
                     **({"grad_reduce": "step"} if fam == "megatron" and zero == 2 else {})},
        "schedule": {"name": "Interleaved1F1B" if vpp > 1 else "1F1B", **split},
        "overlap": overlap,
    }
    if moe is not None:
        notes += _moe_recipe(row, moe, doc["overlap"], doc["training"], notes, tp)
        notes += _stated_settings(row, moe, doc["overlap"], doc["training"], notes)
        notes += _stated_dispatcher(row, moe)
    notes += _dense_recipe(row, doc, notes)
    framework, grad_dtype, n = framework_states_for(row, fam, zero, precision)
    notes += n
    if framework != "zero":
        doc["parallel"]["framework"] = framework
    if grad_dtype is not None:
        doc["parallel"]["grad_reduce_dtype"] = grad_dtype
    if moe is not None:
        doc["moe"] = moe
    return doc, notes


MB_DENSE_RECIPES = {
    "mb-25.11-h100-llama38b-fp8cs": {"recompute": ("block", 5), "where": "perf_recipes/llama/h100/llama3.py:87-89, "
                                     "llama3_8b_pretrain_8gpu_h100_fp8cs_config"},
    "mb-25.11-gb200-llama370b-fp8cs": {"activation_layers": 40, "where": "perf_recipes/llama/gb200/llama3.py:282-284, "
                                       "llama3_70b_pretrain_64gpu_gb200_fp8cs_config"},
    "mb-26.04.01-gb200-llama370b-fp8": {"activation_layers": 40, "where": "perf_recipes/llama/gb200/llama3.py:282-284, "
                                        "llama3_70b_pretrain_64gpu_gb200_fp8cs_config (the 26.x table says FP8)"},
    # the row's own release (Megatron-Bridge v0.5.0, 2026-06-16): llama31_405b_pretrain_config_gb200/_gb300
    # set comm_overlap.tp_comm_overlap = False if precision == "nvfp4"
    "mb-26.06-gb200-llama31405b-nvfp4": {"tp_comm": False, "release": True, "where": "v0.5.0 scripts/performance/"
                                         "configs/llama/llama31_llm_pretrain.py, llama31_405b_pretrain_config_gb200"},
    "mb-26.06-gb300-llama31405b-nvfp4": {"tp_comm": False, "release": True, "where": "v0.5.0 scripts/performance/"
                                         "configs/llama/llama31_llm_pretrain.py, llama31_405b_pretrain_config_gb300"},
}
"""Dense Megatron-Bridge rows whose perf recipe (HEAD 067f987df, the row's layout) recomputes part of
the blocks (``--recompute-method``, ``--recompute-num-layers``) or offloads the activations of some
blocks to the host (``cpu_offloading``, activations only, ``cpu_offloading_num_layers``), or whose own
release's script turns TP communication overlap off (``tp_comm``: the NVFP4 405B rows)."""


def _recipe_recompute(row: dict, training: dict, notes: list[str], settings: dict) -> bool:
    """Put a perf recipe's recompute ``settings`` into ``training`` where the row does not state
    its recompute (``recompute_for`` then noted the default it took: that note goes); whether
    they were applied."""
    if row["training"].get("recompute") is not None:
        return False
    training |= settings
    notes[:] = [n for n in notes if not n.startswith("recompute not stated")]
    return True


def _dense_recipe(row: dict, doc: dict, notes: list[str]) -> list[str]:
    """The row's perf-recipe settings parsim expresses: full recomputation of part of the blocks
    where the row does not state its recompute (the "not stated" note is replaced), and
    block-by-block activation offload (``[offload] activations = "cpu"``, ``activation_layers``)."""
    r = MB_DENSE_RECIPES.get(row["id"])
    if r is None:
        return []
    out = []
    method, k = r.get("recompute", (None, None))
    if method is not None and _recipe_recompute(row, doc["training"], notes, {
            "recompute": "full", "recompute_method": method, "recompute_num_layers": k}):
        out.append(f"perf recipe recomputes: full, {method} {k} ({r['where']}; Megatron-Bridge HEAD, not the "
                   "row's release)")
    if "activation_layers" in r:
        doc["offload"] = {"activations": "cpu", "activation_layers": r["activation_layers"]}
        out.append(f"perf recipe offloads the activations of {r['activation_layers']} blocks to the host "
                   f"({r['where']}; Megatron-Bridge HEAD, not the row's release)")
    if r.get("tp_comm") is False:
        doc["overlap"]["tp_comm"] = False
        out.append(f"perf recipe turns tensor-parallel communication overlap off ({r['where']}, the row's release)")
    return out


@cache
def _mb_moe_recipes() -> dict:
    return json.loads(MB_MOE_RECIPES.read_text())["rows"]


def _moe_recipe(row: dict, moe: dict, overlap: dict, training: dict, notes: list[str], tp: int = 1) -> list[str]:
    """Set ``moe`` / ``overlap`` / ``training`` (in place) from the row's Megatron-Bridge perf
    recipe when one with the row's exact layout exists
    (benchmarks/data/megatron_bridge_moe_recipes.json): the dispatcher (HybridEP and DeepEP both
    dedupe per node; their SM counts), EP overlap (Megatron's overlap_moe_expert_parallel_comm;
    never set = false), TP overlap where stated, and selective recomputation by module
    (``recompute_modules``) where the row does not state its recompute (the recipe's "not
    stated" note is then replaced). Other MoE rows keep NCCL all-to-all without EP overlap
    (Megatron-Core's defaults)."""
    r = _mb_moe_recipes().get(row["id"])
    if r is None:
        return []
    name = (r["recipe"] or "?").rsplit("::", 1)[-1]
    if not r["layout_match"]:
        return [f"no Megatron-Bridge perf recipe with this layout (closest {name}): NCCL all-to-all, no EP overlap"]
    if r["dispatcher"] in ("deepep", "hybridep"):
        moe["dispatcher"] = r["dispatcher"]
        moe["dispatcher_sms"] = r["dispatcher_sms"]
    overlap["ep_comm"] = bool(r["ep_overlap"])
    # TP overlap as the recipe leaves it. Never set (null) means off: the base recipes start from
    # recipes/common.py _pretrain_common (comm_overlap=None), Megatron-Bridge then applies no
    # CommOverlapConfig (training/config.py: only `if self.comm_overlap is not None`), and the
    # model keeps Megatron-Core's TransformerConfig.tp_comm_overlap = False; the one helper that
    # would create one, scripts/performance/utils/overrides.py _set_moe_a2a_overlap_overrides,
    # runs only with EP overlap, which these rows do not set
    overlap["tp_comm"] = bool(r["tp_comm_overlap"])
    note = (f"perf recipe {name} (Megatron-Bridge HEAD, not the row's release): dispatcher {r['dispatcher']}, "
            f"EP overlap {'on' if r['ep_overlap'] else 'off'}")
    if r["tp_comm_overlap"] is None and tp > 1:
        note += ", TP overlap off (never set: Megatron-Core's default)"
    if r.get("bf16_last_layers") and training.get("precision") == "fp8":  # the recipe's BF16 tail under FP8 / NVFP4
        training["bf16_last_layers"] = r["bf16_last_layers"]
        note += f", last {r['bf16_last_layers']} layers in BF16"
    modules = re.match(r"selective, modules \[(.*?)\]", r.get("recompute") or "")
    names = [x.strip().strip("'\"") for x in modules.group(1).split(",")] if modules else []
    if names and _recipe_recompute(row, training, notes, {"recompute": "selective", "recompute_modules": names}):
        note += f", recompute selective {'+'.join(names)}"
    return [note]


def _stated_settings(row: dict, moe: dict, overlap: dict, training: dict, notes: list[str]) -> list[str]:
    """A row's own ``stated`` block -- what its source's command line sets (Megatron-MoE-ModelZoo's
    scripts): the dispatcher, EP overlap (``A2A_OVERLAP`` / the table's "+1f1b overlap"), the
    data-parallel overlaps where the command line leaves them off, and the selective
    recomputation's modules (``--recompute-modules``)."""
    st = row.get("stated") or {}
    out = []
    if st.get("dispatcher"):
        moe["dispatcher"] = st["dispatcher"]
        out.append(f"dispatcher {st['dispatcher']} (the run's command line)")
    if "ep_overlap" in st:
        overlap["ep_comm"] = bool(st["ep_overlap"])
        out.append(f"EP overlap {'on' if st['ep_overlap'] else 'off'} (the run's command line)")
    if st.get("dp_overlap") is False:  # no --overlap-grad-reduce / --overlap-param-gather on the command line
        overlap["grad_reduce"] = overlap["param_gather"] = False
        out.append("no data-parallel overlap (the run's command line)")
    if st.get("recompute_modules"):
        training["recompute_modules"] = list(st["recompute_modules"])
        out.append(f"recompute selective {'+'.join(st['recompute_modules'])} (the run's command line)")
    return out


def _stated_dispatcher(row: dict, moe: dict) -> list[str]:
    """A row whose stated kernel stack names DeepEP (NeMo AutoModel's "TE + DeepEP" column) routes its
    tokens with DeepEP's normal kernels (``[moe] dispatcher = "deepep"``: a token crosses the network
    once per destination node, then fans out over NVLink), unless a perf recipe already set it."""
    if "dispatcher" in moe or "deepep" not in row["framework"]["name"].lower():
        return []
    moe["dispatcher"] = "deepep"
    return ["dispatcher: DeepEP (the row's stated kernels)"]


def framework_states_for(row: dict, fam: str, zero: int, precision: str) -> tuple[str, str | None, list[str]]:
    """(``parallel.framework``, ``parallel.grad_reduce_dtype`` or None, notes): whose model-state
    memory and which gradient-reduction dtype the row's framework uses by default.

    * Megatron family (Megatron-LM/Core, NeMo, Megatron-Bridge, MegaScale): with the
      distributed optimizer (ZeRO-1) its memory layout is ``framework = "megatron"``. Megatron-LM
      accumulates and reduces bf16/FP8 gradients in fp32 (its arguments.py forces
      ``accumulate_allreduce_grads_in_fp32`` for bf16 unless ``--grad-reduce-in-bf16``); NeMo's
      and Megatron-Bridge's performance recipes, which most of these rows are, reduce in bf16.
    * torchtitan, NeMo AutoModel and Meta's stack: FSDP2 with ``reduce_dtype = float32``
      (torchtitan's ``mixed_precision_reduce`` default; the Llama 3 paper reduce-scatters
      gradients in FP32), ``framework = "fsdp"`` when parameters are sharded (ZeRO-3).
    * Composer / llm-foundry: their benchmark configs run FSDP ``mixed_precision: PURE``
      (bf16 reduction): the ZeRO paper's layout, 16-bit reduction (the defaults).
    """
    fw = row["framework"]["name"].lower()
    if precision not in ("bf16", "fp8"):
        return "zero", None, []
    if fam == "megatron":
        # NeMo's and Megatron-Bridge's performance recipes reduce in bf16 (NeMo's performance
        # guide: "reduction in bf16 ensures improved performance at large scale training compared
        # to the default precision of fp32"; ``optim.grad_sync_dtype=bf16``, Bridge's
        # ``ddp.grad_reduce_in_fp32 = False``); plain Megatron-LM keeps its fp32 default
        # (Megatron-LM's examples/llama table "follows those defined in NeMo Framework's performance scripts")
        recipe = "nemo" in fw or "bridge" in fw or "nemo" in str(row["source"].get("release", "")).lower()
        dtype = "bf16" if recipe else None
        note = ["gradients reduced in bf16 (NeMo / Megatron-Bridge performance recipes)"] if dtype else []
        if zero <= 1:
            return "megatron", dtype, note
        return "zero", dtype or "fp32", note or ["gradients reduced in fp32 (Megatron's default for bf16)"]
    if "torchtitan" in fw or "automodel" in fw or "meta internal" in fw:
        if zero == 3:
            return "fsdp", None, []
        return "zero", "fp32", ["gradients reduced in fp32 (FSDP2 reduce_dtype float32)"]
    return "zero", None, []


# --------------------------------------------------------------------------- running
def _layout(doc: dict) -> str:
    """tp pp cp dp [ep: the published expert-parallel group] [vpp] z<ZeRO stage>."""
    par = doc["parallel"]
    group = par["ep"] * par["tp"] // doc.get("moe", {}).get("expert_tp", par["tp"])
    return (f"tp{par['tp']} pp{par['pp']} cp{par['cp']} dp{par['dp']}" + (f" ep{group}" if group > 1 else "")
            + (f" vpp{par['vpp']}" if par["vpp"] > 1 else "") + f" z{par['zero']}")


def run_row(row: dict) -> dict:
    """Convert, simulate and compare one row; a dict with ``status`` "compared" or "skipped"."""
    doc, notes = convert(row)
    base = {"id": row["id"], "category": row["category"], "gpus": _int(row["hardware"].get("count")),
            "notes": notes, "calibration": row["id"].startswith(CALIBRATION_PREFIX)}
    if isinstance(doc, Skip):
        return {**base, "status": "skipped", "kind": doc.kind, "reason": doc.reason}
    try:
        sc = scenario_from_dict(doc, f"<heldout:{row['id']}>")
    except ConfigError as err:
        return {**base, "status": "skipped", "kind": "parsim refused the scenario", "reason": err.line()}
    try:
        res = simulate(sc).to_json()
    except Exception as err:  # noqa: BLE001 -- a cost-model bug in one row is reported, not fatal
        return {**base, "status": "skipped", "kind": "simulation error", "reason": f"{type(err).__name__}: {err}"}
    metric, published, key = published_metric(row)
    if metric == "tokens/s/GPU":
        predicted = res["tokens_per_s"] / res["world_size"]
    else:
        predicted = res["tflops_per_gpu"]
    step = res["step_time_s"]
    bd = res.get("breakdown_s", {})
    comm = sum(bd.get(k, 0.0) for k in ("tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_comm"))
    return {**base, "status": "compared", "scenario": doc, "metric": metric, "published_key": key,
            "predicted": predicted, "published": published, "error": (predicted - published) / published,
            "layout": _layout(doc),
            "step_time_s": step, "mfu": res.get("mfu"), "fits_in_memory": res.get("fits_in_memory"),
            "compute_frac": bd.get("compute", 0.0) / step, "recompute_frac": bd.get("recompute", 0.0) / step,
            "comm_frac": comm / step, "bubble_frac": bd.get("bubble", 0.0) / step,
            "optimizer_frac": bd.get("optimizer", 0.0) / step,
            "comm_by_axis_s": {k: v for k, v in res.get("exposed_comm_by_axis_s", {}).items() if v}}


def summarise(results: list[dict]) -> dict:
    done = [r for r in results if r["status"] == "compared"]

    def stats(rows):
        if not rows:
            return {"n": 0, "mape_pct": None, "bias_pct": None}
        return {"n": len(rows), "mape_pct": 100 * sum(abs(r["error"]) for r in rows) / len(rows),
                "bias_pct": 100 * sum(r["error"] for r in rows) / len(rows)}

    cats = sorted({r["category"] for r in results})
    per_cat = {}
    for c in cats:
        per_cat[c] = {"rows": sum(r["category"] == c for r in results),
                      **stats([r for r in done if r["category"] == c])}
    tally: dict[str, int] = {}
    for r in results:
        if r["status"] == "skipped":
            tally[r["kind"]] = tally.get(r["kind"], 0) + 1
    return {"rows": len(results), "compared": len(done), "skipped": len(results) - len(done),
            "per_category": per_cat, "overall": stats(done),
            "overall_without_calibration": stats([r for r in done if not r["calibration"]]),
            "by_metric": {m: stats([r for r in done if r["metric"] == m]) for m in ("tokens/s/GPU", "TFLOP/s/GPU")},
            "not_fitting": sum(r["fits_in_memory"] is False for r in done),
            "skip_reasons": dict(sorted(tally.items(), key=lambda kv: -kv[1]))}


def run_all(rows: list[dict] | None = None) -> tuple[list[dict], dict]:
    results = [run_row(r) for r in (rows if rows is not None else load_rows())]
    return results, summarise(results)


# --------------------------------------------------------------------------- output
def _fmt(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def table(results: list[dict]) -> str:
    head = ("| id | category | GPUs | layout | metric | predicted | published | error | compute | recompute "
            "| exposed comm | bubble | fits | notes |")
    lines = [head, "|" + "---|" * 14]
    for r in results:
        if r["status"] != "compared":
            continue
        flag = " (cal)" if r["calibration"] else ""
        lines.append(
            f"| {r['id']}{flag} | {r['category']} | {r['gpus']} | {r['layout']} | {r['metric']} | "
            f"{_fmt(r['predicted'])} | {_fmt(r['published'])} | {100 * r['error']:+.1f}% | "
            f"{100 * r['compute_frac']:.0f}% | {100 * r['recompute_frac']:.0f}% | {100 * r['comm_frac']:.0f}% | "
            f"{100 * r['bubble_frac']:.0f}% | {'yes' if r['fits_in_memory'] else 'NO'} | {len(r['notes'])} |")
    return "\n".join(lines)


def skipped_table(results: list[dict]) -> str:
    lines = ["| id | category | why not expressible |", "|---|---|---|"]
    for r in results:
        if r["status"] == "skipped":
            lines.append(f"| {r['id']} | {r['category']} | {r['kind']}: {r['reason']} |")
    return "\n".join(lines)


def summary_table(s: dict) -> str:
    lines = ["| category | rows | compared | MAPE | bias (mean signed error) |", "|---|---|---|---|---|"]

    def pct(v):
        return "–" if v is None else f"{v:.1f}%"

    def sgn(v):
        return "–" if v is None else f"{v:+.1f}%"
    for c, st in s["per_category"].items():
        lines.append(f"| {c} | {st['rows']} | {st['n']} | {pct(st['mape_pct'])} | {sgn(st['bias_pct'])} |")
    o, w = s["overall"], s["overall_without_calibration"]
    lines.append(f"| **all** | {s['rows']} | {o['n']} | **{pct(o['mape_pct'])}** | {sgn(o['bias_pct'])} |")
    lines.append(f"| all but the calibration rows | | {w['n']} | {pct(w['mape_pct'])} | {sgn(w['bias_pct'])} |")
    for m, st in s["by_metric"].items():
        lines.append(f"| rows compared on {m} | | {st['n']} | {pct(st['mape_pct'])} | {sgn(st['bias_pct'])} |")
    return "\n".join(lines)


def worst(results: list[dict], k: int = 5) -> list[dict]:
    done = [r for r in results if r["status"] == "compared"]
    return sorted(done, key=lambda r: -abs(r["error"]))[:k]


def _worst_md(results: list[dict]) -> str:
    out = []
    for r in worst(results):
        axes = ", ".join(f"{a} {v:.2f} s" for a, v in sorted(r["comm_by_axis_s"].items(), key=lambda kv: -kv[1]))
        out.append(f"* **{r['id']}** ({r['layout']}, {r['metric']}): predicted {_fmt(r['predicted'])} vs "
                   f"published {_fmt(r['published'])} ({100 * r['error']:+.1f}%). Step {r['step_time_s']:.2f} s: "
                   f"compute {100 * r['compute_frac']:.0f}%, recompute {100 * r['recompute_frac']:.0f}%, exposed "
                   f"comm {100 * r['comm_frac']:.0f}% ({axes or 'none'}), bubble {100 * r['bubble_frac']:.0f}%"
                   f"{'' if r['fits_in_memory'] else ', does NOT fit in memory'}. Notes: "
                   f"{'; '.join(r['notes']) or 'none'}.")
    return "\n".join(out)


def _notes_md(results: list[dict]) -> str:
    lines = ["| id | assumptions and caveats |", "|---|---|"]
    for r in results:
        if r["status"] == "compared" and r["notes"]:
            lines.append(f"| {r['id']} | {'; '.join(r['notes'])} |")
    return "\n".join(lines)


def report(results: list[dict], s: dict, seconds: float) -> str:
    rules = __doc__.split("Rules\n-----\n", 1)[1]
    tally = "\n".join(f"* {k}: {v}" for k, v in s["skip_reasons"].items())
    return ("# Held-out fidelity: parsim against published training runs\n\n"
            "Generated by `python benchmarks/fidelity_heldout.py --markdown reports/fidelity-heldout.md` "
            f"({s['rows']} rows of `benchmarks/data/heldout_runs.json`, {seconds:.0f} s). Error = (predicted - "
            "published) / published; + means parsim predicts the run faster than it was. Numbers move "
            "as the cost model changes: rerun, do not edit.\n\n"
            "## Summary\n\n" + summary_table(s) + "\n\n"
            f"{s['compared']} rows compared, {s['skipped']} not expressible; {s['not_fitting']} compared rows "
            "do not fit in memory in parsim although they ran.\n\n"
            "Not expressible, by reason:\n\n" + tally + "\n\n"
            "## Five worst rows\n\n" + _worst_md(results) + "\n\n"
            "## Rows\n\n"
            "compute / recompute / exposed comm / bubble: shares of parsim's predicted step "
            "(`breakdown_s`; the optimizer step is the remainder). (cal): a calibration row. "
            "notes: how many assumptions the row needed (listed below).\n\n"
            + table(results) + "\n\n"
            "## Not expressible\n\n" + skipped_table(results) + "\n\n"
            "## Assumptions per row\n\n" + _notes_md(results) + "\n\n"
            "## Rules\n" + rules)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--markdown", help="write the report to this Markdown file")
    ap.add_argument("--json", action="store_true", help="print rows and summary as JSON")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    results, s = run_all()
    seconds = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"rows": results, "summary": s}, indent=1, default=str))
    else:
        print(table(results))
        print()
        print(summary_table(s))
        print(f"\n{s['compared']} compared, {s['skipped']} not expressible ({seconds:.1f} s):")
        for k, v in s["skip_reasons"].items():
            print(f"  {v:3d}  {k}")
    if args.markdown:
        Path(args.markdown).write_text(report(results, s, seconds))


if __name__ == "__main__":
    main()
