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
    p.add_argument("--params", required=True, metavar="P", help="total model parameters (2851e6, 2851M, 2.851B)")
    p.add_argument("--largest-layer-params", metavar="L", default=None,
                   help="parameters of the largest layer (needed for --zero 3)")
    p.add_argument("--gpus-per-node", type=positive_int("--gpus-per-node"), default=1, help="GPUs per node")
    p.add_argument("--nodes", type=positive_int("--nodes"), default=1, help="nodes")
    p.add_argument("--zero", type=int, choices=(2, 3), required=True, help="ZeRO stage")
    p.add_argument("--offload-optimizer", choices=("none", "cpu"), default="none", help="optimizer offload")
    p.add_argument("--offload-param", choices=("none", "cpu"), default="none", help="parameter offload (ZeRO-3)")
    p.add_argument("--zero-init", action="store_true", help="model built under deepspeed.zero.Init (ZeRO-3)")
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
