"""The command line: outputs, and bad input as one line + exit 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "parsim", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_simulate_json_and_outputs(tmp_path):
    sc = ROOT / "scenarios" / "tiny-cpu.toml"
    trace, tl, png = tmp_path / "t.json", tmp_path / "t.csv", tmp_path / "g.png"
    r = run("simulate", sc, "--json", "--trace", trace, "--timeline", tl, "--plot", png)
    assert r.returncode == 0, r.stderr
    mx = json.loads(r.stdout)
    assert mx["world_size"] == 2 and len(mx["stages"]) == 2
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}
    header = tl.read_text().splitlines()[0].split(",")
    assert header[:8] == ["rank", "stream", "op", "stage", "microbatch", "start_s", "end_s", "bytes"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_set_override_changes_the_run():
    sc = ROOT / "scenarios" / "measured-costs-zb.toml"
    a = json.loads(run("simulate", sc, "--json").stdout)
    b = json.loads(run("simulate", sc, "--json", "--set", "schedule.n_microbatches=64").stdout)
    assert a["n_microbatches"] == 24 and b["n_microbatches"] == 64
    assert b["bubble_fraction"] < a["bubble_fraction"]


def test_out_dir_writes_report(tmp_path):
    r = run("simulate", ROOT / "scenarios" / "tiny-cpu.toml", "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    for f in ("report.md", "result.json", "timeline.csv", "trace.json", "gantt.png"):
        assert (tmp_path / "rep" / f).stat().st_size > 0, f
    assert not list((tmp_path / "rep").glob(".*tmp"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_bundled_scenario_simulates(path):
    r = run("simulate", path, "--json")
    assert r.returncode == 0, r.stderr
    mx = json.loads(r.stdout)
    assert mx["step_time_s"] > 0 and 0 <= mx["bubble_fraction"] < 1


def test_schedule_grid_and_csv():
    r = run("schedule", "1F1B", "--pp", "4", "--microbatches", "8")
    assert r.returncode == 0, r.stderr
    assert "0F0" in r.stdout
    r = run("schedule", "GPipe", "--pp", "2", "--microbatches", "3", "--csv")
    rows = r.stdout.strip().splitlines()
    assert len(rows) == 2 and rows[0].split(",")[0] == "0F0"


def _bad(tmp_path, text: str, *extra):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    return run("simulate", p, *extra)


BASE = """
hardware = "dgx-a100-80g"
gpus = 16
[model]
preset = "gpt3-175b"
[training]
global_batch = 64
seq_len = 2048
[parallel]
tp = 8
pp = 2
[schedule]
name = "1F1B"
"""


@pytest.mark.parametrize("edit,key", [
    (lambda t: t.replace("[training]", "[training]\nbatchsize = 3"), "training.batchsize"),
    (lambda t: t.replace('"dgx-a100-80g"', '"dgx-z900"'), "hardware"),
    (lambda t: t.replace("tp = 8", "tp = 7").replace("gpus = 16", "gpus = 14"), "parallel.tp"),
    (lambda t: t.replace("gpus = 16", "gpus = 12"), "gpus"),
    (lambda t: t.replace('name = "1F1B"', 'name = "Interleaved1F1B"').replace("pp = 2", "pp = 2\nvpp = 5"), "parallel.vpp"),
    (lambda t: t.replace('name = "1F1B"', 'name = "Zigzag"'), "schedule.name"),
    (lambda t: t.replace("global_batch = 64", "global_batch = -1"), "training.global_batch"),
    (lambda t: t.replace('preset = "gpt3-175b"', 'preset = "gpt5"'), "model.preset"),
    (lambda t: t.replace("seq_len = 2048", 'seq_len = "long"'), "training.seq_len"),
    (lambda t: t.replace("pp = 2", 'pp = 2\nzero = 1\ndp_comm = "parameter_server"'), "parallel.dp_comm"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, edit, key):
    r = _bad(tmp_path, edit(BASE))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "bad.toml" in lines[0] and key in lines[0], lines[0]


def test_missing_scenario_file(tmp_path):
    r = run("simulate", tmp_path / "nope.toml")
    assert r.returncode == 2 and "nope.toml" in r.stderr and "Traceback" not in r.stderr


def test_bad_profile_number(tmp_path):
    prof = (ROOT / "parsim" / "cluster" / "profiles" / "dgx-a100-80g.toml").read_text()
    bad = "\n".join(l for l in prof.splitlines() if not l.startswith("memory_tbyte_per_s"))
    (tmp_path / "myhw.toml").write_text(bad)
    r = _bad(tmp_path, BASE.replace('"dgx-a100-80g"', f'"{tmp_path / "myhw.toml"}"'))
    assert r.returncode == 2 and "memory_tbyte_per_s" in r.stderr and "myhw.toml" in r.stderr


LLAMA405 = """
hardware = "dgx-h100"
gpus = 256
[model]
preset = "llama3-405b"
[training]
global_batch = 32
seq_len = 8192
recompute = "full"
[parallel]
tp = 8
pp = 16
vpp = 2
[schedule]
name = "Interleaved1F1B"
"""


def test_uneven_stages_and_inferred_dp_from_the_command_line(tmp_path):
    # 126 layers over pp 16 x vpp 2 = 32 chunks: refused evenly, with what would work said
    r = _bad(tmp_path, LLAMA405)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "parallel.vpp" in lines[0]
    assert "first_stage_layers = 3, last_stage_layers = 3" in lines[0]
    r = _bad(tmp_path, LLAMA405, "--json", "--set", "schedule.first_stage_layers=3",
             "--set", "schedule.last_stage_layers=3")
    assert r.returncode == 0, r.stderr
    mx = json.loads(r.stdout)
    assert mx["layers_per_stage"] == [3] + [4] * 30 + [3]  # (126 - 6) / 30 = 4
    assert mx["parallel"]["dp"] == 2 and mx["world_size"] == 256  # 256 / (tp 8 * pp 16)
    r = _bad(tmp_path, LLAMA405, "--set", "schedule.first_stage_layers=2", "--set", "schedule.last_stage_layers=2")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1
    assert "schedule.first_stage_layers" in lines[0] and "e.g. 3 and 3" in lines[0]


def test_inferred_dp_that_does_not_divide_is_one_line(tmp_path):
    r = _bad(tmp_path, LLAMA405, "--set", "parallel.pp=3", "--set", "parallel.vpp=1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
    assert "bad.toml: parallel.dp:" in lines[0] and "= 24" in lines[0]
    r = _bad(tmp_path, LLAMA405, "--json", "--set", "parallel.dp=2", "--set", "schedule.account_for_embedding=true",
             "--set", "schedule.account_for_loss=true")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["layers_per_stage"] == [3] + [4] * 30 + [3]  # (126 + 2) / 32 = 4, ends one fewer
