"""Build small scenarios in tests without files on disk."""
from __future__ import annotations

import copy

from parsim.scenario import scenario_from_dict

TINY_GPT = {"name": "t", "n_layers": 8, "d_model": 256, "n_heads": 8, "n_kv_heads": 8, "d_ff": 1024,
            "vocab_size": 1000, "ffn": "gelu", "norm": "layernorm", "bias": True, "position": "learned",
            "max_seq_len": 512}


def scenario(pp=1, dp=1, tp=1, vpp=1, m=None, schedule="1F1B", costs=None, model=None, hardware="dgx-a100-80g",
             training=None, parallel=None, overlap=None, layers=None):
    mdl = copy.deepcopy(model or TINY_GPT)
    if layers is not None:
        mdl["n_layers"] = layers
    elif "preset" not in mdl:
        mdl["n_layers"] = max(mdl["n_layers"], pp * vpp)
    doc = {
        "name": "test", "hardware": hardware, "gpus": pp * dp * tp,
        "model": mdl,
        "training": {"global_batch": dp * (m or 4), "seq_len": 512, "microbatch_size": 1, **(training or {})},
        "parallel": {"pp": pp, "dp": dp, "tp": tp, "vpp": vpp, **(parallel or {})},
        "schedule": {"name": schedule, **({"n_microbatches": m} if m else {})},
    }
    if costs:
        doc["costs"] = costs
    if overlap:
        doc["overlap"] = overlap
    return scenario_from_dict(doc, "test.toml")


def launch_parity(scenario: str, variants, n_ranks: int, out, timeout: float, deadline: float,
                  steps: int | None = None) -> list[dict]:
    """One gloo launch of ``n_ranks`` ranks running every variant (a list of override lists) in
    parity mode, each rank's own ``timeout`` and the launch's ``deadline`` in seconds; ``steps``:
    training steps per variant (the runtime's default when None). The ranks' results."""
    # torch: imported here, so the torch-free tests can import this module
    from parsim.validate.launch import launch
    job = {"scenario": scenario, "backend": "gloo", "mode": "parity", "variants": list(variants), "timeout": timeout}
    if steps is not None:
        job["parity_steps"] = steps
    return launch(job, n_ranks, out, deadline)


def variant_parity(scenario: str, variants: dict, name: str, out, ranks: list[dict]) -> dict:
    """Gradient parity of variant ``name`` (a key of ``variants``, the override lists one
    :func:`launch_parity` ran in that order) against the single-process reference."""
    from parsim.validate.reference import check_parity
    from parsim.validate.scale import prepare
    i = list(variants).index(name)
    return check_parity(prepare(scenario, variants[name], "gloo"), out, [r["variants"][i] for r in ranks], variant=i)
