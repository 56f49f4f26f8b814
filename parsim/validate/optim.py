"""The optimizers the torch runtime builds (fused where this torch has the fused kernel), shared
by the worker that trains, the single-process reference and the calibration benchmark that
times the step (``parsim.validate.bench``): all three must run the same kernel."""
from __future__ import annotations

import torch


def optimizer_factory(name: str, lr: float = 1e-3):
    fused = {"fused": True} if _fused_ok() else {}

    def make(params):
        if name in ("sgd",):
            return torch.optim.SGD(params, lr=lr)
        if name == "momentum":
            return torch.optim.SGD(params, lr=lr, momentum=0.9)
        if name == "adamw":
            return torch.optim.AdamW(params, lr=lr, **fused)
        return torch.optim.Adam(params, lr=lr, **fused)  # adam, and the rest approximated by Adam
    return make


def _fused_ok() -> bool:
    try:
        torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], fused=True)
        return True
    except (RuntimeError, TypeError, ValueError):
        return False
