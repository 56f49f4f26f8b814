"""DeepSpeed ZeRO-3's parameter fetch, module by module (ZeRO-Inference's weight streaming).

With ``offload_param.device = "cpu"`` a weight reaches the GPU in one blocking host-to-device copy
(then, over several GPUs, an all-gather of the ranks' partitions). With ``"nvme"`` and no
GPUDirect Storage it takes two hops: an asynchronous NVMe read into one of a few pinned swap buffers, then a host-to-device copy
(and, over several GPUs, an all-gather of the ranks' partitions). How much of the first hop hides
under the second is decided by DeepSpeed's fetch logic, which this module replays at the
granularity DeepSpeed fetches at: the leaf modules of the model (``fetch_sub_module`` runs in each
module's forward pre-hook). The rules, from DeepSpeed v0.7.3 (September 2022, the ZeRO-Inference
blog's release):

* A parameter whose partition is smaller than the asynchronous-I/O block (1 MiB by default) never
  goes to NVMe: it stays in host memory (``partitioned_param_swapper.swappable_tensor``).
* Fetching a module (``partition_parameters.all_gather_coalesced``): NVMe partitions not yet read
  are swapped in synchronously; partitions whose read is in flight are waited for with
  ``synchronize_reads``, which waits for *every* pending read (``aio_read_handle.wait()``), not
  only theirs. The copy to the GPU is a blocking ``.to(device)`` (the host waits for it) on the
  side stream, where the all-gather follows, so the next copy also waits for that all-gather.
* Then, with a prefetch bucket (``stage3_prefetch_bucket_size`` > 0), the coordinator copies the
  next parameters of the trace to the GPU until the bucket is full, stopping at the first one
  still on NVMe (a read in flight is waited for as above), and issues asynchronous NVMe reads
  for the parameters after those, while the elements it has considered stay within twice the
  elements in flight to the GPU and a swap buffer is free
  (``partitioned_param_coordinator.__prefetch_nvme_param_partitions``). Without a bucket there
  is no read-ahead: every read is synchronous and the hops add up.
* A swap buffer is free again once its parameter's copy has been made; the GPU computes a
  module once its parameters are gathered, without holding the host (the next fetch starts at
  once); the pass ends when the host and the GPU are both done (``generate`` reads each token).

Not modelled: the reads of the several ranks of a node contend only through their 1/n share of
the node's NVMe rate (``parsim.costs.offload.tiers``); ``stage3_max_live_parameters``.
"""
from __future__ import annotations

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
    lay out here (MoE, multi-head latent attention): those are fetched as one module."""
    m = model
    if m.n_experts > 1 or m.kv_lora_rank > 0:
        return None
    d, hd = m.d_model, m.head_dim_
    q, kv, f = m.n_heads * hd, m.n_kv_heads * hd, m.d_ff
    qb = m.bias or m.qkv_bias
    norm = (float(d), float(d)) if m.norm == "layernorm" else (float(d),)
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
    min_aio_bytes: float = MIN_AIO_BYTES
    """Partitions below this stay in host memory."""
    nvme: bool = True
    """Weights offloaded to NVMe (``offload_param.device = "nvme"``); False: all in host memory
    (``"cpu"``), where the fetch is the same without the reads."""


def run_pass(modules: list[Module], start: float, nvme_bps: float, host_bps: float,
             rules: FetchRules = FetchRules()) -> tuple[float, list[tuple[str, str, int, float, float, float]]]:
    """Replay one forward pass from ``start``: its end and its spans
    (stream, op, module index, start, end, bytes): ``nvme``/``SWAP_IN`` reads, host-link ``FETCH``
    copies, ``dp``/``ALL_GATHER`` gathers, ``compute``/``COMPUTE`` per module."""
    params: list[tuple[int, float, float]] = []  # (module, bytes, numel)
    first: list[int] = []
    for j, mod in enumerate(modules):
        first.append(len(params))
        params += [(j, b, n) for b, n in zip(mod.param_bytes, mod.param_numel)]
    n_p = len(params)
    on_nvme = [rules.nvme and b >= rules.min_aio_bytes for _, b, _ in params]
    read_end: list[float | None] = [None] * n_p
    synced = [False] * n_p
    on_gpu = [False] * n_p
    freed: list[float | None] = [None] * n_p
    spans: list[tuple[str, str, int, float, float, float]] = []
    t = start              # the host
    nvme = start           # when the NVMe queue drains
    side = start           # the copy + all-gather stream
    gpu = start
    in_flight: set[int] = set()

    def held(at: float) -> int:
        return sum(1 for i in range(n_p) if on_nvme[i] and read_end[i] is not None
                   and (freed[i] is None or freed[i] > at))

    def read(i: int, at: float) -> None:
        nonlocal nvme
        s = max(at, nvme)
        nvme = s + params[i][1] / nvme_bps
        read_end[i] = nvme
        spans.append(("nvme", "SWAP_IN", params[i][0], s, nvme, params[i][1]))

    def wait_reads() -> None:  # synchronize_reads: every pending read
        nonlocal t
        t = max(t, nvme)
        for i in range(n_p):
            if read_end[i] is not None:
                synced[i] = True

    def copy(ids: list[int]) -> None:
        nonlocal t, side
        by_module: dict[int, list[int]] = {}
        for i in ids:
            by_module.setdefault(params[i][0], []).append(i)
        for j, group in by_module.items():
            nb = sum(params[i][1] for i in group)
            s = max(t, side)
            e = s + nb / host_bps
            spans.append(("host", "FETCH", j, s, e, nb))
            t = e                            # .to(device): the host waits for the copy
            # the all-gather of what was copied follows on the same stream (a module's parameters
            # may be copied in two goes when a prefetch bucket fills mid-module)
            g = modules[j].gather_s * nb / sum(modules[j].param_bytes)
            side = e + g
            if g > 0:
                spans.append(("dp", "ALL_GATHER", j, e, side, nb))
            for i in group:
                on_gpu[i] = True
                freed[i] = e
                in_flight.add(i)

    for j, mod in enumerate(modules):
        ids = [i for i in range(first[j], first[j] + len(mod.param_bytes)) if not on_gpu[i]]
        need = [i for i in ids if on_nvme[i]]
        missing = [i for i in need if read_end[i] is None]
        if missing:  # a synchronous swap-in, once enough buffers are free
            while held(t) + len(missing) > rules.swap_buffers:
                t = min(f for f in freed if f is not None and f > t)
            for i in missing:
                read(i, t)
        if any(not synced[i] for i in need):
            wait_reads()
        if ids:
            copy(ids)
        last = first[j] + len(mod.param_bytes)
        if rules.prefetch_bucket > 0:
            q, numel, ahead = last, 0.0, []
            while q < n_p and numel < rules.prefetch_bucket:
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
            limit = 2 * sum(params[i][2] for i in in_flight)
            considered, picks = 0.0, []
            free = rules.swap_buffers - held(t)
            for r in range(q, n_p):
                if considered > limit or len(picks) >= free:
                    break
                if on_nvme[r] and read_end[r] is None:
                    picks.append(r)
                considered += params[r][2]
            for r in picks:
                read(r, t)
        # the module's parameters are waited for (they leave the in-flight set); the compute
        # stream waits for the whole side stream (fetch_sub_module's wait_stream), then computes
        for i in range(first[j], last):
            in_flight.discard(i)
        s = max(gpu, side)
        gpu = s + mod.compute_s
        if mod.compute_s > 0:
            spans.append(("compute", "COMPUTE", j, s, gpu, 0.0))
    return max(t, gpu, side), spans
