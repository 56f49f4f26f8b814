"""Context parallelism as a ring (parsim.costs.context): zig-zag balance against a brute-force
count of the causal pairs, ring exposure by hand, the backward's dK/dV bytes, Ulysses'
all-to-all bytes by hand, the all-gather variant, and the ``parallel.cp_comm`` key."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import parsim.costs.context as C
from parsim import simulate
from parsim.costs import cost_inputs, layer_cost, layer_inputs
from parsim.errors import ConfigError
from parsim.scenario import scenario_from_dict

LLAMA8B = {"preset": "llama3-8b"}  # 32 heads of 128, 8 KV heads


def doc(seq=8192, tp=1, cp=2, comm="p2p", hardware="dgx-h100", model=None, precision="bf16", gpus=None, m=1):
    gpus = gpus or tp * cp
    return {"name": "cp", "hardware": hardware, "gpus": gpus, "model": dict(model or LLAMA8B),
            "training": {"global_batch": m * gpus // (tp * cp), "seq_len": seq, "microbatch_size": 1,
                         "precision": precision},
            "parallel": {"tp": tp, "cp": cp, "pp": 1, "cp_comm": comm, "sequence_parallel": tp > 1}}


def inputs(**kw):
    return layer_inputs(cost_inputs(scenario_from_dict(doc(**kw), "cp.toml")))


# ------------------------------------------------------------------ zig-zag balance
def _zigzag_tokens(seq: int, cp: int, rank: int) -> list[int]:
    c = seq // (2 * cp)
    return list(range(rank * c, (rank + 1) * c)) + list(range((2 * cp - 1 - rank) * c, (2 * cp - rank) * c))


def _brute_pairs(q_tokens: list[int], k_tokens: list[int]) -> int:
    return sum(1 for q in q_tokens for k in k_tokens if k <= q)


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_zigzag_blocks_are_the_causal_pairs_counted_by_brute_force(cp):
    """Each ring step's blocks keep exactly the query-key pairs the causal mask keeps between
    this rank's tokens (chunks r and 2cp-1-r) and the source rank's, counted one by one."""
    seq = 8 * cp
    for rank in range(cp):
        steps = C.zigzag_steps(seq, cp, rank)
        assert len(steps) == cp
        for k, blocks in enumerate(steps):
            src = (rank - k) % cp
            want = _brute_pairs(_zigzag_tokens(seq, cp, rank), _zigzag_tokens(seq, cp, src))
            assert sum(b.pairs for b in blocks) == want, (rank, k)


def test_zigzag_every_rank_does_the_same_work():
    """cp = 4, seq = 16 (chunks of c = 2): the diagonal step is a causal 4 x 4 block (10 pairs),
    every other step 2c * c = 8 pairs, on every rank: 34 each, 136 = 16 * 17 / 2 in all."""
    per_rank = []
    for rank in range(4):
        steps = C.zigzag_steps(16, 4, rank)
        assert steps[0] == (C.Block(4, 4, True),)
        assert [sum(b.pairs for b in s) for s in steps] == [10, 8, 8, 8]
        for k in range(1, 4):  # earlier source: both query chunks x its first chunk; later: one x both
            want = C.Block(4, 2, False) if (rank - k) % 4 < rank else C.Block(2, 4, False)
            assert steps[k] == (want,)
        per_rank.append(sum(b.pairs for s in steps for b in s))
    assert per_rank == [34, 34, 34, 34] and sum(per_rank) == 16 * 17 // 2


def test_contiguous_split_is_unbalanced():
    """Without the zig-zag split rank r computes r full L x L blocks and one causal one:
    L = 4 (seq 16, cp 4): 10, 26, 42, 58 pairs -- the last rank does 5.8x the first's work."""
    work = [sum(b.pairs for s in C.contiguous_steps(16, 4, r) for b in s) for r in range(4)]
    assert work == [10, 26, 42, 58] and sum(work) == 136


def test_block_pairs_bottom_right_causal():
    """A causal block with more keys than queries is bottom-right aligned (the kernels'
    convention): 2 queries, 6 keys: rows see 5 and 6 keys; more queries than keys: 3 x 1 -> 1."""
    assert C.Block(2, 6, True).pairs == 11
    assert C.Block(3, 1, True).pairs == 1
    assert C.Block(3, 3, True).pairs == 6 and C.Block(3, 5, False).pairs == 15


# ------------------------------------------------------------------ ring exposure
def test_ring_exposure_by_hand():
    """Forward: a transfer beside each of the first cp-1 steps; backward: K/V, then K/V + dK/dV,
    then dK/dV alone."""
    assert C.forward_transfers(4, 2.0) == [2.0, 2.0, 2.0, 0.0]
    assert C.backward_transfers(4, 2.0) == [2.0, 4.0, 4.0, 2.0]
    assert C.backward_transfers(2, 1.5) == [1.5, 1.5]
    compute = [3.0, 3.0, 3.0, 3.0]
    assert C.ring_exposed(compute, C.forward_transfers(4, 2.0)) == 0.0       # attention outlasts each transfer
    assert C.ring_exposed(compute, C.forward_transfers(4, 5.0)) == pytest.approx(3 * (5.0 - 3.0))
    assert C.ring_exposed(compute, C.backward_transfers(4, 2.0)) == pytest.approx(2 * (4.0 - 3.0))


@pytest.mark.parametrize("seq", [2048, 1024])
def test_ring_on_a_scenario_matches_the_kernels_and_the_link_by_hand(seq):
    """Llama-3-8B, seq 2048 (and 1024), tp 8 x cp 8 on DGX H100s: the CP ring links one GPU of
    each of 8 nodes, 8 such rings share each node's 8 NICs (400 Gb/s x 0.94: 47 GB/s a ring;
    4 us + two 0.13 us switch hops). Each step passes 2 x seq/8 tokens (2 x 256 at 2048) x 1 KV
    head x 128 x 2 bytes; the step's attention is the kernel model's time of its zig-zag block
    (4 heads per TP rank, at the job's clock: power-saturated, its slowest of 64 chips) plus the
    partial results' merging (forward: output and LSE; backward: dQ and dK/dV sums); exposed =
    what each transfer lasts beyond its step."""
    inp = inputs(seq=seq, tp=8, cp=8, gpus=64)
    dev = inp.hardware.device
    assert dev.paced_gpus == 64
    chunk = 2 * (seq // 8) * 1 * 128 * 2
    assert C.kv_chunk_bytes(inp) == chunk
    t = chunk / (8 * 50e9 * 0.94 / 8) + 4e-6 + 2 * 0.13e-6
    assert C.p2p_step_s(inp) == pytest.approx(t, rel=1e-12)
    c = seq // 16
    shapes = [(2 * c, 2 * c, True)] + [(c, 2 * c, False)] * 7  # rank 0: every source is a later rank
    fwd = [dev.attention_kernel_time(1, q, k, 4, 1, 128, causal, False, "bf16") for q, k, causal in shapes]
    bwd = [dev.attention_kernel_time(1, q, k, 4, 1, 128, causal, True, "bf16") for q, k, causal in shapes]
    corr = [0.0] + [dev.memory_time(c * 4 * (128 * 10 + 12))] * 7
    fwd = [f + x for f, x in zip(fwd, corr)]
    # backward steps after the first add their dQ (fp32) and dK/dV (bf16) into the running sums
    acc = [0.0] + [dev.memory_time(128 * (c * 4 * 10 + 2 * (2 * c) * 1 * 6))] * 7
    bwd = [b + x for b, x in zip(bwd, acc)]
    ca = C.cp_attention(inp)
    assert ca.forward_s == pytest.approx(sum(fwd), rel=1e-12)
    assert ca.backward_s == pytest.approx(sum(bwd), rel=1e-12)
    want_f = sum(max(0.0, t - f) for f in fwd[:-1])
    want_b = sum(max(0.0, x - b) for x, b in zip([t] + [2 * t] * 6 + [t], bwd))
    assert ca.forward_comm_s == pytest.approx(want_f, rel=1e-9)
    assert ca.backward_comm_s == pytest.approx(want_b, rel=1e-9)
    # 64-token chunks: each transfer outlasts its small block both ways; at 128 the backward's
    assert want_b > 0 and (want_f > 0 or seq > 1024)


def test_a_transport_on_the_rank_s_own_core_overlaps_nothing():
    """Hand-computed: with ``share`` = 1 (gloo on CPU ranks: the transfer progresses only when
    the rank's thread yields the core) every step pays its whole transfer beside its attention;
    with a partial share the step costs the longer of the transfer and the slowed attention."""
    compute, transfers = [3.0, 3.0, 3.0, 3.0], C.forward_transfers(4, 2.0)  # transfer shorter than attention
    assert C.ring_exposed(compute, transfers) == 0.0
    assert C.ring_exposed(compute, transfers, share=1.0) == pytest.approx(3 * 2.0)
    assert C.ring_exposed(compute, transfers, share=0.25) == pytest.approx(3 * 0.25 * 2.0)
    assert C.ring_exposed([1.0], [5.0], share=0.25) == pytest.approx(4.0)  # the transfer still outlasts it
    gloo = SimpleNamespace(hardware=SimpleNamespace(device=SimpleNamespace(transport_core_share=0.6)))
    assert C.ring_share(gloo) == 1.0
    assert C.ring_share(inputs(seq=4096, cp=2)) == 0.0  # NCCL's p2p SMs: no source, none charged


def test_long_blocks_hide_the_ring():
    """128k tokens over cp 4 in one node: 16k-token blocks take milliseconds, a step's transfer
    a fraction of one: nothing exposed, forward or backward."""
    ca = C.cp_attention(inputs(seq=131072, cp=4))
    assert ca.forward_comm_s == 0.0 and ca.backward_comm_s == 0.0
    assert ca.forward_s > 0 and ca.backward_s > ca.forward_s


# ------------------------------------------------------------------ bytes
@pytest.mark.parametrize("comm", ["p2p", "all_gather"])
def test_backward_sends_twice_the_forward(comm):
    """p2p: the forward passes K/V on cp-1 times, the backward K/V and dK/dV; all-gather: gather
    in the forward, gather again and reduce-scatter dK/dV in the backward."""
    ca = C.cp_attention(inputs(seq=16384, cp=4, comm=comm))
    chunk = 2 * 4096 * 8 * 128 * 2
    assert ca.forward_bytes == 3 * chunk
    assert ca.backward_bytes == 2 * ca.forward_bytes


def test_kv_bytes_follow_kv_heads_and_tp():
    """GQA: 8 KV heads send a quarter of what 32 (MHA) would; tp 2 halves them (4 per rank);
    tp 16 over 8 KV heads leaves one replicated head per rank."""
    mha = dict(LLAMA8B, n_kv_heads=32)
    assert C.kv_chunk_bytes(inputs(cp=2, model=mha)) == 4 * C.kv_chunk_bytes(inputs(cp=2))
    assert C.kv_chunk_bytes(inputs(cp=2, tp=2)) == C.kv_chunk_bytes(inputs(cp=2)) / 2
    assert C.local_heads(inputs(cp=2, tp=16, gpus=32)) == (2, 1)


def test_fp8_training_sends_bf16_kv():
    """FP8 training keeps attention (and the K/V it reads) in BF16."""
    assert C.kv_chunk_bytes(inputs(cp=2, precision="fp8")) == C.kv_chunk_bytes(inputs(cp=2))


def test_ulysses_all_to_all_bytes_by_hand():
    """cp 4, seq 8192, Llama-3-8B: each rank holds 2048 tokens; Q, K, V go out as one all-to-all
    (32 + 2 x 8 heads of 128, bf16), the output comes back (32 heads): (cp-1)/cp of each buffer.
    The backward moves dO in and dQ, dK, dV back: the same bytes."""
    ca = C.cp_attention(inputs(seq=8192, cp=4, comm="a2a"))
    qkv = 2048 * (32 + 2 * 8) * 128 * 2
    out = 2048 * 32 * 128 * 2
    assert ca.forward_bytes == pytest.approx(3 / 4 * (qkv + out), rel=1e-12)
    assert ca.backward_bytes == ca.forward_bytes
    assert C.ulysses_heads(inputs(seq=8192, cp=4, comm="a2a")) == (8, 2)


def test_ulysses_replicates_kv_heads_fewer_than_cp():
    """tp 4 leaves 2 KV heads per rank; Ulysses over cp 4 replicates them to 4 before the
    all-to-all, each rank then attends 8 / 4 = 2 query heads with one KV head."""
    inp = inputs(seq=8192, tp=4, cp=4, comm="a2a")
    qkv, out = C.ulysses_buffers(inp)
    assert qkv == 2048 * (8 + 2 * 4) * 128 * 2 and out == 2048 * 8 * 128 * 2
    assert C.ulysses_heads(inp) == (2, 1)


def test_all_gather_chunks_are_balanced():
    """All-gather CP: query chunk r against keys up to its end, chunk 2cp-1-r likewise; every
    rank keeps (2cp - 1) c^2 + c (c + 1) pairs (c = 2, cp = 4: 7 x 4 + 6 = 34)."""
    c, cp = 2, 4
    work = [C.Block(c, (r + 1) * c, True).pairs + C.Block(c, (2 * cp - r) * c, True).pairs for r in range(cp)]
    assert work == [34] * 4


# ------------------------------------------------------------------ through simulate
def test_breakdown_and_bytes_follow_the_mode():
    """Short sequence, tp 8 x cp 8 across nodes: the ring's exposed transfers show as cp_comm;
    the per-op bytes reach comm_bytes_by_axis.cp (F: cp-1 chunks, B: twice that, per block)."""
    sc = scenario_from_dict(doc(seq=4096, tp=8, cp=8, gpus=64), "cp.toml")
    res = simulate(sc)
    mx = res.metrics
    assert mx["breakdown_s"]["cp_comm"] > 0
    chunk = 2 * 512 * 1 * 128 * 2
    assert mx["comm_bytes_by_axis"]["cp"] == pytest.approx(32 * (7 + 14) * chunk, rel=1e-12)
    lc = layer_cost(layer_inputs(cost_inputs(sc)), False)
    assert lc.backward_input_bytes.cp == 2 * lc.forward_bytes.cp


def test_all_gather_is_exposed_where_the_ring_hides():
    """64k tokens over cp 2: the ring hides its one transfer behind a 32k-token block; the
    all-gather of TE's all_gather mode runs before attention, exposed."""
    ring = C.cp_attention(inputs(seq=65536, cp=2))
    ag = C.cp_attention(inputs(seq=65536, cp=2, comm="all_gather"))
    assert ring.forward_comm_s == 0.0
    assert ag.forward_comm_s > 0 and ag.backward_comm_s > ag.forward_comm_s


def test_cp_attention_costs_at_least_the_flat_share():
    """Blocks of seq/2cp run below a whole sequence's kernel efficiency: the ring's attention is
    never cheaper than 1/cp of the whole sequence's kernel time."""
    inp = inputs(seq=32768, cp=4)
    dev = inp.hardware.device
    whole_f = dev.attention_kernel_time(1, 32768, 32768, 32, 8, 128, True, False, "bf16") / 4
    whole_b = dev.attention_kernel_time(1, 32768, 32768, 32, 8, 128, True, True, "bf16") / 4
    ca = C.cp_attention(inp)
    assert ca.forward_s >= whole_f and ca.backward_s >= whole_b


# ------------------------------------------------------------------ the key
def test_cp_comm_key_is_checked():
    with pytest.raises(ConfigError, match="parallel.cp_comm"):
        scenario_from_dict(doc(comm="ring"), "cp.toml")
    with pytest.raises(ConfigError, match="parallel.cp_comm: a2a splits heads"):
        scenario_from_dict(doc(tp=8, cp=8, comm="a2a", gpus=64), "cp.toml")  # 4 heads per TP rank over 8
    assert scenario_from_dict(doc(), "cp.toml").parallel.cp_comm == "p2p"


def test_plain_ring_charges_the_measured_ring_step_and_the_merges(tmp_path):
    """Without kernel facts (cpu-gloo) the flat attention is spread over the ring's steps and
    every step after the first adds its merge (forward: read the step's output and LSE, read and
    write the running ones) or its gradient accumulation (backward), memory-bound. The K/V
    transfer is the calibrated ring step (``collective_p2p_2``) when the profile measured one,
    else one latency plus the chunk on the link. Hand-computed for the tiny model at cp = 2:
    rank 0's second step is its later chunk's 32 queries on rank 1's 64 keys."""
    from parsim.cluster.hardware import dumps_profile, load_profile
    from parsim.scenario import load_scenario
    base = load_profile("cpu-gloo")
    fitted = tmp_path / "ring.toml"
    fitted.write_text(dumps_profile(base, {}, {"collective_p2p_2": [[float("inf"), 800.0, 1.5]]}))
    for hw in ("cpu-gloo", str(fitted)):
        sc = load_scenario("scenarios/tiny-cpu.toml", [f"hardware={hw}", "parallel.pp=1", "parallel.cp=2",
                                                       "training.flash_attention=true"])
        inp = layer_inputs(cost_inputs(sc))
        dev, b, heads, d = inp.hardware.device, 2, 4, 64  # microbatch 2, 4 heads of 64, no GQA
        flat = (0.004, 0.008)
        ca = C.cp_attention(inp, flat)
        merge = dev.memory_time(b * 32 * heads * (d * (2 + 4 + 4) + 3 * 4))
        accumulate = dev.memory_time(b * d * (32 * heads * (2 + 4 + 4) + 2 * 64 * heads * 3 * 2))
        assert ca.forward_s == pytest.approx(flat[0] + merge, rel=1e-12)
        assert ca.backward_s == pytest.approx(flat[1] + accumulate, rel=1e-12)
        chunk = 2 * b * heads * 64 * d * 4  # K and V of the rank's 64 tokens, fp32
        assert C.kv_chunk_bytes(inp) == chunk
        want = 800e-6 + chunk / 1.5e9 if hw != "cpu-gloo" else base.nvlink.latency_s + chunk / base.nvlink.effective_bandwidth
        assert C.p2p_step_s(inp) == pytest.approx(want, rel=1e-12)
