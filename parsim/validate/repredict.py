"""A validation record predicted again with today's model, the way ``parsim validate`` predicted
it: the scenario it names prepared for its backend with its profile
(``parsim.validate.scale.prepare``) and the schedule its ranks ran (receives posted as they
were). Torch-free: ``parsim calibrate --validations`` and ``benchmarks/band_coverage.py`` use it
without the validation extra.
"""
from __future__ import annotations

from pathlib import Path

from parsim.calibrate.records import Record, located
from parsim.simulate import schedule_for, simulate
from parsim.validate.scale import prepare


def repredict(rec: Record, profile: Path | None = None):
    """(scenario, lowered schedule, metrics) of the record's run as today's model predicts it, or
    None when the record does not name its scenario or that file (or its profile) is gone."""
    scn = located(rec.scenario_file, rec.path) if rec.scenario_file else None
    prof = profile or located(rec.profile, rec.path)
    if scn is None or prof is None:
        return None
    sc = prepare(str(scn), list(rec.overrides), rec.backend, str(prof))
    early = (rec.recv or ("early" if rec.backend == "gloo" else "late")) == "early"
    sched = schedule_for(sc, early_recv=early)
    return sc, sched, simulate(sc, schedule=sched).metrics


def predicted_step(rec: Record, profile: Path | None = None) -> float | None:
    """The step :func:`repredict` predicts, seconds (None as it says)."""
    again = repredict(rec, profile)
    return None if again is None else again[2]["step_time_s"]
