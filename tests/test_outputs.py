"""Output files: the umask's mode, ``-`` for stdout, symlinks and FIFOs written through,
unwritable or occupied paths refused in one line (exit 2) with nothing left behind."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from parsim.cli.common import atomic_write, write_text
from parsim.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "scenarios" / "tiny-cpu.toml"


def run(*args, umask: int = 0o022, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "parsim", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, preexec_fn=lambda: os.umask(umask))


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def leftovers(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp")]


@pytest.mark.parametrize("umask,want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_every_output_honours_the_umask(tmp_path, umask, want):
    files = {"--trace": tmp_path / "t.json", "--timeline": tmp_path / "t.csv",
             "--memory-timeline": tmp_path / "m.csv", "--plot": tmp_path / "g.png"}
    args = [x for k, v in files.items() for x in (k, v)]
    r = run("simulate", TINY, *args, "--out", tmp_path / "rep", umask=umask)
    assert r.returncode == 0, r.stderr
    written = list(files.values()) + [p for p in (tmp_path / "rep").iterdir()]
    assert len(written) == 4 + 6
    for p in written:
        assert mode(p) == want, (p.name, oct(mode(p)))
    assert not leftovers(tmp_path) and not leftovers(tmp_path / "rep")


def test_overwriting_keeps_the_files_mode(tmp_path):
    f = tmp_path / "t.json"
    f.write_text("old")
    f.chmod(0o640)
    write_text(f, "new")
    assert f.read_text() == "new" and mode(f) == 0o640


def test_dash_writes_to_stdout(tmp_path):
    r = run("simulate", TINY, "--timeline", "-")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith("rank,stream,op,stage")
    assert "step time" in r.stderr  # the summary moved out of the stream's way
    assert not (ROOT / "-").exists()
    r = run("simulate", TINY, "--trace", "-", "--timeline", "-")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_symlink_is_written_through_not_replaced(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    r = run("simulate", TINY, "--trace", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["traceEvents"]


def test_fifo_is_written_through(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    r = run("simulate", TINY, "--timeline", fifo)
    reader.join(timeout=60)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, not a regular file
    assert got and got[0].startswith(b"rank,stream,op")


def test_dev_null_is_written_through():
    if not os.access("/dev/null", os.W_OK):
        pytest.skip("no writable /dev/null")
    r = run("simulate", TINY, "--trace", "/dev/null")
    assert r.returncode == 0, r.stderr
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("case", ["directory", "no_permission", "parent_is_a_file", "out_is_a_file"])
def test_unwritable_or_occupied_paths_are_one_line(tmp_path, case):
    if case == "no_permission" and os.geteuid() == 0:
        ro = None  # root writes anywhere: a read-only bind is not available; use a path under /proc instead
        target = "/proc/parsim-cannot-write/t.json"
    elif case == "no_permission":
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "t.json"
    elif case == "directory":
        target = tmp_path
    elif case == "parent_is_a_file":
        (tmp_path / "f").write_text("x")
        target = tmp_path / "f" / "t.json"
    else:
        (tmp_path / "f").write_text("x")
        r = run("simulate", TINY, "--out", tmp_path / "f")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "Traceback" not in r.stderr and str(tmp_path / "f") in r.stderr
        return
    r = run("simulate", TINY, "--trace", target)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and str(target) in err[0] and "cannot write" in err[0], r.stderr
    assert not leftovers(tmp_path)
    if not (case == "no_permission" and os.geteuid() == 0):  # (root: /proc passes the check, fails the write)
        assert r.stdout == "", r.stdout[:200]  # refused before the simulation: no summary printed


@pytest.mark.parametrize("command", [
    ["simulate", TINY, "--timeline"], ["simulate", TINY, "--memory-timeline"], ["simulate", TINY, "--plot"],
    ["infer", "scenarios/inference/bloom-176b-a100-inference.toml", "--trace"],
    ["fl", "scenarios/fl-mobile.toml", "--rounds-csv"],
])
def test_an_output_below_a_file_is_refused_before_any_work(tmp_path, command):
    (tmp_path / "f").write_text("x")
    target = tmp_path / "f" / "out"
    r = run(*command, target)
    assert r.returncode == 2 and r.stdout == "", (r.stdout[:200], r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and f"{target}: cannot write: {tmp_path / 'f'} is not a directory" in err[0], r.stderr


def test_a_failing_writer_leaves_nothing(tmp_path):
    f = tmp_path / "x.csv"

    def bad(tmp):
        Path(tmp).write_text("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(ConfigError, match="No space left"):
        atomic_write(f, bad)
    assert not f.exists() and not leftovers(tmp_path)
    f.write_text("kept")
    with pytest.raises(ConfigError):
        atomic_write(f, bad)
    assert f.read_text() == "kept"  # the old file survives a failed rewrite


def test_plan_and_compare_outputs_are_0644(tmp_path):
    r = run("compare", TINY, "--set", "schedule.name=ZBH1", "--out", tmp_path / "cmp")
    assert r.returncode == 0, r.stderr
    files = list((tmp_path / "cmp").iterdir())
    assert files and all(mode(p) == 0o644 for p in files)
