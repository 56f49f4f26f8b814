"""DeepSpeed ZeRO-3's parameter fetch, module by module (ZeRO-Inference's weight streaming).

With ``offload_param.device = "cpu"`` a weight reaches the GPU in one blocking host-to-device
copy (then, over several GPUs, an all-gather of the ranks' partitions). With ``"nvme"`` and no
GPUDirect Storage it takes two hops: an asynchronous NVMe read into one of a few pinned swap
buffers, then that copy. How much of the first hop hides under the second is decided by
DeepSpeed's fetch logic, which this module replays at the granularity DeepSpeed fetches at: the
leaf modules of the model (``fetch_sub_module`` runs in each module's forward pre-hook). The
rules, from DeepSpeed v0.7.3 (September 2022, the ZeRO-Inference blog's release):

* A parameter whose partition is smaller than the asynchronous-I/O block (1 MiB by default) never
  goes to NVMe: it stays in host memory (``partitioned_param_swapper.swappable_tensor``).
* Fetching a module (``partition_parameters.all_gather_coalesced``): NVMe partitions not yet read
  are swapped in synchronously; partitions whose read is in flight are waited for with
  ``synchronize_reads``, which waits for *every* pending read (``aio_read_handle.wait()``), not
  only theirs. The copy to the GPU is a blocking ``.to(device)`` (the host waits for it) on the
  side stream, where the all-gather follows, so the next copy also waits for that all-gather.
* Then, with a prefetch bucket (``stage3_prefetch_bucket_size`` > 0), the coordinator copies the
  next parameters of the trace to the GPU until the bucket is full or the parameters gathered on
  the GPU reach ``stage3_max_live_parameters`` (a module's are released after it), stopping at
  the first one still on NVMe (a read in flight is waited for as above), and issues asynchronous
  NVMe reads for the parameters after those, while the elements it has considered stay within
  twice the elements in flight to the GPU and a swap buffer is free
  (``partitioned_param_coordinator.__prefetch_nvme_param_partitions``). Without a bucket there
  is no read-ahead: every read is synchronous and the hops add up.
* A swap buffer is free again once its parameter's copy has been made; the GPU computes a
  module once the side stream is done (``wait_stream``), without holding the host (the next
  fetch starts at once); the pass ends when the host, the side stream and the GPU are all done
  (``generate`` reads each token).

Not modelled: the reads of the several ranks of a node contend only through their 1/n share of
the node's NVMe rate (``parsim.costs.offload.tiers``).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

MIN_AIO_BYTES = 1 << 20
"""Smallest partition DeepSpeed puts on NVMe: ``max(MIN_AIO_BYTES, aio.block_size)``, both 1 MiB by
default (deepspeed/runtime/swap_tensor: ``swappable_tensor``)."""
SWAP_BUFFERS = 5
"""Pinned buffers NVMe reads land in: ``offload_param.buffer_count``'s default (offload_config.py)."""
PREFETCH_BUCKET = 5e7
"""Elements the coordinator prefetches ahead: ``stage3_prefetch_bucket_size``'s default
(deepspeed/runtime/zero/config.py)."""
MAX_LIVE = 1e9
"""Elements that may be gathered on the GPU at once, prefetched ones included:
``stage3_max_live_parameters``'s default (deepspeed/runtime/zero/config.py)."""


@dataclass(frozen=True)
class Module:
    """One leaf module as the fetch sees it."""

    param_bytes: tuple[float, ...]
    """Bytes of this rank's partition of each of its parameters."""
    param_numel: tuple[float, ...]
    """Elements of each whole parameter (DeepSpeed's ``ds_numel``, what its prefetch rules count)."""
    compute_s: float
    """Seconds the GPU computes it, once its parameters are gathered."""
    gather_s: float = 0.0
    """Seconds of the all-gather that assembles its parameters from the ranks' partitions."""


def block_modules(model) -> list[tuple[float, ...]] | None:
    """Elements of each parameter of each leaf module of one decoder block, in forward order, as
    the model's reference (Hugging Face) implementation lays them out; None for blocks it does not
    lay out here (MoE, multi-head latent attention, blocks with other than two norms): those are
    fetched as one module."""
    m = model
    if m.n_experts > 1 or m.kv_lora_rank > 0 or m.block_norms != 2:
        return None
    d, hd = m.d_model, m.head_dim_
    q, kv, f = m.n_heads * hd, m.n_kv_heads * hd, m.d_ff
    qb = m.bias or m.qkv_bias
    norm = (float(d), float(d)) if m.norm == "layernorm" and m.norm_shift else (float(d),)
    mods: list[tuple[float, ...]] = [norm]
    if m.fused_qkv:
        mods.append((float((q + 2 * kv) * d),) + ((float(q + 2 * kv),) if qb else ()))
    else:
        for width in (q, kv, kv):
            mods.append((float(width * d),) + ((float(width),) if qb else ()))
    mods.append((float(d * q),) + ((float(d),) if m.bias else ()))
    mods.append(norm)
    if m.ffn_matrices == 3:
        mods += [(float(f * d),) + ((float(f),) if m.bias else ())] * 2
    else:
        mods.append((float(f * d),) + ((float(f),) if m.bias else ()))
    mods.append((float(d * f),) + ((float(d),) if m.bias else ()))
    return mods


def split_block(model, block_bytes: float, compute_s: float, ranks: int,
                gather_s: Callable[[float], float]) -> list[Module]:
    """One block's modules: the block's weight bytes (``block_bytes``, whole, at the inference
    precision) split over its parameters in proportion to their elements, each rank holding 1/ranks
    of each; its compute split the same way (a decode step's GEMMs take time with the weights)."""
    layout = block_modules(model)
    if not layout:
        return [single(block_bytes, compute_s, ranks, gather_s)]
    total = sum(sum(p) for p in layout)
    out = []
    for params in layout:
        share = sum(params) / total
        out.append(Module(param_bytes=tuple(block_bytes * n / total / ranks for n in params),
                          param_numel=tuple(params), compute_s=compute_s * share,
                          gather_s=gather_s(block_bytes * share) if ranks > 1 else 0.0))
    return out


def single(nbytes: float, compute_s: float, ranks: int, gather_s: Callable[[float], float],
           numel: float | None = None) -> Module:
    """A module with one parameter of ``nbytes`` (whole): the embedding, the LM head."""
    return Module(param_bytes=(nbytes / ranks,), param_numel=(numel if numel is not None else nbytes / 2,),
                  compute_s=compute_s, gather_s=gather_s(nbytes) if ranks > 1 else 0.0)


@dataclass(frozen=True)
class FetchRules:
    """The knobs of the fetch (DeepSpeed's defaults unless a scenario says otherwise)."""

    prefetch_bucket: float = PREFETCH_BUCKET
    """Elements prefetched ahead; 0: no prefetch and no NVMe read-ahead."""
    swap_buffers: int = SWAP_BUFFERS
    """Pinned NVMe read buffers."""
    max_live: float = MAX_LIVE
    """Elements gathered on the GPU at once; the prefetch takes at most what is left of it."""
    min_aio_bytes: float = MIN_AIO_BYTES
    """Partitions below this stay in host memory."""
    nvme: bool = True
    """Weights offloaded to NVMe (``offload_param.device = "nvme"``); False: all in host memory
    (``"cpu"``), where the fetch is the same without the reads."""


Span = tuple[str, str, int, float, float, float]
"""(stream, op, module index, start, end, bytes)."""


@dataclass(frozen=True)
class FetchTimeline:
    """The fetch of one pass from time 0: what does not depend on the compute (the host never
    waits for the GPU inside a pass), so passes that stream the same modules share it."""

    spans: tuple[Span, ...]
    """``nvme``/``SWAP_IN`` reads, ``host``/``FETCH`` copies, ``dp``/``ALL_GATHER`` gathers."""
    ready: tuple[float, ...]
    """Per module: when the side stream the compute waits for is done."""
    end: float
    """When the host and the side stream are done."""


def run_pass(modules: list[Module], start: float, nvme_bps: float, host_bps: float,
             rules: FetchRules = FetchRules()) -> tuple[float, list[Span]]:
    """Replay one forward pass from ``start``: its end and its spans
    (stream, op, module index, start, end, bytes): ``nvme``/``SWAP_IN`` reads, host-link ``FETCH``
    copies, ``dp``/``ALL_GATHER`` gathers, ``compute``/``COMPUTE`` per module (their ``compute_s``)."""
    return lay_compute(fetch_timeline(modules, nvme_bps, host_bps, rules), start, [m.compute_s for m in modules])


def lay_compute(tl: FetchTimeline, start: float, compute: list[float]) -> tuple[float, list[Span]]:
    """A pass from ``start`` over the fetch ``tl`` with each module's ``compute`` seconds: its end
    and its spans. Passes over the same modules share one :func:`fetch_timeline`."""
    spans = [(st, op, j, start + a, start + b, nb) for st, op, j, a, b, nb in tl.spans]
    gpu = start
    for j, c in enumerate(compute):
        s = max(gpu, start + tl.ready[j])
        gpu = s + c
        if c > 0:
            spans.append(("compute", "COMPUTE", j, s, gpu, 0.0))
    return max(start + tl.end, gpu), spans


def fetch_timeline(modules: list[Module], nvme_bps: float, host_bps: float, rules: FetchRules) -> FetchTimeline:
    """DeepSpeed's fetch of one pass from time 0 (the rules in the module docstring)."""
    params: list[tuple[int, float, float]] = []  # (module, bytes, numel)
    first: list[int] = []
    for j, mod in enumerate(modules):
        first.append(len(params))
        params += [(j, b, n) for b, n in zip(mod.param_bytes, mod.param_numel)]
    module_bytes = [sum(mod.param_bytes) for mod in modules]
    n_p = len(params)
    on_nvme = [rules.nvme and b >= rules.min_aio_bytes for _, b, _ in params]
    read_end: list[float | None] = [None] * n_p
    synced = [False] * n_p
    on_gpu = [False] * n_p
    spans: list[Span] = []
    ready: list[float] = []
    t = 0.0                # the host (never goes back: the buffer bookkeeping below relies on it)
    nvme = 0.0             # when the NVMe queue drains
    side = 0.0             # the copy + all-gather stream
    in_flight: set[int] = set()
    in_flight_numel = 0.0
    available = 0.0           # elements gathered on the GPU (DeepSpeed's __n_available_params)
    pending: list[int] = []   # reads issued, not yet synchronised
    unfreed = 0               # swap buffers holding a read partition not yet copied
    releases: list[float] = []  # min-heap: when the copied partitions' buffers free up

    def held() -> int:  # swap buffers in use at the host's time t
        while releases and releases[0] <= t:
            heapq.heappop(releases)
        return unfreed + len(releases)

    def read(i: int) -> None:
        nonlocal nvme, unfreed
        s = max(t, nvme)
        nvme = s + params[i][1] / nvme_bps
        read_end[i] = nvme
        pending.append(i)
        unfreed += 1
        spans.append(("nvme", "SWAP_IN", params[i][0], s, nvme, params[i][1]))

    def wait_reads() -> None:  # synchronize_reads: every pending read
        nonlocal t
        t = max(t, nvme)
        for i in pending:
            synced[i] = True
        pending.clear()

    def copy(ids: list[int]) -> None:
        nonlocal t, side, unfreed, in_flight_numel, available
        groups: list[tuple[int, list[int]]] = []  # ids are in trace order: a module's are adjacent
        for i in ids:
            j = params[i][0]
            if groups and groups[-1][0] == j:
                groups[-1][1].append(i)
            else:
                groups.append((j, [i]))
        for j, group in groups:
            nb = sum(params[i][1] for i in group)
            s = max(t, side)
            e = s + nb / host_bps
            spans.append(("host", "FETCH", j, s, e, nb))
            t = e                            # .to(device): the host waits for the copy
            # the all-gather of what was copied follows on the same stream (a module's parameters
            # may be copied in two goes when a prefetch bucket fills mid-module)
            g = modules[j].gather_s * nb / module_bytes[j]
            side = e + g
            if g > 0:
                spans.append(("dp", "ALL_GATHER", j, e, side, nb))
            for i in group:
                on_gpu[i] = True
                in_flight.add(i)
                in_flight_numel += params[i][2]
                available += params[i][2]
                if on_nvme[i]:  # its swap buffer is free once the copy is made
                    unfreed -= 1
                    heapq.heappush(releases, e)

    for j, mod in enumerate(modules):
        last = first[j] + len(mod.param_bytes)
        ids = [i for i in range(first[j], last) if not on_gpu[i]]
        if ids:
            need = [i for i in ids if on_nvme[i]]
            if need:
                missing = [i for i in need if read_end[i] is None]
                if missing:  # a synchronous swap-in, once enough buffers are free
                    while held() + len(missing) > rules.swap_buffers and releases:
                        t = releases[0]
                    for i in missing:
                        read(i)
                if pending and not all(synced[i] for i in need):
                    wait_reads()
            copy(ids)
        if rules.prefetch_bucket > 0:
            q, numel, ahead = last, 0.0, []
            budget = min(rules.max_live - available, rules.prefetch_bucket)
            while q < n_p and numel < budget:
                if on_nvme[q] and read_end[q] is None:
                    break                    # still on NVMe: the read-ahead's business
                if not on_gpu[q]:
                    ahead.append(q)
                    numel += params[q][2]
                q += 1
            if ahead:
                if any(on_nvme[i] and not synced[i] for i in ahead):
                    wait_reads()
                copy(ahead)
            while q < n_p and on_gpu[q]:  # popped off the trace queue by earlier prefetches
                q += 1
            limit = 2 * in_flight_numel
            considered, picks = 0.0, []
            free = rules.swap_buffers - held()
            for r in range(q, n_p):
                if considered > limit or len(picks) >= free:
                    break
                if on_nvme[r] and read_end[r] is None:
                    picks.append(r)
                considered += params[r][2]
            for r in picks:
                read(r)
        # the module's parameters are waited for (they leave the in-flight set); the compute
        # stream waits for the whole side stream as it stands (fetch_sub_module's wait_stream)
        for i in range(first[j], last):
            if i in in_flight:
                in_flight.remove(i)
                in_flight_numel -= params[i][2]
            available -= params[i][2]  # released after the module (used once per pass)
        ready.append(side)
    return FetchTimeline(spans=tuple(spans), ready=tuple(ready), end=max(t, side))
