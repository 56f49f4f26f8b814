"""A wheel (what `pip install parsim` installs) carries everything parsim reads at run time,
and `parsim --version` names the version the package metadata carries."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import parsim
from parsim.cli.main import main

ROOT = Path(__file__).resolve().parent.parent


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"parsim {parsim.__version__}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(out), str(ROOT)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot build a wheel here: {p.stderr.strip().splitlines()[-1:]}")
    return next(out.glob("parsim-*.whl"))


def test_wheel_carries_every_bundled_profile(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    profiles = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "parsim/cluster/profiles").rglob("*.toml"))
    assert profiles, "no bundled profiles found"
    assert [p for p in profiles if p not in names] == []
    assert f"parsim-{parsim.__version__}.dist-info/METADATA" in names


def test_wheel_runs_the_quickstart_from_another_directory(wheel, tmp_path):
    """Unpacked into an empty folder (no repository beside it), the CLI simulates the
    quickstart scenario: the profile it names comes from the package data."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "parsim", "simulate", str(ROOT / "scenarios/gpt3-175b-1f1b.toml"),
                        "--json"], capture_output=True, text=True, cwd=run_dir, env=env)
    assert p.returncode == 0, p.stderr
    assert '"step_time_s"' in p.stdout
    assert list(run_dir.iterdir()) == []  # nothing written where it ran
