"""TeraPipe (Li et al., ICML'21): token slices as schedulable units.

Oracles: brute force over every slicing of a small grid (the DP), GPipe's closed-form makespan
(m + p - 1)(t_F + t_B) over the m*K units with constant costs (the dry run), GPipe itself (K = 1
runs the same actions at the same cost), and the definition of the slice dependencies
(K/V of earlier slices forward, their gradients from later slices backward).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from parsim.costs.slices import (
    SliceCostModel,
    SlicedCosts,
    context_attention_s,
    slice_grid,
)
from parsim.errors import ConfigError, ScheduleError
from parsim.schedule import Durations, build, dry_run, lower, validate
from parsim.schedule.ir import Op
from parsim.schedule.terapipe import (
    brute_force_slicing,
    check_slice_order,
    objective,
    optimal_slicing,
    terapipe,
    uniform_lengths,
)
from parsim.simulate import simulate
from tests.helpers import scenario

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the DP


def _affine(a, b, d):
    """A slice's time: fixed overhead + per token + attention over its context (monotone)."""
    return lambda l, c: a + b * l + d * l * (c + (l + 1) / 2)


@pytest.mark.parametrize("stages,micro", [(1, 1), (2, 1), (4, 2), (8, 1), (96, 3)])
@pytest.mark.parametrize("t", [_affine(1.0, 0.1, 0.01), _affine(0.05, 1.0, 0.2), _affine(3.0, 0.5, 0.0),
                               lambda l, c: math.ceil(l / 3) + 0.3 * (c % 5) + 0.01 * l * c])
def test_dp_equals_brute_force(stages, micro, t):
    n, grid = 10, 2
    dp = optimal_slicing(n * grid, stages, t, grid=grid, microbatches=micro)
    bf = brute_force_slicing(n * grid, stages, t, grid=grid, microbatches=micro)
    assert dp.objective_s == pytest.approx(bf.objective_s, rel=1e-12)
    assert sum(dp.lengths) == n * grid and all(x % grid == 0 for x in dp.lengths)
    # the reported objective is the slicing's own
    assert dp.objective_s == pytest.approx(objective(dp.times_s, stages, micro), rel=1e-12)


def test_dp_trades_slices_against_the_pipeline_depth():
    t = _affine(1.0, 0.1, 0.0)
    assert len(optimal_slicing(64, 1, t, grid=1).lengths) == 1       # no pipeline: one slice
    assert len(optimal_slicing(64, 32, t, grid=1).lengths) > 4       # deep pipeline: many slices


@pytest.mark.parametrize("seq_len,grid", [(30, 7), (23, 3), (11, 4)])
def test_dp_on_a_grid_that_does_not_divide_equals_brute_force(seq_len, grid):
    """The last cell is the remainder (30 = 4 x 7 + 2): the DP and brute force over the same cells agree."""
    for stages, micro in ((4, 1), (8, 2)):
        t = _affine(1.0, 0.3, 0.05)
        dp = optimal_slicing(seq_len, stages, t, grid=grid, microbatches=micro)
        bf = brute_force_slicing(seq_len, stages, t, grid=grid, microbatches=micro)
        assert dp.objective_s == pytest.approx(bf.objective_s, rel=1e-12)
        assert sum(dp.lengths) == seq_len and all(x % grid == 0 for x in dp.lengths[:-1])


def test_dp_refuses_a_grid_below_one():
    with pytest.raises(ScheduleError, match="grid"):
        optimal_slicing(30, 4, _affine(1, 1, 0), grid=0)


def test_scenario_grid_has_at_most_64_cells_for_any_length():
    for seq in (1, 63, 64, 2048, 2049, 4093, 131072):
        g = slice_grid(seq)
        assert -(-seq // g) <= 64 and (seq <= 64 or -(-seq // (g - 1)) > 64)  # the finest such grid


def test_uniform_lengths():
    assert uniform_lengths(10, 3) == (4, 3, 3)
    with pytest.raises(ScheduleError):
        uniform_lengths(4, 5)


# ----------------------------------------------------------------------------- the IR


def test_one_slice_is_gpipe():
    assert terapipe(4, 3, 1).actions == build("GPipe", 4, 3).actions


@pytest.mark.parametrize("pp,m,k", [(1, 1, 4), (3, 2, 3), (4, 4, 8)])
def test_schedule_validates_and_dry_runs_as_gpipe_over_units(pp, m, k):
    s = terapipe(pp, m, k)
    assert (s.n_microbatches, s.n_slices) == (m * k, k)
    validate(lower(s))
    d = Durations(f=1.0, b=2.5, i=1.25, w=1.25, comm=0.0)
    assert dry_run(s, durations=d).makespan == pytest.approx((m * k + pp - 1) * 3.5)


def test_slice_order_is_enforced():
    s = terapipe(3, 2, 3)
    rows = [list(r) for r in s.actions]
    i = rows[1].index(next(a for a in rows[1] if a.op is Op.B))  # first backward: slice 2 of microbatch 0
    rows[1][i], rows[1][i + 1] = rows[1][i + 1], rows[1][i]      # slice 1 before slice 2: K/V grads missing
    with pytest.raises(ScheduleError, match="reverse slice order"):
        check_slice_order(s.with_actions(rows))
    rows = [list(r) for r in s.actions]
    rows[0][0], rows[0][1] = rows[0][1], rows[0][0]
    with pytest.raises(ScheduleError, match="forwards in slice order"):
        validate(s.with_actions(rows))


# ----------------------------------------------------------------------------- costs and the engine


WIDE = {"name": "w", "n_layers": 8, "d_model": 4096, "n_heads": 32, "n_kv_heads": 32, "d_ff": 16384,
        "vocab_size": 1000, "ffn": "gelu", "norm": "layernorm", "bias": True, "position": "learned",
        "max_seq_len": 4096}


def _tiny(k=None, name="TeraPipe", pp=4, m=2, model=None, seq=512):
    sc = scenario(pp=pp, m=m, schedule="GPipe", layers=8, model=model, training={"seq_len": seq})
    return replace(sc, schedule=replace(sc.schedule, name=name, token_slices=k))


def test_attention_over_the_context_grows_with_position():
    sc = _tiny(4)
    model = SliceCostModel(sc)
    inp = model.costs_of(128).layer_inputs
    assert context_attention_s(inp, 0) == (0.0, 0.0)
    f1, b1 = context_attention_s(inp, 128)
    f2, b2 = context_attention_s(inp, 384)
    f3, b3 = context_attention_s(inp, 8192)
    assert 0 < f1 < f2 < f3 and 0 < b1 <= b2 < b3  # small shapes: the kernel's last wave may hide a block
    costs = SlicedCosts(model, (128,) * 4)
    fw = [costs.unit_cost(1, Op.F, u).duration_s for u in range(4)]
    assert fw == sorted(fw) and fw[0] < fw[-1]
    assert costs.unit_p2p_bytes(1, Op.SEND_F, 0) == pytest.approx(costs.base.p2p_bytes(1, Op.SEND_F) / 4)


def test_one_slice_simulates_as_gpipe():
    a, b = simulate(_tiny(1)), simulate(_tiny(None, name="GPipe"))
    assert a.metrics["step_time_s"] == pytest.approx(b.metrics["step_time_s"], rel=1e-12)


def test_slices_shrink_the_bubble_of_a_deep_pipeline():
    kw = {"pp": 8, "m": 1, "model": WIDE, "seq": 4096}
    g = simulate(_tiny(None, name="GPipe", **kw)).metrics
    t = simulate(_tiny(4, **kw)).metrics
    assert t["step_time_s"] < 0.6 * g["step_time_s"]
    assert t["token_slices"] == 4 and t["n_microbatches"] == 1
    auto = simulate(_tiny("auto", **kw)).metrics
    assert auto["step_time_s"] <= t["step_time_s"] * 1.02  # the DP's objective approximates the engine's makespan


def test_interpreters_refuse_token_slices_they_cannot_run():
    sc = _tiny(4)
    full = replace(sc, simulation=replace(sc.simulation, mode="full"))
    with pytest.raises(ScheduleError, match="full engine does not run token slices"):
        simulate(full)


# ----------------------------------------------------------------------------- input and CLI


def test_scenario_keys_are_checked():
    from parsim.scenario import scenario_from_dict
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": 2, "model": {"preset": "gpt2"},
           "training": {"global_batch": 2, "seq_len": 512}, "parallel": {"pp": 2},
           "schedule": {"name": "1F1B", "token_slices": 4}}
    with pytest.raises(ConfigError, match="TeraPipe only"):
        scenario_from_dict(doc, "x.toml")
    doc["schedule"] = {"name": "TeraPipe", "token_slices": "many"}
    with pytest.raises(ConfigError, match="token_slices"):
        scenario_from_dict(doc, "x.toml")
    doc["schedule"] = {"name": "tera-pipe", "token_slices": "auto"}
    assert scenario_from_dict(doc, "x.toml").schedule.token_slices == "auto"


def test_cli_prints_the_sliced_schedule():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "parsim", "schedule", "TeraPipe", "--pp", "2", "--microbatches", "1",
                        "--token-slices", "3"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "3 token slices" in r.stdout and "1B2" in r.stdout
    r = subprocess.run([sys.executable, "-m", "parsim", "schedule", "1F1B", "--pp", "2", "--microbatches", "1",
                        "--token-slices", "3"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


@pytest.mark.parametrize("seed", range(6))
def test_dp_equals_brute_force_on_arbitrary_times(seed):
    """Any slice times at all (not monotone, with ties): the downward walk over bounds is exact."""
    import random
    rng = random.Random(seed)
    table = {}
    t = lambda l, c: table.setdefault((l, c), float(rng.choice([rng.randint(1, 9), rng.random() * 10])))
    stages, micro = rng.choice([1, 2, 5, 40]), rng.choice([1, 3])
    dp = optimal_slicing(11, stages, t, grid=1, microbatches=micro)
    bf = brute_force_slicing(11, stages, t, grid=1, microbatches=micro)
    assert dp.objective_s == pytest.approx(bf.objective_s, rel=1e-12)


# ----------------------------------------------------------------------------- the paper


def test_gpt3_175b_on_48_p3_speedup_matches_the_paper_and_grows_with_the_sequence():
    """Li et al. ICML'21: 5.0x over the same pipeline without token slicing, GPT-3 175B on 48
    p3.16xlarge at sequence 2048 (tests/data/terapipe.json); the speed-up grows with the sequence."""
    import json
    paper = json.loads((ROOT / "tests" / "data" / "terapipe.json").read_text())
    from parsim.scenario import load_scenario

    def speedup(seq):
        sc = load_scenario(str(ROOT / "scenarios" / "gpt3-175b-terapipe-p3.toml"), [f"training.seq_len={seq}"])
        gp = replace(sc, schedule=replace(sc.schedule, name="GPipe", token_slices=None))
        return simulate(gp).metrics["step_time_s"] / simulate(sc).metrics["step_time_s"]

    s2048, s8192 = speedup(2048), speedup(8192)
    want = paper["speedup_over_gpipe"]
    assert abs(s2048 / want - 1) <= paper["tolerance"], s2048
    assert s8192 > s2048


def test_blocking_sends_hold_the_sender():
    """GPipe, 2 stages, 2 microbatches, F = 1 s, B = 2 s, 0.5 s per transfer (hand-computed):
    asynchronous sends give 10 s; a send that holds its sender until it arrives gives 11 s."""
    costs = {"forward_s": 1.0, "backward_s": 2.0, "p2p_s": 0.5}
    sc = scenario(pp=2, m=2, schedule="GPipe", costs=costs)
    assert simulate(sc).metrics["step_time_s"] == pytest.approx(10.0)
    blocking = replace(sc, overlap=replace(sc.overlap, p2p=False))
    assert simulate(blocking).metrics["step_time_s"] == pytest.approx(11.0)
