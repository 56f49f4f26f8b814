"""Memory-bound work of one transformer block as the frameworks run it: bytes and kernel counts.

Everything here moves data through HBM and does almost no arithmetic, so its time is
``bytes / (memory_bandwidth * memory_efficiency)`` plus a launch overhead per kernel. What a
framework launches differs, so each op is counted per setting (``training.fused_kernels``):

* fused (Megatron-Core with Transformer Engine / Apex, the default): one kernel per op --
  norm (TE ``LayerNormLinear`` / Apex ``FusedRMSNorm``: read x, write y), rotary (``fused_apply_rotary_pos_emb``:
  read + write q and k), bias-activation (``bias_gelu_impl`` / ``bias_swiglu_impl``: read the FC1
  output, write the activation), bias-dropout-add (``bias_dropout_add_fused_train``: read the
  branch and the residual, write the sum, plus a 1-byte mask with dropout);
* eager (plain PyTorch modules, Hugging Face ``modeling_llama``/``modeling_gpt2``): op by op.
  ``LlamaRMSNorm.forward``: ``to(float32)``, ``pow(2)``, ``mean``, ``+ eps``, ``rsqrt``, ``*``,
  ``to(dtype)``, ``weight *`` -- 8 kernels, 36 bytes per bf16 element; ``nn.LayerNorm`` is one
  native kernel; ``apply_rotary_pos_emb``: ``q * cos``, ``rotate_half`` (a negation and a
  ``cat``), ``* sin``, ``+`` -- 5 kernels and 10 element passes per tensor; SwiGLU ``act(gate) *
  up``: 2 kernels, 5 passes of f; GeLU 1 kernel; residual ``+`` and ``dropout`` separate kernels.

The backward of each op reads what its forward read plus the incoming gradient and writes the
outgoing one: twice the forward's bytes and kernels (autograd's rule for these pointwise ops,
which the fused backward kernels keep).

FP8 (``training.precision = "fp8"``, Transformer Engine): the linear layers' GEMMs take FP8
operands, so each linear's input (forward) and output gradient (backward) is cast: read the
bf16 tensor, write an FP8 row-wise copy (for this GEMM) and an FP8 column-wise (transposed)
copy (for the weight-gradient GEMM) -- TE's fused ``cast_transpose``. Per recipe:
``delayed`` (the amax is taken inside the cast, scales from history: 1 kernel); ``current``
(``Float8CurrentScaling``: an amax pass reads the tensor first, then the cast: 2 kernels);
``mxfp8`` (Blackwell ``MXFP8BlockScaling``: one 8-bit scale per 32 elements written beside each
copy, 1 kernel); ``blockwise`` (``Float8BlockScaling``, DeepSeek-V3's 1x128 / 128x128: one fp32
scale per 128 elements beside each copy, 1 kernel); ``rowwise`` (torchao.float8's ``ROWWISE``
recipe, torchtitan's ``recipe_name = "rowwise"``: one fp32 scale per row along the contraction
dimension, so a tensor used by two GEMMs that contract different dimensions is reduced and cast
twice, once per axis -- see :func:`rowwise_cast_work`); ``nvfp4`` (Blackwell ``NVFP4BlockScaling``,
Megatron ``--fp4-format e2m1 --fp4-recipe nvfp4``: 4-bit E2M1 elements with one E4M3 scale per 16 and
a per-tensor FP32 scale from the tensor's amax; the GEMM takes TN layouts only, so both copies
always exist; the column-wise copy of inputs and gradients, the weight gradient's operands, goes
through a 16x16 random Hadamard transform first, gradients round stochastically. TE's
``NVFP4Quantizer::quantize_impl`` runs it as two kernels where the shape allows the fused path:
``nvte_hadamard_transform_amax`` (the amax before and after the transform, one read) and
``nvte_quantize_with_hadamard_transform`` (both copies from one read) -- as current scaling, two
reads and two kernels, writing 2 x 9/16 bytes an element). The attention core and the LM head stay BF16
(TE recipes keep ``DotProductAttention`` and the output layer out of ``fp8_autocast``).
FP8 weight casts happen once per optimizer step under Megatron (``is_first_microbatch``
caching) and are not counted per microbatch here.
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.cluster.kernels import sm_clock_hz
from parsim.model import ModelSpec, block_kind

FP8_RECIPES = ("delayed", "current", "mxfp8", "blockwise", "rowwise", "nvfp4")
"""Transformer Engine's low-precision recipes (DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling,
Float8BlockScaling, NVFP4BlockScaling -- the last one 4-bit, run by TE's FP8 autocast like the others)
and torchao.float8's rowwise recipe (torchtitan ``recipe_name = "rowwise"``): ``training.fp8_recipe``."""
SCALE_BYTES_PER_ELEMENT = {"delayed": 0.0, "current": 0.0, "mxfp8": 1.0 / 32, "blockwise": 4.0 / 128,
                           "rowwise": 0.0, "nvfp4": 1.0 / 16}
"""Scale bytes written per low-precision element (MX: one E8M0 per 32, OCP MX spec; blockwise: fp32
per 128; rowwise: one fp32 per row of K >= 1,024 elements, under 0.4%, not counted; NVFP4: one E4M3
per 16)."""
ELEMENT_BYTES = {"nvfp4": 0.5}
"""Bytes of one quantized element where it is not one (NVFP4's E2M1: two to a byte)."""
CAST_KERNELS = {"delayed": 1, "current": 2, "mxfp8": 1, "blockwise": 1, "rowwise": 2, "nvfp4": 2}
"""Kernels per cast (current scaling, rowwise and NVFP4: an amax reduction, then the cast)."""
AMAX_PASS = ("current", "nvfp4")
"""Recipes whose cast reads the 16-bit tensor twice: a per-tensor amax pass, then the cast (rowwise's
per-row amax is :func:`rowwise_cast_work`'s own)."""


@dataclass(frozen=True)
class MemoryWork:
    """Memory-bound work of one pass of one block on one GPU."""

    bytes: float
    """HBM bytes read + written."""
    kernels: int
    """Kernel launches."""
    norm_bytes: float = 0.0
    """Of ``bytes``, those eager RMSNorm chains move (at ``Device.eager_norm_efficiency``)."""
    rotary_bytes: float = 0.0
    """Of ``bytes``, those eager rotary chains move (at ``Device.eager_rotary_efficiency``)."""
    conv_bytes: float = 0.0
    """Of ``bytes``, those a causal depthwise convolution moves (Mamba-2's, Gated DeltaNet's): at the
    slower of the streaming rate and the kernel's own (:data:`CONV_BYTES_PER_CLOCK_PER_SM`)."""

    def __add__(self, other: "MemoryWork") -> "MemoryWork":
        return MemoryWork(self.bytes + other.bytes, self.kernels + other.kernels,
                          self.norm_bytes + other.norm_bytes, self.rotary_bytes + other.rotary_bytes,
                          self.conv_bytes + other.conv_bytes)

    def scaled(self, k: float) -> "MemoryWork":
        """k times the work (bytes and kernels; a backward is ``scaled(2)``)."""
        return MemoryWork(self.bytes * k, int(round(self.kernels * k)), self.norm_bytes * k, self.rotary_bytes * k,
                          self.conv_bytes * k)

    def scaled_bytes(self, k: float) -> "MemoryWork":
        """The same kernels over k times the bytes (per-token work -> a microbatch)."""
        return MemoryWork(self.bytes * k, self.kernels, self.norm_bytes * k, self.rotary_bytes * k,
                          self.conv_bytes * k)


CONV_BYTES_PER_CLOCK_PER_SM = 9.73
"""Bytes the causal depthwise convolution kernel (Dao-AILab's ``causal_conv1d_fn``, which
Megatron-Core's MambaMixer and SGLang call; flash-linear-attention's Triton one for Gated DeltaNet is
costed alike) moves per SM per clock: it does not reach HBM's rate -- 2.4 TB/s on an H100, 2.9 on a
B200, whatever their bandwidth -- but keeps about the same rate per SM and clock on both. The fit of
``benchmarks/fit_causal_conv.py`` on aiconfigurator's measured H100 times
(``benchmarks/data/causal_conv1d_times.csv``: 82 shapes, 0.8%); held out, the B200's 82 (9.9%, the
model 10% slow; 54.9% at the streaming rate alone) and the GB200's 82 (1.8%)."""


def conv_rate(dev) -> float | None:
    """Bytes/s of the causal-convolution kernel on ``dev``: its SMs at the kernel models' clock
    (:func:`parsim.cluster.kernels.sm_clock_hz`); None without kernel facts (the streaming rate then)."""
    if dev.kernels is None:
        return None
    return CONV_BYTES_PER_CLOCK_PER_SM * dev.kernels.sm_count * sm_clock_hz(dev)


def work_time(dev, w: MemoryWork) -> float:
    """Seconds of ``w``'s kernels on ``dev`` (launches aside): its bytes at the layer kernels' rate
    (``layer_memory_efficiency``, a copy's ``memory_efficiency`` where the profile states none), the
    eager norm and rotary chains' at their own measured rates where the profile gives them
    (``eager_norm_efficiency``, ``eager_rotary_efficiency``), a causal convolution's at the slower of
    the streaming rate and its kernel's (:func:`conv_rate`)."""
    t = dev.layer_memory_time(max(0.0, w.bytes - w.norm_bytes - w.rotary_bytes - w.conv_bytes))
    for part, eff in ((w.norm_bytes, dev.eager_norm_efficiency), (w.rotary_bytes, dev.eager_rotary_efficiency)):
        if part:
            t += part / (dev.memory_bandwidth * eff) if eff is not None else dev.layer_memory_time(part)
    if w.conv_bytes:
        rate = conv_rate(dev)
        t += max(dev.memory_time(w.conv_bytes), w.conv_bytes / rate if rate else 0.0)
    return t


def _local(spec: ModelSpec, tp: int, moe: bool) -> tuple[float, float, float, float]:
    """(q width, k width, FFN width f, FC1 output width) per token on one TP rank (``moe``: a
    routed-expert block, its top-k experts and shared experts)."""
    rope_dim = spec.qk_rope_head_dim if spec.is_mla else spec.head_dim_
    kv_heads = 1 if spec.is_mla else spec.n_kv_heads
    q = spec.n_heads * rope_dim / tp
    k = kv_heads * rope_dim / max(1, tp if kv_heads >= tp else 1)
    if moe:
        f = (spec.top_k * spec.d_ff_expert_ + spec.n_shared_experts * spec.d_ff_shared_) / tp
    else:
        f = spec.d_ff / tp
    fc1 = 2 * f if spec.ffn == "swiglu" else f
    return q, k, f, fc1


def forward_pieces(spec: ModelSpec, tokens: int, tp: int, sp: bool, act_bytes: float, fused: bool,
                   dropout: bool, moe: bool = False) -> dict[str, MemoryWork]:
    """One block's forward memory-bound work on one GPU by op: ``norm`` (one of its norms),
    ``rotary``, ``activation``, ``residual`` (both residual adds, with the fused dropout) and
    ``dropout`` (eager only).

    ``act_bytes``: bytes per activation element (2 for bf16). Norms and residuals act on the
    full hidden size, split over tp only with sequence parallelism.
    """
    d = spec.d_model / (tp if sp else 1)
    q, k, f, fc1 = _local(spec, tp, moe)
    a = act_bytes
    rms = spec.norm == "rmsnorm"
    rope = spec.position == "rope"
    swiglu = spec.ffn == "swiglu"
    mask = 1.0 if dropout else 0.0
    none = MemoryWork(0.0, 0)
    if fused:
        pieces = {
            "norm": MemoryWork(2 * d * a, 1),                        # read x, write y
            "rotary": MemoryWork(2 * (q + k) * a, 1) if rope else none,
            "activation": MemoryWork((fc1 + f) * a, 1),              # read FC1 out, write activation
            "residual": MemoryWork(2 * (3 * d * a + mask * d), 2),  # bias-dropout-add: r 2d, w d (+mask)
            "dropout": none,
        }
    else:
        if rms:  # LlamaRMSNorm, per element: to fp32 (r a w 4), pow (r4 w4), mean (r4), mul (r4 w4), to (r4 w a), weight* (r a w a)
            nb = d * ((a + 4) + 8 + 4 + 8 + (4 + a) + 2 * a)
            norm = MemoryWork(nb, 8, norm_bytes=nb)
        else:    # nn.LayerNorm: one native kernel
            norm = MemoryWork(2 * d * a, 1)
        pieces = {
            "norm": norm,
            "rotary": MemoryWork(10 * (q + k) * a, 10, rotary_bytes=10 * (q + k) * a) if rope else none,
            "activation": MemoryWork(5 * f * a, 2) if swiglu else MemoryWork(2 * f * a, 1),
            "residual": MemoryWork(2 * 3 * d * a, 2),
            "dropout": MemoryWork(2 * (2 * d * a + d), 2) if dropout else none,
        }
    if spec.mamba_inner:
        inner = spec.mamba_inner / tp
        conv = 2 * spec.mamba_conv_channels / tp * a
        pieces["mamba"] = MemoryWork(conv + 3 * inner * a, 2, conv_bytes=conv)
    if spec.gdn_value_heads:  # the convolution, the q and k L2 norms, the gates, the gated norm
        conv = 2 * spec.gdn_conv_channels / tp * a
        pieces["gdn"] = MemoryWork(conv + (4 * spec.gdn_key_width + 3 * spec.gdn_value_width) / tp * a, 5,
                                   conv_bytes=conv)
    if spec.attn_output_gate:  # sigmoid(gate) * attention output: read both, write one
        pieces["rotary"] = pieces["rotary"] + MemoryWork(3 * spec.n_heads * spec.head_dim_ / tp * a, 1)
    return {name: w.scaled_bytes(tokens) for name, w in pieces.items()}


HYBRID_PIECES = {"M": ("norm", "mamba"), "G": ("norm", "gdn"), "*": ("norm", "rotary"), "-": ("norm", "activation"),
                 "E": ("norm", "activation")}
"""The memory-bound ops of each hybrid layer beside its one residual add (and dropout): a Mamba-2
layer's pre-norm (fused into its input projection), its causal convolution over x, B and C with the
SiLU (``causal_conv1d``: read and write those channels) and its gated RMSNorm (``RMSNormGated``:
read y and z, write the output); the scan itself is :func:`parsim.costs.compute.mamba_scan_times`'. A
Gated DeltaNet layer's: its pre-norm, the causal convolution over q, k and v with the SiLU, the L2 norms
of q and k, the gates (beta's sigmoid, alpha's softplus) and the gated RMSNorm over the output and z
(the delta rule itself: :func:`parsim.costs.compute.gdn_delta_times`)."""


LEGACY_LAYER_NORM_TIME = (0.0751 / 0.0535, 0.1762 / 0.0866)
"""(forward, backward) time of Apex's ``FusedLayerNorm`` kernels over the persistent ``FastLayerNorm`` on
the same tensor, the norm Megatron-LM ran before a2fdcdf061 (2021-10-08) and with
``--no-persist-layer-norm`` after: apex #1037 (2021-01-27, the pull request that added FastLayerNorm) timed
both on a GA100 over B = 32 x S = 512 tokens of hidden 1024 in fp16 -- 0.0751 against 0.0535 ms forward,
0.1762 against 0.0866 ms backward. Its authors put the gap in the passes over HBM: the new backward
"reads the large input tensors dout and x only once", the new forward keeps its input in registers
(vectorized 16-byte loads); the earlier kernels read them again. parsim charges the persistent kernel's
bytes (the model's ``forward_pieces`` norm: read x, write y; twice that backward) and, for the earlier
one, these ratios of them: the extra passes as extra bytes at the same rate."""


def legacy_layer_norm_work(spec: ModelSpec, tokens: int, tp: int, sp: bool,
                           act_bytes: float) -> tuple[MemoryWork, MemoryWork]:
    """(forward, backward) HBM passes Apex's earlier ``FusedLayerNorm`` makes beyond the persistent
    kernel's over one block's norms (:data:`LEGACY_LAYER_NORM_TIME`): no extra launches."""
    norm = forward_pieces(spec, tokens, tp, sp, act_bytes, True, False)["norm"]
    count = spec.block_norms if block_kind(spec) == "T" else 1
    fwd = norm.bytes * count
    return (MemoryWork(fwd * (LEGACY_LAYER_NORM_TIME[0] - 1.0), 0),
            MemoryWork(2 * fwd * (LEGACY_LAYER_NORM_TIME[1] - 1.0), 0))


def block_forward_work(spec: ModelSpec, tokens: int, tp: int, sp: bool, act_bytes: float,
                       fused: bool, dropout: bool, moe: bool = False) -> MemoryWork:
    """Norms, rotary, activation, residual adds (and dropout) of one block's forward on one GPU:
    :func:`forward_pieces`, the norm once per ``block_norms`` (usually twice)."""
    p = forward_pieces(spec, tokens, tp, sp, act_bytes, fused, dropout, moe)
    kind = block_kind(spec)
    if kind != "T":  # one sub-layer: its own ops, one residual add (and one dropout)
        first, second = (p[name] for name in HYBRID_PIECES[kind])
        return first + second + p["residual"].scaled(0.5) + p["dropout"].scaled(0.5)
    return p["norm"].scaled(spec.block_norms) + p["rotary"] + p["activation"] + p["residual"] + p["dropout"]


def non_tn_fp8_gemms(device) -> bool:
    """The GPU's FP8 GEMMs take any operand layout, not only TN: Transformer Engine's
    ``is_non_tn_fp8_gemm_supported()`` (compute capability 10.x-11.x and 13+, i.e. Blackwell's
    datacenter parts, whose tcgen05 MMA is the profiles' ``mma_style = "tile"``; Hopper's wgmma
    and consumer Blackwell's warp MMA take FP8 operands K-major only)."""
    kf = device.kernels
    return kf is not None and kf.mma_style == "tile"


def fp8_copy_bytes(recipe: str, non_tn: bool) -> float:
    """Bytes per element of the FP8 copies Transformer Engine keeps of one tensor for its GEMMs:
    the row-wise copy, plus a column-wise one for the GEMM contracting the other dimension.
    Per-tensor scaling (delayed, current) makes that second copy a transpose, which TE neither
    builds nor needs where FP8 GEMMs take non-TN layouts (``Float8Tensor.update_usage``: one
    copy); MXFP8 and blockwise scales run along one dimension, so both copies always exist,
    each with its scales."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"unknown fp8 recipe {recipe!r} (known: {', '.join(FP8_RECIPES)})")
    if recipe in ("delayed", "current"):
        return 1.0 if non_tn else 2.0
    # rowwise: one copy per scaling axis; NVFP4: TN-only GEMMs, and the column-wise copy differs
    return 2 * (ELEMENT_BYTES.get(recipe, 1.0) + SCALE_BYTES_PER_ELEMENT[recipe])


def saved_input_bytes(recipe: str | None) -> float:
    """Bytes per element of a linear layer's input kept for its weight gradient under ``recipe``
    (``parsim.costs.memory``): the FP8 copy's byte (MXFP8's scales neglected there), NVFP4's
    column-wise copy with its scales (9/16)."""
    if recipe == "nvfp4":
        return ELEMENT_BYTES["nvfp4"] + SCALE_BYTES_PER_ELEMENT["nvfp4"]
    return 1.0


def fp8_weight_copy_bytes(recipe: str, non_tn: bool) -> float:
    """Bytes per parameter of the low-precision weight copies (:func:`fp8_copy_bytes`), except
    NVFP4's weights, whose scales cover 16x16 blocks (TE's default 2D weight quantization: one
    E4M3 scale per 256 elements) so that both copies agree."""
    if recipe == "nvfp4":
        return 2 * (ELEMENT_BYTES["nvfp4"] + 1.0 / 256)
    return fp8_copy_bytes(recipe, non_tn)


def fp8_cast_work(spec: ModelSpec, tokens_local: int, tp: int, recipe: str, act_bytes: float,
                  moe: bool = False, non_tn: bool = False) -> tuple[MemoryWork, MemoryWork]:
    """(forward, backward) FP8 cast work of one block's linear layers on one GPU, per token
    times ``tokens_local``: forward casts each linear's input (QKV and FC1 see the all-gathered
    d; proj sees q-width, FC2 sees f), backward each linear's output gradient (QKV q+2kv, proj
    d, FC1 its output, FC2 d). Each cast reads the bf16 tensor (twice with current scaling)
    and writes the FP8 copies :func:`fp8_copy_bytes` counts (``non_tn``: the GPU's FP8 GEMMs
    take any layout)."""
    if recipe == "rowwise":
        return rowwise_cast_work(spec, tokens_local, tp, act_bytes, moe)
    writes = fp8_copy_bytes(recipe, non_tn)
    d = spec.d_model
    hd = spec.head_dim_
    qw = spec.n_heads * hd / tp
    kvw = spec.n_kv_heads * hd / max(1, tp if spec.n_kv_heads >= tp else 1)
    _, _, f, fc1 = _local(spec, tp, moe)
    reads = act_bytes * (2 if recipe in AMAX_PASS else 1)
    per = reads + writes
    n = CAST_KERNELS[recipe]
    kind = block_kind(spec)
    if kind != "T":  # one sub-layer's two linear layers: (input width, output gradient width) each
        linears = _hybrid_linears(spec, tp, kind, qw, kvw, f, fc1)
        fwd_elems = sum(k for k, _ in linears)
        bwd_elems = sum(nn for _, nn in linears)
        return (MemoryWork(tokens_local * fwd_elems * per, 2 * n), MemoryWork(tokens_local * bwd_elems * per, 2 * n))
    fwd_elems = d + qw + d + f
    bwd_elems = (qw + 2 * kvw) + d + fc1 + d
    return (MemoryWork(tokens_local * fwd_elems * per, 4 * n), MemoryWork(tokens_local * bwd_elems * per, 4 * n))


def _hybrid_linears(spec: ModelSpec, tp: int, kind: str, qw: float, kvw: float, f: float,
                    fc1: float) -> tuple[tuple[float, float], ...]:
    """(input width K, output width N) on this TP rank of a hybrid layer's two linear layers: a
    Mamba-2 mixer's input and output projections, attention's QKV and projection, the FFN's FC1
    and FC2."""
    d = spec.d_model
    if kind == "M":
        return ((d, spec.mamba_in_proj_width / tp), (spec.mamba_inner / tp, d))
    if kind == "G":
        return ((d, spec.gdn_in_proj_width / tp), (spec.gdn_value_width / tp, d))
    if kind == "*":
        return ((d, qw * (2 if spec.attn_output_gate else 1) + 2 * kvw), (qw, d))
    return ((d, fc1), (f, d))


def rowwise_cast_work(spec: ModelSpec, tokens_local: int, tp: int, act_bytes: float,
                      moe: bool = False) -> tuple[MemoryWork, MemoryWork]:
    """(forward, backward) memory-bound work torchao.float8's rowwise recipe adds to one block's
    four linear layers on one GPU (torchao ``float8_linear.matmul_with_hp_or_float8_args``).

    Each GEMM's operands are scaled per row along the dimension it contracts, so every tensor is
    reduced (amax) and cast once per GEMM that uses it, each cast reading the 16-bit tensor twice
    (the row amax, then the cast) and writing one FP8 copy (``2a + 1`` bytes an element, 2 kernels):

    * forward ``y = x @ W^T`` (contracts K): the input x and the weight W along K;
    * backward ``dx = dy @ W`` (contracts N): dy and W along N; ``dW = dy^T @ x`` (contracts the
      tokens): dy and x along the tokens. The weight is cast every microbatch (no cached FP8
      copy: the rowwise recipe has no FP8 all-gather and no scale precompute).
    * The two backward GEMMs run without fast accumulation (the recipe's default
      ``Float8LinearConfig`` sets ``use_fast_accum`` for the output GEMM only), and for a rowwise
      GEMM without it torchao calls the per-tensor cuBLAS kernel with unit scales and then
      multiplies the output by the scales (``addmm_float8_unwrapped``: ``output *= post_inverse_scale``,
      pytorch/ao#1325: the rowwise CUTLASS kernel without fast accumulation was too slow), one
      more read and write of dx (tokens x K) and of dW (N x K).

    The GEMMs themselves run at the FP8 rate: the rowwise CUTLASS kernel with fast accumulation is
    within 2% of cuBLAS's per-tensor one at 4176x12288x4096 on H100 (pytorch/FBGEMM#2764: 317.5 vs
    310.3 us) and "within 90-100% of tensor-wise efficiency" over a shape sweep (pytorch/pytorch#147971).
    In an MoE block (``moe``) the FFN's weights counted are the top-k experts' a token passes
    through, not the rank's local experts (torchao's grouped-GEMM FP8 for MoE is a prototype, not
    modelled apart).
    """
    a = act_bytes
    cast = 2 * a + 1
    d = spec.d_model
    q, k, f, fc1 = _local(spec, tp, moe)
    # (input width K, output width N) of QKV, proj, FC1, FC2 on this TP rank
    linears = ((d, q + 2 * k), (q, d), (d, fc1), (f, d))
    if block_kind(spec) != "T":
        linears = _hybrid_linears(spec, tp, block_kind(spec), q, k, f, fc1)
    x_elems = tokens_local * sum(kk for kk, _ in linears)
    dy_elems = tokens_local * sum(nn for _, nn in linears)
    w_elems = sum(kk * nn for kk, nn in linears)
    fwd = MemoryWork((x_elems + w_elems) * cast, 2 * 2 * len(linears))
    bwd = MemoryWork((2 * dy_elems + x_elems + w_elems) * cast + (x_elems + w_elems) * 2 * a,
                     (4 * 2 + 2) * len(linears))
    return fwd, bwd


def default_fp8_recipe(peak_flops: dict) -> str:
    """Transformer Engine's default on this device: MXFP8 where the GPU has block-scaled FP8
    GEMMs (a ``mxfp8`` peak: Blackwell), per-tensor current scaling otherwise (Hopper)."""
    return "mxfp8" if "mxfp8" in peak_flops else "current"


def fp8_gemm_precision(recipe: str, peak_flops: dict) -> str:
    """Precision the linear GEMMs run at under ``recipe`` (MXFP8 and NVFP4 on the block-scaled path)."""
    if recipe in ("mxfp8", "nvfp4") and recipe in peak_flops:
        return recipe
    return "fp8"


def loss_work(logits: float, activation_bytes: float, fused_kernels: bool,
              cross_entropy_fusion: bool) -> tuple[MemoryWork, MemoryWork]:
    """(forward, backward) memory-bound work of the cross-entropy over ``logits`` elements (this
    GPU's vocabulary shard of every token), the LM head's output in ``activation_bytes``.

    * Megatron-Core's vocabulary-parallel cross-entropy (``fused_kernels``, no loss fusion; its
      ``_VocabParallelCrossEntropy``): forward casts the logits to fp32 (read a, write 4), takes
      the row max (read 4), subtracts it in place (8), exponentiates in place (8), sums (4) and
      divides in place to keep the softmax for the backward (8): a + 32 bytes, 6 kernels;
      backward scales the saved softmax by the loss gradient in place (8) and the cast's
      backward writes it back at a (4 + a): 12 + a bytes, 2 kernels.
    * Eager PyTorch (``fused_kernels = false``: ``CrossEntropyLoss(logits.float())``): the cast
      (a + 4), ``log_softmax`` (reads the row twice for max and sum, writes it: 12), NLL:
      a + 16 bytes, 3 kernels; backward: the NLL gradient (zeros + scatter: 4),
      ``log_softmax_backward`` (gradient and output read, input gradient written: 12), the
      cast's backward (4 + a): 20 + a bytes, 4 kernels.
    * Fused (``cross_entropy_fusion``: one kernel per pass, online softmax): forward reads the
      logits once (a); backward recomputes the softmax from the saved row max and sum and writes
      the gradient (2a).

    Logits already in fp32 (``activation_bytes`` 4: fp32 training) are not cast: ``.float()``
    returns the tensor itself, so the cast (a + 4 bytes, one kernel) and its backward (4 + a,
    one kernel) drop out of both unfused paths.
    """
    a = activation_bytes
    if cross_entropy_fusion:
        return MemoryWork(logits * a, 1), MemoryWork(logits * 2 * a, 1)
    cast, n = (0.0, 0) if a >= 4 else (a + 4.0, 1)  # the fp32 upcast and, backward, its gradient's cast back
    if fused_kernels:
        return MemoryWork(logits * (cast + 28), 5 + n), MemoryWork(logits * (8 + cast), 1 + n)
    return MemoryWork(logits * (cast + 12), 2 + n), MemoryWork(logits * (16 + cast), 3 + n)


def loss_transient_bytes_per_logit(activation_bytes: float, fused_kernels: bool, cross_entropy_fusion: bool) -> float:
    """Bytes per logit the loss holds for a moment beyond the fp32 copy it keeps for the backward
    (4 bytes, counted with the stage's activations), at its worst point in the backward.

    * Eager PyTorch (``CrossEntropyLoss(logits.float())``): ``log_softmax_backward`` reads the NLL
      gradient (an fp32 tensor of the logits' shape) and the saved output and writes the input
      gradient (fp32): two fp32 temporaries, 8 bytes (the forward's worst, the bf16 logits and
      their fp32 copy beside the saved output, is a + 4, less);
    * Megatron-Core's vocabulary-parallel cross-entropy: the backward scales the saved softmax in
      place and writes the logits' gradient at ``activation_bytes``: a;
    * fused (``cross_entropy_fusion``): chunked over the vocabulary, nothing of the logits' size.
    """
    if cross_entropy_fusion:
        return 0.0
    return activation_bytes if fused_kernels else 8.0


FP8_PROMOTION_INTERVAL = 128
"""K elements between two promotions of an FP8 GEMM's tensor-core partial sums into FP32 on the CUDA
cores on Hopper: DeepSeek-V3's report (arXiv:2412.19437, Sec. 3.3.2: N_C = 128, four WGMMAs) and
CUTLASS's ``mma_promotion_interval = 4`` (MMAs of k = 32) for its FP8 kernels without fast
accumulation; blockwise scaling (1x128 / 128x128) applies its scales at the same boundary."""


def fp8_promotion_time(dev, m: int, n: int, k: int, count: int = 1) -> float:
    """Seconds an FP8 GEMM on Hopper spends promoting its partial sums (``FP8_PROMOTION_INTERVAL``):
    one FP32 multiply-add per output element per interval on the CUDA cores (``fp32`` peak, at the
    clock the tensor cores keep), serialised with the tensor-core main loop. Taken where the
    frameworks turn fast accumulation off -- Transformer Engine's dgrad and wgrad GEMMs
    (``use_split_accumulator``), torchao's input- and weight-gradient GEMMs -- and in every GEMM of
    the blockwise recipe; none on Blackwell, whose tcgen05 MMA accumulates in FP32 in tensor memory
    (Transformer Engine sets no fast-accumulation mode for sm100). On an H100 it costs
    2 x 1,979 / (66.9 x 2 x 128) = 23% of the tensor-core peak's time, ~16% at a GEMM's
    typical 70% of it: pytorch/ao#2377 measures fast accumulation 1.1-1.2x faster."""
    kf = dev.kernels
    fp32 = dev.peak_flops.get("fp32")
    if kf is None or kf.mma_style != "warpgroup" or not fp32:
        return 0.0
    promotions = -(-k // FP8_PROMOTION_INTERVAL)
    return 2.0 * m * n * promotions * count / (fp32 * dev.clock_ratio)
