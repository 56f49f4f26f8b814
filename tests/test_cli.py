"""The command line: outputs, and bad input as one line + exit 2."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = sorted(p for p in (ROOT / "scenarios").glob("*.toml") if not p.name.startswith("fl-"))  # fl-*: parsim fl


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


# ---------------------------------------------------------------- help, the summary's words and numbers

COMMANDS = ("simulate", "schedule", "plan", "compare", "validate", "calibrate", "kernel", "import", "collective")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_has_an_example_and_shows_defaults(command, capsys):
    from parsim.cli.main import main
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert re.search(r"examples?:\s+parsim " + command, out)
    if command in ("simulate", "plan", "schedule", "compare"):
        assert "default" in out or command == "simulate"


def test_schedule_help_lists_every_schedule(capsys):
    from parsim.cli.main import main
    from parsim.schedule import BUILDERS
    with pytest.raises(SystemExit) as e:
        main(["schedule", "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in BUILDERS:
        assert name in out


def test_summary_header_batch_and_two_unambiguous_fractions():
    r = run("simulate", ROOT / "scenarios" / "gpt3-175b-1f1b.toml")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "gpt3-175b-1f1b: gpt3-175b on 1,024 GPUs (128 nodes of dgx-a100-80g)"
    assert "1,536 sequences x 2,048 tokens = 3.15M tokens per step" in r.stdout  # 1536 * 2048 = 3,145,728
    assert sum("bubble_fraction" in ln for ln in lines) == 1 and sum("idle_fraction" in ln for ln in lines) == 1


def test_bubble_is_the_pipelines_and_idle_adds_exposed_dp():
    """Per rank: idle = (T - busy)/T; bubble = idle - exposed dp; both by hand from the JSON."""
    r = run("simulate", ROOT / "scenarios" / "gpt3-175b-1f1b.toml", "--json")
    mx = json.loads(r.stdout)
    T = mx["step_time_s"]
    for s in mx["stages"]:
        assert s["idle_fraction"] == pytest.approx((T - s["busy_s"]) / T, rel=1e-12)
        assert s["bubble_fraction"] == pytest.approx((T - s["busy_s"] - s["exposed_dp_comm_s"]) / T, rel=1e-9)
    b = mx["breakdown_s"]
    assert mx["bubble_fraction"] == pytest.approx((b["bubble"] + b["pp_comm"]) / T, rel=1e-9)
    assert mx["idle_fraction"] > mx["bubble_fraction"] > 0  # this run exposes dp communication


def test_pp1_has_no_pipeline_bubble_but_idles_on_dp():
    r = run("simulate", ROOT / "scenarios" / "gpt3-175b-1f1b.toml", "--json", "--set", "parallel.pp=1",
            "--set", "parallel.dp=128", "--set", "training.global_batch=1536")
    mx = json.loads(r.stdout)
    assert mx["parallel"]["pp"] == 1
    assert mx["bubble_fraction"] == pytest.approx(0.0, abs=1e-9)
    assert mx["idle_fraction"] > 0


def test_train_tokens_gives_time_gpu_hours_and_cost():
    r = run("simulate", ROOT / "scenarios" / "tiny-cpu.toml", "--json", "--train-tokens", "1e6",
            "--gpu-hour-price", "2.5")
    mx = json.loads(r.stdout)
    steps = -(-1_000_000 // (8 * 128))  # ceil(tokens / tokens per step) = 977
    assert mx["train_steps"] == steps == 977
    assert mx["time_to_train_s"] == pytest.approx(steps * mx["step_time_s"])
    assert mx["gpu_hours"] == pytest.approx(mx["time_to_train_s"] * 2 / 3600)
    assert mx["cost"] == pytest.approx(mx["gpu_hours"] * 2.5)
    r = run("simulate", ROOT / "scenarios" / "tiny-cpu.toml", "--gpu-hour-price", "2.5")
    assert r.returncode == 2 and "--gpu-hour-price" in r.stderr


def test_three_significant_digits():
    from parsim.results.summary import fmt_b, fmt_n, fmt_s, pct, sig3
    assert [sig3(x) for x in (22.634, 0.0012345, 9.996, 999.7, 123456, 0)] == ["22.6", "0.00123", "10.0", "1,000",
                                                                               "123,000", "0"]
    assert fmt_s(22.634) == "22.6 s" and fmt_s(0.8123) == "812 ms" and fmt_s(45.06e-6) == "45.1 us"
    assert fmt_s(3 * 86400) == "3.00 days"
    assert fmt_b(13.04 * 2**30) == "13.0 GiB" and fmt_n(175e9) == "175B" and pct(0.07734) == "7.73%"
