"""Context-parallel ranks sum their gradients with the data-parallel replicas.

CP ranks run the same weights on different tokens of the same sequences, so Megatron-Core
reduces dense gradients (and shards its distributed optimizer) over the data-parallel group
*with* context parallelism (``dp_cp``: its default gradient bucket is max(40M, 1M x
|dp_cp|) parameters), and torchtitan's FSDP shards over ``dp_shard_cp``. Before this, parsim
reduced over dp alone: a cp = 2, dp = 1 job had no gradient reduction at all, while the torch
runtime measured one (``parsim validate ... parallel.cp=2``: REDUCE_GRAD 16.8 ms)."""
from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import TINY_GPT

from parsim.cluster.collectives import grad_bucket_bytes, n_buckets, select_algorithm
from parsim.config.parallel import ParallelConfig
from parsim.config.scenario import SimulationConfig
from parsim.costs.inputs import rank_groups
from parsim.costs.memory import state_bytes_per_param
from parsim.costs.model_costs import ModelCosts
from parsim.scenario import scenario_from_dict
from parsim.schedule.ir import Op
from parsim.simulate import simulate


def test_grad_group_is_dp_times_cp_hand_computed():
    # default order (dp, pp, cp, ep, tp), tp = 2, cp = 2, dp = 2, pp = 1: cp stride 2, dp stride 4
    par = ParallelConfig(dp=2, tp=2, cp=2)
    assert par.grad_degree == 4 and par.shard_degree == 4
    assert par.grad_group_ranks(0) == [0, 2, 4, 6]
    assert par.grad_group_ranks(3) == [1, 3, 5, 7]      # the other tp rank's group
    assert list(rank_groups(par).dp) == [0, 2, 4, 6]
    # HSDP: dp_shard x cp ranks hold one shard; the first dp_shard * cp of the dp-major group
    hsdp = ParallelConfig(dp=4, cp=2, dp_shard=2, zero=3)
    assert hsdp.shard_degree == 4 and hsdp.grad_group_ranks(0)[:4] == [0, 1, 2, 3]
    # cp = 1: the dp axis alone, as before
    assert ParallelConfig(dp=4, tp=2).grad_group_ranks(0) == ParallelConfig(dp=4, tp=2).group_ranks("dp", 0)


def _job(dp, cp, zero=0, full=False):
    """A tiny GPT on A100 nodes, dp x cp ranks (tp = pp = 1), two microbatches per replica."""
    sc = scenario_from_dict({
        "name": "t", "hardware": "dgx-a100-80g", "gpus": dp * cp, "model": dict(TINY_GPT),
        "training": {"global_batch": 2 * dp, "microbatch_size": 1, "seq_len": 512, "flash_attention": True},
        "parallel": {"dp": dp, "cp": cp, "zero": zero}, "schedule": {"name": "1F1B"},
        "overlap": {"grad_reduce": False}}, "t.toml")
    return replace(sc, simulation=SimulationConfig("full")) if full else sc


def test_cp_only_job_reduces_its_gradients_over_the_cp_ranks():
    sc = _job(dp=1, cp=2)
    mc = ModelCosts.from_scenario(sc)
    reduce = mc.op_cost(0, Op.REDUCE_GRAD)
    _, g, _ = state_bytes_per_param(sc.training.optimizer, sc.training.precision)
    params = mc.stage_costs[0].params
    # an all-reduce of the stage's gradients over ranks (0, 1), the cp pair, in Megatron's buckets
    bucket = grad_bucket_bytes(0, 2, 2)
    nb = n_buckets(params * g, bucket)
    _, per = select_algorithm(sc.hardware, "all_reduce", params * g / nb, [0, 1])
    assert reduce.duration_s > 0
    assert reduce.duration_s == pytest.approx(nb * per, rel=1e-9)
    assert simulate(sc).metrics["comm_bytes_by_axis"]["dp"] > 0


def test_zero1_shards_optimizer_state_over_dp_times_cp():
    def opt_bytes(dp, cp):
        return ModelCosts.from_scenario(_job(dp, cp, zero=1)).model_states([0], 0)["optimizer"]
    # the same 4-way sharding whether the 4 ranks are dp or dp x cp
    assert opt_bytes(2, 2) == pytest.approx(opt_bytes(4, 1))
    assert opt_bytes(1, 4) == pytest.approx(opt_bytes(4, 1))
    assert opt_bytes(1, 4) == pytest.approx(opt_bytes(1, 1) / 4)


def test_full_mode_reduces_over_the_same_group_as_fast_mode():
    fast = simulate(_job(2, 2)).metrics["exposed_comm_by_axis_s"]["dp"]
    full = simulate(_job(2, 2, full=True)).metrics["exposed_comm_by_axis_s"]["dp"]
    assert fast > 0
    assert full == pytest.approx(fast, rel=0.05)
