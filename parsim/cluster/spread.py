"""How much a profile's durations vary: the spread ``parsim simulate --samples`` draws from.

Every number is a lognormal sigma (the standard deviation of log(actual / predicted); 0.05
is about +-5%), by family of work: ``compute`` (GEMMs, attention: an op's kernels), ``memory``
(streaming ops, the optimizer step), ``collective`` (TP/CP/EP/DP collectives), ``p2p``
(pipeline sends). Three kinds:

* ``repeat``: run-to-run noise of one timing, drawn afresh for every action of the step;
* ``residual``: how far the calibrated model is from what it was fitted on (the fit's
  residuals), drawn once per sample for each (stage, op, family): the same kernel shape
  gets the same error every microbatch;
* ``speed``: the device's speed drift (one factor per sample for all compute and memory
  work), measured by calibration as the spread of whole timing passes;
* ``model``: the model's discrepancy on whole steps (one factor per sample on every duration):
  how far the point prediction was from the measured median step over the end-to-end
  validation runs recorded on this machine (``parsim calibrate --validations``,
  :func:`parsim.calibrate.spread.model_discrepancy`); a GPU profile states it from the
  held-out published runs (``benchmarks/heldout_band.py``), dense and MoE jobs apart
  (``model_moe``). The kernel fits' residuals cannot show
  what running inside a step adds (threads sharing cores, cold caches, a router's skew); the
  validation runs do. It widens the band only: the point prediction does not move.

A calibrated profile states them in its ``[calibration]`` table as ``spread_<family>_<kind>``
(and ``spread_speed``, ``spread_model``), written by ``parsim calibrate`` (``parsim.calibrate.spread``). What a
profile does not state comes from :data:`DEFAULT_SPREAD`.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

FAMILIES = ("compute", "memory", "collective", "p2p")

DEFAULT_REPEAT = 0.08 / (2 * 1.645)
"""0.0243: P. Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in
Large-Scale, Accelerator-Rich Systems", SC22 (arXiv:2208.11035), measure 8% average performance
variation between GPUs of one SKU running the same kernels; read as a 90% range (+-4%), the
lognormal sigma is 0.08 / (2 x 1.645). No comparable published figure was found for collectives
and point-to-point sends: they get the same default."""

DEFAULT_SOURCE = ("default: repeat sigma 0.0243 per family from Sinha et al. SC22 (8% average variation "
                  "between GPUs of one SKU, read as a 90% range); no fit residuals or speed drift measured")


@dataclass(frozen=True)
class Spread:
    """Lognormal sigmas of a profile's durations (see the module docstring)."""

    compute_repeat: float = DEFAULT_REPEAT
    """Run-to-run noise of an op's compute kernels."""
    memory_repeat: float = DEFAULT_REPEAT
    """Run-to-run noise of streaming (memory-bound) work."""
    collective_repeat: float = DEFAULT_REPEAT
    """Run-to-run noise of one collective."""
    p2p_repeat: float = DEFAULT_REPEAT
    """Run-to-run noise of a point-to-point link (drawn per link and sample: the engine's links are FIFO queues)."""
    compute_residual: float = 0.0
    """Fit residual of the compute kernels (calibrated profiles)."""
    memory_residual: float = 0.0
    """Fit residual of streaming ops."""
    collective_residual: float = 0.0
    """Fit residual of collectives."""
    p2p_residual: float = 0.0
    """Fit residual of the point-to-point link."""
    speed: float = 0.0
    """Device speed drift: one factor per sample on all compute and memory work."""
    model: float = 0.0
    """Model discrepancy: one factor per sample on every duration (validation records' step errors;
    on a GPU profile, the held-out published runs': ``benchmarks/heldout_band.py``)."""
    model_moe: float = 0.0
    """The model discrepancy of jobs training a mixture-of-experts model, where the profile states
    it apart (``spread_model_moe``: the held-out MoE runs miss by more); 0: ``model``."""
    source: str = DEFAULT_SOURCE
    """Where these numbers come from."""

    def sigma(self, family: str, kind: str) -> float:
        return getattr(self, f"{family}_{kind}")


DEFAULT_SPREAD = Spread()


def spread_from_table(cal: dict, where: str) -> Spread:
    """A Spread from ``[calibration]`` keys (``spread_<family>_<kind>``, ``spread_speed``,
    ``spread_model``); keys not given keep their defaults."""
    kw = {}
    for f in fields(Spread):
        key = f"spread_{f.name}"
        if f.name != "source" and isinstance(cal.get(key), (int, float)) and not isinstance(cal.get(key), bool):
            kw[f.name] = max(0.0, float(cal[key]))
    if not kw:
        return DEFAULT_SPREAD
    measured = ", ".join(sorted(kw))
    return replace(Spread(**kw), source=f"{where} [calibration] ({measured}); the rest: {DEFAULT_SOURCE}")


def spread_of(profile) -> Spread:
    """The spread a hardware profile states (its source file's ``[calibration]`` table), else the default."""
    path = getattr(profile, "source_path", "")
    if not path or not Path(path).is_file():
        return DEFAULT_SPREAD
    try:
        cal = tomllib.loads(Path(path).read_text()).get("calibration", {})
    except (OSError, tomllib.TOMLDecodeError):
        return DEFAULT_SPREAD
    return spread_from_table(cal, Path(path).name) if isinstance(cal, dict) else DEFAULT_SPREAD
