"""The routing an MoE validation run produced (parsim.validate.routing) and the prediction given it.

Oracles: hand-made rank records (sums, warm-up steps left out, both copies of a two-copy
schedule adding up); a uniform histogram is what ``balanced`` means, so the prediction from it
equals the scenario's own; the runtime's MoE block records each top-k assignment's expert before
capacity dropping, counted by hand on a router whose choices are forced.
"""
from __future__ import annotations

import dataclasses

import pytest

from parsim.cli.validate import plan_validation
from parsim.validate.routing import predicted_with_routing, run_routing

MOE_SCENARIO = "scenarios/tiny-moe-cpu.toml"


def _rank(warmup: int, steps: list[dict]) -> dict:
    return {"warmup": warmup, "steps": steps}


def test_run_routing_sums_measured_steps_over_ranks_and_launches():
    step = lambda rows: {"moe_routed": {"0": rows}}
    launches = [[_rank(1, [step([[9, 9], [9, 9]]), step([[1, 2], [3, 4]])]), _rank(1, [step([[9, 9], [9, 9]]),
                                                                                     step([[5, 6], [7, 8]])])],
                [[_rank(0, [step([[1, 0], [0, 1]])])][0], _rank(0, [step([[0, 0], [0, 0]])])]]
    assert run_routing(launches, chain_len=1) == ((7.0, 8.0), (10.0, 13.0))


def test_two_copies_add_up_and_dense_runs_give_none():
    launches = [[_rank(0, [{"moe_routed": {"0": [[1, 1]], "1": [[2, 0]], "2": [[0, 3]], "3": [[4, 4]]}}])]]
    # stages 0, 1 are copy one's pieces 0, 1; stages 2, 3 copy two's pieces 0, 1
    assert run_routing(launches, chain_len=2) == ((1.0 + 0.0, 1.0 + 3.0), (2.0 + 4.0, 0.0 + 4.0))
    assert run_routing([[_rank(0, [{"spans": []}])]], chain_len=1) is None


def test_uniform_histogram_predicts_what_balanced_predicts():
    run = plan_validation(MOE_SCENARIO, [], "gloo")
    sc = run.predicted.scenario
    uniform = tuple((1.0,) * sc.model.n_experts for _ in range(sc.model.n_layers))
    assert predicted_with_routing(run.predicted, uniform) == pytest.approx(run.predicted.metrics["step_time_s"],
                                                                           rel=1e-12)
    # rank 0 (experts 0, 1) gets 10 of 16 assignments, each expert at its capacity (1.25 x 1/4):
    # nothing dropped, the group waits for the busier rank
    skew = tuple((5.0, 5.0, 3.0, 3.0) for _ in range(sc.model.n_layers))
    assert predicted_with_routing(run.predicted, skew) > run.predicted.metrics["step_time_s"]


def test_the_runtime_records_every_assignment_before_dropping():
    torch = pytest.importorskip("torch")
    from parsim.validate.experts import MoE
    from parsim.validate.model import swiglu
    from parsim.validate.scale import prepare
    from parsim.validate.tensor_parallel import SplitLinear
    from parsim.validate.worker import routed_counts

    spec = dataclasses.replace(prepare(MOE_SCENARIO, [], "gloo").model, n_experts=2, top_k=2, capacity_factor=0.5)
    moe = MoE(spec, torch.float32, SplitLinear, swiglu)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 1.0
    h = torch.zeros(4, spec.d_model)
    h[:, 0] = torch.tensor([3.0, 2.0, -1.0, -2.0])  # first choices: 0, 0, 1, 1; second: 1, 1, 0, 0
    moe.route(h)
    moe.route(h[:2])                                  # first choices 0, 0; second 1, 1
    block = type("Block", (), {"moe": moe})()
    stage = type("Stage", (), {"blocks": [block, type("Dense", (), {"moe": None})()]})()
    # capacity ceil(0.5 * 4 * 2 / 2) = 2 drops half of the first call's assignments: counted anyway
    assert routed_counts({0: stage}) == {"0": [[4 + 2, 4 + 2]]}  # one MoE block, two experts
    assert moe.routed == [] and routed_counts({0: stage}) == {"0": [[0, 0]]}
