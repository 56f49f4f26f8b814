"""The ``[faults]`` table: how often the job's hardware fails and what a failure costs (typed only;
``parsim.goodput`` simulates the whole training run with it)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from parsim.errors import ConfigError

MAX_SPARE_NODES = 2**14
"""Largest spare-node pool: the Monte Carlo keeps a free time per spare for every sampled run and
checkpoint interval (~65 kB per spare: 16,384 take ~1 GB; 100,000 took 6.5 GB and over a minute);
goodput also refuses a pool larger than the job, which never runs dry."""


@dataclass(frozen=True)
class FaultsConfig:
    """Failure rates, checkpointing and recovery of a training run."""

    gpu_mtbf_hours: float
    """Mean time between failures of one GPU (its server share included when no node rate is
    given), hours. The job's failures form a Poisson process: rate = gpus / MTBF (+ nodes and switches)."""
    node_mtbf_hours: float | None = None
    """Mean time between failures of one node from causes other than its GPUs (host, NIC, power), hours."""
    switch_mtbf_hours: float | None = None
    """Mean time between failures of one leaf switch (one per ``network.gpus_per_leaf`` GPUs), hours."""
    checkpoint_interval_s: float | None = None
    """Training time between two checkpoints, seconds (rounded to whole steps); None ("auto"):
    the interval the simulation finds best."""
    checkpoint_write_s: float | None = None
    """Time one checkpoint stops training, seconds; or give ``storage_gbyte_per_s``."""
    checkpoint_bytes: float | None = None
    """Bytes of one checkpoint; None: the model's weights and optimizer states (params x bytes per
    parameter of parsim.costs.memory.state_bytes_per_param)."""
    storage_gbyte_per_s: float | None = None
    """Aggregate write bandwidth of the checkpoint storage, GB/s (10^9 bytes): write time = bytes / it."""
    restart_s: float = 0.0
    """Time from a failure to training again (detection, rescheduling, loading the checkpoint), seconds."""
    spare_nodes: int | None = None
    """Nodes kept ready to replace a failed one; None: always a replacement at hand."""
    node_repair_hours: float | None = None
    """Time a failed node needs to come back as a spare, hours (needed with ``spare_nodes``)."""


_FLOATS = ("gpu_mtbf_hours", "node_mtbf_hours", "switch_mtbf_hours", "checkpoint_write_s", "checkpoint_bytes",
           "storage_gbyte_per_s", "restart_s", "node_repair_hours")


_MOST = {"gpu_mtbf_hours": 1e9, "node_mtbf_hours": 1e9, "switch_mtbf_hours": 1e9,  # 100,000 years
         "checkpoint_write_s": 1e6, "restart_s": 1e6, "node_repair_hours": 1e5,  # ~12 days; ~11 years
         "checkpoint_bytes": 2.0 ** 60, "storage_gbyte_per_s": 1e6}
"""Largest value of each number (beyond them a run's times overflow or describe no machine)."""


def faults_from_table(t: dict, file: str) -> FaultsConfig:
    """Strictly parse a ``[faults]`` table (unknown keys, wrong types and contradictions refused)."""
    p = "faults."
    known = set(_FLOATS) | {"checkpoint_interval_s", "spare_nodes"}
    for k in t:
        if k not in known:
            raise ConfigError(file, p + k, f"unknown key (known: {', '.join(sorted(known))})")
    kw: dict = {}
    for k in _FLOATS:
        if k in t:
            v = t[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                    or (v == 0 and k != "restart_s"):
                want = "a non-negative number" if k == "restart_s" else "a positive number"
                raise ConfigError(file, p + k, f"expected {want}, got {v!r}")
            if v > _MOST[k]:
                raise ConfigError(file, p + k, f"{v:g} is more than parsim models ({_MOST[k]:g})")
            kw[k] = float(v)
    if "gpu_mtbf_hours" not in kw:
        raise ConfigError(file, p + "gpu_mtbf_hours", "missing (required in a [faults] table)")
    ci = t.get("checkpoint_interval_s", "auto")
    if ci != "auto":
        if isinstance(ci, bool) or not isinstance(ci, (int, float)) or not math.isfinite(ci) or ci <= 0:
            raise ConfigError(file, p + "checkpoint_interval_s", f'expected positive seconds or "auto", got {ci!r}')
        kw["checkpoint_interval_s"] = float(ci)
    if ("checkpoint_write_s" in kw) == ("storage_gbyte_per_s" in kw):
        raise ConfigError(file, p + "checkpoint_write_s",
                          "give checkpoint_write_s, or storage_gbyte_per_s (and optionally checkpoint_bytes): one of them")
    if "checkpoint_bytes" in kw and "storage_gbyte_per_s" not in kw:
        raise ConfigError(file, p + "checkpoint_bytes", "needs storage_gbyte_per_s (write time = bytes / bandwidth)")
    if "spare_nodes" in t:
        s = t["spare_nodes"]
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(file, p + "spare_nodes", f"expected a non-negative integer, got {s!r}")
        if s > MAX_SPARE_NODES:
            raise ConfigError(file, p + "spare_nodes", f"{s:,} is more than parsim models ({MAX_SPARE_NODES:,})")
        if "node_repair_hours" not in kw:
            raise ConfigError(file, p + "node_repair_hours", "missing: spare_nodes needs the time a failed node takes to return")
        kw["spare_nodes"] = s
    elif "node_repair_hours" in kw:
        raise ConfigError(file, p + "node_repair_hours", "only meaningful with spare_nodes")
    return FaultsConfig(**kw)
