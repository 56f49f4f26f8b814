"""Cost of collectives: alpha-beta models with nccl-tests' bus-bandwidth factors.

For a group of n ranks moving S bytes over a path of bandwidth B (bytes/s, effective)
and per-hop latency a:

  ring all-reduce       2(n-1)/n * S/B + 2(n-1) a      (busbw factor 2(n-1)/n)
  ring reduce-scatter   (n-1)/n * S/B + (n-1) a        (busbw factor (n-1)/n)
  ring all-gather       (n-1)/n * S/B + (n-1) a
  all-to-all            (n-1)/n * S/B + (n-1) a
  broadcast / reduce    S/B + (n-1) a  (pipelined ring; busbw factor 1)

S is the full buffer size (nccl-tests' convention: all-gather's S is the output).
A group whose ranks all sit in one node runs over NVLink; otherwise the slowest hop
is the NIC, shared by the GPUs of a node that talk across nodes at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hardware import HardwareProfile

BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}
# latency terms (number of sequential hops) of the ring algorithms
HOPS = {
    "all_reduce": lambda n: 2 * (n - 1),
    "reduce_scatter": lambda n: n - 1,
    "all_gather": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
    "broadcast": lambda n: n - 1,
    "reduce": lambda n: n - 1,
}


def alpha_beta_time(kind: str, nbytes: float, n: int, bandwidth: float, latency_s: float) -> float:
    """Ring-algorithm time of collective ``kind`` over n ranks (0 for n == 1)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return BUSBW_FACTOR[kind](n) * nbytes / bandwidth + HOPS[kind](n) * latency_s


def bus_bandwidth(kind: str, nbytes: float, n: int, seconds: float) -> float:
    """nccl-tests' busbw: algbw (S/t) times the collective's factor."""
    return nbytes / seconds * BUSBW_FACTOR[kind](n)


@dataclass(frozen=True)
class GroupPath:
    """The bottleneck path of a communication group on the topology."""

    name: str
    bandwidth: float
    latency_s: float


def group_path(hw: HardwareProfile, ranks: list[int]) -> GroupPath:
    """Bottleneck bandwidth/latency for a ring over ``ranks`` (global GPU indices)."""
    nodes = {r // hw.gpus_per_node for r in ranks}
    if len(nodes) <= 1:
        link = hw.nvlink
        return GroupPath("nvlink", link.effective_bandwidth, link.latency_s)
    # Across nodes each GPU sends through a NIC; with fewer NICs than GPUs, the GPUs of
    # a node that are in different groups at the same time share them (every group of
    # the same axis communicates at once, so all gpus_per_node GPUs are active).
    nic = hw.nic
    share = min(1.0, hw.nics_per_node / hw.gpus_per_node)
    bw = nic.effective_bandwidth * share
    if len(nodes) * hw.gpus_per_node > hw.gpus_per_leaf:
        bw /= max(1.0, hw.spine_oversubscription)
    return GroupPath("nic", bw, nic.latency_s + 2 * hw.switch_latency_s)


def collective_time(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int]) -> float:
    """Time of one collective on the group ``ranks``."""
    if len(ranks) <= 1:
        return 0.0
    path = group_path(hw, ranks)
    return alpha_beta_time(kind, nbytes, len(ranks), path.bandwidth, path.latency_s)
