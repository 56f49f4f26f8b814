"""[stragglers]: slow GPUs and nodes, slow and failed NICs, pipeline ranks on other GPU types.

Oracles: the critical path of 1F1B with measured costs, worked by hand (below); full mode
against fast mode where both see the same job; a DP collective waits for its slowest member;
routes and capacities of the topology; the speed-balanced split moves layers off slow ranks.
"""
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import TINY_GPT

from parsim.cluster.hardware import load_profile
from parsim.errors import ConfigError
from parsim.scenario import scenario_from_dict
from parsim.sim.network import Topology
from parsim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent


def measured(p, m, f, b, c=0.0, stragglers=None):
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": p, "model": {**TINY_GPT, "n_layers": p},
           "training": {"global_batch": m, "seq_len": 512}, "parallel": {"pp": p},
           "schedule": {"name": "1F1B", "n_microbatches": m},
           "costs": {"forward_s": f, "backward_s": b, "p2p_s": c}}
    if stragglers:
        doc["stragglers"] = stragglers
    return scenario_from_dict(doc, "t.toml")


@pytest.mark.parametrize("c", [0.0, 0.1])
def test_slow_last_rank_of_1f1b_moves_the_step_by_its_critical_path(c):
    # p = 4 ranks, m = 8 microbatches, F = 1 s, B = 2 s, p2p c; the last rank 20% slower (F' = 1.2, B' = 2.4).
    # Critical path: microbatch 0's forward down ranks 0..2 and its sends, (p-1)(F + c); then the last
    # rank, never waiting (its upstream hands it a forward every F + B < 1.2 (F + B)), runs its m F' and
    # m B' back to back, m x 1.2 (F + B); then microbatch 7's backward up ranks 2..0 with its sends,
    # (p-1)(B + c). T = (p-1)(F + B + 2c) + 1.2 m (F + B) = 9 + 6c + 28.8.
    p, m, f, b = 4, 8, 1.0, 2.0
    res = simulate(measured(p, m, f, b, c, {"gpus": [[p - 1, 1.2]]}))
    assert res.metrics["step_time_s"] == pytest.approx((p - 1) * (f + b + 2 * c) + 1.2 * m * (f + b), rel=1e-12)
    ps = res.metrics["pace_setter"]
    assert (ps["replica"], ps["rank"], ps["gpus"], ps["slowdown"]) == (0, p - 1, [p - 1], 1.2)
    assert ps["busy_s"] == pytest.approx(1.2 * m * (f + b))
    if c == 0.0:  # against the uniform pipeline, (m + p - 1)(F + B): the slow rank adds 0.2 m (F + B) = 4.8 s
        uniform = simulate(measured(p, m, f, b)).metrics["step_time_s"]
        assert uniform == pytest.approx((m + p - 1) * (f + b))
        assert res.metrics["step_time_s"] - uniform == pytest.approx(0.2 * m * (f + b))


@pytest.mark.parametrize("k", [0, 1, 2])
def test_a_slow_middle_rank_costs_between_its_steady_state_and_all_its_work(k):
    # upstream of the last rank some of the slow rank's warm-up and cool-down work hides in the fill and
    # drain: at least its m - p + 1 steady-state microbatches are on the critical path, at most all m
    p, m, f, b = 4, 8, 1.0, 2.0
    uniform = (m + p - 1) * (f + b)
    extra = simulate(measured(p, m, f, b, 0.0, {"gpus": [[k, 1.2]]})).metrics["step_time_s"] - uniform
    assert 0.2 * (m - p + 1) * (f + b) - 1e-9 <= extra <= 0.2 * m * (f + b) + 1e-9


def test_throttled_node_slows_every_gpu_in_it():
    res = simulate(measured(4, 8, 1.0, 2.0, 0.0, {"nodes": [[0, 1.2]]}))  # 4 GPUs of one 8-GPU node
    assert res.metrics["step_time_s"] == pytest.approx(1.2 * 11 * 3.0)  # every rank 1.2x: the whole step


def job(mode="full", n=16, **stragglers):
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": n, "model": {**TINY_GPT, "n_layers": 8},
           "training": {"global_batch": 16, "seq_len": 512}, "parallel": {"pp": 2, "dp": n // 2},
           "schedule": {"name": "1F1B"}, "simulation": {"mode": mode}}
    if stragglers:
        doc["stragglers"] = stragglers
    return scenario_from_dict(doc, "t.toml")


def test_full_mode_straggler_in_another_replica_sets_the_pace():
    base = simulate(job()).metrics["step_time_s"]
    # GPU 9 is pipeline rank 1 of replica 4 (dp stride 2): the gradient all-reduce waits for it
    slow = simulate(job(gpus=[[9, 1.5]])).metrics
    assert slow["step_time_s"] > base * 1.05
    ps = slow["pace_setter"]
    assert (ps["replica"], ps["rank"], ps["gpus"], ps["slowdown"]) == (4, 1, [9], 1.5)
    # the same straggler in replica 0 costs the same in full mode, and full mode agrees with fast mode there
    same = simulate(job(gpus=[[1, 1.5]])).metrics["step_time_s"]
    assert same == pytest.approx(slow["step_time_s"], rel=0.01)
    assert simulate(job("fast", gpus=[[1, 1.5]])).metrics["step_time_s"] == pytest.approx(same, rel=0.01)


@pytest.mark.parametrize("zero", [2, 3])
def test_full_mode_straggler_with_per_microbatch_reductions(zero):
    """ZeRO-2/3 reduce every microbatch's gradients under its backward, bucket by bucket; a slow
    replica queues its next reduction while the others still run their buckets. Each collective
    keeps the number it was queued with (it once took the counter's newest value and the replicas
    joined different collectives: a deadlock). Oracle as above: the straggler costs the same in
    any replica, and replica 0's agrees with fast mode."""
    def zjob(mode="full", **st):
        sc = job(mode, **st)
        return replace(sc, parallel=replace(sc.parallel, zero=zero))
    base = simulate(zjob()).metrics["step_time_s"]
    other = simulate(zjob(gpus=[[9, 1.5]])).metrics["step_time_s"]
    first = simulate(zjob(gpus=[[1, 1.5]])).metrics["step_time_s"]
    assert other > base * 1.05
    assert other == pytest.approx(first, rel=0.01)
    assert simulate(zjob("fast", gpus=[[1, 1.5]])).metrics["step_time_s"] == pytest.approx(first, rel=0.01)


def test_degraded_nic_slows_the_gradient_reduction():
    base = simulate(job()).metrics
    slow = simulate(job(nics=[[0, 0.1]])).metrics
    assert slow["step_time_s"] > base["step_time_s"]
    assert slow["exposed_comm_by_axis_s"]["dp"] > base["exposed_comm_by_axis_s"]["dp"]


def test_failed_nic_is_rerouted_through_the_next_healthy_one():
    hw = load_profile("dgx-a100-80g")
    topo = Topology(hw, 16, nic_reroute={0: 1})
    links, _ = topo.route(0, 8)  # GPU 0 (node 0) to GPU 8 (node 1)
    assert topo.name(links[0]) == "nic_up[1]"
    assert topo.name(Topology(hw, 16).route(0, 8)[0][0]) == "nic_up[0]"
    half = Topology(hw, 16, nic_scale={3: 0.5})
    assert half.capacity[half.link("nic_up", 3)] == pytest.approx(0.5 * hw.nic.effective_bandwidth)
    simulate(job(failed_nics=[0]))  # runs: the node keeps seven NICs


def mixed(rank_hardware=None, balance=True):
    doc = {"name": "t", "hardware": "dgx-h100", "gpus": 32, "model": {"preset": "llama3-8b"},
           "training": {"global_batch": 64, "seq_len": 4096}, "parallel": {"pp": 4, "tp": 8},
           "schedule": {"name": "1F1B"}}
    if rank_hardware:
        doc["stragglers"] = {"rank_hardware": rank_hardware, "balance": balance}
    return scenario_from_dict(doc, "t.toml")


def test_a100_stages_in_an_h100_pipeline_get_fewer_layers_and_the_step_recovers():
    a100 = [[0, "dgx-a100-80g"], [1, "dgx-a100-80g"]]
    h100 = simulate(mixed()).metrics
    even = mixed(a100, balance=False)
    assert even.layers_per_stage == (8, 8, 8, 8)
    slow = simulate(even).metrics
    # the A100 ranks' own cost model: their busy time is the A100's (several times the H100's per block)
    assert slow["stages"][1]["busy_s"] > 2 * h100["stages"][1]["busy_s"]
    assert slow["pace_setter"]["rank"] in (0, 1)
    balanced = mixed(a100)
    lps = balanced.layers_per_stage
    assert sum(lps) == 32 and lps[0] + lps[1] < lps[2] + lps[3]
    fast = simulate(balanced).metrics
    assert h100["step_time_s"] < fast["step_time_s"] < slow["step_time_s"]
    busy = [s["busy_s"] for s in fast["stages"]]
    assert max(busy) / min(busy) < max(s["busy_s"] for s in slow["stages"]) / min(s["busy_s"] for s in slow["stages"])


ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("setting, needle", [
    ("stragglers.gpus=[[99999, 1.2]]", "stragglers.gpus: index 99999 is outside the job"),
    ("stragglers.gpus=[[1, 0]]", "stragglers.gpus: slowdown must be a positive number"),
    ("stragglers.nics=[[0, 1.5]]", "stragglers.nics: bandwidth fraction must be in 1/1000 to 1"),
    ("stragglers.slow=1", "stragglers.slow: unknown key"),
    ("stragglers.failed_nics=[0,1,2,3,4,5,6,7]", "every NIC of node 0 is down"),
    ("stragglers.nics=[[0, 0.5]]", 'need [simulation] mode = "full"'),
    ("stragglers.rank_hardware=[[0, \"no-such-gpu\"]]", "stragglers.rank_hardware"),
])
def test_bad_stragglers_one_line_exit_2(setting, needle):
    r = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/gpt3-175b-1f1b.toml", "--set", setting],
                       cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_drawn_gpu_variability_one_rank_is_its_own_draw():
    # one GPU, 4 microbatches of F = 1 s, B = 2 s: the step is its drawn factor x 12 s
    import numpy as np
    sc = measured(1, 4, 1.0, 2.0, 0.0, {"gpu_sigma": 0.1, "seed": 3})
    draw = math.exp(0.1 * np.random.default_rng(3).standard_normal(1)[0])
    assert simulate(sc).metrics["step_time_s"] == pytest.approx(draw * 12.0, rel=1e-12)


def test_drawn_gpu_variability_in_full_mode_the_slowest_draw_sets_the_pace():
    import numpy as np
    draws = np.exp(0.05 * np.random.default_rng(0).standard_normal(16))
    res = simulate(job(gpu_sigma=0.05, seed=0)).metrics
    ps = res["pace_setter"]
    assert ps["slowdown"] == pytest.approx(max(draws[g] for g in ps["gpus"]))
    assert res["step_time_s"] > simulate(job()).metrics["step_time_s"]
    assert simulate(job(gpu_sigma=0.05, seed=0)).metrics["step_time_s"] == res["step_time_s"]  # seeded
    r = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/gpt3-175b-1f1b.toml", "--set",
                        "stragglers.gpu_sigma=0.02"], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert r.returncode == 2 and 'mode = "full"' in r.stderr  # draws in every replica: fast mode refuses


def test_a_dp_replica_on_a100_sets_the_pace_of_an_h100_job():
    def dp2(hw="dgx-h100", mode="full", **st):
        doc = {"name": "t", "hardware": hw, "gpus": 32, "model": {"preset": "llama3-8b"},
               "training": {"global_batch": 32, "seq_len": 4096}, "parallel": {"pp": 2, "tp": 8, "dp": 2},
               "schedule": {"name": "1F1B"}, "simulation": {"mode": mode}}
        if st:
            doc["stragglers"] = st
        return scenario_from_dict(doc, "t.toml")
    h100 = simulate(dp2()).metrics["step_time_s"]
    a100 = simulate(dp2("dgx-a100-80g")).metrics["step_time_s"]
    mixed = simulate(dp2(replica_hardware=[[1, "dgx-a100-80g"]])).metrics
    # the gradient all-reduce waits for the A100 replica: the step is the A100 job's (on the H100 job's network)
    assert h100 < mixed["step_time_s"] == pytest.approx(a100, rel=0.02)
    assert mixed["pace_setter"]["replica"] == 1 and mixed["pace_setter"]["slowdown"] > 2
    with pytest.raises(ConfigError, match="replica_hardware"):  # fast mode simulates replica 0 only
        simulate(dp2(mode="fast", replica_hardware=[[1, "dgx-a100-80g"]]))


def test_a_slow_gpu_slows_its_token_slices():
    """TeraPipe's per-slice costs go through the straggler's factor too: every F of the slow
    GPU's stage lasts 1.5x its time on a healthy GPU (before, the slices bypassed the factor)."""
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate
    path = Path(__file__).resolve().parent.parent / "scenarios" / "gpt3-175b-terapipe-p3.toml"
    base = simulate(load_scenario(path, ["schedule.token_slices=4"]))
    slow = simulate(load_scenario(path, ["schedule.token_slices=4", "stragglers.gpus=[[0, 1.5]]"]))
    def f_spans(res):
        tl = res.timeline
        f = tl[(tl.stream == "compute") & (tl.op == "F") & (tl.stage == 0)]
        return sorted((f.end_s - f.start_s).round(12))
    assert f_spans(slow) == pytest.approx([1.5 * d for d in f_spans(base)], rel=1e-9)
    assert slow.metrics["step_time_s"] > base.metrics["step_time_s"]


def test_other_gpu_types_with_token_slices_are_refused_one_line():
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/gpt3-175b-terapipe-p3.toml",
                        "--set", "schedule.token_slices=4", "--set", 'stragglers.rank_hardware=[[0, "dgx-a100-80g"]]'],
                       cwd=root, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "stragglers.rank_hardware" in r.stderr
