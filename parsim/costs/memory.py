"""Memory per GPU: model states (ZeRO stages x optimizer x precision) and activations.

Model states follow ZeRO (Rajbhandari et al. 2019): with Psi parameters on a GPU and
mixed precision, weights take 2*Psi bytes, gradients 2*Psi and the optimizer K*Psi
(K = 12 for Adam: fp32 master weights, momentum, variance). ZeRO-1 divides the K term
by the data-parallel degree N, ZeRO-2 also the gradients, ZeRO-3 everything.

Activations follow Korthikanti et al. 2022 ("Reducing activation recomputation"),
generalised here to grouped-query attention and SwiGLU by counting the same tensors:
per token and layer, 16-bit activations and 1-byte dropout masks,

  replicated over TP unless sequence parallel:  2 layer-norm inputs (4h), the QKV and
      FC1 inputs (4h), two dropout masks (2h, when dropout is on)      -> 10h for GPT
  sharded over TP:  Q, K, V (2q + 4kv), attention output (2q), MLP: GeLU input and
      FC2 input (4f) or SwiGLU gate, up and product (6f)               -> 24h for GPT
  attention scores (standard attention only): softmax 2as, its dropout mask as and
      output 2as                                                         -> 5as
      (without dropout only the softmax output, 2as, is kept)

Element sizes scale with the training precision (``ActivationOptions.bytes_per_element``:
4 for fp32 training doubles every 16-bit term; masks stay 1 byte).

which reproduces s*b*h*(34 + 5as/h) and its TP/SP/selective forms exactly for GPT.
FlashAttention (the default) never materialises the scores, so the 5as term is gone.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.cluster.precision import PRECISION_TABLE
from parsim.model import ModelSpec

# Optimizer state bytes per parameter beyond weights and gradients (K in ZeRO's
# notation). Mixed precision keeps an fp32 master copy inside the optimizer state.
OPTIMIZER_STATE_BYTES_MIXED: dict[str, int] = {
    "sgd": 4,        # fp32 master weights
    "momentum": 8,   # master + momentum
    "adam": 12,      # master + m + v (ZeRO's K=12)
    "adamw": 12,
    "muon": 8,       # master + momentum (Muon keeps one buffer; orthogonalisation is transient)
    "adafactor": 4 + 1,  # master + factored second moment, ~1 byte/param amortised (documented estimate)
}
# Pure fp32 training: no master copy.
OPTIMIZER_STATE_BYTES_FP32: dict[str, int] = {
    "sgd": 0, "momentum": 4, "adam": 8, "adamw": 8, "muon": 4, "adafactor": 1,
}


@dataclass(frozen=True)
class ModelStates:
    """Bytes of model state on one GPU."""

    params: float
    """Weights (in the compute precision; ZeRO-3: only this rank's shard)."""
    grads: float
    """Gradients (ZeRO-2/3: only this rank's shard)."""
    optimizer: float
    """Optimizer state incl. fp32 master weights (ZeRO-1/2/3: only this rank's shard)."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


def state_bytes_per_param(optimizer: str, precision: str) -> tuple[int, int, int]:
    """(weight, gradient, optimizer) bytes per parameter."""
    w = PRECISION_TABLE[precision].weight_bytes  # fp8 training keeps bf16 weights/grads (Transformer Engine)
    table = OPTIMIZER_STATE_BYTES_FP32 if precision == "fp32" else OPTIMIZER_STATE_BYTES_MIXED
    return w, w, table[optimizer]


def model_state_bytes(n_params: float, dp: int, zero: int, optimizer: str = "adam",
                      precision: str = "bf16") -> ModelStates:
    """Per-GPU model states for ``n_params`` parameters held by this GPU before DP sharding."""
    w, g, k = state_bytes_per_param(optimizer, precision)
    p_w, p_g, p_k = n_params * w, n_params * g, n_params * k
    if zero >= 1:
        p_k /= dp
    if zero >= 2:
        p_g /= dp
    if zero >= 3:
        p_w /= dp
    return ModelStates(params=p_w, grads=p_g, optimizer=p_k)


@dataclass(frozen=True)
class ActivationOptions:
    """How activations are kept."""

    recompute: str = "none"
    """none | selective (attention core recomputed) | full (only each layer's input kept)."""
    flash_attention: bool = True
    """FlashAttention-style kernel: the s x s scores are never stored."""
    sequence_parallel: bool = False
    """Norm/dropout activations sharded over tp (Korthikanti et al. 2022)."""
    dropout: bool = True
    """Dropout masks (1 byte per element) are stored; Llama-style training runs without dropout."""
    bytes_per_element: int = 2
    """Bytes of one stored activation element: 2 for 16-bit training (Korthikanti's setting),
    4 for fp32 training (every 16-bit term doubles; 1-byte dropout masks stay 1 byte)."""


def _per_token_parts(spec: ModelSpec, seq_len: int, tp: int, opts: ActivationOptions,
                     layer_index: int | None, routed: bool = True) -> tuple[float, float, float]:
    """Bytes per token for one layer: (replicated-over-TP part, TP-sharded part, score part)."""
    from parsim.model import (
        is_moe_layer,  # local: keeps import graph one-way at module load
    )

    h = spec.d_model
    q = spec.n_heads * spec.head_dim_
    kv = spec.n_kv_heads * spec.head_dim_
    masks = 2 * h if opts.dropout else 0
    e = opts.bytes_per_element / 2  # the 16-bit terms below scale with the element size
    replicated = (4 * h + 4 * h) * e + masks
    if layer_index is not None and spec.is_moe and is_moe_layer(spec, layer_index):
        f = (spec.d_ff_expert or spec.d_ff)
        # each token visits top_k routed experts plus the shared ones
        ffn_mult = spec.top_k + spec.n_shared_experts
        if not routed:  # routed experts counted by the caller from the dispatched rows
            f, ffn_mult = spec.d_ff_shared_, spec.n_shared_experts
    else:
        f, ffn_mult = spec.d_ff, 1
    mlp = (6 * f if spec.ffn == "swiglu" else 4 * f) * ffn_mult
    sharded = (2 * q + 4 * kv + 2 * q + mlp) * e
    # softmax output 2as, plus with dropout its 1-byte mask (as) and its output (2as);
    # without dropout the softmax output is what the scores x V product keeps: 2as only
    per_score = (2.0 * e + (1.0 + 2.0 * e if opts.dropout else 0.0))
    scores = 0.0 if opts.flash_attention else per_score * spec.n_heads * seq_len
    return replicated, sharded, scores


def layer_activation_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int = 1,
                           opts: ActivationOptions = ActivationOptions(),
                           layer_index: int | None = None, routed_rows: float | None = None,
                           expert_tp: int | None = None) -> float:
    """Activation bytes one layer stashes for one microbatch until its backward.

    ``seq_len`` is the sequence length this rank holds (divide by cp before calling).
    MoE layers: by default each token counts top_k routed experts sharded over tp (the
    balanced mean). With ``routed_rows`` (the token-expert assignments this rank's experts
    compute, e.g. the busiest expert-parallel rank's) the routed part is
    :func:`moe_dispatched_activation_bytes` of those rows instead.
    """
    tokens = seq_len * microbatch
    if opts.recompute == "full":
        per_token = opts.bytes_per_element * spec.d_model / (tp if opts.sequence_parallel else 1)
        return tokens * per_token
    routed = routed_rows is None
    replicated, sharded, scores = _per_token_parts(spec, seq_len, tp, opts, layer_index, routed)
    if opts.recompute == "selective":
        scores = 0.0
    rep_div = tp if opts.sequence_parallel else 1
    out = tokens * (replicated / rep_div + sharded / tp + scores / tp)
    if not routed and layer_index is not None and spec.is_moe and _is_moe(spec, layer_index):
        out += moe_dispatched_activation_bytes(spec, routed_rows, expert_tp or tp, opts)
    return out


def _is_moe(spec: ModelSpec, layer_index: int) -> bool:
    from parsim.model import is_moe_layer
    return is_moe_layer(spec, layer_index)


def moe_dispatched_activation_bytes(spec: ModelSpec, rows: float, expert_tp: int = 1,
                                    opts: ActivationOptions = ActivationOptions()) -> float:
    """Bytes the routed experts of one rank stash for ``rows`` dispatched token-expert assignments.

    Per assignment: the permuted expert input (d) and the expert output kept for the
    weighted combine's backward (d), plus the expert FFN's own tensors on its
    d_ff_expert / expert_tp shard (gelu 2f: activation input and FC2 input; swiglu 3f:
    gate, up and their product), all 16-bit elements (Korthikanti's counting).
    """
    f = -(-spec.d_ff_expert_ // expert_tp)
    mlp = (3 * f if spec.ffn == "swiglu" else 2 * f)
    return rows * (2 * spec.d_model + mlp) * opts.bytes_per_element


def layer_recompute_transient_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int,
                                    opts: ActivationOptions, layer_index: int | None = None) -> float:
    """Extra bytes alive while one layer is recomputed and back-propagated (full recompute)."""
    if opts.recompute != "full":
        return 0.0
    none = ActivationOptions("none", opts.flash_attention, opts.sequence_parallel, opts.dropout,
                             opts.bytes_per_element)
    return layer_activation_bytes(spec, seq_len, microbatch, tp, none, layer_index)


def logits_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int) -> float:
    """The LM head's logits kept for the loss: fp32 upcast for a stable cross-entropy.

    Vocabulary-parallel over tp (Megatron); 4 bytes per logit.
    """
    return seq_len * microbatch * spec.vocab_size / tp * 4.0


def embedding_output_bytes(spec: ModelSpec, seq_len: int, microbatch: int, tp: int,
                           sequence_parallel: bool) -> float:
    """The embedding output (input of the first layer) kept on the first stage."""
    return 2.0 * seq_len * microbatch * spec.d_model / (tp if sequence_parallel else 1)
