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
``p2p_bytes``, ``link_spec``; a link is FIFO in its sender's order). It records what it ran as a
:class:`RawTimeline` and the realized per-rank order as a compute-only :class:`Schedule`
(F, B and one STEP per update): replaying that order in the fast engine gives the same
timeline (tests/test_ampnet.py), which is how the rest of parsim reads an AMPNet run.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from parsim.schedule.ir import Op, Schedule, act
from parsim.sim.engine import Link, RawTimeline



@dataclass
class AsyncRun:
    """What one AMPNet run produced."""

    raw: RawTimeline
    """Spans and memory events (the fast engine's format)."""
    schedule: Schedule
    """The order each rank realized (compute actions: F, B, STEP), named "AMPNet"."""
    completed_s: list[float] = field(default_factory=list)
    """Per instance, in completion order: when its backward left stage 0."""
    staleness: list[list[tuple[int, int]]] = field(default_factory=list)
    """Per stage: for each backward, in execution order, (instance, the updates the stage
    applied between that instance's forward and its backward)."""
    updates: list[int] = field(default_factory=list)
    """Per stage: updates applied."""


def simulate_ampnet(n_stages: int, n_instances: int, costs, max_in_flight: int = 1, update_every: int = 1,
                    name: str = "AMPNet") -> AsyncRun:
    """Run ``n_instances`` instances through ``n_stages`` stages (stage s on rank s)."""
    if n_stages < 1 or n_instances < 1 or max_in_flight < 1 or update_every < 1:
        raise ValueError("AMPNet: stages, instances, max_in_flight and update_every must be >= 1")
    out = RawTimeline()
    links: dict[tuple[int, int], Link] = {}
    queues: list[list] = [[] for _ in range(n_stages)]   # heap of (arrival, kind 0=B 1=F, instance)
    free_at = [0.0] * n_stages
    events: list = []                                     # (time, seq, stage): a stage may start work
    seq = [0]
    order: list[list] = [[] for _ in range(n_stages)]
    b_count, updates = [0] * n_stages, [0] * n_stages
    seen_at_f: list[dict[int, int]] = [{} for _ in range(n_stages)]
    staleness: list[list[tuple[int, int]]] = [[] for _ in range(n_stages)]
    completed: list[float] = []
    injected = [0]
    cost_f = [costs.op_cost(s, Op.F) for s in range(n_stages)]
    cost_b = [costs.op_cost(s, Op.B) for s in range(n_stages)]
    cost_step = [costs.op_cost(s, Op.STEP) for s in range(n_stages)]

    def wake(stage: int, at: float) -> None:
        seq[0] += 1
        heapq.heappush(events, (at, seq[0], stage))

    def arrive(stage: int, kind: int, inst: int, at: float) -> None:
        heapq.heappush(queues[stage], (at, kind, inst))
        wake(stage, at)

    def send(src: int, dst: int, op: Op, inst: int, at: float) -> None:
        lk = links.get((src, dst))
        if lk is None:
            nm, bw, lat = costs.link_spec(src, dst)
            lk = links[(src, dst)] = Link(nm, bw, lat)
        nbytes = costs.p2p_bytes(src, op)
        start, when = lk.transfer(at, nbytes)
        out.spans.append((src, "p2p", op.value, src, inst, start, when, nbytes))
        arrive(dst, 1 if op is Op.SEND_F else 0, inst, when)

    def inject(at: float) -> None:
        if injected[0] < n_instances:
            arrive(0, 1, injected[0], at)
            injected[0] += 1

    for _ in range(min(max_in_flight, n_instances)):
        inject(0.0)
    while events:
        now, _, s = heapq.heappop(events)
        q = queues[s]
        if free_at[s] > now or not q or q[0][0] > now:
            continue  # busy (it wakes itself when done) or nothing arrived yet (the arrival wakes it)
        _, kind, inst = heapq.heappop(q)
        start = now
        if kind == 1:  # forward
            c = cost_f[s]
            end = start + c.duration_s
            seen_at_f[s][inst] = updates[s]
            out.spans.append((s, "compute", "F", s, inst, start, end, c.bytes))
            if c.stash_bytes or c.transient_bytes:
                out.mem_events.append((s, start, c.stash_bytes + c.transient_bytes, c.mem_kind))
            if c.transient_bytes:
                out.mem_events.append((s, end, -c.transient_bytes, c.mem_kind))
            order[s].append(act(s, Op.F, inst))
            if s == n_stages - 1:
                arrive(s, 0, inst, end)          # the loss: its backward is ready here
            else:
                send(s, s + 1, Op.SEND_F, inst, end)
        else:  # backward
            c = cost_b[s]
            end = start + c.duration_s
            staleness[s].append((inst, updates[s] - seen_at_f[s].pop(inst)))
            out.spans.append((s, "compute", "B", s, inst, start, end, c.bytes))
            if c.transient_bytes:
                out.mem_events.append((s, start, c.transient_bytes, c.mem_kind))
            released = c.free_bytes + c.transient_bytes
            if released:
                out.mem_events.append((s, end, -released, c.mem_kind))
            order[s].append(act(s, Op.B, inst))
            if s > 0:
                send(s, s - 1, Op.SEND_B, inst, end)
            else:
                completed.append(end)
                inject(end)
            b_count[s] += 1
            if b_count[s] % update_every == 0:   # this stage's own update, right after the backward
                st = cost_step[s]
                out.spans.append((s, "compute", "STEP", s, -1, end, end + st.duration_s, st.bytes))
                order[s].append(act(s, Op.STEP))
                updates[s] += 1
                end += st.duration_s
        free_at[s] = end
        wake(s, end)
    sched = Schedule.trusted(name, n_stages, n_instances, tuple(range(n_stages)),
                             tuple(tuple(r) for r in order))
    return AsyncRun(out, sched, completed, staleness, updates)


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
