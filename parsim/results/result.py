"""One simulated step: span rows (the Timeline), memory events and the cost model's tables ->
metrics (``parsim.results.metrics``), JSON and a readable summary."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from parsim.config.scenario import Scenario
from parsim.costs.tables import CostTables
from parsim.results.frames import MEM_DTYPE, SPAN_DTYPE, memory_frame, spans_frame
from parsim.results.memory import MEMORY_KINDS
from parsim.results.metrics import metrics
from parsim.results.summary import format_summary, json_safe
from parsim.schedule.ir import Schedule
from parsim.sim.engine import RawTimeline

__all__ = ["MEMORY_KINDS", "MEM_DTYPE", "SPAN_DTYPE", "Result", "format_summary", "json_safe", "spans_frame"]


@dataclass
class Result:
    """One simulated optimizer step."""

    scenario: Scenario
    """What was simulated."""
    schedule: Schedule
    """The lowered schedule that ran."""
    tables: CostTables
    """The cost model's per (stage, op), per stage and per rank figures (values, not the model)."""
    timeline: pd.DataFrame
    """One row per executed action (Span): rank, stream, op, stage, microbatch, start_s, end_s, bytes."""
    memory_events: pd.DataFrame
    """rank, time_s, delta_bytes, kind: dynamic allocations over the step."""
    metrics: dict
    """The ``--json`` object."""

    @classmethod
    def from_raw(cls, sc: Scenario, schedule: Schedule, tables: CostTables, raw: RawTimeline) -> Result:
        tl = spans_frame(raw.spans)
        mem = memory_frame(raw.mem_events)
        return cls(sc, schedule, tables, tl, mem, metrics(sc, schedule, tables, tl, mem))

    def to_json(self) -> dict:
        return self.metrics

    def summary(self) -> str:
        return format_summary(self.metrics)
