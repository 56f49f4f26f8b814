"""Scenario -> lowered schedule + costs -> engine -> Result."""
from __future__ import annotations

from parsim.config.scenario import Scenario
from parsim.costs.mixed import MixedCosts, ReplicaCosts
from parsim.costs.model_costs import ModelCosts
from parsim.costs.offload_ops import tier_bytes_per_node
from parsim.errors import ScheduleError
from parsim.results.pace import pace_setter
from parsim.results.result import Result
from parsim.results.tiers import tier_metrics
from parsim.schedule import build, lower
from parsim.schedule.coverage import check_runs
from parsim.schedule.grid import format_grid
from parsim.schedule.ir import Schedule
from parsim.sim import engine, fullsim
from parsim.sim.engine import simulate_schedule
from parsim.sim.stragglers import fast_stragglers


def schedule_for(sc: Scenario, early_recv: bool = False) -> Schedule:
    """The lowered schedule a scenario runs (the same one the torch runtime executes);
    ``early_recv``: receives posted one compute ahead (the gloo runtime's lowering)."""
    par = sc.parallel
    try:
        sched = build(sc.schedule.name, par.pp, sc.n_microbatches, par.vpp)
    except ScheduleError as e:
        # name the scenario file and key: the user fixes it there
        raise ScheduleError(f"{sc.file}: schedule.name: {e.problem}", e.grid) from None
    return lower(sched, zero3=par.zero == 3 and par.dp > 1, early_recv=early_recv,
                 reshard_after_forward=par.reshard_after_forward,
                 grad_per_microbatch=par.dp > 1 and par.grad_per_microbatch)


def full_mode(sc: Scenario) -> bool:
    """Whether ``sc`` runs in the full engine (``[simulation] mode = "full"``, no measured ``[costs]``)."""
    return sc.simulation.mode == "full" and sc.costs is None


def engine_costs(sc: Scenario, costs: ModelCosts):
    """What the engines run: ``costs``, with ``[stragglers]`` ranks and replicas on other GPU types
    costed on their own profiles."""
    run = costs
    if sc.stragglers is not None and sc.stragglers.rank_hardware:
        run = MixedCosts(sc, costs)
    if sc.stragglers is not None and sc.stragglers.replica_hardware and full_mode(sc):
        run = ReplicaCosts(sc, run)
    return run


def simulate(sc: Scenario, costs: ModelCosts | None = None, schedule: Schedule | None = None) -> Result:
    """Simulate one optimizer step of ``sc`` (``schedule``: an already lowered one of it)."""
    sched = schedule if schedule is not None else schedule_for(sc)
    costs = costs or ModelCosts.from_scenario(sc)
    run = engine_costs(sc, costs)
    if full_mode(sc):
        check_runs(sched, fullsim.COVERAGE)  # before anything starts: one line if it cannot
        raw = fullsim.simulate_full(sc, sched, run)
    else:
        check_runs(sched, engine.COVERAGE)
        raw = simulate_schedule(sched, fast_stragglers(sc, sched, run))
    _check_complete(sched, raw)
    res = Result.from_raw(sc, sched, costs.tables(sched.stage_to_rank), raw)
    host, nvme = (tier_bytes_per_node(costs, sched.stage_to_rank)
                  if sc.offload.active and sc.costs is None else (0.0, 0.0))
    tiers = tier_metrics(sc, res.timeline, host, nvme)  # [offload]: host/NVMe bytes, per-tier time
    res.metrics.update(tiers)
    if not tiers["host_fits"]:
        res.metrics["fits_in_memory"] = False
    if sc.stragglers is not None:
        ratio = run.busy_ratio(sched.stage_to_rank) if isinstance(run, ReplicaCosts) else None
        res.metrics["pace_setter"] = pace_setter(sc, res.metrics, ratio)
    return res


def _check_complete(sched: Schedule, raw) -> None:
    """A rank whose compute did not all run is stuck: report where, with the grid."""
    done: dict[int, int] = {}
    for row in raw.spans:
        if row[1] == "compute":
            done[row[0]] = done.get(row[0], 0) + 1
    for rank, actions in enumerate(sched.actions):
        compute = [i for i, a in enumerate(actions) if a.op.is_compute for _ in a.parts]
        n = done.get(rank, 0)
        if n < len(compute):
            step = compute[n]
            raise ScheduleError(
                f"deadlock: rank {rank} never ran step {step} ({actions[step]})",
                format_grid(sched, mark=(rank, step)))
