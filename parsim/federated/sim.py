"""Federated rounds on a virtual clock, as SimPy processes (the project's engine).

Every client task is download -> local compute -> upload over the client's own links
(:func:`parsim.federated.population.completion_time_s`); the server's ingress is not a
bottleneck (clients' uplinks are). Per-client quantities are drawn in bulk with numpy; the
events are the updates reaching the server.

Sync (FedAvg rounds with FedScale's and Bonawitz et al. 2019's selection rules): at the start
of a round the server selects floor(K x over_commitment) clients uniformly among those
online; each runs its task; the server aggregates updates as they arrive (one event each)
and closes the round at the K-th arrival, or at ``deadline_s`` with fewer. Clients still
running when it closes (stragglers), and clients whose availability trace takes them
offline before their task ends, are dropped. A round closing with fewer than
min_fraction x K updates fails (no aggregation). With nobody online and no deadline the
server retries after one median task time.

Async (FedBuff, Nguyen et al. 2022): ``clients_per_round`` clients train at once; when one
finishes, another (online, idle) client starts; the server aggregates every
``buffer_size`` updates (a round), whatever model version each update started from
(staleness = versions since its download). A task longer than ``deadline_s``, and an update
more than ``max_staleness`` versions old (FedScale's async aggregator), are dropped.
"""
from __future__ import annotations

import math

import numpy as np
import simpy

from parsim.federated.compression import encode
from parsim.federated.config import FLScenario
from parsim.federated.population import Availability, compute_time_s, make_population
from parsim.federated.results import FLResult, Round


class _Task:
    """What every client's task moves and computes (the same for all clients)."""

    def __init__(self, sc: FLScenario):
        c, fed = sc.compression, sc.federated
        self.encoding = encode(sc.tensors, c.methods, rank=c.rank, keep_fraction=c.keep_fraction, bits=c.bits,
                               rotation=c.rotation, weight_bits=fed.weight_bits)
        self.up_bits = float(self.encoding.bits)
        self.down_bits = float(sc.params * fed.weight_bits)
        self.fed, self.params = fed, sc.params

    def parts(self, pop, clients: np.ndarray):
        """(compute_s, download_s, upload_s) arrays for ``clients``."""
        f = self.fed
        comp = compute_time_s(pop.seconds_per_sample[clients], batch_size=f.batch_size, local_steps=f.local_steps,
                              train_factor=f.train_factor, encode_ops=self.encoding.ops, params=self.params)
        return comp, self.down_bits / pop.downlink_bit_per_s[clients], self.up_bits / pop.uplink_bit_per_s[clients]


def simulate_fl(sc: FLScenario) -> FLResult:
    """Run the scenario's rounds; rows per round and the summary metrics."""
    fed = sc.federated
    rng = np.random.default_rng(fed.seed)
    pop = make_population(fed, rng)
    avail = Availability(fed, rng)
    task = _Task(sc)
    env = simpy.Environment()
    rows: list[Round] = []
    if fed.mode == "sync":
        env.process(_sync_server(env, fed, pop, avail, task, rows))
        env.run()
    else:
        done = env.event()
        _async_run(env, fed, pop, avail, task, rows, done)
        env.run(until=done)
    return FLResult.build(sc, rows, task.encoding, pop, task)


def _median_task_s(task: _Task, pop) -> float:
    c, d, u = task.parts(pop, np.arange(pop.size))
    return float(np.median(c + d + u))


def _sync_server(env, fed, pop, avail, task, rows):
    k = fed.clients_per_round
    n_select = max(1, math.floor(k * fed.over_commitment))
    need = math.ceil(fed.min_fraction * k - 1e-9)
    for r in range(fed.rounds):
        t0 = env.now
        sel = avail.sample(n_select, t0)
        comp, down, up = task.parts(pop, sel)
        dur = comp + down + up
        reach = avail.online_at_end(sel, t0 + dur)
        order = np.argsort(dur, kind="stable")
        got = []
        for i in order:  # the server aggregates updates as they arrive
            if len(got) == k or (fed.deadline_s is not None and dur[i] > fed.deadline_s):
                break
            yield env.timeout(max(0.0, t0 + dur[i] - env.now))
            if reach[i]:
                got.append(i)
        if len(got) < k:
            if fed.deadline_s is not None:
                close = fed.deadline_s
            elif len(sel):
                close = float(dur.max())  # the server learns a lost client is gone when its task would end
            else:
                close = _median_task_s(task, pop)
            yield env.timeout(max(0.0, t0 + close - env.now))
        got = np.array(got, dtype=np.int64)
        ok = len(got) >= max(need, 1)
        kept = len(got) if ok else 0
        rows.append(Round(round=r, start_s=t0, end_s=env.now, selected=len(sel), participants=kept,
                          dropped=len(sel) - kept, failed=not ok,
                          bytes_up=len(got) * task.up_bits / 8, bytes_down=len(sel) * task.down_bits / 8,
                          compute_s_mean=float(comp[got].mean()) if len(got) else 0.0,
                          comm_s_mean=float((down + up)[got].mean()) if len(got) else 0.0, staleness_mean=0.0))


def _async_run(env, fed, pop, avail, task, rows, done):
    busy = np.zeros(pop.size, dtype=bool)
    st = {"version": 0, "buffer": [], "dropped": 0, "dispatched": 0, "start": 0.0, "down": 0}
    retry = _median_task_s(task, pop)

    def aggregate():
        buf = np.array(st["buffer"])  # (staleness, compute, comm)
        rows.append(Round(round=st["version"], start_s=st["start"], end_s=env.now, selected=st["dispatched"],
                          participants=len(buf), dropped=st["dropped"], failed=False,
                          bytes_up=len(buf) * task.up_bits / 8, bytes_down=st["down"] * task.down_bits / 8,
                          compute_s_mean=float(buf[:, 1].mean()), comm_s_mean=float(buf[:, 2].mean()),
                          staleness_mean=float(buf[:, 0].mean())))
        st.update(version=st["version"] + 1, buffer=[], dropped=0, dispatched=0, start=env.now, down=0)
        if st["version"] == fed.rounds:
            done.succeed()

    def slot():
        while not done.triggered:
            c = avail.sample_one(env.now, busy)
            if c is None:
                yield env.timeout(retry)
                continue
            busy[c] = True
            st["dispatched"] += 1
            st["down"] += 1
            v0, t0 = st["version"], env.now
            comp, down, up = (float(x[0]) for x in task.parts(pop, np.array([c])))
            dur = comp + down + up
            late = fed.deadline_s is not None and dur > fed.deadline_s
            yield env.timeout(fed.deadline_s if late else dur)
            busy[c] = False
            if done.triggered:
                return
            stale = fed.max_staleness is not None and st["version"] - v0 > fed.max_staleness
            if late or stale or not avail.online_at_end(np.array([c]), np.array([t0 + dur]))[0]:
                st["dropped"] += 1
                continue
            st["buffer"].append((st["version"] - v0, comp, down + up))
            if len(st["buffer"]) == fed.buffer_size:
                aggregate()

    for _ in range(fed.clients_per_round):
        env.process(slot())
