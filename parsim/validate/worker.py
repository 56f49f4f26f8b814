"""One rank of a validation run: ``python -m parsim.validate.worker JOB.json``.

Reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT (set by
:mod:`parsim.validate.launch` or by torchrun), rebuilds the same scaled scenario and
lowered schedule as the simulator, runs warm-up and measured steps, and writes
``rank<R>.json`` (spans per step, activation memory, losses) into the job's folder;
in parity mode also ``grads_rank<R>_v<variant>_s<step>.pt``: per reduction group of each
stage, the reduced gradients before the optimizer step with the names and tensor-parallel
shards of the parameters they belong to (``parsim.validate.reference`` checks them).
"""
from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from parsim.costs.slices import slice_lengths
from parsim.schedule.ir import Op
from parsim.schedule.semantics import traits
from parsim.simulate import ampnet_keys, schedule_for
from parsim.validate.bench import probe
from parsim.validate.comm import Group
from parsim.validate.layout import all_groups
from parsim.validate.messages import MessageDrivenRuntime
from parsim.validate.model import (
    build_stages,
    microbatch_data,
    set_recompute,
    set_recompute_modules,
    set_token_dropping,
)
from parsim.validate.optim import optimizer_factory
from parsim.validate.probe import stage_activation_bytes
from parsim.validate.ring import zigzag_positions
from parsim.validate.runtime import Layout, RankRuntime
from parsim.validate.scale import early_recv, prepare
from parsim.validate.shard import dense_local_ties, shard_descriptor, shard_stage
from parsim.validate.tensor_parallel import Par
from parsim.validate.timing import join_group, start_worker

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_p2p_order(sched) -> None:
    """NCCL matches p2p by order per peer pair: SEND order on src must equal RECV order on dst."""
    sends: dict[tuple, list] = {}
    recvs: dict[tuple, list] = {}
    for r, row in enumerate(sched.actions):
        for a in row:
            if a.op in (Op.SEND_F, Op.SEND_B):
                dst = a.stage + 1 if a.op is Op.SEND_F else a.stage - 1
                sends.setdefault((r, sched.rank_of(dst)), []).append((dst, a.op.value[-1], a.microbatch))
            elif a.op in (Op.RECV_F, Op.RECV_B):
                src = a.stage - 1 if a.op is Op.RECV_F else a.stage + 1
                recvs.setdefault((sched.rank_of(src), r), []).append((a.stage, a.op.value[-1], a.microbatch))
    for pair, order in sends.items():
        if recvs.get(pair) != order:
            raise RuntimeError(f"nccl: sends from pipeline rank {pair[0]} to {pair[1]} are not received in the "
                               "order they are sent (NCCL matches p2p by order); cannot run this schedule on nccl")


def main(job_file: str) -> int:
    job, rank, world, local = start_worker(job_file)
    device = join_group(job, rank, world, local, default_timeout_s=120)
    variants = job.get("variants") or [job.get("overrides") or []]
    results = [run_variant(job, overrides, rank, world, device, i) for i, overrides in enumerate(variants)]
    out = results[0] if not job.get("variants") else {"rank": rank, "variants": results}
    (Path(job["out"]) / f"rank{rank}.json").write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def make_groups(par, rank: int, n_chains: int, backend: str, tied: bool = False) -> dict:
    """Create every group of every kind on this process (all ranks, same order); keep its own."""
    mine = {}
    for kind, groups in all_groups(par, n_chains, tied).items():
        stream = {"grad": "dp", "edp": "dp", "tied": "dp"}.get(kind, kind)
        for ranks in groups:
            pg = dist.new_group(ranks) if len(ranks) > 1 else None
            if rank in ranks:
                mine[kind] = Group(tuple(ranks), ranks.index(rank), pg, stream)
    if "edp" not in mine and "grad" in mine:
        # ep = 1: every dp x cp rank holds every expert, so the experts' gradients are reduced
        # over the dense gradients' ranks (all_groups makes no separate edp groups then)
        mine["edp"] = mine["grad"]
    return mine


def run_variant(job: dict, overrides: list, rank: int, world: int, device, index: int) -> dict:
    """Prepare the scenario with ``overrides``, build groups, run it on this rank."""
    sc = prepare(job["scenario"], overrides, job["backend"], job.get("profile"))
    sched = schedule_for(sc, early_recv=early_recv(job))
    par = sc.parallel
    if world != par.world_size:
        raise SystemExit(f"world size {world} != dp*tp*pp*cp = {par.world_size} ({sc.file} with {overrides})")
    if job["backend"] == "nccl":
        check_p2p_order(sched)
    lay = Layout(par, rank, device, DTYPES[sc.training.precision], job["backend"])
    lay.groups = make_groups(par, rank, sched.n_chains, job["backend"], sc.model.tied_embeddings)
    return run({**job, "variant": index}, sc, sched, lay)


def local_data(sc, lay: Layout, n: int, seed: int) -> list[tuple]:
    """This rank's microbatches: its data-parallel replica's, its zig-zag part of the sequence."""
    tr, spec, c, par = sc.training, sc.model, lay.c, sc.parallel
    data = microbatch_data(spec, n * par.dp, tr.microbatch_size, tr.seq_len, seed)
    data = data[c.dp * n:(c.dp + 1) * n]
    if par.cp > 1:
        pos = zigzag_positions(tr.seq_len, par.cp, c.cp)
        data = [(t[:, pos].contiguous(), y[:, pos].contiguous()) for t, y in data]
    return [(t.to(lay.device), y.to(lay.device)) for t, y in data]


def activation_shape(sc) -> tuple[int, int, int]:
    """What crosses a stage boundary: (microbatch, this rank's tokens of the sequence, d_model)."""
    tr, par = sc.training, sc.parallel
    seq = tr.seq_len // par.cp // (par.tp if par.sequence_parallel and par.tp > 1 else 1)
    return (tr.microbatch_size, seq, sc.model.d_model)


def build_local(sc, sched, lay: Layout, seed: int) -> dict:
    """This rank's stages, cut from the full model and wired to its groups."""
    tr, par = sc.training, sc.parallel
    full = build_stages(sc.model, sc.layers_per_stage, tr.seq_len, tr.flash_attention, seed, lay.dtype,
                        chain_len=sched.chain_len)
    g = lay.groups
    px = Par(tp=g.get("tp") if par.tp > 1 else None, sp=par.sequence_parallel and par.tp > 1,
             cp=g.get("cp") if par.cp > 1 else None, ep=g.get("ep") if par.ep > 1 else None)
    mine, memo = {}, {}
    for s in sched.stages_of(lay.pp_rank):
        mine[s] = set_token_dropping(shard_stage(full[s], px, tr.seq_len, memo), sc.moe.drop_tokens).to(lay.device)
        if tr.recompute == "full" and not traits(sc.schedule.name).remat:  # GPipeRemat reruns the stage already
            set_recompute(mine[s], tr.recompute_method or "uniform", tr.recompute_num_layers or 1)
        elif tr.recompute == "selective":  # the modules the runtime builds (scale.runtime_training)
            set_recompute_modules(mine[s], tr.recompute_modules_)
    dense_local_ties(mine.values())
    return mine


def run(job: dict, sc, sched, lay: Layout) -> dict:
    tr = sc.training
    seed = int(job.get("seed", 0))
    mine = build_local(sc, sched, lay, seed)
    n = sched.n_microbatches // sched.n_slices  # TeraPipe: units are (microbatch, token slice)
    data = local_data(sc, lay, n, seed)
    lengths = slice_lengths(sc)[0] if sched.n_slices > 1 else None
    act_shape = activation_shape(sc)
    memory = {}
    if job.get("mode", "time") == "time":
        for s, st in mine.items():  # every rank of a tp/cp/ep group probes the same stages together
            x = data[0][0] if st.first else torch.randn(act_shape, dtype=lay.dtype, device=lay.device)
            memory[str(s)] = stage_activation_bytes(st, x, data[0][1] if st.last else None)
    routed_counts(mine)  # the memory probe's forwards are not the run's routing
    parity = job.get("mode") == "parity"
    common = {"schedule": sched, "stages": mine, "layout": lay, "data": data, "act_shape": act_shape,
              "zero": sc.parallel.zero, "opt_factory": optimizer_factory(tr.optimizer), "fault": job.get("fault"),
              "keep_grads": parity}
    if traits(sc.schedule.name).message_driven:  # AMPNet: the order is what the messages make it
        mif, every = ampnet_keys(sc)
        rt = MessageDrivenRuntime(**common, max_in_flight=mif, update_every=every)
    else:
        rt = RankRuntime(**common, slice_lengths=lengths)
    steps = []
    n_steps = int(job.get("parity_steps", 1)) if parity else int(job.get("warmup", 2)) + int(job.get("steps", 5))
    speed_probe = None if parity else probe(lay.device, lay.dtype)
    for k in range(n_steps):
        dist.barrier()
        faults = _minor_faults()
        st = rt.run_step()
        # page faults taken during the step (allocator churn: a CPU-run artefact worth seeing)
        steps.append({**rt.timer.export(), "losses": st.losses, "minor_faults": _minor_faults() - faults})
        routed = routed_counts(mine)
        if routed:
            steps[-1]["moe_routed"] = routed
        if speed_probe is not None:  # how fast the device runs now, timed as calibration timed it
            dist.barrier()
            steps[-1]["probe_s"] = speed_probe()
        if rt.message_driven:
            steps[-1]["order"] = st.order
        if parity and rt.message_driven:
            (s,) = mine
            torch.save({"order": st.order, "losses": st.losses,
                        "updates": {fp.kind: [g.cpu() for g in st.update_grads.get(fp.kind, [])] for fp in rt.flat[s]},
                        "params": {fp.kind: fp.flat_params()[:fp.numel].detach().cpu() for fp in rt.flat[s]}},
                       Path(job["out"]) / f"ampnet_rank{lay.rank}_v{job.get('variant', 0)}_s{k}.pt")
        elif parity:
            torch.save({f"{s}:{fp.kind}": {"grad": st.grads[(s, fp.kind)].cpu(), "size": fp.size, "index": fp.index,
                                            "sharded": sc.parallel.zero >= 1,
                                            "params": shard_descriptor(mine[s], fp.params)}
                        for s in mine for fp in rt.flat[s]},
                       Path(job["out"]) / f"grads_rank{lay.rank}_v{job.get('variant', 0)}_s{k}.pt")
    c = lay.c
    return {"rank": lay.rank, "pp_rank": c.pp, "dp_rank": c.dp, "tp_rank": c.tp, "cp_rank": c.cp,
            "host": socket.gethostname(), "warmup": 0 if parity else int(job.get("warmup", 2)), "steps": steps,
            "memory": memory, "device": str(lay.device), "threads": torch.get_num_threads()}


def routed_counts(stages: dict) -> dict[str, list[list[int]]]:
    """Per stage, per MoE block (in layer order), this rank's top-k assignments per expert (before
    capacity dropping) over the step's forward calls; the blocks' records are cleared."""
    out = {}
    for s, st in stages.items():
        rows = []
        for blk in st.blocks:
            moe = getattr(blk, "moe", None)
            if moe is None:
                continue
            counts = [0] * moe.n_experts
            for e in moe.routed:
                for j, c in enumerate(torch.bincount(e, minlength=moe.n_experts).tolist()):
                    counts[j] += c
            rows.append(counts)
            moe.routed.clear()
        if rows:
            out[str(s)] = rows
    return out


def _minor_faults() -> int:
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError):
        return 0


if __name__ == "__main__":
    from parsim.validate.launch import die_with_launcher

    die_with_launcher()
    sys.exit(main(sys.argv[1]))
