"""MoE kernels: grouped-GEMM waves by hand, fine-grained experts against the dense GEMM of the
same FLOPs, permute/router bytes by hand, the node-aware all-to-all.

Oracles: hand-counted tiles and round-robin slots (CUTLASS grouped scheduler), the HBM
roofline written out, closed-form byte counts, monotonicity.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from parsim.cluster import kernels as K
from parsim.cluster.hardware import load_profile
from parsim.config.moe import MoEConfig, moe_from_table
from parsim.costs import moe
from parsim.errors import ConfigError
from parsim.model import get_preset

H100 = load_profile("dgx-h100")


def test_grouped_slots_round_robin_by_hand():
    # 3 experts of 300 rows, tile 128x256: ceil(300/128) = 3 tiles each, 9 in all; over 4 slots
    # the round robin gives 3, 2, 2, 2 tiles; K = 640 is 10 blocks of 64 -> busiest 30 blocks
    probs = ((300, 256, 640),) * 3
    assert K._slot_loads(probs, (128, 256, 1), 64, 4) == (30, 3)
    # one launch, not one partial wave per expert: 8 tiles on 4 slots are 2 whole waves
    assert K._slot_loads(((256, 256, 64),) * 4, (128, 256, 1), 64, 4) == (2, 2)
    # ragged K (weight gradients): a 5-block tile and a 1-block tile on 2 slots
    assert K._slot_loads(((128, 256, 320), (128, 256, 64)), (128, 256, 1), 64, 2) == (5, 1)
    # the round robin continues across problems: 3 tiles then 2 on 4 slots -> slot 0 gets 2
    assert K._slot_loads(((384, 256, 64), (256, 256, 64)), (128, 256, 1), 64, 4) == (2, 2)


def _slot_loads_by_walking(problems, tile, k_block, slots):
    """Brute force: hand every tile of every problem to its slot, one by one."""
    tm, tn, _ = tile
    loads, tiles, j = [0] * slots, [0] * slots, 0
    for m, n, k in problems:
        if k == 0:
            continue
        for _ in range(math.ceil(m / tm) * math.ceil(n / tn)):
            loads[j] += math.ceil(k / k_block)
            tiles[j] += 1
            j = (j + 1) % slots
    busiest = max(range(slots), key=lambda s: (loads[s], tiles[s]))
    return loads[busiest], tiles[busiest]


def test_grouped_slots_equal_handing_out_every_tile():
    """The per-problem slot update (a difference array, O(1) per expert) against handing out
    every tile in turn, on random ragged problems that wrap the slots many times."""
    rng = np.random.default_rng(7)
    for _ in range(400):
        slots = int(rng.choice([1, 2, 3, 7, 66, 132]))
        probs = tuple((int(rng.integers(0, 1500)), int(rng.integers(0, 1500)), int(rng.choice([0, 1, 64, 700, 2048])))
                      for _ in range(int(rng.integers(0, 24))))
        tile = (int(rng.choice([64, 128, 256])), int(rng.choice([64, 128, 256])), 1)
        k_block = int(rng.choice([32, 64]))
        assert K._slot_loads(probs, tile, k_block, slots) == _slot_loads_by_walking(probs, tile, k_block, slots)


def test_grouped_gemm_bytes_and_floor_by_hand():
    probs = ((100, 512, 1024),) * 4
    want = 4 * ((100 * 1024 + 1024 * 512) * 2 + 100 * 512 * 2)
    assert K.grouped_gemm_bytes(probs, "bf16") == want
    plan = K.grouped_gemm_plan(H100.device, probs, "bf16")
    assert plan["time_s"] >= want / H100.device.effective_memory_bandwidth


def test_128_expert_top8_layer_is_slower_per_flop_than_dense():
    # Qwen3-30B-A3B's FC1 (d 2048 -> 2 x 768) for 4096 tokens, top-8 of 128 experts, all local:
    # 256 rows per expert. The dense GEMM of the same FLOPs is M = 32768. At the burst clock
    # (a microbenchmark's): under sustained load the dense GEMM slows with the clock and the
    # HBM-bound grouped launch does not, which narrows the gap (ratio 1.14 at 0.848 of the clock)
    dev = H100.device.burst()
    rows, n, k, e = 4096 * 8 // 128, 2 * 768, 2048, 128
    grouped = K.grouped_gemm_plan(dev, ((rows, n, k),) * e, "bf16")
    dense = K.gemm_plan(dev, rows * e, n, k, "bf16")
    flops = 2.0 * rows * e * n * k
    # tile arithmetic: 128x256 tiles -> 2 x 6 = 12 per expert, 1536 in all, the same count as
    # the dense GEMM's 256 x 6; what differs is that every expert reads its own weights:
    # 128 x 2048 x 1536 x 2 bytes = 805 MB against the dense GEMM's 6.3 MB, so the grouped
    # launch is held at the HBM roofline
    floor = e * ((rows * k + k * n) * 2 + rows * n * 2) / dev.effective_memory_bandwidth
    floor += dev.kernels.gemm_latency_s + dev.kernels.grouped_gemm_setup_s  # one launch's fixed time and setup
    assert grouped["memory_bound"] and grouped["time_s"] == pytest.approx(floor)
    # by how much: the floor over the dense time (the dense GEMM runs at its tile time, 12
    # waves of 128x256 tiles, compute-bound): about 1.35x the time per FLOP on an H100
    ratio = grouped["time_s"] / dense["time_s"]
    assert not dense["memory_bound"]
    assert ratio == pytest.approx(floor / dense["time_s"]) and 1.2 < ratio < 1.5, ratio
    assert flops / grouped["time_s"] < 0.8 * flops / dense["time_s"]
    # the same FLOPs as 8 experts of 4096 rows (EP16's share of a 16x larger batch) is the
    # same 1536 tiles in 12 waves and now compute-bound: within 5% of the dense GEMM but for the
    # grouped launch's setup (grouped_gemm_setup_us, measured: about 12% of this 0.2 ms launch)
    ep16 = K.grouped_gemm_plan(dev, ((4096, n, k),) * 8, "bf16")
    assert not ep16["memory_bound"] and ep16["waves"] == 12 == math.ceil(1536 / 132)
    setup = dev.kernels.grouped_gemm_setup_s
    assert setup > 0 and (ep16["time_s"] - setup) / dense["time_s"] == pytest.approx(1.0, abs=0.05)


def test_grouped_time_grows_with_rows_and_single_problem_matches_tiles():
    dev = H100.device
    t = [K.grouped_gemm_time(dev, ((m, 1536, 2048),) * 8) for m in (64, 128, 256, 512, 1024, 4096)]
    assert all(b >= a for a, b in zip(t, t[1:]))
    assert K.grouped_gemm_time(dev, ()) == 0.0


def test_permute_bytes_by_hand():
    # T = 10 tokens, k = 2, R = 30 received rows, d = 4, 2 bytes: a row is 8 bytes
    # forward: permute 2*T*k, sort 2R, inverse sort 2R, unpermute T*k + T -> 190 rows
    # backward: 2*T*k + 2R + 2R + 2*T*k (prob gradient reads outputs) + T -> 210 rows
    f, b = moe.permute_bytes(10, 2, 30, 4, 2)
    assert f == 190 * 8 and b == 210 * 8


def test_router_cost_monotone_in_experts():
    spec = get_preset("qwen3-30b-a3b")
    times = []
    for e in (8, 16, 32, 64, 128, 256):
        r = moe.Routing(1, 4096.0, np.full(e, 4096 * 8 / e), np.full(e, 4096 * 8 / e), None,
                        np.array([4096.0 * 8]), 4096.0 * 8)
        import dataclasses
        m = dataclasses.replace(spec, n_experts=e)
        kern = moe.layer_kernels(H100.device, m, MoEConfig(drop_tokens=False), "bf16", r, r.kept, 4096.0 * 8,
                                 m.d_ff_expert_)
        times.append(kern.router[0] + kern.router[1] + kern.router[2])
    assert all(b > a for a, b in zip(times, times[1:])), times
    fb, bb = moe.router_bytes(1000, 128)
    assert fb == 6 * 1000 * 128 * 4 and bb == 4 * 1000 * 128 * 4


def test_expert_rows_fp8_alignment_and_capacity_padding():
    kept = np.array([1.0, 17.0, 33.0])
    assert moe.expert_rows(kept, "bf16", None, False) == [1, 17, 33]
    assert moe.expert_rows(kept, "fp8", None, False) == [16, 32, 48]
    assert moe.expert_rows(kept, "mxfp8", None, False) == [32, 32, 64]
    assert moe.expert_rows(kept, "bf16", 40.0, True) == [40, 40, 40]


def test_quantize_bytes_zero_in_bf16_and_by_hand_in_fp8():
    assert moe.quantize_bytes(100, 8, 4, 3, "bf16") == (0.0, 0.0)
    f, b = moe.quantize_bytes(100, 8, 4, 3, "fp8")
    assert f == 100 * (8 + 4) * 4 and b == 100 * (8 + 2 * 4) * 4


def test_all_to_all_over_two_nodes_by_hand():
    hw = H100
    group = tuple(range(16))  # two DGX-H100 nodes
    s = 1e8
    nic = hw.nic.effective_bandwidth * hw.nics_per_node / hw.gpus_per_node
    inter = s * 8 / 16 / nic
    intra = s * 7 / 16 / hw.nvlink.effective_bandwidth
    lat = 15 * (hw.nic.latency_s + 2 * hw.switch_latency_s)
    assert moe.all_to_all_time(hw, s, group) == pytest.approx(max(inter, intra) + lat)
    # inside one node: NVLink only, faster than across nodes
    assert moe.all_to_all_time(hw, s, tuple(range(8))) < moe.all_to_all_time(hw, s, group)


def test_pad_to_capacity_needs_drop_tokens():
    with pytest.raises(ConfigError, match="pad_to_capacity"):
        moe_from_table({"pad_to_capacity": True, "drop_tokens": False}, "x.toml")
    assert moe_from_table({"pad_to_capacity": True}, "x.toml").pad_to_capacity


def test_routing_stash_by_hand():
    # 4096 tokens x 128 experts x (1 map + 4 probs + 4 row ids) bytes = 4.72 MB
    assert moe.routing_stash_bytes(4096, 128) == 4096 * 128 * 9


def test_deepep_crosses_each_node_once():
    # 8 experts on 2 nodes (4 each), top-2: P(a node holds neither) = (4/8)(3/7) = 3/14
    assert moe.distinct_nodes(8, 2, 2) == pytest.approx(2 * (1 - 3 / 14))
    assert moe.distinct_nodes(8, 2, 1) == 1.0
    hw = H100
    group = tuple(range(16))
    t, k, e, row = 4096, 8, 128, 2048 * 2
    remote = moe.distinct_nodes(e, k, 2) / 2  # the one other node, when hit
    nic = hw.nic.effective_bandwidth * hw.nics_per_node / hw.gpus_per_node
    rdma = t * remote * row / nic
    nvl = t * k * row * 7 / 8 / hw.nvlink.effective_bandwidth
    lat = hw.nic.latency_s + 2 * hw.switch_latency_s
    assert moe.deepep_time(hw, t, k, e, row, group) == pytest.approx(max(rdma, nvl) + lat)
    # fewer bytes over the network than the NCCL all-to-all of the same dispatch
    assert moe.deepep_time(hw, t, k, e, row, group) < moe.all_to_all_time(hw, t * k * row, group)


def _distinct_nodes_brute(e: int, k: int, nodes: int, groups: int, per_token: int) -> float:
    """Every choice of ``per_token`` groups, equally likely; within one, the exact chance a node
    holds one of the k experts drawn from the chosen groups' experts (counted expert by expert)."""
    size, per = e // groups, e // nodes
    total = count = 0.0
    for chosen in itertools.combinations(range(groups), per_token):
        experts = [x for g in chosen for x in range(g * size, (g + 1) * size)]
        for node in range(nodes):
            on = sum(1 for x in experts if x // per == node)
            total += 1 - math.comb(len(experts) - on, k) / math.comb(len(experts), k)
        count += 1
    return total / count


@pytest.mark.parametrize("e, k, nodes, groups, per_token", [
    (256, 8, 8, 8, 4),   # DeepSeek-V3 at EP64 on 8 nodes: a group is a node
    (256, 8, 4, 8, 4),   # EP32 on 4 nodes: two groups a node
    (256, 8, 16, 8, 4),  # a group spans two nodes
    (64, 6, 2, 8, 3),
    (64, 4, 8, 4, 2),
])
def test_group_limited_routing_reaches_the_nodes_brute_force_counts(e, k, nodes, groups, per_token):
    assert moe.distinct_nodes(e, k, nodes, groups, per_token) == pytest.approx(
        _distinct_nodes_brute(e, k, nodes, groups, per_token), rel=1e-12)
    # the limit only ever removes nodes; all groups allowed is no limit
    assert moe.distinct_nodes(e, k, nodes, groups, per_token) <= moe.distinct_nodes(e, k, nodes) + 1e-12
    assert moe.distinct_nodes(e, k, nodes, groups, groups) == moe.distinct_nodes(e, k, nodes)


def test_deepseek_v3_reaches_at_most_4_nodes_and_deepep_sends_less():
    m = get_preset("deepseek-v3")
    assert (m.expert_groups, m.expert_groups_per_token) == (8, 4)  # config.json n_group, topk_group
    assert moe.distinct_nodes(256, 8, 8, 8, 4) <= 4 < moe.distinct_nodes(256, 8, 8)
    group, t, row = tuple(range(64)), 4096, 7168 * 2
    limited = moe.deepep_time(H100, t, 8, 256, row, group, 1.0, (8, 4))
    assert limited < moe.deepep_time(H100, t, 8, 256, row, group)


@pytest.mark.parametrize("fields, key", [
    ({"expert_groups": 6}, "expert_groups"),                               # 6 does not divide 256
    ({"expert_groups": 8, "expert_groups_per_token": 0}, "expert_groups_per_token"),
    ({"expert_groups": 8, "expert_groups_per_token": 9}, "expert_groups_per_token"),
    ({"expert_groups": 128, "expert_groups_per_token": 2}, "expert_groups_per_token"),  # 2 x 2 experts < top-8
])
def test_bad_expert_groups_are_refused_naming_the_key(fields, key):
    import dataclasses
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(get_preset("deepseek-v3"), **fields)
    assert err.value.key == f"model.{key}"


def test_dispatcher_key_checked():
    with pytest.raises(ConfigError, match="moe.dispatcher"):
        moe_from_table({"dispatcher": "nccl"}, "x.toml")
    assert moe_from_table({"dispatcher": "deepep"}, "x.toml").dispatcher == "deepep"


# --------------------------------------------------------------- how the experts' GEMMs run
# Transformer Engine PR #2045 (NVIDIA/TransformerEngine, "Add Cutlass GroupGEMM Support for
# fine-grained MoE Model", table updated by a maintainer): ``general_grouped_gemm`` on H100 BF16,
# TE 2.7, CUDA 12.9, shape (groups, m, n, k) -> TFLOP/s of the default multi-stream cuBLAS path
# and of the CUTLASS grouped kernel. Microbenchmarks: burst clocks.
TE_2045 = {(8, 4096, 768, 2048): (627.903, 650.574), (16, 2048, 768, 2048): (553.945, 636.927)}


@pytest.mark.parametrize("shape", list(TE_2045))
def test_multi_stream_matches_te_grouped_linear_measurements(shape):
    g, m, n, k = shape
    dev = H100.device.burst()
    flops = 2.0 * g * m * n * k
    measured_ms, measured_cutlass = TE_2045[shape]
    ms = flops / K.multi_stream_gemm_time(dev, ((m, n, k),) * g, "bf16") / 1e12
    assert ms == pytest.approx(measured_ms, rel=0.10), ms
    # the one-kernel grouped model is what TE does not run by default: it is further off from
    # the multi-stream measurement, and (with the grouped launch's setup measured on an H200's
    # torch._grouped_mm, dgx-h100's grouped_gemm_setup_us: no TE figure was used for it) within 3%
    # of the CUTLASS grouped kernel measured beside it (-1.7% and +0.4%; 16% and 19% faster without it)
    grouped = flops / K.grouped_gemm_time(dev, ((m, n, k),) * g, "bf16") / 1e12
    assert abs(grouped / measured_ms - 1) > abs(ms / measured_ms - 1)
    assert grouped == pytest.approx(measured_cutlass, rel=0.03)


def test_expert_gemm_implementations_by_hand():
    dev = H100.device
    lat = dev.kernels.gemm_latency_s
    probs = ((2048, 1536, 2048), (1024, 1536, 2048), (0, 1536, 2048), (4096, 1536, 2048))
    alone = [K.gemm_plan(dev, m, n, k, "fp8")["time_s"] for m, n, k in probs if m]
    # a loop pays every kernel's fixed latency; the four streams pay it once
    assert K.loop_gemm_time(dev, probs, "fp8") == pytest.approx(sum(alone))
    assert K.multi_stream_gemm_time(dev, probs, "fp8") == pytest.approx(sum(alone) - (len(alone) - 1) * lat)
    # one problem: the three are the plain GEMM
    one = ((4096, 1536, 2048),)
    t = dev.kernel_gemm_time(4096, 1536, 2048, "fp8")
    assert K.multi_stream_gemm_time(dev, one, "fp8") == pytest.approx(t)
    assert K.loop_gemm_time(dev, one, "fp8") == pytest.approx(t)
    assert K.expert_gemm_time(dev, (), "bf16", "multi_stream") == 0.0
    with pytest.raises(ValueError, match="not one of"):
        K.expert_gemm_time(dev, one, "bf16", "cutlass")


def test_expert_gemm_follows_the_framework_and_the_key():
    from parsim.config.moe import default_expert_gemm
    from parsim.costs.inputs import cost_inputs
    from parsim.scenario import load_scenario
    assert default_expert_gemm(MoEConfig(), "megatron") == "multi_stream"   # TEGroupedMLP
    assert default_expert_gemm(MoEConfig(), "deepspeed") == "loop"          # deepspeed/moe/experts.py
    assert default_expert_gemm(MoEConfig(), "fsdp") == "grouped"            # torch._grouped_mm
    assert default_expert_gemm(MoEConfig(expert_gemm="loop"), "megatron") == "loop"
    with pytest.raises(ConfigError, match="moe.expert_gemm"):
        moe_from_table({"expert_gemm": "cutlass"}, "x.toml")
    # on a fine-grained model (16 local experts of 768) Megatron's four streams cost more than one
    # grouped kernel and less than a loop
    base = ["model.preset=qwen3-30b-a3b", "parallel.ep=8", "parallel.pp=1", "parallel.dp=8", "gpus=8",
            "training.global_batch=64", "moe.drop_tokens=false"]
    times = {}
    for impl in ("grouped", "multi_stream", "loop"):
        sc = load_scenario("scenarios/mixtral-8x7b-h100.toml", base + [f"moe.expert_gemm={impl!r}".replace("'", '"')])
        ph = moe.moe_phase(sc.model, sc.hardware, cost_inputs(sc).moe, "bf16", 4096, tuple(range(8)), 1, 1)
        times[impl] = sum(ph.kernels.grouped_gemm)
    assert times["grouped"] < times["multi_stream"] < times["loop"]
