"""AMPNet on the torch runtime (gloo): message-driven execution, asynchronous updates on the
weights of now.

Oracles: a single process that replays, stage by stage, the order the run's messages
realized (``parsim.validate.reference.ampnet_reference``): losses, every update's gradients
and the parameters after each step must agree. Negative control: the same orders replayed
with each backward on its forward's weights (weight stashing) must not agree once an update
falls between an instance's forward and its backward, so the parity could fail. With one
instance in flight the order is forced (naive model parallelism): it must be the order the
simulator's AMPNet engine predicts, on every rank and step.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from helpers import launch_parity

torch = pytest.importorskip("torch")
torch.set_num_threads(1)

from parsim.errors import ConfigError  # noqa: E402
from parsim.simulate import simulate  # noqa: E402
from parsim.validate.compare import _order_item  # noqa: E402
from parsim.validate.launch import launch  # noqa: E402
from parsim.validate.reference import check_ampnet_parity  # noqa: E402
from parsim.validate.scale import check_runnable, prepare  # noqa: E402

pytestmark = pytest.mark.torch
TINY = str(Path(__file__).parent / "data" / "validate-tiny.toml")
STEPS = 3
VARIANTS = {  # 4 microbatches (instances) a step
    "one-in-flight": ["schedule.name=AMPNet"],
    "two-in-flight": ["schedule.name=AMPNet", "schedule.max_in_flight=2"],
    # 4 = 3 + 1: a step's last backward joins the next step's first update
    "four-in-flight-every-3": ["schedule.name=AMPNet", "schedule.max_in_flight=4", "schedule.update_every=3"],
}


@pytest.fixture(scope="module")
def ampnet_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("ampnet")
    ranks = launch_parity(TINY, VARIANTS.values(), 2, out, 60, 150, steps=STEPS)
    return out, ranks


def _stale_backwards(order: list) -> int:
    """Backwards of one stage's order with an update between their forward and them."""
    seen, updates, n = {}, 0, 0
    for op, j in order:
        if op == "F":
            seen[j] = updates
        elif op == "B":
            n += updates > seen.pop(j)
        else:
            updates += 1
    return n


@pytest.mark.parametrize("i,name", list(enumerate(VARIANTS)))
def test_ampnet_equals_one_process_replaying_its_order(ampnet_runs, i, name):
    out, ranks = ampnet_runs
    sc = prepare(TINY, VARIANTS[name], "gloo")
    res = check_ampnet_parity(sc, out, [r["variants"][i] for r in ranks], variant=i)
    assert res["max_abs_diff"] < 1e-6
    every = sc.schedule.update_every or 1
    assert res["updates"] == 2 * (STEPS * sc.n_microbatches // every)  # both stages, carried gradients included


@pytest.mark.parametrize("i,name", [(1, "two-in-flight"), (2, "four-in-flight-every-3")])
def test_backwards_on_their_forwards_weights_would_differ(ampnet_runs, i, name):
    """Negative control: instances in flight across an update make the weights a backward sees
    matter; replaying the same orders with stashed (forward-time) weights must fail."""
    out, ranks = ampnet_runs
    sc = prepare(TINY, VARIANTS[name], "gloo")
    res = check_ampnet_parity(sc, out, [r["variants"][i] for r in ranks], variant=i)
    assert sum(_stale_backwards(o) for step in res["orders"] for o in step) > 0
    with pytest.raises(AssertionError):
        check_ampnet_parity(sc, out, [r["variants"][i] for r in ranks], variant=i, weights="forward")


def test_one_in_flight_runs_the_predicted_order(ampnet_runs):
    _, ranks = ampnet_runs
    sc = prepare(TINY, VARIANTS["one-in-flight"], "gloo")
    predicted = [[_order_item(a) for a in row] for row in simulate(sc).schedule.actions]
    m = sc.n_microbatches
    assert predicted[0][:3] == [("F", 0), ("B", 0), ("STEP", -1)] and len(predicted[1]) == 3 * m
    for r in ranks:
        v = r["variants"][0]
        for step in v["steps"]:
            assert [tuple(x) for x in step["order"]] == predicted[v["pp_rank"]]


@pytest.mark.parametrize("sets,key", [
    (["parallel.dp=2", "gpus=4", "training.global_batch=16"], "parallel.dp"),
    (["parallel.tp=2", "gpus=4"], "parallel.tp"),
    (["training.recompute=full"], "training.recompute"),
])
def test_what_the_message_driven_runtime_does_not_build_is_refused_in_one_line(sets, key):
    with pytest.raises(ConfigError) as e:
        check_runnable(TINY, ["schedule.name=AMPNet", *sets])
    assert e.value.key == key


def test_a_rank_failing_mid_step_stops_every_rank_with_one_clear_error(tmp_path):
    """A fault injected into a message-driven step (rank 1's second backward, while rank 0 waits
    on its receiver threads) ends the launch with one error naming the rank, nothing left running."""
    import time

    from parsim.validate.launch import RankFailure
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as ei:
        launch({"scenario": TINY, "backend": "gloo", "steps": 1, "warmup": 0, "overrides": ["schedule.name=AMPNet"],
                "fault": {"rank": 1, "action": "1B1", "kind": "raise"}}, 2, tmp_path, 60)
    assert time.monotonic() - t0 < 60
    assert "rank 1" in str(ei.value) and "injected fault" in str(ei.value)
