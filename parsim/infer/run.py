"""`parsim infer`: generation (prefill, then one decode step per new token) of a scenario's
``[inference]`` table over its model, hardware and parallel tables.

Each model replica (``parallel.dp`` of them) generates ``batch`` sequences; its ``tp x pp``
GPUs run every pass stage after stage (one batch in flight: decode is a chain). Per pass and
stage the cost model (:mod:`parsim.costs.inference`) gives each block's seconds; the timeline
has one span per block (per module where the fetch is replayed) and pass on the ``compute``
stream (op ``PREFILL`` or ``DECODE``, microbatch = the token's index), the stage-to-stage
activations on ``p2p``.

Weights offloaded (``[offload] params = "cpu"|"nvme"``, ZeRO-Inference): no weights live on
the GPU; every pass streams them in. Each stage replays DeepSpeed's ZeRO-3 fetch
module by module (:mod:`parsim.infer.zero_fetch`): each of the node's replicas copies ``1/n`` of
a module over its own PCIe link (a blocking copy), an all-gather over NVLink on the same side
stream assembles it, the next copy waits for that all-gather, and the GPU computes the module once
the side stream is done; from NVMe without GPUDirect Storage the partitions are first read into
pinned swap buffers (synchronously without ``prefetch``, so the two hops add up; with it, ahead of
the copies within DeepSpeed's buffer and in-flight limits); each pipeline stage replays its own
modules. NVMe with GPUDirect Storage streams block by block (``nvme`` and ``dp`` streams:
``FETCH``, ``ALL_GATHER``): with ``prefetch`` block i+1 is fetched while block i computes (two
block buffers), without it the fetch waits for the compute. The embedding and LM head stream at
the start and end of each pass.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from parsim.cluster.collectives import select_algorithm
from parsim.config.offload import (
    MAX_STREAMED_GENERATE_TOKENS,
    InferenceConfig,
    OffloadConfig,
    parse_inference,
    parse_offload_inference,
)
from parsim.config.scenario import Scenario
from parsim.costs.inference import (
    DS07_MAX_TOKENS,
    PassCost,
    act_bytes,
    ds07_workspace_bytes,
    cache_bytes_per_sequence,
    kv_bytes_per_sequence,
    kv_concat,
    pass_cost,
    workspace_bytes,
)
from parsim.costs.offload import Tiers, tiers
from parsim.errors import ConfigError
from parsim.files import read_input_text
from parsim.infer import zero_fetch as zf
from parsim.model import total_params
from parsim.model.shapes import layer_gemms
from parsim.scenario import apply_overrides, scenario_from_dict

SPAN_COLUMNS = ("rank", "stream", "op", "stage", "microbatch", "start_s", "end_s", "bytes")


@dataclass(frozen=True, kw_only=True)
class InferJob:
    """A scenario read for inference."""

    scenario: Scenario
    """Model, hardware and parallel tables (its training table synthesised from [inference])."""
    inference: InferenceConfig
    """The ``[inference]`` table."""
    offload: OffloadConfig
    """Where the weights live (``params``); the optimizer keys do not apply."""


def load_inference(path: str | Path, overrides: list[str] | None = None) -> InferJob:
    """Read an inference scenario: ``[inference]`` required, ``[training]`` optional (ignored)."""
    file = str(path)
    try:
        doc = tomllib.loads(read_input_text(path))  # a leading BOM skipped
    except FileNotFoundError:
        raise ConfigError(file, None, "no such scenario file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(file, None, f"cannot read: {getattr(e, 'strerror', None) or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(file, None, f"not valid TOML: {' '.join(str(e).split())}") from None
    doc = apply_overrides(doc, overrides or [])
    if "inference" not in doc:
        raise ConfigError(file, "inference", "missing [inference] table (batch, prompt_tokens, generate_tokens)")
    inf = parse_inference(doc.pop("inference"), file)
    off = parse_offload_inference(doc.pop("offload", {}), file)
    par = doc.get("parallel", {})
    par = par if isinstance(par, dict) else {}
    dp = par.get("dp")
    if dp is None:  # the replicas the GPUs left after tp x pp make (the scenario loader's own default)
        gpus, split = doc.get("gpus"), [par.get(k, 1) for k in ("tp", "pp", "cp")]
        if isinstance(gpus, int) and all(isinstance(x, int) and x > 0 for x in split):
            dp = max(1, gpus // (split[0] * split[1] * split[2]))
    doc["training"] = {"global_batch": inf.batch * (dp if isinstance(dp, int) and dp > 0 else 1),
                       "microbatch_size": inf.batch, "seq_len": inf.context,
                       "precision": inf.precision if inf.precision in ("fp16", "bf16", "fp32") else "fp16"}
    try:
        sc = scenario_from_dict(doc, file, base_dir=Path(path).parent)
    except ConfigError as e:
        if e.key != "training.precision" or e.file != file:
            raise
        # the synthesised training table's precision is the [inference] table's
        raise ConfigError(file, "inference.precision", e.problem) from None
    if off.params != "none" and inf.generate_tokens > MAX_STREAMED_GENERATE_TOKENS:
        raise ConfigError(file, "inference.generate_tokens",
                          f"{inf.generate_tokens:,} is more than parsim simulates with streamed weights "
                          f"({MAX_STREAMED_GENERATE_TOKENS:,}: every pass replays each module's fetch)")
    if off.params != "none" and sc.hardware.host is None:
        raise ConfigError(file, "offload.params", f"hardware profile {sc.hardware.name} has no [host] table")
    if off.params == "nvme" and sc.hardware.host.nvme_bytes <= 0:
        raise ConfigError(file, "offload.params", f"hardware profile {sc.hardware.name} has no NVMe")
    if inf.engine == "deepspeed-0.7" and sc.model.hybrid_pattern:
        raise ConfigError(file, "inference.engine", "DeepSpeed-Inference v0.7 injects transformer blocks; "
                          f"{sc.model.name}'s hybrid (Mamba-2) layers need engine = \"fused\"")
    if inf.engine == "deepspeed-0.7":
        _check_ds07(job_file=file, sc=sc, inf=inf, off=off)
    if inf.kv_cache == "cpu" and sc.hardware.host is None:
        raise ConfigError(file, "inference.kv_cache", f"hardware profile {sc.hardware.name} has no [host] table")
    # one instance's GPUs wait on one another every pass (its tensor-parallel lockstep, its
    # pipeline); replicas serve apart: its slowest chip sets its compute clock
    sc = replace(sc, hardware=sc.hardware.paced(sc.parallel.tp * sc.parallel.pp))
    return InferJob(scenario=sc, inference=inf, offload=off)


def _check_ds07(*, job_file: str, sc: Scenario, inf: InferenceConfig, off: OffloadConfig) -> None:
    """What DeepSpeed-Inference v0.7 kernel injection can run (v0.7.3): tensor parallelism over
    resident weights, a prompt within its workspace's 128 tokens, and for models whose KV cache
    lives in that workspace (all but BLOOM) the whole context within them."""
    ds = "DeepSpeed-Inference v0.7 (inference.engine)"
    if sc.parallel.pp > 1:
        raise ConfigError(job_file, "parallel.pp", f"{ds} splits models by tensor parallelism only; got pp = "
                          f"{sc.parallel.pp}")
    if off.params != "none":
        raise ConfigError(job_file, "offload.params", f"{ds} keeps the weights on the GPU (streaming them is "
                          "ZeRO-Inference: engine = \"fused\")")
    if inf.prompt_tokens > DS07_MAX_TOKENS:
        raise ConfigError(job_file, "inference.prompt_tokens", f"{ds} sizes its workspace for {DS07_MAX_TOKENS} "
                          f"tokens; got a prompt of {inf.prompt_tokens}")
    if sc.model.position != "alibi" and inf.context > DS07_MAX_TOKENS:
        raise ConfigError(job_file, "inference.generate_tokens", f"{ds} caches at most {DS07_MAX_TOKENS} tokens "
                          f"(its workspace's KV area); prompt + generated = {inf.context}")


@dataclass
class _Clock:
    compute: float = 0.0
    fetch: float = 0.0
    gather: float = 0.0


def _node(job: InferJob) -> tuple[int, Tiers]:
    """The replicas on a node (each fetches a share of every weight) and what one GPU gets of the
    node's host link and NVMe while they all fetch."""
    sc = job.scenario
    n = min(sc.parallel.dp, sc.hardware.gpus_per_node)
    return n, tiers(sc.hardware, n)


def _gather_s(job: InferJob, nbytes: float, n: int) -> float:
    """The all-gather assembling ``nbytes`` of weights from the partitions of ``n`` replicas."""
    return select_algorithm(job.scenario.hardware, "all_gather", nbytes, list(range(n)), concurrent=1)[1] if n > 1 else 0.0


def _fetch_s(job: InferJob, nbytes: float) -> tuple[float, str, float]:
    """(seconds, stream, all-gather seconds) to bring ``nbytes`` of weights from NVMe straight to
    every replica's GPU with GPUDirect Storage (block by block; every other streamed case replays
    DeepSpeed's module-level fetch, :func:`_replayed_pass`)."""
    n, t = _node(job)
    return nbytes / n / min(t.nvme_read, t.host_link), "nvme", _gather_s(job, nbytes, n)


def _module_fetch(job: InferJob) -> bool:
    """Whether streamed weights go as DeepSpeed's ZeRO-3 fetch sends them, replayed module by
    module on each stage (:mod:`parsim.infer.zero_fetch`): from host memory, or from NVMe without
    GPUDirect Storage (with it: block by block, :func:`_fetch_s`)."""
    return job.offload.params == "cpu" or not _node(job)[1].gpudirect


def _replayed_pass(job: InferJob, pc, stage: int, token: int, op: str, start: float, spans: list,
                   cache: dict | None = None) -> float:
    """One pass over one pipeline stage whose weights stream from host memory or from NVMe
    through the swap buffers: DeepSpeed's fetch replayed module by module; returns its end."""
    inf = job.inference
    n, t = _node(job)
    nvme = job.offload.params == "nvme"
    # the modules, each one's share of its block's compute and the fetch itself depend on the
    # weights only (the host never waits for the GPU inside a pass): built once per request,
    # then every pass lays its own compute seconds over them
    shape = (pc.embedding_bytes, tuple(pc.weight_bytes), pc.head_bytes)
    store = cache.setdefault("zero_fetch", {}) if cache is not None else {}
    if shape not in store:
        def gather(nbytes: float) -> float:
            return _gather_s(job, nbytes, n)

        per_el = inf.weight_bits / 8
        mods: list[zf.Module] = []
        owner: list[tuple[int, float]] = []  # (block: -1 the embedding, -2 the head; share)
        if pc.embedding_bytes:
            mods.append(zf.single(pc.embedding_bytes, 0.0, n, gather, pc.embedding_bytes / per_el))
            owner.append((-1, 0.0))
        for b, wbytes in enumerate(pc.weight_bytes):
            block = zf.split_block(job.scenario.model, wbytes, 1.0, n, gather)
            mods += block
            owner += [(b, mod.compute_s) for mod in block]
        if pc.head_bytes:
            mods.append(zf.single(pc.head_bytes, 0.0, n, gather, pc.head_bytes / per_el))
            owner.append((-2, 1.0))
        rules = zf.FetchRules(prefetch_bucket=zf.PREFETCH_BUCKET if inf.prefetch else 0.0, nvme=nvme)
        store[shape] = (owner, zf.fetch_timeline(mods, t.nvme_read if nvme else 1.0, t.host_link, rules))
    owner, timeline = store[shape]
    compute = [0.0 if b == -1 else pc.head_s * f if b == -2 else pc.layer_s[b] * f for b, f in owner]
    end, out = zf.lay_compute(timeline, start, compute)
    names = {"nvme": "nvme", "host": t.host_link_name, "dp": "dp", "compute": "compute"}
    for stream, kind, _, s, e, nb in out:
        spans.append((stage, names[stream], op if kind == "COMPUTE" else kind, stage, token, s, e, nb))
    return end


def _stage_layers(sc: Scenario, stage: int) -> tuple[int, ...]:
    """The blocks pipeline stage ``stage`` holds."""
    first = sum(sc.layers_per_stage[:stage])
    return tuple(range(first, first + sc.layers_per_stage[stage]))


def _stage_pass(job: InferJob, stage: int, layers: tuple[int, ...], batch: int, new: int, context: int,
                cache: dict | None = None) -> PassCost:
    """:func:`parsim.costs.inference.pass_cost` of ``layers`` on pipeline stage ``stage`` with the
    request's tensor parallelism, precision, weights, KV-cache place, head and engine."""
    sc, inf = job.scenario, job.inference
    return pass_cost(hw=sc.hardware, model=sc.model, layers=layers, first_stage=stage == 0,
                     last_stage=stage == sc.parallel.pp - 1, batch=batch, new_tokens=new, context=context,
                     tp=sc.parallel.tp, precision=inf.precision, weight_bits=inf.weight_bits,
                     kv_on_host=inf.kv_cache == "cpu", cache=cache, replicated_head=inf.lm_head == "replicated",
                     engine=inf.engine)


def _run_pass(job: InferJob, clocks: list[_Clock], spans: list, op: str, token: int, new: int, context: int,
              start: float, cache: dict | None = None) -> float:
    """One forward pass through every stage from ``start``; returns its end (``cache``: the
    request's, :func:`parsim.costs.inference.pass_cost`)."""
    sc, inf = job.scenario, job.inference
    par, hw = sc.parallel, sc.hardware
    streamed = job.offload.params != "none"
    t = start
    for stage in range(par.pp):
        pc = _stage_pass(job, stage, _stage_layers(sc, stage), inf.batch, new, context, cache)
        c = clocks[stage]
        if stage > 0:  # the activations arrive from the previous stage
            nb = inf.batch * new * sc.model.d_model * act_bytes(inf.precision)
            link = hw.link_between(0, par.tp)
            arrive = t + link.transfer_time(nb)
            spans.append((stage - 1, "p2p", "SEND_F", stage - 1, token, t, arrive, nb))
            t = arrive
        c.compute = max(c.compute, t)
        if streamed and _module_fetch(job):
            c.compute = c.fetch = t = _replayed_pass(job, pc, stage, token, op, c.compute, spans, cache)
            continue
        blocks = ([(0.0, pc.embedding_bytes)] if pc.embedding_bytes else []) + list(zip(pc.layer_s, pc.weight_bytes))
        if stage == par.pp - 1:
            blocks.append((pc.head_s, pc.head_bytes))
        ready_prev2 = c.compute  # when the buffer two blocks back is free (prefetch depth 1)
        prev_end = c.compute
        for i, (secs, wbytes) in enumerate(blocks):
            begin = c.compute
            if streamed and wbytes:
                f, stream, g = _fetch_s(job, wbytes)
                issue = max(c.fetch, ready_prev2 if inf.prefetch else c.compute)
                issue = max(issue, start if i == 0 and stage == 0 else 0.0)
                c.fetch = issue + f
                spans.append((stage, stream, "FETCH", stage, token, issue, c.fetch, wbytes / max(1, min(
                    par.dp, hw.gpus_per_node))))
                gathered = c.fetch + g
                if g:
                    spans.append((stage, "dp", "ALL_GATHER", stage, token, c.fetch, gathered, wbytes))
                # DeepSpeed's ZeRO-3 fetch (partition_parameters.all_gather_coalesced, v0.7) copies a
                # rank's partition host->device and launches the all-gather on one side stream, and
                # waits for the all-gather on that stream before the next module's copy: the next
                # block's host copy starts when this block's all-gather ends
                c.fetch = gathered
                begin = max(begin, gathered)
            end = begin + secs
            spans.append((stage, "compute", op, stage, token, begin, end, 0.0))
            ready_prev2, prev_end = prev_end, end
            c.compute = end
        t = c.compute
    return t


def run_inference(job: InferJob) -> tuple[dict, pd.DataFrame]:
    """The metrics (``--json`` object) and the span table of one generation request."""
    sc, inf, off = job.scenario, job.inference, job.offload
    par, hw, m = sc.parallel, sc.hardware, sc.model
    clocks = [_Clock() for _ in range(par.pp)]
    spans: list = []
    cache: dict = {}  # shape-only costs, shared by this request's passes
    prefill_end = _run_pass(job, clocks, spans, "PREFILL", 0, inf.prompt_tokens, inf.prompt_tokens, 0.0, cache)
    t = prefill_end
    for tok in range(1, inf.generate_tokens):
        t = _run_pass(job, clocks, spans, "DECODE", tok, 1, inf.prompt_tokens + tok, t, cache)
    total = t
    decode = (total - prefill_end) / (inf.generate_tokens - 1) if inf.generate_tokens > 1 else 0.0
    tokens = par.dp * inf.batch * inf.generate_tokens
    mem = memory(job)
    tl = pd.DataFrame(spans, columns=SPAN_COLUMNS)
    busy = {s: float((g["end_s"] - g["start_s"]).sum()) / par.pp
            for s, g in tl.groupby("stream") if s != "compute"}
    out = {
        "name": sc.name, "hardware": hw.name, "model": m.name, "params": total_params(m),
        "world_size": par.world_size,
        "parallel": {"dp": par.dp, "tp": par.tp, "pp": par.pp},
        "batch": inf.batch, "prompt_tokens": inf.prompt_tokens, "generate_tokens": inf.generate_tokens,
        "precision": inf.precision, "weight_bits": inf.weight_bits, "kv_cache": inf.kv_cache,
        "weights": off.params if off.params != "none" else "gpu", "prefetch": inf.prefetch,
        "engine": inf.engine,
        "prefill_s": prefill_end, "decode_s_per_token": decode, "total_s": total,
        "generate_tokens_per_s": tokens / total if total > 0 else 0.0,
        "generate_tokens_per_s_per_gpu": tokens / total / par.world_size if total > 0 else 0.0,
        "ms_per_token_per_sequence": 1e3 * total / (inf.batch * inf.generate_tokens),
        **mem,
        "stream_busy_s": busy,
    }
    return out, tl


def _ds07_bytes_per_sequence(job: InferJob, layers: int) -> float:
    """Peak bytes per sequence on one GPU under DeepSpeed-Inference v0.7 (weights apart): its
    workspace, and the larger of the prefill's moment (Hugging Face's logits for every prompt
    position, fp16, and BLOOM's first cache) and the last decode step's (BLOOM: the previous
    step's cache and the new one, which ``generate`` holds together until the forward returns;
    the other models' cache is in the workspace; the next-token logits)."""
    sc, inf = job.scenario, job.inference
    m, tp, prec = sc.model, sc.parallel.tp, inf.precision
    vocab = m.vocab_size / (1 if inf.lm_head == "replicated" else tp) * act_bytes(prec)
    concat = kv_concat(inf.engine, m)

    def kv(tokens: int) -> float:
        return kv_bytes_per_sequence(m, layers, tp, tokens, prec) if concat else 0.0
    prefill = inf.prompt_tokens * vocab + kv(inf.prompt_tokens)
    last = kv(inf.context - 1) + kv(inf.context) + vocab
    return ds07_workspace_bytes(m, 1, prec) + max(prefill, last)


def _ds07_dequantized_bytes(job: InferJob) -> float:
    """The 16-bit copy DeepSpeed-Inference v0.7's int8 GEMM makes of its weight (``quantized_gemm``:
    ``at::empty`` of the weight's shape, freed after the GEMM): the largest one, on one GPU."""
    sc, inf = job.scenario, job.inference
    if inf.engine != "deepspeed-0.7" or inf.weight_bits == 16:
        return 0.0
    return max(g.n * g.k * g.count for g in layer_gemms(sc.model, 1, sc.parallel.tp, 0)) * act_bytes(inf.precision)


def memory(job: InferJob) -> dict:
    """Per-GPU memory of the worst stage: weights, KV cache, prefill workspace; the largest batch."""
    sc, inf, off = job.scenario, job.inference, job.offload
    par, hw, m = sc.parallel, sc.hardware, sc.model
    cap = hw.device.usable_memory_bytes
    worst = None
    for stage in range(par.pp):
        layers = _stage_layers(sc, stage)
        pc = _stage_pass(job, stage, layers[:1] or (0,), 1, 1, 1)  # weight bytes only
        per_layer = pc.weight_bytes[0] if pc.weight_bytes else 0.0
        blocks = per_layer * len(layers)
        if m.hybrid_pattern:  # hybrid layers differ: each its own weights
            pc = _stage_pass(job, stage, layers or (0,), 1, 1, 1)
            per_layer, blocks = max(pc.weight_bytes, default=0.0), sum(pc.weight_bytes) if layers else 0.0
        weights = blocks + pc.resident_head_bytes + _ds07_dequantized_bytes(job)
        if off.params != "none":  # the block computing and the one prefetched, gathered whole
            weights = 2 * max(per_layer, pc.head_bytes, pc.embedding_bytes)
        kv_seq = cache_bytes_per_sequence(m, layers, par.tp, inf.context, inf.precision)
        if inf.engine == "deepspeed-0.7":
            per_seq = _ds07_bytes_per_sequence(job, len(layers))
        else:
            ws_seq = workspace_bytes(m, par.tp, 1, inf.prompt_tokens, inf.precision, inf.lm_head == "replicated")
            per_seq = (kv_seq if inf.kv_cache == "gpu" else 0.0) + ws_seq
        max_batch = max(0, int((cap - weights) // per_seq)) if per_seq > 0 else 0
        used = weights + inf.batch * per_seq
        row = (used, weights, kv_seq * inf.batch, max_batch)
        if worst is None or row[0] > worst[0]:
            worst = row
    used, weights, kv, max_batch = worst
    host_need = 0.0
    if off.params == "cpu":
        host_need = total_params(m) * inf.weight_bits / 8
    if inf.kv_cache == "cpu":
        host_need += kv * par.world_size
    nvme_need = total_params(m) * inf.weight_bits / 8 if off.params == "nvme" else 0.0
    host = hw.host
    host_ok = host_need == 0 or host is not None and host_need <= host.pinned_memory_bytes
    nvme_ok = nvme_need == 0 or host is not None and nvme_need <= host.nvme_bytes
    return {"weight_bytes_per_gpu": weights, "kv_cache_bytes": kv, "peak_memory_bytes": used,
            "memory_capacity_bytes": cap, "max_batch": max_batch,
            "fits_in_memory": bool(used <= cap and host_ok and nvme_ok),
            "host_memory_bytes_per_node": host_need, "nvme_bytes_per_node": nvme_need}
