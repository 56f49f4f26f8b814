"""Single-process training of the same model on the same data: the oracle for gradient parity.

One process, the unsharded model (one copy, whatever the schedule's chains), every
microbatch of every data-parallel replica on the whole sequence; the loss is their mean.
For the asynchronous schedules it applies the same stale updates the pipeline does
(``parsim.schedule.semantics.staleness_steps``: stage s computes on the weights of
``delay`` updates ago, the update goes to the newest), so its gradients step by step are
what the pipeline must produce; a synchronous schedule's delay is 0 (plain training).
"""
from __future__ import annotations

from collections import deque
from pathlib import Path

import torch

from parsim.config.scenario import Scenario
from parsim.schedule.semantics import staleness_steps, traits
from parsim.validate.model import build_stages, microbatch_data, set_token_dropping
from parsim.validate.params import params_by_kind


def _chain_len(sc: Scenario) -> int:
    return len(sc.layers_per_stage) // traits(sc.schedule.name).n_chains


def reference_steps(sc: Scenario, n_steps: int = 1, seed: int = 0, optimizer=None) -> list[tuple[float, dict]]:
    """Per step: (mean loss over all dp x m microbatches, {position: {parameter name: gradient}})."""
    from parsim.validate.optim import optimizer_factory

    tr, par = sc.training, sc.parallel
    n = sc.n_microbatches * par.dp
    stages = [set_token_dropping(st, sc.moe.drop_tokens) for st in
              build_stages(sc.model, sc.layers_per_stage[:_chain_len(sc)], tr.seq_len, tr.flash_attention, seed)]
    t = traits(sc.schedule.name)
    seen: set[int] = set()  # a tied embedding is one parameter of two stages: updated once
    params = [[p for p in st.parameters() if p.requires_grad and not (id(p) in seen or seen.add(id(p)))]
              for st in stages]
    make = optimizer or optimizer_factory(tr.optimizer)
    opts = [make(ps) for ps in params]
    # the weight version each stage computes on: ``delay`` updates old (PipeDream: p - s - 1; 2BW: 1)
    delays = [staleness_steps(t, par.pp, s) if t.weight_versions else 0 for s in range(len(stages))]
    hist = [deque([[p.data for p in ps]], maxlen=d + 1) for ps, d in zip(params, delays)]
    data = microbatch_data(sc.model, n, tr.microbatch_size, tr.seq_len, seed)
    out = []
    for _ in range(n_steps):
        for ps, h in zip(params, hist):
            for p, v in zip(ps, h[0]):
                p.data = v
        total = 0.0
        for tokens, targets in data:
            x = tokens
            for st in stages[:-1]:
                x = st(x)
            loss = stages[-1](x, targets)
            (loss / n).backward()
            total += float(loss.detach())
        grads = {s: {name: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                     for name, p in st.named_parameters() if p.requires_grad} for s, st in enumerate(stages)}
        out.append((total / n, grads))
        for ps, h, opt in zip(params, hist, opts):
            fresh = [v.clone() for v in h[-1]]
            for p, v in zip(ps, fresh):
                p.data = v
            opt.step()
            opt.zero_grad(set_to_none=True)
            h.append(fresh)
    return out


def reference_step(sc: Scenario, seed: int = 0) -> tuple[float, dict]:
    """(mean loss, {position: {name: gradient}}) of one step."""
    return reference_steps(sc, 1, seed)[0]


def expected_flat(ref: dict, entry: dict) -> torch.Tensor:
    """What one rank's reduction group must hold: the reference gradients of its parameters,
    cut to its tensor-parallel shards, flattened, padded; its ZeRO shard when sharded."""
    parts = []
    for name, dim, idx in entry["params"]:
        g = ref[name]
        if dim is not None:
            g = g.index_select(dim, torch.tensor(idx))
        parts.append(g.reshape(-1))
    flat = torch.cat(parts)
    size = entry["size"]
    flat = torch.nn.functional.pad(flat, (0, (-flat.numel()) % size))
    if entry["sharded"]:  # ZeRO: this rank's shard
        k = flat.numel() // size
        flat = flat[entry["index"] * k:(entry["index"] + 1) * k]
    else:
        flat = flat[:entry["grad"].numel()]
    return flat


def check_parity(sc: Scenario, out_dir, ranks: list[dict], variant: int = 0, seed: int = 0,
                 rtol: float = 1e-4, atol: float = 1e-6) -> dict:
    """Compare a parity run's losses and reduced gradients, step by step, with :func:`reference_steps`.

    Returns {"loss": (pipeline, reference) of the first step, "max_abs_diff": ...}; raises
    AssertionError on a mismatch.
    """
    n_steps = len(ranks[0]["steps"])
    refs = reference_steps(sc, n_steps, seed)
    par, chain = sc.parallel, _chain_len(sc)
    worst, first = 0.0, None
    for k, (ref_loss, ref) in enumerate(refs):
        losses = [x for r in ranks if r.get("tp_rank", 0) == 0 for x in r["steps"][k]["losses"]]
        assert len(losses) == sc.n_microbatches * par.dp * par.cp, f"step {k}: {len(losses)} losses"
        loss = sum(losses) / len(losses)
        assert abs(loss - ref_loss) <= rtol * abs(ref_loss) + atol, f"step {k}: loss {loss} != reference {ref_loss}"
        first = first or (loss, ref_loss)
        for r in ranks:
            saved = torch.load(Path(out_dir) / f"grads_rank{r['rank']}_v{variant}_s{k}.pt")
            for key, entry in saved.items():
                s = int(key.split(":")[0])
                got, want = entry["grad"], expected_flat(ref[s % chain], entry)
                assert got.shape == want.shape, f"step {k} {key}: shape {tuple(got.shape)} != {tuple(want.shape)}"
                worst = max(worst, float((got - want).abs().max()))
                torch.testing.assert_close(got, want, rtol=rtol, atol=atol,
                                           msg=lambda m: f"step {k} stage {key} rank {r['rank']}: {m}")
    return {"loss": first, "max_abs_diff": worst}


def ampnet_reference(sc: Scenario, orders: list[list[list]], seed: int = 0, weights: str = "now") -> list[dict]:
    """AMPNet in one process: each step replays, stage by stage, the order a message-driven run
    realized (``orders[step][stage]``: ``[(op, instance), ...]`` with op F, B or STEP).

    Every stage's results depend only on its own order and on the messages it receives, so
    any interleaving that respects the messages reproduces the run. ``weights``: "now" (AMPNet:
    a backward computes with the stage's current weights, updated in place since its forward)
    or "forward" (the weights the instance's forward used, loaded into the storage for its
    backward, as weight stashing would keep them: a negative control). The optimizer state and the gradients of backwards not yet
    applied carry over from step to step, as in the run. Per step: {"losses": per instance in
    the last stage's forward order, "updates": {stage: {kind: [flat gradient per update]}},
    "params": {stage: {kind: flat parameters after the step}}}."""
    from parsim.validate.optim import optimizer_factory

    if weights not in ("now", "forward"):
        raise ValueError(f"weights must be 'now' or 'forward', got {weights!r}")
    tr = sc.training
    m = sc.n_microbatches
    stages = build_stages(sc.model, sc.layers_per_stage, tr.seq_len, tr.flash_attention, seed)
    for st in stages:
        set_token_dropping(st, sc.moe.drop_tokens)
    make = optimizer_factory(tr.optimizer)
    kinds = [params_by_kind(st) for st in stages]  # the runtime's flat layout, kind by kind
    # the optimizer steps aliases of each parameter's storage (own version counters), as the runtime does
    aliases = [{k: [torch.nn.Parameter(p.data) for p in ps] for k, ps in ks.items()} for ks in kinds]
    opts = [{k: make(a) for k, a in al.items()} for al in aliases]
    params = [[p for ps in ks.values() for p in ps] for ks in kinds]
    live = [[a for al in als.values() for a in al] for als in aliases]  # writes that autograd does not version
    data = microbatch_data(sc.model, m, tr.microbatch_size, tr.seq_len, seed)
    n_stages, out = len(stages), []
    for step_orders in orders:
        if len(step_orders) != n_stages:
            raise ValueError(f"{len(step_orders)} stage orders for {n_stages} stages")
        fwd, bwd, kept = {}, {}, {}  # (stage, instance) -> output sent on / input gradient sent back / (x, out)
        losses, updates = [], {s: {k: [] for k in kinds[s]} for s in range(n_stages)}
        at = [0] * n_stages
        while any(at[s] < len(step_orders[s]) for s in range(n_stages)):
            moved = False
            for s in range(n_stages):
                if at[s] == len(step_orders[s]):
                    continue
                op, j = step_orders[s][at[s]]
                last = s == n_stages - 1
                if op == "F" and (s == 0 or (s - 1, j) in fwd):
                    x = data[j][0] if s == 0 else fwd.pop((s - 1, j)).detach().requires_grad_(True)
                    y = stages[s](x, data[j][1]) if last else stages[s](x)
                    if last:
                        losses.append(float(y.detach()))
                        y = y * (1.0 / m)  # the runtime's loss scale, to the bit
                    else:
                        fwd[(s, j)] = y.detach()
                    kept[(s, j)] = (x, y, [p.detach().clone() for p in params[s]] if weights == "forward" else None)
                elif op == "B" and (last or (s + 1, j) in bwd):
                    x, y, stashed = kept.pop((s, j))
                    if stashed is not None:  # the forward's weights into the storage for this backward
                        now = [p.detach().clone() for p in params[s]]
                        _load(live[s], stashed)
                    torch.autograd.backward(y, None if last else bwd.pop((s + 1, j)))
                    if stashed is not None:
                        _load(live[s], now)
                    if s > 0:
                        bwd[(s, j)] = x.grad
                elif op == "STEP":
                    for k, ps in kinds[s].items():
                        updates[s][k].append(torch.cat([p.grad.reshape(-1) if p.grad is not None
                                                        else torch.zeros(p.numel()) for p in ps]))
                        for p, a in zip(ps, aliases[s][k]):
                            a.grad = p.grad if p.grad is not None else torch.zeros_like(p)
                        opts[s][k].step()
                        for p in ps:
                            p.grad = None
                else:
                    continue  # its message is not there yet
                at[s] += 1
                moved = True
            if not moved:
                raise ValueError("the stage orders wait on each other: not a realizable message-driven run")
        out.append({"losses": losses, "updates": updates,
                    "params": {s: {k: torch.cat([p.detach().reshape(-1) for p in ps]) for k, ps in kinds[s].items()}
                               for s in range(n_stages)}})
    return out


def _load(aliases: list, values: list) -> None:
    with torch.no_grad():
        for a, v in zip(aliases, values):
            a.copy_(v)


def check_ampnet_parity(sc: Scenario, out_dir, ranks: list[dict], variant: int = 0, seed: int = 0,
                        rtol: float = 1e-4, atol: float = 1e-6, weights: str = "now") -> dict:
    """Compare a message-driven parity run (``ampnet_rank<R>_v<variant>_s<k>.pt``: the realized
    order, the losses, every update's gradients and the parameters after each step) with
    :func:`ampnet_reference` replaying the same orders. Returns {"max_abs_diff", "updates",
    "orders"}; raises AssertionError on a mismatch."""
    by_stage = {r["pp_rank"]: r for r in ranks}
    n_steps = len(ranks[0]["steps"])
    saved = [[torch.load(Path(out_dir) / f"ampnet_rank{by_stage[s]['rank']}_v{variant}_s{k}.pt")
              for s in sorted(by_stage)] for k in range(n_steps)]
    orders = [[[tuple(x) for x in st["order"]] for st in step] for step in saved]
    ref = ampnet_reference(sc, orders, seed, weights)
    worst, n_updates = 0.0, 0
    for k, (got, want) in enumerate(zip(saved, ref)):
        torch.testing.assert_close(torch.tensor(got[-1]["losses"]), torch.tensor(want["losses"]), rtol=rtol, atol=atol,
                                   msg=lambda msg: f"step {k}: losses: {msg}")
        for s, g in enumerate(got):
            for kind, flats in g["updates"].items():
                exp = want["updates"][s][kind]
                assert len(flats) == len(exp), f"step {k} stage {s}: {len(flats)} updates, reference {len(exp)}"
                for u, (a, b) in enumerate(zip(flats, exp)):
                    worst = max(worst, float((a - b).abs().max()))
                    torch.testing.assert_close(a, b, rtol=rtol, atol=atol,
                                               msg=lambda msg: f"step {k} stage {s} update {u}: {msg}")
                n_updates += len(flats)
                a, b = g["params"][kind], want["params"][s][kind]
                worst = max(worst, float((a - b).abs().max()))
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol,
                                           msg=lambda msg: f"step {k} stage {s} parameters: {msg}")
    return {"max_abs_diff": worst, "updates": n_updates, "orders": orders}
