"""What both importers share: the scenario they build, its TOML text, and the check that
parsim's loader accepts it (errors named after the framework's own flag or key).

An importer builds an :class:`Imported`: the scenario as a dict of tables (what a scenario
file holds), the source's settings parsim does not model, and the assumptions it made.
:func:`to_toml` prints it with those as comments at the top; :func:`check` loads it with
the scenario loader, so that an import that would not simulate fails at import time, in
one line naming the framework's flag (``--tensor-model-parallel-size``) rather than
parsim's key.
"""
from __future__ import annotations

import json
import math
import textwrap
import tomllib
from dataclasses import dataclass, field, fields

from parsim.config.parallel import ParallelConfig, partition_layers
from parsim.errors import ConfigError
from parsim.scenario import Scenario, scenario_from_dict
from parsim.schedule.builders import BUILDERS
from parsim.schedule.semantics import canonical_key, name_key, traits

TABLES = ("model", "training", "parallel", "schedule", "overlap", "moe")
"""Scenario tables in the order they are printed."""


@dataclass(frozen=True)
class Imported:
    """A framework configuration translated into a parsim scenario."""

    source: str
    """What was read, for messages and the header: ``"megatron arguments"`` or the file path."""
    doc: dict
    """The scenario as a scenario file holds it: top-level keys and tables (TABLES)."""
    not_modelled: tuple[str, ...] = ()
    """The source's settings parsim does not model, as the user wrote them."""
    notes: tuple[str, ...] = ()
    """Assumptions and approximations the importer made, one sentence each."""
    key_source: dict = field(default_factory=dict)
    """parsim dotted key -> the source's flag or key it came from (for error messages)."""


def has_parallel_key(name: str) -> bool:
    """Whether parsim's [parallel] table knows ``name`` (e.g. ``dp_shard``, added by another change)."""
    return name in {f.name for f in fields(ParallelConfig)}


def schedule_name(requested: str, source: str, key: str) -> str:
    """parsim's registered name for a schedule a framework names (aliases resolved)."""
    want = canonical_key(requested)
    for name in BUILDERS:
        if name_key(name) == want:
            return name
    raise ConfigError(source, key, f"parsim has no schedule {requested!r} (known: {', '.join(BUILDERS)})")


def stage_layout(n_layers: int, per_stage: list[int], vpp: int, schedule: str, stated: dict | None = None) -> dict:
    """``[schedule]`` keys under which parsim places ``per_stage`` (blocks per stage in model
    order): what the source ``stated`` in parsim's words when that gives the same split, else
    the fewest keys (nothing, the embedding/loss slots, the first/last chunk), else the list."""
    n = len(per_stage)
    interleaved = vpp > 1 and traits(schedule).stages_per_rank is None  # as the loader decides
    candidates = ([stated] if stated else []) + [{}, {"account_for_embedding": True}, {"account_for_loss": True},
                  {"account_for_embedding": True, "account_for_loss": True}]
    if n >= 2:
        candidates += [{"first_stage_layers": per_stage[0]}, {"last_stage_layers": per_stage[-1]},
                       {"first_stage_layers": per_stage[0], "last_stage_layers": per_stage[-1]}]
    for c in candidates:
        try:
            got = partition_layers(n_layers, n, interleaved=interleaved,
                                   first=c.get("first_stage_layers"), last=c.get("last_stage_layers"),
                                   embedding=c.get("account_for_embedding", False),
                                   loss=c.get("account_for_loss", False))
        except ConfigError:
            continue
        if list(got) == per_stage:
            return c
    return {"layers_per_stage": per_stage}


def check(imp: Imported) -> Scenario:
    """Load the scenario as ``parsim simulate`` would; a ConfigError names the source's flag."""
    try:
        return scenario_from_dict(tomllib.loads(to_toml(imp)), imp.source)
    except ConfigError as e:
        if e.key in imp.key_source:
            raise ConfigError(imp.source, imp.key_source[e.key], f"{e.problem} (parsim {e.key})") from None
        raise ConfigError(imp.source, e.key, e.problem) from None


def to_toml(imp: Imported, header: str = "") -> str:
    """The scenario file: comments (header, notes, what is not modelled), then the keys."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    if imp.notes:
        lines.append("# Assumed:")
        lines += _wrapped(imp.notes)
    lines.append("# Not modelled by parsim (no effect on this prediction):")
    lines += _wrapped(imp.not_modelled or ("(nothing)",))
    top = {k: v for k, v in imp.doc.items() if not isinstance(v, dict)}
    lines += [f"{k} = {_value(v)}" for k, v in top.items()]
    for table in TABLES:
        body = imp.doc.get(table)
        if body:
            lines += ["", f"[{table}]"] + [f"{k} = {_value(v)}" for k, v in body.items()]
    return "\n".join(lines) + "\n"


def _wrapped(items) -> list[str]:
    out = []
    for item in items:
        out += textwrap.wrap(item, 96, initial_indent="#   ", subsequent_indent="#     ",
                             break_long_words=False, break_on_hyphens=False)
    return out


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"not a TOML number: {v!r}")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")
