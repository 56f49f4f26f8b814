"""Alpa's intra-op ILP and the FlexFlow-style MCMC over the same space (issue 21, steps 2-3).

Oracles: brute-force enumeration of every strategy combination on toy graphs; the closed-form
trade-offs that make Megatron's TP + SP, FSDP or plain DP the right choice on a block."""
from __future__ import annotations

import pytest

pytest.importorskip("scipy")

from parsim.autoplan.blocks import block_graph
from parsim.autoplan.graph import Graph, Setting
from parsim.autoplan.ilp import Problem, brute_force, evaluate, solve
from parsim.autoplan.mcmc import search
from parsim.autoplan.mesh import Mesh
from parsim.autoplan.sharding import propagate
from parsim.cluster.hardware import load_profile
from parsim.config.sharding import sharding_from_table
from parsim.model import get_preset

H100 = load_profile("dgx-h100")
MEGATRON_SP = {"mesh": {"d": 8}, "sequence": "d",
               "weights": {"qkv": "split(1, d)", "out": "split(0, d)", "up": "split(1, d)", "down": "split(0, d)"}}


def _toy_block():
    return block_graph(Setting(get_preset("llama3-8b"), H100, 2, 1024), Mesh((("t", 4),)))


def _toy_2d():
    """qkv -> attn -> out (cyclic) on a 2 x 2 mesh: 25 x 9 x 25 combinations."""
    g = block_graph(Setting(get_preset("llama3-8b"), H100, 4, 1024), Mesh((("a", 2), ("b", 2))))
    ops = g.ops[1:4]
    widths = [e[2] for e in g.edges[1:3]]
    return Graph(ops, ((0, 1, widths[0]), (1, 2, widths[1]), (2, 0, g.edges[0][2])), g.mesh, g.tokens, g.act_bytes)


@pytest.mark.parametrize("budget", [float("inf"), 2.5e9, 2.2e9, 1.0e9])
@pytest.mark.parametrize("runnable", [False, True])
def test_ilp_optimum_equals_brute_force_on_a_block(budget, runnable):
    p = Problem(_toy_block(), H100, n_blocks=2, n_microbatches=4, memory_budget=budget, runnable=runnable)
    bf, il = brute_force(p), solve(p)
    if bf is None:
        assert il is None
        return
    assert il.time_s == pytest.approx(bf.time_s, rel=1e-9)
    assert il.memory_bytes <= budget
    assert evaluate(p, il.choice) == pytest.approx((il.time_s, il.memory_bytes))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_ilp_optimum_equals_brute_force_on_a_2d_mesh(recompute):
    g = _toy_2d()
    free = brute_force(Problem(g, H100, n_microbatches=2, recompute=recompute))
    for budget in (float("inf"), 0.9 * free.memory_bytes):
        p = Problem(g, H100, n_microbatches=2, recompute=recompute, memory_budget=budget)
        bf, il = brute_force(p), solve(p)
        assert (bf is None) == (il is None)
        if bf is not None:
            assert il.time_s == pytest.approx(bf.time_s, rel=1e-9)


def test_megatron_tp_with_sp_falls_out_where_weights_dominate():
    """Llama-3-70B blocks, one sequence of 4096 on a DGX H100: the weights (13.7 GB of states per
    block) cannot stay replicated, and moving activations (tokens x d per collective) costs far
    less than gathering weights (12 d^2): tensor parallelism, with the norms sequence-split
    (the same bytes on the wire, 1/8 of the memory-bound work)."""
    g = block_graph(Setting(get_preset("llama3-70b"), H100, 1, 4096), Mesh((("d", 8),)))
    p = Problem(g, H100, n_blocks=10, memory_budget=70e9)
    sol = solve(p)
    assert sol.choice == propagate(g, sharding_from_table(MEGATRON_SP, "t.toml"))
    no_sp = sharding_from_table({k: v for k, v in MEGATRON_SP.items() if k != "sequence"}, "t.toml")
    assert evaluate(p, propagate(g, no_sp))[0] > sol.time_s


def test_fsdp_falls_out_where_tokens_dominate():
    """Llama-3-8B, 16 x 4096 tokens per microbatch, 32 blocks whose replicated states (112 GB) do
    not fit 45 GB: TP's collectives carry 4 x tokens x d per block pass, exposed (more bytes than
    the block's weights, 12 d^2, once tokens > 3 d), while FSDP's gathers of the weights hide
    behind 65k tokens of compute: every linear layer stored sharded over the 8 GPUs and gathered
    (ZeRO-3 / FSDP)."""
    g = block_graph(Setting(get_preset("llama3-8b"), H100, 16, 4096), Mesh((("d", 8),)))
    p = Problem(g, H100, n_blocks=32, memory_budget=45e9)
    sol = solve(p)
    fsdp = sharding_from_table({"mesh": {"d": 8}, "batch": ["d"], "fsdp": ["d"]}, "t.toml")
    assert sol.choice == propagate(g, fsdp)
    tp = evaluate(p, propagate(g, sharding_from_table(MEGATRON_SP, "t.toml")))
    assert tp[0] > sol.time_s
    # with memory to spare and one sequence per GPU per microbatch, FSDP's gathers (3 x the block's
    # weights per microbatch) no longer hide behind the compute, while plain data parallelism
    # all-reduces the gradients once per step of 64 microbatches: DDP wins
    g = block_graph(Setting(get_preset("llama3-8b"), H100, 8, 1024), Mesh((("d", 8),)))
    roomy = solve(Problem(g, H100, n_blocks=4, n_microbatches=64))
    assert roomy.choice == propagate(g, sharding_from_table({"mesh": {"d": 8}, "batch": ["d"]}, "t.toml"))


def test_expert_parallelism_falls_out_for_the_experts():
    """Mixtral blocks on 8 H100, 8 x 4096 tokens per microbatch: replicated experts would cost
    each GPU all 8 experts' states and a per-step all-reduce of 1.4B parameters per block;
    split over the batch axis (EP) they cost two all-to-alls of the routed tokens per pass."""
    m = get_preset("mixtral-8x7b")
    g = block_graph(Setting(m, H100, 8, 4096), Mesh((("e", 8),)))
    sol = solve(Problem(g, H100, n_blocks=4, n_microbatches=8, memory_budget=60e9))
    experts = g.ops[-1]
    assert experts.name == "experts" and experts.strategies[sol.choice[-1]].roles == ("E",)
    rep = list(sol.choice)
    rep[-1] = next(i for i, s in enumerate(experts.strategies) if s.roles == ("B",))
    assert evaluate(Problem(g, H100, n_blocks=4, n_microbatches=8), tuple(rep))[0] > sol.time_s


@pytest.mark.parametrize("budget", [float("inf"), 2.2e9])
def test_mcmc_never_beats_the_ilp_and_reaches_it_on_a_small_graph(budget):
    p = Problem(_toy_block(), H100, n_blocks=2, n_microbatches=4, memory_budget=budget)
    il = solve(p)
    for seed in range(3):
        mc = search(p, steps=3000, seed=seed)
        assert mc.time_s >= il.time_s * (1 - 1e-12)
        assert mc.memory_bytes <= budget
    assert search(p, steps=3000, seed=0).time_s == pytest.approx(il.time_s, rel=1e-12)


def test_mcmc_on_a_2d_mesh():
    p = Problem(_toy_2d(), H100, n_microbatches=2)
    il = solve(p)
    mc = search(p, steps=5000, seed=1)
    assert mc.time_s >= il.time_s * (1 - 1e-12)
    assert mc.time_s == pytest.approx(il.time_s, rel=1e-12)
