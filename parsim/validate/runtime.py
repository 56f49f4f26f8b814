"""Interpreter of a lowered schedule on torch.distributed: one process per rank.

It walks exactly the per-rank action list the simulator times
(``parsim.simulate.schedule_for``) with the semantics of ``parsim.schedule.ir``:

* ``RECV_*`` posts ``irecv`` into a fresh buffer; the F/B/I that consumes it waits on it;
* ``SEND_*`` is ``isend`` (non-blocking); handles are kept until the end of the step;
* F/B/I/W run the stage's torch module (W: the deferred weight-gradient GEMMs); the
  tensor-, context- and expert-parallel collectives run inside them and are timed apart
  (``parsim.validate.comm``: the ``tp`` / ``cp`` / ``ep`` streams of the measured timeline);
* ``(sFm;tBn)OVERLAP_F_B`` runs its F, then its B, on the one compute stream (the IR allows
  it: same order and dependencies); each part is its own span, as the simulator records it;
* ``REDUCE_GRAD`` sums sequence-parallel partial gradients over tp, then launches an
  asynchronous collective over the stage's flattened gradients on each of its reduction
  groups (``parsim.validate.layout``: data x context parallel ranks, plus the other model
  copy's ranks r and p-1-r for two-chain schedules such as DualPipe; expert-data-parallel
  ranks for routed experts): all-reduce, or reduce-scatter for ZeRO >= 1;
* ``STEP`` waits for its reductions, steps the optimizer (ZeRO >= 1: on this rank's shard
  only, then all-gathers the updated parameters: ``PARAM_GATHER`` span);
* ``UNSHARD`` (ZeRO-3) launches an asynchronous all-gather of the stage's parameter
  shards; compute of the stage waits for it; ``RESHARD`` only marks the end of the window.

Schedule semantics beyond the order (``parsim.schedule.semantics``):

* re-materialisation (GPipeRemat): F runs without autograd and keeps only the stage's
  input; B reruns the forward with autograd, then back-propagates (its span holds both);
* weight stashing (PipeDream, PipeDream-2BW; ``parsim.validate.params.Versions``): the
  step computes on the weight version ``staleness`` updates old, STEP updates the newest;
* two chains (DualPipe, Chimera): each rank holds a piece of each model copy; the copies'
  gradients are summed by the REDUCE_GRAD above.

What it runs is declared in ``parsim.validate.scale.RUNTIME_COVERAGE`` (torch-free, so
``parsim validate`` refuses anything else before a rank starts); :class:`RankRuntime`
checks it again. Every executed action becomes a span (rank, stream, op, stage,
microbatch, start, end, bytes) timed with perf_counter on CPU and CUDA events on GPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from parsim.config.parallel import ParallelConfig
from parsim.schedule.coverage import check_runs
from parsim.schedule.ir import Schedule
from parsim.schedule.semantics import staleness_steps, traits
from parsim.validate.comm import (
    CommRecorder,
    Group,
    all_gather_flat,
    reduce_scatter_flat,
)
from parsim.validate.layout import Coords, coords, rank_at
from parsim.validate.model import Stage
from parsim.validate.params import REDUCTION_GROUP, FlatParams, Versions, params_by_kind, sum_partial_grads
from parsim.validate.scale import RUNTIME_COVERAGE
from parsim.validate.slices import SliceKV
from parsim.validate.tensor_parallel import WeightGradStore
from parsim.validate.timing import Timer


@dataclass
class Layout:
    """Where this process sits, and its groups (``parsim.validate.layout``)."""

    par: ParallelConfig
    rank: int
    device: torch.device
    dtype: torch.dtype
    backend: str
    groups: dict = field(default_factory=dict)
    """kind (tp, cp, grad, ep, edp) -> this rank's :class:`Group` of that kind."""

    @property
    def c(self) -> Coords:
        return coords(self.par, self.rank)

    @property
    def pp(self) -> int:
        return self.par.pp

    @property
    def dp(self) -> int:
        return self.par.dp

    @property
    def pp_rank(self) -> int:
        return self.c.pp

    @property
    def dp_rank(self) -> int:
        return self.c.dp

    def global_rank(self, pp_rank: int) -> int:
        c = self.c
        return rank_at(self.par, c.dp, pp_rank, c.cp, c.tp)

    def group(self, kind: str) -> Group:
        return self.groups.get(kind) or Group((self.rank,), 0, None, kind)


@dataclass
class StepState:
    """Everything one optimizer step keeps between actions."""

    inputs: dict = field(default_factory=dict)      # (stage, mb) -> stage input (leaf)
    outputs: dict = field(default_factory=dict)     # (stage, mb) -> output activation / scaled loss (graph)
    sendout: dict = field(default_factory=dict)     # (stage, mb) -> output to send
    local: dict = field(default_factory=dict)       # (stage, "F"|"B", mb) -> tensor from a stage on this rank
    recvs: dict = field(default_factory=dict)       # (stage, "F"|"B", mb) -> (work, buffer)
    sends: list = field(default_factory=list)       # (work, tensor) kept alive until the step ends
    stores: dict = field(default_factory=dict)      # (stage, mb) -> WeightGradStore (I/W split)
    reduces: dict = field(default_factory=dict)     # (stage, kind) -> [(work, buffer), ...] (one per REDUCE_GRAD)
    unshards: dict = field(default_factory=dict)    # (stage, kind) -> (work, out)
    losses: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)       # parity: (stage, kind) -> reduced grads before the step
    kv: dict = field(default_factory=dict)          # token slices: (stage, mb, block) -> SliceKV
    slice_loss: dict = field(default_factory=dict)  # token slices: mb -> its loss so far (slices weighted)
    order: list = field(default_factory=list)       # message-driven: the realized order [(op, instance), ...]
    update_grads: dict = field(default_factory=dict)  # message-driven parity: kind -> [gradients, one per update]


class RankRuntime:
    """Executes one rank's action list, step after step."""

    message_driven = False
    """Whether this interpreter makes the order from the messages (AMPNet) instead of walking the list."""

    def __init__(self, schedule: Schedule, stages: dict[int, Stage], layout: Layout, data, act_shape,
                 zero: int, opt_factory, fault: dict | None = None, keep_grads: bool = False,
                 slice_lengths: tuple[int, ...] | None = None):
        check_runs(schedule, RUNTIME_COVERAGE)
        if traits(schedule.name).message_driven and not self.message_driven:
            raise ValueError(f"{schedule.name} is message-driven: its action list is not its order "
                             "(parsim.validate.messages.MessageDrivenRuntime runs it)")
        self.sched, self.stages, self.lay = schedule, stages, layout
        self.data, self.act_shape, self.zero = data, act_shape, zero
        self.actions = schedule.actions[layout.pp_rank]
        self.n_mb = schedule.n_microbatches
        par = layout.par
        # token slices (TeraPipe): the action index is a (microbatch, slice) unit
        self.k = schedule.n_slices
        self.lengths = tuple(slice_lengths) if slice_lengths is not None else (act_shape[1],)
        if len(self.lengths) != self.k:
            raise ValueError(f"{self.k} token slices need {self.k} slice lengths, got {self.lengths}")
        self.offsets = tuple(sum(self.lengths[:i]) for i in range(self.k))
        self.scale = 1.0 / (self.n_mb // self.k * par.dp * par.cp)
        t = traits(schedule.name)
        self.remat = t.remat
        self.flat: dict[int, list[FlatParams]] = {}
        self.partial: dict[int, list] = {}
        self.versions: dict[int, Versions] = {}
        claimed: set[int] = set()  # a parameter two of this rank's stages share (a tied embedding's
        for s, st in stages.items():  # ends) is reduced and stepped once, with the first of them
            ps = [p for p in st.parameters() if p.requires_grad]
            self.partial[s] = [p for p in ps if getattr(p, "partial", None) == "tp"]
            self.flat[s] = []
            for kind, mine in params_by_kind(st, claimed).items():
                g = layout.group(REDUCTION_GROUP[kind])
                self.flat[s].append(FlatParams(mine, g.pg, g.size, g.index, zero, opt_factory, kind))
            delay = staleness_steps(t, schedule.pp, layout.pp_rank)
            if t.weight_versions is not None and delay > 0:
                self.versions[s] = Versions(ps, delay)
        self.fault, self.keep_grads = fault or {}, keep_grads
        self.timer = Timer(layout.device)

    # ---- helpers ---------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        return self.lay.global_rank(self.sched.rank_of(stage))

    def _tag(self, stage: int, kind: str, mb: int) -> int:
        return (stage * 2 + (kind == "B")) * self.n_mb + mb

    def _on_me(self, stage: int | None) -> bool:
        return stage is not None and self.sched.rank_of(stage) == self.lay.pp_rank

    def _input(self, st: StepState, stage: int, kind: str, mb: int) -> torch.Tensor:
        key = (stage, kind, mb)
        if key in st.local:
            return st.local.pop(key)
        work, buf = st.recvs.pop(key)
        work.wait()
        self.timer.mark_recv(key)
        return buf

    def _wait_unshard(self, st: StepState, stage: int) -> None:
        for fp in self.flat[stage]:
            pending = st.unshards.pop((stage, fp.kind), None)
            if pending is not None:
                pending[0].wait()
                fp.point_at(pending[1])  # not in place: a forward's saved weights stay valid for its backward

    def _maybe_fault(self, action) -> None:
        if self.fault.get("rank") != self.lay.rank or self.fault.get("action") != str(action):
            return
        kind = self.fault.get("kind", "raise")
        if kind == "hang":
            time.sleep(10 ** 6)
        if kind == "exit":
            import os
            os._exit(3)
        raise RuntimeError(f"injected fault at {action} on rank {self.lay.rank}")

    def _compute(self, a, fn):
        """Run ``fn`` as the span of action ``a``; its collectives timed apart."""
        with CommRecorder() as rec, self.timer.span(a):
            out = fn()
        self.timer.record_comm(a, rec.rows)
        return out

    # ---- one step -------------------------------------------------------------------
    def run_step(self) -> StepState:
        st = StepState()
        for v in self.versions.values():
            v.use_stale()
        self.timer.start_step()
        for a in self.actions:
            self._maybe_fault(a)
            getattr(self, f"_do_{a.op.value}")(st, a)
        for work, _ in st.sends:
            work.wait()
        self.timer.end_step()
        return st

    def _do_RECV_F(self, st, a):
        self._post_recv(st, a.stage, "F", a.microbatch, self.sched.prev_stage(a.stage))

    def _do_RECV_B(self, st, a):
        self._post_recv(st, a.stage, "B", a.microbatch, self.sched.next_stage(a.stage))

    def _post_recv(self, st, stage, kind, mb, peer_stage):
        shape = self.act_shape if self.k == 1 else (self.act_shape[0], self.lengths[mb % self.k], *self.act_shape[2:])
        buf = torch.empty(shape, dtype=self.lay.dtype, device=self.lay.device)
        work = dist.irecv(buf, src=self._peer(peer_stage), tag=self._tag(stage, kind, mb))
        st.recvs[(stage, kind, mb)] = (work, buf)

    def _send(self, st, a, tensor, peer_stage, kind):
        t = tensor.detach().contiguous()
        t0 = self.timer.now()
        work = dist.isend(t, dst=self._peer(peer_stage), tag=self._tag(peer_stage, kind, a.microbatch))
        posted = self.timer.now()  # gloo's caller thread writes into the socket: posting takes time
        st.sends.append((work, t))
        self.timer.record_send(a, t0, t.numel() * t.element_size(), posted)

    def _do_SEND_F(self, st, a):
        self._send(st, a, st.sendout.pop((a.stage, a.microbatch)), self.sched.next_stage(a.stage), "F")

    def _do_SEND_B(self, st, a):
        self._send(st, a, st.inputs.pop((a.stage, a.microbatch)).grad, self.sched.prev_stage(a.stage), "B")

    def _data(self, u: int) -> tuple:
        """(tokens, targets) of action index ``u``: a microbatch, or one token slice of one."""
        if self.k == 1:
            return self.data[u]
        mb, i = divmod(u, self.k)
        a, b = self.offsets[i], self.offsets[i] + self.lengths[i]
        tokens, targets = self.data[mb]
        return tokens[:, a:b], targets[:, a:b]

    def _slice_context(self, st, stage, s: int, u: int, on: bool) -> None:
        """Give (or take back) the blocks of ``stage`` the K/V context of unit ``u``'s slice."""
        mb, i = divmod(u, self.k)
        for bi, blk in enumerate(stage.blocks):
            blk.kv = st.kv.setdefault((s, mb, bi), SliceKV()) if on else None
        if stage.first:
            first = self.offsets[i]
            stage.embed.positions = (torch.arange(first, first + self.lengths[i], device=self.lay.device)
                                     if on else None)

    def _do_F(self, st, a):
        s, m = a.stage, a.microbatch
        stage = self.stages[s]
        tokens, targets = self._data(m)
        x = tokens if stage.first else self._input(st, s, "F", m).detach().requires_grad_(not self.remat)
        self._wait_unshard(st, s)

        def forward():
            with torch.set_grad_enabled(not self.remat):
                return stage(x, targets) if stage.last else stage(x)
        if self.k > 1:
            self._slice_context(st, stage, s, m, True)
            try:
                out = self._compute(a, forward)
            finally:
                self._slice_context(st, stage, s, m, False)
        else:
            out = self._compute(a, forward)
        if stage.last and self.k > 1:  # the sequence's loss: the slices' means weighted by their lengths
            mb, i = divmod(m, self.k)
            w = self.lengths[i] / sum(self.lengths)
            st.slice_loss[mb] = st.slice_loss.get(mb, 0.0) + w * float(out.detach())
            if i == self.k - 1:
                st.losses.append(st.slice_loss.pop(mb))
            out = out * (self.scale * w)
        elif stage.last:
            st.losses.append(float(out.detach()))
            out = out * self.scale
        st.inputs[(s, m)] = x
        if not self.remat:
            st.outputs[(s, m)] = out
        nxt = self.sched.next_stage(s)
        if self._on_me(nxt):
            st.local[(nxt, "F", m)] = out.detach().requires_grad_(not self.remat)
        elif nxt is not None:
            st.sendout[(s, m)] = out

    def _backward(self, st, a, split: bool):
        s, m = a.stage, a.microbatch
        stage = self.stages[s]
        grad = None if stage.last else self._input(st, s, "B", m)
        self._wait_unshard(st, s)
        x = st.inputs[(s, m)]

        def backward():
            if self.remat:  # rerun the forward with autograd on the kept input, then back-propagate
                if not stage.first:
                    x.requires_grad_(True)
                out = stage(x, self._data(m)[1]) * self.scale if stage.last else stage(x)
            else:
                out = st.outputs.pop((s, m))
            if self.k > 1:  # this slice's K/V gradient from the later slices rides along
                mb, i = divmod(m, self.k)
                caches = [st.kv[(s, mb, bi)] for bi in range(len(stage.blocks))]
                more, grads = [], []
                for c in caches:
                    t, g = c.outputs(i)
                    more += t
                    grads += g
                torch.autograd.backward([out, *more], [grad, *grads])
                for c in caches:
                    c.collect(i)
                if i == 0:
                    for bi in range(len(stage.blocks)):
                        st.kv.pop((s, mb, bi), None)
            elif split:
                store = st.stores[(s, m)] = WeightGradStore()
                with store:
                    torch.autograd.backward(out, grad)
            else:
                torch.autograd.backward(out, grad)
        self._compute(a, backward)
        prv = self.sched.prev_stage(s)
        if self._on_me(prv):
            st.local[(prv, "B", m)] = x.grad
        if prv is None or self._on_me(prv):
            st.inputs.pop((s, m))

    def _do_B(self, st, a):
        self._backward(st, a, split=False)

    def _do_I(self, st, a):
        self._backward(st, a, split=True)

    def _do_W(self, st, a):
        store = st.stores.pop((a.stage, a.microbatch))
        self._compute(a, store.flush)

    def _do_OVERLAP_F_B(self, st, a):
        f, b = a.sub
        self._do_F(st, f)
        getattr(self, f"_do_{b.op.value}")(st, b)

    def _do_REDUCE_GRAD(self, st, a):
        """The stage's gradients so far (all of them, or with a microbatch index: what this
        microbatch's backward added since the last reduction), launched asynchronously."""
        tp = self.lay.group("tp")
        if self.partial[a.stage] and tp.size > 1:
            sum_partial_grads(self.partial[a.stage], lambda t: dist.all_reduce(t, group=tp.pg))
        t0, nbytes, work = self.timer.now(), 0.0, None
        for fp in self.flat[a.stage]:
            if fp.size == 1:
                continue  # nothing to reduce (the simulator gives it zero time too)
            # a step's reduction runs on the gradient buffer in place; a microbatch's on a copy
            buf = fp.take_grads() if a.microbatch is not None else fp.flat_grads()
            if self.zero >= 1:
                out = torch.empty(fp.shard, dtype=buf.dtype, device=buf.device)
                work = reduce_scatter_flat(out, buf, fp.group, async_op=True)
                buf = out
            else:
                work = dist.all_reduce(buf, group=fp.group, async_op=True)
            st.reduces.setdefault((a.stage, fp.kind), []).append((work, buf))
            nbytes += fp.padded * buf.element_size()
        if work is not None:
            self.timer.record_async(a, t0, work, nbytes)

    def _do_UNSHARD(self, st, a):
        t0, nbytes, work = self.timer.now(), 0.0, None
        for fp in self.flat[a.stage]:
            if fp.size == 1:
                continue
            out = torch.empty(fp.padded, dtype=fp.dtype, device=fp.device)
            work = all_gather_flat(out, fp.master.detach().to(fp.dtype), fp.group, async_op=True)
            st.unshards[(a.stage, fp.kind)] = (work, out)
            nbytes += fp.padded * out.element_size()
        if work is not None:
            self.timer.record_async(a, t0, work, nbytes)

    def _do_RESHARD(self, st, a):
        pass  # parameters stay allocated; the window is what the memory model accounts for

    def _do_STEP(self, st, a):
        s = a.stage
        pending = []
        for fp in self.flat[s]:
            parts = st.reduces.pop((s, fp.kind), None)
            for work, _ in parts or ():
                work.wait()
            # per-microbatch reductions: their sum is the step's gradient (the reduction is linear)
            pending.append(None if not parts else (None, torch.stack([b for _, b in parts]).sum(0)
                                                   if len(parts) > 1 else parts[0][1]))
        if any(p is not None for p in pending):
            self.timer.mark_async_done(s)
        if s in self.versions:
            self.versions[s].begin_update()
        with self.timer.span(a):
            for fp, p in zip(self.flat[s], pending):
                self._optimizer_step(st, s, fp, p)
        if self.zero in (1, 2):
            t0, nbytes = self.timer.now(), 0.0
            for fp in self.flat[s]:
                if fp.size == 1:
                    continue
                out = torch.empty(fp.padded, dtype=fp.dtype, device=fp.device)
                all_gather_flat(out, fp.master.detach().to(fp.dtype), fp.group)
                fp.load_flat(out)
                nbytes += fp.padded * out.element_size()
            if nbytes:
                self.timer.record_sync("PARAM_GATHER", s, t0, nbytes)

    def _optimizer_step(self, st, s, fp: FlatParams, pending) -> None:
        if self.zero >= 1:
            flat = pending[1] if pending is not None else fp.flat_grads()  # size 1: the whole stage
            shard = flat if flat.numel() == fp.shard else fp.my_shard(flat)
            if self.keep_grads:
                st.grads[(s, fp.kind)] = shard.detach().clone()
            fp.master.grad = shard.to(fp.master.dtype)
            fp.opt.step()
            fp.master.grad = None
            fp.clear_grads()
            if fp.size == 1:  # nothing to gather: the shard is the whole stage
                fp.load_flat(fp.master.detach())
            return
        if pending is not None:
            fp.set_grads(pending[1])
        if self.keep_grads:
            st.grads[(s, fp.kind)] = fp.flat_grads()[:fp.numel].detach().clone()
        fp.opt.step()
        fp.clear_grads()
