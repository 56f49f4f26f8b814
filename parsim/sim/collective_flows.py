"""A collective as phases of point-to-point flows: what full mode puts on the shared network.

Fast mode charges a data-parallel collective the time of the algorithm NCCL's tuner would
pick (:func:`parsim.cluster.collectives.select_algorithm`: ring, tree, hierarchical or
NVLS, with the node's NICs shared by the concurrent groups of the same axis). Full mode
asks the same function which algorithm runs, then moves its bytes as flows on the
:class:`~parsim.sim.network.Topology`, so that other traffic can slow it down. Each
phase's flows are laid out so that, with the concurrent groups fast mode assumes and
nothing else on the network, the phase takes exactly the bandwidth term of fast mode's
formula; the latency term (alpha) is the formula's own, paid once the flows are done.

* ring and tree (the same bandwidth term; tree differs in latency): every rank sends the
  ring's bytes per rank (busbw factor x S) to its successor. The ring visits the group
  node by node; where it crosses from one node to the next, NCCL's channels cross on
  different GPUs, so the crossing is spread over the group's ranks on the node: one flow
  per rank, each rank on its own NIC, carrying 1/g of the bytes (g ranks of the group on
  that node). That is fast mode's "node NICs split over the concurrent groups".
* hierarchical: intra-node ring (reduce-scatter) over NVLink, then one inter-node ring
  per local rank on S/g bytes, each on that rank's own rail (NIC), then an intra-node
  all-gather: the three terms of fast mode's formula, as three phases.
* NVLS (all-reduce, reduce-scatter, all-gather in the NVSwitch): each GPU's port carries
  f x S through the switch at the NVLS algorithm bandwidth (f = 1 for all-reduce, 1/2 for
  its halves, ``parsim.cluster.collectives.NVLS``); its flow is sized (f x S x port
  bandwidth / NVLS bandwidth) so that alone it holds the port for f x S / B_nvls.
* measured (a group inside one node whose profile carries a fitted line for the kind,
  ``parsim.cluster.collectives.node_line``): the ring's flows, each sized (S' x port
  bandwidth / the line's bandwidth) so that alone it holds the port for the line's bandwidth
  term; the line's latency term after them.
* buckets (``n_buckets`` > 1, gradient reduction): the algorithm is the one picked for one
  bucket; the flows carry all buckets' bytes (the bandwidth term is linear in bytes) and
  the latency term is paid once per bucket, as fast mode's :func:`bucketed_time` sums it.
* parameter server (``parallel.dp_comm``): every worker pushes S to the group's first
  rank, then pulls S back from it.

Where the two modes still part without contention: a ring crossing leaf switches over an
oversubscribed spine (fast mode divides the whole ring's bandwidth by the
oversubscription; here only the flows that cross the spine share its uplinks).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from parsim.cluster.collectives import (
    BUSBW_FACTOR,
    NVLS,
    HOPS,
    alpha_beta_time,
    group_path,
    node_line,
    parameter_server_time,
    select_algorithm,
)
from parsim.cluster.hardware import HardwareProfile


@dataclass(frozen=True)
class Phase:
    """Flows that run together; the next phase starts once they have all arrived."""

    flows: tuple[tuple[int, int, float], ...]
    """(source GPU, destination GPU, bytes) of every flow of the phase."""
    latency_s: float
    """The phase's latency term (the alpha-beta formula's sequential steps), paid after its flows."""


@dataclass(frozen=True)
class CollectivePlan:
    """One collective of one group, as full mode runs it."""

    algorithm: str
    """What fast mode's selection picked: ring | tree | hierarchical | nvls | parameter_server."""
    phases: tuple[Phase, ...]
    """In order; empty when there is nothing to move (one rank, no bytes)."""
    time_s: float
    """Fast mode's time for the same collective (its concurrent groups running too)."""


def _no_latency(kind: str, nbytes: float, n: int, latency_s: float, algorithm: str = "ring") -> float:
    """The latency term alone of the alpha-beta formula (its bandwidth term is the flows')."""
    return alpha_beta_time(kind, nbytes, n, math.inf, latency_s, algorithm)


def _by_node(hw: HardwareProfile, ranks: list[int]) -> list[list[int]]:
    """The group's ranks per node, nodes in order of first appearance (the ring's order)."""
    nodes: dict[int, list[int]] = {}
    for r in ranks:
        nodes.setdefault(hw.node_of(r), []).append(r)
    return list(nodes.values())


def _ring_flows(hw: HardwareProfile, ranks: list[int], per_rank: float) -> tuple[tuple[int, int, float], ...]:
    """One ring over the group, node by node, each node crossing spread over the node's ranks;
    inside one node of a direct-link mesh, the rings its links close, each a share."""
    rings = hw.local_rings(ranks)
    if rings:
        base = ranks[0] - ranks[0] % hw.gpus_per_node
        return tuple((base + a, base + b, per_rank / len(rings))
                     for ring in rings for a, b in zip(ring, ring[1:] + ring[:1]))
    nodes = _by_node(hw, ranks)
    flows = []
    for j, members in enumerate(nodes):
        flows += [(a, b, per_rank) for a, b in zip(members, members[1:])]  # inside the node: NVLink
        nxt = nodes[(j + 1) % len(nodes)]
        if nxt is members:  # one node: the ring closes on NVLink
            if len(members) > 1:
                flows.append((members[-1], members[0], per_rank))
            continue
        g = len(members)
        flows += [(a, nxt[i % len(nxt)], per_rank / g) for i, a in enumerate(members)]
    return tuple(flows)


def _intra(hw: HardwareProfile, kind: str, nbytes: float, nodes: list[list[int]]) -> Phase:
    g = len(nodes[0])
    per_rank = BUSBW_FACTOR[kind](g) * nbytes
    flows = tuple(f for members in nodes for f in _ring_flows(hw, members, per_rank))
    return Phase(flows, _no_latency(kind, nbytes, g, hw.nvlink.latency_s))


def _hierarchical(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int]) -> tuple[Phase, ...]:
    nodes = _by_node(hw, ranks)
    g, k = len(nodes[0]), len(nodes)
    rails = [[members[i] for members in nodes] for i in range(g)]  # local rank i of every node
    per_rank = BUSBW_FACTOR[kind](k) * nbytes / g
    inter_lat = group_path(hw, rails[0]).latency_s
    inter = Phase(tuple(f for rail in rails for f in _ring_flows(hw, rail, per_rank)),
                  _no_latency(kind, nbytes / g, k, inter_lat))
    phases = []
    if kind in ("all_reduce", "reduce_scatter"):
        phases.append(_intra(hw, "reduce_scatter", nbytes, nodes))
    phases.append(inter)
    if kind in ("all_reduce", "all_gather"):
        phases.append(_intra(hw, "all_gather", nbytes, nodes))
    return tuple(phases)


def _bucketed(plan: CollectivePlan, nb: int) -> CollectivePlan:
    """``plan`` (of one bucket) for ``nb`` buckets: flows x nb bytes, latency x nb."""
    if nb == 1:
        return plan
    phases = tuple(Phase(tuple((a, b, x * nb) for a, b, x in ph.flows), ph.latency_s * nb) for ph in plan.phases)
    return CollectivePlan(plan.algorithm, phases, plan.time_s * nb)


@lru_cache(maxsize=4096)
def _plan(hw: HardwareProfile, kind: str, nbytes: float, ranks: tuple[int, ...]) -> CollectivePlan:
    group = list(ranks)
    if len(group) <= 1 or nbytes <= 0:
        return CollectivePlan("ring", (), 0.0)
    algorithm, t = select_algorithm(hw, kind, nbytes, group)  # the one selection fast mode uses
    path = group_path(hw, group)
    line = node_line(hw, kind, nbytes, group)
    if line is not None:  # priced by the profile's measured line: the ring's flows at its bandwidth
        alpha, beta = line
        flows = _ring_flows(hw, group, BUSBW_FACTOR[kind](len(group)) * nbytes * path.bandwidth / beta)
        return CollectivePlan(algorithm, (Phase(flows, HOPS[kind](len(group)) * alpha),), t)
    if algorithm == "hierarchical":
        return CollectivePlan(algorithm, _hierarchical(hw, kind, nbytes, group), t)
    if algorithm == "nvls":
        scale = NVLS[kind][0] * hw.nvlink.effective_bandwidth / hw.nvls_bandwidth
        flows = tuple((a, group[(i + 1) % len(group)], nbytes * scale) for i, a in enumerate(group))
        return CollectivePlan(algorithm, (Phase(flows, _no_latency(kind, nbytes, len(group),
                                                                    hw.nvlink.latency_s, "nvls")),), t)
    flows = _ring_flows(hw, group, BUSBW_FACTOR[kind](len(group)) * nbytes)
    return CollectivePlan(algorithm, (Phase(flows, _no_latency(kind, nbytes, len(group), path.latency_s,
                                                               algorithm)),), t)


def plan_collective(hw: HardwareProfile, kind: str, nbytes: float, ranks: list[int],
                    n_buckets: int = 1) -> CollectivePlan:
    """``kind`` of ``nbytes`` (nccl-tests' S) over ``ranks`` (global GPU ids), as phases of
    flows; ``n_buckets``: in that many equal buckets, one collective each."""
    nb = max(1, n_buckets)
    return _bucketed(_plan(hw, kind, float(nbytes) / nb, tuple(ranks)), nb)


def plan_parameter_server(hw: HardwareProfile, nbytes: float, ranks: list[int]) -> CollectivePlan:
    """Push S from every worker to ``ranks[0]``, then pull S back (parallel.dp_comm =
    "parameter_server"; fast mode: ``parameter_server_time``)."""
    if len(ranks) <= 1 or nbytes <= 0:
        return CollectivePlan("parameter_server", (), 0.0)
    server, workers = ranks[0], ranks[1:]
    lat = group_path(hw, ranks).latency_s
    push = Phase(tuple((w, server, float(nbytes)) for w in workers), lat)
    pull = Phase(tuple((server, w, float(nbytes)) for w in workers), lat)
    return CollectivePlan("parameter_server", (push, pull), parameter_server_time(hw, nbytes, ranks))
