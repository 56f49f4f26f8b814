"""Coverage of the 90% band of ``parsim simulate --samples``: how many measured gloo steps fall
inside the P5..P95 the profile's spread predicts.

    python benchmarks/band_coverage.py [--samples 200] [--markdown reports/validation/band-coverage.md]
    python benchmarks/band_coverage.py --live [--launches 2] [--steps 6]

Recorded: every ``reports/validation/**/comparison.json`` (the gloo validation repeats on
record: 12 measured steps per case), each case predicted again from the scenario and overrides
the record names, the way ``parsim validate`` predicted it, with the profile it was predicted with
(``hardware_file``) and that profile's spread as the calibration keeps it (``parsim.calibrate.spread.spread_table`` of the data CSV beside it; repeat
noise and speed drift take the defaults where the calibration did not record them); and again
with the model discrepancy added, its sigma left one out (:func:`recorded`).
``--live``: a fresh ``parsim calibrate`` (which records repeat noise and the pass-wide speed
drift) and ``parsim validate`` launches of tiny-cpu with it, then the same count.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.calibrate.records import MIN_RECORDS, find_records, located  # noqa: E402
from parsim.calibrate.spread import model_discrepancy, spread_table, step_error  # noqa: E402
from parsim.cluster.spread import spread_from_table, spread_of  # noqa: E402
from parsim.uncertainty.band import band  # noqa: E402
from parsim.validate.repredict import predict_run, repredict  # noqa: E402


def record_spread(profile: Path, sc):
    """The spread a record's profile states: from its data CSV when it is a record (repeat noise
    and speed drift take the defaults where the calibration did not record them)."""
    csv = profile.with_suffix(".csv")
    spread = spread_of(sc.hardware)
    if csv.is_file() and "calibrated" not in spread.source:  # a record: its spread from its data
        spread = spread_from_table(spread_table(pd.read_csv(csv)), _shown(profile))
    return spread


def case_band(scn: str, overrides: list[str], profile: Path, samples: int, seed: int, spread=None) -> dict:
    """The band of a gloo validation run of ``scn`` (prepared as ``parsim validate`` runs it)."""
    sc, sched, mx = predict_run(str(ROOT / scn), overrides, "gloo", None, str(profile))
    return band(sc, mx, samples, seed, spread or record_spread(profile, sc), schedule=sched)


def _shown(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def recorded(samples: int, seed: int) -> list[dict]:
    """Every two-rank record's band twice: with the profile's spread as calibrated (``noise``),
    and with the model discrepancy added (``model``), its sigma from the *other* records predicted
    with the same profile (leave one out: a case's own error never widens its own band). Point,
    band and errors are today's model's, each record predicted again the way ``parsim validate``
    predicted it (``parsim.validate.repredict``: the scenario prepared for gloo, the
    schedule its ranks ran) -- what ``parsim calibrate --validations`` folds."""
    picked = []
    for rec in find_records([ROOT / "reports" / "validation"]):
        if rec.oversubscribed:  # ranks taking turns on the cores: reported only elsewhere, not folded
            continue
        profile = located(rec.profile, rec.path)
        again = repredict(rec, profile)
        if again is None:
            raise SystemExit(f"{rec.path}: names no scenario_file to predict it again with")
        sc, sched, mx = again
        picked.append((rec, profile.resolve(), sc, sched, mx, step_error(mx["step_time_s"], rec.measured_s)))
    rows = []
    for rec, profile, sc, sched, mx, err in picked:
        others = [e for r, p, *_, e in picked if p == profile and r is not rec]
        noise = record_spread(profile, sc)
        sigma = model_discrepancy(others) if len(others) >= MIN_RECORDS else 0.0
        measured = list(rec.measured_s)
        row = _row(rec.case, str(rec.path.parent.relative_to(ROOT)), band(sc, mx, samples, seed, noise, sched), measured)
        wide = _row(rec.case, "", band(sc, mx, samples, seed, replace(noise, model=sigma), sched), measured)
        row.update({"model_sigma": sigma, "loo_records": len(others), "error": err,
                    **{f"model_{k}": wide[k] for k in ("p5_s", "p50_s", "p95_s", "inside")}})
        rows.append(row)
    return rows


def _row(case, where, b, measured) -> dict:
    inside = sum(b["step_time_p5_s"] <= x <= b["step_time_p95_s"] for x in measured)
    return {"case": case, "record": where, "p5_s": b["step_time_p5_s"], "p50_s": b["step_time_p50_s"],
            "p95_s": b["step_time_p95_s"], "measured_min_s": min(measured), "measured_max_s": max(measured),
            "inside": inside, "steps": len(measured), "spread": b["spread_source"]}


def live(samples: int, seed: int, launches: int, steps: int, nice: int = 0, passes: int = 0) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="parsim-band-") as tmp:
        subprocess.run([sys.executable, "-m", "parsim", "calibrate", "--backend", "gloo", "--out-dir", tmp,
                        "--nice", str(nice), "--passes", str(passes)], check=True, cwd=ROOT)
        prof = Path(tmp) / "cpu-gloo.toml"
        out = subprocess.run([sys.executable, "-m", "parsim", "validate", "scenarios/tiny-cpu.toml", "--profile",
                              str(prof), "--repeat", str(launches), "--steps", str(steps), "--nice", str(nice),
                              "--json"],
                             check=True, cwd=ROOT, capture_output=True, text=True)
        measured = json.loads(out.stdout)["measured"]["step_time_all_s"]
        b = case_band("scenarios/tiny-cpu.toml", [], prof, samples, seed)
        return [_row("tiny-cpu", "live", b, measured)]


def markdown(rows: list[dict]) -> str:
    inside, total = sum(r["inside"] for r in rows), sum(r["steps"] for r in rows)
    lines = ["# Coverage of the 90% band (`parsim simulate --samples`) on the gloo validation repeats", "",
             "`python benchmarks/band_coverage.py --markdown reports/validation/band-coverage.md`: each recorded case's "
             "band (200 samples, seed 0) from the profile it was predicted with and that profile's spread, against "
             "its 12 measured steps.", ""]
    if rows and "model_inside" in rows[0]:
        wide = sum(r["model_inside"] for r in rows)
        lines += [(f"* **With the model discrepancy** (`spread_model`, leave one out: each case's split-conformal quantile "
                   f"from the other records of its profile (oversubscribed runs set aside), as `parsim calibrate --validations` computes it, "
                   f"each record predicted again as `parsim validate` predicted it): **{wide} of {total} "
                   f"measured steps ({wide / total:.0%}) fall inside the stated 90% band.**"),
                  (f"* Noise only (the profile's kernel repeat noise, fit residuals and speed drift): {inside} of "
                   f"{total} ({inside / total:.0%})."), "",
                  ("The misses left are the cases the model is most biased on (error = log(median measured / point); "
                   "+: the run was slower than predicted): a zero-centred band cannot hold a case whose median "
                   "sits outside it."), "",
                  ("| case | record | error | LOO sigma | noise P5..P95 ms | inside | with model P5..P95 ms | inside | "
                   "measured ms (min..max) |"), "|---|---|---:|---:|---|---:|---|---:|---|"]
        for r in rows:
            lines.append(f"| {r['case']} | {r['record']} | {r['error']:+.3f} | {r['model_sigma']:.3f} "
                         f"({r['loo_records']}) | {r['p5_s'] * 1e3:.1f}..{r['p95_s'] * 1e3:.1f} | "
                         f"{r['inside']}/{r['steps']} | {r['model_p5_s'] * 1e3:.1f}..{r['model_p95_s'] * 1e3:.1f} | "
                         f"{r['model_inside']}/{r['steps']} | "
                         f"{r['measured_min_s'] * 1e3:.1f}..{r['measured_max_s'] * 1e3:.1f} |")
    else:
        lines += [f"**{inside} of {total} measured steps ({inside / total:.0%}) fall inside the stated 90% band.**", "",
                  "| case | record | P5 ms | P50 ms | P95 ms | measured ms (min..max) | inside |",
                  "|---|---|---:|---:|---:|---|---:|"]
        for r in rows:
            lines.append(f"| {r['case']} | {r['record']} | {r['p5_s'] * 1e3:.1f} | {r['p50_s'] * 1e3:.1f} | "
                         f"{r['p95_s'] * 1e3:.1f} | {r['measured_min_s'] * 1e3:.1f}..{r['measured_max_s'] * 1e3:.1f} | "
                         f"{r['inside']}/{r['steps']} |")
    lines += ["", f"Spread of the records: {rows[0]['spread']}" if rows else ""]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--live", action="store_true", help="calibrate and validate tiny-cpu now instead of the records")
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--nice", type=int, default=0, help="niceness increment of the ranks (--live; e.g. -10 as root)")
    ap.add_argument("--passes", type=int, default=0, help="calibration timing passes (--live; 0: calibrate's default)")
    ap.add_argument("--markdown", metavar="FILE")
    args = ap.parse_args(argv)
    rows = live(args.samples, args.seed, args.launches, args.steps, args.nice, args.passes) if args.live else recorded(args.samples, args.seed)
    text = markdown(rows)
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
