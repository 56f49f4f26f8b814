"""Sharding annotations (issue 21, step 1): Megatron TP, SP, FSDP and DP written as GSPMD-style
annotations on a named mesh reproduce the cost model's own figures for a block, and a scenario
may state ``[sharding]`` instead of ``[parallel]`` (strictly parsed)."""
from __future__ import annotations

import pytest

from parsim.autoplan.blocks import block_graph
from parsim.autoplan.graph import Setting
from parsim.autoplan.mesh import Layout, Mesh, reshard_steps
from parsim.autoplan.sharding import breakdown, propagate, stage_mesh
from parsim.cluster.collectives import collective_time
from parsim.config.sharding import sharding_from_table
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.layer import layer_cost
from parsim.costs.memory import state_bytes_per_param
from parsim.errors import ConfigError
from parsim.model import layer_params
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate
from tests.helpers import scenario

MEGATRON = {"qkv": "split(1, t)", "out": "split(0, t)", "up": "split(1, t)", "down": "split(0, t)"}


def _block(hw, model, tp, sp, prec="bf16"):
    sc = scenario(tp=tp, hardware=hw, model=model, parallel={"sequence_parallel": sp},
                  training={"seq_len": 1024, "microbatch_size": 2, "global_batch": 8, "precision": prec})
    table = {"mesh": {"t": tp}, "weights": MEGATRON}
    if sp:
        table["sequence"] = "t"
    sh = sharding_from_table(table, "t.toml")
    g = block_graph(Setting(sc.model, sc.hardware.paced(sc.gpus), 2, 1024, prec), stage_mesh(sh))
    return layer_cost(layer_inputs(cost_inputs(sc)), False), breakdown(sc.hardware.paced(sc.gpus), g, propagate(g, sh))


@pytest.mark.parametrize("hw,model,prec", [("dgx-h100", {"preset": "llama3-8b"}, "bf16"),
                                           ("aws-p3.16xlarge", {"preset": "megatron-3.6b"}, "fp16")])
@pytest.mark.parametrize("sp", [False, True])
def test_megatron_tp_and_sp_annotations_reproduce_the_block_cost(hw, model, prec, sp):
    lc, b = _block(hw, model, 4, sp, prec)
    assert b.forward_s == pytest.approx(lc.forward.compute, rel=1e-9)
    assert b.backward_s == pytest.approx(lc.backward_input.compute + lc.backward_weight.compute, rel=1e-9)
    # Megatron's g in the forward (all-reduce, or reduce-scatter + all-gather with SP) and f in the backward
    assert b.forward_comm_s == pytest.approx(lc.forward.tp_comm, rel=1e-9)
    assert b.backward_comm_s == pytest.approx(lc.backward_input.tp_comm, rel=1e-9)
    assert b.weight_comm_s == 0
    # SP's norms hold replicated weights whose gradients are all-reduced over t once a step (tiny)
    assert b.step_comm_s == 0 if not sp else 0 < b.step_comm_s < 1e-3 * lc.forward.tp_comm * 1e3


def test_fsdp_and_dp_annotations_imply_the_zero3_and_ddp_collectives():
    """FSDP = the weights stored split over the batch axis: gathered (params x weight bytes, as
    parsim.costs.dp's UNSHARD) in the forward and again in the backward, gradients
    reduce-scattered; DP = the gradient all-reduce once a step. Compute is the unsplit block's
    on the local tokens."""
    model = {"preset": "llama3-8b"}
    sc = scenario(dp=8, hardware="dgx-h100", model=model, training={"seq_len": 1024, "microbatch_size": 1,
                                                                     "global_batch": 8})
    st = Setting(sc.model, sc.hardware.paced(sc.gpus), 8, 1024)
    w, gb, _ = state_bytes_per_param("adam", "bf16")
    ranks = list(range(8))
    params = layer_params(sc.model, 0)
    lc = layer_cost(layer_inputs(cost_inputs(sc)), False)
    for fsdp in (True, False):
        sh = sharding_from_table({"mesh": {"d": 8}, "batch": ["d"], "fsdp": ["d"] if fsdp else []}, "t.toml")
        g = block_graph(st, stage_mesh(sh))
        b = breakdown(sc.hardware.paced(sc.gpus), g, propagate(g, sh))
        assert b.forward_s == pytest.approx(lc.forward.compute, rel=1e-9)
        assert b.forward_comm_s == 0 and b.backward_comm_s == 0  # tokens stay split: no resharding
        ops = [(op, op.strategies[c]) for op, c in zip(g.ops, propagate(g, sh))]
        per_param = 16  # bf16 weight + bf16 gradient + Adam's 12 (ZeRO's 2 + 2 + K)
        lin_params = sum(s.state_bytes * (8 if fsdp else 1) / per_param for op, s in ops if op.kind == "linear")
        assert lin_params + 2 * sc.model.d_model == pytest.approx(params)  # every weight of the block (+ 2 RMSNorms)
        for op, s in ops:
            local = s.state_bytes / per_param
            if fsdp and op.kind == "linear":  # stored 1/8: gathered for F, again for B; gradient reduce-scattered
                full = local * 8
                assert s.comm_s == pytest.approx(2 * collective_time(sc.hardware, "all_gather", full * w, ranks)
                                                 + collective_time(sc.hardware, "reduce_scatter", full * gb, ranks))
                assert s.step_comm_s == 0
            elif op.kind != "attn":  # replicated: the gradient all-reduced once a step
                assert s.comm_s == 0
                assert s.step_comm_s == pytest.approx(collective_time(sc.hardware, "all_reduce", local * gb, ranks))


def test_ep_annotation_reproduces_the_moe_block_cost():
    """Mixtral's block with the experts split over the batch axis (GShard's EP): the router, the
    grouped expert GEMMs, permutes and the dispatch/combine all-to-alls are parsim.costs.moe's on
    the slowest EP rank, exactly as the block costs them with dp = ep = 8."""
    sc = scenario(dp=8, hardware="dgx-h100", model={"preset": "mixtral-8x7b"}, parallel={"ep": 8},
                  training={"seq_len": 4096, "microbatch_size": 1, "global_batch": 8})
    lc = layer_cost(layer_inputs(cost_inputs(sc)), True)
    sh = sharding_from_table({"mesh": {"e": 8}, "batch": ["e"], "weights": {"experts": "split(0, e)"}}, "t.toml")
    g = block_graph(Setting(sc.model, sc.hardware.paced(sc.gpus), 8, 4096), stage_mesh(sh))
    b = breakdown(sc.hardware.paced(sc.gpus), g, propagate(g, sh))
    assert b.forward_s == pytest.approx(lc.forward.compute, rel=1e-9)
    assert b.backward_s == pytest.approx(lc.backward_input.compute + lc.backward_weight.compute, rel=1e-9)
    assert b.forward_comm_s == pytest.approx(lc.forward.ep_comm, rel=1e-9)
    assert b.backward_comm_s == pytest.approx(lc.backward_input.ep_comm, rel=1e-9)
    assert b.state_bytes / 16 == pytest.approx(lc.params)  # 1 expert of 8 per GPU, attention replicated


def test_reshard_collectives():
    mesh = Mesh((("a", 2), ("b", 4)))
    full = 1024.0
    assert reshard_steps(Layout(("-", "P")), Layout(("-", "-")), full, mesh) == [("all_reduce", full, (0, 1, 2, 3))]
    assert reshard_steps(Layout(("-", "P")), Layout(("-", "T")), full, mesh) == [("reduce_scatter", full, (0, 1, 2, 3))]
    assert reshard_steps(Layout(("-", "T")), Layout(("-", "-")), full, mesh) == [("all_gather", full, (0, 1, 2, 3))]
    assert reshard_steps(Layout(("T", "F")), Layout(("T", "T")), full, mesh) == [("all_to_all", full / 8, (0, 1, 2, 3))]
    assert reshard_steps(Layout(("-", "-")), Layout(("T", "F")), full, mesh) == []  # slices are free
    assert mesh.group(("a",)) == (0, 4)


ALPA = {
    "name": "a", "hardware": "aws-p3.16xlarge", "gpus": 8,
    "model": {"preset": "megatron-1.7b"},
    "training": {"global_batch": 32, "microbatch_size": 4, "seq_len": 1024, "precision": "fp16", "recompute": "full"},
    "schedule": {"name": "1F1B"},
}


def _doc(sharding=None, parallel=None):
    d = dict(ALPA)
    if sharding is not None:
        d["sharding"] = sharding
    if parallel is not None:
        d["parallel"] = parallel
    return d


SH = {"mesh": {"pp": 2, "dp": 2, "op": 2}, "pipeline": "pp", "batch": ["dp"],
      "weights": {"qkv": "split(1, op)", "out": "split(0, op)", "up": "split(1, op)", "down": "split(0, op)",
                  "embedding": "split(0, op)", "lm_head": "split(1, op)"}}


def test_sharding_table_runs_as_the_parallel_axes_it_amounts_to():
    a = scenario_from_dict(_doc(sharding=SH), "s.toml")
    # the mesh's axis order (pp outermost) placed on the ranks: on the p3's cube-mesh a pair's
    # links depend on which GPUs it joins (dp over GPUs 0, 2: one NVLink; 0, 4: two)
    b = scenario_from_dict(_doc(parallel={"dp": 2, "tp": 2, "pp": 2, "order": ["cp", "pp", "dp", "ep", "tp"]}),
                           "p.toml")
    assert (a.parallel.dp, a.parallel.tp, a.parallel.pp, a.parallel.zero) == (2, 2, 2, 0)
    for axis in ("tp", "dp", "pp"):
        assert a.parallel.group_ranks(axis) == b.parallel.group_ranks(axis)
    assert a.sharding is not None and a.sharding.weight("qkv").axis == "op"
    assert simulate(a).metrics["step_time_s"] == pytest.approx(simulate(b).metrics["step_time_s"], rel=1e-12)
    sp = scenario_from_dict(_doc(sharding={**SH, "sequence": "op", "fsdp": ["dp"]}), "s.toml")
    assert sp.parallel.sequence_parallel and sp.parallel.zero == 3


@pytest.mark.parametrize("bad,key", [
    ({**SH, "colour": 1}, "sharding.colour"),
    ({**SH, "mesh": {"pp": 2, "dp": 2, "op": 4}}, "sharding.mesh"),
    ({**SH, "weights": {**SH["weights"], "out": "split(1, op)"}}, "sharding.weights.out"),
    ({**SH, "weights": {**SH["weights"], "qkv": "shard(1, op)"}}, "sharding.weights.qkv"),
    ({**SH, "weights": {**SH["weights"], "qkv": "split(1, zz)"}}, "sharding.weights.qkv"),
    ({**SH, "weights": {**SH["weights"], "mlp": "replicate"}}, "sharding.weights.mlp"),
    ({**SH, "batch": ["dp", "nope"]}, "sharding.batch"),
    ({**SH, "batch": []}, "sharding.mesh"),
    ({**SH, "fsdp": ["op"]}, "sharding.fsdp"),
    ({**SH, "mesh": {"pp": 2, "dp": 2, "op": 2, "dq": 1}, "batch": ["dp", "zz"]}, "sharding.batch"),
    ({"mesh": {"d1": 2, "op": 2, "d2": 2}, "batch": ["d1", "d2"], "weights": SH["weights"]}, "sharding.batch"),
    ({**SH, "pipeline": "op"}, "sharding"),
])
def test_sharding_table_is_strict(bad, key):
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_doc(sharding=bad), "s.toml")
    assert e.value.key == key


def test_expert_parallelism_as_an_annotation_runs_as_the_bundled_ep_scenario():
    """Mixtral on 64 H100 (scenarios/mixtral-8x7b-h100.toml: pp 4, dp 16, ep 8 inside dp): the same
    job as a mesh {pp = 4, r = 2, e = 8} with the batch over (r, e) and the experts split over e
    (GShard's expert dim on the inner batch axis) simulates to the same metrics."""
    import tomllib
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "scenarios" / "mixtral-8x7b-h100.toml"
    doc = tomllib.loads(path.read_text())
    ref = scenario_from_dict(doc, str(path))
    par = doc.pop("parallel")
    doc["parallel"] = {"zero": par["zero"]}  # ZeRO-1 shards optimizer state: not a weight layout
    doc["sharding"] = {"mesh": {"pp": 4, "r": 2, "e": 8}, "pipeline": "pp", "batch": ["r", "e"],
                       "weights": {"experts": "split(0, e)"}}
    ann = scenario_from_dict(doc, "ep.toml")
    assert (ann.parallel.dp, ann.parallel.ep, ann.parallel.pp, ann.parallel.zero) == (16, 8, 4, 1)
    a, b = simulate(ann).metrics, simulate(ref).metrics
    for k in ("step_time_s", "exposed_comm_s", "peak_memory_bytes", "mfu"):
        assert a[k] == pytest.approx(b[k], rel=1e-12), k


def test_sharding_and_parallel_axes_are_not_both_given():
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_doc(sharding=SH, parallel={"tp": 2}), "s.toml")
    assert e.value.key == "parallel.tp"
