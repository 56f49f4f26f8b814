"""GEMMs beside an overlapped sequence-parallel TP collective run as chunks (Transformer Engine's
userbuffers under Megatron-Core's --tp-comm-overlap; PyTorch's asynchronous TP): which GEMM
is split how, how many chunks run at once, and the block's GEMM time from its chunk kernels, by
hand."""
import tomllib

import pytest
from conftest import ROOT

from parsim.costs import compute
from parsim.costs.inputs import (
    TE_PIPELINE_SPLITS,
    TE_UB_STREAMS,
    WHOLE,
    OverlapSplits,
    cost_inputs,
    layer_inputs,
    tp_overlap_splits,
)
from parsim.model import layer_gemms
from parsim.scenario import scenario_from_dict

LLAMA70B = ROOT / "scenarios" / "llama3-70b-h100.toml"


def _inputs(framework="megatron", tp_comm=True, sp=True, preset=None):
    doc = tomllib.loads(LLAMA70B.read_text())
    doc["parallel"].update(framework=framework, sequence_parallel=sp, zero=1 if framework != "fsdp" else 3)
    doc.setdefault("overlap", {})["tp_comm"] = tp_comm
    if preset:
        doc["model"] = {"preset": preset}
    return layer_inputs(cost_inputs(scenario_from_dict(doc, str(LLAMA70B))))


@pytest.mark.parametrize("framework, tp, sp, overlap, want", [
    # TE: ring exchange, pipeline, bulk; the chunks on 3 streams
    ("megatron", 8, True, True, OverlapSplits(8, TE_PIPELINE_SPLITS, 1, TE_UB_STREAMS, TE_UB_STREAMS)),
    ("megatron", 2, True, True, OverlapSplits(2, 4, 1, 3, 3)),
    # PyTorch async TP: a chunk per rank everywhere; gathered chunks on 2 streams, scattered serial
    ("fsdp", 8, True, True, OverlapSplits(8, 8, 8, 2, 1)),
    ("zero", 4, True, True, OverlapSplits(4, 4, 4, 2, 1)),
    ("megatron", 8, False, True, WHOLE),  # no sequence parallelism: all-reduces, whole GEMMs
    ("megatron", 8, True, False, WHOLE),  # no overlap
    ("megatron", 1, True, True, WHOLE),
])
def test_which_framework_splits_what(framework, tp, sp, overlap, want):
    assert tp_overlap_splits(framework, tp, sp, overlap) == want


def test_te_defaults():
    # Transformer Engine's initialize_ub registers every "pipeline" overlap with num_splits = 4,
    # and module/base.py spreads the chunk GEMMs over _NUM_MAX_UB_STREAMS = 3 compute streams
    assert TE_PIPELINE_SPLITS == 4 and TE_UB_STREAMS == 3


def test_scenario_carries_the_splits():
    assert _inputs().options.tp_overlap_splits == OverlapSplits(8, 4, 1, 3, 3)
    assert _inputs(tp_comm=False).options.tp_overlap_splits == WHOLE
    assert _inputs(framework="fsdp").options.tp_overlap_splits == OverlapSplits(8, 8, 8, 2, 1)


def _by_hand(inp):
    """The block's (F, I, W) GEMM seconds: each chunk a kernel of its own rows, as many of them
    at a time as their side has streams, sharing the SMs as one GEMM over their rows."""
    dev, tokens, tp = inp.hardware.device, inp.shard.tokens, inp.shard.tp
    sp = inp.options.tp_overlap_splits
    col = {"qkv", "q", "q_down", "kv_down", "fc1", "gate", "up"}
    row = {"attn_out", "fc2", "down"}

    def split(m, n, k, p, chunks, streams):
        assert m % chunks == 0  # the cases here divide evenly: every chunk the same kernel
        full, last = divmod(chunks, streams)  # rounds of `streams` chunks, then the rest
        t = full * dev.gemm_time(streams * m // chunks, n, k, p)
        return t + (dev.gemm_time(last * m // chunks, n, k, p) if last else 0.0)
    gather, scatter = (sp.gather, sp.gather_streams), (sp.scatter, sp.scatter_streams)
    f = i = w = 0.0
    for g in layer_gemms(inp.model, tokens, tp, 0):
        p = compute.gemm_precision(inp, g.name)
        if g.name in col:
            cf, ci = gather, (sp.scatter_dgrad, sp.scatter_streams)
        elif g.name in row:
            cf, ci = scatter, gather
        else:
            cf = ci = (1, 1)
        f += split(g.m, g.n, g.k, p, *cf)
        i += split(g.m, g.k, g.n, p, *ci)
        w += dev.gemm_time(g.k, g.n, g.m, p)
    return f, i, w


@pytest.mark.parametrize("framework", ["megatron", "fsdp"])
def test_block_gemms_are_the_sum_of_their_chunks(framework):
    inp = _inputs(framework)
    gemms = tuple(layer_gemms(inp.model, inp.shard.tokens, inp.shard.tp, 0))
    bc = compute.block_compute(inp, gemms, False)
    assert bc.gemm == pytest.approx(_by_hand(inp), rel=1e-12)
    # one launch per chunk: Llama's gate/up/qkv (3 column GEMMs) and down/attn_out (2 row GEMMs)
    whole = compute.block_compute(_inputs(framework, tp_comm=False), gemms, False)
    sp = inp.options.tp_overlap_splits
    assert bc.kernels[0] - whole.kernels[0] == 3 * (sp.gather - 1) + 2 * (sp.scatter - 1)
    assert bc.kernels[1] - whole.kernels[1] == 3 * (sp.scatter_dgrad - 1) + 2 * (sp.gather - 1)


def test_chunks_cost_more_than_the_whole_gemm_and_weight_gradients_stay_whole():
    gemms = tuple(layer_gemms(_inputs().model, _inputs().shard.tokens, 8, 0))
    split = compute.block_compute(_inputs(), gemms, False)
    whole = compute.block_compute(_inputs(tp_comm=False), gemms, False)
    assert split.gemm[0] > whole.gemm[0] and split.gemm[1] > whole.gemm[1]
    assert split.gemm[2] == whole.gemm[2]  # TE's bulk wgrad overlap: the whole GEMM


def test_a_row_count_that_does_not_divide_gives_the_remainder_to_some_chunks():
    dev = _inputs().hardware.device
    # 10 rows in 4 chunks: two of 2 rows and two of 3, one after another
    want = 2 * dev.gemm_time(2, 4096, 4096, "bf16") + 2 * dev.gemm_time(3, 4096, 4096, "bf16")
    assert compute.chunked_gemm_time(dev, 10, 4096, 4096, "bf16", 1, 4) == pytest.approx(want, rel=1e-12)
    # on 3 streams: chunks of 2, 2, 3 rows together (7 rows), then the last 3
    want = dev.gemm_time(7, 4096, 4096, "bf16") + dev.gemm_time(3, 4096, 4096, "bf16")
    assert compute.chunked_gemm_time(dev, 10, 4096, 4096, "bf16", 1, 4, 3) == pytest.approx(want, rel=1e-12)
    assert compute.chunked_gemm_time(dev, 3, 64, 64, "bf16", 1, 4) == dev.gemm_time(3, 64, 64, "bf16")


def test_more_streams_than_chunks_is_the_whole_gemm():
    dev = _inputs().hardware.device
    whole = dev.gemm_time(4096, 3072, 8192, "bf16")
    assert compute.chunked_gemm_time(dev, 4096, 3072, 8192, "bf16", 1, 2, 3) == pytest.approx(whole, rel=1e-12)
    # serial chunks cost more than concurrent ones, which cost no less than the whole GEMM
    serial = compute.chunked_gemm_time(dev, 4096, 3072, 8192, "bf16", 1, 8, 1)
    concurrent = compute.chunked_gemm_time(dev, 4096, 3072, 8192, "bf16", 1, 8, 3)
    assert serial > concurrent >= whole
