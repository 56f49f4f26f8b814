"""The client population: per-client compute speed and links drawn in bulk, availability, and
FedScale's completion time of one task.

A client's task (one round's work) is FedScale's (``ClientMetadata.get_completion_time``,
fedscale/cloud/internal/client_metadata.py, SymbioticLab/FedScale):

    computation   = train_factor x batch_size x local_steps x seconds_per_sample   (train_factor 3:
                    the backward costs two forwards, FedScale's augmentation_factor)
    communication = download_bits / downlink + upload_bits / uplink

(FedScale has one bandwidth for both directions: (upload + download) / bandwidth.) Here the
upload is the compressed update and the encoding's operations add computation at the client's
rate: a forward of one sample is taken as 2 operations per parameter (a dense network's
multiply-adds), so one operation costs seconds_per_sample / (2 P).

Spreads are lognormal around the medians: value = median x exp(sigma Z), Z ~ N(0, 1), one draw
per client (FedScale's lognormal compute model uses sigma 0.6 around its mean).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from parsim.federated.config import AvailabilityTrace, FederatedConfig


@dataclass(frozen=True)
class Population:
    """Per-client arrays (index = client id)."""

    seconds_per_sample: np.ndarray
    """Forward seconds per sample."""
    uplink_bit_per_s: np.ndarray
    """Uplink, bit/s."""
    downlink_bit_per_s: np.ndarray
    """Downlink, bit/s."""
    device_class: np.ndarray
    """Index into the scenario's device classes (0 without classes)."""

    @property
    def size(self) -> int:
        return len(self.seconds_per_sample)


def make_population(fed: FederatedConfig, rng: np.random.Generator) -> Population:
    """Every client's speed and links, drawn in bulk from ``rng``."""
    n = fed.clients
    if fed.device_classes:
        p = np.array([c.fraction for c in fed.device_classes])
        cls = rng.choice(len(p), size=n, p=p / p.sum())
        sps = np.array([c.seconds_per_sample for c in fed.device_classes])[cls]
        up = np.array([c.uplink_bit_per_s for c in fed.device_classes])[cls]
        down = np.array([c.downlink_bit_per_s for c in fed.device_classes])[cls]
    else:
        cls = np.zeros(n, dtype=np.int64)
        sps = np.full(n, fed.seconds_per_sample)
        up = np.full(n, fed.uplink_bit_per_s)
        down = np.full(n, fed.downlink_bit_per_s)
    for arr, sigma in ((sps, fed.compute_sigma), (up, fed.uplink_sigma), (down, fed.downlink_sigma)):
        if sigma > 0:
            arr *= np.exp(sigma * rng.standard_normal(n))
    return Population(seconds_per_sample=sps, uplink_bit_per_s=up, downlink_bit_per_s=down, device_class=cls)


def compute_time_s(seconds_per_sample, *, batch_size: int, local_steps: int, train_factor: float = 3.0,
                   encode_ops: float = 0.0, params: int = 1):
    """Local training plus the encoding's operations (see the module docstring)."""
    return seconds_per_sample * (train_factor * batch_size * local_steps + encode_ops / (2.0 * params))


def completion_time_s(seconds_per_sample, uplink_bit_per_s, downlink_bit_per_s, *, batch_size: int,
                      local_steps: int, upload_bits: float, download_bits: float, train_factor: float = 3.0,
                      encode_ops: float = 0.0, params: int = 1):
    """One task's duration: download, local compute, upload (scalars or arrays)."""
    comp = compute_time_s(seconds_per_sample, batch_size=batch_size, local_steps=local_steps,
                          train_factor=train_factor, encode_ops=encode_ops, params=params)
    return download_bits / downlink_bit_per_s + comp + upload_bits / uplink_bit_per_s


class Availability:
    """Who is online when: always, with a probability per look, or a FedScale trace."""

    def __init__(self, fed: FederatedConfig, rng: np.random.Generator):
        self.kind, self.p, self.rng, self.n = fed.availability, fed.availability_probability, rng, fed.clients
        self.trace = _TraceIndex(fed.availability_trace) if fed.availability_trace else None

    def online(self, clients: np.ndarray, t) -> np.ndarray:
        """Mask: which of ``clients`` are online at time(s) ``t``."""
        if self.kind == "always":
            return np.ones(len(clients), dtype=bool)
        if self.kind == "probability":
            return self.rng.random(len(clients)) < self.p
        return self.trace.active(clients, t)

    def online_at_end(self, clients: np.ndarray, t_end: np.ndarray) -> np.ndarray:
        """Still online when the task ends (FedScale drops a client its trace takes offline; a
        probability or always-on population does not go offline mid-task)."""
        if self.kind != "trace":
            return np.ones(len(clients), dtype=bool)
        return self.trace.active(clients, t_end)

    def sample_one(self, t: float, busy: np.ndarray) -> int | None:
        """One client chosen uniformly among those online and not busy at ``t`` (None: nobody)."""
        for _ in range(8):  # rejection in small batches; the population is mostly idle
            cand = self.rng.integers(self.n, size=32)
            ok = ~busy[cand] & self.online(cand, t)
            if ok.any():
                return int(cand[np.argmax(ok)])
        rest = self.sample(1, t, busy)
        return int(rest[0]) if len(rest) else None

    def sample(self, n: int, t: float, busy: np.ndarray | None = None) -> np.ndarray:
        """Up to ``n`` distinct clients chosen uniformly among those online (and not busy) at ``t``."""
        if self.kind == "always" and busy is None:
            return self.rng.choice(self.n, size=min(n, self.n), replace=False)
        order = self.rng.permutation(self.n)
        if busy is not None:
            order = order[~busy[order]]
        picked, start, chunk = [], 0, max(4 * n, 64)
        while start < len(order) and sum(len(p) for p in picked) < n:
            cand = order[start:start + chunk]
            picked.append(cand[self.online(cand, t)])
            start += chunk
        out = np.concatenate(picked) if picked else np.zeros(0, dtype=np.int64)
        return out[:n]


class _TraceIndex:
    """FedScale's is_active for many clients at once: client c follows trace c mod T; online at t
    when t mod finish_time lies in one of the trace's [active, inactive] intervals."""

    def __init__(self, tr: AvailabilityTrace):
        self.n_traces = len(tr.finish_time)
        self.finish = np.array(tr.finish_time)
        span = max(float(self.finish.max()), max(max(b) for b in tr.inactive)) + 1.0
        lens = np.array([len(a) for a in tr.active])
        self.offset = np.concatenate([[0], np.cumsum(lens)[:-1]])
        self.span = span
        owner = np.repeat(np.arange(self.n_traces), lens)
        self.keys = owner * span + np.concatenate([np.array(a) for a in tr.active])
        self.ends = np.concatenate([np.array(b) for b in tr.inactive])

    def active(self, clients: np.ndarray, t) -> np.ndarray:
        tr = np.asarray(clients) % self.n_traces
        norm = np.asarray(t, dtype=float) % self.finish[tr]
        idx = np.searchsorted(self.keys, tr * self.span + norm, side="right") - 1
        ok = idx >= self.offset[tr]
        idx = np.maximum(idx, 0)
        return ok & (norm <= self.ends[idx])
