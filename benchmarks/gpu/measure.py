"""Ground truth on one GPU: GEMMs, attention, memory-bound kernels and whole transformer layers,
timed with CUDA events, written as CSVs that ``benchmarks/gpu/accuracy.py`` compares with parsim.

    python benchmarks/gpu/measure.py --out DIR [--budget-s 420] [--quick]

Self-contained (torch only: the device machine has no simpy), so nothing here predicts; every
row records what was run (shape, dtype, layout, backend), its median time over repeated launches
and what the shape implies (FLOPs, bytes), nothing else. Phases, each time-boxed by ``--budget-s``
so a slow phase cannot starve the rest, each CSV rewritten after every row (a run killed at its
limit still leaves its rows):

* ``gemm.csv``: the linear layers' GEMMs of the bundled dense models at the tensor-parallel sizes
  they run (forward ``x W^T``, input gradient ``dy W``, weight gradient ``dy^T x``, BF16; the same
  shapes through ``torch._scaled_mm`` in FP8 E4M3, per-tensor scales), a MAMF-style grid for the
  maximum, an N sweep at fixed M and K (tile and wave quantization), small M (decode) and small K
  rows, and grouped expert GEMMs at the MoE models' tokens per expert;
* ``attention.csv``: ``scaled_dot_product_attention`` with the flash (FlashAttention-2) and cuDNN
  backends, forward and backward, 16k tokens per batch as the FlashAttention papers time it,
  sequence 512-32k, head dim 64/128, causal or not, and grouped-query heads;
* ``elementwise.csv``: memory-bound kernels (copy, RMSNorm and LayerNorm, SwiGLU, GeLU, rotary,
  residual add, cross-entropy over 32k-256k vocabularies, AdamW steps) eager and, where it compiles,
  under ``torch.compile``, with the bytes each must move;
* ``layers.csv``: first the Megatron-Core GPT blocks of the H100 weak-scaling table (1.7B, and
  7.1B as tensor parallelism 2 shards it: LayerNorm, biases, GeLU MLP, dropout 0.1, compiled
  bias-GeLU and bias-dropout-add as Megatron's jit fusions), then one Llama-3-8B block and one
  Llama-3-70B block as tensor parallelism 8 shards it,
  forward, backward (input gradient alone and whole), recompute none / selective / full, eager
  (Hugging Face-style ops) and with the memory-bound pieces compiled (one kernel each, as fused
  kernels run them), plus the activation bytes each forward leaves allocated;
* ``head.csv``: the 1.7B GPT's LM head (4096 tokens x 2048 -> 131072) and Megatron-Core's
  op-by-op fp32 cross-entropy, forward and whole backward;
* ``sustained.csv``: six workloads each back to back for ``--sustain-s`` seconds (GEMMs of three
  shapes in BF16 and one in FP8, a Llama-3-8B block forward + backward, a device copy), the rate per
  wall-clock second: with clocks.csv, the clock and power each kind of work settles at under the cap;
* ``clocks.csv``: nvidia-smi sampled every 200 ms through the run; ``env.json``: device, driver,
  versions, each phase's wall time.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F


class Sink:
    """Rows of one CSV, rewritten whole after each append (a killed run keeps its rows)."""

    def __init__(self, path: Path):
        self.path, self.rows = path, []

    def add(self, **row) -> None:
        # wall-clock time of the row, to join with clocks.csv's SM clock and power: the chip sits
        # at its power cap through long GEMM runs, so a row's clock is part of its measurement
        self.rows.append({**row, "t_unix": round(time.time(), 3)})
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            w.writerows(self.rows)
        tmp.replace(self.path)


class Clock:
    """Time left in the run, and each phase's own share of it."""

    def __init__(self, budget_s: float):
        self.t0, self.budget = time.perf_counter(), budget_s
        self.phase_end = self.t0 + budget_s

    def phase(self, share_s: float) -> None:
        self.phase_end = min(self.t0 + self.budget, time.perf_counter() + share_s)

    def over(self) -> bool:
        return time.perf_counter() > self.phase_end


CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def timed(fn, target_s: float = 0.03, min_reps: int = 5, max_reps: int = 200, warmup: int = 2) -> dict:
    """Median seconds of ``fn()`` over repeated launches (CUDA events around each call), after
    warm-up; the repeat count is sized so the timed calls take about ``target_s``."""
    for _ in range(warmup):
        fn()
    sync()
    t = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t, 1e-6)
    reps = int(min(max_reps, max(min_reps, target_s / one)))
    times = []
    if CUDA:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in evs:
            a.record()
            fn()
            b.record()
        sync()
        times = [a.elapsed_time(b) / 1e3 for a, b in evs]
    else:
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    times.sort()
    return {"time_s": statistics.median(times), "min_s": times[0], "p90_s": times[int(0.9 * (len(times) - 1))],
            "reps": reps}


def _sets(nbytes: float) -> int:
    """Operand sets to rotate through so repeated calls read HBM, not a warm L2 (H100/H200: 50-60 MB)."""
    return int(min(6, max(1, math.ceil(256e6 / max(nbytes, 1.0)))))


# ---------------------------------------------------------------- GEMMs
MODELS = {  # d_model, heads, kv heads, head dim, d_ff, ffn
    "llama3-8b": (4096, 32, 8, 128, 14336, "swiglu"),
    "llama3-70b": (8192, 64, 8, 128, 28672, "swiglu"),
    "gpt3-175b": (12288, 96, 96, 128, 49152, "gelu"),
    "mcore-gpt-1.7b": (2048, 16, 16, 128, 8192, "gelu"),
    "mcore-gpt-7.1b": (4096, 32, 32, 128, 16384, "gelu"),
}
GEMM_CASES = [("mcore-gpt-1.7b", 1, 4096), ("mcore-gpt-7.1b", 2, 4096),  # first: K = 2048 (see GPT_LAYERS)
              ("llama3-8b", 1, 4096), ("llama3-8b", 1, 8192), ("llama3-8b", 2, 8192),
              ("llama3-70b", 4, 4096), ("llama3-70b", 8, 4096), ("llama3-70b", 8, 8192),
              ("gpt3-175b", 8, 2048)]
"""(model, tp, tokens per microbatch): the shapes the bundled dense scenarios and the H100 weak-scaling
rows run; each row's ``t_unix`` joins it with clocks.csv (the chip's clock while it ran)."""
MOE = {  # d_model, expert d_ff, experts, top-k, local experts (EP)
    "mixtral-8x7b": (4096, 14336, 8, 2, 1),
    "qwen3-30b-a3b": (2048, 768, 128, 8, 16),
    "qwen3-235b-a22b": (4096, 1536, 128, 8, 16),
    "deepseek-v3": (7168, 2048, 256, 8, 8),
    "gpt-oss-120b": (2880, 2880, 128, 4, 16),
}


def linear_shapes(model: str, tp: int, tokens: int) -> list[tuple[str, int, int, int]]:
    """(name, M, N, K) of one block's forward linears on one TP rank."""
    d, h, kv, hd, ff, ffn = MODELS[model]
    fc1 = 2 * ff if ffn == "swiglu" else ff
    return [("qkv", tokens, (h + 2 * kv) * hd // tp, d), ("proj", tokens, d, h * hd // tp),
            ("fc1", tokens, fc1 // tp, d), ("fc2", tokens, d, ff // tp)]


def gemm_bf16(m: int, n: int, k: int, kind: str, dtype) -> dict:
    """One GEMM as the linear layer runs it: fwd ``x W^T`` (x m x k, W n x k), dgrad ``dy W``
    (dy m x k', W k' x n), wgrad ``dy^T x`` (dy k x m, x k x n): the output is always m x n."""
    per = (m * k + k * n + m * n) * torch.finfo(dtype).bits / 8
    ops = []
    for _ in range(_sets(per)):
        if kind == "fwd":
            a, b = torch.randn(m, k, device=DEV, dtype=dtype), torch.randn(n, k, device=DEV, dtype=dtype)
            ops.append(lambda a=a, b=b: F.linear(a, b))
        elif kind == "dgrad":
            a, b = torch.randn(m, k, device=DEV, dtype=dtype), torch.randn(k, n, device=DEV, dtype=dtype)
            ops.append(lambda a=a, b=b: a @ b)
        else:  # wgrad: both operands transposed views of token-major tensors
            a, b = torch.randn(k, m, device=DEV, dtype=dtype), torch.randn(k, n, device=DEV, dtype=dtype)
            ops.append(lambda a=a, b=b: a.t() @ b)
    it = iter(range(1 << 62))
    r = timed(lambda: ops[next(it) % len(ops)]())
    return r


def gemm_fp8(m: int, n: int, k: int) -> dict | None:
    """``torch._scaled_mm`` E4M3 x E4M3 -> BF16, per-tensor scales (the TN layout Hopper's FP8 GEMM takes)."""
    if not (CUDA and hasattr(torch, "_scaled_mm")) or m % 16 or n % 16 or k % 16:
        return None
    one = torch.ones((), device=DEV)
    ops = []
    for _ in range(_sets(m * k + k * n + 2 * m * n)):
        a = torch.randn(m, k, device=DEV).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=DEV).to(torch.float8_e4m3fn)
        ops.append(lambda a=a, b=b: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
    it = iter(range(1 << 62))
    return timed(lambda: ops[next(it) % len(ops)]())


def grouped(experts: int, rows: int, n: int, k: int, dtype) -> dict:
    """Experts' GEMMs of one layer: ``torch._grouped_mm`` (one kernel) where torch has it, else
    one matmul per expert (recorded in ``impl``)."""
    x = torch.randn(experts * rows, k, device=DEV, dtype=dtype)
    w = torch.randn(experts, n, k, device=DEV, dtype=dtype)
    if CUDA and hasattr(torch, "_grouped_mm"):
        offs = torch.arange(rows, experts * rows + 1, rows, device=DEV, dtype=torch.int32)
        wt = w.transpose(-2, -1)
        try:
            torch._grouped_mm(x, wt, offs=offs)
            return {**timed(lambda: torch._grouped_mm(x, wt, offs=offs)), "impl": "torch._grouped_mm"}
        except Exception as e:  # noqa: BLE001 -- recorded, the loop below times it instead
            print("grouped_mm:", type(e).__name__, str(e)[:120], flush=True)
    xs = x.view(experts, rows, k)
    return {**timed(lambda: [F.linear(xs[e], w[e]) for e in range(experts)]), "impl": "loop"}


def phase_gemm(out: Path, clock: Clock, quick: bool) -> None:
    sink = Sink(out / "gemm.csv")
    dtype = torch.bfloat16 if CUDA else torch.float32
    rows: list[tuple[str, str, int, int, int]] = []  # (group, case, M, N, K)
    cases = [("llama3-8b", 1, 128)] if quick else GEMM_CASES
    for model, tp, tokens in cases:
        for name, m, n, k in linear_shapes(model, tp, tokens):
            tag = f"{model} tp{tp} t{tokens} {name}"
            rows += [("model", f"{tag} fwd", m, n, k), ("model", f"{tag} dgrad", m, k, n), ("model", f"{tag} wgrad", n, k, m)]
    grid = (256, 512) if quick else (1024, 2048, 4096, 8192, 16384)
    kgrid = (256, 512) if quick else (2048, 4096, 8192, 13312, 16384)
    rows += [("mamf", f"grid {m}x{n}x{k}", m, n, k) for m in grid for n in grid for k in kgrid
             if m * n * k <= 8192 * 8192 * 16384]
    if not quick:
        rows += [("nsweep", f"n {n}", 4096, n, 4096) for n in range(256, 8193, 256)]
        rows += [("small_m", f"m {m}", m, 8192, 8192) for m in (1, 8, 16, 32, 64, 128, 256, 512, 1024)]
        rows += [("small_k", f"k {k}", 8192, 8192, k) for k in (64, 128, 256, 512, 1024)]
    for group, case, m, n, k in rows:
        if clock.over():
            print("gemm: phase budget spent at", case, flush=True)
            break
        kind = "dgrad" if case.endswith("dgrad") else "wgrad" if case.endswith("wgrad") else "fwd"
        flops = 2.0 * m * n * k
        r = gemm_bf16(m, n, k, kind, dtype)
        sink.add(group=group, case=case, precision="bf16" if CUDA else "fp32", layout=kind, m=m, n=n, k=k,
                 flops=flops, **r, tflops=flops / r["time_s"] / 1e12)
        if group in ("model", "mamf") or (group == "nsweep" and n % 1024 == 0):
            r8 = gemm_fp8(m, n, k)
            if r8 is not None:
                sink.add(group=group, case=case, precision="fp8", layout="tn", m=m, n=n, k=k, flops=flops, **r8,
                         tflops=flops / r8["time_s"] / 1e12)
    # grouped expert GEMMs: tokens per microbatch 4096 (8192 for the smaller models), balanced routing
    for model, (d, f, e, top, local) in MOE.items():
        if quick and model != "qwen3-30b-a3b":
            continue
        for tokens in ((256,) if quick else (4096, 8192)):
            rows_per = tokens * top // e
            for name, n, k in (("fc1", 2 * f, d), ("fc2", d, f)):
                if clock.over():
                    return
                g = min(local, 4) if quick else local
                r = grouped(g, rows_per, n, k, dtype)
                flops = 2.0 * g * rows_per * n * k
                sink.add(group="grouped", case=f"{model} t{tokens} {name} {g}x{rows_per}", precision=str(dtype)[6:],
                         layout="fwd", m=g * rows_per, n=n, k=k, flops=flops, **r, tflops=flops / r["time_s"] / 1e12,
                         experts=g, rows_per_expert=rows_per)


# ---------------------------------------------------------------- attention
def _sdpa_backends():
    from torch.nn.attention import SDPBackend
    out = {"flash": SDPBackend.FLASH_ATTENTION}
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        out["cudnn"] = SDPBackend.CUDNN_ATTENTION
    if not CUDA:
        out = {"math": SDPBackend.MATH}
    return out


def attention_case(backend, b: int, h: int, kv: int, s: int, d: int, causal: bool, dtype) -> tuple[dict, dict]:
    from torch.nn.attention import sdpa_kernel
    q = torch.randn(b, h, s, d, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(b, kv, s, d, device=DEV, dtype=dtype, requires_grad=True)
    v = torch.randn(b, kv, s, d, device=DEV, dtype=dtype, requires_grad=True)
    gqa = kv != h
    with sdpa_kernel([backend]):
        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        f = timed(fwd)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        do = torch.randn_like(o)
        bw = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    return f, bw


def phase_attention(out: Path, clock: Clock, quick: bool) -> None:
    sink = Sink(out / "attention.csv")
    dtype = torch.bfloat16 if CUDA else torch.float32
    seqs = (128, 256) if quick else (512, 1024, 2048, 4096, 8192, 16384, 32768)
    tokens = 512 if quick else 16384
    hidden = 256 if quick else 2048
    cases = []
    for s in seqs:
        b = max(1, tokens // s)
        for d in (64, 128):
            for causal in (False, True):
                cases.append((b, hidden // d, hidden // d, s, d, causal))
        cases.append((b, 32 if not quick else 4, 8 if not quick else 2, s, 128 if not quick else 64, True))  # GQA 4:1
    for name, backend in _sdpa_backends().items():
        for b, h, kv, s, d, causal in cases:
            if clock.over():
                print("attention: phase budget spent", flush=True)
                return
            flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
            row = dict(backend=name, batch=b, heads=h, kv_heads=kv, seq=s, head_dim=d, causal=causal)
            try:
                f, bw = attention_case(backend, b, h, kv, s, d, causal, dtype)
            except Exception as e:  # noqa: BLE001 -- a backend that refuses a shape is a row, not a crash
                sink.add(**row, pass_="error", error=f"{type(e).__name__}: {str(e)[:160]}")
                continue
            sink.add(**row, pass_="fwd", flops=flops, **f, tflops=flops / f["time_s"] / 1e12)
            sink.add(**row, pass_="bwd", flops=2.5 * flops, **bw, tflops=2.5 * flops / bw["time_s"] / 1e12)
            if CUDA:
                torch.cuda.empty_cache()


# ---------------------------------------------------------------- memory-bound kernels
def hf_rmsnorm(x, w, eps=1e-5):
    """Hugging Face LlamaRMSNorm.forward, op for op."""
    dt = x.dtype
    h = x.to(torch.float32)
    var = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(var + eps)
    return w * h.to(dt)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def hf_rotary(q, k, cos, sin):
    """Hugging Face apply_rotary_pos_emb, op for op."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def swiglu_eager(g, u):
    return F.silu(g) * u


def phase_elementwise(out: Path, clock: Clock, quick: bool, compile_share_s: float) -> None:
    sink = Sink(out / "elementwise.csv")
    dtype = torch.bfloat16 if CUDA else torch.float32
    a = torch.finfo(dtype).bits // 8
    t = 256 if quick else 8192
    d = 256 if quick else 4096
    ff = 512 if quick else 14336
    heads, kvh, hd = (4, 2, 64) if quick else (32, 8, 128)

    def add(case, variant, pass_, nbytes, kernels, r):
        sink.add(case=case, variant=variant, pass_=pass_, tokens=t, bytes=nbytes, kernels=kernels, **r,
                 gbyte_per_s=nbytes / r["time_s"] / 1e9)

    # copy: the bandwidth ceiling (bytes read + written)
    n = (1 << 20) if quick else (1 << 30)
    src, dst = torch.empty(n, dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
    add("copy", "eager", "fwd", 2 * n, 1, timed(lambda: dst.copy_(src)))

    def fwd_bwd(case, variant, fn, inputs, nbytes_f, kernels_f, nbytes_b, kernels_b):
        y = fn(*inputs)
        dy = tuple(torch.randn_like(z) for z in y) if isinstance(y, tuple) else torch.randn_like(y)
        add(case, variant, "fwd", nbytes_f, kernels_f, timed(lambda: fn(*inputs)))
        yy = fn(*inputs)
        need = [i for i in inputs if i.requires_grad]
        add(case, variant, "bwd", nbytes_b, kernels_b, timed(lambda: torch.autograd.grad(yy, need, dy, retain_graph=True)))

    x = torch.randn(t, d, device=DEV, dtype=dtype, requires_grad=True)
    w = torch.ones(d, device=DEV, dtype=dtype, requires_grad=True)
    wb = torch.zeros(d, device=DEV, dtype=dtype, requires_grad=True)
    g = torch.randn(t, ff, device=DEV, dtype=dtype, requires_grad=True)
    u = torch.randn(t, ff, device=DEV, dtype=dtype, requires_grad=True)
    q = torch.randn(1, heads, t, hd, device=DEV, dtype=dtype, requires_grad=True)
    k = torch.randn(1, kvh, t, hd, device=DEV, dtype=dtype, requires_grad=True)
    cos = torch.randn(t, hd, device=DEV, dtype=dtype)
    sin = torch.randn(t, hd, device=DEV, dtype=dtype)
    r = torch.randn(t, d, device=DEV, dtype=dtype, requires_grad=True)
    xd, qk = t * d * a, (heads + kvh) * t * hd * a
    eager = [
        ("rmsnorm", "hf", hf_rmsnorm, (x, w), t * d * ((a + 4) + 8 + 4 + 8 + (4 + a) + 2 * a), 8, None, None),
        ("rmsnorm", "native", lambda x, w: F.rms_norm(x, (d,), w, 1e-5), (x, w), 2 * xd, None, 3 * xd, None),
        ("layernorm", "native", lambda x, w, b: F.layer_norm(x, (d,), w, b), (x, w, wb), 2 * xd, 1, 3 * xd, None),
        ("swiglu", "eager", swiglu_eager, (g, u), 5 * t * ff * a, 2, None, None),
        ("gelu", "eager", F.gelu, (g,), 2 * t * ff * a, 1, 3 * t * ff * a, 1),
        ("rotary", "hf", lambda q, k: hf_rotary(q, k, cos, sin), (q, k), 10 * qk, 10, None, None),
        ("residual", "eager", lambda x, r: x + r, (x, r), 3 * xd, 1, 2 * xd, 0),
    ]
    for case, variant, fn, inputs, nbf, kf, nbb, kb in eager:
        if clock.over():
            return
        fwd_bwd(case, variant, fn, inputs, nbf, kf, nbb if nbb is not None else 2 * nbf, kb if kb is not None else (2 * kf if kf else None))
    # cross-entropy over fp32 logits (eager PyTorch: logits.float() then cross_entropy)
    for vocab in ((512,) if quick else (32768, 131072, 262144)):
        if clock.over():
            return
        logits = torch.randn(t, vocab, device=DEV, dtype=dtype, requires_grad=True)
        tgt = torch.randint(0, vocab, (t,), device=DEV)
        fwd_bwd(f"cross_entropy v{vocab}", "eager", lambda z: F.cross_entropy(z.float(), tgt), (logits,),
                t * vocab * (a + 4 + 4 + 4), None, t * vocab * (4 + 4 + 4 + a), None)
        del logits
        if CUDA:
            torch.cuda.empty_cache()
    # AdamW over fp32 master weights (Megatron's distributed optimizer: fp32 params, grads, m, v)
    for impl in ("fused", "foreach"):
        if clock.over():
            return
        n_params = (1 << 16) if quick else 512 * (1 << 20)
        p = torch.zeros(n_params, device=DEV, requires_grad=True)
        p.grad = torch.randn_like(p)
        try:
            opt = torch.optim.AdamW([p], lr=1e-4, **({impl: True} if CUDA else {}))
            add(f"adamw {n_params}", impl, "step", 16 * n_params + 12 * n_params, None, timed(opt.step, min_reps=3))
        except Exception as e:  # noqa: BLE001
            print("adamw", impl, e, flush=True)
        del p
    # compiled: the same pieces as one generated kernel each (inductor), forward and backward
    clock.phase(compile_share_s)
    compiled = [
        ("rmsnorm", lambda x, w: (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype) * w,
         (x, w), 2 * xd, 3 * xd),
        ("swiglu", swiglu_eager, (g, u), 3 * t * ff * a, 5 * t * ff * a),
        ("rotary", lambda q, k: hf_rotary(q, k, cos, sin), (q, k), 2 * qk, 2 * qk),
        ("residual", lambda x, r: x + r, (x, r), 3 * xd, 2 * xd),
    ]
    for case, fn, inputs, nbf, nbb in compiled:
        if clock.over():
            print("elementwise: compile budget spent", flush=True)
            return
        try:
            cf = torch.compile(fn)
            t0 = time.perf_counter()
            y = cf(*inputs)
            compile_s = time.perf_counter() - t0
            if isinstance(y, tuple):
                dy = tuple(torch.randn_like(z) for z in y)
            else:
                dy = torch.randn_like(y)
            add(case, "compiled", "fwd", nbf, 1, {**timed(lambda: cf(*inputs)), "compile_s": compile_s})
            yy = cf(*inputs)
            need = [i for i in inputs if i.requires_grad]
            add(case, "compiled", "bwd", nbb, 1, timed(lambda: torch.autograd.grad(yy, need, dy, retain_graph=True)))
        except Exception as e:  # noqa: BLE001
            print("compile", case, type(e).__name__, str(e)[:200], flush=True)


# ---------------------------------------------------------------- layers
class _RMSNormFused(torch.autograd.Function):
    """RMSNorm keeping what a fused kernel keeps: x and 1/rms per row (parsim.validate.model's)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, w)
        return (x.float() * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, dy):
        x, rstd, w = ctx.saved_tensors
        xh = x.float() * rstd
        dxh = dy.float() * w.float()
        dx = rstd * (dxh - xh * (dxh * xh).mean(-1, keepdim=True))
        return dx.to(x.dtype), (dy.float() * xh).reshape(-1, x.shape[-1]).sum(0).to(w.dtype), None


class _SwiGLUFused(torch.autograd.Function):
    """silu(gate) * up keeping gate and up only (Megatron's fused bias-SwiGLU)."""

    @staticmethod
    def forward(ctx, gu):
        g, u = gu.chunk(2, dim=-1)
        ctx.save_for_backward(gu)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dy):
        (gu,) = ctx.saved_tensors
        g, u = gu.float().chunk(2, dim=-1)
        sig = torch.sigmoid(g)
        dg = dy.float() * u * sig * (1 + g * (1 - sig))
        du = dy.float() * g * sig
        return torch.cat([dg, du], dim=-1).to(gu.dtype)


class Layer(torch.nn.Module):
    """A Llama block on one TP rank: RMSNorm, fused QKV, rotary, SDPA (causal, GQA), output
    projection, residual, RMSNorm, fused gate/up (FC1), SwiGLU, FC2, residual. ``style``:
    ``eager`` (Hugging Face modules op for op), ``fused`` (norm and SwiGLU as autograd functions
    that keep what fused kernels keep), ``compiled`` (``fused``'s norm, rotary, SwiGLU and residual
    pieces through torch.compile: one kernel each way, as fused kernels run them)."""

    def __init__(self, d, h, kv, hd, ff, seq, dtype, style: str, backend, recompute: str, gpt: bool = False):
        super().__init__()
        self.h, self.kv, self.hd, self.style, self.backend, self.recompute = h, kv, hd, style, backend, recompute
        self.gpt = gpt  # Megatron's GPT block: LayerNorm, biases, GeLU MLP, dropout 0.1 (module docstring)
        init = lambda *s: torch.nn.Parameter(torch.randn(*s, device=DEV, dtype=dtype) * 0.02)
        self.w_qkv, self.w_o = init((h + 2 * kv) * hd, d), init(d, h * hd)
        self.w_fc1, self.w_fc2 = init((1 if gpt else 2) * ff, d), init(d, ff)
        self.n1 = torch.nn.Parameter(torch.ones(d, device=DEV, dtype=dtype))
        self.n2 = torch.nn.Parameter(torch.ones(d, device=DEV, dtype=dtype))
        if gpt:
            self.b_qkv, self.b_o, self.b_fc1, self.b_fc2 = (init(n) for n in ((h + 2 * kv) * hd, d, ff, d))
            self.n1b, self.n2b = init(d), init(d)
        pos = torch.arange(seq, device=DEV, dtype=torch.float32)
        inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=DEV, dtype=torch.float32) / hd))
        ang = torch.outer(pos, inv)
        emb = torch.cat([ang, ang], dim=-1)
        self.cos, self.sin = emb.cos().to(dtype), emb.sin().to(dtype)
        if gpt and style == "compiled":  # Megatron's jit-fused bias-GeLU and bias-dropout-add
            self.c_gelu = torch.compile(lambda u, b: F.gelu(u + b, approximate="tanh"))
            self.c_bda = torch.compile(lambda x, y, b: x + F.dropout(y + b, p=GPT_DROPOUT, training=True))
        if style == "compiled":
            self.c_norm = torch.compile(lambda x, w: _RMSNormFused.apply(x, w, 1e-5))
            self.c_rope = torch.compile(lambda q, k, c, s: hf_rotary(q, k, c, s))
            self.c_act = torch.compile(lambda gu: (lambda g, u: F.silu(g) * u)(*gu.chunk(2, dim=-1)))
            self.c_add = torch.compile(lambda a, b: a + b)

    def norm(self, x, w):
        if self.style == "eager":
            return hf_rmsnorm(x, w)
        if self.style == "compiled":
            return self.c_norm(x, w)
        return _RMSNormFused.apply(x, w, 1e-5)

    def rope(self, q, k):
        if self.style == "compiled":
            return self.c_rope(q, k, self.cos, self.sin)
        return hf_rotary(q, k, self.cos, self.sin)

    def act(self, gu):
        if self.style == "eager":
            g, u = gu.chunk(2, dim=-1)
            return F.silu(g) * u
        if self.style == "compiled":
            return self.c_act(gu)
        return _SwiGLUFused.apply(gu)

    def add(self, a, b):
        return self.c_add(a, b) if self.style == "compiled" else a + b

    def core(self, q, k, v):
        from torch.nn.attention import sdpa_kernel
        with sdpa_kernel([self.backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv != self.h,
                                                  dropout_p=GPT_DROPOUT if self.gpt else 0.0)

    def gpt_block(self, x):
        """Megatron-Core's GPT layer on one TP rank: LayerNorm, fused QKV with bias, rotary, core
        attention with dropout, projection whose bias joins the bias-dropout-add, LayerNorm, FC1
        whose bias joins the bias-GeLU, FC2, bias-dropout-add."""
        b, s, d = x.shape
        bias_gelu = self.c_gelu if self.style == "compiled" else (lambda u, c: F.gelu(u + c, approximate="tanh"))
        bda = self.c_bda if self.style == "compiled" else (
            lambda r, y, c: r + F.dropout(y + c, p=GPT_DROPOUT, training=True))
        qkv = F.linear(F.layer_norm(x, (d,), self.n1, self.n1b), self.w_qkv, self.b_qkv)
        q, k, v = qkv.split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], dim=-1)
        q = q.view(b, s, self.h, self.hd).transpose(1, 2)
        k = k.view(b, s, self.kv, self.hd).transpose(1, 2)
        v = v.view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = self.rope(q, k)
        o = self.core(q, k, v)
        x = bda(x, F.linear(o.transpose(1, 2).reshape(b, s, self.h * self.hd), self.w_o), self.b_o)
        u = F.linear(F.layer_norm(x, (d,), self.n2, self.n2b), self.w_fc1)
        return bda(x, F.linear(bias_gelu(u, self.b_fc1), self.w_fc2), self.b_fc2)

    def block(self, x):
        if self.gpt:
            return self.gpt_block(x)
        b, s, _ = x.shape
        qkv = F.linear(self.norm(x, self.n1), self.w_qkv)
        q, k, v = qkv.split([self.h * self.hd, self.kv * self.hd, self.kv * self.hd], dim=-1)
        q = q.view(b, s, self.h, self.hd).transpose(1, 2)
        k = k.view(b, s, self.kv, self.hd).transpose(1, 2)
        v = v.view(b, s, self.kv, self.hd).transpose(1, 2)
        q, k = self.rope(q, k)
        if self.recompute == "selective":
            from torch.utils.checkpoint import checkpoint
            o = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            o = self.core(q, k, v)
        x = self.add(x, F.linear(o.transpose(1, 2).reshape(b, s, self.h * self.hd), self.w_o))
        return self.add(x, F.linear(self.act(F.linear(self.norm(x, self.n2), self.w_fc1)), self.w_fc2))

    def forward(self, x):
        if self.recompute == "full":
            from torch.utils.checkpoint import checkpoint
            return checkpoint(self.block, x, use_reentrant=False)
        return self.block(x)


LAYERS = {  # name: (d, heads, kv heads, head dim, d_ff) on one TP rank
    "llama3-8b": (4096, 32, 8, 128, 14336),
    "llama3-70b-tp8": (8192, 8, 1, 128, 3584),
}
GPT_LAYERS = {  # Megatron-Core GPT blocks of the H100 weak-scaling table (tests/data/published.json) on one TP rank
    "mcore-gpt-1.7b": (2048, 16, 16, 128, 8192),
    "mcore-gpt-7.1b-tp2": (4096, 16, 16, 128, 8192),
}
GPT_DROPOUT = 0.1
"""Megatron-LM's --hidden-dropout and --attention-dropout defaults."""
GPT_VOCAB = 131072
"""The weak-scaling table's vocabulary: the LM head and loss case (``head_case``)."""


def layer_case(sink: Sink, name: str, seq: int, style: str, backend_name: str, recompute: str, dtype) -> None:
    gpt = name in GPT_LAYERS
    d, h, kv, hd, ff = GPT_LAYERS[name] if gpt else LAYERS[name]
    backend = _sdpa_backends()[backend_name]
    t0 = time.perf_counter()
    layer = Layer(d, h, kv, hd, ff, seq, dtype, style, backend, recompute, gpt=gpt)
    params = list(layer.parameters())
    x = torch.randn(1, seq, d, device=DEV, dtype=dtype, requires_grad=True)
    dy = torch.randn(1, seq, d, device=DEV, dtype=dtype)
    # memory: what one forward leaves allocated (its stash plus its output), and its transient peak
    y = layer(x)
    torch.autograd.grad(y, [x, *params], dy)  # warm (compiles, workspaces)
    del y
    sync()
    if CUDA:
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    y = layer(x)
    sync()
    mem = {}
    if CUDA:
        mem = {"allocated_after_fwd_bytes": torch.cuda.memory_allocated() - before,
               "peak_fwd_bytes": torch.cuda.max_memory_allocated() - before,
               "reserved_bytes": torch.cuda.memory_reserved(), "output_bytes": y.numel() * y.element_size(),
               "input_bytes": x.numel() * x.element_size()}
        torch.cuda.reset_peak_memory_stats()
    torch.autograd.grad(y, [x, *params], dy)
    sync()
    if CUDA:
        mem["peak_bwd_bytes"] = torch.cuda.max_memory_allocated() - before
    del y
    setup_s = time.perf_counter() - t0

    def step(which):
        y = layer(x)
        return torch.autograd.grad(y, [x] if which == "bwd_input" else [x, *params], dy)

    rows = {}
    f = timed(lambda: layer(x), target_s=0.15, min_reps=5, max_reps=30)
    rows["fwd"] = f
    full = timed(lambda: step("bwd"), target_s=0.3, min_reps=5, max_reps=30)
    inp = timed(lambda: step("bwd_input"), target_s=0.3, min_reps=5, max_reps=30)
    rows["bwd"] = {k: (v - f[k] if k.endswith("_s") else v) for k, v in full.items()}
    rows["bwd_input"] = {k: (v - f[k] if k.endswith("_s") else v) for k, v in inp.items()}
    for pass_, r in rows.items():
        sink.add(layer=name, seq=seq, style=style, backend=backend_name, recompute=recompute, pass_=pass_,
                 d_model=d, heads=h, kv_heads=kv, head_dim=hd, d_ff=ff, **r, setup_s=round(setup_s, 2), **mem)


class _VocabCrossEntropyOpByOp(torch.autograd.Function):
    """The loss as Megatron-Core's unfused vocabulary-parallel cross-entropy runs it on one TP rank
    (the op sequence, no TP reductions): the logits cast to fp32, the row max, an in-place
    subtraction and exponent, the row sum, the target's logit, the log-sum minus it, the softmax
    kept in place for the backward; backward: the target's entry less one, scaled by the loss
    gradient in place (the cast's backward casts it back)."""

    @staticmethod
    def forward(ctx, logits, target):
        z = logits.float()
        z -= z.max(dim=-1)[0].unsqueeze(-1)
        picked = z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        torch.exp(z, out=z)
        total = z.sum(dim=-1)
        loss = torch.log(total) - picked
        z.div_(total.unsqueeze(-1))
        ctx.save_for_backward(z, target)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        softmax, target = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        softmax[rows, target] -= 1.0
        softmax.mul_(dloss.unsqueeze(-1))
        return softmax, None


def head_case(sink: Sink, name: str, tokens: int, d: int, vocab: int, dtype) -> None:
    """The LM head GEMM and the op-by-op fp32 cross-entropy of a Megatron-Core GPT on one GPU
    (``head.csv``): forward (GEMM + loss) and whole backward (loss gradient, the cast back, both GEMMs)."""
    x = torch.randn(tokens, d, device=DEV, dtype=dtype, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(vocab, d, device=DEV, dtype=dtype) * 0.02)
    tgt = torch.randint(0, vocab, (tokens,), device=DEV)

    def fwd():
        return _VocabCrossEntropyOpByOp.apply(F.linear(x, w), tgt).sum()

    torch.autograd.grad(fwd(), [x, w])  # warm
    f = timed(fwd, target_s=0.15, min_reps=5, max_reps=30)
    full = timed(lambda: torch.autograd.grad(fwd(), [x, w]), target_s=0.3, min_reps=5, max_reps=30)
    b = {k: (v - f[k] if k.endswith("_s") else v) for k, v in full.items()}
    for pass_, r in (("fwd", f), ("bwd", b)):
        sink.add(case=name, tokens=tokens, d_model=d, vocab=vocab, pass_=pass_, **r)


def _gqa_runs(name: str, dtype) -> bool:
    """Whether SDPA's ``name`` backend runs grouped-query heads forward and backward (the layers need it)."""
    from torch.nn.attention import sdpa_kernel
    if name not in _sdpa_backends():
        return False
    q = torch.randn(1, 8, 256, 128, device=DEV, dtype=dtype, requires_grad=True)
    kv = torch.randn(1, 2, 256, 128, device=DEV, dtype=dtype, requires_grad=True)
    try:
        with sdpa_kernel([_sdpa_backends()[name]]):
            F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True).sum().backward()
        return True
    except Exception as e:  # noqa: BLE001
        print(f"sdpa {name} with GQA: {type(e).__name__}: {str(e)[:160]}", flush=True)
        return False


def phase_layers(out: Path, clock: Clock, quick: bool, styles: tuple[str, ...]) -> None:
    sink = Sink(out / "layers.csv")
    dtype = torch.bfloat16 if CUDA else torch.float32
    if quick:
        LAYERS["tiny"] = (128, 4, 2, 32, 256)
    backend = "cudnn" if _gqa_runs("cudnn", dtype) else next(iter(_sdpa_backends()))
    print("layers: attention backend", backend, flush=True)
    names = ("tiny",) if quick else ("llama3-8b", "llama3-70b-tp8")
    seqs = (64,) if quick else (4096, 8192)
    # first, the Megatron-Core GPT blocks of the H100 weak-scaling rows parsim predicts 13-20% fast
    # (reports/fidelity.md: whether their blocks or the rest of the step is the gap), and their
    # LM head and loss; then the Llama blocks
    gpt = ("tiny-gpt",) if quick else tuple(GPT_LAYERS)
    if quick:
        GPT_LAYERS["tiny-gpt"] = (128, 4, 4, 32, 512)
    plan = [(n, 64 if quick else 4096, "compiled" if CUDA else "eager", backend, "none") for n in gpt]
    try:
        head_case(Sink(out / "head.csv"), "mcore-gpt-1.7b head", 64 if quick else 4096, 128 if quick else 2048,
                  512 if quick else GPT_VOCAB, dtype)
    except Exception as e:  # noqa: BLE001
        print("head case", type(e).__name__, str(e)[:200], flush=True)
    for style in styles:
        for name in names:
            for seq in seqs:
                for rc in (("none", "selective", "full") if style != "compiled" else ("none", "full")):
                    plan.append((name, seq, style, backend, rc))
    if not quick:  # FlashAttention-2 under the same eager block, recompute none
        plan += [(n, 8192, "fused", "flash", "none") for n in names]
    for name, seq, style, be, rc in plan:
        if clock.over():
            print("layers: phase budget spent", flush=True)
            return
        try:
            layer_case(sink, name, seq, style, be, rc, dtype)
        except Exception as e:  # noqa: BLE001
            print("layer", name, seq, style, be, rc, type(e).__name__, str(e)[:200], flush=True)
            traceback.print_exc()
            if name in GPT_LAYERS and be == "cudnn" and "flash" in _sdpa_backends():
                try:  # attention dropout where SDPA's cuDNN backend refuses it: FlashAttention-2 runs it
                    layer_case(sink, name, seq, style, "flash", rc, dtype)
                except Exception as e2:  # noqa: BLE001
                    print("layer", name, "flash", type(e2).__name__, str(e2)[:200], flush=True)
        if CUDA:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------- sustained clock
def _sustain(sink: Sink, workload: str, fn, work: float, unit: str, seconds: float) -> None:
    """``fn`` back to back for ``seconds``: one row per wall-clock second, the rate in ``unit``
    (``work`` per call: FLOP or bytes) -- joined with clocks.csv's SM clock and power by ``t_unix``."""
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            for _ in range(4):
                fn()
            sync()
            calls += 4
        dt = time.perf_counter() - t0
        sink.add(workload=workload, t_s=round(time.perf_counter() - t_start, 3), rate=calls * work / dt / 1e12,
                 unit=unit, calls_per_s=calls / dt)


def phase_sustained(out: Path, seconds: float, quick: bool) -> None:
    """What the power cap does to each kind of work: every workload back to back for ``seconds``
    (GEMMs of three shapes in BF16, one in FP8, a Llama-3-8B block forward + backward, a device
    copy), so the SM clock and power each settles at (clocks.csv) say whether one sustained/burst
    ratio holds for every kernel, as the profiles' MSMF/MAMF pair assumes, or depends on the work."""
    sink = Sink(out / "sustained.csv")
    dtype = torch.bfloat16 if CUDA else torch.float32
    shapes = ((256, 256, 256),) if quick else ((8192, 8192, 8192), (2048, 2048, 13312), (4096, 28672, 4096))
    for m, n, k in shapes:
        a, b = torch.randn(m, k, device=DEV, dtype=dtype), torch.randn(n, k, device=DEV, dtype=dtype)
        _sustain(sink, f"gemm {m}x{n}x{k} {str(dtype)[6:]}", lambda a=a, b=b: F.linear(a, b), 2.0 * m * n * k,
                 "TFLOP/s", seconds)
        del a, b
    if CUDA and hasattr(torch, "_scaled_mm"):
        one = torch.ones((), device=DEV)
        a = torch.randn(8192, 8192, device=DEV).to(torch.float8_e4m3fn)
        b = torch.randn(8192, 8192, device=DEV).to(torch.float8_e4m3fn)
        _sustain(sink, "gemm 8192x8192x8192 fp8", lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                 out_dtype=torch.bfloat16), 2.0 * 8192 ** 3, "TFLOP/s", seconds)
        del a, b
    name = "tiny" if quick else "llama3-8b"
    if quick:
        LAYERS.setdefault("tiny", (128, 4, 2, 32, 256))
    d, h, kv, hd, ff = LAYERS[name]
    seq = 64 if quick else 8192
    backend = "cudnn" if _gqa_runs("cudnn", dtype) else next(iter(_sdpa_backends()))
    layer = Layer(d, h, kv, hd, ff, seq, dtype, "fused", _sdpa_backends()[backend], "none")
    x = torch.randn(1, seq, d, device=DEV, dtype=dtype, requires_grad=True)
    dy = torch.randn(1, seq, d, device=DEV, dtype=dtype)
    params = list(layer.parameters())
    fwd = 2.0 * seq * ((h + 2 * kv) * hd * d + h * hd * d + 3 * ff * d) + 2.0 * seq * seq * h * hd  # causal
    _sustain(sink, f"{name} block fwd+bwd seq {seq}", lambda: torch.autograd.grad(layer(x), [x, *params], dy),
             3.0 * fwd, "TFLOP/s", seconds)
    del layer, x, dy, params
    n = (1 << 20) if quick else (1 << 30)
    src, dst = torch.empty(n, dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
    _sustain(sink, f"copy {n >> 20} MiB", lambda: dst.copy_(src), 2.0 * n, "TB/s", seconds)


# ---------------------------------------------------------------- driver
def smi_sampler(path: Path):
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    fields = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active"
    sink = path.open("w")
    return subprocess.Popen([exe, f"--query-gpu={fields}", "--format=csv,nounits", "-lms", "200"],
                            stdout=sink, stderr=subprocess.DEVNULL)


def environment() -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "cudnn": torch.backends.cudnn.version() if CUDA else None, "device": "cpu"}
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        env.update(device=p.name, sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
                   l2_bytes=getattr(p, "L2_cache_size", None), capability=f"{p.major}.{p.minor}")
        exe = shutil.which("nvidia-smi")
        if exe:
            q = "driver_version,power.limit,clocks.max.sm,clocks.max.mem,name"
            env["nvidia_smi"] = subprocess.run([exe, f"--query-gpu={q}", "--format=csv"], check=False, capture_output=True,
                                               text=True).stdout.strip()
    return env


PHASES = ("gemm", "attention", "elementwise", "layers", "sustained")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=420.0, help="the whole run's wall-clock budget")
    ap.add_argument("--sustain-s", type=float, default=12.0, help="seconds for each sustained workload (six of them)")
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--quick", action="store_true", help="CPU smoke run: tiny shapes")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(json.dumps(env), flush=True)
    if CUDA:
        torch.backends.cuda.matmul.allow_tf32 = False
    smi = smi_sampler(out / "clocks.csv")
    clock = Clock(args.budget_s)
    share = {"gemm": 0.2, "attention": 0.14, "elementwise": 0.1, "layers": 0.42, "sustained": 0.0}
    wall = {}
    try:
        for ph in args.phases.split(","):
            t0 = time.perf_counter()
            clock.phase(share[ph] * args.budget_s)
            try:
                if ph == "gemm":
                    phase_gemm(out, clock, args.quick)
                elif ph == "attention":
                    phase_attention(out, clock, args.quick)
                elif ph == "elementwise":
                    phase_elementwise(out, clock, args.quick, 0.08 * args.budget_s)
                elif ph == "layers":
                    phase_layers(out, clock, args.quick, ("eager", "compiled", "fused"))
                elif ph == "sustained":
                    phase_sustained(out, min(args.sustain_s, 2.0) if args.quick else args.sustain_s, args.quick)
            except Exception:  # noqa: BLE001 -- one phase's failure must not lose the others
                traceback.print_exc()
            wall[ph] = round(time.perf_counter() - t0, 2)
            print(f"phase {ph}: {wall[ph]} s", flush=True)
            env["phase_wall_s"] = wall
            (out / "env.json").write_text(json.dumps(env, indent=1))
            if CUDA:
                torch.cuda.empty_cache()
    finally:
        if smi is not None:
            smi.terminate()
            smi.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
