"""A tied embedding on the torch runtime (gloo, CPU ranks): one matrix where a stage holds both
ends, and where the pipeline cuts it, a copy at each end whose gradients are summed with the other
end's (and the data-parallel replicas') once a step, as Megatron's embedding group does.

Oracle: the single-process model with one shared matrix (parsim.validate.reference), whose
gradient is the sum of the embedding's and the LM head's; every rank's reduced gradients must
equal it, cut to the rank's shard, over two steps (the second runs on the first's update, so the
ends must have updated their copies alike). Negative control: the same run against the untied model."""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import launch_parity, variant_parity

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from parsim.config.parallel import ParallelConfig  # noqa: E402
from parsim.errors import ConfigError  # noqa: E402
from parsim.validate.layout import all_groups  # noqa: E402
from parsim.validate.reference import check_parity  # noqa: E402
from parsim.validate.scale import prepare  # noqa: E402

pytestmark = pytest.mark.torch
TINY = str(Path(__file__).parent / "data" / "validate-tiny.toml")
TIED = "model.tied_embeddings=true"
TWO = {
    "pp1": ["parallel.pp=1", TIED],  # both ends in one stage: one parameter
    "pp1-tp2": ["parallel.pp=1", "parallel.tp=2", TIED],  # the vocabulary rows of both ends alike
    "pp1-dp2-zero1": ["parallel.pp=1", "parallel.dp=2", "parallel.zero=1", TIED],
    "pp2-1F1B": [TIED],  # the copies on ranks 0 and 1, summed at REDUCE_GRAD
    "pp2-interleaved": [TIED, "schedule.name=Interleaved1F1B", "parallel.vpp=2"],
    "pp2-ZBH1": [TIED, "schedule.name=ZBH1"],  # the head's weight gradient deferred to W
    "pp2-ZBV": [TIED, "schedule.name=ZBV"],  # V-shaped: both ends on rank 0, one matrix there
    "pp2-DualPipeV": [TIED, "schedule.name=DualPipeV"],
}
FOUR = {
    "pp2-dp2-zero1": ["gpus=4", "parallel.dp=2", "parallel.zero=1", TIED],
    "pp2-tp2-sp": ["gpus=4", "parallel.tp=2", "parallel.sequence_parallel=true", TIED],
    "pp2-tp2-ZBV": ["gpus=4", "parallel.tp=2", TIED, "schedule.name=ZBV"],  # both ends' shards on rank 0's stages
}


@pytest.fixture(autouse=True)
def _slow_only_when_asked(request):
    if request.node.get_closest_marker("slow") and "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("slow (fresh rank processes): run with -m slow")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tied2")
    return out, launch_parity(TINY, TWO.values(), 2, out, 60, 120, steps=2)


@pytest.mark.parametrize("name", list(TWO))
def test_tied_gradients_equal_the_one_matrix_model(two_ranks, name):
    assert variant_parity(TINY, TWO, name, *two_ranks)["max_abs_diff"] < 1e-6


@pytest.mark.slow
def test_tied_embedding_composes_with_dp_zero_and_tp_on_four_ranks(tmp_path):
    ranks = launch_parity(TINY, FOUR.values(), 4, tmp_path, 90, 200, steps=2)
    for name in FOUR:
        variant_parity(TINY, FOUR, name, tmp_path, ranks)


def test_the_check_tells_summed_copies_from_an_untied_model(two_ranks):
    """Negative control: the pipelined run's gradients against the untied model's (each end's
    own gradient, no sum) must fail the check."""
    out, ranks = two_ranks
    i = list(TWO).index("pp2-1F1B")
    with pytest.raises(AssertionError):
        check_parity(prepare(TINY, [], "gloo"), out, [r["variants"][i] for r in ranks], variant=i)


def test_tied_group_is_both_ends_data_parallel_ranks_by_hand():
    """pp = 4, dp = 2 (dp slowest: rank = 4 dp + pp): the ends are pipeline ranks 0 and 3, so
    the group is {0, 3, 4, 7}; the middle ranks have none; untied or pp = 1, no group."""
    par = ParallelConfig(dp=2, pp=4, order=("dp", "pp", "ep", "cp", "tp"))
    assert all_groups(par, tied=True)["tied"] == [[0, 3, 4, 7]]
    assert all_groups(par)["tied"] == []
    assert all_groups(ParallelConfig(dp=2, pp=1), tied=True)["tied"] == []


@pytest.mark.parametrize("schedule,why", [("DualPipe", "two model copies"), ("PipeDream", "weight versions"),
                                          ("AMPNet", "weight versions")])
def test_schedules_whose_ends_cannot_sum_once_a_step_are_refused_in_one_line(schedule, why):
    with pytest.raises(ConfigError) as e:
        prepare(TINY, [TIED, f"schedule.name={schedule}"], "gloo")
    msg = str(e.value)
    assert "model.tied_embeddings" in msg and why in msg and "\n" not in msg
