"""DeepSpeed ZeRO-3's NVMe parameter fetch, replayed module by module (parsim.infer.zero_fetch).

Oracles: timelines worked out by hand from DeepSpeed v0.7.3's rules (the module docstring), the
models' per-layer parameter counts (parsim.model.shapes, themselves held to published totals).
"""
from __future__ import annotations

import pytest

from parsim.infer import zero_fetch as zf
from parsim.model import get_preset
from parsim.model.shapes import layer_params


def _mods(n: int, nbytes: float = 2.0) -> list[zf.Module]:
    return [zf.Module(param_bytes=(nbytes,), param_numel=(nbytes,), compute_s=0.0) for _ in range(n)]


def _pass(mods, host_bps, bucket, **kw):
    return zf.run_pass(mods, 0.0, 1.0, host_bps, zf.FetchRules(prefetch_bucket=bucket, min_aio_bytes=0, **kw))


def test_without_prefetch_the_two_hops_add_up():
    # read 2 s at 1 B/s, copy 4 s at 0.5 B/s: each module 6 s, one after the other
    end, spans = _pass(_mods(4), 0.5, 0.0)
    assert end == 24.0
    assert [(op, j, s, e) for _, op, j, s, e, _ in spans] == [
        ("SWAP_IN", 0, 0, 2), ("FETCH", 0, 2, 6), ("SWAP_IN", 1, 6, 8), ("FETCH", 1, 8, 12),
        ("SWAP_IN", 2, 12, 14), ("FETCH", 2, 14, 18), ("SWAP_IN", 3, 18, 20), ("FETCH", 3, 20, 24)]


def test_read_ahead_waits_for_every_pending_read():
    # after module 0's copy (to t=6) the read-ahead takes modules 1-3 (2 + 2 + 2 elements: the
    # third is admitted while 4 <= 2 x 2 in flight); module 1 then waits for all three reads
    # (synchronize_reads), so nothing is hidden here: the same 24 s as without prefetch
    end, spans = _pass(_mods(4), 0.5, 1.0)
    assert end == 24.0
    assert [(op, j, s, e) for _, op, j, s, e, _ in spans] == [
        ("SWAP_IN", 0, 0, 2), ("FETCH", 0, 2, 6), ("SWAP_IN", 1, 6, 8), ("SWAP_IN", 2, 8, 10),
        ("SWAP_IN", 3, 10, 12), ("FETCH", 1, 12, 16), ("FETCH", 2, 16, 20), ("FETCH", 3, 20, 24)]


def test_reads_hide_under_the_prefetched_copies():
    # copies of 8 s: module 1's fetch waits for reads 1-3 (t=16), copies 1 and prefetches 2 to the
    # GPU (to t=32), then reads 4 and 5 ahead (in flight 2 + 2: limit 8; four buffers free) while
    # module 3 is prefetched: two 2 s reads hidden, 56 s against 60 without prefetch
    end, spans = _pass(_mods(6), 0.25, 1.0)
    assert end == 56.0 and _pass(_mods(6), 0.25, 0.0)[0] == 60.0
    reads = {j: (s, e) for _, op, j, s, e, _ in spans if op == "SWAP_IN"}
    copies = {j: (s, e) for _, op, j, s, e, _ in spans if op == "FETCH"}
    assert reads[4] == (32, 34) and reads[5] == (34, 36)
    assert copies == {0: (2, 10), 1: (16, 24), 2: (24, 32), 3: (32, 40), 4: (40, 48), 5: (48, 56)}


def test_read_ahead_is_bounded_by_the_swap_buffers():
    # a 100-element module allows 200 elements ahead, but only 5 buffers: 5 reads, not 7
    mods = [zf.Module(param_bytes=(100.0,), param_numel=(100.0,), compute_s=0.0)] + _mods(7)
    _, spans = _pass(mods, 0.5, 1.0)
    ahead = [j for _, op, j, s, _, _ in spans if op == "SWAP_IN" and s >= 300.0 and j > 0]
    first_batch = [j for _, op, j, s, _, _ in spans if op == "SWAP_IN" and s < 310.0 and j > 0]
    assert ahead and first_batch == [1, 2, 3, 4, 5]
    _, spans3 = _pass(mods, 0.5, 1.0, swap_buffers=3)
    assert [j for _, op, j, s, _, _ in spans3 if op == "SWAP_IN" and s < 306.0 and j > 0] == [1, 2, 3]


def test_small_partitions_stay_in_host_memory():
    mods = [zf.Module(param_bytes=(2e6, 1e5), param_numel=(1e6, 5e4), compute_s=0.0)]
    _, spans = zf.run_pass(mods, 0.0, 1e9, 1e9, zf.FetchRules())
    reads = [nb for _, op, _, _, _, nb in spans if op == "SWAP_IN"]
    copies = [nb for _, op, _, _, _, nb in spans if op == "FETCH"]
    assert reads == [2e6] and copies == [2e6 + 1e5]  # the bias is copied from host memory, never read


def test_compute_waits_for_its_gather_and_the_side_stream():
    mods = [zf.Module(param_bytes=(2.0,), param_numel=(2.0,), compute_s=5.0, gather_s=1.0) for _ in range(2)]
    end, spans = _pass(mods, 0.5, 0.0)
    comp = [(s, e) for st, _, _, s, e, _ in spans if st == "compute"]
    gathers = [(s, e) for st, _, _, s, e, _ in spans if st == "dp"]
    # module 0: read 0-2, copy 2-6, gather 6-7, compute 7-12; module 1: read 6-8 (the host is free
    # after the copy), copy 8-12, gather 12-13, compute 13-18
    assert gathers == [(6, 7), (12, 13)] and comp == [(7, 12), (13, 18)] and end == 18


@pytest.mark.parametrize("preset", ["opt-30b", "bloom-176b", "llama3-8b", "gpt-neox-20b", "gpt2"])
def test_block_layout_holds_the_layers_parameters(preset):
    spec = get_preset(preset)
    mods = zf.block_modules(spec)
    assert sum(sum(p) for p in mods) == layer_params(spec, 0)
    if spec.fused_qkv:  # one query_key_value module
        assert len([p for p in mods if p[0] == (spec.n_heads + 2 * spec.n_kv_heads) * spec.head_dim_ * spec.d_model]) == 1
    assert zf.block_modules(get_preset("mixtral-8x7b")) is None  # MoE blocks: one module


def test_split_block_shares_bytes_and_compute_by_elements():
    spec = get_preset("opt-30b")
    mods = zf.split_block(spec, 1e9, 2.0, 4, lambda b: b * 1e-9)
    assert sum(sum(m.param_bytes) for m in mods) * 4 == pytest.approx(1e9)
    assert sum(m.compute_s for m in mods) == pytest.approx(2.0)
    assert sum(m.gather_s for m in mods) == pytest.approx(1.0)


def test_prefetch_stops_at_the_live_parameter_limit():
    # host-resident parameters of 10 elements, 1 B each (1 s a copy): module 0's fetch copies its
    # own, then prefetches while the bucket (25 elements) and the live limit allow -- the check
    # comes before each parameter, so the last one may pass the bound. Module 0 computes once the
    # side stream is done: after 4 copies unbounded (10, 20 < 25, then 30), after 2 with 15 live
    # (10 on the GPU leaves 5: one more parameter)
    mods = [zf.Module(param_bytes=(1.0,), param_numel=(10.0,), compute_s=1.0) for _ in range(6)]
    for live, first_compute in ((1e9, 4.0), (15.0, 2.0)):
        rules = zf.FetchRules(prefetch_bucket=25.0, nvme=False, max_live=live)
        _, spans = zf.run_pass(mods, 0.0, 1.0, 1.0, rules)
        comp = sorted((s, e) for st, _, j, s, e, _ in spans if st == "compute" and j == 0)
        assert comp[0][0] == first_compute
