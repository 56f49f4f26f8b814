"""Sweeps: results appended as they finish; a killed sweep resumes without recomputing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from parsim.plan.sweep import Progress, load_done, run_sweep


def test_results_are_appended_and_reused(tmp_path):
    f = tmp_path / "r.jsonl"
    calls = []

    def job(p):
        calls.append(p["x"])
        return {"value": p["x"] ** 2}

    jobs = [(f"k{i}", {"x": i}) for i in range(5)]
    out = run_sweep(jobs, job, results=f, workers=1, progress=False)
    assert {k: r["value"] for k, r in out.items()} == {f"k{i}": i * i for i in range(5)}
    assert len(f.read_text().splitlines()) == 5
    calls.clear()
    out = run_sweep(jobs + [("k5", {"x": 5})], job, results=f, workers=1, progress=False)
    assert calls == [5] and out["k5"]["value"] == 25 and len(out) == 6


def test_partial_last_line_is_ignored_and_recomputed(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"key": "a", "value": 1}) + "\n" + '{"key": "b", "val')
    assert set(load_done(f)) == {"a"}
    out = run_sweep([("a", {"x": 9}), ("b", {"x": 2})], lambda p: {"value": p["x"]}, results=f, workers=1,
                    progress=False)
    assert out["a"]["value"] == 1 and out["b"]["value"] == 2
    assert set(load_done(f)) == {"a", "b"}


def test_killed_sweep_resumes_without_recomputing(tmp_path):
    f = tmp_path / "r.jsonl"
    n = 12
    code = (
        "from parsim.plan.sweep import run_sweep, demo_job\n"
        f"run_sweep([(f'k{{i}}', {{'x': i, 'sleep_s': 0.3}}) for i in range({n})], demo_job, "
        f"results={str(f)!r}, workers=2, progress=False)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        if f.exists() and len(f.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its worker processes, mid-way
    proc.wait()
    finished = set(load_done(f))
    assert 3 <= len(finished) < n
    recomputed = []

    def job(p):
        recomputed.append(f"k{p['x']}")
        return {"value": p["x"] ** 2}

    out = run_sweep([(f"k{i}", {"x": i}) for i in range(n)], job, results=f, workers=1, progress=False)
    assert set(recomputed) == {f"k{i}" for i in range(n)} - finished
    assert len(out) == n and all(out[f"k{i}"]["value"] == i * i for i in range(n))
    keys = [json.loads(line)["key"] for line in f.read_text().splitlines() if line.strip().endswith("}")]
    assert sorted(keys) == sorted(f"k{i}" for i in range(n))  # each configuration exactly once


def test_plan_results_file_resumes(tmp_path, capsys):
    from parsim.cli.main import main
    f = tmp_path / "plan.jsonl"
    argv = ["plan", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16", "--global-batch", "32",
            "--seq-len", "4096", "--top", "3", "--confirm", "4", "--workers", "1", "--max-cp", "1",
            "--results", str(f), "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    lines = f.read_text().splitlines()
    assert len(lines) == 4
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert f.read_text().splitlines() == lines  # nothing recomputed or re-appended


def test_process_pool_gives_the_same_records(tmp_path):
    from parsim.plan.sweep import demo_job
    jobs = [(f"k{i}", {"x": i}) for i in range(6)]
    out = run_sweep(jobs, demo_job, results=tmp_path / "r.jsonl", workers=2, progress=False)
    assert {k: r["value"] for k, r in out.items()} == {f"k{i}": i * i for i in range(6)}


def test_dask_executor_with_a_stand_in_client(tmp_path, monkeypatch):
    """The dask path submits every job and appends results as they complete."""
    import types
    from concurrent.futures import Future

    class Client:
        def __init__(self, address=None, **kw):
            self.address = address

        def submit(self, fn, *args, key=None, pure=True):
            fut = Future()
            fut.set_result(fn(*args))
            return fut

        def close(self):
            pass

    dist = types.ModuleType("dask.distributed")
    dist.Client, dist.as_completed = Client, lambda futs: iter(futs)
    monkeypatch.setitem(sys.modules, "dask", types.ModuleType("dask"))
    monkeypatch.setitem(sys.modules, "dask.distributed", dist)
    from parsim.plan.sweep import demo_job
    out = run_sweep([("a", {"x": 3}), ("b", {"x": 4})], demo_job, results=tmp_path / "r.jsonl",
                    executor="dask", scheduler="tcp://127.0.0.1:8786", progress=False)
    assert out["a"]["value"] == 9 and out["b"]["value"] == 16
    assert set(load_done(tmp_path / "r.jsonl")) == {"a", "b"}


def test_progress_bar_draws_only_when_enabled(capsys):
    p = Progress(4, "x", enabled=True)
    p.update()
    p.close()
    assert "1/4" in capsys.readouterr().err
    q = Progress(4, "x", enabled=False)
    q.update()
    q.close()
    assert capsys.readouterr().err == ""
