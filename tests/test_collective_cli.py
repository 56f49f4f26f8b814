"""`parsim collective`: one collective's predicted time in nccl-tests' terms, against the
published NVLS all-reduce figure and nccl-tests' bus-bandwidth factors; sizes as nccl-tests
reads them; bad input as one line, exit 2."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import published

from parsim.cli.collective import parse_size, predict, sizes
from parsim.cluster.collectives import KINDS
from parsim.cluster.hardware import load_profile

ROOT = Path(__file__).resolve().parent.parent

# nccl-tests' names in published.json (doc/PERFORMANCE.md) for parsim's kinds
PUBLISHED_NAME = {"all_reduce": "AllReduce", "reduce_scatter": "ReduceScatter", "all_gather": "AllGather",
                  "all_to_all": "AlltoAll", "broadcast": "Broadcast", "reduce": "Reduce"}
# the kinds PERFORMANCE.md leaves out, with the factor nccl-tests' sources apply (src/gather.cu and
# src/scatter.cu: (nranks-1)/nranks; src/sendrecv.cu: 1)
OTHER_FACTOR = {"gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n, "p2p": lambda n: 1.0}


def run(*args):
    return subprocess.run([sys.executable, "-m", "parsim", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def published_factor(kind: str, n: int) -> float:
    """The factor as published (e.g. "2(n-1)/n"), evaluated for n ranks."""
    if kind in OTHER_FACTOR:
        return OTHER_FACTOR[kind](n)
    f = published("nccl-busbw-factors")["expected"]["busbw_factor"][PUBLISHED_NAME[kind]]
    if isinstance(f, (int, float)):
        return float(f)
    num, den = re.fullmatch(r"(\d*)\(n-1\)/n", f).group(1), n
    return (int(num) if num else 1) * (n - 1) / den


def test_nvls_all_reduce_matches_the_published_h100_figure():
    r = run("collective", "all_reduce", "--size", "1G", "--gpus", "8", "--hardware", "dgx-h100", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"time_s", "algbw_gbyte_per_s", "busbw_gbyte_per_s", "algorithm"}
    ref = published("nccl-h100-nvls-allreduce-8gpu")["expected"]
    assert out["algorithm"] == "nvls"
    assert out["busbw_gbyte_per_s"] == pytest.approx(ref["peak_busbw_GBps"], rel=0.10)
    assert out["algbw_gbyte_per_s"] == pytest.approx(ref["peak_algbw_GBps"], rel=0.10)
    assert out["algbw_gbyte_per_s"] == pytest.approx(2 ** 30 / out["time_s"] / 1e9, rel=1e-12)


def test_published_factor_examples():
    ex = published("nccl-busbw-factors")["expected"]["examples"]
    assert published_factor("all_reduce", 8) == ex["allreduce_n8_factor"]
    assert published_factor("all_reduce", 64) == pytest.approx(ex["allreduce_n64_factor"], abs=1e-4)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hardware, gpus", [("dgx-h100", 8), ("dgx-a100-80g", 64), ("dgx-h100", 4)])
def test_busbw_is_algbw_times_the_nccl_tests_factor(kind, hardware, gpus):
    if kind == "p2p":
        gpus = 2
    hw = load_profile(hardware)
    for size in (8, 2 ** 20, 2 ** 30):
        r = predict(hw, kind, size, gpus)
        assert r["busbw_gbyte_per_s"] / r["algbw_gbyte_per_s"] == pytest.approx(published_factor(kind, gpus),
                                                                                  rel=1e-12)


def test_all_gather_inside_a_node_is_the_ring_closed_form():
    # (n-1)/n * S/B + (n-1) * a on NVLink (parsim.cluster.collectives docstring; NCCL's ring);
    # A100's NVSwitch has no NVLink SHARP, so the ring is what NCCL runs there (the formulas: the
    # shipped profile prices it by its nccl-tests lines, tests/test_nccl_lines.py)
    import dataclasses
    hw = dataclasses.replace(load_profile("dgx-a100-80g"), collective_fits=())
    n, s = 8, 2 ** 28
    r = predict(hw, "all_gather", s, n)
    nv = hw.nvlink
    assert r["algorithm"] == "ring"
    assert r["time_s"] == pytest.approx((n - 1) / n * s / nv.effective_bandwidth + (n - 1) * nv.latency_s, rel=1e-12)


def test_all_gather_inside_an_h100_node_is_a_ring():
    # NVLS gains the all-reduce only (the switch reduces); an all-gather still moves (n-1)/n of the
    # buffer through each port: the formulas pick the ring, (n-1)/n S / B + (n-1) a on a profile
    # without measured lines; the shipped dgx-h100 prices it by its nccl-tests line (NCCL 2.29 on
    # 8 H100, benchmarks/fit_nccl_intranode.py), at 512 MiB -- a size the fit left out -- within 10%
    # of the measured 1.4015 ms (335 GB/s bus bandwidth)
    import dataclasses
    hw = load_profile("dgx-h100")
    n, s = 8, 2 ** 29
    bare = dataclasses.replace(hw, collective_fits=())
    r = predict(bare, "all_gather", s, n)
    assert r["algorithm"] == "ring"
    nv = hw.nvlink
    assert r["time_s"] == pytest.approx((n - 1) / n * s / nv.effective_bandwidth + (n - 1) * nv.latency_s, rel=1e-12)
    m = predict(hw, "all_gather", s, n)
    assert m["algorithm"] == "ring"
    assert m["time_s"] == pytest.approx(1.4015e-3, rel=0.10)
    assert m["time_s"] != pytest.approx(r["time_s"], rel=0.02)  # the measured line, not the formula


def test_sizes_read_as_nccl_tests_reads_them():
    assert [parse_size(x) for x in ("8", "8K", "256M", "1G", "1g", "2KB")] == [8, 8192, 2 ** 28, 2 ** 30, 2 ** 30, 2048]
    assert sizes("8:1G", 2) == [2 ** k for k in range(3, 31)]  # nccl-tests -b 8 -e 1G -f 2: 28 sizes
    assert sizes("1K:8K", 4) == [1024, 4096]


def test_range_prints_one_row_per_size():
    r = run("collective", "reduce_scatter", "--size", "1M:16M", "--gpus", "16", "--hardware", "dgx-h100")
    assert r.returncode == 0, r.stderr
    header = [ln for ln in r.stdout.splitlines() if ln.startswith("#")]
    rows = [ln.split() for ln in r.stdout.splitlines() if not ln.startswith("#")]
    for col in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw"):
        assert col in header[1], col
    assert [int(x[0]) for x in rows] == [2 ** 20, 2 ** 21, 2 ** 22, 2 ** 23, 2 ** 24]
    assert all(int(x[1]) == int(x[0]) // 4 and x[2] == "float" and x[3] == "sum" for x in rows)
    assert float(rows[-1][7]) / float(rows[-1][6]) == pytest.approx(15 / 16, rel=2e-3)  # printed to 2 decimals
    js = json.loads(run("collective", "reduce_scatter", "--size", "1M:16M", "--gpus", "16", "--hardware",
                        "dgx-h100", "--json").stdout)
    assert [x["size_bytes"] for x in js] == [int(x[0]) for x in rows]


@pytest.mark.parametrize("args, line", [
    (["all_reduce", "--size", "1X", "--gpus", "8", "--hardware", "dgx-h100"], "--size: cannot read size '1X'"),
    (["all_reduce", "--size", "1G:8", "--gpus", "8", "--hardware", "dgx-h100"], "--size: range '1G:8' ends below"),
    (["all_reduce", "--size", "1G", "--gpus", "1", "--hardware", "dgx-h100"], "--gpus: a collective needs at least 2"),
    (["p2p", "--size", "1G", "--gpus", "8", "--hardware", "dgx-h100"], "--gpus: p2p is one send/receive"),
    (["all_reduce", "--size", "8:1G", "--factor", "1", "--gpus", "8", "--hardware", "dgx-h100"], "--factor: must be"),
    (["all_reduce", "--size", "1G", "--gpus", "8", "--hardware", "no-such-box"], "no-such-box"),
])
def test_bad_input_is_one_line(args, line):
    r = run("collective", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and line in r.stderr, r.stderr


def test_simulate_json_names_each_axis_collective_and_its_algorithm():
    """``collective_algorithms``: per axis the collective it runs, at its size, and the algorithm
    the tuner model picks -- the same answer `parsim collective` gives for that kind, size and
    group (TP = one node's 8 GPUs, global ranks 0..7)."""
    import json as _json
    out = subprocess.run([sys.executable, "-m", "parsim", "simulate", "scenarios/llama3-70b-h100.toml", "--json"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    algos = _json.loads(out)["collective_algorithms"]
    tp = algos["tp"]
    assert tp["kind"] == "reduce_scatter" and tp["ranks"] == 8  # sequence parallel on, tp 8
    assert tp["bytes"] == 8192 * 8192 * 2  # one microbatch's activation, bf16
    cli = _json.loads(subprocess.run(
        [sys.executable, "-m", "parsim", "collective", "reduce_scatter", "--size", str(int(tp["bytes"])),
         "--gpus", "8", "--hardware", "dgx-h100", "--json"], cwd=ROOT, capture_output=True, text=True,
        check=True).stdout)
    assert tp["algorithm"] == cli["algorithm"] == "ring"
    assert tp["time_s"] == pytest.approx(cli["time_s"], rel=1e-9)
    assert set(algos) == {"tp", "dp"}  # cp = ep = 1: no entry
