"""Full-fidelity mode: every replica of the job in true time order, on a shared network.

The default engine simulates one replica with per-rank local clocks and costs the
collectives that cross replicas analytically. Here every (dp, cp) replica's pipeline
runs as SimPy processes in global time, and all traffic is flows on the cluster
:class:`~parsim.sim.network.Topology` under max-min fair sharing
(:class:`~parsim.sim.network.FlowNetwork`):

* a process drives one pipeline rank of one replica: its tp GPUs run in lockstep
  (the TP collectives inside F/B synchronise them; they stay in the op costs), but every
  one of those GPUs sends its own flows on its own NVLink port / NIC;
* SEND_F/SEND_B: one flow per TP rank to the same TP rank of the neighbouring stage;
* DP collectives (REDUCE_GRAD, UNSHARD, the ZeRO parameter all-gather) wait until every
  member of the DP group has issued them, then run as a ring: one flow per ring edge per
  TP rank carrying the ring's bytes per rank (2(n-1)/n S for all-reduce), plus the ring's
  latency steps. With ``overlap.grad_reduce`` the gradient reduction of a stage is issued
  in buckets (one per layer) while its last backward runs, as DDP does.

Only replica 0's spans are recorded (the Result reads one pipeline); the step still
ends when every replica's last collective is done, since replica 0 waits on them.
"""
from __future__ import annotations

import simpy

from parsim.cluster.collectives import HOPS, bytes_sent_per_rank
from parsim.schedule.ir import Op, Schedule
from parsim.sim.engine import BACKWARD_OPS, RawTimeline, _needs
from parsim.sim.network import FlowNetwork, Topology


class _Job:
    def __init__(self, sc, schedule: Schedule, costs):
        self.sc, self.sched, self.costs = sc, schedule, costs
        par = sc.parallel
        self.par = par
        self.env = simpy.Environment()
        self.topo = Topology(sc.hardware, par.world_size)
        self.net = FlowNetwork(self.env, self.topo.capacity)
        self.out = RawTimeline()
        self.arrival: dict[tuple, simpy.Event] = {}
        self.barriers: dict[tuple, tuple[list, simpy.Event]] = {}
        n = schedule.n_stages
        self.nbr = ([schedule.prev_stage(s) for s in range(n)], [schedule.next_stage(s) for s in range(n)])

    def gpus(self, rep: int, rank: int) -> list[int]:
        """Global GPU ids of the TP group of pipeline rank ``rank`` in replica ``rep``."""
        par = self.par
        d, c = divmod(rep, par.cp)
        base = d * par.stride("dp") + rank * par.stride("pp") + c * par.stride("cp")
        return par.group_ranks("tp", base)

    def box(self, key: tuple) -> simpy.Event:
        ev = self.arrival.get(key)
        if ev is None:
            ev = self.arrival[key] = self.env.event()
        return ev

    def flows(self, pairs: list[tuple[int, int]], nbytes: float, extra_latency: float = 0.0):
        evs, lat = [], 0.0
        for a, b in pairs:
            links, la = self.topo.route(a, b)
            lat = max(lat, la)
            evs.append(self.net.transfer(links, nbytes))
        return self.env.all_of(evs), lat + extra_latency

    def collective(self, key: tuple, rep: int, rank: int, kind: str, nbytes: float):
        """Process: join the DP-group collective ``key``; returns when it completes."""
        par = self.par
        members, done = self.barriers.setdefault(key, ([], self.env.event()))
        members.append(rep)
        if len(members) == par.dp:
            self.env.process(self._run_ring(kind, nbytes, rank, rep % par.cp, done))
        yield done

    def _run_ring(self, kind, nbytes, rank, c, done):
        par = self.par
        n = par.dp
        ring = [self.gpus(d * par.cp + c, rank) for d in range(n)]
        pairs = [(ring[j][i], ring[(j + 1) % n][i]) for j in range(n) for i in range(par.tp)]
        per_rank = bytes_sent_per_rank(kind, nbytes, n)
        ev, lat = self.flows(pairs, per_rank)
        yield ev
        yield self.env.timeout(HOPS[kind](n) * lat)
        done.succeed()


def simulate_full(sc, schedule: Schedule, costs) -> RawTimeline:
    """Simulate one optimizer step of every replica on the shared network."""
    job = _Job(sc, schedule, costs)
    n_rep = sc.parallel.dp * sc.parallel.cp
    for rep in range(n_rep):
        for rank, actions in enumerate(schedule.actions):
            job.env.process(_rank(job, rep, rank, actions))
    job.env.run()
    return job.out


def _last_backward(actions) -> dict[int, int]:
    last = {}
    for k, a in enumerate(actions):
        if a.op in BACKWARD_OPS:
            last[a.stage] = k
    return last


def _rank(job: _Job, rep: int, rank: int, actions):
    env, costs, sc = job.env, job.costs, job.sc
    par = sc.parallel
    rec = rep == 0
    spans, mem = job.out.spans, job.out.mem_events
    s2r = job.sched.stage_to_rank
    nbr = job.nbr
    me = job.gpus(rep, rank)
    dp_tail = [env.event().succeed()]  # the dp stream: one collective at a time, in order
    pending: dict[tuple, simpy.Event] = {}
    seq: dict[tuple, int] = {}
    last_bwd = _last_backward(actions)
    bucketed = sc.overlap.grad_reduce and par.dp > 1

    def dp_op(op_name, stage, kind, nbytes, ready=None, buckets=1):
        k = (stage, op_name)
        seq[k] = seq.get(k, 0) + 1
        prev, ev = dp_tail[0], env.event()
        dp_tail[0] = ev

        def run():
            yield prev
            start = env.now
            for b in range(buckets):
                if ready is not None:
                    at = ready[0] + (b + 1) * ready[1] / buckets
                    if at > env.now:
                        yield env.timeout(at - env.now)
                yield env.process(job.collective((rank, stage, op_name, seq[k], b), rep, rank, kind,
                                                 nbytes / buckets))
            if rec:
                spans.append((rank, "dp", op_name, stage, -1, start, env.now, nbytes))
            ev.succeed()
        env.process(run())
        return ev

    for idx, a in enumerate(actions):
        op = a.op
        if op is Op.RECV_F or op is Op.RECV_B:
            continue
        if op is Op.SEND_F or op is Op.SEND_B:
            fwd = op is Op.SEND_F
            dst_stage = nbr[1][a.stage] if fwd else nbr[0][a.stage]
            nbytes = costs.p2p_bytes(a.stage, op)
            peer = job.gpus(rep, s2r[dst_stage])
            ev, lat = job.flows(list(zip(me, peer)), nbytes)
            key = (rep, dst_stage, "F" if fwd else "B", a.microbatch)
            env.process(_deliver(job, ev, lat, key, rec, (rank, "p2p", op.value, a.stage, a.microbatch,
                                                           env.now, nbytes)))
            continue
        c = costs.op_cost(a.stage, op)
        if op is Op.REDUCE_GRAD:
            if (a.stage, "REDUCE_GRAD") not in pending:
                kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
                pending[(a.stage, "REDUCE_GRAD")] = dp_op("REDUCE_GRAD", a.stage, kind, c.bytes)
            continue
        if op is Op.UNSHARD:
            pending[(a.stage, "UNSHARD")] = dp_op("UNSHARD", a.stage, "all_gather", c.bytes)
            if rec and c.stash_bytes:
                mem.append((rank, env.now, c.stash_bytes, c.mem_kind))
            continue
        if op is Op.RESHARD:
            if rec and c.free_bytes:
                mem.append((rank, env.now, -c.free_bytes, c.mem_kind))
            continue
        key = _needs(a, nbr, s2r, rank)
        if key is not None:
            yield job.box((rep,) + key)
        if op is Op.STEP and (a.stage, "REDUCE_GRAD") in pending:
            yield pending.pop((a.stage, "REDUCE_GRAD"))
        un = pending.pop((a.stage, "UNSHARD"), None)
        if un is not None:
            yield un
        start = env.now
        if bucketed and op in BACKWARD_OPS and last_bwd.get(a.stage) == idx:
            g = costs.op_cost(a.stage, Op.REDUCE_GRAD)
            if g.bytes > 0:
                n_layers = max(1, len(costs.stages[a.stage].layers)) if hasattr(costs, "stages") else 1
                kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
                pending[(a.stage, "REDUCE_GRAD")] = dp_op("REDUCE_GRAD", a.stage, kind, g.bytes,
                                                          ready=(start, c.duration_s), buckets=n_layers)
        if rec and (c.stash_bytes or c.transient_bytes):
            mem.append((rank, start, c.stash_bytes + c.transient_bytes, c.mem_kind))
        if c.duration_s > 0:
            yield env.timeout(c.duration_s)
        if rec:
            spans.append((rank, "compute", op.value, a.stage, -1 if a.microbatch is None else a.microbatch,
                          start, env.now, c.bytes))
            released = c.free_bytes + c.transient_bytes
            if released:
                mem.append((rank, env.now, -released, c.mem_kind))
        if c.then_comm_bytes > 0 and par.dp > 1:
            ev = dp_op("PARAM_GATHER", a.stage, "all_gather", c.then_comm_bytes)
            if c.then_comm_s > 0:
                pending[(a.stage, "PARAM_GATHER")] = ev
    for ev in list(pending.values()):
        yield ev


def _deliver(job: _Job, ev, lat, key, rec, row):
    yield ev
    if lat > 0:
        yield job.env.timeout(lat)
    if rec:
        job.out.spans.append(row[:6] + (job.env.now, row[6]))
    job.box(key).succeed()
