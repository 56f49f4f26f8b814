"""Automatic stage partitioning: layers -> stages balancing time under a memory limit.

``[schedule] partition = "balanced"`` asks for it (``"even"``, the default, splits the
blocks as evenly as possible; ``layers_per_stage = [..]`` gives the split explicitly).

:func:`balanced_partition` is a dynamic program over contiguous splits of the layers:
it minimises the largest stage time, where a stage's time is the sum of its layers'
F + B times plus the embedding on the first stage and the LM head and loss on the last
(DESIGN §4: they are real work), subject to every stage's memory (model states of its
layers plus its activation stash times the microbatches it keeps in flight under the
schedule) fitting in the device's usable memory. If no split fits, it returns the
fastest split regardless of memory (the result then reports the overflow). O(S·L²).

:func:`balanced_layers` reads those inputs from the cost model of a scenario (one
stage per rank, one chain: ``vpp = 1``).
"""
from __future__ import annotations

from collections.abc import Sequence

from parsim.errors import ConfigError


def prefix_sums(xs: Sequence[float]) -> list[float]:
    out = [0.0]
    for x in xs:
        out.append(out[-1] + x)
    return out


def balanced_partition(
    layer_time: Sequence[float],
    n_stages: int,
    first_extra: float = 0.0,
    last_extra: float = 0.0,
    layer_mem: Sequence[Sequence[float]] | None = None,
    stage_mem_extra: Sequence[float] | None = None,
    mem_limit: float | None = None,
) -> tuple[int, ...]:
    """Layers per stage minimising the slowest stage (see the module doc).

    ``layer_mem[s][l]``: bytes layer l costs when placed on stage s (its model states
    plus its stash times stage s's in-flight microbatches); ``stage_mem_extra[s]``: the
    embedding/head bytes of stage s.
    """
    n = len(layer_time)
    if not 1 <= n_stages <= n:
        raise ValueError(f"cannot split {n} layers into {n_stages} stages")
    t = prefix_sums(layer_time)
    mems = [prefix_sums(row) for row in layer_mem] if layer_mem is not None else None
    for limit in ((mem_limit, None) if mem_limit is not None and mems is not None else (None,)):
        split = _dp(t, n, n_stages, first_extra, last_extra, mems, stage_mem_extra, limit)
        if split is not None:
            return split
    raise AssertionError("unreachable: without a memory limit every split is feasible")


def _dp(t, n, S, first_extra, last_extra, mems, extra_mem, limit):
    INF = float("inf")
    best = [[INF] * (n + 1) for _ in range(S + 1)]
    cut = [[0] * (n + 1) for _ in range(S + 1)]
    best[0][0] = 0.0
    for s in range(1, S + 1):
        extra = (first_extra if s == 1 else 0.0) + (last_extra if s == S else 0.0)
        lo_j = s
        hi_j = n - (S - s)
        for j in range(lo_j, hi_j + 1):
            for i in range(s - 1, j):
                prev = best[s - 1][i]
                if prev == INF:
                    continue
                if limit is not None:
                    m = mems[s - 1][j] - mems[s - 1][i] + (extra_mem[s - 1] if extra_mem else 0.0)
                    if m > limit:
                        continue
                cost = max(prev, t[j] - t[i] + extra)
                if cost < best[s][j]:
                    best[s][j], cut[s][j] = cost, i
    if best[S][n] == INF:
        return None
    out, j = [], n
    for s in range(S, 0, -1):
        i = cut[s][j]
        out.append(j - i)
        j = i
    return tuple(reversed(out))


def balanced_layers(sc) -> tuple[int, ...]:
    """The balanced split for a scenario (its cost model and schedule's in-flight counts)."""
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.layer import activation_options, layer_cost
    from parsim.costs.memory import layer_activation_bytes, model_state_bytes
    from parsim.costs.model_costs import ModelCosts
    from parsim.costs.stage import block_inputs, layer_kind
    from parsim.model import layer_params
    from parsim.schedule import build, peak_in_flight
    from parsim.schedule.ir import Op

    par, tr = sc.parallel, sc.training
    if par.vpp != 1:
        raise ConfigError(sc.file, "schedule.partition",
                          "balanced partitioning needs one stage per rank (vpp = 1); give layers_per_stage instead")
    costs = ModelCosts(cost_inputs(sc))
    inp = costs.layer_inputs
    n = sc.model.n_layers
    per_layer = []
    for li in range(n):
        lc = layer_cost(*block_inputs(inp, layer_kind(sc.model, li)))
        f, i, w = lc.forward, lc.backward_input, lc.backward_weight
        rec = f.total if tr.recompute == "full" else 0.0
        per_layer.append(f.total + i.total + w.total + rec)
    first, last = costs.stages[0], costs.stages[-1]
    total = lambda st: st.parts[Op.F].total + st.parts[Op.B].total
    first_extra = total(first) - sum(per_layer[li] for li in first.layers)
    last_extra = total(last) - sum(per_layer[li] for li in last.layers)
    if par.pp == 1:
        return (n,)
    in_flight = peak_in_flight(build(sc.schedule.name, par.pp, sc.n_microbatches, 1))
    b, seq = tr.microbatch_size, tr.seq_len // par.cp
    opts = activation_options(inp)
    act = [layer_activation_bytes(sc.model, seq, b, par.tp, opts, li) for li in range(n)]
    state = []
    for li in range(n):
        ms = model_state_bytes(layer_params(sc.model, li) / par.tp, par.shard_degree, par.zero, tr.optimizer, tr.precision)
        state.append(ms.params + ms.grads + ms.optimizer)
    layer_mem = [[state[li] + act[li] * in_flight[s] for li in range(n)] for s in range(par.pp)]
    extra_mem = [0.0] * par.pp
    return balanced_partition(per_layer, par.pp, max(0.0, first_extra), max(0.0, last_extra),
                              layer_mem, extra_mem, sc.hardware.device.usable_memory_bytes)
