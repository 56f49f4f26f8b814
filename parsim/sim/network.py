"""Cluster network: topology (links between GPUs) and a flow-level model of transfers.

Topology (:class:`Topology`, built from a :class:`~parsim.cluster.hardware.HardwareProfile`):
every GPU has an NVLink/NVSwitch port (one link per direction at the per-GPU port
bandwidth; the NVSwitch itself is non-blocking) and a PCIe link to the host; each GPU
drives its own NIC (rail-optimised: local GPU i uses NIC i·nics/gpus_per_node), NICs
plug into the leaf of their scalable unit (``gpus_per_leaf`` GPUs, non-blocking inside);
each leaf has one aggregate uplink/downlink to the spine whose bandwidth is the leaf's
NIC bandwidth divided by ``spine_oversubscription``.

Flows (:class:`FlowNetwork`): concurrent transfers share every link they cross under
max-min fairness (progressive filling). Whenever a flow starts or ends the rates are
recomputed and the next completion is scheduled as a SimPy event; a transfer completes
one path latency after its last byte left. Two flows on one link each get half of it:
each takes twice as long as it would alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from parsim.cluster.hardware import HardwareProfile


@dataclass
class Topology:
    """Links of a cluster of ``n_gpus`` GPUs and the route between any two of them."""

    hw: HardwareProfile
    n_gpus: int
    capacity: list[float] = field(default_factory=list)
    """Bytes/s of each link (index = link id)."""
    names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        hw, n = self.hw, self.n_gpus
        gpn = hw.gpus_per_node
        nodes = -(-n // gpn)
        self.n_nics = nodes * hw.nics_per_node
        leaves = -(-n // hw.gpus_per_leaf)
        self._ids: dict[tuple, int] = {}
        for g in range(n):
            self._add(("nv_up", g), hw.nvlink.effective_bandwidth)
            self._add(("nv_down", g), hw.nvlink.effective_bandwidth)
        for nic in range(self.n_nics):
            self._add(("nic_up", nic), hw.nic.effective_bandwidth)
            self._add(("nic_down", nic), hw.nic.effective_bandwidth)
        nics_per_leaf = hw.gpus_per_leaf // gpn * hw.nics_per_node
        spine_bw = nics_per_leaf * hw.nic.effective_bandwidth / max(1.0, hw.spine_oversubscription)
        for leaf in range(leaves):
            self._add(("leaf_up", leaf), spine_bw)
            self._add(("leaf_down", leaf), spine_bw)

    def _add(self, key: tuple, bw: float) -> None:
        self._ids[key] = len(self.capacity)
        self.capacity.append(bw)
        self.names.append(f"{key[0]}[{key[1]}]")

    def link(self, kind: str, index: int) -> int:
        """Link id of ``(kind, index)``, e.g. ``("nic_up", 3)``."""
        return self._ids[(kind, index)]

    def nic_of(self, gpu: int) -> int:
        hw = self.hw
        local = gpu % hw.gpus_per_node
        return hw.node_of(gpu) * hw.nics_per_node + local * hw.nics_per_node // hw.gpus_per_node

    def route(self, src: int, dst: int) -> tuple[list[int], float]:
        """(link ids, latency in seconds) of the path src -> dst."""
        hw = self.hw
        if src == dst:
            return [], 0.0
        if hw.node_of(src) == hw.node_of(dst):
            return [self._ids[("nv_up", src)], self._ids[("nv_down", dst)]], hw.nvlink.latency_s
        path = [self._ids[("nic_up", self.nic_of(src))]]
        hops = 1
        if hw.leaf_of(src) != hw.leaf_of(dst):
            hops = 3
            if hw.spine_oversubscription <= 1.0:
                # non-blocking: a leaf uplink carries at most its NICs' sum, never the bottleneck
                path.append(self._ids[("nic_down", self.nic_of(dst))])
                return path, hw.nic.latency_s + hops * hw.switch_latency_s
            path += [self._ids[("leaf_up", hw.leaf_of(src))], self._ids[("leaf_down", hw.leaf_of(dst))]]
            hops = 3
        path.append(self._ids[("nic_down", self.nic_of(dst))])
        return path, hw.nic.latency_s + hops * hw.switch_latency_s


@dataclass
class _Flow:
    links: tuple[int, ...]
    remaining: float
    latency_s: float
    done: simpy.Event
    rate: float = 0.0
    since: float = 0.0
    version: int = 0


def max_min_rates(flows: dict[int, tuple[int, ...]], capacity: list[float]) -> dict[int, float]:
    """Max-min fair rates (progressive filling) of flows given as id -> link ids."""
    rates: dict[int, float] = {}
    on_link: dict[int, set[int]] = {}
    for f, links in flows.items():
        if not links:
            rates[f] = float("inf")
        for lk in links:
            on_link.setdefault(lk, set()).add(f)
    cap = {lk: capacity[lk] for lk in on_link}
    while on_link:
        lk = min(on_link, key=lambda x: cap[x] / len(on_link[x]))
        share = cap[lk] / len(on_link[lk])
        for f in list(on_link[lk]):
            rates[f] = share
            for other in flows[f]:
                cap[other] -= share
                members = on_link.get(other)
                if members is not None:
                    members.discard(f)
                    if not members:
                        del on_link[other]
    return rates


class FlowNetwork:
    """Transfers as flows on shared links, max-min fair, driven by a SimPy environment.

    A start or a finish re-rates only the flows connected to it through shared links
    (its component); every other flow keeps its rate and its scheduled completion.
    """

    def __init__(self, env: simpy.Environment, capacity: list[float]):
        self.env = env
        self.capacity = capacity
        self.flows: dict[int, _Flow] = {}
        self.on_link: dict[int, set[int]] = {}
        self._next_id = 0
        self.bytes_on_link = [0.0] * len(capacity)

    def transfer(self, links: list[int], nbytes: float, latency_s: float = 0.0) -> simpy.Event:
        """Start a transfer now; the returned event fires when it has arrived."""
        done = self.env.event()
        if nbytes <= 0 or not links:
            self._fire_later(done, latency_s)
            return done
        fid = self._next_id
        self._next_id += 1
        self.flows[fid] = _Flow(tuple(links), float(nbytes), latency_s, done, since=self.env.now)
        for lk in links:
            self.bytes_on_link[lk] += nbytes
            self.on_link.setdefault(lk, set()).add(fid)
        self._rerate(links)
        return done

    def _fire_later(self, ev: simpy.Event, delay: float) -> None:
        if delay <= 0:
            ev.succeed()
        else:
            self.env.timeout(delay).callbacks.append(lambda _e: ev.succeed())

    def _component(self, links) -> dict[int, tuple[int, ...]]:
        seen_links, comp, todo = set(), {}, list(links)
        while todo:
            lk = todo.pop()
            if lk in seen_links:
                continue
            seen_links.add(lk)
            for f in self.on_link.get(lk, ()):
                if f not in comp:
                    comp[f] = self.flows[f].links
                    todo.extend(comp[f])
        return comp

    def _rerate(self, links) -> None:
        now = self.env.now
        comp = self._component(links)
        rates = max_min_rates(comp, self.capacity)
        for i, r in rates.items():
            f = self.flows[i]
            f.remaining -= f.rate * (now - f.since)
            f.since, f.rate = now, r
            f.version += 1
            v = f.version
            self.env.timeout(max(0.0, f.remaining) / r).callbacks.append(
                lambda _e, i=i, v=v: self._finish(i, v))

    def _finish(self, fid: int, version: int) -> None:
        f = self.flows.get(fid)
        if f is None or f.version != version:
            return  # re-rated since: a later timer owns it
        del self.flows[fid]
        for lk in f.links:
            members = self.on_link[lk]
            members.discard(fid)
            if not members:
                del self.on_link[lk]
        self._fire_later(f.done, f.latency_s)
        self._rerate(f.links)
