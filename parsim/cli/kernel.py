"""`parsim kernel gemm|attention|experts|scan`: one kernel's predicted time, TFLOP/s and efficiency on a profile.

``parsim kernel gemm M N K --hardware H [--precision P] [--json]`` uses the GEMM kernel model
(:mod:`parsim.cluster.kernels`: tiles, waves, Stream-K, MAMF-calibrated main loop, HBM floor);
``parsim kernel attention --seq S --heads N --kv-heads K --head-dim D [--causal] [--backward]
[--batch B] --hardware H [--json]`` the profile's fused-attention kernel
(:mod:`parsim.cluster.attention_kernels`); ``parsim kernel experts E M N K [--implementation I]
--hardware H [--json]`` one MoE layer's E expert GEMMs as ``moe.expert_gemm`` runs them
(:func:`parsim.cluster.kernels.expert_gemm_time`); ``parsim kernel scan --tokens T --heads H [--head-dim P]
[--state N] [--groups G] [--chunk Q] [--backward] --hardware H [--json]`` a Mamba-2 layer's SSD scan
(:mod:`parsim.costs.ssd`: its Triton kernels). ``--json`` prints one object with ``time_s``,
``tflops`` and ``efficiency`` (achieved / dense peak) plus what the model chose. Bad input is one
line on stderr and exit code 2.

The headline is the kernel as a microbenchmark times it: a burst at the boost clock, what MAMF
and the kernel papers measure (and what the tests hold the models to). ``sustained_time_s`` /
``sustained_tflops`` are the same kernel on a chip held at its power limit, as in training and
in ``parsim simulate`` (``device.msmf_*``: the measured saturated/burst ratio; equal to the
burst where the profile has no MSMF); ``--gpus N`` makes them the slowest of N chips', the clock
a synchronous job of N GPUs runs at (``device.msmf_chip_range_*``, :mod:`parsim.cluster.pace`).
"""
from __future__ import annotations

import json
import sys

from parsim.cli.common import EXIT_BAD_INPUT, default_precision
from parsim.errors import ConfigError

WHERE = "parsim kernel"


def _one_line_errors(parser) -> None:
    """argparse's own errors (missing option, unknown flag) as one line, exit 2."""
    def error(message: str) -> None:
        print(f"parsim: error: {parser.prog}: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    parser.error = error


def register(sub) -> None:
    p = sub.add_parser("kernel", help="predict one GEMM or fused-attention kernel on a hardware profile")
    _one_line_errors(p)
    ks = p.add_subparsers(dest="kernel", required=True)

    g = ks.add_parser("gemm", help="C[M x N] = A[M x K] @ B[K x N]: time, TFLOP/s, efficiency")
    for dim in ("M", "N", "K"):
        g.add_argument(dim, help=f"GEMM dimension {dim}")
    g.add_argument("--count", default="1", help="GEMMs of this shape, one launch each (default 1)")
    _common(g, default_precision=None)
    g.set_defaults(func=cmd_gemm)

    a = ks.add_parser("attention", help="one fused-attention pass (FlashAttention-2/3/4 by profile)")
    a.add_argument("--seq", required=True, help="query (and key) sequence length")
    a.add_argument("--seq-k", default=None, help="key/value sequence length (default --seq)")
    a.add_argument("--heads", required=True, help="query heads")
    a.add_argument("--kv-heads", default=None, help="key/value heads (GQA; default --heads)")
    a.add_argument("--head-dim", required=True, help="head dimension")
    a.add_argument("--batch", default="1", help="sequences (default 1)")
    a.add_argument("--causal", action="store_true", help="causal mask (FLOPs halved, as the FlashAttention papers count)")
    a.add_argument("--backward", action="store_true", help="the backward pass (2.5x the forward FLOPs)")
    a.add_argument("--implementation", default=None,
                   help="fa2 | fa3 | fa4 | cudnn | triton: the kernel a framework calls (training.attention_kernel; "
                        "default the GPU's own)")
    _common(a, default_precision=None)
    a.set_defaults(func=cmd_attention)

    e = ks.add_parser("experts", help="one MoE layer's expert GEMMs (E problems of M x N x K) as a framework "
                                      "runs them: time, TFLOP/s, efficiency")
    e.add_argument("E", help="local experts (GEMMs)")
    for dim in ("M", "N", "K"):
        e.add_argument(dim, help=f"each expert's GEMM dimension {dim} (M: its tokens)")
    e.add_argument("--implementation", default="multi_stream",
                   help="grouped (one grouped kernel) | multi_stream (one cuBLAS GEMM per expert over four streams: "
                        "Transformer Engine's GroupedLinear, the default) | loop (one per expert on one stream); "
                        "moe.expert_gemm")
    _common(e, default_precision=None)
    e.set_defaults(func=cmd_experts)

    s = ks.add_parser("scan", help="one Mamba-2 layer's SSD scan (mamba_chunk_scan_combined's kernels): time, "
                                   "TFLOP/s, efficiency")
    s.add_argument("--tokens", required=True, help="tokens scanned (batch x sequence)")
    s.add_argument("--heads", required=True, help="Mamba heads H")
    s.add_argument("--head-dim", default="64", help="channels per head P (default 64)")
    s.add_argument("--state", default="128", help="state size N (default 128)")
    s.add_argument("--groups", default="8", help="B/C groups G (default 8; divides --heads)")
    s.add_argument("--chunk", default="128", help="chunk length Q (default 128, Megatron-Core's)")
    s.add_argument("--backward", action="store_true", help="the backward's kernels (the states recomputed first)")
    _common(s, default_precision=None)
    s.set_defaults(func=cmd_scan)
    dn = ks.add_parser("deltanet", help="one Gated DeltaNet layer's delta rule (flash-linear-attention's "
                                        "chunk_gated_delta_rule kernels): time, TFLOP/s, efficiency")
    dn.add_argument("--tokens", required=True, help="tokens of each sequence")
    dn.add_argument("--heads", required=True, help="value heads (the heads the kernels run)")
    dn.add_argument("--sequences", default="1", help="sequences, each its own state pass (default 1)")
    dn.add_argument("--key-dim", default="128", help="channels of a query / key head (default 128)")
    dn.add_argument("--value-dim", default="128", help="channels of a value head (default 128)")
    dn.add_argument("--chunk", default="64", help="chunk length C (default 64, flash-linear-attention's)")
    dn.add_argument("--backward", action="store_true", help="the backward's kernels (the states recomputed first)")
    _common(dn, default_precision=None)
    dn.set_defaults(func=cmd_deltanet)
    for q in (g, a, e, s, dn):
        _one_line_errors(q)


def _common(p, default_precision: str | None) -> None:
    p.add_argument("--hardware", required=True, help="profile name or path (e.g. dgx-h100)")
    p.add_argument("--precision", default=default_precision,
                   help="bf16 | fp16 | fp8 | mxfp8 | nvfp4 | tf32 | fp32 (default bf16, fp16 where the GPU has no bf16)")
    p.add_argument("--gpus", default="1",
                   help="GPUs of one synchronous job: the sustained figures are its slowest chip's (default 1: "
                        "the measured mean chip)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


MAX_GPUS = 10 ** 7
"""Largest --gpus (ten million: past any cluster built)."""

MAX_DIM = 2 ** 31
"""Largest GEMM dimension, count or attention batch/heads/head dim (2^31: a matrix side past any GPU's
memory; beyond it the command printed 28-digit times)."""


def _positive_int(name: str, text: str, most: int = MAX_DIM) -> int:
    try:
        v = int(str(text))
    except ValueError:
        v = 0
    if v < 1 or str(v) != str(text).strip().lstrip("+"):
        raise ConfigError(WHERE, name, f"must be a positive integer, got {text!r}")
    if v > most:
        raise ConfigError(WHERE, name, f"at most {most:,}, got {v:,}")
    return v


def _device(args):
    from parsim.cluster.hardware import canonical_precision, load_profile

    args.gpus_n = _positive_int("--gpus", args.gpus, most=MAX_GPUS)
    hw = load_profile(args.hardware, source=WHERE).paced(args.gpus_n)
    dev = hw.device.burst()
    if dev.kernels is None:
        raise ConfigError(hw.source_path or WHERE, "device.sm_count",
                          f"profile {hw.name} gives no kernel facts (sm_count, gemm_tiles, ...)")
    if args.precision is not None and not args.precision.strip():
        raise ConfigError(WHERE, "--precision", "an empty precision")
    precision = args.precision or default_precision(dev)
    try:
        precision = canonical_precision(precision)
        dev.peak(precision)
    except ValueError as exc:
        raise ConfigError(WHERE, "--precision", str(exc)) from None
    return hw, dev, precision


def _emit(args, out: dict, text: str) -> int:
    print(json.dumps(out, indent=1) if args.json else text)
    return 0


def cmd_gemm(args) -> int:
    m, n, k = (_positive_int(d, getattr(args, d)) for d in ("M", "N", "K"))
    count = _positive_int("--count", args.count)
    hw, dev, precision = _device(args)
    plan = dev.kernel_gemm_plan(m, n, k, precision)
    t = count * plan["time_s"]
    flops = 2.0 * m * n * k * count
    peak = dev.peak(precision)
    sustained = count * hw.device.kernel_gemm_plan(m, n, k, precision)["time_s"]
    out = {"time_s": t, "tflops": flops / t / 1e12, "efficiency": flops / t / peak,
           "sustained_time_s": sustained, "sustained_tflops": flops / sustained / 1e12,
           "gpus": args.gpus_n,
           "hardware": hw.name, "device": dev.name, "precision": precision, "m": m, "n": n, "k": k,
           "count": count, "flops": flops, "peak_tflops": peak / 1e12,
           "mainloop_tflops": plan["mainloop_flops"] / 1e12, "tile": plan["tile"], "split_k": plan["split_k"],
           "stream_k": plan["stream_k"], "waves": plan["waves"], "memory_bound": plan["memory_bound"]}
    how = ("HBM-bound" if plan["memory_bound"] else
           f"tile {plan['tile']}, " + ("Stream-K" if plan["stream_k"] else f"{plan['waves']} wave(s)")
           + (f", split-K {plan['split_k']}" if plan["split_k"] > 1 else ""))
    text = (f"gemm {m}x{n}x{k} {precision} on {hw.name} ({dev.name}): {t * 1e6:.1f} us, "
            f"{out['tflops']:.1f} TFLOP/s, {out['efficiency']:.1%} of {peak / 1e12:.0f} peak ({how})"
            + _sustained_text(out))
    return _emit(args, out, text)


def _sustained_text(out: dict) -> str:
    """The sustained figure beside the burst one, where the profile's MSMF makes them differ."""
    if out["sustained_time_s"] == out["time_s"]:
        return ""
    who = f", the slowest of {out['gpus']:,} chips" if out["gpus"] > 1 else ""
    return (f"; sustained at the power limit{who}: {out['sustained_time_s'] * 1e6:.1f} us, "
            f"{out['sustained_tflops']:.1f} TFLOP/s")


def cmd_attention(args) -> int:
    from parsim.cluster.attention_kernels import (
        ATTENTION_PRECISIONS,
        IMPLEMENTATIONS,
        KERNELS,
        attention_flops,
        resolve,
    )
    from parsim.scenario import MAX_SEQ_LEN

    # the kernel model walks the sequence tile by tile: the scenarios' sequence bound
    seq = _positive_int("--seq", args.seq, most=MAX_SEQ_LEN)
    seq_k = _positive_int("--seq-k", args.seq_k, most=MAX_SEQ_LEN) if args.seq_k is not None else seq
    heads = _positive_int("--heads", args.heads)
    kv_heads = _positive_int("--kv-heads", args.kv_heads) if args.kv_heads is not None else heads
    head_dim = _positive_int("--head-dim", args.head_dim)
    batch = _positive_int("--batch", args.batch)
    if heads % kv_heads:
        raise ConfigError(WHERE, "--kv-heads", f"{kv_heads} does not divide --heads {heads}")
    hw, dev, precision = _device(args)
    name = dev.kernels.attention_kernel
    if name is None:
        raise ConfigError(hw.source_path or WHERE, "device.attention_kernel",
                          f"{dev.name} has no fused attention kernel (FlashAttention-2/3/4 need sm80 or newer)")
    if precision not in ATTENTION_PRECISIONS:
        raise ConfigError(WHERE, "--precision", f"fused attention runs {', '.join(ATTENTION_PRECISIONS)}, got {precision}")
    impl = args.implementation
    if impl is not None:
        if impl not in IMPLEMENTATIONS:
            raise ConfigError(WHERE, "--implementation", f"must be one of {', '.join(IMPLEMENTATIONS)}, got {impl!r}")
        name = resolve(impl, dev.kernels.mma_style)
        if name is None:
            raise ConfigError(WHERE, "--implementation", f"{impl} is not modelled on {dev.name}")
    try:
        t = dev.attention_kernel_time(batch, seq, seq_k, heads, kv_heads, head_dim, args.causal, args.backward,
                                      precision, impl)
    except ValueError as exc:
        raise ConfigError(WHERE, "--head-dim", str(exc)) from None
    flops = attention_flops(batch, seq, seq_k, heads, head_dim, args.causal, args.backward)
    peak = dev.peak(precision)
    kernel = KERNELS[name]
    sustained = hw.device.attention_kernel_time(batch, seq, seq_k, heads, kv_heads, head_dim, args.causal,
                                                args.backward, precision, impl)
    out = {"time_s": t, "tflops": flops / t / 1e12, "efficiency": flops / t / peak,
           "sustained_time_s": sustained, "sustained_tflops": flops / sustained / 1e12,
           "gpus": args.gpus_n,
           "hardware": hw.name, "device": dev.name, "precision": precision, "kernel": kernel.name,
           "batch": batch, "seq_q": seq, "seq_k": seq_k, "heads": heads, "kv_heads": kv_heads,
           "head_dim": head_dim, "causal": args.causal, "backward": args.backward, "flops": flops,
           "peak_tflops": peak / 1e12, "tile": list(kernel.tile(head_dim, args.causal, args.backward))}
    pass_name = "backward" if args.backward else "forward"
    text = (f"attention {pass_name} b={batch} s={seq}{'' if seq_k == seq else f'/{seq_k}'} h={heads}/{kv_heads} "
            f"d={head_dim}{' causal' if args.causal else ''} {precision} on {hw.name} ({kernel.name}): "
            f"{t * 1e6:.1f} us, {out['tflops']:.1f} TFLOP/s, {out['efficiency']:.1%} of {peak / 1e12:.0f} peak"
            + _sustained_text(out))
    return _emit(args, out, text)


def cmd_experts(args) -> int:
    from parsim.cluster.kernels import EXPERT_GEMM_IMPLEMENTATIONS, expert_gemm_time
    from parsim.model.spec import MAX_EXPERTS

    experts = _positive_int("E", args.E, most=MAX_EXPERTS)
    m, n, k = (_positive_int(d, getattr(args, d)) for d in ("M", "N", "K"))
    impl = args.implementation
    if impl not in EXPERT_GEMM_IMPLEMENTATIONS:
        raise ConfigError(WHERE, "--implementation",
                          f"must be one of {', '.join(EXPERT_GEMM_IMPLEMENTATIONS)}, got {impl!r}")
    hw, dev, precision = _device(args)
    problems = ((m, n, k),) * experts
    times = {i: expert_gemm_time(dev, problems, precision, i) for i in EXPERT_GEMM_IMPLEMENTATIONS}
    t = times[impl]
    sustained = expert_gemm_time(hw.device, problems, precision, impl)
    flops = 2.0 * m * n * k * experts
    peak = dev.peak(precision)
    out = {"time_s": t, "tflops": flops / t / 1e12, "efficiency": flops / t / peak,
           "sustained_time_s": sustained, "sustained_tflops": flops / sustained / 1e12,
           "gpus": args.gpus_n,
           "hardware": hw.name, "device": dev.name, "precision": precision, "implementation": impl,
           "experts": experts, "m": m, "n": n, "k": k, "flops": flops, "peak_tflops": peak / 1e12,
           "time_s_by_implementation": times}
    others = ", ".join(f"{i} {flops / v / 1e12:.0f}" for i, v in times.items() if i != impl)
    text = (f"experts {experts} x {m}x{n}x{k} {precision} on {hw.name} ({dev.name}), {impl}: {t * 1e6:.1f} us, "
            f"{out['tflops']:.1f} TFLOP/s, {out['efficiency']:.1%} of {peak / 1e12:.0f} peak (TFLOP/s as {others})"
            + _sustained_text(out))
    return _emit(args, out, text)


def cmd_deltanet(args) -> int:
    from parsim.costs.gdn import DeltaShape, backward_kernels, delta_rate, delta_times, forward_kernels, state_share
    from parsim.scenario import MAX_SEQ_LEN

    tokens = _positive_int("--tokens", args.tokens, most=MAX_SEQ_LEN)
    heads = _positive_int("--heads", args.heads, most=2 ** 16)
    sequences = _positive_int("--sequences", args.sequences, most=2 ** 20)
    dims = {k: _positive_int(f"--{k.replace('_', '-')}", getattr(args, k), most=2 ** 12)
            for k in ("key_dim", "value_dim", "chunk")}
    hw, dev, precision = _device(args)
    if precision not in ("bf16", "fp16"):
        raise ConfigError(WHERE, "--precision", f"the delta rule runs bf16 or fp16, got {precision}")
    shape = DeltaShape(sequences, tokens, heads, dims["key_dim"], dims["value_dim"], dims["chunk"])
    pick = 1 if args.backward else 0
    t = delta_times(dev, shape, precision)[pick]
    sustained = delta_times(hw.device, shape, precision)[pick]
    kernels = (backward_kernels if args.backward else forward_kernels)(shape, 2)
    flops = sum(k.flops for k in kernels)
    peak = dev.peak(precision)
    out = {"time_s": t, "tflops": flops / t / 1e12, "efficiency": flops / t / peak,
           "sustained_time_s": sustained, "sustained_tflops": flops / sustained / 1e12, "gpus": args.gpus_n,
           "hardware": hw.name, "device": dev.name, "precision": precision, "backward": args.backward,
           "sequences": sequences, "tokens": tokens, "heads": heads, **dims, "flops": flops,
           "peak_tflops": peak / 1e12, "kernel_rate_tflops": delta_rate(dev) / 1e12,
           "state_kernels_sm_share": state_share(dev, shape),
           "kernels": [{"name": k.name, "flops": k.flops, "bytes": k.bytes} for k in kernels]}
    text = (f"deltanet {'backward' if args.backward else 'forward'} {sequences} x {tokens} tokens, {heads} heads "
            f"K={dims['key_dim']} V={dims['value_dim']} C={dims['chunk']} {precision} on {hw.name} ({dev.name}): "
            f"{t * 1e6:.1f} us over {len(kernels)} kernels, {out['tflops']:.1f} TFLOP/s, "
            f"{out['efficiency']:.1%} of {peak / 1e12:.0f} peak (the kernels' rate {out['kernel_rate_tflops']:.1f}, "
            f"state kernels on {out['state_kernels_sm_share']:.0%} of the SMs)" + _sustained_text(out))
    return _emit(args, out, text)


def cmd_scan(args) -> int:
    from parsim.costs.ssd import ScanShape, backward_kernels, forward_kernels, scan_rate, scan_times
    from parsim.scenario import MAX_SEQ_LEN

    tokens = _positive_int("--tokens", args.tokens, most=MAX_SEQ_LEN)
    heads = _positive_int("--heads", args.heads)
    dims = {k: _positive_int(f"--{k.replace('_', '-')}", getattr(args, k), most=2 ** 16)
            for k in ("head_dim", "state", "groups", "chunk")}
    if heads % dims["groups"]:
        raise ConfigError(WHERE, "--groups", f"{dims['groups']} does not divide --heads {heads}")
    hw, dev, precision = _device(args)
    if precision not in ("bf16", "fp16"):
        raise ConfigError(WHERE, "--precision", f"the scan runs bf16 or fp16, got {precision}")
    shape = ScanShape(tokens, heads, dims["head_dim"], dims["state"], dims["groups"], dims["chunk"])
    pick = 1 if args.backward else 0
    t = scan_times(dev, shape, precision)[pick]
    sustained = scan_times(hw.device, shape, precision)[pick]
    kernels = (backward_kernels if args.backward else forward_kernels)(shape, 4 if precision == "fp32" else 2)
    flops = sum(k.flops for k in kernels)
    peak = dev.peak(precision)
    out = {"time_s": t, "tflops": flops / t / 1e12, "efficiency": flops / t / peak,
           "sustained_time_s": sustained, "sustained_tflops": flops / sustained / 1e12, "gpus": args.gpus_n,
           "hardware": hw.name, "device": dev.name, "precision": precision, "backward": args.backward,
           "tokens": tokens, "heads": heads, **dims, "flops": flops, "peak_tflops": peak / 1e12,
           "kernel_rate_tflops": scan_rate(dev) / 1e12,
           "kernels": [{"name": k.name, "flops": k.flops, "bytes": k.bytes} for k in kernels]}
    text = (f"scan {'backward' if args.backward else 'forward'} T={tokens} H={heads} P={dims['head_dim']} "
            f"N={dims['state']} G={dims['groups']} Q={dims['chunk']} {precision} on {hw.name} ({dev.name}): "
            f"{t * 1e6:.1f} us over {len(kernels)} kernels, {out['tflops']:.1f} TFLOP/s, "
            f"{out['efficiency']:.1%} of {peak / 1e12:.0f} peak (the kernels' rate {out['kernel_rate_tflops']:.1f})"
            + _sustained_text(out))
    return _emit(args, out, text)
