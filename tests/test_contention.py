"""Compute slowed by the communication it hides (parsim.cluster.contention): closed forms,
the published measurement it is held to, the profile keys, and where the cost model uses it."""
import pytest

from parsim.cluster.contention import USERBUFFERS_SMS, slowdown_s, sms_of
from parsim.cluster.hardware import load_profile
from parsim.errors import ConfigError

H100 = load_profile("dgx-h100").device


def test_a_collective_shorter_than_the_compute_costs_its_share_of_the_sms():
    # 10 ms of a 24-CTA collective under 100 ms of compute on 132 SMs: 10 * 24 / 132 ms later
    assert slowdown_s(H100, 24, 0.010, 0.100) == pytest.approx(0.010 * 24 / 132, rel=1e-12)


def test_a_collective_outlasting_the_compute_slows_all_of_it():
    # compute of 10 ms at 108/132 of its rate takes 10 * 132/108 ms: 10 * 24/108 ms later
    assert slowdown_s(H100, 24, 1.0, 0.010) == pytest.approx(0.010 * 24 / 108, rel=1e-12)


def test_the_two_cases_meet_where_the_collective_ends_with_the_slowed_compute():
    w = 0.010
    c = w * 132 / 108  # the slowed compute's length
    assert slowdown_s(H100, 24, c, w) == pytest.approx(slowdown_s(H100, 24, c * (1 + 1e-9), w), rel=1e-6)


@pytest.mark.parametrize("sms, comm, compute", [(0, 0.01, 0.1), (24, 0.0, 0.1), (24, 0.01, 0.0)])
def test_nothing_to_slow_costs_nothing(sms, comm, compute):
    assert slowdown_s(H100, sms, comm, compute) == 0.0


def test_a_profile_without_the_facts_takes_overlap_as_free():
    dev = load_profile("cpu-gloo").device
    assert sms_of(dev, False) == 0 and slowdown_s(dev, 24, 0.01, 0.1) == 0.0


def test_fully_overlapped_compute_slows_as_much_as_measured_on_average():
    """Lee et al. 2025 (arXiv:2507.03114): overlapping communication slowed GPT/Llama compute on
    A100/H100 by 18.9% on average (at most 40%). A collective spanning the whole compute on an
    H100 node costs s/(N-s) = 24/108 = 22.2% here."""
    frac = slowdown_s(H100, sms_of(H100, False), 10.0, 1.0) / 1.0
    assert frac == pytest.approx(24 / 108)
    assert abs(frac - 0.189) < 0.05 and frac < 0.40


def test_groups_across_nodes_hold_fewer_ctas():
    assert sms_of(H100, True) == 16 and sms_of(H100, False) == 24


def test_a_collective_cannot_hold_every_sm(tmp_path):
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "parsim" / "cluster" / "profiles" / "dgx-h100.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("collective_ctas = 24", "collective_ctas = 132", 1))
    with pytest.raises(ConfigError, match="collective_ctas"):
        load_profile(str(bad))


def test_tp_overlap_charges_the_userbuffers_sms_to_the_gemms():
    """With --tp-comm-overlap and sequence parallelism the hidden chunks run on TE's
    userbuffers: forward half ring-exchange (1 SM), half pipelined reduce-scatter (24 SMs)."""
    from parsim.costs.inputs import cost_inputs, layer_inputs
    from parsim.costs.layer import tp_layer_comm
    from parsim.scenario import load_scenario

    sc = load_scenario("scenarios/llama3-70b-h100.toml", ["overlap.tp_comm=true", "parallel.sequence_parallel=true"])
    li = layer_inputs(cost_inputs(sc))
    assert li.shard.tp > 1
    gemm = 1.0  # a long GEMM: everything but the first chunk hides
    exposed, slow = tp_layer_comm(li, 1e8, gemm)
    comm = exposed * li.shard.tp  # the first of tp chunks stays exposed
    sms = (USERBUFFERS_SMS["ring_exchange"] + USERBUFFERS_SMS["pipeline"]) / 2
    assert slow == pytest.approx((comm - exposed) * sms / 132, rel=1e-9)
    off = load_scenario("scenarios/llama3-70b-h100.toml", ["overlap.tp_comm=false"])
    assert tp_layer_comm(layer_inputs(cost_inputs(off)), 1e8, gemm)[1] == 0.0


def test_an_async_collective_beside_compute_exposes_what_outlasts_it():
    """Megatron's backward re-gather launched beside a GEMM (``async_beside``), hand-computed:
    1.0 ms of all-gather beside 0.4 ms of GEMM on an H100 exposes 0.6 ms and slows the GEMM by
    the gather's 24 of 132 SMs over the 0.4 ms it ran beside it; beside a longer GEMM nothing is
    exposed; on a CPU rank (gloo: the transport shares the core) all of it is."""
    from parsim.cluster.contention import async_beside
    hw = load_profile("dgx-h100")
    share = hw.device.kernels.collective_ctas / hw.device.kernels.sm_count
    exposed, slow = async_beside(hw, 1.0e-3, 0.4e-3, range(8))
    assert exposed == pytest.approx(0.6e-3, rel=1e-12)
    assert slow == pytest.approx(0.4e-3 * share, rel=1e-12)
    exposed, slow = async_beside(hw, 1.0e-3, 5.0e-3, range(8))
    assert exposed == 0.0 and slow == pytest.approx(1.0e-3 * share, rel=1e-12)
    assert async_beside(load_profile("cpu-gloo"), 1.0e-3, 5.0e-3, range(2)) == (1.0e-3, 0.0)


@pytest.mark.parametrize("hardware", ["dgx-h100", "cpu-gloo"])
def test_sequence_parallel_backward_adds_the_re_gathers(hardware):
    """Under sequence parallelism a block's backward communicates its forward's all-gathers and
    reduce-scatters' conjugates plus QKV's and FC1's input gathered again: on an H100 each
    re-gather beside its site's input-gradient GEMMs (exposed beyond them), on a CPU rank
    blocking. Hand-assembled from the collective's time and the GEMM model."""
    from parsim.cluster.precision import PRECISION_TABLE
    from parsim.costs.inputs import cost_inputs, layer_inputs
    from parsim.costs.layer import layer_cost, tp_collective_time
    from parsim.model import layer_gemms
    from tests.helpers import scenario

    sc = scenario(tp=4, hardware=hardware, model={"preset": "llama3-8b"}, parallel={"sequence_parallel": True},
                  training={"seq_len": 2048, "microbatch_size": 1, "global_batch": 8, "precision": "bf16"})
    li = layer_inputs(cost_inputs(sc))
    lc = layer_cost(li, False)
    act = li.shard.tokens * sc.model.d_model * PRECISION_TABLE["bf16"].activation_bytes
    ag, rs = tp_collective_time(li, "all_gather", act), tp_collective_time(li, "reduce_scatter", act)
    assert lc.forward.tp_comm == pytest.approx(2 * (ag + rs), rel=1e-12)
    dev = li.hardware.device
    if hardware == "cpu-gloo":
        assert lc.backward_input.tp_comm == pytest.approx(2 * (ag + rs) + 2 * ag, rel=1e-12)
        return
    from parsim.costs.compute import gemm_precision
    g = {x.name: x for x in layer_gemms(sc.model, li.shard.tokens, 4)}
    windows = [sum(dev.gemm_time(g[n].m, g[n].k, g[n].n, gemm_precision(li, n)) for n in site)
               for site in (("qkv",), ("gate", "up"))]
    exposed = sum(max(0.0, ag - w) for w in windows)
    assert lc.backward_input.tp_comm == pytest.approx(2 * (ag + rs) + exposed, rel=1e-12)
