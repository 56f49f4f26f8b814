"""Fit a hardware profile to microbenchmark rows (numpy only; no torch).

Each fit refits exactly the knobs the cost model uses (``parsim.cluster.hardware.Device`` and
``LinkTier``), by least squares on log time (relative errors, so small and large cases
weigh alike):

* GEMMs -> ``gemm_efficiency`` and ``gemm_half_dim`` of
  ``t = max(2mnk / (peak * eff * u(m)u(n)u(k)), bytes / (bw * mem_eff))``, u(d) = d/(d+h)
  (grid over h, closed-form eff for each h, roofline floor included);
* streaming ops -> ``memory_efficiency`` (median achieved bytes/s over the datasheet bandwidth);
* in-place updates -> ``update_efficiency`` (the same median over that bandwidth: gradient
  accumulation), Adam steps -> ``optimizer_efficiency`` (the optimizer step);
* attention core -> ``attention_efficiency`` / ``attention_backward_efficiency`` from the
  fused (SDPA) forward / backward cases and ``unfused_attention_efficiency`` /
  ``unfused_attention_backward_efficiency`` from the explicit ones (scores + mask, softmax,
  @V: what runs with ``flash_attention = false``), each the geometric mean of achieved FLOP/s
  over peak of its pass; for the explicit cases the scores' memory traffic the cost model charges
  separately (``parsim.costs.scores_pass_bytes``: once forward, twice backward) is taken
  off first, so prediction = fitted GEMM part + modelled traffic;
* the one-element op -> ``kernel_launch_us``;
* the runtime's block at a negligible size (``eager``) -> ``eager_op_forward_us`` and
  ``eager_op_backward_us`` (pass time over the aten ops dispatched, median over flavours);
* the runtime's block forward after a blocking call against after a spin, less the same for
  a GEMM loop (``rewarm``) -> ``comm_rewarm_us`` (:func:`fit_rewarm`);
* a GEMM loop beside an in-flight all-reduce (``core_share``) -> ``transport_core_share`` (its
  slowdown over the all-reduce's own time, summed over sizes);
* p2p as pipeline ranks meet it (``p2p``: the exchange after an F/B on one host, else one-way
  sends with the sender computing after its isend; mean times) -> link ``latency`` alpha and
  ``bandwidth`` beta of ``t = alpha + S/beta`` (the ping-pong ``p2p_idle`` rows are reported)
  (non-negative least squares on relative error);
* the sender's time inside ``isend`` (``p2p_post``, CPU ranks) -> ``send_post_us`` alpha and
  ``send_post_gbyte_per_s`` beta of the same form (the sender's compute waits that long per send);
* collectives (all-reduce, all-gather, reduce-scatter, all-to-all, broadcast, as the runtime
  calls them) -> per kind, group size and size range (:data:`SIZE_RANGES`) a latency alpha and
  bandwidth beta in the ring formulas' terms of ``parsim.cluster.collectives``
  (t = hops(n) alpha + busbw_factor(n) S / beta): :class:`CollectiveFit`, written into the
  profile's ``[calibration]`` table (``collective_<kind>_<n>``). Each row is reported both
  against its fit (family ``collective``) and against the ring formulas on the fitted
  point-to-point link (``collective_ring``: what the cost model charges today).

When a fitted efficiency would exceed 1 the matching peak/bandwidth is raised to the
measured value and the efficiency set to 1 (a profile stores fractions in (0, 1]).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from parsim.cluster.collectives import BUSBW_FACTOR, HOPS, alpha_beta_time, at_gap, ring_time
from parsim.cluster.hardware import Device, HardwareProfile, LinkTier
from parsim.costs.layer import scores_pass_bytes

LINK_BANDWIDTH_CEILING = 1e14
"""Bytes/s a fitted link may claim: the plausibility bound of a ``_gbyte_per_s`` key (1e5 GB/s)."""
H_GRID = np.concatenate([[0.0], np.geomspace(0.5, 1024, 160)])
SIZE_RANGES = (64 * 2 ** 10, 2 ** 20)
"""Upper ends (bytes) of the collective fits' size ranges; the last range is open. Small
messages are latency-bound, large ones bandwidth-bound, and gloo switches algorithms in
between: one alpha-beta line per range follows the measured curve where one line cannot."""


@dataclass(frozen=True)
class CollectiveFit:
    """One collective on one group size over one size range, in the ring formulas' terms."""

    kind: str
    """all_reduce | all_gather | reduce_scatter | all_to_all | broadcast."""
    group: int
    """Ranks in the group."""
    max_bytes: float
    """Largest size (nccl-tests' convention) this line covers; inf for the last range."""
    alpha_s: float
    """Per-step latency (the ring's hops(n) steps each pay it)."""
    beta: float
    """Link bandwidth, bytes/s (the ring moves busbw_factor(n) S over it)."""

    def time(self, nbytes: float) -> float:
        return ring_time(self.kind, nbytes, self.group, (self.alpha_s, self.beta))

    def as_row(self) -> list[float]:
        """[max bytes, latency us, GB/s]: one row of the profile's ``collective_<kind>_<n>`` key."""
        return [float(self.max_bytes), self.alpha_s * 1e6, self.beta / 1e9]


def fit_collectives(rows: pd.DataFrame, ranges: tuple[float, ...] = SIZE_RANGES) -> tuple[CollectiveFit, ...]:
    """Per (kind, group size): one alpha-beta line per size range (``ranges``: their upper ends,
    the last range open) with two sizes or more (ranges with fewer are merged into their
    neighbour), least squares on relative error."""
    out = []
    for (kind, n), g in rows.groupby(["name", "group"]):
        kind, n = str(kind), int(n)
        if kind not in HOPS or n < 2:
            continue
        g = g.sort_values("bytes")
        edges, lo = [], 0.0
        for e in ranges:  # a range needs two sizes to fit a line, and so does what is left
            if ((g["bytes"] > lo) & (g["bytes"] <= e)).sum() >= 2 and (g["bytes"] > e).sum() >= 2:
                edges.append(e)
                lo = e
        lo = 0.0
        for hi in [*edges, np.inf]:
            part = g[(g["bytes"] > lo) & (g["bytes"] <= hi)]
            a, b = fit_alpha_beta(part)
            out.append(CollectiveFit(kind, n, float(hi), a / HOPS[kind](n), b * BUSBW_FACTOR[kind](n)))
            lo = hi
    return tuple(out)


def collective_fit_time(fits: tuple[CollectiveFit, ...], kind: str, nbytes: float, n: int) -> float | None:
    """Seconds of one collective from the fits (None when none covers this kind and group)."""
    for f in sorted((f for f in fits if f.kind == kind and f.group == n), key=lambda f: f.max_bytes):
        if nbytes <= f.max_bytes:
            return f.time(nbytes)
    return None


@dataclass(frozen=True)
class CollectiveGap:
    """How one collective's in-situ cost on one group size grows with the compute before it."""

    kind: str
    """all_reduce | all_gather | reduce_scatter | all_to_all."""
    group: int
    """Ranks in the group."""
    reference_s: float
    """The gap the collective fits were timed after (``parsim.validate.bench.COMM_GAP_S``, each
    row's ``reference_gap_s``)."""
    shortest_s: float
    """Shortest gap measured (the slope is not extrapolated below it)."""
    longest_s: float
    """Longest gap measured (nor above it)."""
    slope: float
    """Seconds a call adds per second of compute before it: least squares through the reference
    point, (t(gap) - t(reference)) against (gap - reference)."""

    def as_row(self) -> list[float]:
        """[reference gap us, shortest gap us, longest gap us, slope]: the profile's ``comm_gap_<kind>_<n>``."""
        return [self.reference_s * 1e6, self.shortest_s * 1e6, self.longest_s * 1e6, self.slope]

    def as_profile_row(self) -> tuple[str, int, float, float, float, float]:
        """The ``HardwareProfile.collective_gaps`` entry."""
        return (self.kind, self.group, self.reference_s, self.shortest_s, self.longest_s, self.slope)


def fit_collective_gaps(rows: pd.DataFrame) -> tuple[CollectiveGap, ...]:
    """Per (kind, group size) of the ``collective_gap`` rows (``Bench.collective_gaps``): the
    slope of the call's in-situ time over the compute before it, through the row timed after
    the reference gap (each row's ``reference_gap_s``: the one the collective fits were timed
    after), least squares on the other gaps. A kind without the reference row or another gap
    is left out."""
    out = []
    for (kind, n), g in rows.groupby(["name", "group"]):
        reference_s = float(g["reference_gap_s"].iloc[0])
        gaps, secs = g["gap_s"].to_numpy(float), g["seconds"].to_numpy(float)
        ref = np.isclose(gaps, reference_s, rtol=1e-6)
        if not ref.any() or ref.all():
            continue
        x, y = gaps[~ref] - reference_s, secs[~ref] - float(secs[ref].mean())
        out.append(CollectiveGap(str(kind), int(n), reference_s, float(gaps.min()), float(gaps.max()),
                                 float((x * y).sum() / (x * x).sum())))
    return tuple(out)


@dataclass(frozen=True)
class Fit:
    """A calibrated profile with what it was fitted on and how well."""

    profile: HardwareProfile
    sources: dict[str, str]
    """Dotted profile key -> the source comment written beside it."""
    quality: dict[str, float]
    """Median absolute relative error of each fitted family (gemm, memory, attention, p2p, ...)."""
    predictions: pd.DataFrame
    """The data rows with the fitted model's prediction and relative error."""
    collectives: tuple[CollectiveFit, ...] = ()
    """Per collective kind, group size and size range: the fitted alpha-beta line."""
    gaps: tuple[CollectiveGap, ...] = ()
    """Per collective kind and group size: its in-situ cost's slope over the compute before it."""

    def calibration_table(self) -> dict[str, list]:
        """The collective fits as ``[calibration]`` keys: ``collective_<kind>_<n>`` =
        [[max bytes, latency us, GB/s], ...] in size order; the gap slopes as
        ``comm_gap_<kind>_<n>`` = [reference gap us, shortest us, longest us, slope]."""
        out: dict[str, list] = {}
        for f in sorted(self.collectives, key=lambda f: (f.kind, f.group, f.max_bytes)):
            out.setdefault(f"collective_{f.kind}_{f.group}", []).append(f.as_row())
        for gp in sorted(self.gaps, key=lambda gp: (gp.kind, gp.group)):
            out[f"comm_gap_{gp.kind}_{gp.group}"] = gp.as_row()
        return out


def _gemm_model(dev: Device, m, n, k, precision: str) -> np.ndarray:
    return np.array([dev.gemm_time(int(a), int(b), int(c), precision) for a, b, c in zip(m, n, k)])


def fit_gemm(dev: Device, rows: pd.DataFrame, precision: str) -> tuple[float, float, float]:
    """(gemm_efficiency, gemm_half_dim, peak FLOP/s) minimising squared log error."""
    m, n, k = (rows[c].to_numpy(float) for c in ("m", "n", "k"))
    t = rows["seconds"].to_numpy(float)
    peak = dev.peak(precision)
    floor = dev_bytes(dev, m, n, k, precision) / dev.effective_memory_bandwidth
    best = (np.inf, 1.0, 0.0)
    for h in H_GRID:
        u = (m / (m + h)) * (n / (n + h)) * (k / (k + h))
        ideal = 2 * m * n * k / (peak * u)          # compute time at eff = 1
        eff = float(np.exp(np.mean(np.log(ideal / t))))
        for _ in range(3):  # points on the roofline floor do not inform eff
            on = ideal / eff >= floor
            if on.any():
                eff = float(np.exp(np.mean(np.log(ideal[on] / t[on]))))
        loss = float(np.sum(np.log(np.maximum(ideal / eff, floor) / t) ** 2))
        if loss < best[0]:
            best = (loss, eff, float(h))
    _, eff, h = best
    if eff > 1.0:
        return 1.0, h, peak * eff
    return eff, h, peak


def dev_bytes(dev: Device, m, n, k, precision: str) -> np.ndarray:
    return np.array([dev.gemm_bytes(int(a), int(b), int(c), precision) for a, b, c in zip(m, n, k)])


def median_rate(rows: pd.DataFrame) -> float:
    """Median achieved bytes/s of benchmark rows (``bytes`` / ``seconds``)."""
    return float(np.median(rows["bytes"].to_numpy(float) / rows["seconds"].to_numpy(float)))


def fit_memory(dev: Device, rows: pd.DataFrame) -> tuple[float, float]:
    """(memory_efficiency, memory bandwidth B/s)."""
    achieved = median_rate(rows)
    eff = achieved / dev.memory_bandwidth
    return (eff, dev.memory_bandwidth) if eff <= 1.0 else (1.0, achieved)


def scores_traffic_s(dev: Device, name: str, seq: float, batch_heads: float, precision: str) -> float:
    """Modelled memory time of an explicit attention case's scores (0 for a fused case):
    the cost model's ``scores_pass_bytes``, once forward, twice backward."""
    if not name.startswith("explicit"):
        return 0.0
    passes = 2.0 if name.endswith("backward") else 1.0
    return passes * dev.memory_time(scores_pass_bytes(int(batch_heads), int(seq), int(seq), precision))


ATTENTION_FITS = (("attention_efficiency", "sdpa", "forward"),
                  ("attention_backward_efficiency", "sdpa", "backward"),
                  ("unfused_attention_efficiency", "explicit", "forward"),
                  ("unfused_attention_backward_efficiency", "explicit", "backward"))
"""(device field, benchmark case prefix, pass) of each attention efficiency calibration fits."""


def fit_attention(dev: Device, rows: pd.DataFrame, precision: str) -> dict[str, tuple[float, int]]:
    """The attention efficiencies the rows give, by device field (:data:`ATTENTION_FITS`), each
    with the number of cases behind it: ``attention_efficiency`` (fused forward: SDPA),
    ``attention_backward_efficiency`` (its backward), ``unfused_attention_efficiency`` (explicit
    scores + mask, softmax, @V, the modelled scores traffic taken off) and
    ``unfused_attention_backward_efficiency``: each the geometric mean of achieved FLOP/s over its
    pass's cases (a CPU's SDPA backward takes about its forward's time where the FLOP count says
    2.5x: one efficiency for both passes is wrong for each)."""
    peak = dev.peak(precision)
    traffic = [scores_traffic_s(dev, str(r["name"]), r["m"], r["n"], precision) for _, r in rows.iterrows()]
    t = rows["seconds"].to_numpy(float) - np.array(traffic)
    rate = rows["flops"].to_numpy(float) / np.maximum(t, 1e-9)
    names = rows["name"].astype(str)
    out = {}
    for field, prefix, pas in ATTENTION_FITS:
        mask = (names == f"{prefix}_{pas}").to_numpy() & (t > 0)
        if mask.any():
            out[field] = (float(min(1.0, np.exp(np.mean(np.log(rate[mask] / peak))))), int(mask.sum()))
    return out


def fit_alpha_beta(rows: pd.DataFrame) -> tuple[float, float]:
    """(latency s, bandwidth B/s) of t = alpha + S/beta, least squares on relative error."""
    s = rows["bytes"].to_numpy(float)
    t = rows["seconds"].to_numpy(float)
    a = np.stack([1.0 / t, s / t], axis=1)  # (alpha + S x) / t ~ 1
    best, sol = np.inf, (0.0, 1e-12)
    for cand in _nonneg_solutions(a, np.ones_like(t)):
        r = float(np.sum((a @ cand - 1.0) ** 2))
        if r < best:
            best, sol = r, cand
    alpha, inv_beta = sol
    return float(alpha), float(1.0 / max(inv_beta, 1e-15))


def _nonneg_solutions(a: np.ndarray, b: np.ndarray):
    x, *_ = np.linalg.lstsq(a, b, rcond=None)
    if (x >= 0).all():
        yield x
    for j in range(a.shape[1]):  # one coefficient pinned at zero
        xj = np.zeros(a.shape[1])
        col = a[:, j]
        xj[j] = max(0.0, float(col @ b / (col @ col)))
        yield xj


def _rel(pred, meas) -> np.ndarray:
    return (np.asarray(pred, float) - np.asarray(meas, float)) / np.asarray(meas, float)


def fit_core_share(rows: pd.DataFrame) -> float | None:
    """``Device.transport_core_share``: the compute's slowdown beside the collective over the
    collective's own time, summed over sizes (time-weighted: the large buckets a step reduces
    weigh most; per size the ratio is noisy, 0.07-0.88 over two calibrations of this VM, the
    weighted one 0.60-0.67), clipped to [0, 1]; None below 1% (the transport does not run on
    the compute's processor)."""
    share = min(1.0, max(0.0, float(rows["seconds"].sum() / rows["comm_s"].sum())))
    return share if share >= 0.01 else None


def fit_rewarm(rows: pd.DataFrame) -> float:
    """``Device.comm_rewarm_s``: the ``rewarm`` rows' mean over the blocking kinds, at least 0.
    One number for all kinds: per kind the difference moves by ~0.1 ms between runs on this VM
    (four of them: all-reduce 0.17, 0.06, 0.12 and 0.16 ms, reduce-scatter -0.01, 0.23, 0.06 and
    0.17), their mean less (0.12, 0.14, 0.09 and 0.22 ms); nothing in the mechanism (the idled
    core's caches) depends on which collective idled it."""
    return max(0.0, float(rows["seconds"].mean()))


def fit_profile(base: HardwareProfile, data: pd.DataFrame, name: str, precision: str = "fp32",
                backend: str = "gloo") -> Fit:
    """Refit ``base`` to the rows of ``data`` (columns of parsim.validate.bench)."""
    dev = base.device
    kinds = {k: g for k, g in data.groupby("kind")}
    src: dict[str, str] = {}
    peaks = dict(dev.peak_flops)
    tag = f"parsim calibrate --backend {backend}"
    if "memory" in kinds:
        mem_eff, bw = fit_memory(dev, kinds["memory"])
        dev = dataclasses.replace(dev, memory_efficiency=mem_eff, memory_bandwidth=bw)
        src["device.memory_efficiency"] = f"{tag}: median streaming bytes/s over {len(kinds['memory'])} ops (add, layernorm, gelu)"
        src["device.memory_tbyte_per_s"] = (f"{tag}: measured streaming bandwidth" if bw != base.device.memory_bandwidth
                                            else "carried over (datasheet-style estimate); efficiency fitted against it")
    if "update" in kinds:
        upd = kinds["update"]
        achieved = median_rate(upd)
        if achieved > dev.memory_bandwidth:  # the bandwidth becomes the measured one, both rates kept
            src["device.memory_tbyte_per_s"] = f"{tag}: measured in-place update bandwidth"
            dev = dataclasses.replace(dev, memory_bandwidth=achieved,
                                      memory_efficiency=dev.memory_efficiency * dev.memory_bandwidth / achieved)
        dev = dataclasses.replace(dev, update_efficiency=achieved / dev.memory_bandwidth)
        src["device.update_efficiency"] = (f"{tag}: median bytes/s of {len(upd)} in-place updates "
                                           "(add_, mul_ + addcmul_) over the bandwidth above")
    if "optimizer" in kinds:
        opt = kinds["optimizer"]
        dev = dataclasses.replace(dev, optimizer_efficiency=min(1.0, median_rate(opt) / dev.memory_bandwidth))
        src["device.optimizer_efficiency"] = (f"{tag}: median bytes/s of {len(opt)} Adam steps (as the runtime "
                                              "builds them; bytes as parsim.costs.dp counts) over the bandwidth above")
    if "gemm" in kinds:
        eff, h, peak = fit_gemm(dev, kinds["gemm"], precision)
        if peak != dev.peak(precision):
            peaks = {p: peak for p in peaks}
        dev = dataclasses.replace(dev, gemm_efficiency=eff, gemm_half_dim=h, peak_flops=peaks)
        n = len(kinds["gemm"])
        src["device.gemm_efficiency"] = f"{tag}: least-squares (log time) over {n} GEMMs (forward, dX, dW; all ranks computing)"
        src["device.gemm_half_dim"] = src["device.gemm_efficiency"]
    if "attention" in kinds:
        fitted = fit_attention(dev, kinds["attention"], precision)
        dev = dataclasses.replace(dev, **{field: eff for field, (eff, _) in fitted.items()})
        for field, prefix, pas in ATTENTION_FITS:
            if field in fitted:
                what = "fused (SDPA)" if prefix == "sdpa" else "explicit"
                src[f"device.{field}"] = (f"{tag}: geometric mean over {fitted[field][1]} {what} attention {pas} "
                                          "cases" + ("" if prefix == "sdpa" else ", modelled scores traffic taken off"))
    if "launch" in kinds:
        dev = dataclasses.replace(dev, kernel_launch_s=float(kinds["launch"]["seconds"].median()))
        src["device.kernel_launch_us"] = f"{tag}: one-element op, median"
    if "eager" in kinds:
        rows = kinds["eager"]
        for pas in ("forward", "backward"):
            mine = rows[rows["name"].str.startswith(f"block_{pas}")]
            if len(mine):
                per_op = float((mine["seconds"] / mine["ops"]).median())
                dev = dataclasses.replace(dev, **{f"eager_op_{pas}_s": per_op})
                src[f"device.eager_op_{pas}_us"] = (
                    f"{tag}: the torch runtime's block {pas} at a negligible size over the aten ops it "
                    f"dispatched, median of {len(mine)} flavours")
    if "rewarm" in kinds:
        rw = kinds["rewarm"]
        dev = dataclasses.replace(dev, comm_rewarm_s=fit_rewarm(rw))
        src["device.comm_rewarm_us"] = (
            f"{tag}: the runtime's block forward after a blocking call against after a spin of its length, "
            f"less the same for the in-situ rows' GEMM loop, mean over {len(rw)} kinds")
    if "core_share" in kinds:
        share = fit_core_share(kinds["core_share"])
        if share is not None:
            dev = dataclasses.replace(dev, transport_core_share=share)
            src["device.transport_core_share"] = (
                f"{tag}: a GEMM loop's slowdown beside an in-flight all-reduce over the all-reduce's own time, "
                f"summed over {len(kinds['core_share'])} sizes")
    prof = dataclasses.replace(base, name=name, device=dev,  # source_path: "carried over from <base>"
                               description=f"{base.description.split(' (')[0]} (calibrated by {tag})")
    if "p2p" in kinds:
        alpha, beta = fit_alpha_beta(kinds["p2p"])
        # sends whose times the latency alone explains (a noisy run, or sizes too small to show a
        # bandwidth) leave the bandwidth unresolved: the fit's 1e15 B/s would be refused when the
        # written profile loads (parsim.cluster.plausible: at most 1e5 GB/s), so it is held at that
        # bound -- the latency term carries the fit either way
        beta = min(beta, LINK_BANDWIDTH_CEILING)
        tier = LinkTier(base.nvlink.name, beta, alpha, 1.0)
        prof = dataclasses.replace(prof, nvlink=tier)
        how = ("pipeline exchanges (both ranks send after computing, one computes on)"
               if set(kinds["p2p"]["name"]) == {"exchange"} else
               "one-way sends, the sender computing after its isend (as a pipeline rank does)")
        msg = f"{tag}: alpha-beta fit of the mean time of {how} over {len(kinds['p2p'])} sizes"
        src.update({"node.nvlink_gbyte_per_s": msg, "node.nvlink_latency_us": msg,
                    "node.nvlink_efficiency": f"{tag}: bandwidth above is the achieved one"})
        if len({*data.get("host", pd.Series(["x"])).dropna()}) <= 1:  # one host: no inter-node tier to measure
            prof = dataclasses.replace(prof, nic=LinkTier(base.nic.name, beta, alpha, 1.0))
            note = f"{tag}: one host only, set to the measured intra-node (loopback) tier"
            src.update({"network.nic_gbit_per_s": note, "network.nic_latency_us": note, "network.nic_efficiency": note})
    if "p2p_post" in kinds:
        alpha, beta = fit_alpha_beta(kinds["p2p_post"])
        prof = dataclasses.replace(prof, send_post_latency_s=alpha, send_post_bandwidth=beta if beta < 1e14 else 0.0)
        msg = (f"{tag}: alpha-beta fit of the sender's mean time inside isend over {len(kinds['p2p_post'])} sizes "
               "(both ranks computing, then sending to each other, one of them later)")
        src.update({"node.send_post_us": msg, "node.send_post_gbyte_per_s": msg})
    colls = fit_collectives(kinds["collective"]) if "collective" in kinds else ()
    gaps = fit_collective_gaps(kinds["collective_gap"]) if "collective_gap" in kinds else ()
    if gaps:
        prof = dataclasses.replace(prof, collective_gaps=tuple(gp.as_profile_row() for gp in gaps))
    pred = predictions(prof, data, precision, colls)
    quality = {k: float(np.median(np.abs(g["relative_error"]))) for k, g in pred.groupby("kind")}
    if "ring_relative_error" in pred:
        ring = pred["ring_relative_error"].dropna()
        if len(ring):
            quality["collective_ring"] = float(np.median(np.abs(ring)))
    return Fit(prof, src, quality, pred, colls, gaps)


def predictions(prof: HardwareProfile, data: pd.DataFrame, precision: str,
                collectives: tuple[CollectiveFit, ...] = ()) -> pd.DataFrame:
    """Each data row with the profile's predicted seconds and the relative error; a collective
    row is predicted by its fit when there is one (``ring_predicted_s``: the ring formulas on
    the fitted link, beside it)."""
    dev = prof.device
    out = []
    for _, r in data.iterrows():
        kind = r["kind"]
        if kind == "gemm":
            p = dev.gemm_time(int(r["m"]), int(r["n"]), int(r["k"]), precision)
        elif kind == "memory":
            p = dev.memory_time(float(r["bytes"]))
        elif kind == "update":
            p = dev.update_time(float(r["bytes"]))
        elif kind == "optimizer":
            p = dev.optimizer_time(float(r["bytes"]))
        elif kind == "attention":
            name = str(r["name"])
            p = (dev.attention_time(float(r["flops"]), precision, fused=not name.startswith("explicit"),
                                    backward=name.endswith("backward"))
                 + scores_traffic_s(dev, name, r["m"], r["n"], precision))
        elif kind == "launch":
            p = dev.kernel_launch_s
        elif kind == "eager":
            per_op = dev.eager_op_forward_s if "forward" in str(r["name"]) else dev.eager_op_backward_s
            p = float(r["ops"]) * (per_op or dev.kernel_launch_s)
        elif kind == "core_share":
            p = (dev.transport_core_share or 0.0) * float(r["comm_s"])
        elif kind == "rewarm":
            p = dev.comm_rewarm_s or 0.0
        elif kind in ("p2p", "p2p_idle"):  # p2p_idle: reported against the fitted link
            p = prof.nvlink.transfer_time(float(r["bytes"]))
        elif kind == "p2p_post":
            p = prof.send_post_time(float(r["bytes"]))
        elif kind == "collective":
            ring = alpha_beta_time(r["name"], float(r["bytes"]), int(r["group"]),
                                   prof.nvlink.effective_bandwidth, prof.nvlink.latency_s)
            fitted = collective_fit_time(collectives, r["name"], float(r["bytes"]), int(r["group"]))
            out.append({**r.to_dict(), "predicted_s": ring if fitted is None else fitted, "ring_predicted_s": ring})
            continue
        elif kind == "collective_gap":  # the fit at this size, moved by the slope to this gap
            ranks = list(range(int(r["group"])))
            fitted = collective_fit_time(collectives, r["name"], float(r["bytes"]), len(ranks))
            if fitted is None:
                continue
            p = at_gap(prof, str(r["name"]), ranks, fitted, float(r["gap_s"]))
        else:
            continue
        out.append({**r.to_dict(), "predicted_s": p})
    df = pd.DataFrame(out)
    df["relative_error"] = _rel(df["predicted_s"], df["seconds"])
    if "ring_predicted_s" in df:
        df["ring_relative_error"] = _rel(df["ring_predicted_s"], df["seconds"])
    return df
