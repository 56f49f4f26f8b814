"""The result's ``moe`` object: per-EP-rank routed tokens, expert compute, all-to-all, drops, memory."""
from __future__ import annotations

import numpy as np

from parsim.costs.tables import MoEFigures


def moe_layers_per_rank(moe_layers_per_stage: list[int], stage_to_rank: tuple[int, ...], pp: int) -> list[int]:
    """MoE blocks on each pipeline rank."""
    per = [0] * pp
    for s, n in enumerate(moe_layers_per_stage):
        per[stage_to_rank[s]] += n
    return per


def moe_metrics(fig: MoEFigures, layers_per_rank: list[int], n_microbatches: int, recompute_full: bool,
                peak_memory_bytes: float) -> dict:
    """Per layer and per microbatch figures, and their totals over the mean pipeline rank's step."""
    n_layers = float(np.mean(layers_per_rank)) if layers_per_rank else 0.0
    per_layer_expert = fig.forward_s + fig.backward_input_s + fig.backward_weight_s
    if recompute_full:
        per_layer_expert += fig.forward_s
    a2a_per_layer = (6 if recompute_full else 4) * fig.all_to_all_s
    return {
        "ep_group_size": fig.ep_group_size,
        "expert_tp": fig.expert_tp,
        "tokens_per_rank": fig.tokens_per_rank,
        "routed_tokens_per_rank": list(fig.routed_tokens_per_rank),
        "imbalance": fig.imbalance,
        "capacity_tokens_per_expert": fig.capacity_tokens_per_expert,
        "dropped_fraction": fig.dropped_fraction,
        "layer_expert_compute_s": {"forward": fig.forward_s, "backward_input": fig.backward_input_s,
                                   "backward_weight": fig.backward_weight_s},
        "layer_all_to_all_s": fig.all_to_all_s,
        "dispatcher": fig.dispatcher,
        "dispatcher_sms": fig.dispatcher_sms,
        # one MoE layer, one microbatch, forward + backward (no recompute), the slowest EP rank
        "layer_s": {**{f"{name}_s": t for name, t in fig.kernels_s},
                    "all_to_all_s": 4 * fig.all_to_all_s},
        "all_to_all_bytes_per_rank": {"send": fig.all_to_all_send_bytes, "recv_max": fig.all_to_all_recv_max_bytes},
        "expert_compute_s": per_layer_expert * n_layers * n_microbatches,
        "all_to_all_s": a2a_per_layer * n_layers * n_microbatches,
        "worst_rank_peak_memory_bytes": peak_memory_bytes,
    }
