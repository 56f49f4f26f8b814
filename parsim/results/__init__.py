"""Span rows -> metrics, JSON, summary text and Chrome/Perfetto traces."""
from parsim.results.result import MEMORY_KINDS, Result, json_safe

__all__ = ["MEMORY_KINDS", "Result", "json_safe"]
