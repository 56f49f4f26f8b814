"""Errors that reach the user as one line (the CLI turns them into exit code 2)."""
from __future__ import annotations


class ParsimError(Exception):
    """Base class: anything the user can fix by changing their input."""


class ConfigError(ParsimError):
    """Bad input: names the file, the key and what is wrong.

    str(err) is the single line the CLI prints, e.g.
    ``scenarios/x.toml: parallel.tp: 96 heads are not divisible by tp=7``.
    """

    def __init__(self, file: str | None, key: str | None, problem: str):
        self.file = file
        self.key = key
        self.problem = problem
        super().__init__(self.line())

    def line(self) -> str:
        parts = [p for p in (self.file, self.key) if p]
        return ": ".join(parts + [self.problem])


class ScheduleError(ParsimError):
    """A schedule that cannot run (causality broken, deadlock, bad degrees).

    ``grid`` holds a rank-by-step text grid with the failing step marked, when
    one could be drawn; the CLI prints the one-line message and, under it, the grid.
    """

    def __init__(self, problem: str, grid: str | None = None):
        self.problem = problem
        self.grid = grid
        super().__init__(problem)
