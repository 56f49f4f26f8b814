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
