"""Throughput from the step time: tokens/s, model TFLOP/s per GPU, MFU, HFU, Megatron's TFLOP/s.

* mfu: model FLOPs (3 x forward of all layers and the LM head, full s^2 attention, no
  recompute) per GPU per second / peak; hfu counts what runs, recompute included.
"""
from __future__ import annotations

from parsim.config.scenario import Scenario
from parsim.model import megatron_flops_per_step, model_flops_per_step


def throughput(sc: Scenario, T: float, hw_flops_per_gpu: float, pp: int) -> dict[str, float]:
    """``tokens_per_s``, ``tflops_per_gpu``, ``mfu``, ``hfu``, ``megatron_tflops_per_gpu`` of a step of ``T`` s;
    ``hw_flops_per_gpu``: FLOPs the pipeline ranks executed, summed over the ``pp`` ranks."""
    tr, m = sc.training, sc.model
    tokens, world = sc.tokens_per_step, sc.parallel.world_size
    model_flops = model_flops_per_step(m, tokens, tr.seq_len)
    tflops = model_flops / T / world / 1e12 if T > 0 else 0.0
    peak_flops = sc.hardware.device.peak(tr.precision)
    meg = megatron_flops_per_step(m, tr.global_batch, tr.seq_len, recompute=tr.recompute == "full")
    return {
        "tokens_per_s": tokens / T if T > 0 else 0.0,
        "tflops_per_gpu": tflops,
        "mfu": tflops * 1e12 / peak_flops,
        "hfu": (hw_flops_per_gpu / pp) * (1.0) / T / peak_flops if T > 0 else 0.0,
        "megatron_tflops_per_gpu": meg / T / world / 1e12 if T > 0 else 0.0,
    }
