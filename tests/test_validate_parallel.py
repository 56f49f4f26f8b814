"""Tensor, sequence, context and expert parallelism on the torch runtime (gloo, CPU ranks).

Oracle: the single-process unsharded model on the same data (parsim.validate.reference);
every rank's reduced gradients must equal the reference's, cut to the rank's shard. The
two-rank variants run in one launch (the default suite); pp x tp, pp x cp and
pp x dp x ep on four ranks are oversubscribed on two cores and marked slow.
Unit tests below hold the pieces to hand-computed cases.
"""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import launch_parity, variant_parity

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from parsim.config.parallel import ParallelConfig  # noqa: E402
from parsim.validate.layout import all_groups, coords  # noqa: E402
from parsim.validate.ring import zigzag_positions  # noqa: E402
from parsim.validate.scale import prepare  # noqa: E402

pytestmark = pytest.mark.torch
TINY = str(Path(__file__).parent / "data" / "validate-tiny.toml")
MOE = ["model.n_experts=4", "model.top_k=2", "model.capacity_factor=1.0"]
TWO = {
    "tp2": ["parallel.pp=1", "parallel.tp=2"],
    "tp2-sp": ["parallel.pp=1", "parallel.tp=2", "parallel.sequence_parallel=true", "model.n_kv_heads=2",
               "model.ffn=swiglu", "model.norm=rmsnorm"],
    "cp2": ["parallel.pp=1", "parallel.cp=2", "training.flash_attention=true"],
    "cp2-gqa": ["parallel.pp=1", "parallel.cp=2", "training.flash_attention=true", "model.n_kv_heads=2"],
    "ep2": ["parallel.pp=1", "parallel.dp=2", "parallel.ep=2", *MOE],
    # Megatron's full recomputation on the runtime's blocks (reentrant checkpoints): the first block
    # of each stage; units of two blocks with the tensor-parallel collectives rerun; the K/V ring rerun
    "recompute-block": ["training.recompute=full", "training.recompute_method=block", "training.recompute_num_layers=1"],
    "tp2-recompute-uniform": ["parallel.pp=1", "parallel.tp=2", "training.recompute=full",
                              "training.recompute_method=uniform", "training.recompute_num_layers=2"],
    "cp2-recompute": ["parallel.pp=1", "parallel.cp=2", "training.flash_attention=true", "training.recompute=full",
                      "training.recompute_method=uniform", "training.recompute_num_layers=1"],
    # Megatron's selective recompute of the modules the runtime builds: the (unfused) attention
    # core and the MLP; the whole MoE layer with its all-to-alls rerun
    "selective-core-mlp": ["training.recompute=selective", 'training.recompute_modules=["core_attn","mlp"]'],
    "ep2-selective-moe": ["parallel.pp=1", "parallel.dp=2", "parallel.ep=2", *MOE, "training.recompute=selective",
                          'training.recompute_modules=["moe"]'],
}
FOUR = {
    "pp2-tp2-sp-ZBH1": ["gpus=4", "parallel.tp=2", "parallel.sequence_parallel=true", "schedule.name=ZBH1"],
    "pp2-cp2-DualPipeV": ["gpus=4", "parallel.cp=2", "training.flash_attention=true", "schedule.name=DualPipeV"],
    "pp2-dp2-ep2-interleaved": ["gpus=4", "parallel.dp=2", "parallel.ep=2", *MOE, "schedule.name=Interleaved1F1B",
                                "parallel.vpp=2", "training.global_batch=16"],
}


@pytest.fixture(autouse=True)
def _slow_only_when_asked(request):
    """The slow runs here start fresh rank processes for minutes: they run with ``-m slow``
    (the marker's documented meaning), not in everyone's default suite."""
    if request.node.get_closest_marker("slow") and "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("slow (fresh rank processes): run with -m slow")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("par2")
    ranks = launch_parity(TINY, TWO.values(), 2, out, 60, 120)
    return out, ranks


@pytest.mark.parametrize("name", list(TWO))
def test_sharded_gradients_equal_the_unsharded_model(two_ranks, name):
    assert variant_parity(TINY, TWO, name, *two_ranks)["max_abs_diff"] < 1e-6


@pytest.mark.slow
def test_parallel_axes_compose_with_pipelines_on_four_ranks(tmp_path):
    ranks = launch_parity(TINY, FOUR.values(), 4, tmp_path, 90, 200)
    for name in FOUR:
        variant_parity(TINY, FOUR, name, tmp_path, ranks)


def test_zigzag_split_by_hand():
    """8 tokens, cp = 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2."""
    assert zigzag_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert zigzag_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    everything = torch.cat([zigzag_positions(24, 3, i) for i in range(3)])
    assert sorted(everything.tolist()) == list(range(24))


def test_groups_by_hand():
    """dp=2 x pp=2 x tp=2 (tp innermost): rank = 4 dp + 2 pp + tp."""
    par = ParallelConfig(dp=2, pp=2, tp=2)
    c = coords(par, 6)
    assert (c.dp, c.pp, c.cp, c.tp) == (1, 1, 0, 0)
    g = all_groups(par)
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert sorted(g["grad"]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    two = all_groups(ParallelConfig(dp=1, pp=4), n_chains=2)["grad"]  # copies on ranks r and p-1-r
    assert sorted(two) == [[0, 3], [1, 2]]
    ep = all_groups(ParallelConfig(dp=4, pp=1, ep=2))
    assert ep["ep"] == [[0, 1], [2, 3]] and sorted(ep["edp"]) == [[0, 2], [1, 3]]


def test_routing_keeps_first_choices_before_second_and_drops_over_capacity():
    """4 tokens, 2 experts, top-1 then top-2, capacity ceil(0.5 * 4 * 2 / 2) = 2 per expert."""
    from parsim.validate.experts import MoE
    from parsim.validate.model import swiglu
    from parsim.validate.scale import prepare as prep
    from parsim.validate.tensor_parallel import SplitLinear
    spec = prep(TINY, MOE, "gloo").model
    import dataclasses
    spec = dataclasses.replace(spec, n_experts=2, top_k=2, capacity_factor=0.5)
    moe = MoE(spec, torch.float32, SplitLinear, swiglu)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 1.0  # expert 0's score = feature 0
    h = torch.zeros(4, spec.d_model)
    h[:, 0] = torch.tensor([3.0, 2.0, -1.0, -2.0])  # tokens 0, 1 prefer expert 0; 2, 3 expert 1
    e, tok, w = moe.route(h)
    kept = sorted(zip(e.tolist(), tok.tolist()))
    # expert 0: first choices of tokens 0, 1 fill it (cap 2): token 2's and 3's second choices dropped;
    # expert 1: first choices of tokens 2, 3 fill it: tokens 0's and 1's second choices dropped
    assert kept == [(0, 0), (0, 1), (1, 2), (1, 3)]
    p0 = 1 / (1 + math.exp(-3.0))  # softmax of (3, 0); renormalised over the top-2 it stays p0
    assert w[0].item() == pytest.approx(p0, rel=1e-6)
    moe.drop = False
    assert len(moe.route(h)[0]) == 8


@pytest.mark.parametrize("method, k", [("uniform", 1), ("uniform", 2), ("block", 1), ("selective", 0)])
def test_checkpointed_blocks_keep_what_the_cost_model_counts(method, k):
    """The runtime's full recomputation keeps each unit's input (reentrant checkpoints: a saved
    tensor the probe sees) and, for blocks outside the units, their whole stash; selective
    recomputation of the core and the MLP keeps the rest of each block: the measured stash of
    both pipeline stages equals ``StageCost.activation_bytes`` within 5% (the gate)."""
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.model_costs import ModelCosts
    from parsim.validate.model import (
        build_stages,
        microbatch_data,
        set_recompute,
        set_recompute_modules,
    )
    from parsim.validate.probe import stage_activation_bytes
    modules = ("core_attn", "mlp")  # selective: the unfused core's scores and the MLP's tensors go
    sc = prepare(TINY, [f'training.recompute_modules=["{modules[0]}","{modules[1]}"]', "training.recompute=selective"]
                 if method == "selective" else ["training.recompute=full", f"training.recompute_method={method}",
                                                f"training.recompute_num_layers={k}"], "gloo")
    tr = sc.training
    stages = build_stages(sc.model, sc.layers_per_stage, tr.seq_len, tr.flash_attention)
    tokens, targets = microbatch_data(sc.model, 1, tr.microbatch_size, tr.seq_len, 0)[0]
    costs = ModelCosts(cost_inputs(sc))
    plain = stage_activation_bytes(stages[1], torch.randn(tr.microbatch_size, tr.seq_len, sc.model.d_model),
                                   targets)["activation_bytes"]
    for s, st in enumerate(stages):
        if method == "selective":
            set_recompute_modules(st, modules)
        else:
            set_recompute(st, method, k)
        x = tokens if st.first else torch.randn(tr.microbatch_size, tr.seq_len, sc.model.d_model)
        measured = stage_activation_bytes(st, x, targets if st.last else None)["activation_bytes"]
        predicted = costs.stage_costs[s].activation_bytes
        assert measured == pytest.approx(predicted, rel=0.05), (s, measured, predicted)
    assert measured < plain  # the checkpoints keep less than the plain stage


@pytest.mark.parametrize("name", ["cp2", "cp2-gqa"])
def test_ring_sends_what_the_cost_model_counts(two_ranks, name):
    """The runtime's ring moves the bytes the cost model charges (``parsim.costs.context``): per
    block, the forward passes K/V on cp - 1 times and the backward K/V and the travelling dK/dV
    cp - 1 times each, as Transformer Engine's ring does (a rank keeps its own chunk's partial
    gradient; the others' arrive after the last step) -- twice the forward's bytes."""
    from parsim.costs.context import cp_attention
    from parsim.costs.inputs import cost_inputs, layer_inputs
    _, ranks = two_ranks
    i = list(TWO).index(name)
    sc = prepare(TINY, TWO[name], "gloo")
    ca = cp_attention(layer_inputs(cost_inputs(sc)))
    for r in ranks:
        spans = r["variants"][i]["steps"][0]["spans"]
        sent = {}
        for stream, op, _stage, mb, _t0, _t1, nbytes in spans:
            if stream == "cp":
                sent.setdefault((op, mb), 0.0)
                sent[(op, mb)] += nbytes
        assert sent, "no context-parallel communication recorded"
        for (op, _mb), nbytes in sent.items():
            per_block = ca.forward_bytes if op == "F" else ca.backward_bytes
            assert nbytes == pytest.approx(sc.model.n_layers * per_block, rel=1e-12), (op, nbytes)


def test_sequence_parallel_backward_gathers_each_column_input_again(two_ranks):
    """Megatron's sequence parallelism keeps only the sequence shard of every column-parallel
    layer's input (QKV, FC1, the LM head) and gathers it again in the backward. Every other
    collective has its conjugate in the other pass (block all-gathers / reduce-scatters, the
    embedding's reduce-scatter / all-gather, the head's all-gather / reduce-scatter), except the
    cross-entropy's three all-reduces of one fp32 number per token in the forward. So a
    microbatch's backward moves 2 L + 1 gathered activations more than its forward, less
    those three: in the runtime's records (buffer bytes) and in the cost model's bytes sent
    (an all-gather over 2 ranks sends half its buffer, an all-reduce all of it)."""
    from parsim.costs.inputs import cost_inputs, layer_inputs
    from parsim.costs.layer import layer_cost
    from parsim.costs.stage import embedding_cost, head_cost
    _, ranks = two_ranks
    i = list(TWO).index("tp2-sp")
    sc = prepare(TINY, TWO["tp2-sp"], "gloo")
    tr, m = sc.training, sc.model
    tokens = tr.microbatch_size * tr.seq_len
    act, loss = tokens * m.d_model * 4, tokens * 4  # fp32
    for r in ranks:
        sent: dict = {}
        for stream, op, _stage, mb, _t0, _t1, nbytes in r["variants"][i]["steps"][0]["spans"]:
            if stream == "tp":
                sent.setdefault(mb, {}).setdefault(op, 0.0)
                sent[mb][op] += nbytes
        assert sent and all(set(ops) == {"F", "B"} for ops in sent.values())
        for ops in sent.values():
            assert ops["B"] - ops["F"] == (2 * m.n_layers + 1) * act - 3 * loss
    li = layer_inputs(cost_inputs(sc))
    lc, head, emb = layer_cost(li, False), head_cost(li), embedding_cost(li)
    model = (m.n_layers * (lc.backward_input_bytes.tp - lc.forward_bytes.tp)
             + head.backward_bytes.tp - head.forward_bytes.tp + emb.backward_bytes.tp - emb.forward_bytes.tp)
    assert model == pytest.approx((2 * m.n_layers + 1) * act / 2 - 3 * loss, rel=1e-12)
