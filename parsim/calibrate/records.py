"""Validation records folded into a profile's spread: ``parsim calibrate --validations``.

A record is the ``comparison.json`` that ``parsim validate --out DIR`` writes: the profile it
was predicted with (``hardware_file``), the predicted step (``predicted.step_time_s``) and every
measured step (``measured.step_time_all_s``). The records predicted with one profile give that
profile's model discrepancy (:func:`parsim.calibrate.spread.model_discrepancy`), written into its
``[calibration]`` table as ``spread_model`` with how many records it rests on; ``parsim simulate
--samples`` then draws it (``parsim.cluster.spread``).
"""
from __future__ import annotations

import json
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from parsim.calibrate.spread import model_discrepancy, step_error
from parsim.errors import ConfigError

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

    @property
    def error(self) -> float:
        """log(median measured / predicted)."""
        return step_error(self.predicted_s, self.measured_s)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def read_record(path: Path) -> Record:
    """One ``comparison.json`` -> Record; a file that is not one is a one-line ConfigError."""
    try:
        d = json.loads(path.read_text())
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
    return Record(path, str(d.get("scenario", path.parent.name)), d["hardware_file"], float(pred["step_time_s"]),
                  tuple(float(x) for x in steps))


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


def _same_file(named: str, profile: Path, record: Path) -> bool:
    """A record's ``hardware_file`` (as the run named it: relative to where it ran, or absolute)
    is ``profile``: tried as given, then against the record's own ancestors."""
    want = profile.resolve()
    cand = [Path(named)] + [anc / named for anc in record.resolve().parents]
    return any(c.is_file() and c.resolve() == want for c in cand)


def records_for(records: list[Record], profile: Path) -> list[Record]:
    """The records predicted with ``profile``."""
    return [r for r in records if _same_file(r.profile, profile, r.path)]


def fold(records: list[Record], profile: Path) -> tuple[dict, list[Record]]:
    """(the ``[calibration]`` values for ``profile``, the records they rest on); refused below
    MIN_RECORDS."""
    mine = records_for(records, profile)
    if len(mine) < MIN_RECORDS:
        others = sorted({r.profile for r in records} - {str(profile)})
        hint = f" (the others name: {', '.join(others)})" if others else ""
        raise ConfigError(str(profile), "spread_model",
                          f"{len(mine)} of {len(records)} records were predicted with this profile; "
                          f"at least {MIN_RECORDS} are needed{hint}")
    sigma = model_discrepancy([r.error for r in mine])
    return {"spread_model": sigma, "spread_model_records": len(mine),
            "spread_model_source": f"parsim calibrate --validations: robust sigma of log(median measured / predicted "
                                   f"step) over {len(mine)} records ({', '.join(r.case for r in mine)})"}, mine


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
