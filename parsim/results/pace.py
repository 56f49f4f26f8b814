"""Which rank sets the pace of a job with stragglers (``[stragglers]``)."""
from __future__ import annotations

import statistics

from parsim.config.scenario import Scenario
from parsim.sim.stragglers import gpu_slowdowns, rank_factors, rank_gpus


def pace_setter(sc: Scenario, mx: dict, busy_ratio: dict | None = None) -> dict:
    """The (replica, pipeline rank) whose compute is longest: replica 0's busy time of that
    rank (replica 0 is the one recorded) x its slowdown relative to replica 0's (``busy_ratio``:
    replicas on another GPU type, their compute over replica 0's, counted as a slowdown). Its
    GPUs, its slowdown, its busy time, and how much longer than the median pipeline rank it is busy."""
    par = sc.parallel
    factors = rank_factors(par, gpu_slowdowns(sc.stragglers, sc.hardware.gpus_per_node, sc.gpus))
    for key, r in (busy_ratio or {}).items():  # replicas on another GPU type: their busy time over replica 0's
        factors[key] = factors.get(key, 1.0) * r
    busy = {s["rank"]: s["busy_s"] for s in mx["stages"]}
    # replica 0's ranks as recorded, and every slow rank elsewhere scaled from its replica-0 twin
    cands = [(b, 0, r) for r, b in busy.items()]
    cands += [(busy[r] * f / factors.get((0, r), 1.0), rep, r) for (rep, r), f in factors.items() if rep != 0]
    t, rep, rank = max(cands, key=lambda c: (c[0], -c[1], -c[2]))
    median = statistics.median(busy.values())
    return {"replica": rep, "rank": rank, "gpus": rank_gpus(par, rep, rank),
            "slowdown": factors.get((rep, rank), 1.0), "busy_s": t,
            "busy_over_median": t / median if median > 0 else 1.0}
