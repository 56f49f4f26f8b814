"""Where a rank process sits in the parallel grid, and the process groups it talks on.

Torch-free: the coordinates and group member lists follow ``ParallelConfig``'s rank grid
(``parsim.config.parallel``: axes ordered slowest to fastest, tensor parallel innermost by
default) and the expert-parallel carving of ``parsim.costs.moe`` (ep consecutive indices of
the dp x cp index, cp fastest), so the runtime's groups are the ranks the cost model prices.

Groups (each a sorted list of global ranks):

* ``pp``: the stage's pipeline neighbours share every other coordinate;
* ``tp`` / ``cp``: ranks differing in that coordinate only (the cp group in cp order: the ring);
* ``grad``: what sums a dense parameter's gradient: every data-parallel and context-parallel
  peer (each saw other tokens), and for a two-copy schedule (DualPipe, Chimera) also the
  ranks holding the other copy of the same model piece (pipeline rank p-1-r);
* ``ep``: the expert-parallel group (routed experts sharded over it, all-to-all inside it);
* ``edp``: the ranks holding the same experts (their gradients' reduction group);
* ``tied``: with a tied embedding cut by the pipeline (``tied``, pp > 1), the first and the
  last pipeline rank's data x context parallel ranks: the embedding's copy on one end and the
  LM head's on the other, reduced together (Megatron's embedding group, which all-reduces the
  two ends' gradients after the data-parallel reduction: one collective here, the same sum).
"""
from __future__ import annotations

from dataclasses import dataclass

from parsim.config.parallel import ParallelConfig


@dataclass(frozen=True)
class Coords:
    """One global rank's position in the grid."""

    rank: int
    """Global rank."""
    dp: int
    """Data-parallel index."""
    pp: int
    """Pipeline rank."""
    cp: int
    """Context-parallel index (position in the K/V ring)."""
    tp: int
    """Tensor-parallel index."""


def coords(par: ParallelConfig, rank: int) -> Coords:
    """Coordinates of ``rank`` in ``par``'s grid."""
    c = {a: (rank // par.stride(a)) % getattr(par, a) for a in ("dp", "pp", "cp", "tp")}
    return Coords(rank, c["dp"], c["pp"], c["cp"], c["tp"])


def rank_at(par: ParallelConfig, dp: int, pp: int, cp: int, tp: int) -> int:
    """The global rank at these coordinates."""
    return dp * par.stride("dp") + pp * par.stride("pp") + cp * par.stride("cp") + tp * par.stride("tp")


def edp_index(par: ParallelConfig, c: Coords) -> int:
    """Index of the rank in the dp x cp plane, cp fastest (``parsim.costs.moe``'s order)."""
    return c.dp * par.cp + c.cp


def _plane(par: ParallelConfig, pps: tuple[int, ...], tp: int, keep) -> list[int]:
    """Ranks on pipeline ranks ``pps`` and tp index ``tp`` whose dp x cp index passes ``keep``."""
    return sorted(rank_at(par, d, p, c, tp) for p in pps for d in range(par.dp) for c in range(par.cp)
                  if keep(d * par.cp + c))


def all_groups(par: ParallelConfig, n_chains: int = 1, tied: bool = False) -> dict[str, list[list[int]]]:
    """Every group of every kind, each once, in one deterministic order (every process must
    create them in the same order). ``tied``: the model ties its embedding and LM head."""
    out: dict[str, list[list[int]]] = {k: [] for k in ("tp", "cp", "grad", "ep", "edp", "tied")}
    seen: dict[str, set] = {k: set() for k in out}

    def add(kind: str, ranks: list[int]) -> None:
        key = tuple(ranks)
        if key not in seen[kind]:
            seen[kind].add(key)
            out[kind].append(list(ranks))

    for r in range(par.world_size):
        c = coords(par, r)
        add("tp", par.group_ranks("tp", r))
        add("cp", sorted(par.group_ranks("cp", r), key=lambda x: coords(par, x).cp))
        add("grad", grad_ranks(par, c, n_chains))
        if par.ep > 1:
            add("ep", ep_ranks(par, c))
            add("edp", edp_ranks(par, c, n_chains))
        if tied and par.pp > 1 and c.pp in (0, par.pp - 1):
            add("tied", tied_ranks(par, c))
    return out


def tied_ranks(par: ParallelConfig, c: Coords) -> list[int]:
    """The reduction group of a tied embedding's copies: both pipeline ends' data x context
    parallel ranks at this tensor-parallel index (the same vocabulary rows)."""
    return _plane(par, (0, par.pp - 1), c.tp, lambda j: True)


def pair_of(par: ParallelConfig, pp: int, n_chains: int) -> tuple[int, ...]:
    """The pipeline ranks holding the copies of pipeline rank ``pp``'s model pieces."""
    if n_chains == 1:
        return (pp,)
    return tuple(sorted({pp, par.pp - 1 - pp}))


def grad_ranks(par: ParallelConfig, c: Coords, n_chains: int = 1) -> list[int]:
    """The reduction group of a dense parameter of this rank's stages."""
    return _plane(par, pair_of(par, c.pp, n_chains), c.tp, lambda j: True)


def ep_ranks(par: ParallelConfig, c: Coords) -> list[int]:
    """This rank's expert-parallel group."""
    j0 = edp_index(par, c) // par.ep * par.ep
    return _plane(par, (c.pp,), c.tp, lambda j: j0 <= j < j0 + par.ep)


def edp_ranks(par: ParallelConfig, c: Coords, n_chains: int = 1) -> list[int]:
    """Ranks holding the same experts as this one (their gradients' reduction group)."""
    k = edp_index(par, c) % par.ep
    return _plane(par, pair_of(par, c.pp, n_chains), c.tp, lambda j: j % par.ep == k)
