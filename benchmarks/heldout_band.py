"""The model discrepancy of the GPU profiles, from the held-out published runs: what
``parsim simulate --samples`` draws as ``spread_model`` on a GPU profile.

    python benchmarks/heldout_band.py [--markdown reports/heldout-band.md]

Every compared row of ``benchmarks/fidelity_heldout.py`` (the calibration rows, the public
set's H100 weak scaling, left out) gives one step error, log(measured step / predicted step)
= log(predicted / published throughput). By GPU generation (each profile's rows pooled with
its siblings': one die, one kernel stack) and by what the job trains (a dense model, or a
mixture of experts: ``spread_model`` and ``spread_model_moe``, the MoE runs miss by more), the
rows sorted by id are split in two: the even
positions fit ``spread_model`` exactly as ``parsim calibrate --validations`` fits it from
validation records (``parsim.calibrate.spread.model_discrepancy``: the split-conformal 90%
quantile of |error| over 1.645), the odd positions are held out and the script reports how
many of them the fitted 90% range covers. The profiles state the fitted value in their
``[calibration]`` table (``spread_model``, ``spread_model_moe``); this script prints it so that a rerun can be
compared with what the profiles say. It moves no point prediction: the band widens.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import fidelity_heldout as fh

from parsim.calibrate.spread import Z_BAND, model_discrepancy
from parsim.cluster.hardware import load_profile

GENERATIONS = {
    "ampere": ("dgx-a100-80g", "dgx-a100-40g"),
    "hopper": ("dgx-h100", "dgx-h200", "dgx-h800", "grand-teton-h100"),
    "blackwell": ("dgx-b200", "hgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72"),
}
"""Profiles whose rows are pooled: one die and one kernel stack per generation."""


def step_error(row: dict) -> float:
    """log(measured step / predicted step) of a compared row (its error is predicted over
    published throughput, less 1)."""
    return math.log1p(row["error"])


def split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(fit, held out): the rows sorted by id, even positions and odd positions."""
    rows = sorted(rows, key=lambda r: r["id"])
    return rows[0::2], rows[1::2]


def covered(rows: list[dict], sigma: float) -> int:
    """Rows whose step error lies inside the 90% range of a lognormal factor of ``sigma``."""
    return sum(1 for r in rows if abs(step_error(r)) <= Z_BAND * sigma)


KINDS = {"dense": "spread_model", "moe": "spread_model_moe"}
"""The two discrepancies a profile states: jobs training a dense model, and a mixture of experts."""


def is_moe(result: dict) -> bool:
    """Whether a compared row trains a mixture-of-experts model (its scenario's model)."""
    from parsim.scenario import scenario_from_dict
    return scenario_from_dict(result["scenario"], result["id"]).model.is_moe


def bands(results: list[dict]) -> dict[tuple[str, str], dict]:
    """Per (generation, dense or moe): the fitted discrepancy, the rows it rests on and how many
    of the held-out half (and of the fit half) its 90% range covers."""
    done = [r for r in results if r.get("status") == "compared" and not r["calibration"]]
    kind_of = {r["id"]: "moe" if is_moe(r) else "dense" for r in done}  # one scenario parse per row
    out = {}
    for gen, profiles in GENERATIONS.items():
        for kind in KINDS:
            rows = [r for r in done if r["scenario"]["hardware"] in profiles and kind_of[r["id"]] == kind]
            if len(rows) < 2:
                continue
            fit, held = split(rows)
            sigma = model_discrepancy([step_error(r) for r in fit])
            out[gen, kind] = {"profiles": profiles, "rows": len(rows), "fit": len(fit), "held": len(held),
                              "sigma": sigma, "covered_held": covered(held, sigma),
                              "covered_fit": covered(fit, sigma),
                              "median_abs_error": statistics.median(abs(step_error(r)) for r in rows)}
    return out


def stated(gen: str, kind: str) -> list[tuple[str, float]]:
    """(profile, the discrepancy of ``kind`` its [calibration] table states) for a generation's profiles."""
    from parsim.cluster.spread import spread_of
    field = "model_moe" if kind == "moe" else "model"
    return [(p, getattr(spread_of(load_profile(p)), field)) for p in GENERATIONS[gen]]


def report(b: dict[tuple[str, str], dict]) -> str:
    head = ("| generation | model | profiles | rows (fit / held out) | fitted sigma (key) | 90% range | "
            "held-out rows inside | fit rows inside | median abs log error | stated by the profiles |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for (gen, kind), v in b.items():
        q = Z_BAND * v["sigma"]
        st = ", ".join(f"{p} {s:.4f}" for p, s in stated(gen, kind))
        lines.append(f"| {gen} | {kind} | {', '.join(v['profiles'])} | {v['rows']} ({v['fit']} / {v['held']}) | "
                     f"{v['sigma']:.4f} (`{KINDS[kind]}`) | x{math.exp(-q):.2f} .. x{math.exp(q):.2f} | "
                     f"{v['covered_held']} of {v['held']} ({100 * v['covered_held'] / max(1, v['held']):.0f}%) | "
                     f"{v['covered_fit']} of {v['fit']} | {v['median_abs_error']:.3f} | {st} |")
    return head + "\n".join(lines)


PROFILE_DIR = ROOT / "parsim" / "cluster" / "profiles"


def write_profiles(b: dict[tuple[str, str], dict], directory: Path = PROFILE_DIR) -> None:
    """Put each generation's fitted discrepancy in its profiles' ``[calibration]`` key, with the
    counts its source comment states (the rows it rests on, the held-out rows inside its range)."""
    import re
    for (gen, kind), v in b.items():
        key = KINDS[kind]
        for name in v["profiles"]:
            path = directory / f"{name}.toml"
            pat = re.compile(rf"^{key} = [\d.]+(  # source: .*?)on \d+ held-out rows of (.*?); \d+ of the other \d+ inside",
                             re.M)
            text, n = pat.subn(lambda m: f"{key} = {v['sigma']:.4f}{m.group(1)}on {v['fit']} held-out rows of "
                                         f"{m.group(2)}; {v['covered_held']} of the other {v['held']} inside",
                               path.read_text())
            if n != 1:
                raise SystemExit(f"{path}: no {key} line with the generated source comment to update")
            path.write_text(text)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", help="write the table to this Markdown file")
    ap.add_argument("--write", action="store_true", help="write the fitted values into the profiles")
    args = ap.parse_args(argv)
    results, _ = fh.run_all()
    b = bands(results)
    if args.write:
        write_profiles(b)
    text = report(b)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(
            "# Model discrepancy of the GPU profiles, from the held-out published runs\n\n"
            "Generated by `python benchmarks/heldout_band.py --markdown reports/heldout-band.md`. "
            "Step error = log(predicted / published throughput) of each compared row of "
            "`benchmarks/fidelity_heldout.py` (the calibration rows left out); per GPU generation the "
            "rows sorted by id are split into even (fit) and odd (held out) positions, dense and MoE "
            "jobs apart; `spread_model` (dense) and `spread_model_moe` are fitted on the fit half as `parsim calibrate --validations` fits it (the split-conformal "
            "90% quantile of |error| over 1.645) and checked on the held-out half. `parsim simulate "
            "--samples N` draws it once per sample on every duration: the band widens, the point "
            "prediction does not move.\n\n" + text + "\n")


if __name__ == "__main__":
    main()
