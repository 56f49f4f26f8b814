"""Activation memory of one microbatch through one stage, measured.

CPU: ``torch.autograd.graph.saved_tensors_hooks`` sees every tensor autograd keeps for
the backward; distinct storages that are not parameters or buffers are summed (a view
counts its whole storage once: what stays allocated). GPU: ``memory_allocated`` after
the forward minus before, minus the stage output itself (``max_memory_allocated`` is
reported beside it as the transient peak).
"""
from __future__ import annotations

import torch

from parsim.validate.model import Stage


def saved_tensor_bytes(stage: Stage, x: torch.Tensor, targets: torch.Tensor | None) -> float:
    """Bytes autograd saves for the backward of one forward of ``stage`` on ``x``."""
    skip = {t.untyped_storage().data_ptr() for t in [*stage.parameters(), *stage.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in skip:
            seen[ptr] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = stage(x, targets) if stage.last else stage(x)
    del out
    return float(sum(seen.values()))


def cuda_stash_bytes(stage: Stage, x: torch.Tensor, targets: torch.Tensor | None) -> tuple[float, float]:
    """(bytes still allocated after the forward, peak during it), output excluded."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = stage(x, targets) if stage.last else stage(x)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated() - out.numel() * out.element_size()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return float(after - before), float(peak)


def stage_activation_bytes(stage: Stage, x: torch.Tensor, targets: torch.Tensor | None) -> dict:
    """Measured stash of one microbatch (the number compared with StageCost.activation_bytes)."""
    if x.is_floating_point():
        x = x.detach().requires_grad_(True)
    if x.device.type == "cuda":
        stash, peak = cuda_stash_bytes(stage, x, targets)
        return {"activation_bytes": stash, "peak_bytes": peak, "method": "cuda memory_allocated"}
    return {"activation_bytes": saved_tensor_bytes(stage, x, targets), "method": "saved_tensors_hooks"}
