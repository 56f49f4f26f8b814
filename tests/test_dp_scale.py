"""Data parallelism at scale and the accounting defects: gradient buckets, switch tiers, rails,
NVLS for every kind, two-copy gradient sync (DualPipe/Chimera), Muon's Newton-Schulz, HFU with
selective recompute, MoE MFU from routed tokens. Oracles: closed forms and hand-computed cases."""

import pytest
from test_interpreters import _run_alone

from parsim import load_scenario, simulate
from parsim.cluster.collectives import (
    KINDS,
    NVLS,
    SWITCH_RADIX,
    algorithm_times,
    alpha_beta_time,
    bucketed_time,
    grad_bucket_bytes,
    group_path,
    megatron_bucket_params,
    n_buckets,
    select_algorithm,
    switch_hops,
)
from parsim.cluster.hardware import load_profile
from parsim.costs.dp import NS_ITERATIONS, newton_schulz_flops, newton_schulz_matrices
from parsim.model import PRESETS
from parsim.sim.collective_flows import plan_collective

H100, A100 = load_profile("dgx-h100"), load_profile("dgx-a100-80g")
NIC_STEP = H100.nic.latency_s  # one ring step across nodes, before the switches


# ----------------------------------------------------------------------------- buckets

def test_bucket_count_is_a_ceiling_and_defaults_follow_the_frameworks():
    assert n_buckets(100.0, 30.0) == 4
    assert n_buckets(90.0, 30.0) == 3
    assert n_buckets(10.0, 0.0) == 1  # no bucketing: one collective
    assert n_buckets(0.0, 30.0) == 0
    # Megatron-core: max(40M, 1M x dp) parameters; bf16 gradients are 2 bytes
    assert megatron_bucket_params(16) == 40e6 and megatron_bucket_params(192) == 192e6
    assert grad_bucket_bytes(0, 192, 2) == 192e6 * 2
    assert grad_bucket_bytes(25 * 2 ** 20, 192, 2) == 25 * 2 ** 20  # stated (DDP's 25 MiB) wins


def test_buckets_pay_one_latency_term_each_hand_computed():
    """Two nodes, one GPU each (a DP pair beside TP ranks): ring all-reduce on one rail,
    S/B + 2a per call; ten buckets: S/B + 20a (the bandwidth term does not change)."""
    ranks = [0, 8]
    b = H100.nic.effective_bandwidth  # the node's 8 NICs shared by the 8 concurrent groups: one rail each
    a = H100.nic.latency_s + 2 * 1 * H100.switch_latency_s  # one leaf switch, there and back
    S = 1e9
    name, t, nb = bucketed_time(H100, "all_reduce", S, ranks, S / 10)
    assert (name, nb) == ("ring", 10)
    assert t == pytest.approx(S / b + 20 * a, rel=1e-12)
    assert bucketed_time(H100, "all_reduce", S, ranks, 0)[1] == pytest.approx(S / b + 2 * a, rel=1e-12)


def test_each_dp_group_gets_its_rail():
    """All eight DP groups of a node of TP ranks reduce at once: each gets one NIC's bandwidth."""
    path = group_path(H100, [0, 8, 16, 24])
    assert path.bandwidth == pytest.approx(H100.nic.effective_bandwidth * H100.nics_per_node / 8)
    alone = group_path(H100, [0, 8, 16, 24], concurrent=1)
    assert alone.bandwidth == pytest.approx(min(H100.nic.effective_bandwidth * 8, H100.nvlink.effective_bandwidth))


def test_latency_grows_with_the_switch_tiers():
    """Inside a leaf domain (256 GPUs) one switch; through a spine (radix-64 two-tier pod: 64^2/2
    = 2048 GPUs) three; through a core tier (64^3/4 = 65536) five; beyond, seven."""
    assert SWITCH_RADIX ** 2 // 2 == 2048 and SWITCH_RADIX ** 3 // 4 == 65536
    cases = [([0, 1], 0), ([0, 8], 1), ([0, 256], 3), ([0, 2048], 5), ([0, 65536], 7)]
    for ranks, hops in cases:
        assert switch_hops(H100, ranks) == hops, ranks
    lat = [group_path(H100, r).latency_s for r, _ in cases[1:]]
    assert lat == pytest.approx([H100.nic.latency_s + 2 * h * H100.switch_latency_s for h in (1, 3, 5, 7)])
    assert lat == sorted(lat) and len(set(lat)) == 4


def test_spine_oversubscription_divides_the_bandwidth_across_leaves():
    """The Llama 3 cluster's 1:7 aggregation layer: a group crossing leaves gets 1/7 of its rail."""
    from dataclasses import replace
    hw = replace(H100, spine_oversubscription=7.0)
    inside, across = group_path(hw, [0, 8]), group_path(hw, [0, 256])
    assert across.bandwidth == pytest.approx(inside.bandwidth / 7)


def test_a_large_dp_reduction_picks_the_tree_for_small_buckets():
    """192 nodes (MegaScale's dp): the ring's 2 x 191 latency steps lose to the tree's 2 x 8 for a
    small bucket; for a huge buffer the bandwidth terms are equal and the ring's alpha is paid once."""
    ranks = [8 * i for i in range(192)]
    assert select_algorithm(H100, "all_reduce", 1e6, ranks)[0] == "tree"
    times = algorithm_times(H100, "all_reduce", 1e6, ranks)
    assert times["ring"] - times["tree"] == pytest.approx((2 * 191 - 2 * 8) * group_path(H100, ranks).latency_s)


def test_full_mode_plan_of_buckets_takes_fast_modes_time():
    """The eight DP groups of four nodes reduce at once, nothing else on the network: the
    bucketed plans' flows take fast mode's nb x one bucket's time."""
    for kind in ("all_reduce", "reduce_scatter"):
        S, bucket = 4e8, 5e7
        _, want, nb = bucketed_time(H100, kind, S, [0, 8, 16, 24], bucket)
        plans = [plan_collective(H100, kind, S, [i, 8 + i, 16 + i, 24 + i], n_buckets=nb) for i in range(8)]
        assert nb == 8 and plans[0].time_s == pytest.approx(want)
        assert _run_alone(H100, 32, plans) == pytest.approx(want, rel=1e-9)
        one = plan_collective(H100, kind, S / nb, [0, 8, 16, 24])
        assert want == pytest.approx(nb * one.time_s, rel=1e-12)


# ----------------------------------------------------------------------------- NVLS

def test_nvls_is_stated_for_every_kind():
    assert set(NVLS) == set(KINDS)
    for kind, terms in NVLS.items():
        if isinstance(terms, str):
            with pytest.raises(ValueError, match=kind):
                alpha_beta_time(kind, 1e6, 8, 1e11, 1e-6, "nvls")


def test_reduce_scatter_and_all_gather_are_rings_inside_an_h100_node():
    """NVLS moves (n-1)/n of the buffer through every port for a reduce-scatter or an all-gather, as
    the ring does: they are rings by hand, (n-1)/n S / B + (n-1) a; only the all-reduce is NVLS."""
    import dataclasses
    S, n = 1e9, 8
    nv = H100.nvlink
    bare = dataclasses.replace(H100, collective_fits=())  # the formulas (dgx-h100 ships nccl-tests lines)
    for kind in ("reduce_scatter", "all_gather"):
        assert select_algorithm(H100, kind, S, list(range(n)))[0] == "ring"
        name, t = select_algorithm(bare, kind, S, list(range(n)))
        assert name == "ring"
        assert t == pytest.approx((n - 1) / n * S / nv.effective_bandwidth + (n - 1) * nv.latency_s, rel=1e-12)
        assert "nvls" not in algorithm_times(H100, kind, S, list(range(n)))
    assert select_algorithm(H100, "all_reduce", S, list(range(n)))[0] == "nvls"
    assert "nvls" not in algorithm_times(H100, "broadcast", S, list(range(n)))
    assert "nvls" not in algorithm_times(A100, "reduce_scatter", S, list(range(n)))  # A100's NVSwitch cannot


def test_sequence_parallel_tp_comm_costs_what_nccl_tests_measure_against_nvls_all_reduce():
    """SP's reduce-scatter + all-gather against plain TP's NVLS all-reduce of the same buffer, 8 H100:
    nccl-tests at NCCL 2.29 (benchmarks/data/nccl_tests_times.csv, 512 MiB) measure 0.875 S / 336 and
    0.875 S / 335 GB/s bus bandwidth against 1.75 S / 445 -- 1.33x; within 10% of that, and each
    within 10% of its measured time."""
    import csv
    from conftest import ROOT
    with open(ROOT / "benchmarks" / "data" / "nccl_tests_times.csv") as f:
        rows = {r["kind"]: float(r["ms"]) * 1e-3 for r in csv.DictReader(line for line in f if not line.startswith("#"))
                if r["gpu"] == "H100 SXM" and r["gpus"] == "8" and r["bytes"] == str(2 ** 29)}
    tp, S = list(range(8)), 2 ** 29
    got = {k: select_algorithm(H100, k, S, tp)[1] for k in ("reduce_scatter", "all_gather", "all_reduce")}
    for k, t in got.items():
        assert t == pytest.approx(rows[k], rel=0.10), k
    measured = (rows["reduce_scatter"] + rows["all_gather"]) / rows["all_reduce"]
    assert (got["reduce_scatter"] + got["all_gather"]) / got["all_reduce"] == pytest.approx(measured, rel=0.10)


# ----------------------------------------------------------------------------- Muon

def test_newton_schulz_flops_closed_form_and_llama_matrices():
    # the quintic iteration on an a x b matrix: X X^T, A A, B X
    a, b = 3, 5
    assert newton_schulz_flops(a, b) == 2 * a * b * a + 2 * a * a * a + 2 * a * a * b
    mats = sorted(newton_schulz_matrices(PRESETS["llama3-8b"], False, 1, 1))
    # qkv 6144 x 4096, attn_out 4096 x 4096, gate/up/down 14336 x 4096 (a <= b)
    assert mats == sorted([(4096, 6144, 1), (4096, 4096, 1), (4096, 14336, 1), (4096, 14336, 1),
                           (4096, 14336, 1)])


LLAMA70 = "scenarios/llama3-70b-h100.toml"


def _step_s(over):
    tl = simulate(load_scenario(LLAMA70, over)).timeline
    st = tl[(tl.op == "STEP") & (tl["rank"] == 0)]
    return float((st.end_s - st.start_s).sum())


def test_muon_step_costs_newton_schulz_gemms():
    """Muon and momentum keep the same optimizer-state bytes (master + one buffer); the step
    differs by 5 Newton-Schulz iterations of the three GEMMs on every TP-local 2-D weight."""
    base = ["parallel.pp=1", "parallel.dp=1", "parallel.tp=8", "gpus=8", "training.global_batch=8"]
    t_muon = _step_s(base + ["training.optimizer=muon"])
    t_mom = _step_s(base + ["training.optimizer=momentum"])
    sc = load_scenario(LLAMA70, base)
    dev, m = sc.hardware.paced(sc.gpus).device, sc.model  # the job's clock: its slowest of 8 chips
    one = sum(dev.gemm_time(a, a, b) + dev.gemm_time(a, a, a) + dev.gemm_time(a, b, a)
              for a, b, _ in newton_schulz_matrices(m, False, 8, 1))
    assert t_muon - t_mom == pytest.approx(m.n_layers * NS_ITERATIONS * one, rel=1e-9)
    flops = m.n_layers * NS_ITERATIONS * sum(newton_schulz_flops(a, b) for a, b, _ in newton_schulz_matrices(m, False, 8, 1))
    assert t_muon - t_mom >= flops / dev.peak("bf16")  # no faster than the GEMMs at peak


def test_muon_on_a_gpu_without_bf16_runs_newton_schulz_at_fp32():
    """V100 has no bf16 tensor cores (its profile states fp16 and fp32 only): the bf16 iteration
    runs on the CUDA cores, at the fp32 rate (it was an internal error)."""
    base = ["parallel.pp=1", "parallel.dp=1", "parallel.tp=8", "gpus=8", "training.global_batch=8",
            "hardware=dgx2-v100", "training.precision=fp16"]
    t_muon = _step_s(base + ["training.optimizer=muon"])
    t_mom = _step_s(base + ["training.optimizer=momentum"])
    sc = load_scenario(LLAMA70, base)
    dev, m = sc.hardware.device, sc.model
    assert "bf16" not in dev.peak_flops
    one = sum(dev.gemm_time(a, a, b, "fp32") + dev.gemm_time(a, a, a, "fp32") + dev.gemm_time(a, b, a, "fp32")
              for a, b, _ in newton_schulz_matrices(m, False, 8, 1))
    assert t_muon - t_mom == pytest.approx(m.n_layers * NS_ITERATIONS * one, rel=1e-9)


# ----------------------------------------------------------------------------- two model copies

@pytest.mark.parametrize("name", ["DualPipe", "Chimera"])
def test_two_copies_sum_their_gradients_every_step(name):
    """dp = 1: each stage's gradients are all-reduced with its twin's (the same layers on
    pipeline rank p-1-r): a 2-rank all-reduce sends S per rank, S = the stage's gradient bytes."""
    from parsim.costs.model_costs import ModelCosts
    from parsim.schedule.ir import Op
    from parsim.simulate import schedule_for
    over = [f"schedule.name={name}", "parallel.dp=1", "gpus=32", "training.global_batch=16"]
    sc = load_scenario(LLAMA70, over)
    sched = schedule_for(sc)
    p = sc.parallel.pp
    for r, row in enumerate(sched.actions):  # each rank reduces both of its stages: one per copy
        reduced = {a.stage for a in row if a.op is Op.REDUCE_GRAD}
        assert reduced == {s for s, rr in enumerate(sched.stage_to_rank) if rr == r}
        twin = {s % p for s in reduced}
        assert twin == {r, p - 1 - r}  # model pieces r and p-1-r: the twins' pieces
    mc = ModelCosts.from_scenario(sc)
    grad_bytes = sum(st.params for st in mc.stage_costs) * 2  # bf16 gradients
    m = simulate(sc, mc).metrics
    assert m["comm_bytes_by_axis"]["dp"] == pytest.approx(grad_bytes / p, rel=1e-9)
    one_copy = simulate(load_scenario(LLAMA70, ["schedule.name=1F1B", *over[1:]])).metrics
    assert one_copy["comm_bytes_by_axis"]["dp"] == 0.0  # one copy, dp = 1: nothing to sum


@pytest.mark.parametrize("name, step_tol, wait_tol", [
    ("Chimera", 0.01, 0.2),
    # DualPipe's backwards run inside composite F&B ops (OVERLAP_F_B): full mode starts the
    # bucketed reduction after the composite op, fast mode hides it under the B inside it --
    # the reduction full mode leaves exposed is ~0.07 s of a 2.99 s step
    ("DualPipe", 0.02, None),
])
def test_full_mode_runs_the_twin_all_reduce_as_fast_mode(name, step_tol, wait_tol):
    """Full mode runs each stage's twin all-reduce as flows between ranks r and p-1-r of the
    replica (dp = 1: nothing else to reduce), as fast mode costs it."""
    over = [f"schedule.name={name}", "parallel.dp=1", "gpus=32", "training.global_batch=16"]
    got = {}
    for mode in ("fast", "full"):
        res = simulate(load_scenario(LLAMA70, [*over, f"simulation.mode={mode}"]))
        tl = res.timeline
        red = tl[(tl.stream == "dp") & (tl.op == "REDUCE_GRAD")]
        got[mode] = (res.metrics["step_time_s"], res.metrics["exposed_comm_by_axis_s"]["dp"],
                     red.end_s.max(), res.metrics["comm_bytes_by_axis"]["dp"])
    assert got["full"][1] > 0  # the twins' sum is waited for in full mode (before: no flows at dp = 1)
    assert got["full"][3] == pytest.approx(got["fast"][3], rel=1e-9)
    assert got["full"][0] == pytest.approx(got["fast"][0], rel=step_tol)
    if wait_tol is not None:
        assert got["full"][1] == pytest.approx(got["fast"][1], rel=wait_tol)
        assert got["full"][2] == pytest.approx(got["fast"][2], rel=0.01)


# ----------------------------------------------------------------------------- HFU, MoE MFU

def test_hfu_counts_selective_recompute_flops():
    """Unfused attention with selective recompute reruns every block's attention core forward:
    4 b s^2 n_heads head_dim per block and sequence (Llama-3-70B: 80 blocks, 64 heads of 128)."""
    base = ["training.flash_attention=false", "training.global_batch=16"]
    runs = {}
    for rc in ("selective", "none"):
        sc = load_scenario(LLAMA70, [*base, f"training.recompute={rc}"])
        m = simulate(sc).metrics
        runs[rc] = m["hfu"] * m["step_time_s"] * sc.hardware.device.peak("bf16") * m["world_size"]
    s = 8192
    extra = 80 * 16 * 4 * s * s * 64 * 128
    assert runs["selective"] - runs["none"] == pytest.approx(extra, rel=1e-9)


def test_moe_mfu_counts_routed_not_dropped_tokens():
    """Capacity 0.5 of top-2 balanced routing drops half the assignments: the MFU numerator loses
    half the routed experts' FLOPs, 3 x 2 x tokens x top_k x layers x 3 x d_model x d_ff / 2."""
    from parsim.model import model_flops_per_step
    mixtral = "scenarios/mixtral-8x7b-h100.toml"
    out = {}
    for cf in (0.5, 1.25):
        sc = load_scenario(mixtral, [f"model.capacity_factor={cf}", "moe.drop_tokens=true"])
        m = simulate(sc).metrics
        out[cf] = (m, sc)
    m, sc = out[0.5]
    assert m["moe"]["dropped_fraction"] == pytest.approx(0.5)
    tokens = 256 * 4096
    dropped = 3 * 2 * tokens * 2 * 32 * 3 * 4096 * 14336 * 0.5
    numerator = m["mfu"] * m["step_time_s"] * sc.hardware.device.peak("bf16") * m["world_size"]
    assert numerator == pytest.approx(model_flops_per_step(sc.model, tokens, 4096) - dropped, rel=1e-9)
    m125, sc125 = out[1.25]
    assert m125["moe"]["dropped_fraction"] == 0.0
    assert m125["mfu"] * m125["step_time_s"] * sc125.hardware.device.peak("bf16") * m125["world_size"] == \
        pytest.approx(model_flops_per_step(sc125.model, tokens, 4096), rel=1e-9)
    assert m["mfu"] < m125["mfu"]  # dropping half the work no longer reads as efficiency
