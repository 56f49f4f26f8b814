"""Full mode at scale: what makes it near-linear must not change what it computes.

Oracles: the same job simulated with every TP rank's flows (the plain model) against the
first TP rank standing for its group on the quotient network; work counted in events and
flows (exact counts, not timings: speed is benchmarks/bench_fullmode.py's), which must be
affine in the number of replicas when every replica does the same work; and the
garbage collector, which must find nothing a larger job leaves behind that a smaller one
does not (the run pauses it).
"""
from __future__ import annotations

import gc
from dataclasses import replace

import pytest
from helpers import scenario

from parsim.config.scenario import SimulationConfig
from parsim.costs.model_costs import ModelCosts
from parsim.scenario import load_scenario
from parsim.sim.fullsim import run_full
from parsim.simulate import schedule_for, simulate

L70 = "scenarios/llama3-70b-h100.toml"
FULL = ["simulation.mode=full"]
DP8_TP4 = ["parallel.dp=8", "parallel.tp=4", "parallel.pp=2", "gpus=64", "training.global_batch=64"]
DP8_TP2 = ["parallel.dp=8", "parallel.tp=2", "parallel.pp=4", "gpus=64", "training.global_batch=64"]


def _hw(sc, **kw):
    return replace(sc, hardware=replace(sc.hardware, **kw))


def _tp3():
    """tp = 3 on 6-GPU nodes (a block size that is no power of two: the quotient's
    capacities are divided inexactly), leaves of two nodes behind a 30:1 spine."""
    model = {"name": "t", "n_layers": 8, "d_model": 384, "n_heads": 6, "n_kv_heads": 6, "d_ff": 1536,
             "vocab_size": 1200, "ffn": "gelu", "norm": "layernorm", "bias": True, "position": "learned",
             "max_seq_len": 512}
    sc = scenario(pp=2, dp=6, tp=3, m=4, model=model, hardware="dgx-h100")
    sc = replace(sc, simulation=SimulationConfig("full"))
    return _hw(sc, gpus_per_node=6, nics_per_node=6, gpus_per_leaf=12, spine_oversubscription=30.0)


CONTENDED = {
    # leaves of two nodes behind a 16:1 spine: the dp rings' leaf crossings share the uplinks
    # (at 4:1 they would not: the uplink still carries them all at their NICs' rate)
    "spine 16:1, tp=4": lambda: _hw(load_scenario(L70, FULL + DP8_TP4), spine_oversubscription=16.0,
                                    gpus_per_leaf=16),
    "spine 16:1, no buckets": lambda: _hw(load_scenario(L70, FULL + DP8_TP4 + ["overlap.grad_reduce=false"]),
                                          spine_oversubscription=16.0, gpus_per_leaf=16),
    # one NIC per node: the block's flows (and the node's other blocks') all on it
    "one NIC per node, tp=2": lambda: _hw(load_scenario(L70, FULL + DP8_TP2), nics_per_node=1),
    "NIC per 2 GPUs, spine 3:1, ZeRO-3": lambda: _hw(load_scenario(L70, FULL + DP8_TP2 + ["parallel.zero=3"]),
                                                     nics_per_node=2, spine_oversubscription=3.0, gpus_per_leaf=16),
    "tp=3, spine 30:1": _tp3,
}


def _run(sc, lump: bool):
    sched = schedule_for(sc)
    return run_full(sc, sched, ModelCosts.from_scenario(sc), lump=lump)


@pytest.mark.parametrize("name", list(CONTENDED))
def test_first_tp_rank_standing_for_its_group_gives_the_same_timeline(name):
    """Every span of replica 0 (compute, p2p, dp collectives) and every memory event, with
    every TP rank's flows simulated and with the first standing for its group."""
    sc = CONTENDED[name]()
    every, st_every = _run(sc, lump=False)
    lumped, st = _run(sc, lump=True)
    assert st_every.lanes == sc.parallel.tp and st.lanes == 1
    assert st_every.net.flows == sc.parallel.tp * st.net.flows
    assert len(lumped.spans) == len(every.spans)
    for a, b in zip(sorted(every.spans), sorted(lumped.spans)):
        assert a[:5] == b[:5] and a[7] == b[7]
        assert b[5:7] == pytest.approx(a[5:7], rel=1e-12, abs=1e-15), (a, b)
    lumped_mem, every_mem = sorted(lumped.mem_events), sorted(every.mem_events)
    assert len(lumped_mem) == len(every_mem)
    for a, b in zip(every_mem, lumped_mem):  # (rank, time, delta bytes, kind): approx takes flat values only
        assert (b[0], b[3]) == (a[0], a[3])
        assert b[1:3] == pytest.approx(a[1:3], rel=1e-12, abs=1e-15), (a, b)


@pytest.mark.parametrize("name", list(CONTENDED))
def test_those_jobs_contend(name):
    """The cases above are worth something only if flows share links there: with the
    shared links (leaf uplinks, shared NICs) made ample, the step gets shorter."""
    sc = CONTENDED[name]()
    ample = _hw(sc, spine_oversubscription=1.0, nics_per_node=sc.hardware.gpus_per_node)
    assert simulate(ample).metrics["step_time_s"] < simulate(sc).metrics["step_time_s"] * 0.99


def test_asymmetric_blocks_simulate_every_tp_rank():
    """Four GPUs of a TP group on two NICs (two each): shifting inside the group does not map
    the NICs onto themselves, so each TP rank's flows run."""
    sc = _hw(load_scenario(L70, FULL + DP8_TP4), nics_per_node=4)
    _raw, st = _run(sc, lump=True)
    assert st.lanes == 4


def _job(dp: int):
    return load_scenario(L70, FULL + [f"parallel.dp={dp}", f"gpus={32 * dp}", f"training.global_batch={16 * dp}"])


def test_work_is_affine_in_the_number_of_replicas():
    """Every replica does the same work: flows, max-min computations and flow ratings grow
    in proportion to dp (no re-rating of other replicas' flows), events by the same amount
    per replica."""
    st = {dp: _run(_job(dp), lump=True)[1] for dp in (2, 4, 8)}
    assert st[8].net.flows == 4 * st[2].net.flows and st[4].net.flows == 2 * st[2].net.flows
    assert st[8].net.rated == 4 * st[2].net.rated
    assert st[8].net.components == 4 * st[2].net.components
    assert st[8].events - st[4].events == 2 * (st[4].events - st[2].events)
    assert st[8].processes == 4 * st[2].processes


def test_a_run_leaves_no_garbage_that_grows_with_the_job():
    """The collector is paused while the step runs; reference counting must free all of it
    (a cycle per replica would be memory a paused collector never gets back)."""
    left = {}
    for dp in (2, 16):
        sc = _job(dp)
        sched, costs = schedule_for(sc), ModelCosts.from_scenario(sc)
        gc.collect()
        run_full(sc, sched, costs)
        left[dp] = gc.collect()
        assert gc.isenabled()  # given back as it was
    assert left[16] == left[2]


def test_the_benchmark_job_at_1024_gpus_full_equals_fast():
    """Llama-3-405B, TP8 PP16 DP8, 1F1B (bench_fullmode.py's first row): nothing contends on
    a non-blocking fabric, so full mode's step is fast mode's within 1%."""
    doc = {"name": "llama3-405b-1k", "hardware": "dgx-h100", "gpus": 1024, "model": {"preset": "llama3-405b"},
           "training": {"global_batch": 128, "seq_len": 8192, "microbatch_size": 1, "recompute": "selective"},
           "parallel": {"dp": 8, "tp": 8, "pp": 16, "zero": 1, "sequence_parallel": True},
           "schedule": {"name": "1F1B"}}
    from parsim.scenario import scenario_from_dict
    fast = simulate(scenario_from_dict(doc, "t.toml")).metrics["step_time_s"]
    full = simulate(scenario_from_dict(doc | {"simulation": {"mode": "full"}}, "t.toml")).metrics["step_time_s"]
    assert full == pytest.approx(fast, rel=0.01)
