"""Mixture of experts under expert parallelism: routing, imbalance, expert GEMMs, all-to-all.

One MoE layer, one microbatch, on the ranks of one expert-parallel (EP) group:

* The EP group: ``ep`` ranks carved out of dp x cp (cp varies fastest), times
  ``tp / expert_tp`` when experts use less tensor parallelism than the dense layers
  (Megatron-Core "parallel folding": the TP ranks then split the tokens and join the
  EP group). ``expert_tp`` defaults to ``tp`` (Megatron's default). The group has
  G = ep * tp / expert_tp ranks, each holding n_experts / G experts (contiguous), each
  expert's hidden size sharded over expert_tp.
* Routing: every rank holds T tokens (its microbatch shard: b * seq / cp, divided by
  tp / expert_tp when folded) and routes T * top_k assignments. The share of the group's
  G * T * top_k assignments that each expert gets is an *input* ([moe] routing):
  balanced, Zipf (hot experts, rank^-s), log-normal (exp(N(0, sigma)) per expert) or a
  measured histogram. Zipf and log-normal shares are placed on experts by a seeded
  permutation, so results are deterministic given the seed.
* Capacity (GShard/Switch): capacity_factor * G * T * top_k / n_experts per expert;
  with drop_tokens the overflow is dropped (not sent, not computed).
* Dispatch and combine are all-to-alls over the group on the topology
  (``parsim.collectives.collective_time``): 2 in forward, 2 in backward. Each rank sends
  the kept share of its T * top_k assignments, (G-1)/G of them to other ranks; a rank
  hosting hot experts receives more. The slowest rank (most received tokens) sets the
  pace of the group: its expert GEMMs and its all-to-all buffer are what the pipeline sees.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from parsim.cluster.collectives import collective_time, placement
from parsim.cluster.contention import group_sms
from parsim.cluster.hardware import canonical_precision
from parsim.cluster.kernels import expert_gemm_time
from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.moe import DISPATCHER_SMS, MoEConfig, layer_histograms
from parsim.costs.memory_ops import fp8_copy_bytes, fp8_promotion_time, non_tn_fp8_gemms


# ---------------------------------------------------------------- routing
def expert_shares(cfg: MoEConfig, n_experts: int) -> np.ndarray:
    """Fraction of the routed assignments each expert receives (sums to 1). With one histogram per
    MoE layer (each layer is costed with its own: ``parsim.costs.stage``) the mean layer's."""
    per_layer = layer_histograms(cfg)
    if cfg.routing == "histogram" and per_layer is not None:
        rows = np.asarray(per_layer, dtype=float)
        w = (rows / rows.sum(axis=1, keepdims=True)).mean(axis=0)
    elif cfg.routing == "histogram":
        w = np.asarray(cfg.histogram, dtype=float)
    elif cfg.routing == "zipf":
        ranks = np.arange(1, n_experts + 1, dtype=float)
        w = np.random.default_rng(cfg.seed).permutation(ranks ** -cfg.zipf_s)
    elif cfg.routing == "lognormal":
        w = np.exp(np.random.default_rng(cfg.seed).normal(0.0, cfg.lognormal_sigma, n_experts))
    else:
        w = np.ones(n_experts)
    return w / w.sum()


@dataclass(frozen=True)
class Routing:
    """Where one microbatch's assignments go in one EP group (per MoE layer)."""

    group_size: int
    """G: ranks of the EP group."""
    tokens_per_rank: float
    """T: tokens each rank routes."""
    offered: np.ndarray
    """Assignments routed to each expert (group-wide)."""
    kept: np.ndarray
    """Assignments each expert computes (offered, capped at capacity when dropping)."""
    capacity: float | None
    """Assignments one expert can take (None: dropless)."""
    received: np.ndarray
    """Assignments each EP rank computes (sum of its experts' kept)."""
    sent: float
    """Assignments each rank sends (its kept T * top_k, on average)."""

    @property
    def dropped_fraction(self) -> float:
        total = float(self.offered.sum())
        return 1.0 - float(self.kept.sum()) / total if total > 0 else 0.0

    @property
    def imbalance(self) -> float:
        """Busiest rank's received assignments over the mean."""
        mean = float(self.received.mean())
        return float(self.received.max()) / mean if mean > 0 else 1.0


def route(model, cfg: MoEConfig, tokens_per_rank: float, group_size: int) -> Routing:
    """Assignments per expert and per EP rank for one MoE layer and one microbatch."""
    e = model.n_experts
    total = group_size * tokens_per_rank * model.top_k
    offered = total * expert_shares(cfg, e)
    cap = None
    kept = offered
    if cfg.drop_tokens:
        cap = float(math.ceil(model.capacity_factor * total / e))
        kept = np.minimum(offered, cap)
    received = kept.reshape(group_size, e // group_size).sum(axis=1)
    return Routing(group_size, tokens_per_rank, offered, kept, cap, received,
                   float(kept.sum()) / group_size)


def all_to_all_bytes(r: Routing, d_model: int, bytes_per_el: int) -> dict[str, np.ndarray | float]:
    """Bytes one dispatch (or combine) moves off/onto each rank, one direction each.

    ``send``: each rank's kept assignments bound for the other G-1 ranks; balanced:
    T * top_k * d_model * bytes * (G-1)/G. ``recv``: per rank, what its experts get from
    the others (senders uniform).
    """
    g = r.group_size
    frac = (g - 1) / g
    return {"send": r.sent * d_model * bytes_per_el * frac,
            "recv": r.received * d_model * bytes_per_el * frac}


# ---------------------------------------------------------------- costs
def ep_group_ranks(par, expert_tp: int) -> list[int]:
    """Global ranks of the EP group of rank 0 (dp x cp index, cp fastest, then folded tp ranks)."""
    out = []
    for j in range(par.ep):
        d, c = divmod(j, par.cp)
        base = d * par.stride("dp") + c * par.stride("cp")
        for t in range(0, par.tp, expert_tp):
            out.append(base + t * par.stride("tp"))
    return sorted(out)


def expert_dp_ranks(par) -> list[int]:
    """Ranks holding the same experts as rank 0 (expert data parallel: dp*cp/ep of them)."""
    out = []
    for j in range(0, par.dp * par.cp, par.ep):
        d, c = divmod(j, par.cp)
        out.append(d * par.stride("dp") + c * par.stride("cp"))
    return out


# ---------------------------------------------------------------- kernels
# Memory-bound MoE kernels as Megatron-Core runs them (megatron/core/transformer/moe:
# router.py ``topk_softmax_with_capacity``, moe_utils.py ``permute``/``unpermute``,
# token_dispatcher.py ``MoEAlltoAllTokenDispatcher``; Transformer Engine's fused
# ``moe_permute``/``moe_unpermute``). Bytes are HBM reads + writes, counted per kernel.
ROUTER_LOGIT_BYTES = 4
"""Router logits and probabilities are fp32 (Megatron-Core ``moe_router_dtype`` fp32, the
precision the MoE docs recommend for the softmax/top-k and the aux loss)."""
ROUTER_FWD_PASSES = 6
"""fp32 [T, E] passes of the router forward after its GEMM: softmax (or sigmoid) read +
write, top-k read, the scatter of the top-k probs into the dense [T, E] ``probs`` write,
the aux-loss (load-balancing) reads of probs and of the [T, E] routing map (counted as one
fp32 pass: the map is 1 byte, the per-expert token count another read of it)."""
ROUTER_BWD_PASSES = 4
"""fp32 [T, E] passes of the router backward before its GEMMs: the aux-loss gradient write,
the softmax backward's reads of probs and gradient and its write."""
ROUTER_KERNELS = (8, 6)
"""Kernels of the router in forward and backward (GEMM, softmax, top-k, scatter, aux loss
sums; their backward), each with a launch gap (``device.kernel_launch_s``)."""
PERMUTE_KERNELS = (6, 6)
"""Kernels of dispatch + combine bookkeeping per pass: the permute, the sort of received
chunks by local expert, its inverse, the unpermute (weighted combine), plus the routing-map
index computation; the same number run their backward."""
FP8_ROW_ALIGN = {"fp8": 16, "mxfp8": 32, "nvfp4": 128}
"""Rows each expert pads to under FP8 / FP4 (Megatron-Core ``moe_router_padding_for_fp8``:
FP8 GEMMs need M a multiple of 16, MXFP8 of 32: one scale block of 32 rows; NVFP4 128,
``megatron/core/fp4_utils.get_fp4_align_size``: the grouped quantize with its Hadamard
transform wants 64 and runs faster at 128, and a 128-row padding spares the host the token
counts the scale layout would need)."""


def quant_bytes_per_element(precision: str, non_tn: bool) -> float | None:
    """Bytes per element of one quantization pass before an FP8 / FP4 grouped GEMM (Transformer
    Engine): read the bf16 tensor (2; NVFP4 twice: its per-tensor amax first), write the copies
    the GEMMs need (``memory_ops.fp8_copy_bytes``: row-wise, and column-wise where the layout
    requires it; MXFP8 and NVFP4 with their scales); None for a 16-bit GEMM."""
    p = canonical_precision(precision)
    if p not in ("fp8", "mxfp8", "nvfp4"):
        return None
    if p == "nvfp4":
        return 2 * 2 + fp8_copy_bytes("nvfp4", non_tn)
    return 2 + fp8_copy_bytes("mxfp8" if p == "mxfp8" else "current", non_tn)


def _dense_gemm(dev, m: int, n: int, k: int, prec: str) -> float:
    """A plain GEMM by the kernel model where the profile has one, else the device's model."""
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    if dev.kernels is not None:
        return dev.kernel_gemm_time(m, n, k, prec)
    return dev.gemm_time(m, n, k, prec)


def _grouped(dev, problems: list[tuple[int, int, int]], prec: str, implementation: str = "grouped") -> float:
    """The local experts' GEMMs run as ``implementation`` runs them (kernel model:
    ``parsim.cluster.kernels.expert_gemm_time``), else the sum of per-expert GEMMs (the device's
    shape model) for profiles without kernel facts."""
    if dev.kernels is not None:
        return expert_gemm_time(dev, tuple(problems), canonical_precision(prec), implementation)
    return sum(dev.gemm_time(m, n, k, prec) for m, n, k in problems if m and n and k)


def expert_rows(kept: np.ndarray, precision: str, capacity: float | None, pad_to_capacity: bool) -> list[int]:
    """Rows each local expert's GEMMs compute: its kept assignments, the full capacity when
    the expert input is padded to it, rounded up to the FP8 row alignment."""
    align = FP8_ROW_ALIGN.get(canonical_precision(precision), 1)
    out = []
    for r in kept:
        rows = capacity if (pad_to_capacity and capacity is not None) else float(r)
        rows = int(math.ceil(rows - 1e-9))
        out.append(-(-rows // align) * align)
    return out


def router_bytes(tokens: float, n_experts: int) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the router's memory-bound kernels for ``tokens`` tokens."""
    per_pass = tokens * n_experts * ROUTER_LOGIT_BYTES
    return ROUTER_FWD_PASSES * per_pass, ROUTER_BWD_PASSES * per_pass


def permute_bytes(tokens: float, top_k: int, rows: float, d_model: int, bpe: float) -> tuple[float, float]:
    """(forward, backward) HBM bytes of dispatch permutation and combine unpermutation.

    Forward: permute (read T*k rows of d -- a token is read once per expert it goes to --
    write T*k rows); sort the R received rows by local expert (read + write R rows); after
    the experts, the inverse sort (R rows read + written); the unpermute with its weighted
    sum (read T*k rows, write T). Backward: the same gathers and scatters on the gradients,
    plus the combine's probability gradient reads the expert outputs again (T*k rows).
    """
    row = d_model * bpe
    tk = tokens * top_k
    fwd = (2 * tk + 2 * rows + 2 * rows + tk + tokens) * row
    bwd = (2 * tk + 2 * rows + 2 * rows + 2 * tk + tokens) * row
    return fwd, bwd


def activation_bytes(rows: float, f: int, ffn_matrices: int, bpe: float) -> tuple[float, float]:
    """(forward, backward) bytes of the expert activation on ``rows`` rows of local width f:
    SwiGLU reads gate and up and writes their product (3f), its backward reads the gradient
    and both inputs and writes two gradients (5f); GeLU 2f and 3f."""
    if ffn_matrices == 3:
        return 3.0 * rows * f * bpe, 5.0 * rows * f * bpe
    return 2.0 * rows * f * bpe, 3.0 * rows * f * bpe


def quantize_bytes(rows: float, d_model: int, f: int, ffn_matrices: int, precision: str,
                   non_tn: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes of the FP8 quantization passes of the expert GEMMs' inputs:
    forward the FC1 input (d) and the FC2 input (f); backward the FC2 output gradient (d)
    and the FC1 output gradient ((ffn_matrices - 1) f). Zero for 16-bit precisions."""
    per = quant_bytes_per_element(precision, non_tn)
    if per is None:
        return 0.0, 0.0
    return rows * (d_model + f) * per, rows * (d_model + (ffn_matrices - 1) * f) * per


ROUTING_MAP_BYTES = 1 + 4 + 4
"""Bytes per (token, expert) the routing keeps for the backward: the boolean routing map and
the fp32 probabilities (Megatron-Core ``topk_softmax_with_capacity`` returns both as dense
[T, E]; the softmax backward needs the probabilities), and the int32 row-id map of Transformer
Engine's ``moe_permute`` ([E, T]) that its backward gathers through."""


def routing_stash_bytes(tokens: float, n_experts: int) -> float:
    """Bytes one MoE layer keeps for its backward besides the dispatched rows: the routing
    map, probabilities and permutation row-id map of :data:`ROUTING_MAP_BYTES` per entry."""
    return tokens * n_experts * ROUTING_MAP_BYTES


def all_to_all_time(hw, nbytes: float, group: tuple[int, ...]) -> float:
    """One NCCL all-to-all (Megatron-Core's ``alltoall`` dispatcher, not DeepEP) of ``nbytes``
    per rank (its send or, for the busiest rank, its receive buffer) over ``group``.

    Each rank exchanges S/n with every peer at once: the (g-1)/n of S bound for its own node
    go over NVLink, the (n-g)/n for other nodes over the network, both concurrently; every
    GPU of a node sends off-node at once, so a rank gets its node's NIC bandwidth divided by
    the GPUs per node (not the whole node's, as a ring crossing once would). Latency: the
    ring convention of ``parsim.cluster.collectives`` ((n-1) steps of the slowest hop).
    """
    n = len(group)
    if n <= 1 or nbytes <= 0:
        return 0.0
    pl = placement(hw, list(group))
    if pl.nodes <= 1:
        return collective_time(hw, "all_to_all", nbytes, list(group))
    g = pl.per_node
    intra = nbytes * (g - 1) / n / hw.nvlink.effective_bandwidth
    nic = hw.nic.effective_bandwidth * hw.nics_per_node / hw.gpus_per_node
    hops = 1
    if pl.leaves > 1:
        nic /= max(1.0, hw.spine_oversubscription)
        hops = 3
    inter = nbytes * (n - g) / n / nic
    latency = (n - 1) * (hw.nic.latency_s + 2 * hops * hw.switch_latency_s)
    return max(intra, inter) + latency


PIECES = ("router", "permute", "grouped_gemm", "activation", "quantize")
"""The named pieces of one MoE layer's compute (:class:`MoEKernels`)."""


def _miss(pool: float, on_node: float, top_k: int) -> float:
    """P(none of ``top_k`` picks, uniform without replacement from ``pool`` experts, is one of
    the ``on_node`` experts a node holds)."""
    miss = 1.0
    for i in range(top_k):
        miss *= max(0.0, (pool - on_node - i) / (pool - i))
    return miss


def distinct_nodes(n_experts: int, top_k: int, nodes: int, groups: int = 0, groups_per_token: int = 0) -> float:
    """Expected distinct nodes one token's top_k experts sit on, experts spread evenly (and in
    order) over ``nodes`` and chosen uniformly without replacement (balanced routing): nodes
    times the chance that a node holds at least one of them (hypergeometric).

    With group-limited routing (``groups`` equal groups of consecutive experts, a token's experts
    from ``groups_per_token`` of them: DeepSeek-V3's node-limited routing, 4 of 8) the groups are
    chosen uniformly, then the experts among theirs. Where each node holds whole groups (groups a
    multiple of nodes) the number of a node's groups chosen is hypergeometric; where each group
    spans whole nodes (nodes a multiple of groups) a node is reachable only when its one group
    is chosen. Other splits are costed without the limit (a group straddling nodes unevenly)."""
    if nodes <= 1:
        return 1.0
    per = n_experts / nodes
    if groups <= 1 or groups_per_token >= groups or (groups % nodes and nodes % groups):
        return nodes * (1.0 - _miss(n_experts, per, top_k))
    size = n_experts // groups
    pool = groups_per_token * size  # the experts of the chosen groups
    if groups % nodes == 0:
        q = groups // nodes  # whole groups per node
        total = math.comb(groups, groups_per_token)
        miss = sum(math.comb(q, j) * math.comb(groups - q, groups_per_token - j) / total * _miss(pool, j * size, top_k)
                   for j in range(min(q, groups_per_token) + 1))
    else:
        chosen = groups_per_token / groups  # P(this node's group is among the chosen)
        miss = (1.0 - chosen) + chosen * _miss(pool, per, top_k)
    return nodes * (1.0 - miss)


def deepep_time(hw, tokens: float, top_k: int, n_experts: int, row_bytes: float, group: tuple[int, ...],
                imbalance: float = 1.0, expert_groups: tuple[int, int] = (0, 0)) -> float:
    """One DeepEP normal-kernel dispatch (or combine) of ``tokens`` tokens per rank.

    DeepEP (github.com/deepseek-ai/DeepEP, the DeepSeek-V3 report Sec. 3.2.2) sends a token
    over RDMA once to each other node that holds one of its experts (to the GPU of the same
    local index), which forwards it over NVLink to the experts' GPUs there. Per rank: RDMA
    bytes T * (remote distinct nodes) * row, NVLink bytes T * (distinct ranks) * row * (g-1)/g:
    a token reaches each destination GPU once, however many of its experts that GPU hosts
    (``get_dispatch_layout``'s ``is_token_in_rank`` is per rank; the receiver's buffer holds one
    row per token and expands it to its experts locally); ``expert_groups`` = (groups, per token)
    of group-limited routing (:func:`distinct_nodes`, over nodes and over ranks) cuts the nodes
    and the GPUs a token reaches. Megatron-Core's own MoE layer test (moe_perf, H100, EP 8,
    DeepSeek proxy of 32 experts top-8 in 8 groups, 4 a token) measures the flex dispatchers
    1.4-1.7 ms a forward faster than its all-to-all dispatcher, which sends a copy per expert: the
    four GPUs against eight copies. The README's normal-kernel table (H800, CX7 400 Gb/s)
    reaches 43-58 GB/s RDMA and ~155 GB/s NVLink per GPU: the profile's NIC and NVLink
    bandwidths are used for them. The busiest rank's receive scales by ``imbalance``.
    """
    n = len(group)
    if n <= 1 or tokens <= 0:
        return 0.0
    pl = placement(hw, list(group))
    g = pl.per_node
    nodes = pl.nodes
    ranks = distinct_nodes(n_experts, top_k, n, *expert_groups)  # the GPUs a token reaches
    nvl = tokens * ranks * row_bytes * (g - 1) / max(1, n) * nodes * imbalance
    if nodes <= 1:
        return nvl / hw.nvlink.effective_bandwidth + (n - 1) * hw.nvlink.latency_s
    remote = distinct_nodes(n_experts, top_k, nodes, *expert_groups) * (nodes - 1) / nodes
    nic = hw.nic.effective_bandwidth * hw.nics_per_node / hw.gpus_per_node
    hops = 1
    if pl.leaves > 1:
        nic /= max(1.0, hw.spine_oversubscription)
        hops = 3
    rdma = tokens * remote * row_bytes * imbalance / nic
    return max(rdma, nvl / hw.nvlink.effective_bandwidth) + (nodes - 1) * (hw.nic.latency_s + 2 * hops * hw.switch_latency_s)


@dataclass(frozen=True)
class MoEKernels:
    """Seconds of one MoE layer's pieces on the slowest EP rank, one microbatch, by pass
    (forward, backward-input, backward-weight)."""

    router: tuple[float, float, float]
    """Router GEMM, softmax/sigmoid + top-k, aux-loss (and its backward), launch gaps."""
    permute: tuple[float, float, float]
    """Token permute / sort-by-expert and unpermute with the weighted combine, launch gaps."""
    grouped_gemm: tuple[float, float, float]
    """The experts' grouped GEMMs (FC1, FC2; their dgrad; their wgrad): one launch each."""
    activation: tuple[float, float, float]
    """The expert activation (SwiGLU / GeLU) and its backward."""
    quantize: tuple[float, float, float]
    """FP8 / MXFP8 quantization (+ transpose) passes of the grouped GEMMs' inputs."""

    def by_piece(self) -> tuple[tuple[str, float], ...]:
        """(piece, forward + backward seconds) for each piece."""
        return tuple((name, float(sum(getattr(self, name)))) for name in PIECES)

    def total(self, i: int) -> float:
        """All pieces of pass ``i`` (0 forward, 1 backward-input, 2 backward-weight)."""
        return self.router[i] + self.permute[i] + self.grouped_gemm[i] + self.activation[i] + self.quantize[i]


def layer_kernels(dev, model, cfg: MoEConfig, precision: str, r: Routing, kept: np.ndarray, rows: float,
                  f: int, gemm_precision: str | None = None, blockwise: bool = False) -> MoEKernels:
    """The pieces of one MoE layer on a rank whose local experts keep ``kept`` assignments
    (``rows`` in all), routing ``r.tokens_per_rank`` tokens, expert width ``f``; the grouped
    GEMMs (and their FP8 casts) at ``gemm_precision`` (default ``precision``); an FP8 GEMM's
    split accumulation on Hopper (``memory_ops.fp8_promotion_time``) in the gradients' GEMMs, and
    in the forward's too under the ``blockwise`` recipe."""
    gp = gemm_precision or precision
    e, k = model.n_experts, model.top_k
    d_router, d = model.d_model, model.expert_width  # LatentMoE: the experts and the dispatch see latent rows
    bpe = PRECISION_TABLE[precision].activation_bytes
    # a device that states the torch runtime's per-op host time (a CPU rank) is charged the MoE
    # block's counted ops instead (parsim.costs.layer.eager_moe_extra_ops), not launch gaps
    launch = 0.0 if dev.eager_op_forward_s is not None else dev.kernel_launch_s
    t = r.tokens_per_rank
    ti = int(math.ceil(t))
    mem = dev.memory_time
    rf, rb = router_bytes(t, e)
    rp = precision if precision in ("fp16", "fp32", "tf32") else "bf16"  # never FP8 (Megatron, TE)
    router = (_dense_gemm(dev, ti, e, d_router, rp) + mem(rf) + ROUTER_KERNELS[0] * launch,
              _dense_gemm(dev, ti, d_router, e, rp) + mem(rb) + ROUTER_KERNELS[1] * launch,
              _dense_gemm(dev, e, d_router, ti, rp))
    pf, pb = permute_bytes(t, k, rows, d, bpe)
    permute = (mem(pf) + PERMUTE_KERNELS[0] * launch, mem(pb) + PERMUTE_KERNELS[1] * launch, 0.0)
    m = expert_rows(kept, gp, r.capacity, cfg.pad_to_capacity)
    n1 = (model.ffn_matrices - 1) * f  # gate and up as one FC1 (Megatron-Core GroupedMLP)
    # each pass's two grouped GEMMs as (m, n, k) per expert: the forward's FC1 and FC2, the
    # backward's input gradients (FC2's, then FC1's) and weight gradients
    passes = ([[(x, n1, d) for x in m], [(x, d, f) for x in m]],
              [[(x, f, d) for x in m], [(x, d, n1) for x in m]],
              [[(d, n1, x) for x in m], [(f, d, x) for x in m]])
    impl = cfg.expert_gemm or "grouped"  # resolved from the framework by parsim.costs.inputs
    gg = tuple(_grouped(dev, a, gp, impl) + _grouped(dev, b, gp, impl) + 2 * launch for a, b in passes)
    if canonical_precision(gp) == "fp8":
        def promo(shapes):
            return sum(fp8_promotion_time(dev, a, b, c) for a, b, c in shapes if a and b and c)
        split = [promo(a) + promo(b) for a, b in passes]
        gg = (gg[0] + (split[0] if blockwise else 0.0), gg[1] + split[1], gg[2] + split[2])
    padded = float(sum(m))
    af, ab = activation_bytes(padded, f, model.ffn_matrices, bpe)
    activation = (mem(af) + launch, mem(ab) + launch, 0.0)
    qf, qb = quantize_bytes(padded, d, f, model.ffn_matrices, gp, non_tn_fp8_gemms(dev))
    quant = (mem(qf) + (2 * launch if qf else 0.0), mem(qb) + (2 * launch if qb else 0.0), 0.0)
    return MoEKernels(router, permute, gg, activation, quant)


@dataclass(frozen=True)
class MoEPhase:
    """Per-layer, per-microbatch MoE costs on the slowest EP rank."""

    routing: Routing
    """Where the assignments go (group-wide)."""
    group: tuple[int, ...]
    """Global ranks of the EP group."""
    expert_tp: int
    """Tensor-parallel degree of the experts."""
    rank_times: np.ndarray
    """Per EP rank: (forward, backward-input, backward-weight) seconds of all MoE kernels, shape (G, 3)."""
    slowest: int
    """Index (in the group) of the rank with the most MoE work."""
    kernels: MoEKernels
    """The slowest rank's pieces by pass."""
    all_to_all_s: float
    """One dispatch (or combine) all-to-all as the slowest rank sees it."""
    forward_flops: float
    """Mean rank's expert GEMM FLOPs of one forward."""
    routed_rows: float
    """Assignments the slowest rank computes (its dispatched-token activations)."""
    routing_stash_bytes: float = 0.0
    """Routing map, probabilities and row-id map one layer keeps for the backward."""
    count_exchange_s: float = 0.0
    """The forward's exchange of tokens-per-expert counts that sizes the dispatch: an all-gather
    of every EP rank's int64 count per expert (Megatron-Core's all-to-all dispatcher gathers
    ``num_local_tokens_per_expert`` over the EP group before its all-to-all, and copies them to
    the host; parsim's torch runtime does the same all-gather, ``validate.comm.exchange_counts``).
    The backward reuses the counts. 0 with DeepEP (its layout is computed on the device)."""
    dispatcher_sms: int = 0
    """SMs the dispatch/combine kernels hold while in flight (``MoEConfig.dispatcher_sms``, else
    Megatron-Core's DeepEP/HybridEP default, else the profile's NCCL ``collective_ctas``)."""

    @property
    def forward_s(self) -> float:
        return float(self.rank_times[self.slowest, 0])

    @property
    def backward_input_s(self) -> float:
        return float(self.rank_times[self.slowest, 1])

    @property
    def backward_weight_s(self) -> float:
        return float(self.rank_times[self.slowest, 2])


def moe_phase(model, hw, cfg: MoEConfig, precision: str, tokens: int, group: tuple[int, ...], expert_tp: int,
              tp: int, gemm_precision: str | None = None, blockwise: bool = False) -> MoEPhase:
    """Costs of one MoE layer for one microbatch of ``tokens`` tokens per rank (after cp) on the
    EP group ``group`` (:func:`ep_group_ranks`; experts sharded over ``expert_tp`` of the ``tp``
    ranks). ``precision``: the training precision (activations, dispatch); ``gemm_precision``:
    what the grouped GEMMs run at (default the same; FP8 may run as MXFP8)."""
    m = model
    fold = tp // expert_tp
    g = len(group)
    r = route(m, cfg, tokens / fold, g)
    f = -(-m.d_ff_expert_ // expert_tp)
    per_rank = r.kept.reshape(g, m.n_experts // g)
    dev = hw.device
    # ranks with the same local loads cost the same: compute each distinct load once
    cache: dict[tuple, MoEKernels] = {}
    pieces = []
    for i, rows in enumerate(per_rank):
        key = tuple(np.round(rows, 6))
        if key not in cache:
            cache[key] = layer_kernels(dev, m, cfg, precision, r, rows, float(r.received[i]), f,
                                       gemm_precision or precision, blockwise)
        pieces.append(cache[key])
    times = np.array([[p.total(0), p.total(1), p.total(2)] for p in pieces])
    slowest = int(np.argmax(times.sum(axis=1)))
    bpe = PRECISION_TABLE[precision].activation_bytes  # tokens are dispatched as activations
    flex = cfg.dispatcher in ("deepep", "hybridep")  # HybridEP: the same node-deduplicated path
    if flex:
        a2a = deepep_time(hw, r.tokens_per_rank * (1.0 - r.dropped_fraction), m.top_k, m.n_experts,
                          m.expert_width * bpe, tuple(group), r.imbalance, (m.expert_groups, m.expert_groups_per_token))
    else:
        buf = max(r.sent, float(r.received.max())) * m.expert_width * bpe
        a2a = all_to_all_time(hw, buf, tuple(group))
    counts = count_exchange_time(hw, m.n_experts, tuple(group)) if not flex else 0.0
    if cfg.dispatcher_sms is not None:
        sms = cfg.dispatcher_sms
    else:
        sms = DISPATCHER_SMS[cfg.dispatcher] if flex else group_sms(hw, group)
    flops = 2.0 * float(r.kept.sum()) / g * m.ffn_matrices * m.expert_width * f
    return MoEPhase(r, tuple(group), expert_tp, times, slowest, pieces[slowest], a2a, flops,
                    float(r.received[slowest]), routing_stash_bytes(r.tokens_per_rank, m.n_experts), counts, sms)


COUNT_BYTES = 8
"""Bytes of one tokens-per-expert count (int64, as torch's bincount/histc results are kept)."""


def count_exchange_time(hw, n_experts: int, group: tuple[int, ...]) -> float:
    """Seconds of the all-gather of every EP rank's per-expert token counts (``MoEPhase.count_exchange_s``)."""
    if len(group) <= 1:
        return 0.0
    return collective_time(hw, "all_gather", len(group) * n_experts * COUNT_BYTES, list(group))
