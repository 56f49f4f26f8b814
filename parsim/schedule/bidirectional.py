"""Bidirectional schedules: DualPipe, DualPipeV (DeepSeek-V3) and Chimera (Li & Hoefler 2021).

* ``DualPipe``: two model copies (``n_chains = 2``). Chain 0 runs stages 0..p-1 on ranks
  0..p-1 and microbatches 0..m/2-1; chain 1 runs stages p..2p-1 on ranks p-1..0 and
  microbatches m/2..m-1, so rank r holds model pieces r and p-1-r (2x parameters).
  The order follows DeepSeek's eight steps per rank (h = min(r, p-1-r), rank r's
  "phase 0" is chain 0 on the first half of the ranks, chain 1 on the second):
  nF0, nF0F1, nB1W1F1 (zero bubble), the main nF0B1F1B0 steps whose F and B run as one
  composite ``OVERLAP_F_B``, nB1F1B0, nB1B0 (second half split into I/W), nWB0, nW.
  Needs p and m even and m >= 2p. Bubble (p/2-1)(F&B + B - 3W) (DeepSeek-V3 Table 2).
* ``DualPipeV``: the same steps on a V (one copy, 2p stages; stage r and 2p-1-r on rank
  r; needs m >= 2p): DualPipe "cut in half", 1x parameters.
* ``Chimera``: two model copies placed as DualPipe's (down chain 0, up chain 1), each on
  half of the microbatches, ordered by list scheduling (see ``_greedy_bidirectional``);
  bubble (D-2)/(2N+D-2) with equal F and B times, at most D microbatches in flight.

The W of a split backward is queued and run later (DualPipe's WeightGradStore): FIFO.
"""
from __future__ import annotations

from collections import deque

from parsim.errors import ScheduleError
from parsim.schedule.builders import _check_sizes, register, two_chunks
from parsim.schedule.ir import Op, Schedule, act, overlap
from parsim.schedule.semantics import ScheduleTraits, set_traits


class _Rank:
    """Counters of one rank's two phases (stage, first microbatch, n) and its W queue."""

    def __init__(self, stages, offsets, n):
        self.stage, self.off, self.n = stages, offsets, n
        self.f = [0, 0]
        self.b = [0, 0]
        self.wq: deque = deque()
        self.out: list = []

    def _f(self, ph):
        a = act(self.stage[ph], Op.F, self.off[ph] + self.f[ph])
        self.f[ph] += 1
        return a

    def _b(self, ph, zb):
        mb = self.off[ph] + self.b[ph]
        self.b[ph] += 1
        if zb:
            self.wq.append(act(self.stage[ph], Op.W, mb))
            return act(self.stage[ph], Op.I, mb)
        return act(self.stage[ph], Op.B, mb)

    def forward(self, ph):
        self.out.append(self._f(ph))

    def backward(self, ph, zb=False):
        self.out.append(self._b(ph, zb))

    def weight(self):
        if self.wq:
            self.out.append(self.wq.popleft())

    def forward_backward(self, ph0, ph1):
        f = self._f(ph0)
        self.out.append(overlap(f, self._b(ph1, False)))


def _dualpipe_steps(rk: _Rank, h: int, n_half: int, n: int, middle: bool) -> list:
    """DeepSeek's eight steps for a rank at distance ``h`` from the pipeline's edge."""
    for _ in range((n_half - h - 1) * 2):
        rk.forward(0)
    for _ in range(h + 1):
        rk.forward(0)
        rk.forward(1)
    for _ in range(n_half - h - 1):
        rk.backward(1, zb=True)
        rk.weight()
        rk.forward(1)
    for i in range(n - 2 * n_half + h + 1):
        if i == 0 and middle:
            rk.forward(0)  # not overlapped: shortens the bubble at the turn
            rk.backward(1)
        else:
            rk.forward_backward(0, 1)
        rk.forward_backward(1, 0)
    for _ in range(n_half - h - 1):
        rk.backward(1)
        rk.forward_backward(1, 0)
    zb = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            zb = True
        rk.backward(1, zb=zb)
        if i == (h + 1) // 2 and h % 2 == 0:
            zb = True
        rk.backward(0, zb=zb)
    for _ in range(n_half - h - 1):
        rk.weight()
        rk.backward(0, zb=True)
    while rk.wq:
        rk.weight()
    return rk.out


def dualpipe(pp: int, m: int) -> Schedule:
    """DualPipe: bidirectional, two model copies, overlapped F&B (see module doc)."""
    _check_sizes(pp, m)
    if pp % 2 or m % 2 or m < 2 * pp:
        raise ScheduleError(f"DualPipe needs an even pp, an even number of microbatches and m >= 2*pp "
                            f"(got pp={pp}, m={m})")
    half, n_half = m // 2, pp // 2
    rows = []
    for r in range(pp):
        a, b = r, pp + (pp - 1 - r)  # chain 0 stage, chain 1 stage on this rank
        first = r < n_half
        stages = (a, b) if first else (b, a)
        offsets = (0, half) if first else (half, 0)
        h = min(r, pp - 1 - r)
        rows.append(tuple(_dualpipe_steps(_Rank(stages, offsets, half), h, n_half, half, h == n_half - 1)))
    s2r = tuple(range(pp)) + tuple(pp - 1 - k for k in range(pp))
    return Schedule.trusted("DualPipe", 2 * pp, m, s2r, tuple(rows), 2)


def dualpipe_v(pp: int, m: int) -> Schedule:
    """DualPipeV: DualPipe's steps on a V of 2p stages, one model copy (see module doc)."""
    _check_sizes(pp, m)
    if m < 2 * pp:
        raise ScheduleError(f"DualPipeV needs m >= 2*pp microbatches (got pp={pp}, m={m})")
    rows = tuple(
        tuple(_dualpipe_steps(_Rank((r, 2 * pp - 1 - r), (0, 0), m), r, pp, m, r == pp - 1))
        for r in range(pp)
    )
    s2r = tuple(s if s < pp else 2 * pp - 1 - s for s in range(2 * pp))
    return Schedule.trusted("DualPipeV", 2 * pp, m, s2r, rows)


def chimera(pp: int, m: int) -> Schedule:
    """Chimera: two model copies in opposite directions (see module doc)."""
    _check_sizes(pp, m)
    if pp % 2 or m % 2:
        raise ScheduleError(f"Chimera needs an even pp and an even number of microbatches (got pp={pp}, m={m})")
    s2r = tuple(range(pp)) + tuple(pp - 1 - k for k in range(pp))
    rows = _greedy_bidirectional(pp, m, s2r)
    return Schedule.trusted("Chimera", 2 * pp, m, s2r, rows, 2)


def _greedy_bidirectional(pp: int, m: int, s2r: tuple) -> tuple:
    """Chimera's order by list scheduling with unit F and B times: whenever a rank is
    free it starts the ready action that can start first, a backward before a forward,
    then the lower microbatch of its chain; at most pp microbatches in flight per rank
    (Chimera's activation bound D x M_a). This reproduces Chimera's (D-2)/(2N+D-2)."""
    half = m // 2
    ready: dict[tuple, float] = {}
    pending: list[set] = [set() for _ in range(pp)]

    def post(key, t):
        ready[key] = t
        pending[s2r[key[1]]].add(key)

    post((1, 0, 0), 0.0)  # (kind 1 = F / 0 = B, stage, microbatch); each chain's next
    post((1, pp, half), 0.0)  # microbatch is posted when the previous one starts (same order)
    clock = [0.0] * pp
    live = [0] * pp
    rows: list[list] = [[] for _ in range(pp)]
    for _ in range(2 * pp * m):
        best = None
        for r in range(pp):
            for key in pending[r]:
                if key[0] and key[1] % pp == 0 and live[r] >= pp:
                    continue
                pri = (max(clock[r], ready[key]), key[0], key[2] % half, key[1])
                if best is None or pri < best[0]:
                    best = (pri, r, key)
        (start, _, _, _), r, key = best
        pending[r].discard(key)
        kind, st, j = key
        clock[r] = start + 1.0
        if kind:
            if st % pp == 0 and (j % half) + 1 < half:
                post((1, st, j + 1), 0.0)
            live[r] += 1
            rows[r].append(act(st, Op.F, j))
            post((1, st + 1, j) if (st + 1) % pp else (0, st, j), clock[r])
        else:
            live[r] -= 1
            rows[r].append(act(st, Op.B, j))
            if st % pp:
                post((0, st - 1, j), clock[r])
    return tuple(tuple(r) for r in rows)


register("DualPipe", two_chunks(dualpipe, "DualPipe"))
register("DualPipeV", two_chunks(dualpipe_v, "DualPipeV"))
register("Chimera", two_chunks(chimera, "Chimera"))
set_traits("DualPipe", ScheduleTraits(stages_per_rank=2, n_chains=2, overlap_f_b=True))
set_traits("DualPipeV", ScheduleTraits(stages_per_rank=2, overlap_f_b=True))
set_traits("Chimera", ScheduleTraits(stages_per_rank=2, n_chains=2))
