"""The ``[moe]`` table: how tokens are routed to experts (typed, checked)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from parsim.cluster.kernels import EXPERT_GEMM_IMPLEMENTATIONS
from parsim.errors import ConfigError

ROUTINGS = ("balanced", "zipf", "lognormal", "histogram")
DISPATCHERS = ("alltoall", "deepep", "hybridep")
MAX_LOGNORMAL_SIGMA = 50.0
"""Largest ``lognormal_sigma``: exp of a N(0, sigma) draw stays finite in float64 up to ~700."""

DISPATCHER_SMS = {"deepep": 20, "hybridep": 24}
"""SMs the flex dispatchers' kernels hold while in flight, as Megatron-Core configures them by
default: ``moe_deepep_num_sms = 20`` (DeepEP's own ``Buffer.num_sms = 20``, deep_ep/buffer.py)
and ``moe_hybridep_num_sms = 24`` (megatron/core/transformer/transformer_config.py). NCCL's
all-to-all holds the profile's ``collective_ctas`` instead (parsim.cluster.contention)."""


@dataclass(frozen=True)
class MoEConfig:
    """The scenario's ``[moe]`` table: how tokens are routed and experts are sharded."""

    routing: str = "balanced"
    """balanced | zipf | lognormal | histogram: how the routed assignments spread over experts."""
    zipf_s: float = 1.0
    """Zipf exponent: the expert of popularity rank r gets a share proportional to r^-s."""
    lognormal_sigma: float = 0.5
    """Sigma of the log-normal per-expert load (exp(N(0, sigma)), normalised)."""
    histogram: tuple[float, ...] | tuple[tuple[float, ...], ...] | None = None
    """Measured tokens (or any weights) per expert, n_experts values, normalised to shares; or one
    such list per MoE layer, in layer order (what Megatron-Core's per-layer tokens-per-expert
    logging records): each MoE layer is then costed with its own routing."""
    seed: int = 0
    """Seed of the permutation / draw of the zipf and lognormal loads."""
    expert_tp: int | None = None
    """Tensor-parallel degree of the experts; default the dense tp. Must divide tp."""
    drop_tokens: bool = True
    """Drop assignments over an expert's capacity (capacity_factor); false = dropless."""
    dispatcher: str = "alltoall"
    """How tokens reach their experts: ``alltoall`` (NCCL all-to-all, Megatron-Core's
    ``moe_token_dispatcher_type = "alltoall"``) or ``deepep`` (DeepEP normal kernels, Megatron's
    ``flex`` dispatcher: a token crosses the network once per destination node, then fans out
    over NVLink) or ``hybridep`` (NVIDIA's HybridEP behind the same ``flex`` dispatcher: the same
    node-deduplicated RDMA then NVLink fan-out, costed as ``deepep``; its own SM count)."""
    dispatcher_sms: int | None = None
    """SMs the dispatch/combine kernels hold while they run (slowing the compute they overlap
    with ``overlap.ep_comm``); None: ``DISPATCHER_SMS`` for deepep/hybridep (Megatron-Core's
    defaults), the profile's NCCL ``collective_ctas`` for alltoall. Megatron-Core's
    ``moe_deepep_num_sms`` / ``moe_hybridep_num_sms``."""
    pad_to_capacity: bool = False
    """With drop_tokens, every expert computes a full capacity of rows (padded; GShard/Switch
    static shapes, Megatron-Core ``moe_pad_expert_input_to_capacity``); false: its kept rows."""
    expert_gemm: str | None = None
    """How the local experts' GEMMs run (``parsim.cluster.kernels.EXPERT_GEMM_IMPLEMENTATIONS``):
    ``grouped`` (one grouped kernel: CUTLASS, ``torch._grouped_mm``), ``multi_stream`` (one
    cuBLAS GEMM per expert over four streams: Transformer Engine's ``GroupedLinear``) or ``loop``
    (one GEMM per expert on one stream). None: the framework's (:func:`default_expert_gemm`)."""


EXPERT_GEMM_DEFAULTS = {"megatron": "multi_stream", "deepspeed": "loop"}
"""``parallel.framework`` -> how it runs the experts' GEMMs when ``moe.expert_gemm`` is not given.
Megatron-Core builds its experts from Transformer Engine (``TEGroupedMLP`` on
``TEColumnParallelGroupedLinear``: megatron/core/extensions/transformer_engine_spec_provider.py),
whose grouped GEMM is per-expert cuBLAS calls on four streams unless NVTE_USE_CUTLASS_GROUPED_GEMM
is set (Hopper only; transformer_engine/common/gemm/cublaslt_gemm.cu ``nvte_multi_tensor_gemm``;
no Megatron-Bridge recipe sets it). DeepSpeed-MoE loops over its experts (deepspeed/moe/experts.py).
Others (FSDP2/torchtitan's ``torch._grouped_mm``, the generic ``zero``): one grouped kernel."""


def default_expert_gemm(cfg: MoEConfig, framework: str) -> str:
    """``cfg.expert_gemm`` if given, else the framework's default (:data:`EXPERT_GEMM_DEFAULTS`)."""
    return cfg.expert_gemm or EXPERT_GEMM_DEFAULTS.get(framework, "grouped")


def _counts(h) -> bool:
    """A list of non-negative finite numbers, not all zero."""
    return (isinstance(h, list) and bool(h)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0
                    for x in h)
            and 0 < sum(h) < math.inf)  # counts summing past a float (1e308 each) overflow the shares


def layer_histograms(cfg: MoEConfig) -> tuple[tuple[float, ...], ...] | None:
    """One histogram per MoE layer when the scenario states them so, else None."""
    h = cfg.histogram
    return h if h and isinstance(h[0], tuple) else None


def for_moe_layer(cfg: MoEConfig, j: int) -> MoEConfig:
    """The routing of MoE layer ``j`` (0-based among the MoE layers) as a one-histogram config."""
    rows = layer_histograms(cfg)
    return cfg if rows is None else replace(cfg, routing="histogram", histogram=rows[j])


def moe_from_table(t: dict, file: str) -> MoEConfig:
    """The ``[moe]`` table -> MoEConfig (strict keys and types)."""
    p = "moe."
    if not isinstance(t, dict):
        raise ConfigError(file, "moe", "expected a table")
    names = {f.name for f in fields(MoEConfig)}
    for k in t:
        if k not in names:
            raise ConfigError(file, p + k, f"unknown key (known: {', '.join(sorted(names))})")
    kw = dict(t)
    if kw.get("dispatcher", "alltoall") not in DISPATCHERS:
        raise ConfigError(file, p + "dispatcher", f"{kw['dispatcher']!r} is not one of {', '.join(DISPATCHERS)}")
    if "expert_gemm" in kw and kw["expert_gemm"] not in EXPERT_GEMM_IMPLEMENTATIONS:
        raise ConfigError(file, p + "expert_gemm",
                          f"{kw['expert_gemm']!r} is not one of {', '.join(EXPERT_GEMM_IMPLEMENTATIONS)}")
    if kw.get("routing", "balanced") not in ROUTINGS:
        raise ConfigError(file, p + "routing", f"{kw['routing']!r} is not one of {', '.join(ROUTINGS)}")
    for key in ("zipf_s", "lognormal_sigma"):
        if key in kw:
            v = kw[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(file, p + key, f"expected a non-negative finite number, got {v!r}")
            if key == "lognormal_sigma" and v > MAX_LOGNORMAL_SIGMA:
                raise ConfigError(file, p + key, f"at most {MAX_LOGNORMAL_SIGMA:g} (exp(N(0, sigma)) loads overflow "
                                                 f"beyond; sigma 3 already puts most tokens on one expert), got {v!r}")
            kw[key] = float(v)
    for key in ("seed", "expert_tp", "dispatcher_sms"):
        if key in kw:
            v = kw[key]
            low = 1 if key == "expert_tp" else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(file, p + key, f"expected a {'positive' if low else 'non-negative'} integer, got {v!r}")
    for key in ("drop_tokens", "pad_to_capacity"):
        if key in kw and not isinstance(kw[key], bool):
            raise ConfigError(file, p + key, f"expected true/false, got {kw[key]!r}")
    if "histogram" in kw:
        h = kw["histogram"]
        if isinstance(h, list) and h and all(isinstance(row, list) for row in h):
            for j, row in enumerate(h):
                if not _counts(row):
                    raise ConfigError(file, f"{p}histogram[{j}]", "expected a list of non-negative numbers (tokens "
                                      "per expert of that MoE layer), not all zero")
            kw["histogram"] = tuple(tuple(float(x) for x in row) for row in h)
        elif _counts(h):
            kw["histogram"] = tuple(float(x) for x in h)
        else:
            raise ConfigError(file, p + "histogram", "expected a list of non-negative numbers (tokens per expert), "
                              "not all zero, or one such list per MoE layer")
    cfg = MoEConfig(**kw)
    if cfg.pad_to_capacity and not cfg.drop_tokens:
        raise ConfigError(file, p + "pad_to_capacity", "needs drop_tokens = true (a dropless expert has no capacity)")
    if cfg.routing == "histogram" and cfg.histogram is None:
        raise ConfigError(file, p + "histogram", "missing (routing = \"histogram\" needs one value per expert)")
    return cfg


def check_moe(cfg: MoEConfig, model, par, file: str) -> None:
    """Rules that need the model and the parallel degrees (ConfigError naming the key)."""
    etp = cfg.expert_tp or par.tp
    if par.tp % etp:
        raise ConfigError(file, "moe.expert_tp", f"expert_tp={etp} must divide tp={par.tp}")
    if not model.is_moe:
        return
    g = par.ep * (par.tp // etp)
    if model.n_experts % g:
        raise ConfigError(file, "parallel.ep", f"{model.n_experts} experts do not divide over the expert-parallel "
                          f"group of ep*tp/expert_tp = {par.ep}*{par.tp}/{etp} = {g} ranks")
    rows = layer_histograms(cfg)
    if rows is not None:
        if len(rows) != model.n_moe_layers:
            raise ConfigError(file, "moe.histogram", f"has {len(rows)} per-layer lists but the model has "
                              f"{model.n_moe_layers} MoE layers")
        bad = next((j for j, row in enumerate(rows) if len(row) != model.n_experts), None)
        if bad is not None:
            raise ConfigError(file, f"moe.histogram[{bad}]", f"has {len(rows[bad])} values but the model has "
                              f"{model.n_experts} experts")
    elif cfg.histogram is not None and len(cfg.histogram) != model.n_experts:
        raise ConfigError(file, "moe.histogram", f"has {len(cfg.histogram)} values but the model has "
                          f"{model.n_experts} experts")
