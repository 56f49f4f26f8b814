"""The ``[offload]`` table applied to a job's ops and memory (:mod:`parsim.costs.offload` has
the physics): the STEP becomes gradient copy, (NVMe swap,) CPU-Adam and parameter copy;
F and B fetch offloaded parameters and move activation checkpoints; the model states that
left the GPU are counted on the host or NVMe instead."""
from __future__ import annotations

from dataclasses import replace

from parsim.cluster.precision import PRECISION_TABLE
from parsim.costs.memory import state_bytes_per_param
from parsim.costs.offload import CPU_ADAM_STATE_BYTES, Tiers, fetch_params_s, step_plan, tier_bytes, tiers
from parsim.schedule.ir import Op
from parsim.sim.engine import OpCost


def job_tiers(inputs) -> Tiers:
    """What one GPU sees behind it when every GPU of its node offloads."""
    par = inputs.parallel
    return tiers(inputs.hardware, min(par.world_size, inputs.hardware.gpus_per_node))


def _shard(inputs, params: float) -> float:
    par = inputs.parallel
    return params / (par.shard_degree if par.zero >= 1 else 1)


def stage_ops(costs, stage: int, ops: dict[Op, OpCost]) -> dict[Op, OpCost]:
    """``ops`` of ``stage`` with the offload's transfers and CPU work as phases."""
    inp = costs.inputs
    off = inp.offload
    t = job_tiers(inp)
    st = costs.stage_costs[stage]
    tr = inp.training
    w, g, k = state_bytes_per_param(tr.optimizer, tr.precision)
    shard = _shard(inp, st.params)
    out = dict(ops)
    back = Op.B if Op.B in ops else Op.I
    backward_s = sum(ops[o].duration_s for o in (Op.B, Op.I, Op.W) if o in ops)
    compute_s = (ops[Op.F].duration_s + backward_s) * inp.n_microbatches if Op.F in ops else 0.0
    if off.optimizer != "none" and Op.STEP in ops:
        step = ops[Op.STEP]
        plan = step_plan(off=off, t=t, shard_params=shard, weight_bytes=w, grad_bytes=g, state_bytes=k,
                         gpu_update_s=step.duration_s, backward_s=ops[back].duration_s if back in ops else 0.0,
                         compute_s=compute_s)
        out[Op.STEP] = replace(step, duration_s=plan.duration_s, phases=step.phases + plan.phases)
    if off.params != "none":
        fetch = fetch_params_s(off=off, t=t, shard_bytes=w * shard)
        for op in (Op.F, back):
            if op in out:  # prefetched layer by layer under the op's compute: the longer of the two
                c = out[op]
                out[op] = replace(c, duration_s=max(c.duration_s, fetch),
                                  phases=c.phases + ((t.host_link_name, "H2D_PARAMS", 0.0, fetch, w * shard),))
    if off.activations == "cpu" and Op.F in out and back in out:
        f, b = out[Op.F], out[back]
        stash, held = offloaded_stash(off, f.stash_bytes, st.n_layers, st.ends_activation_bytes)
        copy = stash / t.host_link
        out[Op.F] = replace(f, stash_bytes=f.stash_bytes - stash, duration_s=max(f.duration_s, copy),
                            transient_bytes=f.transient_bytes + held,
                            phases=f.phases + ((t.host_link_name, "D2H_ACTS", 0.0, copy, stash),))
        out[back] = replace(b, free_bytes=max(0.0, b.free_bytes - stash), duration_s=max(b.duration_s, copy),
                            transient_bytes=b.transient_bytes + held,
                            phases=b.phases + ((t.host_link_name, "H2D_ACTS", 0.0, copy, stash),))
    return out


def offloaded_stash(off, stash: float, n_layers: int, ends: float = 0.0) -> tuple[float, float]:
    """(bytes of a microbatch's stash that go to the host, bytes of them on the GPU at once while
    they move). The whole stash (DeepSpeed's checkpoint offload) is all on the GPU until the
    forward ends and again from the start of the backward. Block by block
    (``activation_layers``, Megatron/TE): of a stage of n blocks (whose stash is the stage's less
    ``ends``, the embedding's and the head's, which stay), k blocks' go, two of them at a time on
    the GPU (the block computing and the one in flight: TE's double buffering)."""
    if off.activation_layers is None or n_layers <= 0:
        return stash, stash
    k = min(off.activation_layers, n_layers)
    per_block = max(0.0, stash - ends) / n_layers
    return k * per_block, min(k, 2) * per_block


def model_states(costs, stages: list[int], states: dict) -> dict:
    """A pipeline rank's GPU model states with the offloaded parts removed."""
    inp = costs.inputs
    off = inp.offload
    r = off.optimizer_ratio if off.optimizer != "none" else 0.0
    out = dict(states)
    out["optimizer"] = states["optimizer"] * (1.0 - r)
    out["grads"] = states["grads"] * (1.0 - r)
    if off.params != "none":
        w = PRECISION_TABLE[inp.training.precision].weight_bytes
        unit = max((costs.stage_costs[s].params / max(1, costs.stage_costs[s].n_layers) for s in stages), default=0.0)
        out["params"] = min(states["params"], 2 * w * unit)  # the layer computing and the one prefetched
    return out


def tier_bytes_per_node(costs, stage_to_rank: tuple[int, ...]) -> tuple[float, float]:
    """(host bytes, NVMe bytes) one node holds: its GPUs' offloaded states and checkpoints."""
    inp = costs.inputs
    tr = inp.training
    w, _, k = state_bytes_per_param(tr.optimizer, tr.precision)
    k_host = max(k, CPU_ADAM_STATE_BYTES - 4)  # fp32 master, m, v (12) at least, as CPU-Adam keeps them
    per_rank = []
    for rank in range(inp.parallel.pp):
        stages = [s for s, r in enumerate(stage_to_rank) if r == rank]
        shard = _shard(inp, sum(costs.stage_costs[s].params for s in stages))
        acts = sum(offloaded_stash(inp.offload, st.activation_bytes, st.n_layers, st.ends_activation_bytes)[0]
                   for st in (costs.stage_costs[s] for s in stages)) * min(inp.n_microbatches, inp.parallel.pp)
        tb = tier_bytes(off=inp.offload, shard_params=shard, weight_bytes=w, state_bytes=k_host,
                        activation_bytes=acts if inp.offload.activations == "cpu" else 0.0)
        per_rank.append(tb)
    gpus = min(inp.parallel.world_size, inp.hardware.gpus_per_node)
    host = sum(tb.host for tb in per_rank) / len(per_rank) * gpus
    nvme = sum(tb.nvme for tb in per_rank) / len(per_rank) * gpus
    return host, nvme
