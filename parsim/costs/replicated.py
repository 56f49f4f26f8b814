"""PipeDream as published (Narayanan et al., SOSP'19): per-layer costs for its partitioner, the
cost table of a pipeline whose stages are replicated (1F1B-RR), and the steady state of it.

* Per-layer costs come from the cost model with one layer per stage (the first layer carries
  the embedding, the last the LM head and loss): forward + backward seconds, gradient bytes,
  the activation sent after the layer.
* A stage of layers i..j costs the sum of its layers; its replicas (workers holding the same
  stage) synchronise their gradients with an all-reduce among themselves after every update,
  on their data-parallel stream (PipeDream's W^m term, overlapped with compute).
* Workers are numbered stage by stage over the pipeline ranks of the scenario (``parallel.pp``
  = the workers of one pipeline): worker w sits on the GPU of pipeline rank w, so links and
  the replicas' all-reduce use the real placement.
* The steady state is simulated (``parsim.sim.ampnet.simulate_async`` with PipeDream's
  one-forward-one-backward and NOAM = ceil(workers / input-stage workers) microbatches in
  flight, one update per microbatch on every worker, no flush).
"""
from __future__ import annotations

from dataclasses import replace

from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.scenario import Scenario
from parsim.costs.layer import cached_collective_time
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.schedule.ir import Op
from parsim.schedule.pipedream_planner import PipeDreamPlan, noam, plan, plan_period
from parsim.sim.ampnet import simulate_async, staleness_summary, steady_state
from parsim.sim.engine import OpCost


class LayerCosts:
    """Per-layer figures of a scenario (one layer per stage through the cost model)."""

    def __init__(self, sc: Scenario):
        n = sc.model.n_layers
        one = replace(sc, parallel=replace(sc.parallel, pp=n, vpp=1), layers_per_stage=(1,) * n,
                      schedule=replace(sc.schedule, name="1F1B", stage_replication=None, layers_per_stage=None),
                      costs=None)
        self.mc = ModelCosts.from_scenario(one)
        self.base = ModelCosts.from_scenario(sc)
        grad = PRECISION_TABLE[sc.training.precision].weight_bytes
        ops = [self.mc.stage_ops(l) for l in range(n)]
        self.f = [o[Op.F].duration_s for o in ops]
        self.b = [o[Op.B].duration_s for o in ops]
        self.step = [o.get(Op.STEP, OpCost(0.0)).duration_s for o in ops]
        self.stash = [o[Op.F].stash_bytes for o in ops]
        self.compute = [f + b for f, b in zip(self.f, self.b)]
        """Forward + backward seconds of one microbatch, per layer."""
        self.weights = [st.params * grad for st in self.mc.stage_costs]
        """Gradient bytes per layer (this GPU's shard)."""
        self.act = [st.p2p_bytes for st in self.mc.stage_costs]
        """Bytes sent after each layer (one activation, or its gradient back)."""
        self.gpus = self.base.groups.pipeline
        """Global GPU of each worker (pipeline rank) of the first pipeline."""
        self.hw = self.base.inputs.hardware
        self.cluster = self.base.layer_inputs.cluster

    def link(self, a: int, b: int) -> tuple[str, float, float]:
        lk = self.hw.link_between(self.gpus[a], self.gpus[b])
        return (lk.name, lk.effective_bandwidth, lk.latency_s)

    def comm(self, nbytes: float) -> float:
        """One transfer between neighbouring workers (the slowest neighbouring link)."""
        worst = 0.0
        for w in range(len(self.gpus) - 1):
            _, bw, lat = self.link(w, w + 1)
            worst = max(worst, nbytes / bw + lat if bw > 0 else lat)
        return worst

    def sync(self, nbytes: float, m: int, first: int = 0) -> float:
        """All-reduce of ``nbytes`` among ``m`` replicas on workers first .. first + m - 1."""
        if m <= 1:
            return 0.0
        group = tuple(self.gpus[first:first + m])
        return cached_collective_time(self.cluster, "all_reduce", float(nbytes), group)


class ReplicatedCosts:
    """The cost table of a replicated pipeline for ``simulate_async`` (stages x workers)."""

    def __init__(self, lc: LayerCosts, stages: tuple[tuple[int, int], ...], replication: tuple[int, ...]):
        self.lc, self.stages, self.replication = lc, stages, replication
        self._ops = []
        for i, j in stages:
            r = range(i, j + 1)
            self._ops.append({
                Op.F: OpCost(sum(lc.f[l] for l in r), stash_bytes=sum(lc.stash[l] for l in r)),
                Op.B: OpCost(sum(lc.b[l] for l in r), free_bytes=sum(lc.stash[l] for l in r)),
                Op.STEP: OpCost(sum(lc.step[l] for l in r)),
            })
        firsts = [sum(replication[:s]) for s in range(len(stages))]
        self.sync_s = tuple(lc.sync(sum(lc.weights[i:j + 1]), m, f)
                            for (i, j), m, f in zip(stages, replication, firsts))
        """Per stage: the replicas' gradient all-reduce after an update."""

    def op_cost(self, stage: int, op: Op) -> OpCost:
        return self._ops[stage].get(op, OpCost(0.0))

    def p2p_bytes(self, stage: int, op: Op) -> float:
        i, j = self.stages[stage]
        return self.lc.act[j] if op is Op.SEND_F else self.lc.act[i - 1] if i > 0 else 0.0

    def link_spec(self, src: int, dst: int) -> tuple[str, float, float]:
        return self.lc.link(src, dst)

    def send_post_s(self, nbytes: float) -> float:
        return self.lc.hw.send_post_time(nbytes)


def _even(n_layers: int, k: int) -> tuple[tuple[int, int], ...]:
    q, r = divmod(n_layers, k)
    out, first = [], 0
    for s in range(k):
        size = q + (s < r)
        out.append((first, first + size - 1))
        first += size
    return tuple(out)


def pipedream_plan(sc: Scenario, lc: LayerCosts | None = None) -> tuple[PipeDreamPlan, LayerCosts]:
    """The stages and replication of a PipeDream scenario: given, chosen by the partitioner
    (``"auto"``), or one worker per stage on the scenario's split."""
    lc = lc or LayerCosts(sc)
    workers = sc.parallel.pp
    rep = sc.schedule.stage_replication
    sync = lc.sync
    if rep == "auto":
        return plan(lc.compute, lc.weights, lc.act, workers, sync, lc.comm), lc
    if rep is None:
        stages, first = [], 0
        for n in sc.layers_per_stage:
            stages.append((first, first + n - 1))
            first += n
        rep = (1,) * len(stages)
    else:
        if sum(rep) != workers:
            raise ConfigError(sc.file, "schedule.stage_replication",
                              f"workers {list(rep)} sum to {sum(rep)}, not to the pipeline's pp={workers}")
        if len(rep) > sc.model.n_layers:
            raise ConfigError(sc.file, "schedule.stage_replication",
                              f"{len(rep)} stages for {sc.model.n_layers} layers")
        stages = _even(sc.model.n_layers, len(rep))
    stages = tuple(stages)
    return PipeDreamPlan(stages, tuple(rep), plan_period(lc.compute, lc.weights, lc.act, stages, rep, sync, lc.comm)), lc


def pipedream_steady_state(sc: Scenario) -> dict:
    """The ``pipedream_rr`` block: the plan, the simulated steady state (no flush, an update per
    microbatch on every worker), per-stage staleness and weight versions."""
    if sc.costs is not None:
        raise ConfigError(sc.file, "costs", "PipeDream's stage replication needs the cost model's "
                                            "per-layer costs; measured [costs] are per stage")
    p, lc = pipedream_plan(sc)
    costs = ReplicatedCosts(lc, p.stages, p.replication)
    m = sc.n_microbatches
    in_flight = noam(p.replication) * p.replication[0]
    n = 4 * max(m, in_flight)
    t = sc.schedule
    run = simulate_async(len(p.stages), n, costs, max_in_flight=in_flight, update_every=1,
                         replicas=p.replication, policy="1f1b", sync_s=costs.sync_s,
                         weight_stashing=t.weight_stashing, vertical_sync=t.vertical_sync, name="PipeDream")
    tokens = sc.training.microbatch_size * sc.training.seq_len
    per, tok = steady_state(run, tokens, skip=n // 4, window=n // 2)
    stale = [staleness_summary([v for inst, v in rows if n // 4 <= inst < 3 * n // 4]) for rows in run.staleness]
    return {
        "config": p.config(),
        "stage_layers": list(p.layers_per_stage),
        "stage_replication": list(p.replication),
        "planner_period_s": p.period_s,
        "noam": in_flight,
        "period_per_microbatch_s": per,
        "steady_state_step_s": per * m,
        "steady_state_tokens_per_s": tok * sc.parallel.dp,
        "replica_sync_s": list(costs.sync_s),
        "weight_stashing": t.weight_stashing,
        "vertical_sync": t.vertical_sync,
        "weight_versions": list(run.weight_versions),
        "staleness_steps": [st["mode"] for st in stale],
        "staleness": stale,
    }
