"""Asynchronous schedules on the torch runtime (gloo, 2 CPU ranks): PipeDream's and
PipeDream-2BW's weight stashing, step by step.

Oracle: a single process that applies the same stale updates (parsim.validate.reference:
stage s computes on the weights of ``staleness_steps`` updates ago, the optimizer updates
the newest). Three steps, so that the stale versions differ from the current ones; the
negative control shows the gradients a flushed (synchronous) run would give differ, so
the parity could fail.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import launch_parity

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from parsim.schedule.semantics import staleness_steps, traits  # noqa: E402
from parsim.validate.reference import check_parity, expected_flat, reference_steps  # noqa: E402
from parsim.validate.scale import prepare  # noqa: E402

pytestmark = pytest.mark.torch
TINY = str(Path(__file__).parent / "data" / "validate-tiny.toml")
STEPS = 3
ASYNC = {"PipeDream": ["schedule.name=PipeDream"], "PipeDream2BW": ["schedule.name=PipeDream2BW"]}


@pytest.fixture(scope="module")
def async_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("async")
    ranks = launch_parity(TINY, ASYNC.values(), 2, out, 60, 120, steps=STEPS)
    return out, ranks


@pytest.mark.parametrize("i,name", list(enumerate(ASYNC)))
def test_stashed_weights_give_the_stale_updates_gradients(async_runs, i, name):
    out, ranks = async_runs
    sc = prepare(TINY, ASYNC[name], "gloo")
    res = check_parity(sc, out, [r["variants"][i] for r in ranks], variant=i)
    assert res["max_abs_diff"] < 1e-6


@pytest.mark.parametrize("i,name", list(enumerate(ASYNC)))
def test_a_flushed_run_would_differ(async_runs, i, name):
    """Negative control: the synchronous (1F1B) trajectory's gradients of the stale stage
    are not what the asynchronous run produced after the first update."""
    out, ranks = async_runs
    sc = prepare(TINY, ASYNC[name], "gloo")
    stale_stage = 0  # PipeDream: p - 1 - 0 = 1 update stale; 2BW: every stage 1
    assert staleness_steps(traits(name), sc.parallel.pp, stale_stage) >= 1
    fresh = reference_steps(prepare(TINY, ["schedule.name=1F1B"], "gloo"), STEPS)
    r0 = next(r["variants"][i] for r in ranks if r["variants"][i]["pp_rank"] == 0)
    got = torch.load(out / f"grads_rank{r0['rank']}_v{i}_s1.pt")["0:dense"]
    want_sync = expected_flat(fresh[1][1][0], got)
    assert (got["grad"] - want_sync).abs().max() > 1e-4
