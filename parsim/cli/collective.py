"""`parsim collective KIND --size S --gpus N --hardware H`: one collective's predicted time,
printed as nccl-tests prints it (size, count, type, redop, root, time, algbw, busbw).

Conventions are nccl-tests' (doc/PERFORMANCE.md): ``S`` is the full buffer (all-gather's
output, reduce-scatter's input); sizes take K/M/G suffixes in powers of 1024; algbw = S/t
in GB/s of 1e9 bytes; busbw = algbw times the collective's factor (2(n-1)/n for
all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast,
reduce and send/recv), whatever algorithm ran. The N GPUs are global ranks 0..N-1 placed
as the profile's nodes hold them, and this group is the only one communicating (as in an
nccl-tests run), so it has its nodes' NICs to itself.
"""
from __future__ import annotations

import json
import math

from parsim.errors import ConfigError

UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4}
TYPES = {"int8": 1, "uint8": 1, "half": 2, "bfloat16": 2, "float": 4, "int32": 4, "uint32": 4,
         "double": 8, "int64": 8, "uint64": 8}
"""nccl-tests' data types and their bytes (the count column is size / bytes)."""
ROOTED = ("broadcast", "reduce", "gather", "scatter")
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
MAX_ROWS = 4096
"""Most rows one range prints (nccl-tests' 8 B to 16 GiB at factor 2 is 32)."""
MAX_SIZE = 2 ** 60
"""Largest buffer (1 EiB): far beyond any GPU's memory, still exact as an integer byte count."""


def register(sub) -> None:
    from parsim.cluster.collectives import KINDS

    p = sub.add_parser("collective", help="predicted time and bus bandwidth of one collective (nccl-tests columns)")
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=f"one of {', '.join(KINDS)}")
    p.add_argument("--size", required=True, help="bytes (8K, 256M, 1G: powers of 1024 as nccl-tests), "
                                                 "or a range MIN:MAX (nccl-tests -b/-e)")
    p.add_argument("--factor", type=float, default=2.0, help="size multiplier between rows of a range (default 2)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the group (ranks 0..N-1)")
    p.add_argument("--hardware", required=True, help="hardware profile name or path")
    p.add_argument("--type", default="float", choices=TYPES, help="element type for the count column (default float)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object (time_s, algbw_gbyte_per_s, busbw_gbyte_per_s, algorithm); a range: a list "
                        "of them, each with its size_bytes")
    p.set_defaults(func=cmd_collective)


def parse_size(text: str, key: str = "--size") -> int:
    """``"256M"`` -> 268435456 (nccl-tests: K, M, G are powers of 1024)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in UNITS and t[-1:] else ""
    digits = t[: len(t) - len(unit)]
    try:
        value = float(digits)
    except ValueError:
        raise ConfigError("parsim collective", key, f"cannot read size {text!r} (e.g. 8K, 256M, 1G)") from None
    if not math.isfinite(value) or value * UNITS[unit] > MAX_SIZE:
        raise ConfigError("parsim collective", key, f"size {text!r} must be a finite number of bytes up to 1E (2^60)")
    size = int(value * UNITS[unit])
    if size < 1:
        raise ConfigError("parsim collective", key, f"size {text!r} must be at least one byte")
    return size


def sizes(text: str, factor: float) -> list[int]:
    """One size, or nccl-tests' range MIN:MAX stepped by ``factor``."""
    lo_text, sep, hi_text = text.partition(":")
    lo = parse_size(lo_text)
    if not sep:
        return [lo]
    hi = parse_size(hi_text)
    if hi < lo:
        raise ConfigError("parsim collective", "--size", f"range {text!r} ends below its start")
    if not math.isfinite(factor) or factor <= 1:
        raise ConfigError("parsim collective", "--factor", f"must be a finite number above 1 for a range, got {factor:g}")
    out = [lo]
    while out[-1] * factor <= hi:
        nxt = int(out[-1] * factor)
        if nxt <= out[-1]:
            raise ConfigError("parsim collective", "--factor",
                              f"{factor:g} does not grow a {out[-1]}-byte size by a whole byte; use a larger factor")
        if len(out) == MAX_ROWS:
            raise ConfigError("parsim collective", "--factor",
                              f"range {text!r} at factor {factor:g} has more than {MAX_ROWS} rows; use a larger factor")
        out.append(nxt)
    return out


def predict(hw, kind: str, size: int, gpus: int) -> dict:
    """The four numbers the command reports for one size."""
    from parsim.cluster.collectives import bus_bandwidth, select_algorithm

    algorithm, t = select_algorithm(hw, kind, size, list(range(gpus)), concurrent=1)
    return {"time_s": t, "algbw_gbyte_per_s": size / t / 1e9,
            "busbw_gbyte_per_s": bus_bandwidth(kind, size, gpus, t) / 1e9, "algorithm": algorithm}


def cmd_collective(args) -> int:
    from parsim.cluster.hardware import load_profile
    from parsim.scenario import MAX_GPUS

    if args.gpus > MAX_GPUS:  # the group's ranks are listed: the scenarios' bound
        raise ConfigError("parsim collective", "--gpus", f"at most {MAX_GPUS:,} GPUs in one group, got {args.gpus:,}")
    if args.gpus < 2:
        raise ConfigError("parsim collective", "--gpus", f"a collective needs at least 2 GPUs, got {args.gpus}")
    if args.kind == "p2p" and args.gpus != 2:
        raise ConfigError("parsim collective", "--gpus", f"p2p is one send/receive between 2 GPUs, got {args.gpus}")
    hw = load_profile(args.hardware)
    want = sizes(args.size, args.factor)
    if want[0] < TYPES[args.type]:
        raise ConfigError("parsim collective", "--size", f"{want[0]} bytes is less than one {args.type} "
                          f"({TYPES[args.type]} bytes)")
    rows = [(s, predict(hw, args.kind, s, args.gpus)) for s in want]
    if args.json:
        out = rows[0][1] if len(rows) == 1 and ":" not in args.size else [{"size_bytes": s} | r for s, r in rows]
        print(json.dumps(out, indent=1))
        return 0
    nodes = len({hw.node_of(r) for r in range(args.gpus)})
    print(f"# {args.kind} on {args.gpus} GPUs ({nodes} node{'s' * (nodes > 1)} of {hw.name}), predicted by parsim")
    print(f"# {'size':>12} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} {'time':>10} {'algbw':>8} {'busbw':>8}"
          f"  algorithm")
    print(f"# {'(B)':>12} {'(elements)':>12} {'':>8} {'':>6} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    for s, r in rows:
        redop = "sum" if args.kind in REDUCING else "none"
        root = 0 if args.kind in ROOTED else -1
        print(f"  {s:>12} {s // TYPES[args.type]:>12} {args.type:>8} {redop:>6} {root:>6} {r['time_s'] * 1e6:>10.2f} "
              f"{r['algbw_gbyte_per_s']:>8.2f} {r['busbw_gbyte_per_s']:>8.2f}  {r['algorithm']}")
    return 0
