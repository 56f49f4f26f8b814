"""One IR, four interpreters: the dry run, the fast engine, the full engine and the torch
runtime must mean the same thing by a schedule, and each must refuse, before it starts,
what it does not run (parsim.schedule.coverage).

Oracles: each interpreter against another (the same durations give the same times), fast
mode's closed-form collective time against the same collective run as flows, and a
declaration against the code that is supposed to honour it.
"""
from __future__ import annotations

import pytest
import simpy

from parsim.cluster.collectives import collective_time
from parsim.cluster.hardware import load_profile
from parsim.config.parallel import ParallelConfig
from parsim.errors import ScheduleError
from parsim.scenario import load_scenario
from parsim.schedule import BUILDERS, Durations, build, dry_run, lower
from parsim.schedule.coverage import ALL_OPS, Coverage, Trait, check_runs, schedule_traits
from parsim.schedule.dryrun import COVERAGE as DRY_RUN
from parsim.schedule.ir import Op
from parsim.simulate import schedule_for, simulate
from parsim.sim.collective_flows import plan_collective
from parsim.sim.engine import COVERAGE as FAST
from parsim.sim.engine import OpCost, simulate_schedule
from parsim.sim.fullsim import COVERAGE as FULL
from parsim.sim.network import FlowNetwork, Topology
from parsim.validate.scale import RUNTIME_COVERAGE

TINY = "scenarios/tiny-cpu.toml"
NAMES = list(BUILDERS)
LOWERINGS = [{}, {"zero3": True}, {"early_recv": True}, {"zero3": True, "early_recv": True}]
INTERPRETERS = {"dry run": DRY_RUN, "fast engine": FAST, "full engine": FULL, "torch runtime": RUNTIME_COVERAGE}
# unequal durations (exact binary fractions), so that a wrong dependency shows up as a time
D = Durations(f=1.0, b=2.5, i=1.25, w=1.0, comm=0.375, unshard=0.75, reduce=1.5, step=0.5, overlap=3.0)


def _vpp(name: str) -> list[str]:
    return ["parallel.vpp=2"] if name == "Interleaved1F1B" else []


def _lowered(name: str, pp: int = 4, m: int = 8, **kw):
    return lower(build(name, pp, m, 2 if name == "Interleaved1F1B" else 1), **kw)


class ConstantCosts:
    """The dry run's durations as the engine's cost table (no bytes, p2p latency only)."""

    def __init__(self, d: Durations):
        self.d = d
        self.t = {Op.F: d.f, Op.B: d.b, Op.I: d.i, Op.W: d.w, Op.STEP: d.step, Op.REDUCE_GRAD: d.reduce,
                  Op.UNSHARD: d.unshard, Op.RESHARD: 0.0}

    def op_cost(self, stage, op):
        return OpCost(self.t[op])

    def p2p_bytes(self, stage, op):
        return 0.0

    def link_spec(self, src, dst):
        return ("constant", 0.0, self.d.comm)  # no bandwidth term: arrival = send + comm

    def overlap_cost(self, f_stage, b_stage, b_op):
        return self.d.overlap


# ----------------------------------------------------------------------------- (a) fast vs full


@pytest.mark.parametrize("name", NAMES)
def test_fast_and_full_mode_agree_on_tiny_cpu(name):
    """Nothing contends on two CPU ranks: the two engines must give the same step (1%)."""
    over = [f"schedule.name={name}", *_vpp(name)]
    if schedule_traits(_lowered(name)) & FULL.refuses:  # refused up front, in one line (section c)
        with pytest.raises(ScheduleError, match="the full engine does not run"):
            simulate(load_scenario(TINY, [*over, "simulation.mode=full"]))
        return
    fast = simulate(load_scenario(TINY, over)).metrics["step_time_s"]
    full = simulate(load_scenario(TINY, [*over, "simulation.mode=full"])).metrics["step_time_s"]
    assert full == pytest.approx(fast, rel=0.01)


# ----------------------------------------------------------------------------- (b) dry run vs fast


def _engine_spans(sched, raw) -> list[list[tuple[float, float]]]:
    """The fast engine's (start, end) per action, in the dry run's layout (RECV/RESHARD: skipped)."""
    rows: dict[tuple, list] = {}
    for rank, _stream, op, stage, mb, start, end, _b in raw.spans:
        rows.setdefault((rank, op, stage, mb), []).append((start, end))
    taken: dict[tuple, int] = {}

    def take(r, op, stage, mb):
        key = (r, op, stage, -1 if mb is None else mb)
        k = taken.get(key, 0)
        taken[key] = k + 1
        return rows[key][k]

    out = []
    for r, row in enumerate(sched.actions):
        spans = []
        for a in row:
            if a.op in (Op.RECV_F, Op.RECV_B, Op.RESHARD):
                spans.append(None)
            elif a.op is Op.OVERLAP_F_B:  # recorded as its F then its B part
                f, b = a.sub
                spans.append((take(r, "F", f.stage, f.microbatch)[0], take(r, b.op.value, b.stage, b.microbatch)[1]))
            else:
                spans.append(take(r, a.op.value, a.stage, a.microbatch))
        out.append(spans)
    return out


@pytest.mark.parametrize("kw", LOWERINGS, ids=["plain", "zero3", "early_recv", "zero3+early_recv"])
@pytest.mark.parametrize("name", NAMES)
def test_dry_run_and_fast_engine_give_identical_times(name, kw):
    sched = _lowered(name, **kw)
    dry = dry_run(sched, D)
    engine = _engine_spans(sched, simulate_schedule(sched, ConstantCosts(D)))
    n = 0
    for r, row in enumerate(sched.actions):
        for k, a in enumerate(row):
            if engine[r][k] is not None:
                assert engine[r][k] == dry.spans[r][k], f"rank {r} step {k} {a}"
                n += 1
    assert n > 0


# ----------------------------------------------------------------------------- (c) run or refused


def _emitted(sched) -> set[Op]:
    return {op for row in sched.actions for a in row for op in (a.op, *(p.op for p in a.sub or ()))}


def test_every_op_is_emitted_by_some_builder():
    """So that (c) below really covers every op of the IR."""
    seen = set()
    for name in NAMES:
        for kw in LOWERINGS:
            seen |= _emitted(_lowered(name, **kw))
    assert seen == ALL_OPS


def _refused(cov: Coverage, sched) -> ScheduleError | None:
    try:
        check_runs(sched, cov)
    except ScheduleError as e:
        return e
    return None


def _assert_refusal_line(err: ScheduleError, sched, cov: Coverage) -> None:
    line = str(err)
    assert "\n" not in line and err.grid is None
    assert sched.name in line and cov.interpreter in line
    named = [op.value for op in _emitted(sched) - cov.ops] + [t.value for t in schedule_traits(sched) & cov.refuses]
    assert any(x in line for x in named)


@pytest.mark.parametrize("name", NAMES)
def test_every_op_is_run_or_refused_by_each_interpreter(name):
    for kw in LOWERINGS:
        sched = _lowered(name, 2, 4, **kw)
        for label, cov in INTERPRETERS.items():
            assert cov.interpreter == label
            err = _refused(cov, sched)
            uncovered = _emitted(sched) - cov.ops or schedule_traits(sched) & cov.refuses
            assert (err is not None) == bool(uncovered), (label, kw)
            if err is not None:
                _assert_refusal_line(err, sched, cov)
        # run: each simulator completes every compute part of every rank
        run = dry_run(sched, D)
        for row, spans in zip(sched.actions, run.spans):
            assert all(e > s for a, (s, e) in zip(row, spans) if a.op.is_compute)
        raw = simulate_schedule(sched, ConstantCosts(D))
        parts = sum(len(a.parts) for row in sched.actions for a in row if a.op.is_compute)
        assert sum(1 for row in raw.spans if row[1] == "compute") == parts


@pytest.mark.parametrize("name", NAMES)
def test_full_engine_runs_every_lowering(name):
    """Full mode on a real cost model, dp=2 (ZeRO-3 gathers, reductions on the network),
    receives posted early or not: simulate() completes every action (it raises otherwise)."""
    if schedule_traits(_lowered(name)) & FULL.refuses:
        return  # refused up front (test_fast_and_full_mode_agree_on_tiny_cpu checks the line)
    for zero in (0, 3):
        sc = load_scenario(TINY, [f"schedule.name={name}", *_vpp(name), "gpus=4", "parallel.dp=2",
                                  "training.global_batch=16", f"parallel.zero={zero}", "simulation.mode=full"])
        for early in (False, True):
            res = simulate(sc, schedule=schedule_for(sc, early_recv=early))
            ops = set(res.timeline.op)
            assert "REDUCE_GRAD" in ops and ("UNSHARD" in ops) == (zero == 3)


def test_a_refusal_names_schedule_op_and_interpreter():
    cov = Coverage("test interpreter", ops=ALL_OPS - {Op.W})
    with pytest.raises(ScheduleError) as ei:
        check_runs(_lowered("ZBH1"), cov)
    assert str(ei.value).startswith("schedule ZBH1: the test interpreter does not run W actions (first: rank 0 step")
    check_runs(_lowered("1F1B"), cov)  # no W there: runs
    chimera = _lowered("Chimera")
    assert schedule_traits(chimera) == {Trait.TWO_CHAINS}
    with pytest.raises(ScheduleError, match="schedule Chimera: the test2 does not run two model chains"):
        check_runs(chimera, Coverage("test2", refuses=frozenset({Trait.TWO_CHAINS})))


def test_runtime_declaration_is_its_dispatch():
    """The torch runtime executes an action by calling ``_do_<OP>``: it declares exactly those
    (which schedules it runs correctly: tests/test_validate.py, gradient parity)."""
    pytest.importorskip("torch")
    from parsim.validate.runtime import RankRuntime
    handled = {op for op in Op if hasattr(RankRuntime, f"_do_{op.value}")}
    assert handled == RUNTIME_COVERAGE.ops


# ----------------------------------------------------------------------------- (d) DP collectives


LLAMA_DP = ["parallel.dp=16", "parallel.tp=4", "parallel.pp=1", "gpus=64"]


def _dp_spans(over: list[str], mode: str) -> tuple[float, dict]:
    res = simulate(load_scenario("scenarios/llama3-70b-h100.toml", [*over, f"simulation.mode={mode}"]))
    tl = res.timeline
    dp = tl[tl.stream == "dp"]
    return res.metrics["step_time_s"], {(r.op, r.stage): (r.end_s - r.start_s, r.end_s) for r in dp.itertuples()}


@pytest.mark.parametrize("extra", [
    ["overlap.grad_reduce=false"],                                  # the brief's case: one uncontended all-reduce
    ["overlap.grad_reduce=false", "overlap.param_gather=false"],    # ZeRO-1 gather after the step
    [],                                                             # bucketed under the backward, gather overlapped
    ["parallel.zero=3"],                                            # ZeRO-3 parameter gathers
])
def test_dp_collectives_agree_fast_and_full(extra):
    """REDUCE_GRAD of Llama-3-70B over dp=16 (2 ranks per node, 8 nodes) is 769 ms in full
    mode without the shared selection (flat rings through half the NICs) vs 385 ms fast."""
    t_fast, fast = _dp_spans(LLAMA_DP + extra, "fast")
    t_full, full = _dp_spans(LLAMA_DP + extra, "full")
    assert t_full == pytest.approx(t_fast, rel=0.01)
    assert set(full) == set(fast)
    for key, (dur, end) in fast.items():
        assert full[key][1] == pytest.approx(end, rel=0.01), key  # the collective ends together
        if key[0] != "REDUCE_GRAD" or "overlap.grad_reduce=false" in extra:
            assert full[key][0] == pytest.approx(dur, rel=0.01, abs=1e-9), key
    if "overlap.grad_reduce=false" in extra:
        # one ring reduce-scatter's bandwidth term (0.3846 s with the NIC at 0.86 of 50 GB/s,
        # 0.3846 x 0.86 / 0.94 at the 47 GB/s NCCL's maintainers state for NDR) plus, per extra
        # bucket, its 15 latency steps: 17.6B gradients in Megatron's 40M-parameter buckets = 441
        # collectives, a step = NIC 4 us + 2 x one leaf switch 0.13 us (dgx-h100)
        band = 0.3846 * 0.86 / 0.94
        assert fast[("REDUCE_GRAD", 0)][0] == pytest.approx(band + 440 * 15 * (4.0e-6 + 2 * 0.13e-6), rel=1e-3)


@pytest.mark.parametrize("path, over", [
    ("scenarios/llama3-70b-h100.toml", ["overlap.tp_comm=true"]),        # TP collectives pipelined in F/B
    ("scenarios/llama3-70b-h100.toml", ["schedule.name=DualPipeV"]),     # OVERLAP_F_B with dp, tp and pp
    ("scenarios/llama3-70b-h100.toml", ["schedule.name=ZBH1"]),          # split backward, bucketed reduction
    ("scenarios/llama3-70b-h100.toml", ["parallel.cp=2", "parallel.pp=2"]),  # one dp group per cp index
    ("scenarios/mixtral-8x7b-h100.toml", ["overlap.ep_comm=true"]),      # expert all-to-alls hidden, expert-dp
    ("scenarios/mixtral-8x7b-h100.toml", ["overlap.ep_comm=false"]),
])
def test_fast_and_full_mode_agree_on_bundled_jobs(path, over):
    """Every [overlap] key reaches both engines the same way (1%; what is left is p2p sharing)."""
    fast = simulate(load_scenario(path, over)).metrics["step_time_s"]
    full = simulate(load_scenario(path, [*over, "simulation.mode=full"])).metrics["step_time_s"]
    assert full == pytest.approx(fast, rel=0.01)


def _run_alone(hw, n_gpus: int, plans) -> float:
    env = simpy.Environment()
    topo = Topology(hw, n_gpus)
    net = FlowNetwork(env, topo.capacity)

    def go():
        for k in range(len(plans[0].phases)):
            yield env.all_of([net.transfer(topo.route(a, b)[0], x) for p in plans for a, b, x in p.phases[k].flows])
            yield env.timeout(max(p.phases[k].latency_s for p in plans))
    env.process(go())
    env.run()
    return env.now


@pytest.mark.parametrize("hw_name", ["dgx-h100", "dgx-a100-80g", "cpu-gloo"])
def test_collective_flows_take_fast_modes_time(hw_name):
    """Every group of an axis at once (fast mode's concurrency), nothing else on the network:
    the flows of the selected algorithm take exactly ``collective_time``."""
    hw = load_profile(hw_name)
    algorithms = set()
    for dp, tp, pp in [(16, 4, 1), (4, 8, 2), (8, 2, 2), (8, 1, 1), (1, 8, 1), (64, 1, 1), (2, 1, 2)]:
        par = ParallelConfig(dp=dp, tp=tp, pp=pp)
        for axis in ("dp", "tp"):
            groups = sorted({tuple(par.group_ranks(axis, r)) for r in range(par.world_size)})
            for kind in ("all_reduce", "reduce_scatter", "all_gather"):
                for nbytes in (1e4, 1e6, 1e8, 1e10):
                    plans = [plan_collective(hw, kind, nbytes, list(g)) for g in groups]
                    want = collective_time(hw, kind, nbytes, list(groups[0]))
                    got = _run_alone(hw, par.world_size, plans) if plans[0].phases else 0.0
                    assert got == pytest.approx(want, rel=1e-9, abs=1e-15), (dp, tp, pp, axis, kind, nbytes)
                    algorithms.add(plans[0].algorithm)
    if hw_name == "dgx-h100":
        assert algorithms == {"ring", "tree", "hierarchical", "nvls"}


# ----------------------------------------------------------------------------- (e) validate


@pytest.mark.parametrize("name", NAMES)
def test_validate_refuses_before_launching_a_rank(name, monkeypatch, capsys):
    """``parsim validate`` on a schedule the runtime does not run: exit 2, one line naming
    schedule, op (or trait) and interpreter, and no rank process."""
    import parsim.validate.launch as launch_mod
    from parsim.cli.main import main

    def no_launch(*a, **k):
        raise AssertionError("a rank process was launched")
    monkeypatch.setattr(launch_mod, "launch", no_launch)
    sched = schedule_for(load_scenario(TINY, [f"schedule.name={name}", *_vpp(name)]))
    err = _refused(RUNTIME_COVERAGE, sched)
    if err is None:
        return  # runnable: one real run below, the rest in tests/test_validate.py (gradient parity)
    rc = main(["validate", TINY, "--set", f"schedule.name={name}", *[x for v in _vpp(name) for x in ("--set", v)],
               "--steps", "1", "--warmup", "0", "--repeat", "1"])
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and out.out == ""
    assert lines[0].startswith(f"parsim: error: {TINY}: schedule.name: schedule {name}: the torch runtime does not run")
    _assert_refusal_line(err, sched, RUNTIME_COVERAGE)


@pytest.mark.torch
def test_validate_runs_one_step_of_a_v_shaped_schedule(capsys):
    """The one real launch: ZBV (two stages per rank, the loss on rank 0, split backward)."""
    pytest.importorskip("torch")
    from parsim.cli.main import main
    rc = main(["validate", TINY, "--set", "schedule.name=ZBV", "--steps", "1", "--warmup", "0", "--repeat", "1",
               "--json"])
    import json
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(out["losses"]) == 4  # m = 4 microbatches, each a loss on the rank holding the last stage
