"""The tied embedding's gradient all-reduce between the pipeline's first and last stage
(Megatron's ``_allreduce_word_embedding_grads``): hand-computed sizes and groups."""
from __future__ import annotations

import pytest

from parsim.cluster.collectives import collective_time
from parsim.costs import ModelCosts
from parsim.costs.dp import tied_embedding_sync_s
from parsim.scenario import load_scenario
from parsim.schedule.ir import Op


def _reduce(sc, stage):
    ops = ModelCosts.from_scenario(sc).stage_ops(stage)
    return ops[Op.REDUCE_GRAD].duration_s if Op.REDUCE_GRAD in ops else 0.0


def test_without_data_parallelism_the_tied_copies_sync_is_the_end_stages_reduction():
    """tiny GPT, pp = 2, dp = 1, tied: each end stage all-reduces the vocab x d fp32 gradient with
    the other (ranks 0 and 1); untied, nothing to reduce."""
    tied = load_scenario("scenarios/tiny-cpu.toml", ["model.tied_embeddings=true"])
    want = collective_time(tied.hardware, "all_reduce", 1024 * 256 * 4.0, [0, 1])
    assert want > 0
    assert _reduce(tied, 0) == pytest.approx(want) and _reduce(tied, 1) == pytest.approx(want)
    untied = load_scenario("scenarios/tiny-cpu.toml")
    assert _reduce(untied, 0) == 0.0 and _reduce(untied, 1) == 0.0
    one_stage = load_scenario("scenarios/tiny-cpu.toml", ["model.tied_embeddings=true", "parallel.pp=1", "gpus=1"])
    assert _reduce(one_stage, 0) == 0.0  # one copy: nothing to keep in sync


def test_gpt3_syncs_its_embedding_shard_between_the_pipeline_ends_only():
    """GPT-3 175B (tied, tp 8, pp 8): the first and last stage add the all-reduce of the vocab x
    12288 / 8 gradient shard (the gradient buffer's dtype) between ranks 0 and the last
    pipeline rank; the middle stages add nothing."""
    sc = load_scenario("scenarios/gpt3-175b-1f1b.toml")
    m, par = sc.model, sc.parallel
    assert m.tied_embeddings and par.pp > 1
    pipe = par.pipeline_ranks()
    nbytes = m.vocab_size * m.d_model / par.tp * par.grad_bytes(sc.training.precision)
    want = collective_time(sc.hardware, "all_reduce", nbytes, [pipe[0], pipe[-1]])
    mc = ModelCosts.from_scenario(sc)
    for first, head_copy, expected in ((True, False, want), (False, True, want), (False, False, 0.0)):
        got = tied_embedding_sync_s(mc.inputs.cluster, m, par, sc.training.precision, first, head_copy, True)
        assert got == pytest.approx(expected)
    assert tied_embedding_sync_s(mc.inputs.cluster, m, par, sc.training.precision, True, False, False) == 0.0
    # the middle stages are alike: their reductions equal, the ends' exceed theirs by at least the sync
    middle = _reduce(sc, 3)
    assert _reduce(sc, 4) == middle
    assert _reduce(sc, 0) > middle and _reduce(sc, par.pp - 1) > middle


def test_the_full_engine_runs_the_sync_after_the_stage_s_reduction():
    """simulation.mode = "full" times the data-parallel part as flows and then the tied sync as
    a fixed span: with dp = 1 the two engines agree to the nanosecond, the end stages' REDUCE_GRAD
    spans exactly the sync."""
    import pandas as pd

    from parsim.simulate import simulate
    want = collective_time(load_scenario("scenarios/tiny-cpu.toml").hardware, "all_reduce", 1024 * 256 * 4.0, [0, 1])
    steps = {}
    for mode in ("fast", "full"):
        sc = load_scenario("scenarios/tiny-cpu.toml", ["model.tied_embeddings=true", f'simulation.mode="{mode}"'])
        r = simulate(sc)
        rows = pd.DataFrame(r.timeline)
        spans = rows[rows.op == "REDUCE_GRAD"]
        assert len(spans) == 2 and ((spans.end_s - spans.start_s) - want).abs().max() < 1e-12
        steps[mode] = r.metrics["step_time_s"]
    assert steps["full"] == pytest.approx(steps["fast"], abs=1e-9)


def test_the_validation_runtime_runs_a_tied_embedding_where_its_ends_sum_once_a_step():
    """The runtime ties the matrix (one parameter in a stage holding both ends, a copy per end
    summed at REDUCE_GRAD where the pipeline cuts it: tests/test_validate_tied.py); schedules
    whose ends cannot sum once a step (two model copies, weight versions) are refused in one line."""
    from parsim.errors import ConfigError
    from parsim.validate.scale import check_supported
    check_supported(load_scenario("scenarios/tiny-cpu.toml", ["model.tied_embeddings=true"]))
    with pytest.raises(ConfigError, match="model.tied_embeddings"):
        check_supported(load_scenario("scenarios/tiny-cpu.toml", ["model.tied_embeddings=true", "schedule.name=Chimera"]))
