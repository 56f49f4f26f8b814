"""The forward of an MoE layer exchanges its tokens-per-expert counts before the dispatch.

Megatron-Core's all-to-all dispatcher all-gathers every EP rank's ``num_local_tokens_per_expert``
(and copies them to the host) to size its all-to-all; parsim's torch runtime does the same
all-gather (``parsim.validate.comm.exchange_counts``), so a validated ep = 2 step makes three
collectives per MoE layer forward, not two. The backward reuses the counts."""
from __future__ import annotations

from dataclasses import replace

import pytest

from parsim.cluster.collectives import collective_time
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.layer import layer_cost, moe_phase
from parsim.scenario import load_scenario


def test_forward_pays_one_count_all_gather_more_than_the_backward():
    sc = load_scenario("scenarios/tiny-moe-cpu.toml")
    inp = layer_inputs(cost_inputs(sc))
    ph = moe_phase(inp)
    g = len(ph.group)
    assert g == 2
    # an all-gather of g x n_experts int64 counts over the EP group, costed independently
    want = collective_time(sc.hardware, "all_gather", g * sc.model.n_experts * 8, list(ph.group))
    assert ph.count_exchange_s == pytest.approx(want, rel=1e-12) and want > 0
    lc = layer_cost(inp, True)
    # without overlap both passes carry dispatch + combine; the forward also the count exchange
    assert lc.forward.ep_comm - lc.backward_input.ep_comm == pytest.approx(want, rel=1e-9)


def test_deepep_computes_its_layout_on_the_device():
    sc = load_scenario("scenarios/tiny-moe-cpu.toml")
    sc = replace(sc, moe=replace(sc.moe, dispatcher="deepep"))
    ph = moe_phase(layer_inputs(cost_inputs(sc)))
    assert ph.count_exchange_s == 0.0 and ph.all_to_all_s > 0
