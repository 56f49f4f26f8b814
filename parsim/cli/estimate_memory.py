"""`parsim estimate-memory`: DeepSpeed's ZeRO-2/ZeRO-3 model-state estimator, reproduced.

``--json`` prints ``per_gpu_bytes`` and ``per_cpu_bytes`` (host memory per node) for the
chosen row; the summary prints the whole table DeepSpeed's ``..._all_cold`` prints (GiB =
2^30 bytes, as DeepSpeed's "GB"), the chosen row marked.
"""
from __future__ import annotations

import json

from parsim.errors import ConfigError

WHERE = "parsim estimate-memory"
SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def count(option: str):
    """A parameter count: 2851e6, 2851M, 2.851B, 32M."""
    def conv(text: str) -> float:
        t = text.strip().upper()
        unit = t[-1:] if t[-1:] in SUFFIX and t[-1:] else ""
        try:
            v = float(t[: len(t) - len(unit)]) * SUFFIX[unit]
        except ValueError:
            raise ConfigError(WHERE, option, f"cannot read a parameter count from {text!r} "
                                             "(e.g. 2851e6, 2851M, 2.851B)") from None
        if not v > 0 or v == float("inf"):
            raise ConfigError(WHERE, option, f"must be a positive count, got {text!r}")
        return v
    return conv


def register(sub) -> None:
    from parsim.cli.args import positive_int

    p = sub.add_parser("estimate-memory", help="DeepSpeed's ZeRO-2/3 model-state memory estimator",
                       description="Model-state memory per GPU and host memory per node, as DeepSpeed's "
                                   "estimate_zero2/zero3_model_states_mem_needs_all_cold compute them "
                                   "(params, grads, optimizer states; no activations or buffers).",
                       epilog="example: parsim estimate-memory --params 2851e6 --largest-layer-params 32e6 "
                              "--gpus-per-node 8 --nodes 1 --zero 3 --offload-optimizer cpu --offload-param cpu "
                              "--zero-init")
    p.add_argument("--params", metavar="P", help="total model parameters (2851e6, 2851M, 2.851B)")
    p.add_argument("--largest-layer-params", metavar="L", default=None,
                   help="parameters of the largest layer (needed for --zero 3)")
    p.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node"), default=None, help="GPUs per node (default 1)")
    p.add_argument("--nodes", type=positive_int("--nodes"), default=None, help="nodes (default 1)")
    p.add_argument("--zero", type=int, choices=(2, 3), help="ZeRO stage")
    p.add_argument("--offload-optimizer", choices=("none", "cpu"), default=None, help="optimizer offload (default none)")
    p.add_argument("--offload-param", choices=("none", "cpu"), default=None,
                   help="parameter offload (ZeRO-3; default none)")
    p.add_argument("--zero-init", action="store_true", help="model built under deepspeed.zero.Init (ZeRO-3)")
    p.add_argument("--scenario", metavar="FILE",
                   help="a training scenario: DeepSpeed's estimate for its model, GPUs, ZeRO stage and [offload], "
                        "beside what parsim simulate counts (activations, buffers, fragmentation)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a key of --scenario (repeatable)")
    p.add_argument("--json", action="store_true", help="one JSON object: per_gpu_bytes, per_cpu_bytes, ...")
    p.set_defaults(func=cmd_estimate_memory)


def _gib(b: int) -> float:
    return b / 2 ** 30


def _options(r) -> str:
    if r.zero == 2:
        return f"offload_optimizer={r.offload_optimizer}"
    return (f"offload_param={r.offload_param:4}, offload_optimizer={r.offload_optimizer:4}, "
            f"zero_init={int(r.zero_init)}")


def cmd_estimate_memory(args) -> int:
    from parsim.costs.zero_estimate import estimate_zero2, estimate_zero3, estimator_table

    if args.scenario:
        return _scenario(args)
    # defaults here: with --scenario these come from the scenario, and a stated one is refused there
    args.gpus_per_node = args.gpus_per_node or 1
    args.nodes = args.nodes or 1
    args.offload_optimizer = args.offload_optimizer or "none"
    args.offload_param = args.offload_param or "none"
    if args.params is None or args.zero is None:
        raise ConfigError(WHERE, "--params" if args.params is None else "--zero", "required (or give --scenario)")
    params = count("--params")(args.params)
    layer = count("--largest-layer-params")(args.largest_layer_params) if args.largest_layer_params else None
    if args.zero == 2:
        if args.offload_param != "none":
            raise ConfigError(WHERE, "--offload-param", "parameter offload needs --zero 3")
        if args.zero_init:
            raise ConfigError(WHERE, "--zero-init", "zero.Init partitions parameters: it needs --zero 3")
        row = estimate_zero2(params=params, gpus_per_node=args.gpus_per_node, nodes=args.nodes,
                             offload_optimizer=args.offload_optimizer)
    else:
        if layer is None:
            raise ConfigError(WHERE, "--largest-layer-params", "--zero 3 needs the largest layer's parameters")
        if layer > params:
            raise ConfigError(WHERE, "--largest-layer-params", "exceeds --params")
        if args.offload_param == "cpu" and args.offload_optimizer != "cpu":
            raise ConfigError(WHERE, "--offload-param", "cpu needs --offload-optimizer cpu "
                                                        "(DeepSpeed's estimator has no such row)")
        row = estimate_zero3(params=params, largest_layer_params=layer, gpus_per_node=args.gpus_per_node,
                             nodes=args.nodes, offload_optimizer=args.offload_optimizer,
                             offload_param=args.offload_param, zero_init=args.zero_init)
    if args.json:
        print(json.dumps({"per_gpu_bytes": row.per_gpu_bytes, "per_cpu_bytes": row.per_cpu_bytes,
                          "per_gpu_gib": _gib(row.per_gpu_bytes), "per_cpu_gib": _gib(row.per_cpu_bytes),
                          "largest_layer_bytes": row.largest_layer_bytes, "zero": row.zero,
                          "offload_optimizer": row.offload_optimizer, "offload_param": row.offload_param,
                          "zero_init": row.zero_init, "params": params, "gpus_per_node": args.gpus_per_node,
                          "nodes": args.nodes}, indent=1))
        return 0
    print(f"ZeRO-{args.zero} model states (DeepSpeed's estimator): {args.nodes} node{'s' * (args.nodes > 1)} x "
          f"{args.gpus_per_node} GPU{'s' * (args.gpus_per_node > 1)}, {params / 1e6:.0f}M params"
          + (f", {layer / 1e6:.0f}M largest layer" if layer is not None and args.zero == 3 else ""))
    print("    per CPU |  per GPU | options   (GiB; params, grads, optimizer only)")
    for r in estimator_table(zero=args.zero, params=params, largest_layer_params=layer or 0,
                             gpus_per_node=args.gpus_per_node, nodes=args.nodes):
        mark = "*" if r == row else " "
        print(f"{mark} {_gib(r.per_cpu_bytes):8.2f} | {_gib(r.per_gpu_bytes):8.2f} | {_options(r)}")
    print("  not counted: activations, communication buckets, allocator fragmentation, CUDA context "
          "(parsim simulate counts them for a full scenario)")
    return 0


def _scenario(args) -> int:
    """DeepSpeed's estimate for a scenario next to parsim's full per-GPU memory."""
    from parsim.costs.zero_estimate import estimate_zero2, estimate_zero3
    from parsim.model import trained_params
    from parsim.model.shapes import layer_gemms
    from parsim.results.summary import fmt_b
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate

    if args.params or args.zero or args.largest_layer_params:
        raise ConfigError(WHERE, "--scenario", "takes the model, GPUs and ZeRO stage from the scenario: "
                                               "drop --params/--zero/--largest-layer-params")
    given = [o for o, v in (("--gpus-per-node", args.gpus_per_node), ("--nodes", args.nodes),
                            ("--offload-optimizer", args.offload_optimizer), ("--offload-param", args.offload_param))
             if v is not None]
    if given:  # silently unused before: the scenario's GPUs and [offload] decide
        raise ConfigError(WHERE, given[0], "takes its value from --scenario (its gpus, hardware and [offload]); "
                                           "change the scenario with --set instead")
    sc = load_scenario(args.scenario, args.set)
    par, m, hw = sc.parallel, sc.model, sc.hardware
    if par.zero not in (2, 3):
        raise ConfigError(sc.file, "parallel.zero", f"DeepSpeed's estimators cover ZeRO 2 and 3, got {par.zero}")
    if par.tp * par.pp * par.cp > 1:
        raise ConfigError(sc.file, "parallel", "DeepSpeed's estimators assume data parallelism only (tp = pp = cp = 1)")
    params = trained_params(m)
    layer = max([m.vocab_size * m.d_model] + [g.n * g.k for g in layer_gemms(m, 1, 1)])  # largest module's own
    gpn = min(sc.gpus, hw.gpus_per_node)
    nodes = -(-sc.gpus // gpn)
    off = sc.offload
    opt = "cpu" if off.optimizer != "none" else "none"
    prm = "cpu" if off.params != "none" else "none"
    if par.zero == 2:
        ds = estimate_zero2(params=params, gpus_per_node=gpn, nodes=nodes, offload_optimizer=opt)
    else:
        if prm == "cpu" and opt == "none":
            raise ConfigError(sc.file, "offload.params", "DeepSpeed's estimator has no row for params without optimizer")
        ds = estimate_zero3(params=params, largest_layer_params=layer, gpus_per_node=gpn, nodes=nodes,
                            offload_optimizer=opt, offload_param=prm, zero_init=args.zero_init)
    mx = simulate(sc).metrics
    worst = max(mx["stages"], key=lambda st: st["peak_memory_bytes"])
    mem = worst["memory"]
    states = mem.get("params", 0.0) + mem.get("grads", 0.0) + mem.get("optimizer", 0.0)
    acts = mem.get("activations", 0.0)
    buffers = worst["peak_memory_bytes"] - states - acts
    frag = worst["peak_reserved_bytes"] - worst["peak_memory_bytes"]
    context = hw.device.memory_reserved_bytes
    out = {"deepspeed": {"per_gpu_bytes": ds.per_gpu_bytes, "per_cpu_bytes": ds.per_cpu_bytes,
                         "params": params, "largest_layer_params": layer, "gpus_per_node": gpn, "nodes": nodes,
                         "zero": par.zero, "offload_optimizer": opt, "offload_param": prm, "zero_init": args.zero_init},
           "parsim": {"model_states_bytes": states, "activations_bytes": acts, "buffers_bytes": buffers,
                      "fragmentation_bytes": frag, "cuda_context_bytes": context,
                      "peak_memory_bytes": worst["peak_memory_bytes"], "peak_reserved_bytes": worst["peak_reserved_bytes"],
                      "device_bytes": worst["peak_reserved_bytes"] + context,
                      "memory_capacity_bytes": hw.device.memory_bytes,
                      "host_memory_bytes_per_node": mx.get("host_memory_bytes_per_node", 0.0),
                      "fits_in_memory": mx["fits_in_memory"]},
           "left_out_bytes": worst["peak_reserved_bytes"] + context - ds.per_gpu_bytes}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    p = out["parsim"]
    print(f"{sc.name}: ZeRO-{par.zero}, {sc.gpus} GPU{'s' * (sc.gpus > 1)} ({nodes} x {gpn}), {params / 1e6:,.0f}M "
          f"params, largest layer {layer / 1e6:,.0f}M; offload optimizer={opt}, params={prm}")
    print(f"  DeepSpeed's estimate   {fmt_b(ds.per_gpu_bytes)} per GPU, {fmt_b(ds.per_cpu_bytes)} host per node "
          "(model states; host: its initialisation peak x 1.5)")
    print("  parsim, per GPU at its peak:")
    for label, v in (("model states", states), ("activations", acts), ("buffers (buckets, comm, gathers)", buffers),
                     ("= allocated at the peak", p["peak_memory_bytes"]),
                     ("+ caching-allocator reserve", frag), ("+ CUDA context and workspaces", context)):
        print(f"    {label:34} {fmt_b(v)}")
    print(f"  parsim simulate: {'fits' if p['fits_in_memory'] else 'does NOT fit'} (allocated peak within "
          f"{fmt_b(p['memory_capacity_bytes'])} less the context and the profile's reserve)")
    left = out["left_out_bytes"]
    gap = (f"left out by the estimator: {fmt_b(left)} per GPU" if left >= 0 else
           f"the estimator counts {fmt_b(-left)} per GPU more than parsim's whole device footprint")
    print(f"  {gap}; parsim's host memory per node (steady state): {fmt_b(p['host_memory_bytes_per_node'])}")
    return 0
