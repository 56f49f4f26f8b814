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
    params = [[p for p in st.parameters() if p.requires_grad] for st in stages]
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
