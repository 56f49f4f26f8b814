"""The memory tiers behind the GPUs: host DRAM (pinned), the CPU that runs CPU-Adam, NVMe
drives, and NVLink-C2C where the CPU and GPU share a package (Grace Hopper / Blackwell).

The optional ``[host]`` table of a hardware profile (per node; every number with its
source). PCIe host<->device per GPU is the ``[node]`` table's ``pcie_*`` keys; with
``c2c_gbyte_per_s`` the host link of each GPU is NVLink-C2C instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from parsim.cluster.plausible import check_plausible
from parsim.errors import ConfigError
from parsim.units import GB, TB, GiB

_KEYS = {  # key: (required, kind)
    "cpu_memory_gib": (True, "pos"), "pinned_memory_gib": (True, "pos"),
    "cpu_memory_gbyte_per_s": (True, "pos"), "cpu_memory_efficiency": (True, "frac"),
    "cpu_cores": (True, "int"), "cpu_adam_gparams_per_s_per_core": (True, "pos"),
    "nvme_tbyte": (False, "pos"), "nvme_read_gbyte_per_s": (False, "pos"),
    "nvme_write_gbyte_per_s": (False, "pos"), "nvme_efficiency": (False, "frac"),
    "gpudirect_storage": (False, "bool"),
    "c2c_gbyte_per_s": (False, "pos"), "c2c_efficiency": (False, "frac"),
}


@dataclass(frozen=True, kw_only=True)
class HostTier:
    """One node's CPU, host memory and NVMe (all per node, SI units)."""

    cpu_memory_bytes: float
    """Host DRAM capacity."""
    pinned_memory_bytes: float
    """Host memory that can be page-locked for DMA (what offloaded states and buffers may use)."""
    cpu_memory_bandwidth: float
    """Datasheet DRAM bandwidth, all sockets (bytes/s)."""
    cpu_memory_efficiency: float
    """Fraction of it a streaming kernel (STREAM triad, CPU-Adam) reaches."""
    cpu_cores: int
    """Physical cores (CPU-Adam's threads; the node's GPUs share them)."""
    cpu_adam_params_per_s_per_core: float
    """CPU-Adam's compute rate on one core (parameters/s), the ceiling when bandwidth is not."""
    nvme_bytes: float = 0.0
    """NVMe capacity (0: none)."""
    nvme_read_bandwidth: float = 0.0
    """Aggregate sequential read of the node's drives (bytes/s)."""
    nvme_write_bandwidth: float = 0.0
    """Aggregate sequential write (bytes/s)."""
    nvme_efficiency: float = 1.0
    """Fraction of the drives' rates the offload engine's asynchronous I/O reaches."""
    gpudirect_storage: bool = False
    """NVMe <-> GPU DMA without a host bounce buffer (GDS)."""
    c2c_bandwidth: float = 0.0
    """NVLink-C2C per GPU per direction (bytes/s; 0: the host link is PCIe)."""
    c2c_efficiency: float = 1.0
    """Fraction of the C2C rate large copies reach."""

    @property
    def stream_bandwidth(self) -> float:
        """Host memory bandwidth a streaming kernel reaches (bytes/s)."""
        return self.cpu_memory_bandwidth * self.cpu_memory_efficiency

    @property
    def nvme_read(self) -> float:
        return self.nvme_read_bandwidth * self.nvme_efficiency

    @property
    def nvme_write(self) -> float:
        return self.nvme_write_bandwidth * self.nvme_efficiency


def _value(file: str, key: str, kind: str, v: Any):
    if kind == "bool":
        if not isinstance(v, bool):
            raise ConfigError(file, key, f"must be true or false, got {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(file, key, f"must be a number, got {v!r}")
    if kind == "int" and (not isinstance(v, int) or v < 1):
        raise ConfigError(file, key, f"must be a positive integer, got {v!r}")
    if kind == "pos" and v <= 0:
        raise ConfigError(file, key, f"must be > 0, got {v!r}")
    if kind == "frac" and not 0 < v <= 1:
        raise ConfigError(file, key, f"must be a fraction in (0, 1], got {v!r}")
    check_plausible(file, key, v)
    return v


def parse_host(table: Mapping[str, Any] | None, file: str) -> HostTier | None:
    """The ``[host]`` table, strictly (None when the profile has none)."""
    if table is None:
        return None
    if not isinstance(table, Mapping):
        raise ConfigError(file, "host", "must be a table ([host])")
    t = {}
    for k, v in table.items():
        if k not in _KEYS:
            raise ConfigError(file, f"host.{k}", f"unknown key (known: {', '.join(_KEYS)})")
        t[k] = _value(file, f"host.{k}", _KEYS[k][1], v)
    for k, (required, _) in _KEYS.items():
        if required and k not in t:
            raise ConfigError(file, f"host.{k}", "missing (a [host] table must give it)")
    if "nvme_tbyte" in t and not {"nvme_read_gbyte_per_s", "nvme_write_gbyte_per_s"} <= set(t):
        raise ConfigError(file, "host.nvme_read_gbyte_per_s", "NVMe needs read and write bandwidths")
    if t["pinned_memory_gib"] > t["cpu_memory_gib"]:
        raise ConfigError(file, "host.pinned_memory_gib", "exceeds host.cpu_memory_gib")
    return HostTier(
        cpu_memory_bytes=t["cpu_memory_gib"] * GiB, pinned_memory_bytes=t["pinned_memory_gib"] * GiB,
        cpu_memory_bandwidth=t["cpu_memory_gbyte_per_s"] * GB, cpu_memory_efficiency=t["cpu_memory_efficiency"],
        cpu_cores=t["cpu_cores"], cpu_adam_params_per_s_per_core=t["cpu_adam_gparams_per_s_per_core"] * 1e9,
        nvme_bytes=t.get("nvme_tbyte", 0.0) * TB, nvme_read_bandwidth=t.get("nvme_read_gbyte_per_s", 0.0) * GB,
        nvme_write_bandwidth=t.get("nvme_write_gbyte_per_s", 0.0) * GB,
        nvme_efficiency=t.get("nvme_efficiency", 1.0), gpudirect_storage=t.get("gpudirect_storage", False),
        c2c_bandwidth=t.get("c2c_gbyte_per_s", 0.0) * GB, c2c_efficiency=t.get("c2c_efficiency", 1.0))
