"""Results from rows: the Result holds the span rows and the cost model's tables (values, not
the model); metrics add up to the tables; bytes by axis checked against hand computation."""
from __future__ import annotations

import dataclasses

import pytest
from helpers import TINY_GPT

from parsim import simulate
from parsim.costs import PART_NAMES, CostTables
from parsim.model import total_params
from parsim.scenario import scenario_from_dict

# TINY_GPT: 8 blocks, d_model 256, 8 heads of 32 (MHA), seq 512; one microbatch = 512 tokens


def tiny(pp=2, tp=1, cp=1, dp=1, m=4, precision="bf16", recompute="none", sp=False, zero=0, schedule="1F1B"):
    doc = {"name": "t", "hardware": "dgx-h100", "gpus": pp * tp * cp * dp, "model": dict(TINY_GPT),
           "training": {"global_batch": dp * m, "seq_len": 512, "microbatch_size": 1, "precision": precision,
                        "recompute": recompute},
           "parallel": {"pp": pp, "tp": tp, "cp": cp, "dp": dp, "zero": zero, "sequence_parallel": sp},
           "schedule": {"name": schedule}}
    return scenario_from_dict(doc, "t.toml")


def test_result_holds_tables_not_the_cost_model():
    res = simulate(tiny(tp=2))
    assert not hasattr(res, "costs")
    assert isinstance(res.tables, CostTables)
    with pytest.raises(dataclasses.FrozenInstanceError):
        res.tables.ops[0].flops = 0.0
    assert len(res.tables.stages) == 2 and len(res.tables.static_memory) == 2


def test_tables_add_up_to_the_step_breakdown():
    """Every compute span takes its (stage, op) row's parts: summed over the spans that ran,
    the rows are the breakdown (times pp: it is the mean pipeline rank's)."""
    res = simulate(tiny(pp=2, tp=2, recompute="full"))
    rows = {(r.stage, r.op): r for r in res.tables.ops}
    tl = res.timeline
    compute = tl[(tl["stream"] == "compute") & (tl["op"] != "STEP")]
    pp = res.schedule.pp
    br = res.metrics["breakdown_s"]
    for part in PART_NAMES:
        total = sum(getattr(rows[(s, str(o))].parts, part) for s, o in zip(compute["stage"], compute["op"]))
        assert total == pytest.approx(br[part] * pp, rel=1e-12), part
    assert br["tp_comm"] > 0 and br["recompute"] > 0
    # each span lasts its row's total (no overlap in 1F1B) and B = I + W
    for s, o, a, b in zip(compute["stage"], compute["op"], compute["start_s"], compute["end_s"]):
        assert b - a == pytest.approx(rows[(s, str(o))].parts.total, rel=1e-12)
    for s in range(2):
        i, w, b = rows[(s, "I")].parts, rows[(s, "W")].parts, rows[(s, "B")].parts
        assert b.total == pytest.approx(i.total + w.total, rel=1e-12)
    assert sum(res.metrics["breakdown_s"].values()) == pytest.approx(res.metrics["step_time_s"], rel=1e-9)


def _tp_bytes_by_hand(tp: int, wire: int, m: int, passes: int, layers_per_rank: int = 4, pp: int = 2,
                      loss: bool = True, sp: bool = False) -> float:
    """Per GPU and step, mean over the pipeline ranks: 2 all-reduces of the block's activation
    (512 tokens x 256 x wire bytes) per block and pass, a ring all-reduce sending 2(t-1)/t of
    it; the first stage adds the embedding's all-reduce in its forward, the last the LM head's
    input-gradient all-reduce in its backward and (``loss``) the vocabulary-parallel
    cross-entropy's three all-reduces of one fp32 number per token in its forward. Sequence
    parallelism (``sp``) turns each block's all-reduce into an all-gather and a reduce-scatter
    (the same bytes), the head's into a forward all-gather and a backward reduce-scatter (the
    same again) and the embedding's into one reduce-scatter (half); each block's backward also
    gathers QKV's and FC1's input again (Megatron keeps only the sequence shard): two
    all-gathers sending (t-1)/t of the activation each, one ring's worth; the head's backward
    gathers its input again too (half a ring)."""
    act = 512 * 256 * wire
    ring = 2 * (tp - 1) / tp * act
    per_rank = layers_per_rank * (passes * 2 + (1 if sp else 0)) * ring * m
    embedding = ring * m
    head = ring * m * (1.5 if sp else 1) + (3 * 2 * (tp - 1) / tp * 512 * 4 * m if loss else 0.0)
    return (pp * per_rank + embedding + head) / pp


@pytest.mark.parametrize("precision,wire", [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("recompute,passes", [("none", 2), ("full", 3)])
def test_tp_bytes_follow_the_precision(precision, wire, recompute, passes):
    mx = simulate(tiny(tp=2, precision=precision, recompute=recompute)).metrics
    assert mx["comm_bytes_by_axis"]["tp"] == pytest.approx(_tp_bytes_by_hand(2, wire, 4, passes), rel=1e-12)


def test_tp_bytes_double_from_bf16_to_fp32():
    bf16 = simulate(tiny(tp=4, sp=True)).metrics["comm_bytes_by_axis"]["tp"]
    fp32 = simulate(tiny(tp=4, sp=True, precision="fp32")).metrics["comm_bytes_by_axis"]["tp"]
    loss = _tp_bytes_by_hand(4, 2, 4, 2) - _tp_bytes_by_hand(4, 2, 4, 2, loss=False)  # fp32 in both
    assert bf16 > 0 and fp32 - loss == pytest.approx(2 * (bf16 - loss), rel=1e-12)
    assert bf16 == pytest.approx(_tp_bytes_by_hand(4, 2, 4, 2, sp=True), rel=1e-12)


@pytest.mark.parametrize("precision,wire", [("bf16", 2), ("fp32", 4)])
def test_cp_bytes_are_the_kv_blocks_the_ring_sends(precision, wire):
    """cp = 2: each rank holds 256 of the 512 tokens; per block the forward passes its K and V
    block on once (cp - 1 steps) and the backward twice as much (K/V, then dK/dV travelling back
    the same ring): 2 x 256 tokens x 8 KV heads x 32 x wire bytes per block."""
    mx = simulate(tiny(cp=2, precision=precision)).metrics
    block = 2 * 256 * 8 * 32 * wire
    assert mx["comm_bytes_by_axis"]["cp"] == pytest.approx(4 * (1 + 2) * block * 4, rel=1e-12)  # 4 blocks, F + B, m=4
    cp4 = simulate(tiny(cp=4, precision=precision)).metrics
    # cp = 4: blocks of 128 tokens, 3 ring steps
    assert cp4["comm_bytes_by_axis"]["cp"] == pytest.approx(4 * (1 + 2) * 3 * (2 * 128 * 8 * 32 * wire) * 4, rel=1e-12)
    assert simulate(tiny(precision=precision)).metrics["comm_bytes_by_axis"]["cp"] == 0.0


def test_dp_bytes_are_the_ring_bytes_of_the_gradients_and_gathers():
    """dp = 4, ZeRO-1, one stage: reduce-scatter of the bf16 gradients, then all-gather of the
    updated bf16 parameters, each (n-1)/n of the buffer per GPU."""
    sc = tiny(pp=1, dp=4, zero=1)
    res = simulate(sc)
    psi = total_params(sc.model)
    assert res.tables.stages[0].params == psi
    bytes_ = res.metrics["comm_bytes_by_axis"]
    assert bytes_["dp"] == pytest.approx(2 * 3 / 4 * psi * 2, rel=1e-12)
    assert bytes_["dp_buffer"] == pytest.approx(2 * psi * 2, rel=1e-12)
    zero0 = simulate(tiny(pp=1, dp=4, zero=0)).metrics["comm_bytes_by_axis"]
    assert zero0["dp"] == pytest.approx(2 * 3 / 4 * psi * 2, rel=1e-12)  # all-reduce: 2(n-1)/n, no gather


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    """dp 8, ep 4: dense gradients all-reduce over 8 ranks, expert gradients over the 2 ranks
    holding the same experts."""
    from test_moe import moe_doc
    res = simulate(scenario_from_dict(moe_doc(dp=8, parallel={"ep": 4}), "x.toml"))
    st = res.tables.stages[0]
    dense, expert = st.params - st.expert_params, st.expert_params
    want = 2 * 7 / 8 * dense * 2 + 2 * 1 / 2 * expert * 2
    assert res.metrics["comm_bytes_by_axis"]["dp"] == pytest.approx(want, rel=1e-12)


def test_ep_bytes_are_the_dispatch_and_combine_sends():
    """Per MoE layer and microbatch: dispatch + combine in F, again in B; what one rank sends in one."""
    from test_moe import moe_doc
    mx = simulate(scenario_from_dict(moe_doc(), "x.toml")).metrics
    moe = mx["moe"]
    layers = 4  # TINY_MOE: every block is MoE, one stage
    want = 4 * moe["all_to_all_bytes_per_rank"]["send"] * layers * mx["n_microbatches"]
    assert mx["comm_bytes_by_axis"]["ep"] == pytest.approx(want, rel=1e-12) and want > 0
