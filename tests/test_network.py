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
    # a long backward hides all but the last of its 24 buckets (one per layer); the hidden 23
    # held NCCL's CTAs, so the backward they ran under ends s/N of their time later
    # (parsim.cluster.contention; dp = 2 across two A100 nodes: s = collective_ctas_net)
    kf = load_profile("dgx-a100-80g").device.kernels
    s_over_n = kf.collective_ctas_net / kf.sm_count
    assert long_on == pytest.approx(long_off / 24 + long_off * 23 / 24 * s_over_n, rel=1e-6)
    assert long_on < 0.2 * long_off
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


# ----------------------------------------------------------------------------- max-min vs brute force
# The oracle is the textbook definition, computed the slow way: every unfixed flow's rate
# rises together until some link is full; that link's flows are fixed; repeat over the
# remaining flows. No components, no heap, no batching: all flows, every time.


def _brute_max_min(flows: dict[int, tuple[int, ...]], capacity: list[float]) -> dict[int, float]:
    rate = {f: 0.0 for f in flows}
    fixed: set[int] = set()
    while len(fixed) < len(flows):
        free = [f for f in flows if f not in fixed]
        # how much every free flow can still grow before some link is full
        step = min((capacity[lk] - sum(rate[f] for f in flows if lk in flows[f]))
                   / sum(1 for f in free if lk in flows[f])
                   for lk in {lk for f in free for lk in flows[f]})
        for f in free:
            rate[f] += step
        for lk in {lk for f in free for lk in flows[f]}:
            used = sum(rate[f] for f in flows if lk in flows[f])
            if used >= capacity[lk] * (1 - 1e-12):
                fixed |= {f for f in free if lk in flows[f]}
    return rate


def _random_flows(rng, n_links: int, n_flows: int) -> dict[int, tuple[int, ...]]:
    return {f: tuple(rng.sample(range(n_links), rng.randint(1, min(4, n_links)))) for f in range(n_flows)}


def test_max_min_rates_equal_brute_force_on_random_networks():
    import random
    rng = random.Random(7)
    for _ in range(300):
        n_links = rng.randint(1, 9)
        capacity = [rng.choice([1.0, 2.0, 3.0, 10.0, rng.uniform(0.5, 20.0)]) for _ in range(n_links)]
        flows = _random_flows(rng, n_links, rng.randint(1, 12))
        got = max_min_rates(flows, capacity)
        want = _brute_max_min(flows, capacity)
        assert got.keys() == want.keys()
        for f in flows:
            assert got[f] == pytest.approx(want[f], rel=1e-9), (flows, capacity)
        # and it is max-min fair by definition: feasible, and every flow has a full link
        # on which no other flow gets more
        for lk in range(n_links):
            assert sum(got[f] for f in flows if lk in flows[f]) <= capacity[lk] * (1 + 1e-9)
        for f, links in flows.items():
            assert any(sum(got[g] for g in flows if lk in flows[g]) >= capacity[lk] * (1 - 1e-9)
                       and all(got[g] <= got[f] * (1 + 1e-9) for g in flows if lk in flows[g]) for lk in links)


def _brute_network(capacity: list[float], transfers) -> list[float]:
    """Completion time of each (start, links, bytes): global max-min over every active flow,
    recomputed at every start and every finish."""
    t, left = 0.0, {i: x[2] for i, x in enumerate(transfers)}
    done: dict[int, float] = {}
    pending = sorted(range(len(transfers)), key=lambda i: transfers[i][0])
    active: set[int] = set()
    while len(done) < len(transfers):
        while pending and transfers[pending[0]][0] <= t:
            active.add(pending.pop(0))
        rates = _brute_max_min({i: transfers[i][1] for i in active}, capacity) if active else {}
        nxt_start = transfers[pending[0]][0] if pending else float("inf")
        nxt_end = min((t + left[i] / rates[i] for i in active), default=float("inf"))
        t_next = min(nxt_start, nxt_end)
        for i in active:
            left[i] -= rates[i] * (t_next - t)
        t = t_next
        for i in [i for i in active if left[i] <= 1e-9 * transfers[i][2]]:
            active.discard(i)
            done[i] = t
    return [done[i] for i in range(len(transfers))]


def _flow_network(capacity: list[float], transfers, batched: bool) -> list[float]:
    env = simpy.Environment()
    net = FlowNetwork(env, capacity)
    done = [0.0] * len(transfers)

    def one(i, at, links, nbytes):
        yield env.timeout(at)
        yield net.transfer(list(links), nbytes)
        done[i] = env.now

    def together(at, group):
        yield env.timeout(at)
        yield net.start([(transfers[i][1], transfers[i][2]) for i in group])
        for i in group:
            done[i] = env.now

    if batched:  # one call per start instant: then all of them end when the last one does
        by_start: dict[float, list[int]] = {}
        for i, (at, _l, _b) in enumerate(transfers):
            by_start.setdefault(at, []).append(i)
        for at, group in by_start.items():
            env.process(together(at, group))
    else:
        for i, (at, links, nbytes) in enumerate(transfers):
            env.process(one(i, at, links, nbytes))
    env.run()
    return done


@pytest.mark.parametrize("seed", range(40))
def test_flow_network_matches_global_recomputation(seed):
    """Random networks, flows starting at random and at shared instants: every completion
    time equals the brute force's (global max-min re-computed at every event)."""
    import random
    rng = random.Random(seed)
    n_links = rng.randint(2, 8)
    capacity = [rng.choice([1.0, 4.0, rng.uniform(0.5, 8.0)]) for _ in range(n_links)]
    starts = [0.0, 0.0, 0.5, 1.0, rng.uniform(0, 3), rng.uniform(0, 3)]
    transfers = [(rng.choice(starts), tuple(rng.sample(range(n_links), rng.randint(1, min(3, n_links)))),
                  rng.choice([1.0, 2.0, rng.uniform(0.1, 5.0)])) for _ in range(rng.randint(1, 14))]
    want = _brute_network(capacity, transfers)
    got = _flow_network(capacity, transfers, batched=False)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    # started together in one call, each group ends with its last flow
    batched = _flow_network(capacity, transfers, batched=True)
    for i, (at, _l, _b) in enumerate(transfers):
        group_end = max(want[j] for j, x in enumerate(transfers) if x[0] == at)
        assert batched[i] == pytest.approx(group_end, rel=1e-9, abs=1e-12)


def test_a_flow_with_latency_arrives_one_latency_after_its_last_byte():
    env = simpy.Environment()
    net = FlowNetwork(env, [2.0])
    ev = net.transfer([0], 4.0, latency_s=0.25)
    env.run(ev)
    assert env.now == pytest.approx(2.25)
    assert net.stats.flows == 1


def test_link_ids_names_and_capacities():
    topo = Topology(A100, 32)
    n = 0
    for kind, count in (("nv_up", 32), ("nv_down", 32), ("nic_up", topo.n_nics), ("nic_down", topo.n_nics),
                        ("leaf_up", topo.n_leaves), ("leaf_down", topo.n_leaves)):
        for i in range(count):
            lk = topo.link(kind, i)
            assert topo.names[lk] == f"{kind}[{i}]"
            n += 1
    assert n == len(topo.capacity) == len(topo.names)
    assert topo.capacity[topo.link("nv_up", 5)] == A100.nvlink.effective_bandwidth
    assert topo.capacity[topo.link("nic_down", 3)] == A100.nic.effective_bandwidth
    with pytest.raises(KeyError):
        topo.link("nic_up", topo.n_nics)


def test_block_capacity_divides_only_what_a_block_shares():
    from dataclasses import replace
    over = replace(A100, spine_oversubscription=4.0, gpus_per_leaf=16)
    topo = Topology(over, 64)
    cap = topo.block_capacity(4)
    nv, nic, leaf = topo.link("nv_up", 1), topo.link("nic_up", 1), topo.link("leaf_down", 1)
    assert cap[nv] == topo.capacity[nv] and cap[nic] == topo.capacity[nic]   # the GPU's own
    assert cap[leaf] == topo.capacity[leaf] / 4                               # the block's four flows
    one_nic = Topology(replace(over, nics_per_node=1), 64).block_capacity(2)
    assert one_nic[topo.link("nic_up", 0)] == A100.nic.effective_bandwidth / 2  # the node's one NIC
    assert Topology(replace(A100, nics_per_node=4), 16).block_capacity(4) is None  # 2 NICs in a block of 4
    assert Topology(A100, 16).block_capacity(3) is None                           # 3 does not divide a node


@pytest.mark.parametrize("mode", ["fast", "full"])
def test_unoverlapped_reduction_of_every_chunk_waits_for_the_ranks_last_backward(mode):
    # interleaved 1F1B with two chunks per rank and dp = 2: without overlap.grad_reduce every
    # chunk's reduction starts once the rank's last backward has ended (Megatron's
    # finalize_model_grads after the flush); with it, the chunk that finishes first reduces
    # under the other chunk's last backwards
    from dataclasses import replace

    from parsim.config.scenario import SimulationConfig

    def spans(grad_reduce):
        sc = scenario(pp=2, dp=2, vpp=2, m=4, schedule="Interleaved1F1B", model={"preset": "megatron-1.7b"},
                      overlap={"grad_reduce": grad_reduce, "p2p": True})
        if mode == "full":
            sc = replace(sc, simulation=SimulationConfig("full"))
        t = simulate(sc).timeline
        return t[t["rank"].isin([0, 1])]
    off, on = spans(False), spans(True)
    for rank in (0, 1):
        mine = off[off["rank"] == rank]
        last_b = mine[mine["op"] == "B"]["end_s"].max()
        reduce = mine[mine["op"] == "REDUCE_GRAD"]
        assert len(reduce) == 2 and (reduce["start_s"] >= last_b - 1e-12).all()
        mine = on[on["rank"] == rank]
        assert mine[mine["op"] == "REDUCE_GRAD"]["start_s"].min() < mine[mine["op"] == "B"]["end_s"].max()
