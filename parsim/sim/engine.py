"""SimPy interpreter of a lowered schedule.

The kernel is domain-free: it knows ranks, streams, links, actions, durations and
byte counts, never transformers. Everything it needs about cost comes through a
:class:`CostTable` (seconds and bytes per (stage, op)); everything it produces is a
list of span rows and memory events, from which ``parsim.results`` derives metrics.

Semantics (the same the torch runtime implements):

* each rank walks its action list in order; compute actions (F, B, I, W, STEP) run on
  the rank's compute stream and block the walk;
* ``SEND_*`` is non-blocking: the transfer starts when issued, occupies the link for
  bytes/bandwidth and arrives one latency later (a cost table with ``blocking_p2p`` true,
  ``[overlap] p2p = false``, makes the sender's compute wait until it has arrived);
* a cost table with ``send_post_s(bytes)`` (a CPU rank's gloo ``isend``, whose caller thread
  writes into the socket: ``HardwareProfile.send_post_time``) holds the sender's compute that
  long after each send (a ``post`` span); the transfer's own timing is unchanged, since the link's
  calibrated time runs from the call;
* ``RECV_*`` posts a receive; the compute action that consumes the data waits for it;
* ``REDUCE_GRAD`` and ``UNSHARD`` run asynchronously on the rank's data-parallel
  stream (one collective at a time per stream); STEP waits for its stage's
  REDUCE_GRAD (the last one when they run per microbatch: the stream is in order),
  compute of a stage waits for its pending UNSHARD;
* memory: F stashes activations until the matching backward frees them; each
  action may hold transient bytes while it runs.
* ``OVERLAP_F_B`` (DualPipe): one compute that waits for the F part's input and the
  B part's output-gradient, lasts ``costs.overlap_cost(f, b)`` (F + B when the cost
  table has no such method), and is recorded as two back-to-back spans (its F, then
  its B) splitting that duration in proportion to their own costs.
* chains (``schedule.n_chains > 1``): a stage's producer/consumer is
  ``schedule.prev_stage``/``next_stage``, not s -/+ 1.
* a cost table with ``fresh_per_action = True`` (``parsim.uncertainty.sampled``: durations
  drawn per action) is asked for every action's cost; otherwise once per (stage, op) and rank.
* a cost table with ``dp_core_share`` = s > 0 (a CPU rank whose transport threads share its
  core: ``Device.transport_core_share``): compute progresses at ``1 - s`` of its rate while the
  rank's dp stream is busy (the collectives issued before it), so it ends later by ``s`` times
  the overlap, up to the whole of it at s = 1; the collective's own time is unchanged.
* token slices (``schedule.n_slices > 1``, TeraPipe): units differ in cost, so a cost table
  with ``unit_cost(stage, op, unit)`` / ``unit_p2p_bytes(stage, op, unit)`` answers F/B/I/W
  and the sends per action index (``parsim.costs.slices``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import simpy

from parsim.schedule.coverage import Coverage
from parsim.schedule.ir import Action, Op, Schedule

COVERAGE = Coverage("fast engine")
"""Every op and every schedule trait (weight versions, re-materialisation and chains reach
it through the cost table and ``Schedule.prev_stage``/``next_stage``; token slices through
``unit_cost``). AMPNet's order is an output of its own engine (``parsim.sim.ampnet``); a
realized AMPNet order replays here like any other (tests/test_ampnet.py)."""
COMPUTE_OPS = frozenset({Op.F, Op.B, Op.I, Op.W, Op.STEP, Op.OVERLAP_F_B})
BACKWARD_OPS = frozenset({Op.B, Op.I})
UNIT_OPS = frozenset({Op.F, Op.B, Op.I, Op.W})
"""Ops whose cost a token-sliced cost table gives per unit."""


@dataclass(frozen=True)
class OpCost:
    """What one action costs; the engine's only input about the workload."""

    duration_s: float
    """Time the action occupies its stream."""
    bytes: float = 0.0
    """Bytes moved (communication actions)."""
    stash_bytes: float = 0.0
    """Bytes allocated at the start and kept after the end (F: the activation stash)."""
    free_bytes: float = 0.0
    """Bytes released at the end (B/I/W: the stash of the forward they consume)."""
    transient_bytes: float = 0.0
    """Bytes alive only while the action runs (workspace, recomputed activations)."""
    mem_kind: str = "activations"
    """Memory category of stash/free/transient bytes (activations | other)."""
    then_comm_s: float = 0.0
    """Asynchronous collective launched on the dp stream when the action ends (ZeRO param all-gather after STEP)."""
    then_comm_bytes: float = 0.0
    """Bytes of that collective."""
    lead_s: float = 0.0
    """REDUCE_GRAD per microbatch: how long before it is issued (the end of its backward) its
    first buckets may start on the dp stream (the part of the backward it hides under)."""
    tail_s: float = 0.0
    """REDUCE_GRAD per microbatch: what of it runs after its backward ends at least (the last bucket)."""
    wait_s: float | None = None
    """UNSHARD: the part of ``duration_s`` its stage's compute waits for (ZeRO-3/FSDP's
    prefetched per-unit gathers hide the rest under that compute); None: all of it."""
    phases: tuple = ()
    """Compute ops: work on other streams this op drives (offload transfers, CPU-Adam), as
    (stream, name, offset from the op's start in s, duration s, bytes); recorded as spans."""


@dataclass
class Link:
    """A unidirectional point-to-point path; concurrent transfers queue FIFO on it."""

    name: str
    bandwidth: float
    """Bytes per second (effective)."""
    latency_s: float
    free_at: float = 0.0

    def transfer(self, now: float, nbytes: float) -> tuple[float, float]:
        """Start and arrival time of a transfer issued at ``now``."""
        start = max(now, self.free_at)
        occupy = nbytes / self.bandwidth if self.bandwidth > 0 else 0.0
        self.free_at = start + occupy
        return start, start + occupy + self.latency_s


class CostTable(Protocol):
    def op_cost(self, stage: int, op: Op) -> OpCost: ...
    def p2p_bytes(self, stage: int, op: Op) -> float: ...
    def link_spec(self, src_rank: int, dst_rank: int) -> tuple[str, float, float]:
        """(name, effective bandwidth B/s, latency s) of the path between two pipeline ranks."""
        ...


@dataclass
class RawTimeline:
    """Columnar output of one run: span rows and memory events."""

    spans: list[tuple] = field(default_factory=list)
    """(rank, stream, op, stage, microbatch, start_s, end_s, bytes); microbatch -1 = none."""
    mem_events: list[tuple] = field(default_factory=list)
    """(rank, time_s, delta_bytes, kind)."""

    SPAN_COLUMNS = ("rank", "stream", "op", "stage", "microbatch", "start_s", "end_s", "bytes")
    MEM_COLUMNS = ("rank", "time_s", "delta_bytes", "kind")


class _Mailbox:
    """Arrival times of p2p messages, and events for receivers that came early."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.arrival: dict[tuple, float] = {}
        self.waiting: dict[tuple, simpy.Event] = {}

    def deliver(self, key: tuple, at: float) -> None:
        self.arrival[key] = at
        ev = self.waiting.pop(key, None)
        if ev is not None:
            ev.succeed()

    def event(self, key: tuple) -> simpy.Event:
        ev = self.waiting.get(key)
        if ev is None:
            ev = self.waiting[key] = self.env.event()
        return ev


def simulate_schedule(schedule: Schedule, costs: CostTable) -> RawTimeline:
    """Run one optimizer step of a lowered schedule; return its spans and memory events.

    Each rank process keeps its own clock and hands control to the SimPy scheduler
    only when it needs a message that has not been sent yet. Ranks interact only
    through message arrival times on point-to-point links that one sender owns
    (FIFO in that sender's program order), so this gives exactly the timeline of
    advancing every rank in global time order, with far fewer events.
    """
    env = simpy.Environment()
    out = RawTimeline()
    box = _Mailbox(env)
    links: dict[tuple[int, int], Link] = {}

    def link(src: int, dst: int) -> Link:
        lk = links.get((src, dst))
        if lk is None:
            name, bw, lat = costs.link_spec(src, dst)
            lk = links[(src, dst)] = Link(name, bw, lat)
        return lk

    n_stages = schedule.n_stages
    s2r = schedule.stage_to_rank
    nbr = ([schedule.prev_stage(s) for s in range(n_stages)], [schedule.next_stage(s) for s in range(n_stages)])
    for rank, actions in enumerate(schedule.actions):
        env.process(_rank_process(rank, actions, costs, link, box, out, nbr, s2r))
    env.run()
    return out


def _needs(action: Action, nbr: tuple[list, list], s2r: tuple[int, ...], rank: int) -> tuple | None:
    """Mailbox key of the remote input a compute action consumes, if any."""
    tag = _need_tag(action.stage, action.op, nbr, s2r, rank)
    return None if tag is None else (action.stage, tag, action.microbatch)


def _overlap_cost(costs, f: Action, b: Action) -> tuple[OpCost, OpCost, float]:
    """(F cost, B cost, duration of the pair) of a composite OVERLAP_F_B."""
    cf, cb = costs.op_cost(f.stage, Op.F), costs.op_cost(b.stage, b.op)
    fn = getattr(costs, "overlap_cost", None)
    dur = fn(f.stage, b.stage, b.op) if fn is not None else cf.duration_s + cb.duration_s
    return cf, cb, dur


def _need_tag(stage: int, op: Op, nbr: tuple[list, list], s2r: tuple[int, ...], rank: int) -> str | None:
    """"F"/"B" when a compute op of ``stage`` consumes a message from another rank, else None."""
    if op is Op.F:
        p = nbr[0][stage]
        return "F" if p is not None and s2r[p] != rank else None
    if op in BACKWARD_OPS:
        q = nbr[1][stage]
        return "B" if q is not None and s2r[q] != rank else None
    return None


def _rank_process(rank, actions, costs, link_of, box, out, nbr, s2r):
    # The loop runs once per action of the step (hundreds of thousands for large
    # pipelines): per-(stage, op) facts are looked up once and cached in locals.
    spans_append = out.spans.append
    mem = out.mem_events
    mem_append = mem.append
    t = 0.0                             # this rank's clock: when its compute stream is next free
    dp_free = 0.0                       # when its dp stream is next free
    reduce_done: dict[int, float] = {}  # stage -> end of its REDUCE_GRAD
    unshard_done: dict[int, float] = {}  # stage -> end of its pending UNSHARD
    arrival = box.arrival
    waiting = box.waiting
    op_cost = costs.op_cost
    send_info: dict[tuple, tuple] = {}
    compute_info: dict[tuple, tuple] = {}
    RECV_F, RECV_B, SEND_F, SEND_B = Op.RECV_F, Op.RECV_B, Op.SEND_F, Op.SEND_B
    fresh = getattr(costs, "fresh_per_action", False)  # a drawing cost table: asked once per action
    unit_cost = getattr(costs, "unit_cost", None)  # token-sliced schedules: a cost per action index
    blocking_p2p = getattr(costs, "blocking_p2p", False)
    post_of = getattr(costs, "send_post_s", None)  # the sender's own time posting a send (gloo on CPU)
    share = getattr(costs, "dp_core_share", 0.0) or 0.0
    dp_busy: list[tuple[float, float]] = []  # this rank's dp-stream intervals (share > 0 only)

    def stretch(begin: float, seconds: float) -> float:
        while dp_busy and dp_busy[0][1] <= begin:  # the walk's clock only moves forward
            dp_busy.pop(0)
        return shared_end(begin, seconds, dp_busy, share) if dp_busy else begin + seconds
    for a in actions:
        op = a.op
        if op is RECV_F or op is RECV_B:
            continue  # posting a receive costs nothing; the consumer waits below
        stage = a.stage
        if op is SEND_F or op is SEND_B:
            info = send_info.get((stage, op))
            if info is None:
                fwd = op is SEND_F
                dst = nbr[1][stage] if fwd else nbr[0][stage]
                nb = costs.p2p_bytes(stage, op)
                info = send_info[(stage, op)] = (link_of(rank, s2r[dst]), nb, dst, "F" if fwd else "B", op.value,
                                                 post_of(nb) if post_of is not None else 0.0)
            lk, nbytes, dst, tag, name, post = info
            mb = a.microbatch
            if unit_cost is not None:
                nbytes = costs.unit_p2p_bytes(stage, op, mb)
                post = post_of(nbytes) if post_of is not None else 0.0
            start, arrive = lk.transfer(t, nbytes)
            spans_append((rank, "p2p", name, stage, mb, start, arrive, nbytes))
            if post > 0.0:  # the transfer's time already counts from the call; the sender's compute waits
                spans_append((rank, "post", name, stage, mb, t, t + post, nbytes))
                t += post
            if blocking_p2p and arrive > t:
                t = arrive  # a blocking send: the sender's compute waits for it
            key = (dst, tag, mb)
            arrival[key] = arrive
            if waiting:
                ev = waiting.pop(key, None)
                if ev is not None:
                    ev.succeed()
            continue
        if op is Op.OVERLAP_F_B:
            start = t
            for part in a.sub:
                tag = _need_tag(part.stage, part.op, nbr, s2r, rank)
                if tag is not None:
                    key = (part.stage, tag, part.microbatch)
                    at = arrival.get(key)
                    if at is None:
                        yield box.event(key)
                        at = arrival[key]
                    start = max(start, at)
                pending = unshard_done.get(part.stage)
                if pending is not None and pending > start:
                    start = pending
            t = _run_overlap(rank, a, start, costs, spans_append, mem_append, stretch if share else None)[1]
            continue
        info = None if fresh else compute_info.get((stage, op))
        if info is None:
            info = compute_info[(stage, op)] = (op_cost(stage, op), _need_tag(stage, op, nbr, s2r, rank), op.value)
        c, tag, name = info
        if unit_cost is not None and op in UNIT_OPS:
            c = unit_cost(stage, op, a.microbatch)
        if op is Op.REDUCE_GRAD or op is Op.UNSHARD:
            start = t - c.lead_s if t - c.lead_s > dp_free else dp_free
            dp_free = start + c.duration_s
            if c.tail_s and dp_free < t + c.tail_s:  # the last bucket is ready when the backward ends
                dp_free = t + c.tail_s
            if op is Op.REDUCE_GRAD:
                reduce_done[stage] = dp_free
            else:
                unshard_done[stage] = dp_free if c.wait_s is None else start + c.wait_s
            if share and dp_free > start:
                dp_busy.append((start, dp_free))
            spans_append((rank, "dp", name, stage, -1 if a.microbatch is None else a.microbatch, start, dp_free,
                          c.bytes))
            if c.stash_bytes:
                mem_append((rank, start, c.stash_bytes, c.mem_kind))
            continue
        if op is Op.RESHARD:
            if c.free_bytes:
                mem_append((rank, t, -c.free_bytes, c.mem_kind))
            continue
        # compute: wait for remote input, pending parameter gathers, gradient reduction
        start = t
        mb = a.microbatch
        if tag is not None:
            key = (stage, tag, mb)
            at = arrival.get(key)
            if at is None:
                yield box.event(key)  # the sender has not reached its SEND yet
                at = arrival[key]
            if at > start:
                start = at
        if op is Op.STEP:
            start = max(start, reduce_done.get(stage, 0.0))
        if unshard_done:
            pending = unshard_done.get(stage)
            if pending is not None and pending > start:
                start = pending
        end = stretch(start, c.duration_s) if share else start + c.duration_s
        t = end
        if c.stash_bytes or c.transient_bytes:
            mem_append((rank, start, c.stash_bytes + c.transient_bytes, c.mem_kind))
        spans_append((rank, "compute", name, stage, -1 if mb is None else mb, start, end, c.bytes))
        for stream, pname, offset, dur, nb in c.phases:  # offload: pcie / cpu / nvme spans
            p0 = max(0.0, start + offset)
            spans_append((rank, stream, pname, stage, -1 if mb is None else mb, p0, max(p0, start + offset + dur), nb))
        released = c.free_bytes + c.transient_bytes
        if released:
            mem_append((rank, end, -released, c.mem_kind))
        if c.then_comm_s > 0 or c.then_comm_bytes > 0:
            s0 = max(end, dp_free)
            dp_free = s0 + c.then_comm_s
            if share and dp_free > s0:
                dp_busy.append((s0, dp_free))
            spans_append((rank, "dp", "PARAM_GATHER", stage, -1, s0, dp_free, c.then_comm_bytes))


def shared_end(start: float, work: float, busy: list, share: float) -> float:
    """When ``work`` seconds of compute started at ``start`` end, running at ``1 - share`` of
    its rate inside the (disjoint, time-ordered) ``busy`` intervals and at full rate outside."""
    t, left = start, work
    for b0, b1 in busy:
        if b1 <= t:
            continue
        if b0 >= t + left:
            break
        if b0 > t:
            left -= b0 - t
            t = b0
        rate = 1.0 - share
        if rate > 0.0 and rate * (b1 - t) >= left:
            return t + left / rate
        left -= rate * (b1 - t)
        t = b1
    return t + left


def _run_overlap(rank, a, start, costs, spans_append, mem_append, stretch=None) -> tuple[float, float]:
    """Record a composite OVERLAP_F_B starting at ``start``; return (end of its F part, its end).
    ``stretch(start, seconds)``: its end when compute shares the core (None: it does not)."""
    f, b = a.sub
    cf, cb, dur = _overlap_cost(costs, f, b)
    total = cf.duration_s + cb.duration_s
    if stretch is not None:
        dur = stretch(start, dur) - start
    mid = start + (dur * cf.duration_s / total if total > 0 else dur / 2)
    end = start + dur
    # a pair run block by block (the backward releasing each block's stash while the forward
    # allocates the next: ``pair_releases_first``) never holds both halves' stashes at once
    early = cb.free_bytes if getattr(costs, "pair_releases_first", False) else 0.0
    if early:
        mem_append((rank, start, -early, cb.mem_kind))
    if cf.stash_bytes or cf.transient_bytes or cb.transient_bytes:
        mem_append((rank, start, cf.stash_bytes + cf.transient_bytes + cb.transient_bytes, cf.mem_kind))
    spans_append((rank, "compute", "F", f.stage, f.microbatch, start, mid, cf.bytes))
    spans_append((rank, "compute", b.op.value, b.stage, b.microbatch, mid, end, cb.bytes))
    released = cf.transient_bytes + cb.free_bytes - early + cb.transient_bytes
    if released:
        mem_append((rank, end, -released, cf.mem_kind))
    return mid, end
