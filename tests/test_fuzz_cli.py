"""Seeded random combinations of scenario overrides through the command line, in process.

Every combination either runs (exit 0) or is refused in one line on stderr with exit 2 --
never an internal error, a traceback or a deadlock. The pools mix values a user might set
with ones that are wrong on their own or only together (a tensor-parallel degree that does not
divide the heads, ZeRO-3 with a straggler in full mode, Muon on a GPU without bf16, ...).
A --set fuzz of this kind, at 10^5 cases, found defects that now have tests of their own (a
full-mode deadlock under ZeRO-2/3 with a straggler in tests/test_stragglers.py, Muon on V100 in
tests/test_dp_scale.py); this fixed sample of a few hundred guards the property itself.
"""
import contextlib
import io
import random

import pytest

from parsim.cli.main import main

STRUCTURE = {
    "parallel.tp": [1, 2, 3, 4, 8], "parallel.pp": [1, 2, 3, 4], "parallel.dp": [1, 2, 3], "parallel.cp": [1, 2, 4],
    "parallel.ep": [1, 2, 4], "parallel.vpp": [1, 2, 3], "parallel.zero": [0, 1, 2, 3],
    "parallel.sequence_parallel": ["true", "false"], "parallel.framework": ['"megatron"', '"zero"', '"fsdp"'],
    "training.microbatch_size": [1, 2, 3], "training.global_batch": [1, 7, 8, 64], "training.seq_len": [1, 7, 128, 4096],
    "training.recompute": ['"none"', '"full"', '"selective"', '"op"'], "training.optimizer": ['"adam"', '"muon"', '"sgd"'],
    "training.precision": ['"bf16"', '"fp8"', '"fp16"', '"fp32"'], "training.flash_attention": ["true", "false"],
    "schedule.name": ['"GPipe"', '"1F1B"', '"Interleaved1F1B"', '"ZBH2"', '"ZBV"', '"DualPipe"', '"DualPipeV"', '"Chimera"',
                      '"PipeDream"', '"PipeDream2BW"', '"TeraPipe"', '"AMPNet"', '"GPipeRemat"', '"Naive"'],
    "schedule.token_slices": [1, 2, 4, '"auto"'], "overlap.grad_reduce": ["true", "false"], "overlap.p2p": ["true", "false"],
    "moe.routing": ['"balanced"', '"zipf"'], "moe.drop_tokens": ["true", "false"],
    "stragglers.gpus": ["[[1, 1.5]]", "[[0, 0.5]]"], "simulation.mode": ['"fast"', '"full"'],
    "hardware": ['"cpu-gloo"', '"dgx-h100"', '"dgx2-v100"', '"gb200-nvl72"'], "gpus": [2, 4, 8],
}
SCENARIOS = ("scenarios/tiny-cpu.toml", "scenarios/tiny-moe-cpu.toml", "scenarios/tiny-llama-cpu.toml")
CASES = 400


def _run(argv: list[str]) -> tuple[int, list[str]]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's usage errors
            rc = e.code
    return rc, err.getvalue().strip().splitlines()


def _combos(seed: int, n: int):
    rnd = random.Random(seed)
    keys = sorted(STRUCTURE)
    for _ in range(n):
        picks = rnd.sample(keys, rnd.randint(2, 5))
        yield rnd.choice(SCENARIOS), [f"{k}={rnd.choice(STRUCTURE[k])}" for k in picks]


@pytest.mark.parametrize("chunk", range(4))
def test_random_overrides_run_or_are_refused_in_one_line(chunk):
    bad = []
    for i, (scenario, sets) in enumerate(_combos(2026, CASES)):
        if i % 4 != chunk:
            continue
        rc, lines = _run(["simulate", scenario, *[x for s in sets for x in ("--set", s)], "--json"])
        if rc not in (0, 2) or (rc == 2 and len(lines) != 1):
            bad.append((scenario, sets, rc, lines[:2]))
    assert not bad, bad[:5]


def test_the_sample_reaches_both_outcomes():
    """The pools are not all refusals (nor all accepted): a fuzz that only exercises the loader
    would say nothing about the simulators."""
    rcs = [_run(["simulate", sc, *[x for s in sets for x in ("--set", s)], "--json"])[0]
           for sc, sets in _combos(7, 40)]
    assert 0 in rcs and 2 in rcs
