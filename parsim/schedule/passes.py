"""Lowering passes (compute-only schedule -> runnable schedule) and validation.

Passes are small functions Schedule -> Schedule; :func:`lower` composes them:

1. ZeRO-3 / FSDP parameter gathers, one of:

   * :func:`add_unshard_per_microbatch` (``reshard_after_forward``, FSDP's and DeepSpeed
     ZeRO-3's default): ``sUNSHARDm`` right before every F and every B/I of stage s,
     ``sRESHARDm`` right after it -- each microbatch gathers the parameters for its
     forward and again for its backward. W needs no parameters (dW = x^T dy).
   * :func:`add_unshard_reshard` (kept gathered): ``sUNSHARD`` right before the first F of
     stage s and ``sRESHARD`` right after its last F; again before its first backward and
     after its last. When the forward and backward windows overlap (1F1B and every
     schedule that mixes them), the stage stays gathered from its first F to its last
     backward: one window.
2. :func:`add_send_recv`: ``RECV_F`` right before each F whose input comes from another
   rank, ``SEND_F`` right after each F whose consumer is on another rank; ``RECV_B``
   before and ``SEND_B`` after each B/I likewise. Nothing between stages on one rank.
3. :func:`add_grad_reduction`: ``sREDUCE_GRAD`` right after the last backward of s (the
   last B, or the last W when split; after the SEND that follows it, if any), and
   ``sSTEP`` for each stage at the end of its rank's list, in reduction order. With
   ``per_microbatch`` (ZeRO-2/3 and FSDP's reduce-scatter of every microbatch's
   gradients) ``sREDUCE_GRADm`` follows the last backward of every (s, m) instead; with
   ``after_all_backward`` (no overlap of the reduction) every stage's waits for the rank's
   last backward.
4. :func:`post_recvs_early` (optional, ``lower(..., early_recv=True)``): every RECV moves
   to the start of its rank's list (in order), so a runtime whose transport needs both
   sides posted (gloo's rendezvous) has every receive posted before the sender sends.

:func:`validate` checks a schedule (lowered or not) and dry-runs it; any failure is a
:class:`ScheduleError` naming the rank, step and action, with a grid marking it.
"""
from __future__ import annotations

from collections import Counter

from parsim.errors import ScheduleError
from parsim.schedule.dryrun import DryRun, _fail, dry_run
from parsim.schedule.grid import format_grid
from parsim.schedule.ir import Action, Op, Schedule, act, action_table, no_gc, overlap
from parsim.schedule.terapipe import check_slice_order

_P2P = (Op.SEND_F, Op.RECV_F, Op.SEND_B, Op.RECV_B)


def _refuse_if_present(schedule: Schedule, ops: tuple[Op, ...], pass_name: str) -> None:
    ops = frozenset(ops)
    for r, row in enumerate(schedule.actions):
        if ops.isdisjoint({a.op for a in row}):
            continue
        for k, a in enumerate(row):
            if a.op in ops:
                raise _fail(schedule, r, k, f"{pass_name}: the schedule already has {a.op.value} actions")


def add_send_recv(schedule: Schedule) -> Schedule:
    """Insert SEND/RECV around every compute whose peer stage is on another rank.

    One linear pass; a composite OVERLAP_F_B gets the RECVs of both its parts before
    it and their SENDs after it.
    """
    _refuse_if_present(schedule, _P2P, "add_send_recv")
    s2r = schedule.stage_to_rank
    n, nm = schedule.n_stages, schedule.n_microbatches
    prev = [schedule.prev_stage(s) for s in range(n)]
    nxt = [schedule.next_stage(s) for s in range(n)]
    F, B, I = Op.F, Op.B, Op.I
    # per stage: the RECV_F/SEND_B tables when its producer is remote, SEND_F/RECV_B when its consumer is
    up = [action_table(s, Op.RECV_F, nm) if p is not None and s2r[p] != s2r[s] else None for s, p in enumerate(prev)]
    up_b = [action_table(s, Op.SEND_B, nm) if t is not None else None for s, t in enumerate(up)]
    down = [action_table(s, Op.SEND_F, nm) if q is not None and s2r[q] != s2r[s] else None for s, q in enumerate(nxt)]
    down_b = [action_table(s, Op.RECV_B, nm) if t is not None else None for s, t in enumerate(down)]
    rows = []
    for row in schedule.actions:
        out: list[Action] = []
        push = out.append
        for a in row:
            op = a.op
            if op is F:
                s, m = a.stage, a.microbatch
                t = up[s]
                if t is not None:
                    push(t[m])
                push(a)
                t = down[s]
                if t is not None:
                    push(t[m])
            elif op is B or op is I:
                s, m = a.stage, a.microbatch
                t = down_b[s]
                if t is not None:
                    push(t[m])
                push(a)
                t = up_b[s]
                if t is not None:
                    push(t[m])
            elif op is Op.OVERLAP_F_B:
                f, b = a.sub
                if up[f.stage] is not None:
                    push(up[f.stage][f.microbatch])
                if down_b[b.stage] is not None:
                    push(down_b[b.stage][b.microbatch])
                push(a)
                if down[f.stage] is not None:
                    push(down[f.stage][f.microbatch])
                if up_b[b.stage] is not None:
                    push(up_b[b.stage][b.microbatch])
            else:
                push(a)
        rows.append(tuple(out))
    return _same_shape(schedule, tuple(rows))


def post_recvs_early(schedule: Schedule, ahead: int | None = None) -> Schedule:
    """Post every RECV ``ahead`` compute actions before the compute that consumes it (None:
    at the start of its rank's list, every receive of the step posted before any compute).

    gloo (and NCCL beyond its eager buffers) moves a p2p message only when the receive
    is posted: the receiver's "ready" notice has to reach the sender, and on a CPU rank the
    sender's progress thread that answers it shares its core with the sender's compute, so
    it runs when the scheduler lets it preempt that compute (milliseconds). Posted right
    before its consumer, every message waits for that; posted one compute ahead, a message
    still waits when the computes are short (TeraPipe's token slices: 2-3 ms). Measured on
    this 2-core VM, TeraPipe k=4 on the tiny GPT (gloo, 6 steps after 2 warm-up): step
    time -20% and -24% below the prediction with receives one compute ahead, -15% with four,
    -12% and -13% with every receive posted at the step's start (bubble -46..-55% ->
    -14..-17%). Timing in the simulator is unchanged (posting a receive is free there; its
    consumer waits for the arrival either way). Relative order of the RECVs is kept.
    Not for NCCL: p2p on one communicator runs in posting order, and a RECV overtaking a
    SEND to the same peer can deadlock two ranks.
    """
    if ahead is not None and ahead < 1:
        raise ValueError(f"ahead must be >= 1 compute (or None: the step's start), got {ahead}")
    rows = []
    for row in schedule.actions:
        out: list[Action] = []
        computes: list[int] = []  # indices in ``out`` of the compute actions placed so far
        floor = 0                 # RECVs stay in order: never insert before the previous one moved
        for a in row:
            if a.op is Op.RECV_F or a.op is Op.RECV_B:
                if ahead is None:
                    at = floor
                elif computes:
                    at = max(floor, computes[-ahead] if len(computes) >= ahead else computes[0])
                else:
                    at = len(out)
                out.insert(at, a)
                floor = at + 1
                computes = [c + 1 if c >= at else c for c in computes]
                continue
            if a.op.is_compute:
                computes.append(len(out))
            out.append(a)
        rows.append(tuple(out))
    return _same_shape(schedule, tuple(rows))


def _same_shape(schedule: Schedule, rows: tuple) -> Schedule:
    return Schedule.trusted(schedule.name, schedule.n_stages, schedule.n_microbatches,
                            schedule.stage_to_rank, rows, schedule.n_chains, schedule.n_slices)


def last_backward(row, n_stages: int | None = None) -> dict[int, int]:
    """Stage -> index of its last B or W (a composite counts for its B part).

    Scans from the end; stops once ``n_stages`` stages (the rank's, when known) are found.
    """
    last: dict[int, int] = {}
    B, W, OV = Op.B, Op.W, Op.OVERLAP_F_B
    for k in range(len(row) - 1, -1, -1):
        a = row[k]
        op = a.op
        if op is B or op is W:
            last.setdefault(a.stage, k)
        elif op is OV and a.sub[1].op is B:
            last.setdefault(a.sub[1].stage, k)
        else:
            continue
        if n_stages is not None and len(last) == n_stages:
            break
    return last


def _windows(row: tuple[Action, ...], stage: int) -> list[tuple[int, int]]:
    """Index windows [first, last] during which ``stage`` needs its parameters."""
    fwd = [k for k, a in enumerate(row) if any(p.stage == stage and p.op is Op.F for p in a.parts)]
    bwd = [k for k, a in enumerate(row) if any(p.stage == stage and p.op.is_backward for p in a.parts)]
    wins = [(w[0], w[-1]) for w in (fwd, bwd) if w]
    if len(wins) == 2 and wins[1][0] <= wins[0][1]:
        return [(min(wins[0][0], wins[1][0]), max(wins[0][1], wins[1][1]))]
    return sorted(wins)


def add_unshard_reshard(schedule: Schedule) -> Schedule:
    """ZeRO-3: gather each stage's parameters around its forward and backward groups."""
    _refuse_if_present(schedule, (Op.UNSHARD, Op.RESHARD), "add_unshard_reshard")
    rows = []
    for r, row in enumerate(schedule.actions):
        before: dict[int, list[Action]] = {}
        after: dict[int, list[Action]] = {}
        for s in schedule.stages_of(r):
            for lo, hi in _windows(row, s):
                before.setdefault(lo, []).append(Action(s, Op.UNSHARD))
                after.setdefault(hi, []).append(Action(s, Op.RESHARD))
        out: list[Action] = []
        for k, a in enumerate(row):
            out += before.get(k, [])
            out.append(a)
            out += after.get(k, [])
        rows.append(out)
    return schedule.with_actions(rows)


def add_unshard_per_microbatch(schedule: Schedule) -> Schedule:
    """ZeRO-3/FSDP with resharding after forward: gather around every F and every B/I."""
    _refuse_if_present(schedule, (Op.UNSHARD, Op.RESHARD), "add_unshard_per_microbatch")
    rows = []
    F, B, I, OV = Op.F, Op.B, Op.I, Op.OVERLAP_F_B
    for row in schedule.actions:
        out: list[Action] = []
        for a in row:
            op = a.op
            if op is F or op is B or op is I or op is OV:
                # the parts needing parameters, each stage once (a composite's two stages differ)
                need = list(dict.fromkeys((p.stage, p.microbatch) for p in a.parts if p.op is not Op.W))
                out += [act(s, Op.UNSHARD, m) for s, m in need]
                out.append(a)
                out += [act(s, Op.RESHARD, m) for s, m in need]
            else:
                out.append(a)
        rows.append(tuple(out))
    return _same_shape(schedule, tuple(rows))


def last_backward_per_microbatch(row) -> dict[tuple[int, int], int]:
    """(stage, microbatch) -> index of the action ending its backward (B, or W when split)."""
    last: dict[tuple[int, int], int] = {}
    for k, a in enumerate(row):
        for p in a.parts:
            if p.op is Op.B or p.op is Op.W:
                last[(p.stage, p.microbatch)] = k
    return last


_AFTER_BACKWARD = (Op.SEND_B, Op.SEND_F, Op.RESHARD)
"""What stays right after a backward: its sends and the release of its gathered parameters."""


def add_grad_reduction(schedule: Schedule, reduce: bool = True, step: bool = True,
                       per_microbatch: bool = False, after_all_backward: bool = False) -> Schedule:
    """REDUCE_GRAD after each stage's last backward (if ``reduce``; ``per_microbatch``: after
    every microbatch's backward); STEPs at the end.

    ``after_all_backward``: every stage's REDUCE_GRAD waits for the rank's last backward, in the
    order the stages finished -- a framework that does not overlap the reduction with the
    backward (Megatron's ``finalize_model_grads`` without ``--overlap-grad-reduce``, which
    reduces each model chunk in turn once the pipeline has flushed) instead of launching a
    chunk's buckets as its last backward ends."""
    _refuse_if_present(schedule, (Op.REDUCE_GRAD, Op.STEP), "add_grad_reduction")
    rows = []
    per_rank = [0] * schedule.pp
    for r in schedule.stage_to_rank:
        per_rank[r] += 1
    for r, row in enumerate(schedule.actions):
        last = last_backward(row, per_rank[r])
        order = sorted(last.items(), key=lambda kv: kv[1])
        at: dict[int, list[Action]] = {}
        points = (sorted(((k, s, m) for (s, m), k in last_backward_per_microbatch(row).items()))
                  if per_microbatch else [(k, s, None) for s, k in order])
        if after_all_backward and not per_microbatch and order:
            points = [(order[-1][1], s, m) for _, s, m in points]
        for k, s, m in points:
            while k + 1 < len(row) and row[k + 1].op in _AFTER_BACKWARD:
                k += 1
            if reduce:
                at.setdefault(k, []).append(act(s, Op.REDUCE_GRAD, m))
        out: list[Action] = []
        if at:
            prev = 0
            for k in sorted(at):
                out += row[prev:k + 1]
                out += at[k]
                prev = k + 1
            out += row[prev:]
        else:
            out += row
        if step:
            out += [act(s, Op.STEP) for s, _ in order]
        rows.append(tuple(out))
    return _same_shape(schedule, tuple(rows))


def lower(
    schedule: Schedule,
    *,
    zero3: bool = False,
    reduce_grad: bool = True,
    optimizer_step: bool = True,
    early_recv: bool = False,
    reshard_after_forward: bool = False,
    grad_per_microbatch: bool = False,
    reduce_after_all_backward: bool = False,
) -> Schedule:
    """Compose the passes: UNSHARD/RESHARD (zero3: per microbatch when
    ``reshard_after_forward``, else one window per stage), SEND/RECV, REDUCE_GRAD (per
    microbatch when ``grad_per_microbatch``; after the rank's last backward for every stage
    when ``reduce_after_all_backward``) and STEP, then (``early_recv``)
    :func:`post_recvs_early`.

    Cached on the (immutable) schedule and the flags: lowering the same build twice is free.
    """
    key = (id(schedule), zero3, reduce_grad, optimizer_step, early_recv, reshard_after_forward, grad_per_microbatch,
           reduce_after_all_backward)
    hit = _LOWERED.get(key)
    if hit is not None and hit[0] is schedule:
        return hit[1]
    low = _lower(schedule, zero3, reduce_grad, optimizer_step, reshard_after_forward, grad_per_microbatch,
                 reduce_after_all_backward)
    if early_recv:
        low = post_recvs_early(low)
    if len(_LOWERED) >= 32:
        _LOWERED.pop(next(iter(_LOWERED)))
    _LOWERED[key] = (schedule, low)  # the schedule is kept alive, so its id is not reused
    return low


_LOWERED: dict[tuple, tuple[Schedule, Schedule]] = {}


def _lower(schedule: Schedule, zero3: bool, reduce_grad: bool, optimizer_step: bool,
           reshard_after_forward: bool, grad_per_microbatch: bool, after_all_backward: bool) -> Schedule:
    with no_gc():
        s = schedule
        if zero3:
            s = add_unshard_per_microbatch(s) if reshard_after_forward else add_unshard_reshard(s)
        s = add_send_recv(s)
        if reduce_grad or optimizer_step:
            s = add_grad_reduction(s, reduce=reduce_grad, step=optimizer_step, per_microbatch=grad_per_microbatch,
                                   after_all_backward=after_all_backward)
    return s


def pair_forward_with_backward(schedule: Schedule) -> Schedule:
    """Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``), on a compute-only
    1F1B or interleaved 1F1B schedule: each rank runs one more warm-up forward
    (schedules.py ``get_pp_rank_microbatches``: "one extra micro-batch forward step before
    the 1f1b stages ... to ensure the forward and backward computations are independent"),
    then every steady-state forward and the backward after it as one composite
    ``(F;B)OVERLAP_F_B`` whose halves run layer by layer beside each other
    (combined_1f1b.py), then the remaining backwards alone. With pp = 1: F0, (F1;B0), ...,
    (F[m-1];B[m-2]), B[m-1] -- the phases of ``combined_1f1b_schedule_for_no_pipelining``."""
    rows = []
    for r, row in enumerate(schedule.actions):
        if any(a.op not in (Op.F, Op.B) for a in row):
            raise ScheduleError(f"{schedule.name}: rank {r} runs {sorted({a.op.value for a in row})}: pairing "
                                "forwards with backwards needs a compute-only schedule of F and B")
        fwd = [a for a in row if a.op is Op.F]
        bwd = [a for a in row if a.op is Op.B]
        # 1F1B's steady step is F then B, so the forwards before the first backward are the
        # warm-up plus one: Megatron's warm-up with its extra microbatch
        warm = next((i for i, a in enumerate(row) if a.op is Op.B), len(fwd))
        out = list(fwd[:warm])
        pairs = len(fwd) - warm
        out += [overlap(fwd[warm + k], bwd[k]) for k in range(pairs)]
        out += bwd[pairs:]
        rows.append(tuple(out))
    return Schedule.trusted(schedule.name, schedule.n_stages, schedule.n_microbatches, schedule.stage_to_rank,
                            tuple(rows), schedule.n_chains)


# ----------------------------------------------------------------------------- validate


def _check_placement(schedule: Schedule) -> None:
    n, nm = schedule.n_stages, schedule.n_microbatches
    for r, row in enumerate(schedule.actions):
        for k, a in ((k, p) for k, whole in enumerate(row) for p in whole.parts):
            s = a.stage
            if s >= n:
                raise _fail(schedule, r, k, f"stage {s} out of range (n_stages={n})")
            if schedule.rank_of(s) != r:
                raise _fail(schedule, r, k, f"stage {s} lives on rank {schedule.rank_of(s)}, not here")
            if a.microbatch is not None and a.microbatch >= nm:
                raise _fail(schedule, r, k, f"microbatch {a.microbatch} out of range (n_microbatches={nm})")
            if a.microbatch is not None and a.microbatch not in schedule.microbatches_of(s):
                raise _fail(schedule, r, k, f"microbatch {a.microbatch} is not in stage {s}'s chain")
            if a.op.is_p2p:
                fwd_peer = a.op in (Op.SEND_F, Op.RECV_B)
                peer = schedule.next_stage(s) if fwd_peer else schedule.prev_stage(s)
                if peer is None:
                    raise _fail(schedule, r, k, f"stage {s} has no stage {s + 1 if fwd_peer else s - 1} to talk to")
                if schedule.rank_of(peer) == r:
                    raise _fail(schedule, r, k, f"stages {s} and {peer} share rank {r}: no SEND/RECV between them")


def _check_rank_order(schedule: Schedule, r: int, lowered: bool) -> None:
    """Same-rank prerequisites, duplicates, ZeRO-3 windows, reduction placement."""
    row = schedule.actions[r]
    managed = {a.stage for a in row if a.op is Op.UNSHARD}
    last_bwd = last_backward(row)
    reduced: dict[int, set] = {}  # stage -> the microbatches (or None) of its REDUCE_GRADs
    for a in row:
        if a.op is Op.REDUCE_GRAD:
            reduced.setdefault(a.stage, set()).add(a.microbatch)
    seen: set[tuple] = set()  # (stage, op, microbatch) of the actions issued so far
    gathered: set[int] = set()
    for k, a in ((k, p) for k, whole in enumerate(row) for p in whole.parts):
        s, m, op = a.stage, a.microbatch, a.op
        key = (s, op, m)
        if key in seen and op not in (Op.UNSHARD, Op.RESHARD):
            problem = "appears twice"
        elif op in (Op.F, Op.B, Op.I) and s in managed and s not in gathered:
            # W (dW = x^T dy) reads no parameters: it may run resharded
            problem = f"stage {s} parameters are not gathered here (UNSHARD missing or RESHARD too early)"
        elif op in (Op.F, Op.B, Op.I, Op.W, Op.SEND_F, Op.SEND_B):
            problem = _check_compute(schedule, r, a, seen, lowered)
        elif op is Op.REDUCE_GRAD and m is not None:
            if (s, Op.B, m) not in seen and (s, Op.W, m) not in seen:
                problem = f"comes before the backward of stage {s} microbatch {m}"
            else:
                problem = None
        elif op in (Op.REDUCE_GRAD, Op.STEP) and last_bwd.get(s, -1) > k:
            problem = f"comes before the last backward of stage {s} (step {last_bwd[s]})"
        elif op is Op.STEP and any((s, Op.REDUCE_GRAD, x) not in seen for x in reduced.get(s, ())):
            problem = f"comes before {s}REDUCE_GRAD"
        elif op is Op.UNSHARD and s in gathered:
            problem = f"stage {s} is already gathered"
        elif op is Op.RESHARD and s not in gathered:
            problem = f"stage {s} is not gathered"
        else:
            problem = None
        if problem:
            raise _fail(schedule, r, k, problem)
        seen.add(key)
        if op is Op.UNSHARD:
            gathered.add(s)
        elif op is Op.RESHARD:
            gathered.discard(s)


def _check_compute(schedule: Schedule, r: int, a: Action, seen: set[tuple], lowered: bool) -> str | None:
    """Same-rank prerequisites of F, B, I, W and of the SENDs of their results."""
    s, m, op = a.stage, a.microbatch, a.op
    if op is Op.F:
        return _check_input(schedule, r, a, seen, lowered, fwd=True)
    if op is Op.B or op is Op.I:
        if (s, Op.F, m) not in seen:
            return f"comes before its forward {s}F{m}"
        if (s, Op.I if op is Op.B else Op.B, m) in seen:
            return f"stage {s} microbatch {m} has both B and I"
        return _check_input(schedule, r, a, seen, lowered, fwd=False)
    if op is Op.W:
        return None if (s, Op.I, m) in seen else f"comes before its {s}I{m}"
    if op is Op.SEND_F:
        return None if (s, Op.F, m) in seen else f"sends before its {s}F{m} ran"
    if (s, Op.B, m) in seen or (s, Op.I, m) in seen:  # SEND_B
        return None
    return f"sends before its {s}B{m}/{s}I{m} ran"


def _check_input(schedule: Schedule, r: int, a: Action, seen: set[tuple], lowered: bool, fwd: bool) -> str | None:
    s, m = a.stage, a.microbatch
    src = schedule.prev_stage(s) if fwd else schedule.next_stage(s)
    if src is None:
        return None
    if schedule.rank_of(src) == r:
        if fwd and (src, Op.F, m) in seen:
            return None
        if not fwd and ((src, Op.B, m) in seen or (src, Op.I, m) in seen):
            return None
        return f"comes before its input {src}{'F' if fwd else 'B/I'}{m} on the same rank"
    recv = Op.RECV_F if fwd else Op.RECV_B
    if lowered and (s, recv, m) not in seen:
        return f"no {s}{recv.value}{m} posted before it"
    return None


def _first_step(schedule: Schedule, r: int, pred) -> int | None:
    return next((k for k, a in enumerate(schedule.actions[r]) if pred(a)), None)


def _check_counts(schedule: Schedule) -> None:
    """Each (stage, microbatch): one F, and one B or one I and one W (plus their sends)."""
    count = Counter((p.stage, p.op, p.microbatch) for row in schedule.actions for a in row for p in a.parts)
    lowered = schedule.is_lowered
    n = schedule.n_stages
    for s in range(n):
        r = schedule.rank_of(s)
        nxt, prv = schedule.next_stage(s), schedule.prev_stage(s)
        for m in schedule.microbatches_of(s):
            at = lambda op: _first_step(schedule, r, lambda a: Action(s, op, m) in a.parts)  # noqa: E731
            problem, step = None, None
            if not count[(s, Op.F, m)]:
                problem = f"stage {s} microbatch {m} has no F"
            elif not (count[(s, Op.B, m)] or count[(s, Op.I, m)]):
                problem, step = f"stage {s} microbatch {m} has no B (or I+W)", at(Op.F)
            elif count[(s, Op.I, m)] and not count[(s, Op.W, m)]:
                problem, step = f"stage {s} microbatch {m} has I but no W", at(Op.I)
            elif lowered and nxt is not None and schedule.rank_of(nxt) != r and not count[(s, Op.SEND_F, m)]:
                problem, step = f"{s}F{m} has no {s}SEND_F{m} for stage {nxt}", at(Op.F)
            elif lowered and prv is not None and schedule.rank_of(prv) != r and not count[(s, Op.SEND_B, m)]:
                problem = f"stage {s} microbatch {m} sends no gradient to stage {prv} (SEND_B missing)"
                step = at(Op.B) if count[(s, Op.B, m)] else at(Op.I)
            if problem:
                if step is not None:
                    raise _fail(schedule, r, step, problem)
                raise ScheduleError(
                    f"rank {r}: {problem}", grid=format_grid(schedule, mark=(r, None), window=10)
                )


def validate(schedule: Schedule, **durations) -> DryRun:
    """Check ``schedule`` and dry-run it; raise ScheduleError on the first problem.

    Checks, in order: placement (stages on their rank, indices in range, SEND/RECV only
    between ranks); same-rank order (B/I after F, W after I, SEND after its producer,
    an F/B/I after a same-rank producer or, when lowered, after its RECV; ZeRO-3 windows;
    REDUCE_GRAD/STEP after the last backward); counts (one F and one B or I+W per stage
    and microbatch; when lowered every cross-rank output sent); token slices in K/V order
    (``terapipe.check_slice_order``); then the dry run, which
    enforces cross-rank causality and finds deadlocks. Returns the dry run.
    """
    _check_placement(schedule)
    lowered = schedule.is_lowered
    for r in range(schedule.pp):
        _check_rank_order(schedule, r, lowered)
    _check_counts(schedule)
    check_slice_order(schedule)  # token slices (TeraPipe): K/V order on each stage
    return dry_run(schedule, **durations)
