"""Stage partitioning: the DP against brute force, memory limits, scenario keys."""
from __future__ import annotations

import itertools

import pytest
from helpers import scenario

from parsim import simulate
from parsim.costs.partition import balanced_partition
from parsim.errors import ConfigError


def _brute(times, S, fe, le, mem=None, limit=None):
    n, best = len(times), None
    for cuts in itertools.combinations(range(1, n), S - 1):
        b = (0, *cuts, n)
        sizes = tuple(b[k + 1] - b[k] for k in range(S))
        if mem is not None and any(sum(mem[k][b[k]:b[k + 1]]) > limit for k in range(S)):
            continue
        cost = max(sum(times[b[k]:b[k + 1]]) + (fe if k == 0 else 0) + (le if k == S - 1 else 0) for k in range(S))
        if best is None or cost < best[0] - 1e-12:
            best = (cost, sizes)
    return best


@pytest.mark.parametrize("times, S, fe, le", [
    ([1] * 10, 4, 0, 0), ([1] * 10, 4, 3, 3), ([1, 2, 3, 4, 5, 6], 3, 0, 0), ([2, 1, 1, 1, 1, 2, 5], 3, 1, 4),
    ([1] * 12, 4, 0, 2.5),
])
def test_dp_equals_brute_force(times, S, fe, le):
    got = balanced_partition(times, S, fe, le)
    cost = lambda sp: max(sum(times[sum(sp[:k]):sum(sp[:k + 1])]) + (fe if k == 0 else 0)  # noqa: E731
                          + (le if k == S - 1 else 0) for k in range(S))
    assert sum(got) == len(times) and cost(got) == pytest.approx(_brute(times, S, fe, le)[0])


def test_lm_head_moves_layers_off_the_last_stage():
    assert balanced_partition([1] * 12, 4, 0.0, 2.0) == (3, 3, 4, 2) or balanced_partition([1] * 12, 4, 0, 2)[-1] == 2


def test_memory_limit_binds():
    times = [1] * 8
    mem = [[4] * 8, [3] * 8, [2] * 8, [1] * 8]  # early stages hold more in flight (1F1B)
    got = balanced_partition(times, 4, 0, 0, mem, None, 8.0)
    assert all(sum(mem[k][:1]) * got[k] <= 8.0 for k in range(4))
    assert got == _brute(times, 4, 0, 0, mem, 8.0)[1] or max(got) == _brute(times, 4, 0, 0, mem, 8.0)[0]
    # nothing fits: the fastest split regardless of memory
    assert balanced_partition(times, 4, 0, 0, mem, None, 1.0) == (2, 2, 2, 2)


def test_scenario_keys_and_result():
    sc = scenario(pp=4, m=8, layers=10, schedule="1F1B")
    assert sc.layers_per_stage == (3, 3, 2, 2)
    big_vocab = {"vocab_size": 200000}
    from helpers import TINY_GPT
    model = {**TINY_GPT, **big_vocab, "n_layers": 16}
    bal = scenario(pp=4, m=8, model=model, parallel={}, layers=16)
    from dataclasses import replace

    from parsim.costs.partition import balanced_layers
    split = balanced_layers(bal)
    assert sum(split) == 16 and split[-1] <= split[0]  # the large LM head takes layers off the last stage
    explicit = _with_schedule(pp=4, m=8, model=model, extra={"layers_per_stage": [5, 4, 4, 3]})
    mx = simulate(explicit).to_json()
    assert mx["layers_per_stage"] == [5, 4, 4, 3] and mx["partition"] == "explicit"
    assert [s["layers"] for s in mx["stages"]] == [5, 4, 4, 3]
    balanced = _with_schedule(pp=4, m=8, model=model, extra={"partition": "balanced"})
    assert simulate(balanced).to_json()["partition"] == "balanced"
    with pytest.raises(ConfigError, match="layers_per_stage"):
        _with_schedule(pp=4, m=8, model=model, extra={"layers_per_stage": [5, 4, 4]})
    with pytest.raises(ConfigError, match="partition"):
        _with_schedule(pp=4, m=8, model=model, extra={"partition": "magic"})


def _with_schedule(pp, m, model, extra):
    from parsim.scenario import scenario_from_dict
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": pp, "model": model,
           "training": {"global_batch": m, "seq_len": 512}, "parallel": {"pp": pp},
           "schedule": {"name": "1F1B", "n_microbatches": m, **extra}}
    return scenario_from_dict(doc, "t.toml")
