"""What every report states before its numbers: the context (parsim version, hardware,
model, batch, sequence length) and how far to trust them (the measured fidelity).

The uncertainty line is computed from the data of ``reports/fidelity.md`` (its table's
``error`` column: predicted vs published step time of public training runs), not written
as prose here, so it follows the report when the report is regenerated.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from parsim.results.summary import gpus_text, pct

FIDELITY_REPORT = Path(__file__).resolve().parents[2] / "reports" / "fidelity.md"


@dataclass(frozen=True)
class Fidelity:
    """Predicted vs published step time over the rows of a fidelity report."""

    rows: int
    """Published runs compared."""
    mape: float
    """Mean absolute relative error (a fraction)."""
    worst: float
    """Largest absolute relative error (a fraction)."""
    source: str
    """The report the rows come from."""


def read_fidelity(path: Path = FIDELITY_REPORT) -> Fidelity | None:
    """The fidelity measured in ``path`` (None when the file or its table is missing, e.g. an
    installed package without the repository's reports)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    errors: list[float] = []
    col = None
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "error" in cells:
            col = cells.index("error")
            continue
        if col is not None and len(cells) > col:
            m = re.fullmatch(r"([+-]?\d+(?:\.\d+)?)%", cells[col])
            if m:
                errors.append(abs(float(m.group(1))) / 100.0)
    if not errors:
        return None
    try:
        source = str(path.relative_to(FIDELITY_REPORT.parents[1]))
    except ValueError:
        source = str(path)
    return Fidelity(len(errors), sum(errors) / len(errors), max(errors), source)


def uncertainty_line(fid: Fidelity | None = None, path: Path = FIDELITY_REPORT) -> str:
    fid = fid if fid is not None else read_fidelity(path)
    if fid is None:
        return ("Uncertainty: no fidelity measurement is available in this installation "
                "(reports/fidelity.md); treat the numbers as a model's estimate.")
    return (f"Uncertainty: against {fid.rows} published training runs ({fid.source}) the predicted step time was "
            f"off by {pct(fid.mape)} on average (MAPE), {pct(fid.worst)} at worst; differences between scenarios "
            f"smaller than that are within the model's error.")


def context_line(mx: dict, version: str | None = None) -> str:
    """``parsim 0.1.0; gpt3-175b on 1,024 GPUs (128 nodes of dgx-a100-80g); global batch 1,536 x seq 2,048``
    (``version``: the caller's ``parsim.__version__``, which this layer cannot import)."""
    return (f"parsim{' ' + version if version else ''}; {mx['model']} on {gpus_text(mx['world_size'], mx.get('gpus_per_node'), mx['hardware'])}; "
            f"global batch {mx['global_batch']:,} sequences x seq {mx['seq_len']:,} tokens "
            f"({mx['tokens_per_step']:,} tokens per step)")
