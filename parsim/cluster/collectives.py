"""Cost of collectives: alpha-beta models with nccl-tests' bus-bandwidth factors,
ring / tree / hierarchical / NVLS algorithms, NCCL-like selection, on the topology.

For a group of n ranks moving S bytes (nccl-tests' convention: S is the full buffer,
all-gather's output, reduce-scatter's input) over links of bandwidth B and per-step
latency a:

  ring all-reduce       2(n-1)/n * S/B + 2(n-1) a      (busbw factor 2(n-1)/n)
  ring reduce-scatter   (n-1)/n * S/B + (n-1) a        (busbw factor (n-1)/n)
  ring all-gather       (n-1)/n * S/B + (n-1) a
  all-to-all            (n-1)/n * S/B + (n-1) a
  gather / scatter      (n-1)/n * S/B + (n-1) a        (the root's link carries it all)
  broadcast / reduce    S/B + (n-1) a                  (pipelined chain; busbw factor 1)
  p2p                   S/B + a
  tree (double binary, across nodes) same bandwidth term, latency 2 ceil(log2 n) a (all-reduce),
                        ceil(log2 n) a (broadcast, reduce)
  NVLS all-reduce       S/B_nvls + 2a                  (NVSwitch reduces in the switch)
  hierarchical          reduce-scatter inside the node, the collective on S/g across
                        nodes (each local rank on its own rail), all-gather inside the node

On a cluster (:func:`collective_time`) B comes from where the group sits: NVLink port
bandwidth when the group is inside a node; across nodes, the NICs of a node are shared
by every group of the same axis that has ranks on that node (all groups of an axis
communicate at once: with one rank of the group per node, as a DP group beside a node of
TP ranks, each group gets its rail), and a group spanning leaf switches pays the spine's
oversubscription. Each step's latency counts the switches a message crosses: one inside
a leaf domain, three through a spine, five through a core tier (:func:`switch_hops`). The
algorithm is chosen as NCCL's tuner does: the fastest modelled one for this size and group.

NVLS by kind (:data:`NVLS`): NCCL implements NVLink SHARP for all-reduce, reduce-scatter and
all-gather (``src/device/all_reduce.h``, ``reduce_scatter.h``, ``all_gather.h``:
``RunWorkElement<..., NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>``, NCCL >= 2.18 on NVSwitch
systems of Hopper and later). Only the all-reduce gains from it: the switch reduces, so each
port carries the buffer once each way instead of 2(n-1)/n of it; a reduce-scatter or all-gather
still moves (n-1)/n of the buffer through every port, as the ring does, and is costed as the
ring (measured: nccl-tests at NCCL 2.29 on 8 H100 reach 335 GB/s bus bandwidth for both at
512 MB, against 445 for the NVLS all-reduce). Every other kind has none (the reason is stated there).

Gradient buckets (:func:`bucketed_time`): frameworks reduce gradients in buckets (PyTorch
DDP ``bucket_cap_mb`` = 25 MB; Megatron-core ``bucket_size`` = max(40M, 1M x dp)
parameters), one collective per bucket, each with its own latency terms.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from parsim.cluster.hardware import HardwareProfile

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather", "scatter",
         "all_to_all", "p2p")
ALGORITHMS = ("ring", "tree", "hierarchical", "nvls")

BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "p2p": lambda n: 1.0,
}
# latency terms (number of sequential steps) of the ring algorithms
HOPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "reduce_scatter": lambda n: n - 1,
    "all_gather": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
    "gather": lambda n: n - 1,
    "scatter": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
    "reduce": lambda n: n - 1,
    "p2p": lambda n: 1,
}
TREE_KINDS = {"all_reduce": 2, "broadcast": 1, "reduce": 1}  # latency multiple of ceil(log2 n)
NVLS: dict[str, tuple[float, int] | str] = {
    # kind -> (fraction of S / B_nvls each GPU's port carries, latency steps), or why there is none.
    # The all-reduce is a multimem ld_reduce (reduce-scatter) then a multimem st (all-gather):
    # each half moves half its traffic, so reduce-scatter and all-gather take S / (2 B_nvls).
    "all_reduce": (1.0, 2),
    "reduce_scatter": ("NVLS moves (n-1)/n of the buffer through each GPU's NVLink port, as the ring does: no "
                       "bandwidth to gain (nccl-tests, NCCL 2.29, 8 H100: 336 GB/s bus bandwidth at 512 MB, "
                       "ring-class; aiconfigurator's nccl_perf); costed as the ring"),
    "all_gather": ("NVLS multicasts each shard, but every GPU still receives (n-1)/n of the buffer through its "
                   "port: no bandwidth to gain (nccl-tests, NCCL 2.29, 8 H100: 335 GB/s bus bandwidth at "
                   "512 MB); costed as the ring"),
    "broadcast": "no NVLS kernel in NCCL (ring/tree only)",
    "reduce": "no NVLS kernel in NCCL (ring/tree only)",
    "gather": "point-to-point sends to the root; the switch's multicast does not apply",
    "scatter": "point-to-point sends from the root; the switch's multicast does not apply",
    "all_to_all": "point-to-point sends between every pair; nothing to reduce or multicast",
    "p2p": "one send; nothing to reduce or multicast",
}
"""NVLink SHARP per collective kind: its cost terms where NCCL has an NVLS algorithm, else why not."""
SWITCH_RADIX = 64
"""Ports of a fabric switch (NVIDIA Quantum-2 QM9700: 64 NDR 400 Gb/s ports). A two-tier fat tree of
radix-k switches reaches k^2/2 endpoints, a three-tier one k^3/4 (Al-Fares et al., SIGCOMM 2008)."""
# kinds a hierarchical (intra-node, then inter-node) algorithm decomposes
HIER_KINDS = ("all_reduce", "reduce_scatter", "all_gather")


def alpha_beta_time(kind: str, nbytes: float, n: int, bandwidth: float, latency_s: float,
                    algorithm: str = "ring") -> float:
    """Time of collective ``kind`` over n ranks on uniform links (0 for n == 1 or no bytes).

    ``algorithm``: "ring" (every kind), "tree" (all-reduce, broadcast, reduce) or "nvls"
    (all-reduce, reduce-scatter, all-gather: ``bandwidth`` is then the NVLS all-reduce's
    algorithm bandwidth).
    """
    if kind not in BUSBW_FACTOR:
        raise ValueError(f"unknown collective {kind!r} (known: {', '.join(KINDS)})")
    if (n <= 1 and kind != "p2p") or nbytes <= 0:
        return 0.0
    if algorithm == "nvls":
        terms = NVLS[kind]
        if isinstance(terms, str):
            raise ValueError(f"nvls does not implement {kind}: {terms}")
        return terms[0] * nbytes / bandwidth + terms[1] * latency_s
    beta = BUSBW_FACTOR[kind](n) * nbytes / bandwidth
    if algorithm == "tree":
        if kind not in TREE_KINDS:
            raise ValueError(f"tree does not implement {kind} (NCCL: {', '.join(TREE_KINDS)})")
        return beta + TREE_KINDS[kind] * math.ceil(math.log2(n)) * latency_s
    if algorithm != "ring":
        raise ValueError(f"unknown algorithm {algorithm!r} for uniform links")
    return beta + HOPS[kind](n) * latency_s


def bus_bandwidth(kind: str, nbytes: float, n: int, seconds: float) -> float:
    """nccl-tests' busbw: algbw (S/t) times the collective's factor."""
    return nbytes / seconds * BUSBW_FACTOR[kind](n)


@dataclass(frozen=True)
class GroupPath:
    """The bottleneck path of a communication group on the topology."""

    name: str
    """``"nvlink"`` (inside one node), ``"pcie"`` (inside a node of direct links that close no
    ring over the group) or ``"nic"`` (crosses nodes)."""
    bandwidth: float
    """Bytes/s per rank of the group's slowest hop, after sharing with concurrent groups."""
    latency_s: float
    """Per-step latency of that hop."""


@dataclass(frozen=True)
class GroupPlacement:
    """Where a group's ranks sit: how many nodes, ranks per node, leaves spanned."""

    n: int
    nodes: int
    per_node: int
    """Ranks of the group on each node (the largest count)."""
    leaves: int
    concurrent: int
    """Groups of the same axis with ranks on one node (they share its NICs)."""


def placement(hw: HardwareProfile, ranks: list[int], concurrent: int | None = None) -> GroupPlacement:
    """Placement of a group; ``concurrent`` defaults to filling the node with such groups."""
    per: dict[int, int] = {}
    for r in ranks:
        per[hw.node_of(r)] = per.get(hw.node_of(r), 0) + 1
    g = max(per.values())
    leaves = len({hw.leaf_of(r) for r in ranks})
    conc = concurrent if concurrent is not None else max(1, hw.gpus_per_node // g)
    return GroupPlacement(len(ranks), len(per), g, leaves, conc)


def switch_hops(hw: HardwareProfile, ranks: list[int]) -> int:
    """Switches a message between the group's farthest ranks crosses: 0 inside a node, 1 inside
    a leaf domain, 3 (leaf, spine, leaf) inside a two-tier pod of SWITCH_RADIX^2/2 GPUs, 5
    through a core tier (SWITCH_RADIX^3/4 GPUs), 7 beyond. One NIC port per GPU (rails)."""
    if len({hw.node_of(r) for r in ranks}) <= 1:
        return 0
    for hops, span in ((1, hw.gpus_per_leaf), (3, SWITCH_RADIX ** 2 // 2), (5, SWITCH_RADIX ** 3 // 4)):
        if len({r // span for r in ranks}) == 1:
            return hops
    return 7


def _nic_share(hw: HardwareProfile, pl: GroupPlacement, hops: int = 1) -> GroupPath:
    """Per-rank inter-node bandwidth of a flat ring: the node's NICs split over the
    concurrent groups, each group's ring crossing the node boundary once per channel;
    ``hops``: switches crossed (:func:`switch_hops`), each paid on the way and back."""
    node_bw = hw.nic.effective_bandwidth * hw.nics_per_node
    bw = node_bw / pl.concurrent
    own_rail = hw.nic.effective_bandwidth * hw.nics_per_node / max(1, hw.gpus_per_node)
    if pl.per_node > 1 or bw > own_rail:
        # more than the GPU's own rail: the data reaches the other NICs over NVLink (NCCL's PXN)
        bw = min(bw, hw.nvlink.effective_bandwidth)
    if pl.leaves > 1:
        bw /= max(1.0, hw.spine_oversubscription)
        hops = max(hops, 3)  # leaf -> spine -> leaf
    return GroupPath("nic", bw, hw.nic.latency_s + 2 * hops * hw.switch_latency_s)


def group_path(hw: HardwareProfile, ranks: list[int], concurrent: int | None = None) -> GroupPath:
    """Bottleneck bandwidth/latency of a flat ring over ``ranks`` (global GPU indices)."""
    pl = placement(hw, ranks, concurrent)
    if pl.nodes <= 1:
        return _intra_node_path(hw, ranks)
    return _nic_share(hw, pl, switch_hops(hw, ranks))


def _intra_node_path(hw: HardwareProfile, ranks: list[int]) -> GroupPath:
    """A ring inside one node: the GPU's NVLink port on an NVSwitch; on a direct-link mesh
    as many links as the group has rings (:mod:`parsim.cluster.nvlink_mesh`), or PCIe
    through the host where direct links cannot close one."""
    rings = hw.local_rings(ranks)
    if rings is None:
        return GroupPath("nvlink", hw.nvlink.effective_bandwidth, hw.nvlink.latency_s)
    if not rings:
        return GroupPath("pcie", hw.pcie.effective_bandwidth, hw.pcie.latency_s)
    return GroupPath("nvlink", len(rings) * hw.nvlink_link_bandwidth * hw.nvlink.efficiency, hw.nvlink.latency_s)


def algorithm_times(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int],
                    concurrent: int | None = None, measured: bool = True) -> dict[str, float]:
    """Modelled time of every algorithm that implements ``kind`` on this group.

    A group inside one node whose profile measured ``kind`` (``collective_fits``: nccl-tests on
    the GPU's NVLink, or ``parsim calibrate`` on this machine) is priced by the measurement,
    under the name of the algorithm the formulas would pick (the measurement is what the library
    ran; which algorithm that was, the formulas say). ``measured=False``: the formulas alone
    (the link as a transport other than the measured library sees it, e.g. Transformer
    Engine's userbuffers)."""
    n = len(ranks)
    if n <= 1 or nbytes <= 0:
        return {"ring": 0.0}
    pl = placement(hw, ranks, concurrent)
    line = node_line(hw, kind, nbytes, ranks) if measured else None
    if line is not None:
        formulas = algorithm_times(hw, kind, nbytes, ranks, concurrent, measured=False)
        return {min(formulas, key=formulas.get): ring_time(kind, nbytes, n, line)}
    flat = group_path(hw, ranks, concurrent)
    out = {"ring": alpha_beta_time(kind, nbytes, n, flat.bandwidth, flat.latency_s)}
    if kind in TREE_KINDS and n > 2 and pl.nodes > 1:  # NCCL's trees span nodes
        out["tree"] = alpha_beta_time(kind, nbytes, n, flat.bandwidth, flat.latency_s, "tree")
    if not isinstance(NVLS[kind], str) and pl.nodes == 1 and hw.nvls_bandwidth > 0 and n == hw.gpus_per_node:
        out["nvls"] = alpha_beta_time(kind, nbytes, n, hw.nvls_bandwidth, hw.nvlink.latency_s, "nvls")
    if kind in HIER_KINDS and pl.nodes > 1 and pl.per_node > 1 and n == pl.nodes * pl.per_node:
        local = [r for r in ranks if hw.node_of(r) == hw.node_of(ranks[0])]
        out["hierarchical"] = _hierarchical(hw, kind, nbytes, pl, switch_hops(hw, ranks), local)
    return out


def _hierarchical(hw: HardwareProfile, kind: str, nbytes: float, pl: GroupPlacement, hops: int,
                  local: list[int]) -> float:
    """Intra-node reduce-scatter / all-gather over NVLink (the ring ``local``, the group's
    ranks on one node, can run) + inter-node on S/g per rail."""
    g, k = pl.per_node, pl.nodes
    nv = _intra_node_path(hw, local)
    intra_kind = {"all_reduce": ("reduce_scatter", "all_gather"), "reduce_scatter": ("reduce_scatter",),
                  "all_gather": ("all_gather",)}[kind]
    intra = sum(alpha_beta_time(x, nbytes, g, nv.bandwidth, nv.latency_s) for x in intra_kind)
    # each local rank drives its own rail: one inter-node ring per local rank, NICs shared
    # by the gpus_per_node/g concurrent groups' rails (nics_per_node/gpus_per_node each)
    rail = GroupPlacement(k, k, 1, pl.leaves, pl.concurrent * g)
    inter = _nic_share(hw, rail, hops)
    return intra + alpha_beta_time(kind, nbytes / g, k, inter.bandwidth, inter.latency_s)


def fitted_line(hw: HardwareProfile, kind: str, nbytes: float, n: int) -> tuple[float, float] | None:
    """(per-step latency s, link bandwidth B/s) of ``kind`` of ``nbytes`` on n ranks from the
    profile's measured fits (``collective_fits``), the size's range; None when none was
    measured for this kind.

    A group size with no line of its own takes the line of the largest measured size below it
    (the smallest, when every measured one is larger): the lines are the ring formulas' terms,
    so a 16-GPU all-to-all inside an NVLink domain measured up to 4 GPUs pays its 15 steps at
    the 4-GPU call's per-step latency and moves its bytes at that call's link bandwidth."""
    fits = [f for f in getattr(hw, "collective_fits", ()) if f[0] == kind]
    if not fits:
        return None
    sizes = sorted({f[1] for f in fits})
    g = n if n in sizes else max((s for s in sizes if s < n), default=sizes[0])
    for _, _, max_bytes, alpha, beta in sorted(f for f in fits if f[1] == g):
        if nbytes <= max_bytes:
            return alpha, beta
    return None


def node_line(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int]) -> tuple[float, float] | None:
    """:func:`fitted_line` of a group inside one node (its collectives' measured line); None for a
    group across nodes, which the formulas price, or where nothing was measured."""
    if len({hw.node_of(r) for r in ranks}) > 1:
        return None
    return fitted_line(hw, kind, nbytes, len(ranks))


def ring_time(kind: str, nbytes: float, n: int, line: tuple[float, float]) -> float:
    """Seconds of ``kind`` of ``nbytes`` on n ranks at a measured line (per-step latency s, link
    bandwidth B/s) in the ring formula's terms."""
    alpha, beta = line
    return HOPS[kind](n) * alpha + BUSBW_FACTOR[kind](n) * nbytes / beta


def select_algorithm(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int],
                     concurrent: int | None = None) -> tuple[str, float]:
    """(algorithm, seconds): the fastest modelled algorithm, as NCCL's tuner picks."""
    times = algorithm_times(hw, kind, nbytes, ranks, concurrent)
    name = min(times, key=times.get)
    return name, times[name]


def link_time(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int]) -> float:
    """Time of one collective on the group by the formulas alone, whatever the profile measured
    of its collective library: a transport that is not that library (Transformer Engine's
    userbuffers, whose ring exchanges are point-to-point copies over NVLink)."""
    if len(ranks) <= 1:
        return 0.0
    return min(algorithm_times(hw, kind, nbytes, ranks, measured=False).values())


def collective_time(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int],
                    concurrent: int | None = None) -> float:
    """Time of one collective on the group ``ranks`` (NCCL-like algorithm selection)."""
    if len(ranks) <= 1:
        return 0.0
    return select_algorithm(hw, kind, nbytes, ranks, concurrent)[1]


def in_pass_time(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int] | tuple[int, ...], calls: int,
                 gap_s: float, base_s: float | None = None) -> float:
    """Seconds ``calls`` blocking ``kind`` collectives of ``nbytes`` cost a rank that computes
    ``gap_s`` on average before each of them (a block's F or B with its tensor- or
    expert-parallel collectives: the pass's compute over its calls). Where the profile measured
    how a call's in-situ cost grows with the compute before it (``HardwareProfile.collective_gaps``:
    gloo on CPU ranks, whose transport threads wake on cores the compute has held, and whose
    ranks arrive further apart after more work), ``calls`` x (the fitted time + slope x (gap -
    the reference gap the fit was timed at)), the gap clamped to the measured ones; with a
    linear slope the sum does not depend on how the pass's compute splits between its calls.
    Otherwise ``calls`` x :func:`collective_time` (``base_s``: that time, already known to the
    caller, e.g. memoised)."""
    if calls <= 0 or len(ranks) <= 1:
        return 0.0
    base = collective_time(hw, kind, nbytes, list(ranks)) if base_s is None else base_s
    return calls * at_gap(hw, kind, ranks, base, gap_s)


def at_gap(hw: HardwareProfile, kind: str, ranks: list[int] | tuple[int, ...], base_s: float, gap_s: float) -> float:
    """One blocking ``kind`` call on ``ranks`` after ``gap_s`` of compute, from ``base_s``, its
    time at the reference gap (:func:`in_pass_time`); ``base_s`` where the profile did not
    measure the dependence for this kind and group size."""
    for k, n, ref, lo, hi, slope in hw.collective_gaps:
        if k == kind and n == len(ranks) and placement(hw, list(ranks)).nodes <= 1:
            return max(FLOOR_S, base_s + slope * (min(hi, max(lo, gap_s)) - ref))
    return base_s


FLOOR_S = 1e-7
"""Least seconds one communication call is taken as (0.1 us): what :func:`at_gap` prices a call
at (a measured slope extrapolated to a short gap could otherwise come out at or below zero), and
what calibration takes a measured call as (``parsim.validate.bench``: an in-situ difference or an
exchange wait can come out at or below zero in the noise, and rows' spreads are log ratios)."""


def n_buckets(nbytes: float, bucket_bytes: float) -> int:
    """Buckets a gradient buffer of ``nbytes`` is reduced in (``bucket_bytes`` <= 0: one)."""
    if nbytes <= 0:
        return 0
    if bucket_bytes <= 0:
        return 1
    return max(1, math.ceil(nbytes / bucket_bytes))


def bucketed_time(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int], bucket_bytes: float,
                  concurrent: int | None = None) -> tuple[str, float, int]:
    """(algorithm, seconds, buckets): ``nbytes`` reduced as equal buckets of at most
    ``bucket_bytes``, one collective each, back to back (each pays its latency terms; the
    tuner picks the algorithm for the bucket's size). Equal buckets: a framework fills
    buckets in parameter order, so sizes differ by at most one layer's gradients."""
    nb = n_buckets(nbytes, bucket_bytes)
    if len(ranks) <= 1 or nb == 0:
        return "ring", 0.0, nb
    name, t = select_algorithm(hw, kind, nbytes / nb, ranks, concurrent)
    return name, nb * t, nb


def megatron_bucket_params(dp: int) -> float:
    """Megatron-core's default DDP bucket (``DistributedDataParallelConfig.bucket_size``):
    max(40M, 1M x dp) parameters, larger for larger dp so that buckets stay bandwidth-bound."""
    return max(40e6, 1e6 * dp)


DDP_BUCKET_BYTES = 25 * 2 ** 20
"""PyTorch DDP's default ``bucket_cap_mb`` = 25 (MiB)."""


def grad_bucket_bytes(bucket_bytes: float, dp: int, grad_bytes: int) -> float:
    """The gradient bucket in bytes: ``bucket_bytes`` (``overlap.bucket_bytes``) when > 0, else
    Megatron-core's default of max(40M, 1M x dp) parameters of ``grad_bytes``-byte gradients
    (the dtype they are reduced in: ``ParallelConfig.grad_bytes``)."""
    if bucket_bytes > 0:
        return float(bucket_bytes)
    return megatron_bucket_params(dp) * grad_bytes


def bytes_sent_per_rank(kind: str, nbytes: float, n: int) -> float:
    """Bytes one rank puts on the wire in the ring algorithm (the busbw factor times S)."""
    if n <= 1:
        return 0.0
    return BUSBW_FACTOR[kind](n) * nbytes


def parameter_server_time(hw: HardwareProfile, nbytes: float, ranks: list[int]) -> float:
    """DP through a parameter server: reduce to one rank, then broadcast back.

    The server's single link receives (n-1) gradients and sends (n-1) copies: the
    comparison point for the all-reduce (its time grows with n, the ring's does not).
    """
    n = len(ranks)
    if n <= 1:
        return 0.0
    path = group_path(hw, ranks)
    return 2 * (n - 1) * nbytes / path.bandwidth + 2 * path.latency_s
