"""parsim compare: the report's files, figures and the headless-Chromium render."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from parsim.cli.main import main

CHROMIUM = "/usr/bin/chromium"
BASE = "scenarios/gpt3-175b-1f1b.toml"
SMALL = ["--set", "training.global_batch=128"]  # m = 8 per replica: a quick report


def _imgs(html: str) -> list[str]:
    return re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)


@pytest.fixture(scope="module")
def sweep_report(tmp_path_factory):
    import os
    out = tmp_path_factory.mktemp("cmp") / "pp"
    root = Path(__file__).resolve().parent.parent
    cwd = os.getcwd()
    os.chdir(root)
    try:
        rc = main(["compare", BASE, *SMALL, "--sweep", "parallel.pp=4,8", "--out", str(out)])
    finally:
        os.chdir(cwd)
    assert rc == 0
    return out


def test_sweep_report_has_every_figure(sweep_report):
    html = (sweep_report / "report.html").read_text()
    titles = [t for t, _ in _imgs(html)]
    assert "Where the step time goes" in titles
    assert "Peak memory per pipeline rank against device capacity" in titles
    assert "Scaling with parallel.pp" in titles
    assert sum(t.startswith("Pipeline schedule:") for t in titles) == 2
    assert "src=\"http" not in html and "<script" not in html  # self-contained
    md = (sweep_report / "report.md").read_text()
    for f in ("breakdown.png", "memory.png", "scaling.png", "gantt-0.png", "gantt-1.png"):
        assert f"]({f})" in md and (sweep_report / f).stat().st_size > 5000
    assert "pp=4 (dp=32)" in md and "pp=8 (dp=16)" in md  # gpus kept: dp recomputed


def test_figures_have_titles_axis_units_and_legends():
    """Built directly so the matplotlib objects can be inspected."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import parsim.report.compare as report
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate
    root = Path(__file__).resolve().parent.parent
    items = [(f"pp={pp}", simulate(load_scenario(root / BASE, ["training.global_batch=128", f"parallel.pp={pp}",
                                                             f"parallel.dp={1024 // (8 * pp)}"])))
             for pp in (4, 8)]
    seen = []
    orig = plt.close

    def keep(fig=None):
        seen.append(fig)
    plt.close = keep
    try:
        report.build_figures(items, ("parallel.pp", [4, 8]))
    finally:
        plt.close = orig
    assert len(seen) == 5
    for fig in seen:
        axes = [ax for ax in fig.axes if ax.get_xlabel() or ax.get_ylabel()]
        title = fig._suptitle.get_text() if fig._suptitle else " ".join(ax.get_title() for ax in fig.axes)
        assert title.strip()
        assert any(ax.get_xlabel() for ax in axes) and any(ax.get_ylabel() for ax in axes)
        # quantities carry units "(s)", "(GiB)", ...; categorical axes (rank, scenario) do not need one
        assert any(re.search(r"\((s|GiB|tokens/s per GPU)\)", ax.get_xlabel() + ax.get_ylabel()) for ax in axes)
        assert fig.legends or any(ax.get_legend() for ax in fig.axes)
        orig(fig)


def test_variants_and_files(tmp_path, root, monkeypatch):
    monkeypatch.chdir(root)
    out = tmp_path / "v"
    rc = main(["compare", BASE, *SMALL, "--variant", "1F1B:schedule.name=1F1B",
               "--variant", "ZB-H1:schedule.name=ZBH1", "--out", str(out)])
    assert rc == 0
    md = (out / "report.md").read_text()
    assert re.search(r"^\| 1F1B +\|", md, re.M) and re.search(r"^\| ZB-H1 +\|", md, re.M)
    assert not (out / "scaling.png").exists()


def test_sweep_with_a_baseline_file(root, monkeypatch, tmp_path):
    """--baseline FILE is simulated and listed first, outside the sweep: the scaling chart plots
    the swept scenarios only, as % of it (three results against two swept values was an internal
    error: 'x and y must have same first dimension')."""
    monkeypatch.chdir(root)
    out = tmp_path / "b"
    tiny = "scenarios/tiny-cpu.toml"
    rc = main(["compare", tiny, "--sweep", "training.microbatch_size=1,2", "--baseline", tiny, "--out", str(out)])
    assert rc == 0
    assert (out / "scaling.png").stat().st_size > 5000
    rows = [ln for ln in (out / "report.md").read_text().splitlines() if ln.startswith("| ") and "baseline" in ln]
    assert rows and "microbatch_size" not in rows[0].split("|")[1]  # the file, not a swept point


def test_bad_compare_input_is_one_line(capsys, root, monkeypatch, tmp_path):
    monkeypatch.chdir(root)
    rc = main(["compare", BASE, BASE, "--sweep", "parallel.pp=2,4", "--out", str(tmp_path / "x")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "BASE" in err[0]


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="chromium not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(sweep_report, tmp_path):
    shot = tmp_path / "shot.png"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1300,6000",
           f"--screenshot={shot}", (sweep_report / "report.html").resolve().as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10000
    import matplotlib.image as mpimg
    img = mpimg.imread(shot)
    assert img.std() > 0.05  # not blank
    # the page's images decoded and drawn: the rendered page holds many non-white pixels
    nonwhite = (img[..., :3].mean(axis=2) < 0.9).mean()
    assert nonwhite > 0.02
    html = (sweep_report / "report.html").read_text()
    import base64
    for title, data in _imgs(html):
        assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n", title
