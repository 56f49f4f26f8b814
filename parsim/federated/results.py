"""Federated results: one row per round and the summary metrics (``parsim fl --json``)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Round:
    """One round (sync) or one aggregation of buffer_size updates (async)."""

    round: int
    """Index from 0."""
    start_s: float
    """Virtual time the round started (async: the previous aggregation)."""
    end_s: float
    """Virtual time the server closed it."""
    selected: int
    """Clients sent the model for this round (async: tasks started since the previous aggregation)."""
    participants: int
    """Updates aggregated (0 for a failed round)."""
    dropped: int
    """Selected clients whose update was not aggregated: stragglers, deadline, gone offline
    (async: tasks dropped since the previous aggregation)."""
    failed: bool
    """Sync: fewer than min_fraction x K updates by the close; nothing aggregated."""
    bytes_up: float
    """Bytes of the updates that reached the server."""
    bytes_down: float
    """Bytes of the model sent to the selected clients."""
    compute_s_mean: float
    """Mean local compute of the aggregated clients' tasks, s."""
    comm_s_mean: float
    """Mean download + upload of the aggregated clients' tasks, s."""
    staleness_mean: float
    """Async: mean model versions between an aggregated update's download and its aggregation."""

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


COLUMNS = ("round", "start_s", "end_s", "duration_s", "selected", "participants", "dropped", "failed", "bytes_up",
           "bytes_down", "compute_s_mean", "comm_s_mean", "staleness_mean")


@dataclass(frozen=True)
class FLResult:
    """Rows per round and the metrics derived from them."""

    name: str
    """Scenario name."""
    rows: tuple[Round, ...]
    """One per round, in order."""
    metrics: dict
    """Summary (the JSON ``parsim fl --json`` prints)."""

    @classmethod
    def build(cls, sc, rows: list[Round], encoding, pop, task) -> FLResult:
        fed = sc.federated
        dur = np.array([r.duration_s for r in rows]) if rows else np.zeros(1)
        selected = sum(r.selected for r in rows)
        dropped = sum(r.dropped for r in rows)
        ok = [r for r in rows if not r.failed]
        mx = {
            "name": sc.name, "mode": fed.mode, "clients": fed.clients, "clients_per_round": fed.clients_per_round,
            "buffer_size": fed.buffer_size if fed.mode == "async" else None, "model": sc.model_name,
            "params": sc.params, "rounds": len(rows), "successful_rounds": len(ok), "failed_rounds": len(rows) - len(ok),
            "total_time_s": rows[-1].end_s if rows else 0.0,
            "round_time_s_p50": float(np.percentile(dur, 50)), "round_time_s_p90": float(np.percentile(dur, 90)),
            "round_time_s_mean": float(dur.mean()),
            "participants_mean": float(np.mean([r.participants for r in rows])) if rows else 0.0,
            "dropped_fraction": dropped / selected if selected else 0.0,
            "uplink_bits_per_param": encoding.bits_per_param, "uplink_bits_per_update": encoding.bits,
            "downlink_bits_per_param": float(fed.weight_bits), "compression": list(sc.compression.methods) or ["none"],
            "compression_ops_per_update": encoding.ops,
            "bytes_up_total": float(sum(r.bytes_up for r in rows)), "bytes_down_total": float(sum(r.bytes_down for r in rows)),
            "staleness_mean": float(np.mean([r.staleness_mean for r in ok])) if ok and fed.mode == "async" else 0.0,
            "client_task_s_p50": _task_p50(task, pop),
        }
        return cls(name=sc.name, rows=tuple(rows), metrics=mx)

    def row_dicts(self) -> list[dict]:
        return [{**asdict(r), "duration_s": r.duration_s} for r in self.rows]

    def frame(self):
        import pandas as pd
        return pd.DataFrame(self.row_dicts(), columns=list(COLUMNS))

    def to_json(self) -> str:
        return json.dumps(self.metrics, indent=1)

    def time_to_rounds(self) -> np.ndarray:
        """Virtual time by which n successful rounds were done, n = 1, 2, ..."""
        return np.array([r.end_s for r in self.rows if not r.failed])

    def rounds_by(self, t: float) -> int:
        """Successful rounds finished by virtual time ``t``."""
        return int(np.sum(self.time_to_rounds() <= t))

    def summary(self) -> str:
        m = self.metrics
        mode = "sync (FedAvg rounds)" if m["mode"] == "sync" else f"async (FedBuff, buffer {m['buffer_size']})"
        lines = [
            f"{m['name']}: {m['clients']:,} clients, {m['clients_per_round']:,} per round, {mode}",
            f"  model             {m['model']} ({m['params']:,} parameters)",
            (f"  uplink            {', '.join(m['compression'])}: {m['uplink_bits_per_param']:.4g} bits/param "
             f"({m['uplink_bits_per_update'] / 8e6:.4g} MB per update)"),
            f"  rounds            {m['rounds']} ({m['failed_rounds']} failed) in {_hms(m['total_time_s'])}",
            f"  round time        p50 {_hms(m['round_time_s_p50'])}, p90 {_hms(m['round_time_s_p90'])}",
            f"  client task       p50 {_hms(m['client_task_s_p50'])} (download + compute + upload)",
            (f"  participants      {m['participants_mean']:.1f} per round; dropped {m['dropped_fraction']:.1%} of "
             "selected"),
            f"  traffic           up {m['bytes_up_total'] / 1e9:.4g} GB, down {m['bytes_down_total'] / 1e9:.4g} GB",
        ]
        if m["mode"] == "async":
            lines.append(f"  staleness         {m['staleness_mean']:.2f} model versions (mean)")
        return "\n".join(lines)


def _task_p50(task, pop) -> float:
    idx = np.arange(min(pop.size, 100_000))
    c, d, u = task.parts(pop, idx)
    return float(np.median(c + d + u))


def _hms(s: float) -> str:
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"
