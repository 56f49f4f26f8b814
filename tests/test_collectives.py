"""Collective costs: hand-computed alpha-beta numbers, nccl-tests busbw, placement, selection."""
import math

import pytest
from conftest import published

from parsim.cluster.collectives import (
    BUSBW_FACTOR,
    algorithm_times,
    alpha_beta_time,
    bus_bandwidth,
    bytes_sent_per_rank,
    collective_time,
    group_path,
    parameter_server_time,
    select_algorithm,
)
from parsim.cluster.hardware import load_profile
from parsim.config.parallel import ParallelConfig

A100, H100 = load_profile("dgx-a100-80g"), load_profile("dgx-h100")
S, B, ALPHA = 256e6, 100e9, 5e-6


@pytest.mark.parametrize("kind,n,expected", [
    ("all_reduce", 8, 2 * 7 / 8 * S / B + 2 * 7 * ALPHA),
    ("reduce_scatter", 8, 7 / 8 * S / B + 7 * ALPHA),
    ("all_gather", 16, 15 / 16 * S / B + 15 * ALPHA),
    ("all_to_all", 4, 3 / 4 * S / B + 3 * ALPHA),
    ("broadcast", 8, S / B + 7 * ALPHA),
    ("reduce", 8, S / B + 7 * ALPHA),
    ("gather", 8, 7 / 8 * S / B + 7 * ALPHA),
    ("scatter", 8, 7 / 8 * S / B + 7 * ALPHA),
    ("p2p", 2, S / B + ALPHA),
])
def test_ring_alpha_beta_hand_computed(kind, n, expected):
    assert alpha_beta_time(kind, S, n, B, ALPHA) == pytest.approx(expected, rel=1e-12)


def test_tree_and_nvls_hand_computed():
    assert alpha_beta_time("all_reduce", S, 64, B, ALPHA, "tree") == pytest.approx(
        2 * 63 / 64 * S / B + 2 * 6 * ALPHA)
    assert alpha_beta_time("broadcast", S, 16, B, ALPHA, "tree") == pytest.approx(S / B + 4 * ALPHA)
    assert alpha_beta_time("all_reduce", S, 8, B, ALPHA, "nvls") == pytest.approx(S / B + 2 * ALPHA)
    with pytest.raises(ValueError):
        alpha_beta_time("all_gather", S, 8, B, ALPHA, "tree")


def test_busbw_factors_match_nccl_tests():
    ex = published("nccl-busbw-factors")["expected"]["examples"]
    assert BUSBW_FACTOR["all_reduce"](8) == pytest.approx(ex["allreduce_n8_factor"])
    assert BUSBW_FACTOR["all_reduce"](64) == pytest.approx(ex["allreduce_n64_factor"], abs=1e-4)
    # a ring all-reduce at link bandwidth B shows busbw -> B for large S
    t = alpha_beta_time("all_reduce", 1e12, 8, B, ALPHA)
    assert bus_bandwidth("all_reduce", 1e12, 8, t) == pytest.approx(B, rel=1e-3)


def test_8gpu_allreduce_busbw_matches_nccl_a100_and_h100():
    size = 1 << 30
    t = collective_time(A100, "all_reduce", size, list(range(8)))
    a100 = published("nccl-a100-allreduce")["expected"]["single_node_8gpu_allreduce_busbw_GBps"]
    assert bus_bandwidth("all_reduce", size, 8, t) / 1e9 == pytest.approx(a100, rel=0.10)
    algo, t = select_algorithm(H100, "all_reduce", size, list(range(8)))
    h100 = published("nccl-h100-nvls-allreduce-8gpu")["expected"]["peak_busbw_GBps"]
    assert algo == "nvls"
    assert bus_bandwidth("all_reduce", size, 8, t) / 1e9 == pytest.approx(h100, rel=0.10)


def test_placement_decides_what_crosses_nodes():
    par = ParallelConfig(dp=4, tp=8, pp=2)
    tp = par.group_ranks("tp", 0)
    dp = par.group_ranks("dp", 0)
    assert tp == list(range(8)) and group_path(A100, tp).name == "nvlink"
    # one DP rank per node: 8 concurrent DP groups share the node's 8 NICs -> one NIC each
    path = group_path(A100, dp)
    assert path.name == "nic" and path.bandwidth == pytest.approx(A100.nic.effective_bandwidth)
    # tp innermost by default; putting dp innermost puts the DP group inside a node instead
    par2 = ParallelConfig(dp=4, tp=8, pp=2, order=("pp", "cp", "ep", "tp", "dp"))
    assert group_path(A100, par2.group_ranks("dp", 0)).name == "nvlink"
    assert group_path(A100, par2.group_ranks("tp", 0)).name == "nic"


def test_whole_node_group_uses_all_nics_and_spine_oversubscription_divides():
    ranks = list(range(16))  # two full nodes: the ring's node egress spreads over 8 NICs
    assert group_path(A100, ranks).bandwidth == pytest.approx(
        min(A100.nvlink.effective_bandwidth, 8 * A100.nic.effective_bandwidth))
    from dataclasses import replace
    over = replace(A100, spine_oversubscription=2.0, gpus_per_leaf=8)
    far = [0, 8]
    assert group_path(over, far, concurrent=1).bandwidth == pytest.approx(
        group_path(A100, far, concurrent=1).bandwidth / 2)


def test_selection_is_fastest_and_latency_favours_tree_for_small_messages():
    ranks = list(range(0, 512, 8))  # 64 ranks, one per node
    small = algorithm_times(A100, "all_reduce", 64e3, ranks)
    assert small["tree"] < small["ring"]
    assert select_algorithm(A100, "all_reduce", 64e3, ranks)[0] == "tree"
    hier = algorithm_times(A100, "all_reduce", 1e9, list(range(32)))
    assert "hierarchical" in hier and min(hier.values()) == collective_time(A100, "all_reduce", 1e9, list(range(32)))


def test_bytes_and_parameter_server():
    assert bytes_sent_per_rank("all_reduce", 1.0, 4) == pytest.approx(1.5)
    assert bytes_sent_per_rank("reduce_scatter", 1.0, 4) + bytes_sent_per_rank("all_gather", 1.0, 4) == \
        pytest.approx(bytes_sent_per_rank("all_reduce", 1.0, 4))
    ranks = [0, 8, 16, 24]
    ps = parameter_server_time(A100, 1e9, ranks)
    path = group_path(A100, ranks)
    assert ps == pytest.approx(2 * 3 * 1e9 / path.bandwidth + 2 * path.latency_s)
    ring = collective_time(A100, "all_reduce", 1e9, ranks)
    assert ps / ring == pytest.approx(4.0, rel=0.01)  # 2(n-1) S vs 2(n-1)/n S per link
    assert math.isclose(collective_time(A100, "all_reduce", 1e9, [0]), 0.0)


def test_parameter_server_dp_is_selectable_and_slower_than_ring_at_scale():
    """DP through a parameter server (reduce to one rank, broadcast back): 2(n-1)*S/B through the
    server's one link, against the ring's 2(n-1)/n*S/B -- selectable per scenario for comparison."""
    from helpers import scenario

    from parsim import simulate
    from parsim.cluster.collectives import group_path, parameter_server_time

    base = dict(pp=1, dp=16, m=2, overlap={"grad_reduce": False})
    ring = simulate(scenario(**base))
    ps = simulate(scenario(**base, parallel={"dp_comm": "parameter_server"}))

    def reduce_s(res):
        tl = res.timeline
        return float((tl.loc[tl["op"] == "REDUCE_GRAD", "end_s"] - tl.loc[tl["op"] == "REDUCE_GRAD", "start_s"]).sum())

    st = ps.tables.stages[0]
    hw = ps.scenario.hardware
    ranks = ps.scenario.parallel.group_ranks("dp", 0)
    path = group_path(hw, ranks)
    S = st.params * 2  # bf16 gradients
    assert reduce_s(ps) == pytest.approx(2 * 15 * S / path.bandwidth + 2 * path.latency_s, rel=1e-9)
    assert reduce_s(ps) == pytest.approx(parameter_server_time(hw, S, ranks), rel=1e-12)
    assert reduce_s(ps) > 4 * reduce_s(ring)
    assert ps.to_json()["step_time_s"] > ring.to_json()["step_time_s"]
