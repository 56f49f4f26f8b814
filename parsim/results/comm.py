"""Bytes by parallel axis: what one GPU of the representative replica sends per step (mean over
pipeline ranks), from the cost model's own accounting of each (stage, op) joined with the
spans that ran. Collectives count nccl-tests' bus bytes (ring all-reduce 2(n-1)/n of the
buffer, reduce-scatter / all-gather / all-to-all (n-1)/n); the context-parallel ring counts
the K/V blocks passed on; pipeline sends their activations."""
from __future__ import annotations

import pandas as pd

from parsim.costs.parts import AXES


def bytes_by_axis(tl: pd.DataFrame, sent: pd.DataFrame, pp: int) -> dict[str, float]:
    """``pp``, ``dp``, ``dp_buffer`` (the data-parallel buffers, not what is sent), ``tp``, ``cp``, ``ep``."""
    spans = pd.DataFrame({"stage": tl["stage"].to_numpy(), "op": tl["op"].astype(str).to_numpy()})
    j = spans.merge(sent, on=["stage", "op"], how="left").fillna(0.0)
    axis = {a: float(j[a].sum()) / pp for a in AXES}
    dp_buffer = float(tl.loc[tl["stream"] == "dp", "bytes"].sum()) / pp
    return {"pp": axis["pp"], "dp": axis["dp"], "dp_buffer": dp_buffer, "tp": axis["tp"], "cp": axis["cp"],
            "ep": axis["ep"]}


def collective_algorithms(sc) -> dict[str, dict]:
    """The collective each parallel axis runs most, at its size, and the algorithm chosen for
    it (``parsim.cluster.collectives.select_algorithm``, NCCL's tuner as modelled): ``kind``,
    ``bytes`` (the buffer), ``ranks`` (group size), ``algorithm``, ``time_s``. Axes of degree 1
    are left out. tp: one layer's activation (all-reduce; reduce-scatter with sequence
    parallelism); dp: one gradient bucket (all-reduce; reduce-scatter with ZeRO >= 1, over the
    shard group); cp: the K/V block passed per ring step (or the all-gather / all-to-all of
    ``parallel.cp_comm``); ep: one microbatch's dispatch all-to-all."""
    from parsim.cluster.collectives import grad_bucket_bytes, select_algorithm
    from parsim.cluster.precision import PRECISION_TABLE
    from parsim.costs.inputs import rank_groups

    par, m, tr, hw = sc.parallel, sc.model, sc.training, sc.hardware
    groups = rank_groups(par)
    act = PRECISION_TABLE[tr.precision].activation_bytes  # GEMM outputs, K/V and dispatched tokens: 16-bit under FP8
    tokens = tr.microbatch_size * tr.seq_len // par.cp
    wanted = []
    if par.tp > 1:
        wanted.append(("tp", "reduce_scatter" if par.sequence_parallel else "all_reduce",
                       tokens * m.d_model * act, list(groups.tp)))
    if par.grad_degree > 1:  # dense gradients sum over dp x cp (groups.dp)
        n_s = par.shard_degree if par.zero >= 1 else par.grad_degree
        wanted.append(("dp", "reduce_scatter" if par.zero >= 1 else "all_reduce",
                       grad_bucket_bytes(sc.overlap.bucket_bytes, par.grad_degree, par.grad_bytes(tr.precision)),
                       list(groups.dp)[:n_s]))
    if par.cp > 1:
        kv = 2 * tokens * m.n_kv_heads * m.head_dim_ * act / par.tp
        kind = {"p2p": "p2p", "all_gather": "all_gather", "a2a": "all_to_all"}.get(par.cp_comm, "p2p")
        wanted.append(("cp", kind, kv * (par.cp if kind == "all_gather" else 1), list(groups.cp)))
    if par.ep > 1 and m.is_moe:
        from parsim.costs.moe import ep_group_ranks
        etp = (sc.moe.expert_tp if sc.moe is not None else None) or par.tp
        per = tokens * m.top_k * m.d_model * act / (par.tp if par.sequence_parallel else 1)
        wanted.append(("ep", "all_to_all", per, ep_group_ranks(par, etp)))
    out = {}
    for axis, kind, nbytes, ranks in wanted:
        if len(ranks) <= 1 or nbytes <= 0:
            continue
        if kind == "p2p":
            ranks = ranks[:2]
        algo, t = select_algorithm(hw, kind, nbytes, ranks)
        out[axis] = {"kind": kind, "bytes": float(nbytes), "ranks": len(ranks), "algorithm": algo, "time_s": t}
    return out
