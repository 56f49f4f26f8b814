"""Scenario -> lowered schedule + costs -> engine -> Result."""
from __future__ import annotations

from parsim.config.scenario import Scenario
from parsim.costs.inputs import pairs_forward_with_backward
from parsim.costs.mixed import MixedCosts, ReplicaCosts
from parsim.costs.model_costs import ModelCosts
from parsim.costs.offload_ops import tier_bytes_per_node
from parsim.costs.replicated import pipedream_steady_state
from parsim.costs.slices import SliceCostModel, SlicedCosts, slice_lengths
from parsim.errors import ConfigError, ScheduleError
from parsim.results.pace import pace_setter
from parsim.results.result import Result
from parsim.results.tiers import tier_metrics
from parsim.schedule import build, lower
from parsim.schedule.coverage import check_runs
from parsim.schedule.grid import format_grid
from parsim.schedule.ir import Schedule
from parsim.schedule.passes import pair_forward_with_backward
from parsim.schedule.semantics import canonical_key, traits
from parsim.schedule.terapipe import terapipe
from parsim.sim import engine, fullsim
from parsim.sim.ampnet import ampnet_metrics, simulate_ampnet
from parsim.sim.engine import simulate_schedule
from parsim.sim.stragglers import fast_stragglers


def schedule_for(sc: Scenario, early_recv: bool = False, token_slices: int | None = None) -> Schedule:
    """The lowered schedule a scenario runs (the same one the torch runtime executes);
    ``early_recv``: receives posted at the step's start (the gloo runtime's lowering);
    ``token_slices``: TeraPipe's K when already solved (else from the scenario)."""
    par = sc.parallel
    try:
        if canonical_key(sc.schedule.name) == "terapipe" and par.vpp == 1:
            k = token_slices if token_slices is not None else len(slice_lengths(sc)[0])
            sched = terapipe(par.pp, sc.n_microbatches, k)
        else:
            sched = build(sc.schedule.name, par.pp, sc.n_microbatches, par.vpp)
    except ScheduleError as e:
        # name the scenario file and key: the user fixes it there
        raise ScheduleError(f"{sc.file}: schedule.name: {e.problem}", e.grid) from None
    if pairs_forward_with_backward(sc):  # Megatron-Core's combined 1F1B (overlap.ep_comm)
        sched = pair_forward_with_backward(sched)
    return lower(sched, zero3=par.zero == 3 and par.grad_degree > 1, early_recv=early_recv,
                 reshard_after_forward=par.reshard_after_forward,
                 grad_per_microbatch=par.grad_degree > 1 and par.grad_per_microbatch,
                 reduce_after_all_backward=not sc.overlap.grad_reduce)


def full_mode(sc: Scenario) -> bool:
    """Whether ``sc`` runs in the full engine (``[simulation] mode = "full"``, no measured ``[costs]``)."""
    return sc.simulation.mode == "full" and sc.costs is None


def engine_costs(sc: Scenario, costs: ModelCosts):
    """What the engines run: ``costs``, with ``[stragglers]`` ranks and replicas on other GPU types
    costed on their own profiles."""
    run = costs
    st = sc.stragglers
    if st is not None and (st.rank_hardware or st.replica_hardware) and isinstance(costs, SlicedCosts):
        raise ConfigError(sc.file, "stragglers.rank_hardware" if st.rank_hardware else "stragglers.replica_hardware",
                          "other GPU types with token slices (TeraPipe) are not modelled: the slices are "
                          "costed on the scenario's own hardware")
    if sc.stragglers is not None and sc.stragglers.rank_hardware:
        run = MixedCosts(sc, costs)
    if sc.stragglers is not None and sc.stragglers.replica_hardware and full_mode(sc):
        run = ReplicaCosts(sc, run)
    return run


def schedule_and_costs(sc: Scenario, costs: ModelCosts, schedule: Schedule | None = None):
    """(lowered schedule, cost table) the engines run for ``sc``: with ``token_slices`` (TeraPipe)
    the slices are solved first and the table answers per slice (``parsim.costs.slices``)."""
    if sc.schedule.token_slices is not None and not isinstance(costs, SlicedCosts):
        if sc.costs is not None:
            raise ScheduleError(f"{sc.file}: schedule.token_slices: measured [costs] are per sequence; "
                                "token slices need the cost model (remove [costs] or token_slices)")
        model = SliceCostModel(sc, costs)
        costs = SlicedCosts(model, slice_lengths(sc, model)[0])
    if schedule is None and isinstance(costs, SlicedCosts):
        schedule = schedule_for(sc, token_slices=len(costs.lengths))
    return (schedule if schedule is not None else schedule_for(sc)), costs


def simulate(sc: Scenario, costs: ModelCosts | None = None, schedule: Schedule | None = None) -> Result:
    """Simulate one optimizer step of ``sc`` (``schedule``: an already lowered one of it)."""
    costs = costs or ModelCosts.from_scenario(sc)
    if traits(sc.schedule.name).message_driven:
        return _simulate_message_driven(sc, costs)
    sched, costs = schedule_and_costs(sc, costs, schedule)
    run = engine_costs(sc, costs)
    if full_mode(sc):
        check_runs(sched, fullsim.COVERAGE)  # before anything starts: one line if it cannot
        if not sc.overlap.p2p:
            raise ConfigError(sc.file, "overlap.p2p", "the full engine sends asynchronously; blocking sends "
                                                      "(p2p = false) run in fast mode")
        raw = fullsim.simulate_full(sc, sched, run)
    else:
        check_runs(sched, engine.COVERAGE)
        raw = simulate_schedule(sched, fast_stragglers(sc, sched, run))
    _check_complete(sched, raw)
    res = Result.from_raw(sc, sched, costs.tables(sched.stage_to_rank), raw)
    _add_tiers(sc, costs, sched.stage_to_rank, res)
    if sc.stragglers is not None:
        ratio = run.busy_ratio(sched.stage_to_rank) if isinstance(run, ReplicaCosts) else None
        res.metrics["pace_setter"] = pace_setter(sc, res.metrics, ratio)
    if isinstance(costs, SlicedCosts):
        res.metrics["token_slice_lengths"] = list(costs.lengths)
    if traits(sc.schedule.name).weight_versions == "pipedream" and (
            sc.costs is None or sc.schedule.stage_replication is not None):
        res.metrics["pipedream_rr"] = pipedream_steady_state(sc)  # as published: no flush, 1F1B-RR
    return res


def _add_tiers(sc: Scenario, costs, stage_to_rank: tuple[int, ...], res: Result) -> None:
    """[offload]: host and NVMe bytes per node and per-tier time in ``res.metrics`` (zeros and an
    empty ``tier_time_s`` without offload), every engine's result alike; a host side that does
    not fit makes the job not fit."""
    host, nvme = (tier_bytes_per_node(costs, stage_to_rank)
                  if sc.offload.active and sc.costs is None else (0.0, 0.0))
    tiers = tier_metrics(sc, res.timeline, host, nvme)
    res.metrics.update(tiers)
    if not tiers["host_fits"]:
        res.metrics["fits_in_memory"] = False


def _simulate_message_driven(sc: Scenario, costs: ModelCosts) -> Result:
    """AMPNet: one step (the microbatches of one step from an empty pipeline, updates as they
    come) as the timeline, and a 4-step run for the steady state and the staleness."""
    par = sc.parallel
    sched = schedule_for(sc)  # the registry's order: names the schedule, refuses impossible shapes
    if sc.simulation.mode == "full":
        check_runs(sched, fullsim.COVERAGE)
    if par.dp > 1 or par.vpp > 1:
        raise ScheduleError(f"{sc.file}: schedule.name: AMPNet runs one model replica with one stage per "
                            f"rank (dp=1, vpp=1), got dp={par.dp} vpp={par.vpp}")
    m = sc.n_microbatches
    run = simulate_message_driven_run(sc, costs)
    long_run = simulate_message_driven_run(sc, costs, n_instances=4 * m)
    res = Result.from_raw(sc, run.schedule, costs.tables(run.schedule.stage_to_rank), run.raw)
    _add_tiers(sc, costs, run.schedule.stage_to_rank, res)
    tokens = sc.training.microbatch_size * sc.training.seq_len
    res.metrics["ampnet"] = ampnet_metrics(run, long_run, m, tokens, *ampnet_keys(sc))
    return res


def ampnet_keys(sc: Scenario) -> tuple[int, int]:
    """(max_in_flight, update_every) of an AMPNet scenario, unset keys at their default 1."""
    return sc.schedule.max_in_flight or 1, sc.schedule.update_every or 1


def simulate_message_driven_run(sc: Scenario, costs, n_instances: int | None = None):
    """AMPNet from an empty pipeline on ``costs``: ``n_instances`` instances (default: one step's
    ``sc.n_microbatches``)."""
    return simulate_ampnet(sc.parallel.pp, n_instances or sc.n_microbatches, costs, *ampnet_keys(sc))


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
