"""The only place that knows about human units.

Inside parsim everything is SI: seconds, bytes, FLOP, FLOP/s, bytes/s. Config keys
carry their unit in the name (``memory_gib``, ``nvlink_gbyte_per_s``); loaders convert
with the helpers here, and reports format with ``fmt_*``.
"""
from __future__ import annotations

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2.0**10
MiB = 2.0**20
GiB = 2.0**30
TiB = 2.0**40

TFLOP = 1e12
PFLOP = 1e15

US = 1e-6
MS = 1e-3

# Key suffix -> multiplier to SI. A loader looks at the suffix of a key and scales.
SUFFIX_TO_SI: dict[str, float] = {
    "_s": 1.0,
    "_ms": MS,
    "_us": US,
    "_bytes": 1.0,
    "_kib": KiB,
    "_mib": MiB,
    "_gib": GiB,
    "_gb": GB,
    "_tb": TB,
    "_tflops": TFLOP,
    "_pflops": PFLOP,
    "_gbyte_per_s": GB,  # GB/s (1e9 bytes/s)
    "_tbyte_per_s": TB,  # TB/s
    "_gbit_per_s": GB / 8,  # Gb/s line rate -> bytes/s
}


def to_si(key: str, value: float) -> float:
    """Scale ``value`` by the unit its key's suffix names (longest suffix wins)."""
    for suffix in sorted(SUFFIX_TO_SI, key=len, reverse=True):
        if key.endswith(suffix):
            return float(value) * SUFFIX_TO_SI[suffix]
    raise KeyError(f"key {key!r} has no unit suffix")


def gbit_per_s(x: float) -> float:
    """Line rate in Gb/s -> bytes/s."""
    return x * GB / 8


def fmt_bytes(b: float) -> str:
    """Binary units, as nvidia-smi and torch.cuda report memory."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(b) >= scale:
            return f"{b / scale:.2f} {unit}"
    return f"{b:.0f} B"


def fmt_seconds(s: float) -> str:
    if abs(s) >= 1.0:
        return f"{s:.3f} s"
    if abs(s) >= MS:
        return f"{s / MS:.3f} ms"
    return f"{s / US:.1f} us"


def fmt_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"
