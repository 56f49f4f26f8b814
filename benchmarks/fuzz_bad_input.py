"""Mutation fuzzing of parsim's inputs: does every bad input end in one line and exit 2?

    python benchmarks/fuzz_bad_input.py [--seconds 300] [--seed 0] [--target scenario|command|profile|hf|all]

Each kind of input mutated at random from the bundled ones and run in-process through
``parsim.cli.main.main`` (what the ``parsim`` command runs):

* ``scenario``: ``parsim simulate`` on a bundled small scenario with 1-3 ``--set KEY=VALUE`` of
  the scenario's own keys and the common ``[parallel]``/``[training]``/``[model]`` ones, the
  values drawn from wrong types, zero, negatives, huge and tiny numbers, NaN and names;
* ``profile``: a GPU profile with 1-2 keys dropped, retyped or joined by an unknown key, run
  by ``simulate`` (``--set hardware=PATH``), ``kernel gemm``, ``kernel attention`` and
  ``collective``;
* ``hf``: a bundled Hugging Face ``config.json`` (tests/data/hf) with 1-3 keys dropped or
  retyped (nested ``text_config`` included), or cut short, run by ``parsim plan --model``.

A run is fine when it exits 0 (a result; ``plan`` also 1: nothing fits), or 2 with exactly one
line on stderr. Anything else -- exit 70 (parsim's own defect), an exception escaping ``main``,
a traceback, a multi-line error -- is printed once per distinct message with the mutation
that caused it. Exit status: 1 when any was found. Not a test (random, time-bounded); the
inputs that break a rule become cases in tests/test_bad_input.py.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import random
import re
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.cli.main import main

SCENARIOS = ("scenarios/tiny-cpu.toml", "scenarios/tiny-moe-cpu.toml", "scenarios/tiny-llama-cpu.toml")
PROFILES = ("parsim/cluster/profiles/dgx-h100.toml", "parsim/cluster/profiles/gb200-nvl72.toml",
            "parsim/cluster/profiles/dgx-a100-80g.toml")
COMMON_KEYS = ("gpus", "hardware", "parallel.tp", "parallel.pp", "parallel.dp", "parallel.cp", "parallel.ep",
               "parallel.vpp", "parallel.zero", "parallel.sequence_parallel", "parallel.framework",
               "training.microbatch_size", "training.global_batch", "training.seq_len", "training.precision",
               "training.recompute", "training.fp8_recipe", "training.attention_kernel", "training.optimizer",
               "schedule.name", "schedule.partition", "schedule.layers_per_stage", "model.preset",
               "model.n_layers", "model.d_model", "model.n_heads", "model.n_kv_heads", "model.vocab_size",
               "model.n_experts", "model.top_k", "overlap.p2p", "stragglers.gpu_sigma", "offload.activations",
               "simulation.mode")
TOML_VALUES = ("0", "-1", "1", "2", "3", "7", "1e30", "1e-30", '"abc"', '""', "true", "false", "[]", "{}", "[1,2]",
               "nan", "inf", "0.5", "-0.5", "1.5", "1024", "65536", "9999999999999", '"1F1B"', '"ZBV"',
               '"DualPipe"', '"Chimera"', '"AMPNet"', '"TeraPipe"', '"full"', '"selective"', '"fp8"', '"fp16"',
               '"dgx-h100"', '"dgx2-v100"', '"llama3-8b"', '"mixtral-8x7b"', '"gpt-oss-20b"', '"balanced"',
               '"cpu"', '"mxfp8"', '"cudnn"', '"fa4"', '["128x128/3sm"]', '["0x128"]')
JSON_VALUES = (0, -1, 1, 2, 7, 1e30, 1e-30, "abc", "", True, False, [], {}, [1, 2], None, 0.5, -0.5, 4096,
               9999999999999, "llama", "gpt_oss", "deepseek_v3", ["sliding_attention"], ["X"], math.nan, math.inf)


def run(argv: list[str], accept: tuple[int, ...] = (0, 2)) -> str | None:
    """None when ``main(argv)`` behaves, else what went wrong (one line)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
        except BaseException as e:  # noqa: BLE001 -- escaping main is exactly what is hunted here
            return f"escaped {type(e).__name__}: {e}"
    msg = err.getvalue().strip()
    if rc not in accept:
        return f"exit {rc}: {msg.splitlines()[0] if msg else '(no message)'}"
    if rc == 2 and (len(msg.splitlines()) != 1 or "Traceback" in msg):
        return f"exit 2 with {len(msg.splitlines())} lines: {msg[:200]}"
    return None


def scenario_case(rng: random.Random, tmp: Path) -> tuple[list[str], object, tuple[int, ...]]:
    path = rng.choice(SCENARIOS)
    doc = tomllib.loads((ROOT / path).read_text())
    keys = [k for k in _toml_leaves(doc)] + list(COMMON_KEYS)
    sets = [f"{rng.choice(keys)}={rng.choice(TOML_VALUES)}" for _ in range(rng.choice((1, 1, 2, 3)))]
    return ["simulate", str(ROOT / path), *[a for s in sets for a in ("--set", s)]], sets, (0, 2)


OTHER_COMMANDS = (("infer", "scenarios/inference/bloom-176b-a100-inference.toml", ()),
                  ("infer", "scenarios/inference/opt-30b-zero-inference-v100.toml", ()),
                  ("fl", "scenarios/fl-mobile.toml", ()),
                  ("goodput", "scenarios/llama3-405b-16k-faults.toml", ("--train-tokens", "15e12")))
"""(command, bundled scenario, fixed arguments) of the commands beside ``simulate`` that read a scenario."""


def command_case(rng: random.Random, tmp: Path) -> tuple[list[str], object, tuple[int, ...]]:
    cmd, path, fixed = rng.choice(OTHER_COMMANDS)
    doc = tomllib.loads((ROOT / path).read_text())
    keys = list(_toml_leaves(doc))
    sets = [f"{rng.choice(keys)}={rng.choice(TOML_VALUES)}" for _ in range(rng.choice((1, 1, 2)))]
    return [cmd, str(ROOT / path), *fixed, *[a for s in sets for a in ("--set", s)]], sets, (0, 2)


def profile_case(rng: random.Random, tmp: Path) -> tuple[list[str], object, tuple[int, ...]]:
    lines = (ROOT / rng.choice(PROFILES)).read_text().splitlines()
    keyed = [i for i, line in enumerate(lines) if re.match(r"^[a-z_0-9]+\s*=", line)]
    changed = []
    for _ in range(rng.choice((1, 1, 2))):
        i = rng.choice(keyed)
        key = lines[i].split("=")[0].strip()
        r = rng.random()
        lines[i] = "" if r < 0.15 else lines[i] + "\nbogus_key = 1" if r < 0.2 else f"{key} = {rng.choice(TOML_VALUES)}"
        changed.append(lines[i])
    p = tmp / "profile.toml"
    p.write_text("\n".join(lines))
    argv = rng.choice((["simulate", str(ROOT / "scenarios/tiny-cpu.toml"), "--set", f'hardware="{p}"'],
                       ["kernel", "gemm", "4096", "4096", "4096", "--hardware", str(p)],
                       ["kernel", "attention", "--seq", "4096", "--heads", "32", "--head-dim", "128", "--causal",
                        "--hardware", str(p)],
                       ["collective", "all_reduce", "--size", "1G", "--gpus", "16", "--hardware", str(p)]))
    return argv, changed, (0, 2)


def hf_case(rng: random.Random, tmp: Path) -> tuple[list[str], object, tuple[int, ...]]:
    files = sorted((ROOT / "tests/data/hf").glob("*/config.json"))
    doc = json.loads(rng.choice(files).read_text())
    changed: list = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        path = rng.choice(list(_json_leaves(doc)))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        if rng.random() < 0.2:
            parent.pop(path[-1], None)
            changed.append(("drop", path))
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(JSON_VALUES))
            changed.append((path, parent[path[-1]]))
    text = json.dumps(doc)
    if rng.random() < 0.05:
        text = text[: rng.randrange(len(text))]
        changed.append("cut short")
    p = tmp / "config.json"
    p.write_text(text)
    argv = ["plan", "--model", str(p), "--hardware", "dgx-h100", "--gpus", "8", "--global-batch", "8",
            "--seq-len", "1024", "--top", "1", "--schedules", "1F1B", "--confirm", "1"]
    return argv, changed, (0, 1, 2)


def _toml_leaves(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _toml_leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def _json_leaves(d: dict, prefix: tuple = ()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _json_leaves(v, prefix + (k,))
        yield prefix + (k,)


CASES = {"scenario": scenario_case, "command": command_case, "profile": profile_case, "hf": hf_case}


def main_fuzz() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="time budget (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", choices=(*CASES, "all"), default="all")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    targets = list(CASES) if a.target == "all" else [a.target]
    found: dict[str, object] = {}
    runs = 0
    with tempfile.TemporaryDirectory() as tmp:
        end = time.monotonic() + a.seconds
        while time.monotonic() < end:
            argv, mutation, accept = CASES[rng.choice(targets)](rng, Path(tmp))
            problem = run(argv, accept)
            runs += 1
            if problem is not None:
                key = re.sub(r"\d+", "N", problem)[:120]
                if key not in found:
                    found[key] = mutation
                    print(f"{problem}\n    {argv[0]} {mutation}", flush=True)
    print(f"{runs} runs ({', '.join(targets)}), {len(found)} distinct problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main_fuzz())
