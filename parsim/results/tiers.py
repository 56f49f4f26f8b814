"""Memory tiers in the result: host and NVMe bytes per node and the time each tier is busy
(spans on the ``pcie``/``c2c``, ``cpu`` and ``nvme`` streams: offload transfers, CPU-Adam,
NVMe swaps), and whether the host side fits."""
from __future__ import annotations

import pandas as pd

TIER_STREAMS = ("pcie", "c2c", "cpu", "nvme")


def tier_metrics(sc, tl: pd.DataFrame, host_bytes: float, nvme_bytes: float) -> dict:
    """The JSON fields: ``host_memory_bytes_per_node``, ``nvme_bytes_per_node``, ``tier_time_s``
    (seconds each tier is busy, summed over its spans, mean over pipeline ranks) and ``host_fits`` (host bytes within the profile's pinned memory, NVMe within its drives)."""
    pp = max(1, int(tl["rank"].max()) + 1) if len(tl) else 1
    busy = {}
    for stream in TIER_STREAMS:
        rows = tl[tl["stream"] == stream]
        if len(rows):
            busy[stream] = float((rows["end_s"] - rows["start_s"]).sum()) / pp
    host = sc.hardware.host
    host_ok = host is None and host_bytes == 0 or host is not None and host_bytes <= host.pinned_memory_bytes
    nvme_ok = nvme_bytes == 0 or host is not None and nvme_bytes <= host.nvme_bytes
    return {"host_memory_bytes_per_node": host_bytes, "nvme_bytes_per_node": nvme_bytes,
            "tier_time_s": busy, "host_fits": bool(host_ok and nvme_ok)}
