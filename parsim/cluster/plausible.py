"""Plausible ranges for hardware-profile numbers, by the unit their key names.

A profile's schema says a bandwidth is positive and an efficiency a fraction; these ranges also
keep out values no real machine has (an efficiency of 1e-300, a 10^12 us latency, an FP8 peak of
10^300 TFLOP/s), which otherwise simulate to steps of 10^300 s or overflow to infinity. Each range
is at least 100x wider than the devices parsim knows, from a laptop CPU rank (cpu-gloo) to a
GB300 rack, on both sides.
"""
from __future__ import annotations

from parsim.errors import ConfigError

RANGES: tuple[tuple[str, float, float, str], ...] = (
    # (key suffix, low, high, what): the first suffix that ends the key wins
    ("_tflops", 1e-4, 1e6, "TFLOP/s"),             # cpu-gloo ~0.1 .. GB300 FP4 ~15,000
    ("_gparams_per_s_per_core", 1e-4, 1e4, "G params/s per core"),
    ("_tbyte_per_s", 1e-4, 1e3, "TB/s"),           # a CPU rank's DRAM share .. HBM4 ~10
    ("_gbyte_per_s", 1e-4, 1e5, "GB/s"),           # loopback .. NVLink5 900
    ("_gbit_per_s", 1e-3, 1e6, "Gb/s"),            # 1 GbE .. 1.6 Tb/s NICs
    ("_gib", 0.0, 1e6, "GiB"),                     # memory capacities (reserved may be 0)
    ("_tbyte", 1e-4, 1e5, "TB"),                   # NVMe capacity
    ("_us", 0.0, 1e6, "us"),                       # latencies and per-op times: at most 1 s
    ("_efficiency", 1e-3, 1.0, "fraction"),        # achieved share of a peak
    ("_share", 1e-3, 1.0, "fraction"),
    ("_per_clock_per_sm", 1.0, 1e6, "per clock per SM"),
    ("_half_dim", 0.0, 1e6, "elements"),
    ("_oversubscription", 1.0, 1e3, "x"),
)
COUNTS: dict[str, int] = {
    # integer counts: at most these (SMs: 100x B200's 148; CTAs: an SM count; GPUs: 2^20)
    "sm_count": 100_000, "collective_ctas": 100_000, "collective_ctas_net": 100_000,
    "gpus_per_node": 1_000, "nics_per_node": 1_000, "gpus_per_leaf": 2 ** 20, "cpu_cores": 100_000,
}


def check_plausible(file: str, key: str, v: float) -> None:
    """Refuse ``v`` for ``key`` (``table.name``) outside its unit's plausible range."""
    name = key.rsplit(".", 1)[-1]
    if name in COUNTS:
        if v > COUNTS[name]:
            raise ConfigError(file, key, f"{v:,} is more than any machine parsim models (at most {COUNTS[name]:,})")
        return
    for suffix, lo, hi, unit in RANGES:
        if name.endswith(suffix):
            if not lo <= v <= hi:
                raise ConfigError(file, key, f"{v:g} is outside the plausible range {lo:g} to {hi:g} ({unit})")
            return
