"""Flow-level network: fair sharing, topology routes, DP overlap, ZeRO bytes, full mode."""
import pytest
import simpy
from helpers import scenario

from parsim.cluster.hardware import load_profile
from parsim.sim.network import FlowNetwork, Topology, max_min_rates
from parsim.simulate import simulate

A100 = load_profile("dgx-a100-80g")


def _run(transfers, n_gpus=32):
    """transfers: (name, src, dst, bytes, start) -> finish times."""
    topo = Topology(A100, n_gpus)
    env = simpy.Environment()
    net = FlowNetwork(env, topo.capacity)
    done = {}

    def go(name, src, dst, nbytes, at):
        yield env.timeout(at)
        links, _ = topo.route(src, dst)
        yield net.transfer(links, nbytes)
        done[name] = env.now
    for t in transfers:
        env.process(go(*t))
    env.run()
    return done


def test_two_flows_on_one_link_take_twice_as_long():
    alone = _run([("a", 0, 8, 1e9, 0.0)])["a"]
    assert alone == pytest.approx(1e9 / A100.nic.effective_bandwidth)
    both = _run([("a", 0, 8, 1e9, 0.0), ("b", 0, 16, 1e9, 0.0)])  # share GPU 0's NIC
    assert both["a"] == pytest.approx(2 * alone) and both["b"] == pytest.approx(2 * alone)
    apart = _run([("a", 0, 8, 1e9, 0.0), ("b", 1, 9, 1e9, 0.0)])  # different rails: no sharing
    assert apart["a"] == pytest.approx(alone) and apart["b"] == pytest.approx(alone)


def test_rates_are_recomputed_when_a_flow_ends():
    t = 1e9 / A100.nic.effective_bandwidth
    done = _run([("long", 0, 8, 2e9, 0.0), ("short", 0, 16, 0.5e9, 0.0)])
    assert done["short"] == pytest.approx(t)          # half rate for 0.5 GB
    assert done["long"] == pytest.approx(2.5 * t)     # then the full link for the remaining 1.5 GB


def test_max_min_fairness_progressive_filling():
    # links: 0 (cap 10) shared by f1,f2; link 1 (cap 4) only f2 -> f2=4, f1=6
    assert max_min_rates({1: (0,), 2: (0, 1)}, [10.0, 4.0]) == {2: 4.0, 1: 6.0}


def test_routes_follow_the_topology():
    topo = Topology(A100, 32)
    links, lat = topo.route(0, 1)
    assert [topo.names[x] for x in links] == ["nv_up[0]", "nv_down[1]"] and lat == A100.nvlink.latency_s
    links, _ = topo.route(3, 11)
    assert [topo.names[x] for x in links] == ["nic_up[3]", "nic_down[11]"]


def _dp_job(seq_len, grad_reduce, mode="fast", zero=0):
    return simulate(scenario(dp=2, tp=8, m=2, model={"preset": "megatron-1.7b"},
                             training={"seq_len": seq_len, "global_batch": 4},
                             parallel={"zero": zero}, overlap={"grad_reduce": grad_reduce}
                             | ({"param_gather": False} if zero else {}))
                    if mode == "fast" else _full(seq_len, grad_reduce)).metrics


def _full(seq_len, grad_reduce):
    from dataclasses import replace

    from parsim.config.scenario import SimulationConfig
    sc = scenario(dp=2, tp=8, m=2, model={"preset": "megatron-1.7b"},
                  training={"seq_len": seq_len, "global_batch": 4}, overlap={"grad_reduce": grad_reduce})
    return replace(sc, simulation=SimulationConfig("full"))


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_dp_allreduce_hidden_when_backward_is_long_exposed_when_not(mode):
    def exposed(seq, overlap):
        return _dp_job(seq, overlap, mode)["exposed_comm_by_axis_s"]["dp"]
    long_on, long_off = exposed(2048, True), exposed(2048, False)
    short_on, short_off = exposed(64, True), exposed(64, False)
    assert long_off > 0 and short_off > 0
    assert long_on < 0.1 * long_off      # a long backward hides all but the last bucket
    assert short_on > 0.5 * short_off    # a short one cannot hide it


def test_full_mode_matches_fast_mode_without_contention():
    fast = _dp_job(512, False)["step_time_s"]
    full = simulate(_full(512, False)).metrics["step_time_s"]
    assert full == pytest.approx(fast, rel=0.01)


def test_zero_bytes_per_axis_follow_the_zero_paper():
    def dp_bytes(zero):
        # GPipe: all forwards, then all backwards -- ZeRO-3 gathers the parameters for each phase;
        # the paper's per-step volumes: gradients reduced once per step, parameters kept gathered
        # (per-microbatch semantics, the frameworks' default: tests/test_zero.py)
        sc = scenario(dp=4, tp=8, m=2, schedule="GPipe", model={"preset": "megatron-1.7b"}, training={"global_batch": 8},
                      parallel={"zero": zero, "grad_reduce": "step", "reshard_after_forward": False},
                      overlap={"param_gather": True})
        return simulate(sc).metrics["comm_bytes_by_axis"]["dp"]
    base = dp_bytes(0)
    assert dp_bytes(1) == pytest.approx(base)
    assert dp_bytes(2) == pytest.approx(base)
    assert dp_bytes(3) == pytest.approx(1.5 * base)
