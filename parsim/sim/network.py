"""Cluster network: topology (links between GPUs) and a flow-level model of transfers.

Topology (:class:`Topology`, built from a :class:`~parsim.cluster.hardware.HardwareProfile`):
every GPU has an NVLink/NVSwitch port (one link per direction at the per-GPU port
bandwidth; the NVSwitch itself is non-blocking) and a PCIe link to the host; each GPU
drives its own NIC (rail-optimised: local GPU i uses NIC i·nics/gpus_per_node), NICs
plug into the leaf of their scalable unit (``gpus_per_leaf`` GPUs, non-blocking inside);
each leaf has one aggregate uplink/downlink to the spine whose bandwidth is the leaf's
NIC bandwidth divided by ``spine_oversubscription``. GPUs wired to each other directly
(``node.nvlink_links``: DGX-1, p3.16xlarge) have, in place of the port, one link per ordered
pair of a node's GPUs carrying the NVLink links between them (PCIe through the host where
there are none).

Flows (:class:`FlowNetwork`): concurrent transfers share every link they cross under
max-min fairness (progressive filling). Two flows on one link each get half of it: each
takes twice as long as it would alone. The cost of a change is kept to what it touches:

* a start or a finish re-rates only the flows connected to it through shared links (its
  component); every other flow keeps its rate and its completion time;
* flows started at one instant are rated together, once (a collective's thousand ring
  flows, every replica's send in the same microsecond), and flows finishing at one
  instant are retired together, once;
* a re-rated flow whose rate did not change keeps its completion time (no new timer);
* completions are kept in one heap with one SimPy timer armed at the earliest, rather
  than one SimPy event per flow per re-rating.

The result is the same max-min allocation at every instant as re-computing it over
all flows whenever any flow starts or ends (``tests/test_network.py`` checks it against
that brute force on random networks).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import simpy

from parsim.cluster.hardware import HardwareProfile

_KINDS = ("nv_up", "nv_down", "nic_up", "nic_down", "leaf_up", "leaf_down")


@dataclass
class Topology:
    """Links of a cluster of ``n_gpus`` GPUs and the route between any two of them.

    Link ids are arithmetic (GPU g's NVLink port: 2g up, 2g+1 down; then the NICs, then
    the leaves' spine links), so a 131,072-GPU cluster costs a list of capacities, not a
    table of names: names are made when asked for.
    """

    hw: HardwareProfile
    n_gpus: int
    capacity: list[float] = field(default_factory=list)
    """Bytes/s of each link (index = link id)."""
    names: _LinkNames | None = None
    """``names[link]``: the link as ``kind[index]``, e.g. ``nic_up[3]``."""
    nic_scale: dict[int, float] = field(default_factory=dict)
    """NIC -> fraction of its bandwidth it has (a degraded NIC; ``[stragglers] nics``)."""
    nic_reroute: dict[int, int] = field(default_factory=dict)
    """Failed NIC -> the NIC its GPUs' traffic goes through instead (``[stragglers] failed_nics``)."""

    def __post_init__(self) -> None:
        hw, n = self.hw, self.n_gpus
        gpn = hw.gpus_per_node
        nodes = -(-n // gpn)
        self.n_nics = nodes * hw.nics_per_node
        self.n_leaves = -(-n // hw.gpus_per_leaf)
        self._first = (0, 0, 2 * n, 2 * n, 2 * n + 2 * self.n_nics, 2 * n + 2 * self.n_nics)
        """First link id of each of _KINDS (up and down interleaved: +0 up, +1 down)."""
        self._count = (n, n, self.n_nics, self.n_nics, self.n_leaves, self.n_leaves)
        self._routes: dict[tuple[int, int], tuple[list[int], float]] = {}
        nics_per_leaf = hw.gpus_per_leaf // gpn * hw.nics_per_node
        spine_bw = nics_per_leaf * hw.nic.effective_bandwidth / max(1.0, hw.spine_oversubscription)
        self.capacity = ([hw.nvlink.effective_bandwidth] * (2 * n) + [hw.nic.effective_bandwidth] * (2 * self.n_nics)
                         + [spine_bw] * (2 * self.n_leaves))
        for nic, f in self.nic_scale.items():  # both directions of a degraded NIC
            for k in (0, 1):
                self.capacity[self._first[2] + 2 * nic + k] *= f
        self._pair0 = len(self.capacity)
        """First of the directed GPU-pair links of a direct-link mesh (none on an NVSwitch)."""
        if hw.nvlink_links is not None:  # a pair has its own links (or PCIe through the host)
            per_link = hw.nvlink_link_bandwidth * hw.nvlink.efficiency
            self.capacity += [hw.nvlink_links[a][b] * per_link or hw.pcie.effective_bandwidth
                              for _ in range(nodes) for a in range(gpn) for b in range(gpn)]
        self.names = _LinkNames(self._first, len(self.capacity), self._pair0 if hw.nvlink_links is not None else None,
                                gpn)

    def link(self, kind: str, index: int) -> int:
        """Link id of ``(kind, index)``, e.g. ``("nic_up", 3)``."""
        k = _KINDS.index(kind)
        if not 0 <= index < self._count[k]:
            raise KeyError((kind, index))
        return self._first[k] + 2 * index + k % 2

    def name(self, link: int) -> str:
        """``kind[index]`` of a link id."""
        return self.names[link]

    def nic_of(self, gpu: int) -> int:
        hw = self.hw
        local = gpu % hw.gpus_per_node
        nic = hw.node_of(gpu) * hw.nics_per_node + local * hw.nics_per_node // hw.gpus_per_node
        return self.nic_reroute.get(nic, nic) if self.nic_reroute else nic

    def route(self, src: int, dst: int) -> tuple[list[int], float]:
        """(link ids, latency in seconds) of the path src -> dst (memoised: a job reuses a
        few routes per GPU thousands of times)."""
        r = self._routes.get((src, dst))
        if r is None:
            r = self._routes[(src, dst)] = self._route(src, dst)
        return r

    def _route(self, src: int, dst: int) -> tuple[list[int], float]:
        hw = self.hw
        if src == dst:
            return [], 0.0
        if hw.node_of(src) == hw.node_of(dst):
            if hw.nvlink_links is None:
                return [2 * src, 2 * dst + 1], hw.nvlink.latency_s
            gpn = hw.gpus_per_node
            node, a, b = hw.node_of(src), src % gpn, dst % gpn
            lat = hw.nvlink.latency_s if hw.nvlink_links[a][b] else hw.pcie.latency_s
            return [self._pair0 + (node * gpn + a) * gpn + b], lat
        nic0 = self._first[2]
        path = [nic0 + 2 * self.nic_of(src)]
        hops = 1
        if hw.leaf_of(src) != hw.leaf_of(dst):
            hops = 3
            if hw.spine_oversubscription <= 1.0:
                # non-blocking: a leaf uplink carries at most its NICs' sum, never the bottleneck
                path.append(nic0 + 2 * self.nic_of(dst) + 1)
                return path, hw.nic.latency_s + hops * hw.switch_latency_s
            leaf0 = self._first[4]
            path += [leaf0 + 2 * hw.leaf_of(src), leaf0 + 2 * hw.leaf_of(dst) + 1]
        path.append(nic0 + 2 * self.nic_of(dst) + 1)
        return path, hw.nic.latency_s + hops * hw.switch_latency_s

    def block_capacity(self, block: int) -> list[float] | None:
        """Link capacities of the network in which the first GPU of every aligned block of
        ``block`` consecutive GPUs stands for the whole block; None where that is not exact.

        It is exact when shifting every GPU by one place inside its block (cyclically) maps
        the topology onto itself: blocks inside one node, and each block's GPUs either on
        NICs of their own or all on one NIC. A traffic pattern that the same shift maps
        onto itself (full mode's: every TP rank sends its own copy of each flow to the same
        TP rank elsewhere) then has a max-min allocation the shift leaves unchanged (it is
        unique), so the block's ``block`` flows all run at the representative's rate. On a
        link of the representative's own (its NVLink port, its own NIC) only the
        representative's flow is counted, as it should; a link every GPU of the block
        crosses (a NIC they share, a leaf's spine links) carries ``block`` such flows,
        so it offers the representative ``capacity / block``.
        """
        hw = self.hw
        gpn, nics = hw.gpus_per_node, hw.nics_per_node
        cap = list(self.capacity)
        if block <= 1:
            return cap
        if gpn % block or hw.nvlink_links is not None:  # a mesh's pairs differ: no shift maps it onto itself
            return None
        for start in range(0, gpn, block):
            on = {i * nics // gpn for i in range(start, start + block)}
            if len(on) == 1:
                continue  # the block shares one NIC: the shift leaves it in place
            if len(on) < block or nics < gpn:
                return None  # some GPUs of the block share a NIC and others do not
        shared_from = self._first[2] if nics < gpn else self._first[4]  # shared NICs, leaves
        cap[shared_from:] = [c / block for c in cap[shared_from:]]
        return cap


def _link_name(first: tuple[int, ...], link: int, pair0: int | None = None, gpn: int = 1) -> str:
    if pair0 is not None and link >= pair0:
        node, rest = divmod(link - pair0, gpn * gpn)
        a, b = divmod(rest, gpn)
        return f"nv_pair[{node * gpn + a}->{node * gpn + b}]"
    for k in (4, 2, 0):
        if link >= first[k]:
            off = link - first[k]
            return f"{_KINDS[k + off % 2]}[{off // 2}]"
    raise IndexError(link)


class _LinkNames:
    """``names[link]`` without a table of strings (and without a reference back to the
    topology: no cycle for the garbage collector to find)."""

    def __init__(self, first: tuple[int, ...], n_links: int, pair0: int | None = None, gpn: int = 1):
        self._first, self._n = first, n_links
        self._pair0, self._gpn = pair0, gpn  # pair0: first directed GPU-pair link (None: no mesh)

    def __getitem__(self, link: int) -> str:
        if not 0 <= link < self._n:
            raise IndexError(link)
        return _link_name(self._first, link, self._pair0, self._gpn)

    def __len__(self) -> int:
        return self._n


def max_min_rates(flows: dict[int, tuple[int, ...]], capacity: list[float]) -> dict[int, float]:
    """Max-min fair rates (progressive filling) of flows given as id -> link ids.

    The link offering the smallest fair share (remaining capacity / flows not yet fixed)
    fixes its flows at that share; their rate is taken off every other link they cross.
    A heap of shares keeps this O((flows x hops + links) log links) rather than a scan of
    every link per round (a large component: an oversubscribed spine links everything).
    """
    rates: dict[int, float] = {}
    on_link: dict[int, list[int]] = {}
    for f, links in flows.items():
        if not links:
            rates[f] = math.inf
        for lk in links:
            members = on_link.get(lk)
            if members is None:
                on_link[lk] = [f]
            else:
                members.append(f)
    cap = {lk: capacity[lk] for lk in on_link}
    left = {lk: len(m) for lk, m in on_link.items()}
    heap = [(cap[lk] / n, lk) for lk, n in left.items()]
    heapq.heapify(heap)
    while heap:
        share, lk = heapq.heappop(heap)
        n = left.get(lk)
        if n is None or share != cap[lk] / n:
            continue  # stale entry: the link's share changed since (a newer entry holds it)
        del left[lk]
        for f in on_link[lk]:
            if f in rates:
                continue
            rates[f] = share
            for other in flows[f]:
                m = left.get(other)
                if m is None:
                    continue
                cap[other] -= share
                if m == 1:
                    del left[other]
                else:
                    left[other] = m - 1
                    heapq.heappush(heap, (cap[other] / (m - 1), other))
    return rates


class _Flow:
    """One transfer in flight (slots: millions of these go through a large job)."""

    __slots__ = ("links", "remaining", "rate", "since", "finish", "batch")

    def __init__(self, links: tuple[int, ...], nbytes: float, now: float, batch: _Batch):
        self.links = links
        self.remaining = nbytes   # bytes left at ``since``
        self.rate = 0.0           # bytes/s since ``since`` (0: not rated yet)
        self.since = now
        self.finish = math.inf    # when the last byte leaves at this rate
        self.batch = batch


class _Batch:
    """Flows started by one call: its event fires when the last of them is done."""

    __slots__ = ("left", "done")

    def __init__(self, done: simpy.Event):
        self.left = 0
        self.done = done


@dataclass
class NetworkStats:
    """What a run of the flow model did (reported by benchmarks/bench_fullmode.py)."""

    flows: int = 0
    """Flows started (a transfer of zero bytes or over no link is not a flow)."""
    components: int = 0
    """Re-ratings: max-min computations over one connected set of flows."""
    rated: int = 0
    """Flow rates computed over all re-ratings (the work of the max-min computations)."""


class FlowNetwork:
    """Transfers as flows on shared links, max-min fair, driven by a SimPy environment."""

    def __init__(self, env: simpy.Environment, capacity: list[float]):
        self.env = env
        self.capacity = capacity
        self.flows: dict[int, _Flow] = {}
        self.on_link: dict[int, set[int]] = {}
        self.stats = NetworkStats()
        self._next_id = 0
        self._due: list[tuple[float, int]] = []     # (finish, flow id); stale when the flow's finish moved
        self._alarms: list[tuple[float, int]] = []  # SimPy timers pending: (time, serial)
        self._serial = 0
        self._dirty: list[int] = []                 # links whose flows must be re-rated at this instant
        self._flush_pending = False

    def transfer(self, links: list[int], nbytes: float, latency_s: float = 0.0) -> simpy.Event:
        """Start a transfer now; the returned event fires when it has arrived."""
        done = self.start(((links, nbytes),))
        if latency_s <= 0:
            return done
        arrived = self.env.event()
        done.callbacks.append(lambda _e: self.env.timeout(latency_s).callbacks.append(
            lambda _t: arrived.succeed()))
        return arrived

    def start(self, transfers) -> simpy.Event:
        """Start transfers ``(links, bytes)`` now; the event fires when the last byte of the
        last of them has left (latency is the caller's: it differs per path)."""
        env = self.env
        done = env.event()
        batch = _Batch(done)
        now = env.now
        flows, on_link, dirty = self.flows, self.on_link, self._dirty
        fid = self._next_id
        for links, nbytes in transfers:
            if nbytes <= 0 or not links:
                continue
            links = tuple(links)
            flows[fid] = _Flow(links, float(nbytes), now, batch)
            for lk in links:
                members = on_link.get(lk)
                if members is None:
                    on_link[lk] = {fid}
                else:
                    members.add(fid)
            dirty.extend(links)
            batch.left += 1
            fid += 1
        self.stats.flows += fid - self._next_id
        self._next_id = fid
        if batch.left == 0:
            done.succeed()
        elif not self._flush_pending:
            # rate everything started at this instant together, after the processes now due ran
            self._flush_pending = True
            ev = env.event()
            ev.callbacks.append(self._flush)
            ev.succeed()
        return done

    def _flush(self, _ev=None) -> None:
        self._flush_pending = False
        links, self._dirty = self._dirty, []
        if links:
            self._rerate(links)

    def _components(self, links):
        """The connected sets of flows reachable from ``links`` through shared links, one at a
        time (id -> links): each is rated on its own, most of them a single flow."""
        flows, on_link = self.flows, self.on_link
        seen_links, seen = set(), set()
        for seed in links:
            if seed in seen_links:
                continue
            comp, todo = {}, [seed]
            while todo:
                lk = todo.pop()
                if lk in seen_links:
                    continue
                seen_links.add(lk)
                for f in on_link.get(lk, ()):
                    if f not in seen:
                        seen.add(f)
                        comp[f] = ls = flows[f].links
                        todo.extend(ls)
            if comp:
                yield comp

    def _rerate(self, links) -> None:
        now = self.env.now
        st, cap = self.stats, self.capacity
        flows, due = self.flows, self._due
        first = math.inf
        for comp in self._components(links):
            st.components += 1
            st.rated += len(comp)
            if len(comp) == 1:  # alone on its links: the slowest of them
                (fid, ls), = comp.items()
                rates = ((fid, min([cap[lk] for lk in ls])),)
            else:
                rates = max_min_rates(comp, cap).items()
            for fid, r in rates:
                f = flows[fid]
                if r == f.rate:
                    continue  # same rate: the same completion time, already in the heap
                if f.rate:
                    f.remaining -= f.rate * (now - f.since)
                f.since, f.rate = now, r
                f.finish = t = now + max(0.0, f.remaining) / r
                heapq.heappush(due, (t, fid))
                if t < first:
                    first = t
        if first < math.inf:
            self._arm(first)

    def _arm(self, t: float) -> None:
        """Make sure a timer fires at ``t`` (one already pending at or before ``t`` will do:
        it re-arms for the next completion when it fires)."""
        if self._alarms and self._alarms[0][0] <= t:
            return
        self._serial += 1
        key = (t, self._serial)
        heapq.heappush(self._alarms, key)
        self.env.timeout(max(0.0, t - self.env.now)).callbacks.append(lambda _e: self._ring(key))

    def _ring(self, key: tuple[float, int]) -> None:
        """A timer fired: retire every flow done by its time, re-rate what they leave."""
        alarms = self._alarms
        if alarms[0] == key:
            heapq.heappop(alarms)
        else:  # rounding let a later-armed, earlier timer fire second: drop this one by hand
            alarms.remove(key)
            heapq.heapify(alarms)
        t = key[0]
        flows, on_link, due = self.flows, self.on_link, self._due
        freed = self._dirty
        n = 0
        while due and due[0][0] <= t:
            ft, fid = heapq.heappop(due)
            f = flows.get(fid)
            if f is None or f.finish != ft:
                continue  # re-rated since: a later entry holds it
            del flows[fid]
            n += 1
            for lk in f.links:
                members = on_link[lk]
                members.discard(fid)
                if not members:
                    del on_link[lk]
            freed.extend(f.links)
            b = f.batch
            b.left -= 1
            if b.left == 0:
                b.done.succeed()
        if n:
            self._flush()
        while due and (due[0][1] not in flows or flows[due[0][1]].finish != due[0][0]):
            heapq.heappop(due)
        if due:
            self._arm(due[0][0])
