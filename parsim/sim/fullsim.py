"""Full-fidelity mode: every replica of the job in true time order, on a shared network.

The default (fast) engine simulates one replica with per-rank local clocks and costs the
collectives that cross replicas analytically. Here every (dp, cp) replica's pipeline
runs as SimPy processes in global time, and all traffic is flows on the cluster
:class:`~parsim.sim.network.Topology` under max-min fair sharing
(:class:`~parsim.sim.network.FlowNetwork`). The semantics of every action are the fast
engine's (``parsim.sim.engine``); only where the time of communication comes from differs:

* a process drives one pipeline rank of one replica: its tp GPUs run in lockstep
  (the TP collectives inside F/B synchronise them; they stay in the op costs, with
  ``overlap.tp_comm`` / ``overlap.ep_comm`` applied there, as in fast mode), but every
  one of those GPUs sends its own flows on its own NVLink port / NIC. Those tp copies
  of every flow are one weighted flow class wherever the topology is symmetric under
  shifting GPUs inside their TP group (``Topology.block_capacity``: the group inside one
  node, on NICs of their own or all on one): the first TP rank's flows run on the
  quotient network, exactly (the max-min allocation is unique, so symmetric), at 1/tp
  of the cost; elsewhere every TP rank's flows run;
* SEND_F/SEND_B: one flow per TP rank to the same TP rank of the neighbouring stage; the
  sender's compute waits ``send_post_s`` after it (as the fast engine);
* ``OVERLAP_F_B``: as the fast engine (both parts' inputs, one duration, two spans);
* DP collectives (REDUCE_GRAD, UNSHARD, the ZeRO-1/2 parameter all-gather) wait until
  every member of the group has issued them, then run the algorithm fast mode's
  selection picks, as flows (:mod:`parsim.sim.collective_flows`): one group per TP rank,
  the groups of fast mode's concurrency model. REDUCE_GRAD reduces the dense gradients
  over the dp group (or through a parameter server, ``parallel.dp_comm``) and the expert
  gradients over the expert-data-parallel group, as fast mode does;
* ``overlap.grad_reduce``: a stage's reduction is n equal pieces (n = its layers; bytes
  and latency term split alike, fast mode's t/n per piece), piece b ready once the
  b-th n-th of the backward before the REDUCE_GRAD has run (DDP's buckets). With a fused
  B that is exactly fast mode's max(t - B(n-1)/n, t/n); with a split backward the pieces
  hide under the last W only (a layer's gradient is final after its last W), where fast
  mode's closed form lets them hide under a whole B;
* two model copies (DualPipe, Chimera): after its dp reduction each stage's gradients (its
  shard, when sharded) are all-reduced with its twin's -- the same layers on pipeline rank
  p-1-r of the replica -- as flows between the two ranks (fast mode's twin all-reduce);
* ``overlap.param_gather``: the ZeRO-1/2 gather runs under the next step's forward: a span
  of what the cost model found exposed (``parsim.costs.dp.param_gather_exposed``) carrying
  its bytes, as in fast mode; otherwise it runs after STEP.
* ``[stragglers]`` (``parsim.sim.stragglers``): each replica's slow pipeline ranks run their
  compute stretched (a DP collective waits for its slowest member: a straggler anywhere sets
  the pace); slow NICs have less capacity, a failed NIC's GPUs send through the node's next
  healthy NIC (sharing it); with either, the TP lanes are not lumped (no longer symmetric).

Only replica 0's spans are recorded (the Result reads one pipeline); the step still
ends when every replica's last collective is done, since replica 0 waits on them.
"""
from __future__ import annotations

from dataclasses import dataclass

import simpy

from parsim.cluster.collectives import grad_bucket_bytes, n_buckets
from parsim.cluster.contention import slowdown_s
from parsim.schedule.coverage import Coverage, Trait
from parsim.schedule.ir import Op, Schedule, no_gc
from parsim.schedule.passes import last_backward, last_backward_per_microbatch
from parsim.sim.collective_flows import plan_collective, plan_parameter_server
from parsim.sim.engine import RawTimeline, _needs, _overlap_cost, _run_overlap
from parsim.sim.network import FlowNetwork, NetworkStats, Topology
from parsim.sim.stragglers import gpu_slowdowns, nic_changes, rank_factors, slowed

COVERAGE = Coverage("full engine", refuses=frozenset({Trait.TOKEN_SLICES, Trait.MESSAGE_DRIVEN}))
"""Every op, every schedule trait (weights and memory semantics come from the cost table)
but token slices (its per-(stage, op) cost lookups have no per-unit costs: fast mode runs them)."""


class _Job:
    def __init__(self, sc, schedule: Schedule, costs, lump: bool = True):
        self.sc, self.sched, self.costs = sc, schedule, costs
        self.par = par = sc.parallel
        self.env = simpy.Environment()
        st = sc.stragglers
        self.topo = Topology(sc.hardware, par.world_size, **nic_changes(st, sc.hardware))
        self.factors = rank_factors(par, gpu_slowdowns(st, sc.hardware.gpus_per_node, sc.gpus)) if st else {}
        lump = lump and not (st and (st.nics or st.failed_nics))  # an odd NIC breaks the TP groups' symmetry
        # the TP ranks of a process send identical flows on symmetric links: simulate the
        # first one on the quotient network where it stands for all (Topology.block_capacity)
        cap = self.topo.block_capacity(par.tp) if lump and par.stride("tp") == 1 else None
        self.lanes = par.tp if cap is None else 1  # TP ranks whose flows run: all, or the first for all
        self.net = FlowNetwork(self.env, self.topo.capacity if cap is None else cap)
        self.out = RawTimeline()
        self.arrival: dict[tuple, simpy.Event] = {}
        self.barriers: dict[tuple, tuple[list, simpy.Event]] = {}
        self._replicas: dict[tuple[str, int], list[int]] = {}
        n = schedule.n_stages
        self.nbr = ([schedule.prev_stage(s) for s in range(n)], [schedule.next_stage(s) for s in range(n)])

    def gpus(self, rep: int, rank: int) -> list[int]:
        """Global GPU ids of the simulated TP ranks of pipeline rank ``rank`` in replica ``rep`` (= d * cp + c)."""
        par = self.par
        d, c = divmod(rep, par.cp)
        base = d * par.stride("dp") + rank * par.stride("pp") + c * par.stride("cp")
        return par.group_ranks("tp", base)[:self.lanes]

    def replicas(self, group: str, rep: int) -> list[int]:
        """Replicas in ``rep``'s gradient group: "dp" (every dp x cp replica: context-parallel
        ranks sum their gradients with the data-parallel ones, ``ParallelConfig.grad_degree``) or
        "edp" (the replicas holding the same experts: dp*cp/ep of them, as ``expert_dp_ranks``)."""
        par = self.par
        key = (group, (rep % par.ep) if group == "edp" else 0)
        reps = self._replicas.get(key)
        if reps is None:  # every replica asks once per collective: O(dp) each, built once
            if group == "edp":
                reps = [j for j in range(par.dp * par.cp) if j % par.ep == key[1]]
            else:
                reps = list(range(par.dp * par.cp))
            self._replicas[key] = reps
        return reps

    def box(self, key: tuple) -> simpy.Event:
        ev = self.arrival.get(key)
        if ev is None:
            ev = self.arrival[key] = self.env.event()
        return ev

    def flows(self, triples, scale: float = 1.0):
        """Start flows (src GPU, dst GPU, bytes x scale); (all-arrived event, largest path latency)."""
        route = self.topo.route
        lat, transfers = 0.0, []
        for a, b, nbytes in triples:
            links, la = route(a, b)
            if la > lat:
                lat = la
            transfers.append((links, nbytes * scale))
        return self.net.start(transfers), lat

    def join(self, key: tuple, rep: int, rank: int, part: tuple, scale: float) -> simpy.Event:
        """Join ``rep``'s group of the collective ``key``; the event fires when it completes."""
        group, kind, nbytes = part
        reps = self.replicas(group, rep)
        k = key + (reps[0],)
        members, done = self.barriers.setdefault(k, ([], self.env.event()))
        members.append(rep)
        if len(members) == len(reps):
            del self.barriers[k]
            self.env.process(self._run(kind, nbytes, scale, rank, reps, done))
        return done

    def join_twin(self, key: tuple, rep: int, rank: int, twin: int, nbytes: float, scale: float) -> simpy.Event:
        """Join the gradient all-reduce of a two-chain schedule's stage with its twin (the same
        layers on pipeline rank ``twin`` of the same replica: DeepSeek's DualPipe sums each
        stage's gradients across ranks r and p-1-r); the event fires when both have run it."""
        k = key + (rep, min(rank, twin))
        members, done = self.barriers.setdefault(k, ([], self.env.event()))
        members.append(rank)
        if len(members) == 2:
            del self.barriers[k]
            self.env.process(self._run_pair(nbytes, scale, rep, (rank, twin), done))
        return done

    def _run_pair(self, nbytes, scale, rep, ranks, done):
        hw = self.sc.hardware
        plans = [plan_collective(hw, "all_reduce", nbytes, [self.gpus(rep, r)[i] for r in ranks],
                                 self._buckets("all_reduce", nbytes)) for i in range(self.lanes)]
        yield from self._phases(plans, scale)
        done.succeed()

    def _buckets(self, kind: str, nbytes: float) -> int:
        """Gradient reductions (the only all-reduces and reduce-scatters here) run in fast mode's buckets."""
        if kind not in ("all_reduce", "reduce_scatter"):
            return 1
        sc = self.sc
        return n_buckets(nbytes, grad_bucket_bytes(sc.overlap.bucket_bytes, sc.parallel.grad_degree,
                                                   sc.parallel.grad_bytes(sc.training.precision)))

    def _run(self, kind, nbytes, scale, rank, reps, done):
        """The collective's phases for every TP rank's group at once (fast mode's concurrent groups)."""
        hw = self.sc.hardware
        plans = []
        for i in range(self.lanes):
            ranks = [self.gpus(j, rank)[i] for j in reps]
            plans.append(plan_parameter_server(hw, nbytes, ranks) if kind == "parameter_server"
                         else plan_collective(hw, kind, nbytes, ranks, self._buckets(kind, nbytes)))
        yield from self._phases(plans, scale)
        done.succeed()

    def _phases(self, plans, scale):
        """Run the lanes' plans phase by phase: each phase's flows together, then its latency."""
        for k in range(len(plans[0].phases)):
            phases = [p.phases[k] for p in plans]
            ev, _ = self.flows([f for ph in phases for f in ph.flows], scale)
            yield ev
            lat = max(ph.latency_s for ph in phases) * scale
            if lat > 0:
                yield self.env.timeout(lat)


def simulate_full(sc, schedule: Schedule, costs) -> RawTimeline:
    """Simulate one optimizer step of every replica on the shared network."""
    return run_full(sc, schedule, costs)[0]


@dataclass(frozen=True)
class FullStats:
    """What a full-mode run did: the work its wall time is spent on."""

    events: int
    """SimPy events processed (process steps, timers, flow completions, message arrivals)."""
    processes: int
    """Rank processes: pipeline ranks x replicas."""
    lanes: int
    """TP ranks per process whose flows were simulated (1: the first stood for all, exactly)."""
    net: NetworkStats
    """Flows started and max-min re-ratings."""


def run_full(sc, schedule: Schedule, costs, lump: bool = True) -> tuple[RawTimeline, FullStats]:
    """:func:`simulate_full` and what it did; ``lump=False`` simulates every TP rank's
    flows even where the first one stands for all (tests compare the two)."""
    job = _Job(sc, schedule, costs, lump)
    n_rep = sc.parallel.dp * sc.parallel.cp
    for rep in range(n_rep):
        for rank, actions in enumerate(schedule.actions):
            job.env.process(_rank(job, rep, rank, actions))
    # the cyclic collector paused while the step runs: a large job keeps some hundred thousand
    # SimPy events and generator frames alive, and from 16,384 to 65,536 GPUs the time in full
    # collections grew 21-fold, to half the run; the run makes no reference cycles that outlive
    # it besides the environment's own (tests/test_fullmode_scaling.py checks this)
    with no_gc():
        job.env.run()
    events = next(job.env._eid)  # SimPy's event serial: one per event scheduled, all processed by now
    return job.out, FullStats(events, n_rep * len(schedule.actions), job.lanes, job.net.stats)


def _dp_parts(job: _Job, stage: int, op: Op, nbytes: float) -> list[tuple[str, str, float]]:
    """(group, kind, bytes) of the collectives a DP action runs, one after the other, as the
    cost model's data-parallel ops compose them: nothing when dp x cp = 1; the dense gradients
    over dp x cp (or through a parameter server), the expert gradients over the expert-dp group."""
    par = job.par
    if par.grad_degree <= 1 or nbytes <= 0:
        return []
    if op is not Op.REDUCE_GRAD:  # UNSHARD, PARAM_GATHER: the stage's parameters over dp
        return [("dp", "all_gather", nbytes)]
    kind = "all_reduce" if par.zero == 0 else "reduce_scatter"
    st = job.costs.stages[stage] if hasattr(job.costs, "stages") else None
    expert = nbytes * st.expert_params / st.params if st is not None and st.params > 0 else 0.0
    dense = "parameter_server" if par.dp_comm == "parameter_server" else kind
    parts = [("dp", dense, nbytes - expert), ("edp" if par.ep > 1 else "dp", kind, expert)]
    return [p for p in parts if p[2] > 0 and len(job.replicas(p[0], 0)) > 1]


def _twin_bytes(job: _Job, stage: int, nbytes: float) -> float:
    """Bytes of a two-chain stage's all-reduce with its twin, as the cost model sends them:
    after a sharded dp reduction each rank holds its shard (ZeRO >= 1, dp > 1), else the whole."""
    par = job.par
    if job.sched.n_chains != 2 or nbytes <= 0:
        return 0.0
    if par.zero < 1 or par.grad_degree <= 1:
        return nbytes
    st = job.costs.stages[stage] if hasattr(job.costs, "stages") else None
    expert = nbytes * st.expert_params / st.params if st is not None and st.params > 0 else 0.0
    n_s = par.shard_degree
    return (nbytes - expert) / n_s + expert / max(1, len(job.replicas("edp" if par.ep > 1 else "dp", 0)))


def _n_layers(costs, stage: int) -> int:
    """Gradient buckets of a stage (one per block), as fast mode counts them."""
    return max(1, len(costs.stages[stage].layers)) if hasattr(costs, "stages") else 1


def _rank(job: _Job, rep: int, rank: int, actions):
    env, sc = job.env, job.sc
    own = getattr(job.costs, "for_replica", None)  # [stragglers] replica_hardware: this replica's GPU type
    costs = slowed(own(rep) if own else job.costs, job.sched.stage_to_rank, job.factors, rep)  # and its slow ranks
    rec = rep == 0
    spans, mem = job.out.spans, job.out.mem_events
    keep, keep_mem = (spans.append, mem.append) if rec else (_drop, _drop)
    nbr, s2r = job.nbr, job.sched.stage_to_rank
    me = job.gpus(rep, rank)
    dp_tail = [env.event().succeed()]  # the dp stream: one collective at a time, in order
    share = getattr(costs, "dp_core_share", 0.0) or 0.0
    dp_state = [False, env.event()]  # (a collective is in flight, an event the next change fires)

    def dp_running(on: bool) -> None:
        """The rank's dp stream starts or stops a collective: compute beside it changes rate."""
        dp_state[0] = on
        ev, dp_state[1] = dp_state[1], env.event()
        ev.succeed()

    def compute_for(seconds: float):
        """Run ``seconds`` of compute, at ``1 - share`` of its rate while the dp stream is busy
        (the fast engine's semantics, ``parsim.sim.engine.shared_end``)."""
        left = seconds
        while left > 1e-15:
            rate = 1.0 - share if dp_state[0] else 1.0
            change, t0 = dp_state[1], env.now
            if rate <= 0.0:
                yield change
                continue
            yield env.timeout(left / rate) | change
            left -= (env.now - t0) * rate
    pending: dict[tuple, simpy.Event] = {}
    seq: dict[tuple, int] = {}
    sends: dict[tuple, tuple] = {}
    # step index -> the stage whose REDUCE_GRAD the lowering put right after that step
    anchor = {k: s for s, k in last_backward(actions).items()}
    per_microbatch = any(a.op is Op.REDUCE_GRAD and a.microbatch is not None for a in actions)
    if per_microbatch:
        # ZeRO-2/3, FSDP: every microbatch's reduction hides under that microbatch's backward
        anchor = {k: s for (s, _), k in last_backward_per_microbatch(actions).items()}
    bucketed = sc.overlap.grad_reduce
    # SMs a hidden reduction takes from its backward; per-microbatch reductions (ZeRO-2/3) are
    # not charged, as fast mode's cost model does not charge them
    dp_sms = job.costs.dp_collective_sms() if hasattr(job.costs, "dp_collective_sms") and not per_microbatch else 0
    under: dict[int, bool] = {}  # stage -> its reduction was launched under its last backward

    def dp_op(op_name, stage, op, nbytes, window=None, run=True, mb=None, wait_s=None, fixed_s=0.0):
        """Queue a DP collective on the dp stream (``run=False``: a span of ``fixed_s`` -- the
        part the cost model found exposed -- with its bytes); ``window`` = (start, duration) of
        the backward its buckets hide under."""
        k = (stage, op_name)
        seq[k] = nth = seq.get(k, 0) + 1  # this collective's number, fixed now: the next one may be
        # queued (and the counter moved on) while this one's buckets still wait for their backward
        parts = _dp_parts(job, stage, op, nbytes) if run else []
        twin_bytes = _twin_bytes(job, stage, nbytes) if run and op is Op.REDUCE_GRAD else 0.0
        n = _n_layers(costs, stage) if window is not None else 1
        prev, ev = dp_tail[0], env.event()
        dp_tail[0] = ev
        early = env.event() if wait_s is not None else None  # what the stage's compute waits for

        def go():
            yield prev
            if early is not None:
                env.process(_after(env, wait_s, early))
            start, gated, active = None, False, 0.0
            end = window[0] + window[1] if window is not None else 0.0
            for b in range(n):
                if window is not None:
                    at = window[0] + (b + 1) * window[1] / n
                    gated = at > env.now
                    if gated:
                        yield env.timeout(at - env.now)
                t0 = env.now
                start = env.now if start is None else start
                if share and run:  # the bucket's transfer takes the rank's core from its compute
                    dp_running(True)
                for i, part in enumerate(parts):
                    yield job.join((rank, stage, op_name, nth, b, i), rep, rank, part, 1 / n)
                if twin_bytes > 0:
                    chain_len = job.sched.n_stages // 2
                    yield job.join_twin(("TWIN", stage % chain_len, nth, b), rep, rank,
                                        len(job.sched.actions) - 1 - rank, twin_bytes, 1 / n)
                if share and run:
                    dp_running(False)
                active += max(0.0, min(env.now, end) - t0)  # of this bucket, what ran under the backward
            if window is not None and dp_sms:
                # the buckets that ran under the backward held SMs it needed
                # (parsim.cluster.contention): it ended that much later, and so does the last
                # bucket when it waited for the backward's end rather than for the link
                slow = slowdown_s(job.sc.hardware.device, dp_sms, active, window[1])
                if gated and slow > 0:
                    yield env.timeout(slow)
            if fixed_s > 0:
                yield env.timeout(fixed_s)
            keep((rank, "dp", op_name, stage, -1 if mb is None else mb, start, env.now, nbytes))
            ev.succeed()
        env.process(go())
        return ev if early is None else early

    def tied_of(stage: int) -> float:
        """The tied embedding's sync after the stage's reduction (``ModelCosts.tied_sync_s``):
        a fixed span on the dp stream, not flows (a two-rank all-reduce between the pipeline's ends)."""
        of = getattr(costs, "tied_sync_s", None)
        return of(stage) if of is not None else 0.0

    def reduce_under(stage: int, start: float, duration: float) -> None:
        """overlap.grad_reduce: the stage's bucketed reduction, under the backward just started."""
        g = costs.op_cost(stage, Op.REDUCE_GRAD)
        if g.bytes > 0 and not under.get(stage):
            under[stage] = True
            pending[(stage, "REDUCE_GRAD")] = dp_op("REDUCE_GRAD", stage, Op.REDUCE_GRAD, g.bytes,
                                                    window=(start, duration), fixed_s=tied_of(stage))

    for idx, a in enumerate(actions):
        op = a.op
        if op is Op.RECV_F or op is Op.RECV_B:
            continue
        if op is Op.SEND_F or op is Op.SEND_B:
            info = sends.get((a.stage, op))
            if info is None:  # the same peer and bytes for every microbatch: looked up once
                fwd = op is Op.SEND_F
                dst_stage = nbr[1][a.stage] if fwd else nbr[0][a.stage]
                nbytes = costs.p2p_bytes(a.stage, op)
                peer = job.gpus(rep, s2r[dst_stage])
                post_of = getattr(costs, "send_post_s", None)
                info = sends[(a.stage, op)] = ([(x, y, nbytes) for x, y in zip(me, peer)], nbytes, dst_stage,
                                               "F" if fwd else "B", post_of(nbytes) if post_of is not None else 0.0)
            triples, nbytes, dst_stage, tag, post = info
            ev, lat = job.flows(triples)
            row = (rank, "p2p", op.value, a.stage, a.microbatch, env.now, nbytes) if rec else None
            _deliver(job, ev, lat, (rep, dst_stage, tag, a.microbatch), row)
            if post > 0.0:  # the sender's compute waits while it posts (the fast engine's semantics)
                keep((rank, "post", op.value, a.stage, a.microbatch, env.now, env.now + post, nbytes))
                yield env.timeout(post)
            continue
        if op is Op.OVERLAP_F_B:
            for part in a.sub:
                yield from _wait_inputs(job, rep, rank, part, pending)
            start = env.now
            if share:  # the pair's length is known only once it has run beside the dp stream
                cf, cb, dur = _overlap_cost(costs, *a.sub)
                if bucketed and idx in anchor:
                    total = cf.duration_s + cb.duration_s
                    b_part = dur * cb.duration_s / total if total > 0 else dur / 2
                    reduce_under(anchor[idx], start + dur - b_part, b_part)  # under the B part
                yield from compute_for(dur)
                mid, end = _run_overlap(rank, a, start, costs, keep, keep_mem,
                                        stretch=lambda _b, _s, e=env.now: e)
                continue
            mid, end = _run_overlap(rank, a, start, costs, keep, keep_mem)
            if bucketed and idx in anchor:
                reduce_under(anchor[idx], mid, end - mid)  # under the B part
            if end > start:
                yield env.timeout(end - start)
            continue
        c = costs.op_cost(a.stage, op)
        if op is Op.REDUCE_GRAD:
            # launched already under its backward (overlap.grad_reduce) unless an earlier
            # microbatch's reduction is what is pending (ZeRO-2/3 reduce every microbatch;
            # the dp stream runs in order, so STEP waits for the newest)
            if not under.pop(a.stage, False):
                pending[(a.stage, "REDUCE_GRAD")] = dp_op("REDUCE_GRAD", a.stage, op, c.bytes, mb=a.microbatch,
                                                          fixed_s=tied_of(a.stage) if a.microbatch is None else 0.0)
            continue
        if op is Op.UNSHARD:
            pending[(a.stage, "UNSHARD")] = dp_op("UNSHARD", a.stage, op, c.bytes, mb=a.microbatch, wait_s=c.wait_s)
            if c.stash_bytes:
                keep_mem((rank, env.now, c.stash_bytes, c.mem_kind))
            continue
        if op is Op.RESHARD:
            if c.free_bytes:
                keep_mem((rank, env.now, -c.free_bytes, c.mem_kind))
            continue
        yield from _wait_inputs(job, rep, rank, a, pending)
        if op is Op.STEP and (a.stage, "REDUCE_GRAD") in pending:
            yield pending.pop((a.stage, "REDUCE_GRAD"))
        start = env.now
        if bucketed and idx in anchor:
            reduce_under(anchor[idx], start, c.duration_s)
        if c.stash_bytes or c.transient_bytes:
            keep_mem((rank, start, c.stash_bytes + c.transient_bytes, c.mem_kind))
        if c.duration_s > 0:
            if share:
                yield from compute_for(c.duration_s)
            else:
                yield env.timeout(c.duration_s)
        keep((rank, "compute", op.value, a.stage, -1 if a.microbatch is None else a.microbatch,
              start, env.now, c.bytes))
        released = c.free_bytes + c.transient_bytes
        if released:
            keep_mem((rank, env.now, -released, c.mem_kind))
        if c.then_comm_bytes > 0 or c.then_comm_s > 0:
            # ZeRO-1/2 gather of the updated shards: under the next step's forward with
            # overlap.param_gather (a zero-length span with its bytes, as fast mode), else now
            overlapped = sc.overlap.param_gather
            pending[(a.stage, "PARAM_GATHER")] = dp_op("PARAM_GATHER", a.stage, Op.UNSHARD, c.then_comm_bytes,
                                                       run=not overlapped,
                                                       fixed_s=c.then_comm_s if overlapped else 0.0)
    for ev in list(pending.values()):
        yield ev


def _wait_inputs(job: _Job, rep: int, rank: int, a, pending):
    """Wait for the remote input a compute action consumes and for its stage's pending UNSHARD."""
    key = _needs(a, job.nbr, job.sched.stage_to_rank, rank)
    if key is not None:
        key = (rep,) + key
        yield job.box(key)
        del job.arrival[key]  # one consumer per message: a large job holds no delivered boxes
    un = pending.pop((a.stage, "UNSHARD"), None)
    if un is not None:
        yield un


def _after(env, seconds: float, ev):
    """Succeed ``ev`` ``seconds`` from now (the exposed part of a prefetched gather)."""
    yield env.timeout(seconds)
    ev.succeed()


def _drop(_row) -> None:
    """Replicas other than 0 record nothing."""


def _deliver(job: _Job, ev, lat, key, row) -> None:
    """When the flows of a send are done and one path latency has passed: the message is in
    the receiver's box (``row``: the p2p span to record, replica 0 only)."""
    env = job.env

    def arrived(_e) -> None:
        if row is not None:
            job.out.spans.append(row[:6] + (env.now, row[6]))
        job.box(key).succeed()

    def sent(_e) -> None:
        if lat > 0:
            env.timeout(lat).callbacks.append(arrived)
        else:
            arrived(None)
    ev.callbacks.append(sent)
