"""Fit of physically named quantities: NCCL's per-step latency and link bandwidth inside one
NVLink domain, per collective, group size and message-size range, from nccl-tests.

    python benchmarks/fit_nccl_intranode.py [--markdown reports/fit-nccl-intranode.md] [--write]

Why a fit: the ring formulas of ``parsim.cluster.collectives`` on a datasheet NVLink rate, one
efficiency and NCCL's LL128 hop latency describe the bandwidth NCCL reaches on 512 MiB messages,
not the rest of the curve. NCCL's bandwidth ramps up with the message through its protocols (LL,
LL128, Simple) and channel counts, each call pays a launch and a pipeline fill, and a 2-GPU group
on an NVSwitch reaches less of the port than an 8-GPU one (nccl-tests, NCCL 2.29.2, out of place:
H100 258, 318, 335 GB/s bus bandwidth at 512 MiB for 2, 4, 8 GPUs). Those are properties of the
GPU's NVLink and NCCL, measured by a collective microbenchmark, so they belong in the GPU's profile.

Protocol (the issue's fit rule: physically named quantities fitted on part of the data, the error
on the rest reported):

* data: ``benchmarks/data/nccl_tests_times.csv`` (aiconfigurator's nccl-tests runs on A100 SXM at
  NCCL 2.27.3, H100 SXM, H200 SXM, B200, GB200, B300 and GB300 at NCCL 2.29.2; all-gather,
  all-reduce, reduce-scatter, all-to-all; 2, 4 and 8 GPUs (GB200 and GB300: 2 and 4), 512 B to
  512 MiB in powers of two);
* fitted on the sizes with an even power of two (1 KiB, 4 KiB, ..., 256 MiB), held out: the odd
  ones (512 B, 2 KiB, ..., 512 MiB, which is outside every fitted size);
* the model, per (GPU, collective, group size) and size range (:data:`RANGES`: latency-bound
  calls up to 64 KiB, NCCL's LL / LL128 range up to 4 MiB, the Simple protocol above): the ring
  formula t = hops(n) x alpha + busbw_factor(n) x S / beta, alpha and beta by least squares on
  relative error (``parsim.calibrate.fit.fit_collectives``, as ``parsim calibrate`` fits a machine);
* ``--write`` puts the lines in the profiles of the measured GPU (:data:`PROFILES`) as
  ``[calibration] collective_<kind>_<n>`` keys. A group inside one NVLink domain with no line of
  its own size takes the per-step latency and link bandwidth of the largest measured size below it
  (``parsim.cluster.collectives.fitted_line``).

Printed: per GPU and collective, the median and largest absolute error on the held-out sizes,
before (the ring formulas on the profile's NVLink) and after (the fitted lines).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import re
import statistics
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.calibrate.fit import CollectiveFit, collective_fit_time, fit_collectives  # noqa: E402
from parsim.cluster.collectives import collective_time  # noqa: E402
from parsim.cluster.hardware import load_profile  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "nccl_tests_times.csv"
CUSTOM_DATA = ROOT / "benchmarks" / "data" / "custom_allreduce_times.csv"
CUSTOM_KIND = "custom_all_reduce"
"""The profile key's kind of a serving engine's NVLink all-reduce lines (``collective_custom_all_reduce_<n>``):
vLLM's CustomAllreduce under a CUDA graph, which ``parsim infer``'s ``engine = "fused"`` runs for
tensor-parallel all-reduces up to 8 MiB (``parsim.costs.inference.tp_allreduce_s``)."""
PROFILE_DIR = ROOT / "parsim" / "cluster" / "profiles"
RANGES = (64 * 2 ** 10, 4 * 2 ** 20)
"""Upper ends of the fitted size ranges (bytes): latency-bound calls, NCCL's low-latency
protocols, and the Simple protocol's bandwidth-bound range (open)."""
PROFILES = {"A100 SXM": ("dgx-a100-80g", "dgx-a100-40g"), "H100 SXM": ("dgx-h100", "grand-teton-h100"),
            "H200 SXM": ("dgx-h200",), "B200": ("dgx-b200", "hgx-b200"), "GB200": ("gb200-nvl72",),
            "B300": ("dgx-b300",), "GB300": ("gb300-nvl72",)}
"""The profiles each measured GPU's lines go to: the same GPU on the same NVLink and switch (both
DGX A100s share the NVLink 3 baseboard; Grand Teton carries an HGX H100 8-GPU baseboard; DGX and
HGX B200 are one baseboard). Not H800 (8 NVLink links, not 18: not measured)."""
CUSTOM_SOURCE = ("benchmarks/fit_nccl_intranode.py: vLLM CustomAllreduce under a CUDA graph ({gpu}, aiconfigurator "
                 "custom_allreduce_perf, benchmarks/data/custom_allreduce_times.csv, up to 8 MiB), ring-formula lines "
                 "fitted on the even powers of two; held-out odd sizes: median |error| {med:.1%} (NCCL's line: {before:.1%})")
SOURCE = ("benchmarks/fit_nccl_intranode.py: nccl-tests ({gpu}, aiconfigurator nccl_perf, "
          "benchmarks/data/nccl_tests_times.csv), ring-formula per-step latency and link bandwidth per size "
          "range fitted on the even powers of two; held-out odd sizes: median |error| {med:.1%} (before: {before:.1%})")


def load(path: Path = DATA, kind: str | None = None) -> pd.DataFrame:
    """One measured table as the fit reads it (kind from its ``kind`` column, else ``kind``), each
    row marked ``fit`` (an even power of two) or held out."""
    with open(path) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    df = pd.DataFrame({"gpu": [r["gpu"] for r in rows], "name": [kind or r["kind"] for r in rows],
                       "group": [int(r["gpus"]) for r in rows], "bytes": [float(r["bytes"]) for r in rows],
                       "seconds": [float(r["ms"]) * 1e-3 for r in rows]})
    df["fit"] = [round(math.log2(b)) % 2 == 0 for b in df["bytes"]]
    return df


def fit(df: pd.DataFrame) -> dict[str, tuple[CollectiveFit, ...]]:
    """Per GPU: its fitted lines (on the even sizes)."""
    return {gpu: fit_collectives(g[g["fit"]], RANGES) for gpu, g in df.groupby("gpu")}


def load_custom(path: Path = CUSTOM_DATA) -> pd.DataFrame:
    """vLLM's custom all-reduce rows, as :func:`load` reads nccl-tests' (kind ``all_reduce``)."""
    return load(path, kind="all_reduce")


def custom_errors(df: pd.DataFrame, fits: dict[str, tuple[CollectiveFit, ...]]) -> pd.DataFrame:
    """The held-out custom all-reduce rows: error of the fitted lines, and of NCCL's (what the
    profile priced a serving engine's all-reduce at without them)."""
    out = []
    for gpu, g in df[~df["fit"]].groupby("gpu"):
        hw = load_profile(PROFILES[gpu][0])
        for r in g.itertuples():
            nccl = collective_time(hw, "all_reduce", r.bytes, list(range(r.group)))
            after = collective_fit_time(fits[gpu], "all_reduce", r.bytes, r.group)
            out.append({"gpu": gpu, "kind": CUSTOM_KIND, "group": r.group, "bytes": r.bytes,
                        "before": nccl / r.seconds - 1, "after": after / r.seconds - 1})
    return pd.DataFrame(out)


def errors(df: pd.DataFrame, fits: dict[str, tuple[CollectiveFit, ...]]) -> pd.DataFrame:
    """Every held-out row with the relative error before (ring formulas on the shipped profile
    without fits) and after (the fitted lines)."""
    out = []
    for gpu, g in df[~df["fit"]].groupby("gpu"):
        hw = dataclasses.replace(load_profile(PROFILES[gpu][0]), collective_fits=())
        for r in g.itertuples():
            before = collective_time(hw, r.name, r.bytes, list(range(r.group)))
            after = collective_fit_time(fits[gpu], r.name, r.bytes, r.group)
            out.append({"gpu": gpu, "kind": r.name, "group": r.group, "bytes": r.bytes,
                        "before": before / r.seconds - 1, "after": after / r.seconds - 1})
    return pd.DataFrame(out)


def table(err: pd.DataFrame) -> list[str]:
    lines = ["| GPU | collective | held-out sizes | before: median abs error (largest) | after: median (largest) |",
             "|---|---|---|---|---|"]
    for (gpu, kind), g in err.groupby(["gpu", "kind"]):
        b, a = g["before"].abs(), g["after"].abs()
        lines.append(f"| {gpu} | {kind} | {len(g)} | {b.median():.1%} ({b.max():.0%}) | {a.median():.1%} ({a.max():.0%}) |")
    b, a = err["before"].abs(), err["after"].abs()
    lines.append(f"| all | all | {len(err)} | {b.median():.1%} ({b.max():.0%}) | {a.median():.1%} ({a.max():.0%}) |")
    return lines


def calibration_lines(fits: tuple[CollectiveFit, ...], source: str, kind: str | None = None) -> list[str]:
    """The ``collective_<kind>_<n>`` keys of one GPU's fits (``kind``: the key's kind in place of
    the fit's own), each with its source comment."""
    keys: dict[str, list[list[float]]] = {}
    for f in sorted(fits, key=lambda f: (f.kind, f.group, f.max_bytes)):
        keys.setdefault(f"collective_{kind or f.kind}_{f.group}", []).append(f.as_row())

    def num(x: float) -> str:  # sizes exactly (a range's edge is a size), rates to 6 digits
        return "inf" if math.isinf(x) else str(int(x)) if x == int(x) and abs(x) >= 1 else f"{x:.6g}"
    return [f"{k} = [{', '.join('[' + ', '.join(num(x) for x in row) + ']' for row in rows)}]  # source: {source}"
            for k, rows in keys.items()]


def write_profile(path: Path, lines: list[str]) -> None:
    """Replace the profile's ``collective_*`` keys of ``[calibration]`` with ``lines``."""
    text = path.read_text().splitlines()
    kept = [t for t in text if not re.match(r"collective_\w+_\d+ = ", t)]
    at = kept.index("[calibration]") + 1
    path.write_text("\n".join(kept[:at] + lines + kept[at:]) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", type=Path, help="write the report here")
    ap.add_argument("--write", action="store_true", help="write the fitted lines into the profiles")
    args = ap.parse_args(argv)
    df = load()
    fits = fit(df)
    err = errors(df, fits)
    cdf = load_custom()
    cfits = fit(cdf)
    cerr = custom_errors(cdf, cfits)
    lines = table(err)
    clines = table(cerr)
    print("\n".join(lines) + "\n\n" + "\n".join(clines))
    if args.write:
        for gpu, names in PROFILES.items():
            e, c = err[err["gpu"] == gpu], cerr[cerr["gpu"] == gpu]
            src = SOURCE.format(gpu=gpu, med=statistics.median(e["after"].abs()), before=statistics.median(e["before"].abs()))
            csrc = CUSTOM_SOURCE.format(gpu=gpu, med=statistics.median(c["after"].abs()),
                                        before=statistics.median(c["before"].abs()))
            for name in names:
                write_profile(PROFILE_DIR / f"{name}.toml",
                              calibration_lines(fits[gpu], src) + calibration_lines(cfits[gpu], csrc, CUSTOM_KIND))
    if args.markdown:
        doc = (__doc__ or "").split("\n\n", 2)
        args.markdown.write_text("# NCCL inside one NVLink domain: fitted per-step latency and link bandwidth\n\n"
                                 + doc[2].strip() + "\n\n" + "\n".join(lines) + "\n\n"
                                 "## A serving engine's custom all-reduce (vLLM's CustomAllreduce under a CUDA graph)\n\n"
                                 "Fitted the same way on `benchmarks/data/custom_allreduce_times.csv` (up to its 8 MiB "
                                 "cap); 'before' is what the profile's NCCL all-reduce line charges at that size.\n\n"
                                 + "\n".join(clines) + "\n")


if __name__ == "__main__":
    main()
