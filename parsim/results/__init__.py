"""Span rows + memory events + the cost model's tables -> metrics, JSON, summary text and
Chrome/Perfetto traces."""
from parsim.results.memory import MEMORY_KINDS
from parsim.results.result import Result
from parsim.results.summary import json_safe

__all__ = ["MEMORY_KINDS", "Result", "json_safe"]
