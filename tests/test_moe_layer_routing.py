"""One routing histogram per MoE layer (``[moe] histogram = [[...], ...]``): each MoE layer is
costed with its own routing. Oracles: the blocks add up (a one-stage model's step is the mean of
the steps each layer's histogram gives to the whole model), identical rows are one histogram,
and malformed lists are refused in one line naming the key."""
from __future__ import annotations

import pytest

from parsim.cli.main import main
from parsim.scenario import load_scenario
from parsim.simulate import simulate

TINY_MOE = "scenarios/tiny-moe-cpu.toml"
ROWS = ([233, 661, 536, 618], [535, 976, 44, 493], [1011, 306, 531, 200], [516, 129, 584, 819])
"""tiny-moe's four MoE layers as the validation runtime's router sent its first step's 2,048
assignments (4 microbatches of 256 tokens, top-2), counted per expert."""


def _hist(rows) -> str:
    return "moe.histogram=[" + ",".join("[" + ",".join(str(x) for x in r) + "]" for r in rows) + "]"


def _step(*over) -> float:
    return simulate(load_scenario(TINY_MOE, ["moe.routing=histogram", *over])).metrics["step_time_s"]


def test_per_layer_step_is_the_mean_of_the_layers_whole_model_steps():
    """tiny-moe: one stage, four blocks, all MoE, 1F1B with dp only: the step is linear in the
    blocks' costs, so with layer j on histogram j it is the mean of the four steps where every
    layer has histogram j (brute force over the layers)."""
    per_layer = _step(_hist(ROWS))
    each = [_step("moe.histogram=[" + ",".join(str(x) for x in r) + "]") for r in ROWS]
    assert per_layer == pytest.approx(sum(each) / len(each), rel=1e-9)
    assert min(each) < per_layer < max(each)  # the rows differ: not one of them


def test_identical_rows_are_one_histogram():
    row = ROWS[1]
    assert _step(_hist([row] * 4)) == _step("moe.histogram=[" + ",".join(str(x) for x in row) + "]")


def test_each_stage_gets_its_own_layers_routing():
    """pp = 2 (two MoE blocks a stage): swapping which layers hold the skewed routing moves the
    work between the stages, the step's sum of forwards staying the same."""
    skew, even = [1000, 10, 10, 4], [256, 256, 256, 256]
    sc = ["parallel.pp=2", "parallel.dp=1", "parallel.ep=1", "gpus=2"]
    a = simulate(load_scenario(TINY_MOE, ["moe.routing=histogram", _hist([skew, skew, even, even]), *sc]))
    b = simulate(load_scenario(TINY_MOE, ["moe.routing=histogram", _hist([even, even, skew, skew]), *sc]))
    fa = [a.tables.op(s, "F").parts.total for s in (0, 1)]
    fb = [b.tables.op(s, "F").parts.total for s in (0, 1)]
    assert fa[0] != pytest.approx(fa[1]) and fb[0] != pytest.approx(fb[1])
    assert sum(fa) == pytest.approx(sum(fb), rel=1e-6)  # the ends (embedding, head) are the same in both


@pytest.mark.parametrize("value,key", [
    ("[[1,2,3,4],[1,2,3,4]]", "moe.histogram"),           # 2 lists for 4 MoE layers
    ("[[1,2,3,4],[1,2,3],[1,2,3,4],[1,2,3,4]]", "moe.histogram[1]"),  # 3 values for 4 experts
    ("[[1,2,3,4],[1,-2,3,4],[1,2,3,4],[1,2,3,4]]", "moe.histogram[1]"),
    ("[[0,0,0,0],[1,2,3,4],[1,2,3,4],[1,2,3,4]]", "moe.histogram[0]"),
    ("[[1,2,3,4],5]", "moe.histogram"),
])
def test_malformed_per_layer_histograms_are_refused(capsys, value, key):
    rc = main(["simulate", TINY_MOE, "--set", "moe.routing=histogram", "--set", f"moe.histogram={value}"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0] and "Traceback" not in err[0]
