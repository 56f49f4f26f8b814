"""Single-process training of the same model on the same data: the oracle for gradient parity."""
from __future__ import annotations

import torch

from parsim.config.scenario import Scenario
from parsim.validate.model import build_stages, microbatch_data


def reference_step(sc: Scenario, seed: int = 0) -> tuple[float, dict[int, torch.Tensor]]:
    """(mean loss over all dp x m microbatches, {stage: flat gradient}) of one step, one process."""
    tr, par = sc.training, sc.parallel
    n = sc.n_microbatches * par.dp
    stages = build_stages(sc.model, sc.layers_per_stage, tr.seq_len, tr.flash_attention, seed)
    total = 0.0
    for tokens, targets in microbatch_data(sc.model, n, tr.microbatch_size, tr.seq_len, seed):
        x = tokens
        for st in stages[:-1]:
            x = st(x)
        loss = stages[-1](x, targets)
        (loss / n).backward()
        total += float(loss.detach())
    grads = {}
    for s, st in enumerate(stages):
        ps = [p for p in st.parameters() if p.requires_grad]
        grads[s] = torch.cat([p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel()) for p in ps])
    return total / n, grads


def check_parity(sc: Scenario, out_dir, ranks: list[dict], variant: int = 0, seed: int = 0,
                 rtol: float = 1e-4, atol: float = 1e-6) -> dict:
    """Compare a parity run's losses and reduced gradients with :func:`reference_step`.

    Returns {"loss": (pipeline, reference), "max_abs_diff": ...}; raises AssertionError on mismatch.
    """
    from pathlib import Path

    ref_loss, ref = reference_step(sc, seed)
    par = sc.parallel
    losses = [x for r in ranks for x in r["steps"][0]["losses"]]
    assert len(losses) == sc.n_microbatches * par.dp, f"{len(losses)} losses"
    loss = sum(losses) / len(losses)
    assert abs(loss - ref_loss) <= rtol * abs(ref_loss) + atol, f"loss {loss} != reference {ref_loss}"
    worst = 0.0
    for r in ranks:
        got = torch.load(Path(out_dir) / f"grads_rank{r['rank']}_v{variant}.pt")
        for s, g in got.items():
            want = ref[int(s)]
            if par.zero >= 1:
                padded = torch.nn.functional.pad(want, (0, (-want.numel()) % par.dp))
                shard = padded.numel() // par.dp
                want = padded[r["dp_rank"] * shard:(r["dp_rank"] + 1) * shard]
            assert g.shape == want.shape, f"stage {s}: shape {tuple(g.shape)} != {tuple(want.shape)}"
            worst = max(worst, float((g - want).abs().max()))
            torch.testing.assert_close(g, want, rtol=rtol, atol=atol, msg=lambda m: f"stage {s} rank {r['rank']}: {m}")
    return {"loss": (loss, ref_loss), "max_abs_diff": worst}
