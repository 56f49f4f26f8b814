"""AMPNet (Gaunt et al. 2017, "AMPNet: Asynchronous Model-Parallel Training for Dynamic Neural
Networks"): message-driven asynchronous model parallelism.

Each stage (one pipeline rank) owns a queue. Forward messages come from the previous stage,
backward messages from the next; the stage runs whichever message has arrived first (ties:
backward first, then the lower instance), one at a time. The last stage turns a forward into
its loss and backward at once. A data source keeps at most ``max_in_flight`` instances
(microbatches) active: a new one enters stage 0 when an instance's backward leaves stage 0.
Each stage applies its own optimizer update (the cost table's STEP for the stage) after every
``update_every`` backward messages it processed: there is no flush and no weight stashing, so
a backward uses the weights of *now*, ``staleness`` updates newer than those its forward used.

With ``max_in_flight = 1`` one instance at a time goes down and back: synchronous (naive)
model parallelism. More instances in flight fill the pipeline (throughput) and make gradients
staler (each update a stage applies between an instance's forward and its backward).

The engine is deterministic and uses the same cost table as the fast engine (``op_cost``,
``p2p_bytes``, ``link_spec``, ``send_post_s``; a link is FIFO in its sender's order). It records what it ran as a
:class:`RawTimeline` and the realized per-rank order as a compute-only :class:`Schedule`
(F, B and one STEP per update): replaying that order in the fast engine gives the same
timeline (tests/test_ampnet.py), which is how the rest of parsim reads an AMPNet run.

The same engine, with workers replicating a stage (round robin), PipeDream's
one-forward-one-backward preference, the replicas' gradient all-reduce and weight stashing /
vertical sync, gives PipeDream's no-flush steady state (``parsim.costs.replicated``).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from parsim.schedule.ir import Op, Schedule, act
from parsim.sim.engine import Link, RawTimeline


@dataclass
class AsyncRun:
    """What one asynchronous run produced."""

    raw: RawTimeline
    """Spans and memory events (the fast engine's format; rank = worker)."""
    schedule: Schedule
    """The order each worker realized (compute actions: F, B, STEP); with one worker per stage
    a Schedule like any other (stage s on rank s)."""
    completed_s: list[float] = field(default_factory=list)
    """Per instance, in completion order: when its backward left stage 0."""
    staleness: list[list[tuple[int, int]]] = field(default_factory=list)
    """Per stage: for each backward, in execution order, (instance, the updates its worker
    applied between the weights the instance's forward used and its backward)."""
    updates: list[int] = field(default_factory=list)
    """Per worker: updates applied."""
    weight_versions: list[int] = field(default_factory=list)
    """Per stage: most weight versions one of its workers had to keep at once (one per
    instance between its forward and backward with weight stashing, plus the newest; 1 without)."""


def simulate_ampnet(n_stages: int, n_instances: int, costs, max_in_flight: int = 1, update_every: int = 1,
                    name: str = "AMPNet") -> AsyncRun:
    """AMPNet: ``n_instances`` instances through ``n_stages`` stages (stage s on rank s), messages
    run in arrival order, no weight stashing."""
    return simulate_async(n_stages, n_instances, costs, max_in_flight, update_every, name=name,
                          weight_stashing=False)


def simulate_async(n_stages: int, n_instances: int, costs, max_in_flight: int = 1, update_every: int = 1,
                   replicas: tuple[int, ...] | None = None, policy: str = "arrival",
                   sync_s: tuple[float, ...] | None = None, weight_stashing: bool = True,
                   vertical_sync: bool = False, name: str = "AMPNet") -> AsyncRun:
    """An asynchronous pipeline run (AMPNet; PipeDream's 1F1B-RR with ``policy="1f1b"``).

    * ``replicas[s]`` workers hold stage s; instance j goes to worker j % replicas[s] (round
      robin). Workers are numbered stage by stage.
    * ``policy``: "arrival" runs the message that arrived first (ties: backward first);
      "1f1b" prefers the other kind than the worker's last message when both have arrived
      (PipeDream's one-forward-one-backward in steady state).
    * after every ``update_every`` backwards a worker updates (the stage's STEP); with
      replicas the update launches the replicas' gradient all-reduce (``sync_s[s]``) on the
      worker's data-parallel stream, and the next update waits for it.
    * staleness: updates between the weights the forward used and the backward: the worker's
      own version at the forward, or with ``vertical_sync`` the version it had when the
      instance entered the pipeline (PipeDream's vertical sync: one version end to end).
    """
    if n_stages < 1 or n_instances < 1 or max_in_flight < 1 or update_every < 1:
        raise ValueError("async pipeline: stages, instances, max_in_flight and update_every must be >= 1")
    if policy not in ("arrival", "1f1b"):
        raise ValueError(f"async pipeline: policy must be 'arrival' or '1f1b', got {policy!r}")
    reps = tuple(replicas) if replicas is not None else (1,) * n_stages
    if len(reps) != n_stages or any(r < 1 for r in reps):
        raise ValueError(f"async pipeline: replicas {reps} must give every one of {n_stages} stages >= 1 worker")
    p = _Pipeline(n_stages, n_instances, costs, reps, policy, sync_s, weight_stashing, vertical_sync,
                  update_every, by_worker=replicas is not None)
    for _ in range(min(max_in_flight, n_instances)):
        p.inject(0.0)
    p.run()
    n_workers = len(p.stage_of)
    sched = Schedule.trusted(name, n_workers, n_instances, tuple(range(n_workers)),
                             tuple(tuple(r) for r in p.order)) if n_workers == n_stages else None
    return AsyncRun(p.out, sched, p.completed, p.staleness, p.updates, p.versions)


class _Pipeline:
    """The state of one asynchronous run: workers, their queues and clocks, the data source."""

    def __init__(self, n_stages, n_instances, costs, reps, policy, sync_s, stashing, vertical, every, by_worker):
        self.n_stages, self.n_instances, self.costs, self.reps = n_stages, n_instances, costs, reps
        self.policy, self.stashing, self.vertical, self.every = policy, stashing, vertical, every
        self.by_worker = by_worker  # links named by worker (replicated placements) or by stage
        self.sync = tuple(sync_s) if sync_s is not None else (0.0,) * n_stages
        self.base = [sum(reps[:s]) for s in range(n_stages)]
        self.stage_of = [s for s in range(n_stages) for _ in range(reps[s])]
        w = len(self.stage_of)
        self.out = RawTimeline()
        self.links: dict[tuple[int, int], Link] = {}
        self.post_of = getattr(costs, "send_post_s", None)  # the sender's time posting a send
        self.queues: list[list] = [[] for _ in range(w)]   # heap of (arrival, kind 0=B 1=F, instance)
        self.free_at, self.dp_free, self.last_kind = [0.0] * w, [0.0] * w, [0] * w
        self.events: list = []
        self.seq = 0
        self.order: list[list] = [[] for _ in range(w)]
        self.b_count, self.updates = [0] * w, [0] * w
        self.seen_at_f: list[dict[int, int]] = [{} for _ in range(w)]
        self.at_entry: dict[int, list[int]] = {}
        self.staleness: list[list[tuple[int, int]]] = [[] for _ in range(n_stages)]
        self.versions = [1] * n_stages
        self.completed: list[float] = []
        self.injected = 0
        # a drawing table (--samples) is asked per action; a plain one once per (stage, op)
        self.cost = None if getattr(costs, "fresh_per_action", False) else {
            op: [costs.op_cost(s, op) for s in range(n_stages)] for op in (Op.F, Op.B, Op.STEP)}

    def _cost(self, op: Op, stage: int):
        return self.costs.op_cost(stage, op) if self.cost is None else self.cost[op][stage]

    def worker(self, stage: int, inst: int) -> int:
        return self.base[stage] + inst % self.reps[stage]

    def wake(self, w: int, at: float) -> None:
        self.seq += 1
        heapq.heappush(self.events, (at, self.seq, w))

    def arrive(self, w: int, kind: int, inst: int, at: float) -> None:
        heapq.heappush(self.queues[w], (at, kind, inst))
        self.wake(w, at)

    def send(self, src: int, dst: int, op: Op, inst: int, at: float) -> float:
        """Issue a send at ``at``; return when the sender can compute again (after posting it:
        the fast engine's ``send_post_s``)."""
        s = self.stage_of[src]
        lk = self.links.get((src, dst))
        if lk is None:
            spec = self.costs.link_spec(src, dst) if self.by_worker else self.costs.link_spec(s, self.stage_of[dst])
            lk = self.links[(src, dst)] = Link(*spec)
        nbytes = self.costs.p2p_bytes(s, op)
        start, when = lk.transfer(at, nbytes)
        self.out.spans.append((src, "p2p", op.value, s, inst, start, when, nbytes))
        self.arrive(dst, 1 if op is Op.SEND_F else 0, inst, when)
        post = self.post_of(nbytes) if self.post_of is not None else 0.0
        if post > 0.0:
            self.out.spans.append((src, "post", op.value, s, inst, at, at + post, nbytes))
        return at + post

    def inject(self, at: float) -> None:
        j = self.injected
        if j < self.n_instances:
            self.at_entry[j] = [self.updates[self.worker(s, j)] for s in range(self.n_stages)]
            self.arrive(self.worker(0, j), 1, j, at)
            self.injected += 1

    def pick(self, w: int, now: float) -> tuple:
        q = self.queues[w]
        if self.policy == "1f1b":
            want = 1 - self.last_kind[w]
            alt = [x for x in q if x[0] <= now and x[1] == want]
            if alt:
                x = min(alt)
                q.remove(x)
                heapq.heapify(q)
                return x
        return heapq.heappop(q)

    def run(self) -> None:
        while self.events:
            now, _, w = heapq.heappop(self.events)
            q = self.queues[w]
            if self.free_at[w] > now or not q or q[0][0] > now:
                continue  # busy (it wakes itself when done) or nothing arrived yet (the arrival wakes it)
            _, kind, inst = self.pick(w, now)
            self.last_kind[w] = kind
            end = self.forward(w, inst, now) if kind == 1 else self.backward(w, inst, now)
            self.free_at[w] = end
            self.wake(w, end)

    def forward(self, w: int, inst: int, start: float) -> float:
        s = self.stage_of[w]
        c = self._cost(Op.F, s)
        end = start + c.duration_s
        self.seen_at_f[w][inst] = self.at_entry[inst][s] if self.vertical else self.updates[w]
        if self.stashing:  # the versions in-flight forwards used, and the newest
            self.versions[s] = max(self.versions[s], len(set(self.seen_at_f[w].values()) | {self.updates[w]}))
        self.out.spans.append((w, "compute", "F", s, inst, start, end, c.bytes))
        if c.stash_bytes or c.transient_bytes:
            self.out.mem_events.append((w, start, c.stash_bytes + c.transient_bytes, c.mem_kind))
        if c.transient_bytes:
            self.out.mem_events.append((w, end, -c.transient_bytes, c.mem_kind))
        self.order[w].append(act(s, Op.F, inst))
        if s == self.n_stages - 1:
            self.arrive(w, 0, inst, end)          # the loss: its backward is ready here
        else:
            end = self.send(w, self.worker(s + 1, inst), Op.SEND_F, inst, end)
        return end

    def backward(self, w: int, inst: int, start: float) -> float:
        s = self.stage_of[w]
        c = self._cost(Op.B, s)
        end = start + c.duration_s
        self.staleness[s].append((inst, self.updates[w] - self.seen_at_f[w].pop(inst)))
        self.out.spans.append((w, "compute", "B", s, inst, start, end, c.bytes))
        if c.transient_bytes:
            self.out.mem_events.append((w, start, c.transient_bytes, c.mem_kind))
        released = c.free_bytes + c.transient_bytes
        if released:
            self.out.mem_events.append((w, end, -released, c.mem_kind))
        self.order[w].append(act(s, Op.B, inst))
        if s > 0:
            end = self.send(w, self.worker(s - 1, inst), Op.SEND_B, inst, end)
        else:
            self.completed.append(end)
        self.b_count[w] += 1
        if self.b_count[w] % self.every == 0:
            end = self.update(w, s, end)
        if s == 0:
            self.inject(self.completed[-1])  # the next instance enters (after this worker's update)
        return end

    def update(self, w: int, s: int, at: float) -> float:
        """This worker's own update right after a backward; with replicas, their gradient
        all-reduce follows on its data-parallel stream, and the next update waits for it."""
        st = self._cost(Op.STEP, s)
        replicated = self.reps[s] > 1
        t0 = max(at, self.dp_free[w]) if replicated else at
        self.out.spans.append((w, "compute", "STEP", s, -1, t0, t0 + st.duration_s, st.bytes))
        self.order[w].append(act(s, Op.STEP))
        self.updates[w] += 1
        end = t0 + st.duration_s
        if replicated and self.sync[s] > 0:
            d0 = max(end, self.dp_free[w])
            self.dp_free[w] = d0 + self.sync[s]
            self.out.spans.append((w, "dp", "REDUCE_GRAD", s, -1, d0, self.dp_free[w], 0.0))
        return end


def steady_state(run: AsyncRun, tokens_per_instance: float, skip: int, window: int) -> tuple[float, float]:
    """(seconds per instance, tokens/s) between the ``skip``-th and ``skip + window``-th completion."""
    t = sorted(run.completed_s)
    if window < 1 or skip + window >= len(t) + 1 or skip < 1:
        raise ValueError("AMPNet: not enough completed instances for a steady-state window")
    dt = (t[skip + window - 1] - t[skip - 1]) / window
    return dt, tokens_per_instance / dt if dt > 0 else 0.0


def staleness_summary(values: list[int]) -> dict:
    """A stage's staleness distribution: mean, max, mode and the fraction at each value."""
    if not values:
        return {"mean": 0.0, "max": 0, "mode": 0, "fraction": {}}
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    n = len(values)
    mode = max(sorted(counts), key=lambda k: counts[k])
    return {"mean": sum(values) / n, "max": max(values), "mode": mode,
            "fraction": {str(k): counts[k] / n for k in sorted(counts)}}


def ampnet_metrics(run: AsyncRun, long_run: AsyncRun, m: int, tokens_per_instance: float,
                   max_in_flight: int, update_every: int) -> dict:
    """The ``ampnet`` block of the result: steady state (instances m .. 3m of a 4m-instance run)
    and the per-stage staleness of the backwards of those instances."""
    per, tok = steady_state(long_run, tokens_per_instance, skip=m, window=2 * m)
    stale = []
    for rows in long_run.staleness:
        vals = [v for inst, v in rows if m <= inst < 3 * m]
        stale.append(staleness_summary(vals))
    return {
        "max_in_flight": max_in_flight,
        "update_every": update_every,
        "steady_state_step_s": per * m,
        "steady_state_tokens_per_s": tok,
        "staleness_steps": [st["mode"] for st in stale],
        "staleness": stale,
        "updates_per_step": [u * m / max(1, len(long_run.completed_s)) for u in long_run.updates],
    }
