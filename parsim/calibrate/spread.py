"""What calibration keeps of the spread it measured (``parsim.cluster.spread`` reads it back).

* :func:`pass_spread`: from a case-by-pass table of timings, each case's run-to-run noise with
  the pass-wide speed taken out, and the spread of that pass-wide speed (the device's drift);
* :func:`spread_table`: from the calibration rows (measured seconds, the fitted prediction and,
  when the bench recorded them, each row's ``repeat_sigma`` and ``speed_sigma``), the
  ``spread_<family>_<kind>`` keys of the profile's ``[calibration]`` table;
* :func:`model_discrepancy`: from end-to-end validation records (``parsim validate`` on this
  machine: predicted step against the measured steps), ``spread_model``.

The repeat-noise and residual figures are robust lognormal sigmas: 1.4826 x the median absolute
log deviation (the standard deviation for a normal, not moved by a few outliers). The model
discrepancy is not: it is what has to widen a band that states 90% until it holds 90% of the
runs, and the model's step errors are not normal (most cases within a few percent, a few biased
by 15-20%), so it is the split-conformal quantile of the records' absolute errors (Vovk et al.
2005; Lei et al. 2018, "Distribution-free predictive inference for regression") expressed as the
lognormal sigma whose 90% range has that half-width.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

MAD_TO_SIGMA = 1.4826
BAND_COVERAGE = 0.90
"""The coverage the stated band claims (P5..P95)."""
Z_BAND = 1.6448536269514722
"""The standard normal's 95th percentile: a lognormal factor exp(sigma z) lies within
exp(+-Z_BAND sigma) with probability BAND_COVERAGE."""
FAMILY_OF_KIND = {"gemm": "compute", "attention": "compute", "memory": "memory", "update": "memory",
                  "optimizer": "memory", "launch": "memory", "collective": "collective", "p2p": "p2p"}


def robust_sigma(log_dev) -> float:
    """1.4826 x median |x|: the deviations are about zero (predicted vs measured), not about their median."""
    x = np.abs(np.asarray(log_dev, float))
    x = x[np.isfinite(x)]
    return float(MAD_TO_SIGMA * np.median(x)) if len(x) else 0.0


def pass_spread(times) -> tuple[list[float], float]:
    """``times[case][pass]`` seconds -> (per case: sigma of its timings once each pass's common
    speed is taken out, sigma of the pass speeds)."""
    lt = np.log(np.asarray(times, float))
    if lt.ndim != 2 or lt.shape[1] < 2:
        return [0.0] * len(lt), 0.0
    dev = lt - np.median(lt, axis=1, keepdims=True)
    speed = np.median(dev, axis=0)  # one factor per pass: the whole machine faster or slower
    rest = dev - speed[None, :]
    return [robust_sigma(r) for r in rest], robust_sigma(speed - np.median(speed))


def spread_table(pred: pd.DataFrame) -> dict[str, float]:
    """``spread_*`` keys from calibration rows with ``kind``, ``seconds``, ``predicted_s`` (and
    optional ``repeat_sigma``, ``speed_sigma``)."""
    out: dict[str, float] = {}
    fam = pred["kind"].map(FAMILY_OF_KIND)
    for family in ("compute", "memory", "collective", "p2p"):
        rows = pred[fam == family]
        if not len(rows):
            continue
        out[f"spread_{family}_residual"] = round(robust_sigma(np.log(rows["predicted_s"] / rows["seconds"])), 4)
        if "repeat_sigma" in rows and rows["repeat_sigma"].notna().any():
            out[f"spread_{family}_repeat"] = round(float(rows["repeat_sigma"].dropna().median()), 4)
    if "speed_sigma" in pred and pred["speed_sigma"].notna().any():
        out["spread_speed"] = round(float(pred["speed_sigma"].dropna().median()), 4)
    return out


def step_error(predicted_s: float, measured_s) -> float:
    """log(median measured step / predicted step) of one validation record (+: the run was slower)."""
    return float(np.log(np.median(np.asarray(measured_s, float)) / predicted_s))


def model_discrepancy(errors, coverage: float = BAND_COVERAGE) -> float:
    """``spread_model`` from the validation records' step errors (:func:`step_error`, one per
    record): the split-conformal quantile of their absolute values -- the ceil((n + 1) coverage)-th
    smallest of the n, the largest when that rank passes n (fewer than 9 records at 90%) --
    divided by :data:`Z_BAND`, so that a new case exchangeable with the records falls within the
    drawn factor's 90% range at least 90% of the time. About zero, not about their mean: a bias
    the records share is part of the model's error and widens the band; the point prediction is
    not moved."""
    e = np.sort(np.abs(np.asarray(errors, float)))
    e = e[np.isfinite(e)]
    if not len(e):
        return 0.0
    rank = min(len(e), int(np.ceil((len(e) + 1) * coverage)))
    return round(float(e[rank - 1]) / Z_BAND, 4)
