"""Mixture of experts under expert parallelism: routing, imbalance, expert GEMMs, all-to-all.

One MoE layer, one microbatch, on the ranks of one expert-parallel (EP) group:

* The EP group: ``ep`` ranks carved out of dp x cp (cp varies fastest), times
  ``tp / expert_tp`` when experts use less tensor parallelism than the dense layers
  (Megatron-Core "parallel folding": the TP ranks then split the tokens and join the
  EP group). ``expert_tp`` defaults to ``tp`` (Megatron's default). The group has
  G = ep * tp / expert_tp ranks, each holding n_experts / G experts (contiguous), each
  expert's hidden size sharded over expert_tp.
* Routing: every rank holds T tokens (its microbatch shard: b * seq / cp, divided by
  tp / expert_tp when folded) and routes T * top_k assignments. The share of the group's
  G * T * top_k assignments that each expert gets is an *input* ([moe] routing):
  balanced, Zipf (hot experts, rank^-s), log-normal (exp(N(0, sigma)) per expert) or a
  measured histogram. Zipf and log-normal shares are placed on experts by a seeded
  permutation, so results are deterministic given the seed.
* Capacity (GShard/Switch): capacity_factor * G * T * top_k / n_experts per expert;
  with drop_tokens the overflow is dropped (not sent, not computed).
* Dispatch and combine are all-to-alls over the group on the topology
  (``parsim.collectives.collective_time``): 2 in forward, 2 in backward. Each rank sends
  the kept share of its T * top_k assignments, (G-1)/G of them to other ranks; a rank
  hosting hot experts receives more. The slowest rank (most received tokens) sets the
  pace of the group: its expert GEMMs and its all-to-all buffer are what the pipeline sees.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from parsim.cluster.collectives import collective_time
from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.moe import MoEConfig


# ---------------------------------------------------------------- routing
def expert_shares(cfg: MoEConfig, n_experts: int) -> np.ndarray:
    """Fraction of the routed assignments each expert receives (sums to 1)."""
    if cfg.routing == "histogram":
        w = np.asarray(cfg.histogram, dtype=float)
    elif cfg.routing == "zipf":
        ranks = np.arange(1, n_experts + 1, dtype=float)
        w = np.random.default_rng(cfg.seed).permutation(ranks ** -cfg.zipf_s)
    elif cfg.routing == "lognormal":
        w = np.exp(np.random.default_rng(cfg.seed).normal(0.0, cfg.lognormal_sigma, n_experts))
    else:
        w = np.ones(n_experts)
    return w / w.sum()


@dataclass(frozen=True)
class Routing:
    """Where one microbatch's assignments go in one EP group (per MoE layer)."""

    group_size: int
    """G: ranks of the EP group."""
    tokens_per_rank: float
    """T: tokens each rank routes."""
    offered: np.ndarray
    """Assignments routed to each expert (group-wide)."""
    kept: np.ndarray
    """Assignments each expert computes (offered, capped at capacity when dropping)."""
    capacity: float | None
    """Assignments one expert can take (None: dropless)."""
    received: np.ndarray
    """Assignments each EP rank computes (sum of its experts' kept)."""
    sent: float
    """Assignments each rank sends (its kept T * top_k, on average)."""

    @property
    def dropped_fraction(self) -> float:
        total = float(self.offered.sum())
        return 1.0 - float(self.kept.sum()) / total if total > 0 else 0.0

    @property
    def imbalance(self) -> float:
        """Busiest rank's received assignments over the mean."""
        mean = float(self.received.mean())
        return float(self.received.max()) / mean if mean > 0 else 1.0


def route(model, cfg: MoEConfig, tokens_per_rank: float, group_size: int) -> Routing:
    """Assignments per expert and per EP rank for one MoE layer and one microbatch."""
    e = model.n_experts
    total = group_size * tokens_per_rank * model.top_k
    offered = total * expert_shares(cfg, e)
    cap = None
    kept = offered
    if cfg.drop_tokens:
        cap = float(math.ceil(model.capacity_factor * total / e))
        kept = np.minimum(offered, cap)
    received = kept.reshape(group_size, e // group_size).sum(axis=1)
    return Routing(group_size, tokens_per_rank, offered, kept, cap, received,
                   float(kept.sum()) / group_size)


def all_to_all_bytes(r: Routing, d_model: int, bytes_per_el: int) -> dict[str, np.ndarray | float]:
    """Bytes one dispatch (or combine) moves off/onto each rank, one direction each.

    ``send``: each rank's kept assignments bound for the other G-1 ranks; balanced:
    T * top_k * d_model * bytes * (G-1)/G. ``recv``: per rank, what its experts get from
    the others (senders uniform).
    """
    g = r.group_size
    frac = (g - 1) / g
    return {"send": r.sent * d_model * bytes_per_el * frac,
            "recv": r.received * d_model * bytes_per_el * frac}


# ---------------------------------------------------------------- costs
def ep_group_ranks(par, expert_tp: int) -> list[int]:
    """Global ranks of the EP group of rank 0 (dp x cp index, cp fastest, then folded tp ranks)."""
    out = []
    for j in range(par.ep):
        d, c = divmod(j, par.cp)
        base = d * par.stride("dp") + c * par.stride("cp")
        for t in range(0, par.tp, expert_tp):
            out.append(base + t * par.stride("tp"))
    return sorted(out)


def expert_dp_ranks(par) -> list[int]:
    """Ranks holding the same experts as rank 0 (expert data parallel: dp*cp/ep of them)."""
    out = []
    for j in range(0, par.dp * par.cp, par.ep):
        d, c = divmod(j, par.cp)
        out.append(d * par.stride("dp") + c * par.stride("cp"))
    return out


@dataclass(frozen=True)
class MoEPhase:
    """Per-layer, per-microbatch MoE costs on the slowest EP rank."""

    routing: Routing
    group: tuple[int, ...]
    expert_tp: int
    rank_times: np.ndarray
    """Per EP rank: (forward, backward-input, backward-weight) expert GEMM seconds, shape (G, 3)."""
    slowest: int
    """Index (in the group) of the rank with the most expert work."""
    all_to_all_s: float
    """One dispatch (or combine) all-to-all as the slowest rank sees it."""
    forward_flops: float
    """Mean rank's expert GEMM FLOPs of one forward."""
    routed_rows: float
    """Assignments the slowest rank computes (its dispatched-token activations)."""

    @property
    def forward_s(self) -> float:
        return float(self.rank_times[self.slowest, 0])

    @property
    def backward_input_s(self) -> float:
        return float(self.rank_times[self.slowest, 1])

    @property
    def backward_weight_s(self) -> float:
        return float(self.rank_times[self.slowest, 2])


def _expert_times(dev, model, rows: np.ndarray, f: int, prec: str) -> tuple[float, float, float]:
    """F, I, W seconds of the experts that compute ``rows`` assignments each (f: local hidden size)."""
    d = model.d_model
    shapes = [(f, d)] * (model.ffn_matrices - 1) + [(d, f)]  # (n, k) of gate/up (or fc1) and down
    t = [0.0, 0.0, 0.0]
    for r in rows:
        m = int(math.ceil(r))
        for n, k in shapes:
            t[0] += dev.gemm_time(m, n, k, prec)
            t[1] += dev.gemm_time(m, k, n, prec)
            t[2] += dev.gemm_time(k, n, m, prec)
    return t[0], t[1], t[2]


def moe_phase(model, hw, cfg: MoEConfig, precision: str, tokens: int, group: tuple[int, ...], expert_tp: int,
              tp: int) -> MoEPhase:
    """Costs of one MoE layer for one microbatch of ``tokens`` tokens per rank (after cp) on the
    EP group ``group`` (:func:`ep_group_ranks`; experts sharded over ``expert_tp`` of the ``tp`` ranks)."""
    m = model
    fold = tp // expert_tp
    g = len(group)
    r = route(m, cfg, tokens / fold, g)
    f = -(-m.d_ff_expert_ // expert_tp)
    per_rank = r.kept.reshape(g, m.n_experts // g)
    times = np.array([_expert_times(hw.device, m, rows, f, precision) for rows in per_rank])
    slowest = int(np.argmax(times.sum(axis=1)))
    bpe = PRECISION_TABLE[precision].activation_bytes  # tokens are dispatched as activations
    buf = max(r.sent, float(r.received.max())) * m.d_model * bpe
    a2a = collective_time(hw, "all_to_all", buf, group) if g > 1 else 0.0
    flops = 2.0 * float(r.kept.sum()) / g * m.ffn_matrices * m.d_model * f
    return MoEPhase(r, tuple(group), expert_tp, times, slowest, a2a, flops, float(r.received[slowest]))


def moe_metrics(phase: MoEPhase, moe_layers_per_rank: list[int], n_microbatches: int,
                recompute_full: bool, peak_memory_bytes: float, element_bytes: int, d_model: int) -> dict:
    """The result's ``moe`` object (per-rank tokens, expert compute, all-to-all, drops, memory)."""
    r = phase.routing
    n_layers = float(np.mean(moe_layers_per_rank)) if moe_layers_per_rank else 0.0
    per_layer_expert = phase.forward_s + phase.backward_input_s + phase.backward_weight_s
    if recompute_full:
        per_layer_expert += phase.forward_s
    a2a_per_layer = (6 if recompute_full else 4) * phase.all_to_all_s
    b = all_to_all_bytes(r, d_model, element_bytes)
    return {
        "ep_group_size": r.group_size,
        "expert_tp": phase.expert_tp,
        "tokens_per_rank": r.tokens_per_rank,
        "routed_tokens_per_rank": [float(x) for x in r.received],
        "imbalance": r.imbalance,
        "capacity_tokens_per_expert": r.capacity,
        "dropped_fraction": r.dropped_fraction,
        "layer_expert_compute_s": {"forward": phase.forward_s, "backward_input": phase.backward_input_s,
                                   "backward_weight": phase.backward_weight_s},
        "layer_all_to_all_s": phase.all_to_all_s,
        "all_to_all_bytes_per_rank": {"send": float(b["send"]), "recv_max": float(np.max(b["recv"]))},
        "expert_compute_s": per_layer_expert * n_layers * n_microbatches,
        "all_to_all_s": a2a_per_layer * n_layers * n_microbatches,
        "worst_rank_peak_memory_bytes": peak_memory_bytes,
    }
