"""The routing an MoE validation run produced, and the prediction given it.

The torch runtime's router decides for real where every token goes (``parsim.validate.experts``
records each top-k assignment's expert before capacity dropping; the worker counts them per MoE
block after each step). The scenario's ``[moe] routing`` is an assumption (the bundled tiny MoE
says ``balanced``). Routing is an input of the simulator, not something it predicts, so the
report also gives the step the simulator predicts from the routing the run produced: the same
scenario with ``routing = "histogram"``, one histogram per MoE layer. Torch-free.
"""
from __future__ import annotations

import dataclasses

from parsim.simulate import simulate


def run_routing(launches: list[list[dict]], chain_len: int) -> tuple[tuple[float, ...], ...] | None:
    """Per MoE layer in model order, the top-k assignments per expert summed over every rank and
    measured step of every launch (None when no rank recorded any). Stage s holds piece
    s % ``chain_len`` of its model copy (two-copy schedules: both copies' routing adds up)."""
    pieces: dict[int, list[list[int]]] = {}
    for ranks in launches:
        for r in ranks:
            for step in r["steps"][r.get("warmup", 0):]:
                for s, rows in step.get("moe_routed", {}).items():
                    acc = pieces.setdefault(int(s) % chain_len, [[0] * len(row) for row in rows])
                    for a, row in zip(acc, rows):
                        for j, n in enumerate(row):
                            a[j] += n
    if not pieces:
        return None
    layers = [row for p in sorted(pieces) for row in pieces[p]]
    if not any(sum(row) for row in layers):
        return None
    return tuple(tuple(float(n) for n in row) for row in layers)


def predicted_with_routing(predicted, histogram: tuple[tuple[float, ...], ...]) -> float:
    """Step time (s) the simulator predicts for ``predicted``'s scenario and schedule with each MoE
    layer routed as ``histogram`` says (``[moe] routing = "histogram"``, one row per MoE layer)."""
    sc = predicted.scenario
    moe = dataclasses.replace(sc.moe, routing="histogram", histogram=histogram)
    return simulate(dataclasses.replace(sc, moe=moe), schedule=predicted.schedule).metrics["step_time_s"]
