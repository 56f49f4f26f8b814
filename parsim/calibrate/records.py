"""Validation records folded into a profile's spread: ``parsim calibrate --validations``.

A record is the ``comparison.json`` that ``parsim validate --out DIR`` writes: the profile it
was predicted with (``hardware_file``), the predicted step (``predicted.step_time_s``), every
measured step (``measured.step_time_all_s``) and what was validated (``scenario_file``,
``overrides``, ``backend``, ``recv``). The records predicted with one profile give that
profile's model discrepancy (:func:`parsim.calibrate.spread.model_discrepancy`), written into its
``[calibration]`` table as ``spread_model`` with how many records it rests on; ``parsim simulate
--samples`` then draws it (``parsim.cluster.spread``).

The error that goes in is today's model's: a record that names its scenario is predicted again
(``parsim.validate.repredict``, the validation's own path: the scenario prepared for the backend
and the schedule its ranks ran; passed in as ``predict``, this layer sits below the simulator),
so a cost-model change since the run is not mistaken for, or hidden in, the discrepancy; an
older record without ``scenario_file`` keeps the prediction it holds.
"""
from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from parsim.calibrate.spread import model_discrepancy, step_error
from parsim.errors import ConfigError, ScheduleError
from parsim.files import read_input_text

MIN_RECORDS = 3
"""Fewest records a discrepancy is stated from: below that a sigma is not an estimate."""

_HEADER = re.compile(r"^\s*\[([^\[\]]+)\]\s*(#.*)?$")
"""A TOML table header line (not an array-of-tables one), with an optional comment."""

KEYS = ("spread_model", "spread_model_records", "spread_model_source")
"""The ``[calibration]`` keys this writes (any earlier values are replaced)."""


@dataclass(frozen=True)
class Record:
    """One validation record, as read from its ``comparison.json``."""

    path: Path
    """The ``comparison.json`` file."""
    case: str
    """Its ``scenario`` field: the case the run validated."""
    profile: str
    """Its ``hardware_file``: the profile the prediction used, as the run named it."""
    predicted_s: float
    """The predicted step, seconds."""
    measured_s: tuple[float, ...]
    """Every measured step, seconds."""
    scenario_file: str | None = None
    """The scenario the run validated, as the run named it (None: an older record)."""
    overrides: tuple[str, ...] = ()
    """Its ``--set`` overrides."""
    backend: str = "gloo"
    """The torch.distributed backend it ran on."""
    recv: str | None = None
    """Where its ranks posted receives ("early" | "late"; the schedule they ran)."""
    oversubscribed: bool = False
    """CPU ranks outnumbered the host's cores (``world`` > ``cpu_count`` on gloo): the ranks took
    turns on the cores, which no profile models; such a record is not folded."""

    @property
    def error(self) -> float:
        """log(median measured / predicted), with the prediction the record holds."""
        return step_error(self.predicted_s, self.measured_s)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def read_record(path: Path) -> Record:
    """One ``comparison.json`` -> Record; a file that is not one is a one-line ConfigError."""
    try:
        d = json.loads(read_input_text(path))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(str(path), None, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(str(path), None, f"not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(d, dict):
        raise ConfigError(str(path), None, "expected a JSON object (a parsim validate comparison.json)")
    pred = d.get("predicted") if isinstance(d.get("predicted"), dict) else {}
    meas = d.get("measured") if isinstance(d.get("measured"), dict) else {}
    if not _positive(pred.get("step_time_s")):
        raise ConfigError(str(path), "predicted.step_time_s", "missing or not a positive number")
    steps = meas.get("step_time_all_s")
    if not isinstance(steps, list) or not steps or not all(_positive(x) for x in steps):
        raise ConfigError(str(path), "measured.step_time_all_s", "missing or not a list of positive numbers")
    if not isinstance(d.get("hardware_file"), str) or not d["hardware_file"]:
        raise ConfigError(str(path), "hardware_file", "missing: the record does not name its profile")
    scn, ov = d.get("scenario_file"), d.get("overrides", [])
    if scn is not None and (not isinstance(scn, str) or not scn):
        raise ConfigError(str(path), "scenario_file", "not a file name")
    if not isinstance(ov, list) or not all(isinstance(o, str) for o in ov):
        raise ConfigError(str(path), "overrides", "not a list of KEY=VALUE strings")
    for key in ("backend", "recv"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise ConfigError(str(path), key, "not a string")
    world, cores = d.get("world"), d.get("cpu_count")
    backend = d.get("backend") or "gloo"
    over = (backend == "gloo" and isinstance(world, int) and isinstance(cores, int) and world > cores)
    return Record(path, str(d.get("scenario", path.parent.name)), d["hardware_file"], float(pred["step_time_s"]),
                  tuple(float(x) for x in steps), scn, tuple(ov), backend, d.get("recv"), over)


def find_records(paths) -> list[Record]:
    """Every ``comparison.json`` under the given directories (or the files themselves), sorted."""
    files: set[Path] = set()
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.rglob("comparison.json"))
            if not found:
                raise ConfigError(str(p), None, "no comparison.json under it (parsim validate --out DIR writes one)")
            files.update(found)
        elif p.is_file():
            files.add(p)
        else:
            raise ConfigError(str(p), None, "no such file or directory")
    return [read_record(f) for f in sorted(files)]


def _candidates(named: str, record: Path) -> list[Path]:
    """A file a record names (as the run named it: relative to where it ran, or absolute): tried
    as given, then against the record's own ancestors."""
    return [Path(named)] + [anc / named for anc in record.resolve().parents]


def _same_file(named: str, profile: Path, record: Path) -> bool:
    """A record's ``hardware_file`` is ``profile``."""
    want = profile.resolve()
    return any(c.is_file() and c.resolve() == want for c in _candidates(named, record))


def located(named: str, record: Path) -> Path | None:
    """Where a file the record names is now (None: nowhere)."""
    return next((c for c in _candidates(named, record) if c.is_file()), None)


def today_predictions(records: list[Record], profile: Path, predict=None) -> list[tuple[Record, float, bool]]:
    """(record, predicted step seconds, predicted again?) per record: ``predict(record, profile)``
    -> seconds or None (``parsim.validate.repredict.predicted_step``: today's model on the
    record's scenario), else the prediction the record holds."""
    out = []
    for r in records:
        try:
            again = predict(r, profile) if predict is not None else None
        except (ConfigError, ScheduleError):  # the scenario no longer loads as it did: the record's own
            again = None
        out.append((r, again if again is not None else r.predicted_s, again is not None))
    return out


def records_for(records: list[Record], profile: Path) -> list[Record]:
    """The records predicted with ``profile`` (oversubscribed ones included: :func:`fold` sets them aside)."""
    return [r for r in records if _same_file(r.profile, profile, r.path)]


def fold(records: list[Record], profile: Path, predict=None) -> tuple[dict, list[tuple[Record, float, bool]]]:
    """(the ``[calibration]`` values for ``profile``, the records they rest on with their
    predictions: :func:`today_predictions` with ``predict``); refused below MIN_RECORDS."""
    named = records_for(records, profile)
    mine = [r for r in named if not r.oversubscribed]
    if len(mine) < MIN_RECORDS:
        others = sorted({r.profile for r in records} - {str(profile)})
        hint = f" (the others name: {', '.join(others)})" if others else ""
        aside = f", {len(named) - len(mine)} of them oversubscribed (set aside)" if len(named) > len(mine) else ""
        raise ConfigError(str(profile), "spread_model",
                          f"{len(named)} of {len(records)} records were predicted with this profile{aside}; "
                          f"at least {MIN_RECORDS} are needed{hint}")
    preds = today_predictions(mine, profile, predict)
    sigma = model_discrepancy([step_error(pred, r.measured_s) for r, pred, _ in preds])
    again = sum(a for *_, a in preds)
    how = ("each predicted again with today's model" if again == len(mine) else
           f"{again} predicted again with today's model, {len(mine) - again} with the prediction the record holds")
    return {"spread_model": sigma, "spread_model_records": len(mine),
            "spread_model_source": f"parsim calibrate --validations: split-conformal 90% quantile of |log(median "
                                   f"measured / predicted step)| / 1.645 over {len(mine)} records "
                                   f"({', '.join(r.case for r in mine)}; {how})"}, preds


def with_calibration(text: str, values: dict, where: str) -> str:
    """The profile's TOML ``text`` (refused in one line if it is not TOML) with ``values`` set in
    its ``[calibration]`` table, created when absent; earlier values of these keys are replaced."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(where, None, f"not TOML: {e}") from None
    table = None
    out: list[str] = []
    head = None
    for line in text.splitlines():
        m = _HEADER.match(line)
        if line.lstrip().startswith("[["):  # an array of tables: not the calibration table
            table = None
        elif m:
            table = m.group(1).strip()
            if table == "calibration":
                head = len(out)
        elif table == "calibration" and "=" in line and line.split("=", 1)[0].strip() in values:
            continue  # replaced below
        out.append(line)
    new = [f"{k} = {json.dumps(v) if isinstance(v, str) else v}" for k, v in values.items()]
    if head is None:
        out += ["", "[calibration]", *new]
    else:
        out[head + 1:head + 1] = new
    result = "\n".join(out) + "\n"
    try:
        tomllib.loads(result)
    except tomllib.TOMLDecodeError as e:  # e.g. a key of this name written as a dotted or quoted key
        raise ConfigError(where, "calibration", f"cannot set {', '.join(values)} in this table: {e}") from None
    return result
