"""parsim's MoE layer against Megatron-Core's own MoE layer performance test.

    python benchmarks/moe_layer_check.py

Data: ``benchmarks/data/megatron_moe_perf.json`` -- Megatron-LM's ``moe_perf`` functional test: one
``MoELayer`` on 8 H100s (expert parallelism 8, a 4,096-token sequence a GPU, forced load balancing),
a Mixtral proxy (4096 x 14336, 8 experts top-2) and a DeepSeek proxy (7168 x 2048, 32 experts top-8,
group-limited 4 of 8), through its all-to-all, DeepEP and HybridEP dispatchers, in BF16 and TE's
blockwise FP8; forward and backward milliseconds (the file says where each comes from). None of these
went into parsim.

parsim costs the same layer -- a one-layer hybrid model of one MoE layer ("E": the layer's pre-norm
and residual add are the only extras), the same parallel layout and dispatcher, balanced routing --
at the burst clock (the test times a single layer between idle gaps, not a power-saturated run) and
prints its forward (compute + the blocking expert all-to-alls) and backward (input and weight
gradients) against the measured ones.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.costs.inputs import cost_inputs  # noqa: E402
from parsim.costs.layer import layer_cost  # noqa: E402
from parsim.costs.model_costs import ModelCosts  # noqa: E402
from parsim.costs.stage import block_inputs  # noqa: E402
from parsim.scenario import scenario_from_dict  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "megatron_moe_perf.json"
DISPATCHERS = {"a2a": "alltoall", "deepep": "deepep", "hybridep": "hybridep"}


def scenario(case: str, proxies: dict):
    proxy, disp, _, prec = case.split("_")
    p = proxies[proxy]
    model = dict(name=proxy, n_layers=1, n_heads=p["d_model"] // 128, n_kv_heads=8, d_ff=p["d_ff_expert"],
                 vocab_size=32000, ffn="swiglu", hybrid_pattern="E", **p)
    training = {"global_batch": 8, "microbatch_size": 1, "seq_len": 4096, "precision": prec}
    if prec == "fp8":
        training["fp8_recipe"] = "blockwise"
    doc = {"name": case, "hardware": "dgx-h100", "gpus": 8, "model": model, "training": training,
           "parallel": {"dp": 8, "ep": 8, "zero": 1, "framework": "megatron"},
           "moe": {"routing": "balanced", "drop_tokens": False, "dispatcher": DISPATCHERS[disp]}}
    sc = scenario_from_dict(doc, case)
    return dataclasses.replace(sc, hardware=dataclasses.replace(sc.hardware, device=sc.hardware.device.burst()))


def layer_ms(case: str, proxies: dict) -> tuple[float, float]:
    """(forward, backward) ms of parsim's MoE layer for one test case."""
    inp = ModelCosts(cost_inputs(scenario(case, proxies))).layer_inputs
    lc = layer_cost(*block_inputs(inp, "E"))
    fwd = lc.forward.compute + lc.forward.ep_comm
    bwd = lc.backward_input.compute + lc.backward_input.ep_comm + lc.backward_weight.compute
    return fwd * 1e3, bwd * 1e3


def errors() -> dict[str, tuple[float, float]]:
    """case -> (forward, backward) relative error of parsim against the measured times."""
    data = json.loads(DATA.read_text())
    out = {}
    for case, meas in data["cases"].items():
        f, b = layer_ms(case, data["proxies"])
        out[case] = (f / meas["forward_ms"] - 1, b / meas["backward_ms"] - 1)
    return out


def main() -> None:
    errs = errors()
    for case, (f, b) in errs.items():
        print(f"{case:30s} forward {100 * f:+5.0f}%  backward {100 * b:+5.0f}%")
    for prec in ("bf16", "fp8"):
        e = [abs(x) for c, fb in errs.items() if c.endswith(prec) for x in fb]
        print(f"{prec}: MAPE {100 * sum(e) / len(e):.1f}% over {len(e)} times")


if __name__ == "__main__":
    main()
