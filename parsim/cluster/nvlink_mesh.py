"""NVLink between GPUs wired to each other directly (no NVSwitch): which rings a group can run.

DGX-1 and AWS p3.16xlarge join their 8 V100s in a hybrid cube-mesh: each GPU's six NVLink2
links go to four peers, one or two links each, and some pairs have none (``nvidia-smi topo
-m``: NV1, NV2, SYS). On an NVSwitch every GPU reaches every other at its full port rate;
here a pair only has the links between them. NCCL builds its rings along cycles of direct
links: a group of n >= 3 GPUs runs one ring in each direction around each cycle through all
of its members, the cycles sharing no link; two GPUs run one ring per link between them.
A rank then sends over as many links at once as there are rings, so a collective's
bandwidth is ``rings x link bandwidth``.

Pure functions of the profile's link-count matrix (``node.nvlink_links``) and the group's
local GPU indices.
"""
from __future__ import annotations

from itertools import permutations

MAX_MESH_GPUS = 8
"""Largest node a link matrix may describe: the ring search tries every cycle through a group
((n-1)! orders; DGX-1, the p3 and 8-GPU Infinity Fabric boards are 8)."""

Links = tuple[tuple[int, ...], ...]
"""links[a][b]: NVLink links between local GPUs a and b of a node (symmetric, 0 on the diagonal)."""


def check_links(value: object, gpus_per_node: int) -> Links | str:
    """The matrix as a tuple of tuples, or what is wrong with it (one sentence)."""
    n = gpus_per_node
    if n > MAX_MESH_GPUS:
        return (f"direct-link meshes of up to {MAX_MESH_GPUS} GPUs per node are supported (node.gpus_per_node = {n}): "
                "every group's rings are searched over its cycles")
    if not isinstance(value, list) or len(value) != n or not all(isinstance(r, list) and len(r) == n for r in value):
        return f"must be a {n} x {n} list of lists (node.gpus_per_node = {n}), one row per GPU of the node"
    for a, row in enumerate(value):
        for b, x in enumerate(row):
            if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                return f"row {a}, column {b}: must be a link count >= 0, got {x!r}"
            if a == b and x:
                return f"row {a}: a GPU has no links to itself (column {b} is {x})"
            if value[b][a] != x:
                return f"must be symmetric: row {a} column {b} is {x}, row {b} column {a} is {value[b][a]}"
    degrees = {sum(row) for row in value}
    if len(degrees) != 1 or 0 in degrees:
        return f"every GPU must have the same number of links, at least one (row sums: {[sum(r) for r in value]})"
    return tuple(tuple(row) for row in value)


def links_per_gpu(links: Links) -> int:
    """NVLink links of one GPU (a row's sum: the same for every GPU)."""
    return sum(links[0])


def _cycles(links: Links, members: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every cycle through all ``members`` along direct links, each once (starting at the
    first member, the second member below the last)."""
    first, rest = members[0], members[1:]
    out = []
    for order in permutations(rest):
        if order[0] > order[-1]:
            continue  # the same cycle walked backwards
        cyc = (first, *order)
        if all(links[a][b] for a, b in zip(cyc, cyc[1:] + cyc[:1])):
            out.append(cyc)
    return out


def _pack(cycles: list[tuple[int, ...]], left: dict[tuple[int, int], int], start: int, bound: int) -> list:
    """The most cycles from ``cycles[start:]`` that ``left`` links carry together (depth-first,
    stopping at ``bound``, the degree limit)."""
    best: list = []
    for i in range(start, len(cycles)):
        edges = [tuple(sorted(e)) for e in zip(cycles[i], cycles[i][1:] + cycles[i][:1])]
        if any(left[e] == 0 for e in edges):
            continue
        for e in edges:
            left[e] -= 1
        got = [cycles[i]] + (_pack(cycles, left, i, bound - 1) if bound > 1 else [])
        for e in edges:
            left[e] += 1
        if len(got) > len(best):
            best = got
            if len(best) == bound:
                break
    return best


def rings(links: Links, members: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The directed rings NCCL can run over ``members`` (local GPU indices) at once, one link
    direction each: for two GPUs, one per link between them; for three or more, both
    directions of each of the most cycles through all members that share no link (a cycle
    may reuse a pair with two links). Empty when direct links cannot close a ring."""
    m = tuple(members)
    if len(m) < 2:
        return ()
    if len(m) == 2:
        return tuple(m for _ in range(links[m[0]][m[1]]))
    left = {tuple(sorted((a, b))): links[a][b] for a in m for b in m if a < b}
    bound = min(sum(links[a][b] for b in m) for a in m) // 2  # a cycle takes two links of every member
    packed = _pack(_cycles(links, m), left, 0, bound) if bound else []
    return tuple(r for cyc in packed for r in (cyc, (cyc[0], *reversed(cyc[1:]))))
