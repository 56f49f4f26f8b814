"""The ``[stragglers]`` table: a job whose GPUs and links are not all alike (typed only).

Slow GPUs and throttled nodes lengthen every compute action of the GPUs they name (a pipeline
rank's TP GPUs run in lockstep: the slowest sets that rank's pace); slow NICs and failed NICs
change the network (full mode: capacities, and a failed NIC's traffic rerouted through the
node's next healthy NIC); ``rank_hardware`` runs pipeline ranks on another GPU type (their
stages costed with that profile, the layers apportioned to speed), ``replica_hardware`` whole
data-parallel replicas (full mode: the replicas hold the same layers). Fast mode simulates
replica 0 only: a straggler elsewhere needs ``[simulation] mode = "full"``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from parsim.errors import ConfigError


@dataclass(frozen=True)
class StragglerConfig:
    """Per-GPU, per-node and per-link departures from the profile."""

    gpus: tuple[tuple[int, float], ...] = ()
    """(global GPU, slowdown): every compute action of that GPU takes ``slowdown`` times as long (1.2: 20% slower)."""
    nodes: tuple[tuple[int, float], ...] = ()
    """(node, slowdown): every GPU of the node (a throttled node: power, cooling)."""
    nics: tuple[tuple[int, float], ...] = ()
    """(NIC, bandwidth fraction in (0, 1]): a degraded NIC (full mode; NIC i is local GPU i's rail on node i // nics_per_node)."""
    failed_nics: tuple[int, ...] = ()
    """NICs that are down: their GPUs' traffic goes through the node's next healthy NIC (full mode)."""
    rank_hardware: tuple[tuple[int, str], ...] = ()
    """(pipeline rank, hardware profile): that rank's GPUs are another type (e.g. A100 stages in an H100 job)."""
    replica_hardware: tuple[tuple[int, str], ...] = ()
    """(DP replica = d * cp + c, hardware profile): every GPU of that replica another type (full mode)."""
    balance: bool = True
    """With ``rank_hardware``: apportion the layers to each rank's speed (False: keep the scenario's split)."""
    gpu_sigma: float = 0.0
    """Every GPU's own persistent slowdown drawn lognormal with this sigma (manufacturing and power-management
    variability: 0.0243 reads Sinha et al. SC22's 8% average variation as a 90% range); 0: none."""
    seed: int = 0
    """Seed of the ``gpu_sigma`` draws (the same seed, the same slow GPUs)."""


def _pairs(t: dict, key: str, file: str, second) -> tuple:
    v = t.get(key, [])
    if not isinstance(v, list) or not all(isinstance(x, list) and len(x) == 2 for x in v):
        raise ConfigError(file, f"stragglers.{key}", f"expected a list of [index, value] pairs, got {v!r}")
    out = []
    for i, x in v:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ConfigError(file, f"stragglers.{key}", f"index must be a non-negative integer, got {i!r}")
        out.append((i, second(x, f"stragglers.{key}")))
    if len({i for i, _ in out}) != len(out):
        raise ConfigError(file, f"stragglers.{key}", "an index appears twice")
    return tuple(out)


MAX_SLOWDOWN = 1000.0
"""Largest slowdown (and 1 / the smallest) a straggler may have: a GPU 1000x slower has failed,
and beyond ~1e300 its times overflow to infinity (a 1e300 slowdown printed a 773 ms step)."""


def stragglers_from_table(t: dict, file: str) -> StragglerConfig:
    """Strictly parse ``[stragglers]`` (indices are checked against the job by :func:`check_stragglers`)."""
    known = {"gpus", "nodes", "nics", "failed_nics", "rank_hardware", "replica_hardware", "balance", "gpu_sigma",
             "seed"}
    for k in t:
        if k not in known:
            raise ConfigError(file, f"stragglers.{k}", f"unknown key (known: {', '.join(sorted(known))})")

    def slowdown(x, key):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
            raise ConfigError(file, key, f"slowdown must be a positive number (1.2: 20% slower), got {x!r}")
        if not 1 / MAX_SLOWDOWN <= x <= MAX_SLOWDOWN:
            raise ConfigError(file, key, f"slowdown {x!r} is outside 1/{MAX_SLOWDOWN:g} to {MAX_SLOWDOWN:g} (a GPU "
                              "that much slower has failed: see [faults])")
        return float(x)

    def fraction(x, key):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 1 / MAX_SLOWDOWN <= x <= 1:
            raise ConfigError(file, key, f"bandwidth fraction must be in 1/{MAX_SLOWDOWN:g} to 1 (a NIC slower than "
                              f"that has failed: failed_nics), got {x!r}")
        return float(x)

    def profile(x, key):
        if not isinstance(x, str) or not x:
            raise ConfigError(file, key, f"expected a hardware profile name, got {x!r}")
        return x

    failed = t.get("failed_nics", [])
    if not isinstance(failed, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                               for i in failed):
        raise ConfigError(file, "stragglers.failed_nics", f"expected a list of NIC indices, got {failed!r}")
    if len(set(failed)) != len(failed):  # as the [index, value] lists refuse a repeated index
        raise ConfigError(file, "stragglers.failed_nics", f"a NIC is listed twice: {failed!r}")
    balance = t.get("balance", True)
    if not isinstance(balance, bool):
        raise ConfigError(file, "stragglers.balance", f"expected true/false, got {balance!r}")
    sigma = t.get("gpu_sigma", 0.0)
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not 0 <= sigma <= 1:
        raise ConfigError(file, "stragglers.gpu_sigma", f"expected a lognormal sigma in [0, 1], got {sigma!r}")
    seed = t.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(file, "stragglers.seed", f"expected a non-negative integer, got {seed!r}")
    return StragglerConfig(_pairs(t, "gpus", file, slowdown), _pairs(t, "nodes", file, slowdown),
                           _pairs(t, "nics", file, fraction), tuple(sorted(set(failed))),
                           _pairs(t, "rank_hardware", file, profile), _pairs(t, "replica_hardware", file, profile),
                           balance, float(sigma), seed)


def check_stragglers(st: StragglerConfig, gpus: int, gpus_per_node: int, nics_per_node: int, pp: int,
                     file: str, replicas: int = 1) -> None:
    """Indices inside the job; a node keeps at least one healthy NIC."""
    nodes = -(-gpus // gpus_per_node)
    for key, pairs, n in (("gpus", st.gpus, gpus), ("nodes", st.nodes, nodes), ("nics", st.nics, nodes * nics_per_node),
                          ("rank_hardware", st.rank_hardware, pp), ("replica_hardware", st.replica_hardware, replicas)):
        for i, _ in pairs:
            if i >= n:
                raise ConfigError(file, f"stragglers.{key}", f"index {i} is outside the job (0..{n - 1})")
    for i in st.failed_nics:
        if i >= nodes * nics_per_node:
            raise ConfigError(file, "stragglers.failed_nics", f"NIC {i} is outside the job (0..{nodes * nics_per_node - 1})")
    for node in {i // nics_per_node for i in st.failed_nics}:
        if all(node * nics_per_node + k in st.failed_nics for k in range(nics_per_node)):
            raise ConfigError(file, "stragglers.failed_nics", f"every NIC of node {node} is down: the node is cut off")
