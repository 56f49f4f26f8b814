"""Throughput from the step time: tokens/s, model TFLOP/s per GPU, MFU, HFU, Megatron's TFLOP/s.

* mfu: model FLOPs (3 x forward of all layers and the LM head, full s^2 attention, no
  recompute) per GPU per second / peak. MoE layers count the expert FLOPs of the routed
  assignments an expert computes: those dropped over capacity are not the model's work
  (a capacity factor of 0.5 must not show a higher MFU than 1.25 for doing less).
* hfu: the FLOPs the GPUs executed (recompute included: full recompute's forward and selective
  recompute's modules rerun, both in the cost tables) per GPU per second / peak.
"""
from __future__ import annotations

from parsim.config.scenario import Scenario
from parsim.model import megatron_flops_per_step, model_flops_per_step, mtp_block_kinds
from parsim.model.spec import ModelSpec


def dropped_expert_flops(m: ModelSpec, tokens: float, dropped_fraction: float) -> float:
    """Model FLOPs (3 passes) of the routed expert assignments dropped over capacity in one step:
    each of tokens x top_k assignments of an MoE layer multiplies ffn_matrices x d_model x d_ff_expert weights."""
    if not m.is_moe or dropped_fraction <= 0:
        return 0.0
    per_assignment = 2.0 * m.ffn_matrices * m.d_model * m.d_ff_expert_
    moe_blocks = m.n_moe_layers + m.mtp_layers * sum(1 for k in mtp_block_kinds(m) if k is True or k == "E")
    return 3.0 * dropped_fraction * tokens * m.top_k * moe_blocks * per_assignment


def throughput(sc: Scenario, T: float, hw_flops_per_gpu: float, pp: int,
               dropped_fraction: float = 0.0) -> dict[str, float]:
    """``tokens_per_s``, ``tflops_per_gpu``, ``mfu``, ``hfu``, ``megatron_tflops_per_gpu`` of a step of ``T`` s;
    ``hw_flops_per_gpu``: FLOPs the pipeline ranks executed, summed over the ``pp`` ranks;
    ``dropped_fraction``: of the MoE assignments, those dropped over capacity."""
    tr, m = sc.training, sc.model
    tokens, world = sc.tokens_per_step, sc.parallel.world_size
    model_flops = model_flops_per_step(m, tokens, tr.seq_len) - dropped_expert_flops(m, tokens, dropped_fraction)
    tflops = model_flops / T / world / 1e12 if T > 0 else 0.0
    peak_flops = sc.hardware.device.peak(tr.precision)
    meg = megatron_flops_per_step(m, tr.global_batch, tr.seq_len, recompute=tr.recompute == "full")
    hw = hw_flops_per_gpu / pp
    return {
        "tokens_per_s": tokens / T if T > 0 else 0.0,
        "tflops_per_gpu": tflops,
        "mfu": tflops * 1e12 / peak_flops,
        "hfu": hw / T / peak_flops if T > 0 else 0.0,
        "megatron_tflops_per_gpu": meg / T / world / 1e12 if T > 0 else 0.0,
    }
