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
from parsim.validate.scale import early_recv, prepare


def predict_run(scenario: str, overrides: list[str], backend: str, recv: str | None, profile: str):
    """(scenario, lowered schedule, metrics) of a validation run of ``scenario`` as today's model
    predicts it: prepared for ``backend`` with ``profile``, its receives posted as ``recv`` says."""
    sc = prepare(scenario, overrides, backend, profile)
    sched = schedule_for(sc, early_recv=early_recv({"backend": backend, "recv": recv}))
    return sc, sched, simulate(sc, schedule=sched).metrics


def repredict(rec: Record, profile: Path | None = None):
    """:func:`predict_run` of the record's run, or None when the record does not name its
    scenario or that file (or its profile) is gone."""
    scn = located(rec.scenario_file, rec.path) if rec.scenario_file else None
    prof = profile or located(rec.profile, rec.path)
    if scn is None or prof is None:
        return None
    return predict_run(str(scn), list(rec.overrides), rec.backend, rec.recv, str(prof))


def predicted_step(rec: Record, profile: Path | None = None) -> float | None:
    """The step :func:`repredict` predicts, seconds (None as it says)."""
    again = repredict(rec, profile)
    return None if again is None else again[2]["step_time_s"]
