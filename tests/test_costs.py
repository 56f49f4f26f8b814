"""The cost model's pure parts: cached results equal fresh computations, typed inputs, and the
planner's activation states against a brute-force walk of the schedule."""
from __future__ import annotations

import dataclasses
import gc
import random

import pytest
from helpers import scenario

from parsim.cluster.hardware import load_profile
from parsim.costs import (
    ModelCosts,
    clear_caches,
    cost_inputs,
    layer_cost,
    layer_inputs,
    stage_cost,
)
from parsim.costs.dp import DPInputs, DPSetting, dp_ops
from parsim.model import get_preset
from parsim.plan.prescreen import activation_peaks, prescreen, stash_states
from parsim.plan.space import PlanSpec, default_schedules, enumerate_candidates
from parsim.schedule import build
from parsim.schedule.ir import Op


def _costs_view(mc: ModelCosts) -> list:
    """Every number a ModelCosts hands out, stage by stage."""
    out = []
    for s, st in enumerate(mc.stage_costs):
        ops = {op: dataclasses.astuple(c) for op, c in mc.stage_ops(s).items()}
        out.append((st.params, st.expert_params, st.parts, st.flops, st.bytes, st.p2p_bytes, st.activation_bytes,
                    st.weight_grad_stash_bytes, st.recompute_transient_bytes, ops,
                    mc.dp_ops[s].sent if mc.dp_ops[s] else None))
    return out


def test_layer_cost_cache_returns_the_fresh_computation():
    sc = scenario(pp=2, tp=2, dp=2, m=4, hardware="dgx-h100", training={"recompute": "full"})
    inp = layer_inputs(cost_inputs(sc))
    cached = layer_cost(inp, False)
    assert layer_cost(inp, False) is cached  # a hit
    assert layer_cost.__wrapped__(inp, False) == cached  # the function itself, uncached: equal values


def test_stages_built_through_warm_caches_equal_a_cold_build():
    """Stage sums are shared between pipeline depths (prefixes of blocks) and ZeRO stages share
    stage costs; what comes out must not depend on what the caches held."""
    kw = dict(tp=2, dp=2, m=8, layers=8, hardware="dgx-h100", parallel={"zero": 1})
    clear_caches()
    for pp in (1, 4, 8):  # warm: 8, 2 and 1 blocks per stage, another ZeRO stage
        ModelCosts.from_scenario(scenario(pp=pp, **kw))
    ModelCosts.from_scenario(scenario(pp=2, **{**kw, "parallel": {"zero": 2}}))
    warm = _costs_view(ModelCosts.from_scenario(scenario(pp=2, **kw)))
    clear_caches()
    cold = _costs_view(ModelCosts.from_scenario(scenario(pp=2, **kw)))
    assert warm == cold


def test_uneven_moe_stages_sum_their_blocks_in_order():
    """A stage mixing dense and MoE blocks sums them block by block: the same numbers as one
    uncached stage cost."""
    from test_moe import moe_doc

    from parsim.costs.stage import stage_layout
    from parsim.scenario import scenario_from_dict
    sc = scenario_from_dict(moe_doc(model={"first_dense_layers": 1}, pp=2, parallel={"ep": 4}), "x.toml")
    mc = ModelCosts.from_scenario(sc)
    inp = mc.layer_inputs
    layout = stage_layout(sc.model, tuple(sc.layers_per_stage), mc.chain_len)
    assert (False, True) in [sh.kinds for sh in layout.shapes]  # a dense block, then an MoE one
    for shape in layout.shapes:
        st = stage_cost(inp, shape)
        assert stage_cost.__wrapped__(inp, shape) == st
        # the blocks' parameters add up block by block (the embedding is on the first stage)
        blocks = [layer_cost(inp, k) for k in shape.kinds]
        assert st.expert_params == sum(b.expert_params for b in blocks) > 0


def test_dp_ops_cache_equals_fresh():
    sc = scenario(pp=1, dp=4, m=4, hardware="dgx-h100", parallel={"zero": 3})
    mc = ModelCosts.from_scenario(sc)
    st = mc.stage_costs[0]
    ci = mc.inputs
    setting = DPSetting(ci.cluster, ci.parallel, ci.training.optimizer, ci.training.precision, ci.overlap)
    inp = DPInputs(setting, st.params, st.expert_params, st.parts[Op.B].total, st.n_layers)
    warm = dp_ops(inp)
    clear_caches()
    fresh = dp_ops(inp)
    assert {k: dataclasses.astuple(v) for k, v in warm.ops.items()} == \
        {k: dataclasses.astuple(v) for k, v in fresh.ops.items()}
    assert warm.sent == fresh.sent and set(warm.ops) == {Op.REDUCE_GRAD, Op.STEP, Op.UNSHARD, Op.RESHARD}


def test_step_zeroes_the_gradient_buffer_below_zero3():
    """The step time is the optimizer's traffic plus, for ZeRO 0-2 (a persistent gradient
    buffer, Megatron's zero_grad_buffer), one in-place write of every local gradient; ZeRO-3
    keeps no full buffer. Hand-computed from the device's rates."""
    from parsim.costs.memory import state_bytes_per_param
    for zero in (0, 1, 3):
        sc = scenario(pp=1, dp=4, m=4, hardware="dgx-h100", parallel={"zero": zero})
        mc = ModelCosts.from_scenario(sc)
        st, ci = mc.stage_costs[0], mc.inputs
        setting = DPSetting(ci.cluster, ci.parallel, ci.training.optimizer, ci.training.precision, ci.overlap)
        ops = dp_ops(DPInputs(setting, st.params, st.expert_params, st.parts[Op.B].total, st.n_layers)).ops
        w, _, k = state_bytes_per_param(ci.training.optimizer, ci.training.precision)
        g = ci.parallel.grad_bytes(ci.training.precision)
        dev = ci.cluster.profile.device
        shard = st.params / (4 if zero >= 1 else 1)
        expected = dev.optimizer_time(shard * (2 * k + g + w))
        if zero < 3:
            expected += dev.update_time(st.params * g)
        assert ops[Op.STEP].duration_s == pytest.approx(expected, rel=1e-12)


def test_layer_inputs_do_not_depend_on_the_data_parallel_setting():
    """dp, ZeRO and the optimizer leave a block's cost alone: one cache entry serves them all."""
    a = layer_inputs(cost_inputs(scenario(pp=2, dp=2, tp=2, m=4, parallel={"zero": 0})))
    b = layer_inputs(cost_inputs(scenario(pp=2, dp=4, tp=2, m=4, parallel={"zero": 3})))
    assert a == b and hash(a) == hash(b)
    c = layer_inputs(cost_inputs(scenario(pp=2, dp=2, tp=2, m=4, training={"microbatch_size": 2})))
    assert c != a


def test_model_costs_take_typed_inputs():
    sc = scenario(pp=2, dp=2, m=4)
    ci = cost_inputs(sc)
    assert dataclasses.is_dataclass(ci) and ci.layers_per_stage == tuple(sc.layers_per_stage)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ci.n_microbatches = 1
    assert _costs_view(ModelCosts(ci)) == _costs_view(ModelCosts.from_scenario(sc))


def _walk_peaks(name, pp, m, vpp, act, wstash, trans):
    """Brute force: walk every rank's actions, counting live stashes and pending W per stage;
    the peak of stash (+ the backward's transient) at every F and every B/I."""
    sched = build(name, pp, m, vpp)
    out = []
    for row in sched.actions:
        live, wpend, best = {}, {}, 0.0
        for a in row:
            s = a.stage
            if a.op is Op.F:
                live[s] = live.get(s, 0) + 1
                v = sum(n * act[t] for t, n in sorted(live.items()))
                best = max(best, v + sum(n * wstash[t] for t, n in sorted(wpend.items())))
            elif a.op in (Op.B, Op.I):
                v = sum(n * act[t] for t, n in sorted(live.items()))
                best = max(best, v + sum(n * wstash[t] for t, n in sorted(wpend.items())) + trans[s])
                live[s] -= 1
                if a.op is Op.I:
                    wpend[s] = wpend.get(s, 0) + 1
            elif a.op is Op.W:
                wpend[s] -= 1
        out.append(best)
    return out


@pytest.mark.parametrize("name,pp,m,vpp", [("GPipe", 4, 6, 1), ("1F1B", 4, 9, 1), ("1F1B", 8, 3, 1),
                                           ("ZBH1", 4, 8, 1), ("ZBH2", 4, 12, 1), ("ZBH2", 6, 7, 1),
                                           ("Interleaved1F1B", 4, 8, 2), ("Interleaved1F1B", 2, 6, 3)])
def test_activation_states_keep_every_peak_of_the_walk(name, pp, m, vpp):
    """The planner keeps only the states no other state dominates: for any non-negative
    stage sizes its peaks equal the brute-force walk's."""
    import numpy as np
    rng = random.Random(7)
    states = stash_states(name, pp, m, vpp)
    n = pp * vpp
    for _ in range(20):
        act = [rng.uniform(0, 10) for _ in range(n)]
        wst = [rng.uniform(0, 1) * a for a in act]
        trans = [rng.choice([0.0, rng.uniform(0, 30)]) for _ in range(n)]
        got = activation_peaks(states, np.array(act), np.array(wst), np.array(trans), pp)
        assert list(got) == pytest.approx(_walk_peaks(name, pp, m, vpp, act, wst, trans), rel=1e-12)


def test_prescreen_cold_equals_warm_and_leaves_the_collector_on():
    spec = PlanSpec(model=get_preset("llama3-8b"), model_ref="llama3-8b", hardware=load_profile("dgx-h100"),
                    gpus=32, global_batch=64, seq_len=4096, schedules=default_schedules(),
                    recompute=("none", "full"), microbatch_sizes=(1, 2), max_cp=2)
    cands, _ = enumerate_candidates(spec)
    clear_caches()
    cold, rej_cold = prescreen(spec, cands)
    warm, rej_warm = prescreen(spec, cands)
    assert gc.isenabled()
    assert [dataclasses.astuple(e) for e in cold] == [dataclasses.astuple(e) for e in warm]
    assert rej_cold == rej_warm


def test_embedding_weight_gradient_passes_over_the_whole_table_every_microbatch():
    """The first stage's W beyond a middle stage's (the same blocks): the tokens' gradients
    scattered into their rows (4 bytes a token element, as before) plus the dense table of this
    rank's vocab / tp rows that torch's embedding backward zero-fills and reads, and the add into
    the gradient buffer (read and write): (2 w + 2 g) bytes a table element. Hand-computed."""
    from parsim.costs.memory import state_bytes_per_param
    for tp in (1, 2):
        sc = scenario(pp=3, tp=tp, m=4, layers=3, hardware="dgx-h100")
        mc = ModelCosts.from_scenario(sc)
        first, middle = mc.stage_costs[0], mc.stage_costs[1]
        ci, m = mc.inputs, sc.model
        dev = ci.cluster.profile.device
        w, g, _ = state_bytes_per_param(ci.training.optimizer, ci.training.precision)
        tokens = sc.training.microbatch_size * sc.training.seq_len
        expected = (dev.memory_time(tokens * m.d_model * 4)
                    + dev.memory_time(m.vocab_size / tp * m.d_model * (2 * w + 2 * g)))
        extra = first.parts[Op.W].total - middle.parts[Op.W].total
        assert extra == pytest.approx(expected, rel=1e-9)
