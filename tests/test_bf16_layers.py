"""Blocks kept in BF16 under an FP8 / NVFP4 recipe (``training.bf16_first_layers`` /
``bf16_last_layers``; Megatron's ``--first-last-layers-bf16 --num-layers-at-start-in-bf16 N
--num-layers-at-end-in-bf16 M``).

Oracles: a job whose every block is kept BF16 is the BF16 job (same step, same memory); the step
is linear in the number of blocks kept; the blocks kept are the model's first and last, so only
the pipeline stages holding them change; Megatron's own refusals (delayed scaling) and defaults
(one block at each end).
"""
from __future__ import annotations

import pytest

from parsim.costs.inputs import cost_inputs
from parsim.costs.model_costs import ModelCosts
from parsim.errors import ConfigError
from parsim.frameworks import import_megatron
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate


def _doc(precision: str = "fp8", pp: int = 1, gpus: int = 1, **training) -> dict:
    t = {"global_batch": 4, "seq_len": 4096, "precision": precision, **training}
    if precision == "fp8":
        t.setdefault("fp8_recipe", "nvfp4")
    return {"name": "b", "hardware": "gb200-nvl72", "gpus": gpus, "model": {"preset": "llama3-8b"},
            "training": t, "parallel": {"dp": gpus // pp, "pp": pp, "zero": 1, "framework": "megatron"}}


def _run(**kw) -> dict:
    return simulate(scenario_from_dict(_doc(**kw), "b.toml")).metrics


def test_every_block_kept_bf16_is_the_bf16_job():
    kept, bf16 = _run(bf16_first_layers=32), _run(precision="bf16")
    assert kept["step_time_s"] == pytest.approx(bf16["step_time_s"], rel=1e-12)
    assert kept["peak_memory_bytes"] == pytest.approx(bf16["peak_memory_bytes"], rel=1e-12)


def test_the_step_is_linear_in_the_blocks_kept():
    s = [_run(bf16_last_layers=k)["step_time_s"] for k in (0, 1, 3)]
    assert s[0] < s[1] < s[2]
    assert s[2] - s[0] == pytest.approx(3 * (s[1] - s[0]), rel=1e-9)
    # first or last: the same blocks of a uniform model
    assert _run(bf16_first_layers=3)["step_time_s"] == pytest.approx(s[2], rel=1e-12)
    assert _run(bf16_first_layers=3)["bf16_layers"] == {"first": 3, "last": 0}  # the result says so


def test_only_the_stages_holding_the_kept_blocks_change():
    base = ModelCosts(cost_inputs(scenario_from_dict(_doc(pp=2, gpus=2), "b.toml")))
    kept = ModelCosts(cost_inputs(scenario_from_dict(_doc(pp=2, gpus=2, bf16_last_layers=4), "b.toml")))
    from parsim.schedule.ir import Op
    f = lambda mc, s: mc.stage_costs[s].parts[Op.F].total
    assert f(kept, 0) == f(base, 0) and f(kept, 1) > f(base, 1)


def test_low_precision_weight_copies_only_for_the_other_blocks():
    def copies(**kw) -> float:
        mc = ModelCosts(cost_inputs(scenario_from_dict(_doc(**kw), "b.toml")))
        st = mc.model_states([0], 0)
        return dict(st["buffers"]).get("fp8_weights", 0.0)
    full = copies()
    assert copies(bf16_first_layers=8) == pytest.approx(full * (1 - 8 / 32), rel=1e-12)
    assert copies(bf16_first_layers=32) == 0.0


@pytest.mark.parametrize("training, words", [
    ({"precision": "bf16", "bf16_first_layers": 1}, 'only under precision = "fp8"'),
    ({"bf16_last_layers": -1}, "must be >= 0"),
    ({"bf16_first_layers": 20, "bf16_last_layers": 13}, "exceeds the model's 32 blocks"),
    ({"fp8_recipe": "delayed", "bf16_first_layers": 1}, "delayed scaling does not support"),
])
def test_refusals(training, words):
    doc = _doc(**{k: v for k, v in training.items() if k == "precision"})
    doc["training"].update({k: v for k, v in training.items() if k != "precision"})
    with pytest.raises(ConfigError, match="training.bf16_") as e:
        scenario_from_dict(doc, "b.toml")
    assert words in str(e.value)


SMALL = ["--num-layers", "24", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
         "--vocab-size", "32000", "--bf16"]


@pytest.mark.parametrize("flags, first, last", [
    (["--fp4-format", "e2m1", "--first-last-layers-bf16"], 1, 1),  # TransformerConfig's defaults
    (["--fp4-format", "e2m1", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "0",
      "--num-layers-at-end-in-bf16", "4"], 0, 4),
    (["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8", "--first-last-layers-bf16"], 1, 1),
])
def test_megatron_flags(flags, first, last):
    t = import_megatron(SMALL + flags, hardware="gb200-nvl72").doc["training"]
    assert (t.get("bf16_first_layers", 0), t.get("bf16_last_layers", 0)) == (first, last)


def test_megatron_flags_without_low_precision_are_listed_as_ignored():
    imp = import_megatron(SMALL + ["--first-last-layers-bf16", "--num-layers-at-end-in-bf16", "3"])
    listed = " ".join(imp.not_modelled)
    assert "--first-last-layers-bf16 (ignored" in listed and "--num-layers-at-end-in-bf16 3 (ignored" in listed
    assert "bf16_last_layers" not in imp.doc["training"]
