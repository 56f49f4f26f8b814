"""Interpreter of a lowered schedule on torch.distributed: one process per rank.

It walks exactly the per-rank action list the simulator times
(``parsim.simulate.schedule_for``) with the semantics of ``parsim.schedule.ir``:

* ``RECV_*`` posts ``irecv`` into a fresh buffer; the F/B/I that consumes it waits on it;
* ``SEND_*`` is ``isend`` (non-blocking); handles are kept until the end of the step;
* F/B/I/W run the stage's torch module (W: the deferred weight-gradient GEMMs);
* ``REDUCE_GRAD`` launches an asynchronous collective over the stage's flattened
  gradients on the data-parallel group (all-reduce, or reduce-scatter for ZeRO >= 1;
  gloo has no reduce-scatter, so there it is an all-reduce whose shard is kept);
* ``STEP`` waits for its reduction, steps the optimizer (ZeRO >= 1: on this rank's
  shard only, then all-gathers the updated parameters: ``PARAM_GATHER`` span);
* ``UNSHARD`` (ZeRO-3) launches an asynchronous all-gather of the stage's parameter
  shards; compute of the stage waits for it; ``RESHARD`` only marks the end of the window.

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

from parsim.schedule.coverage import check_runs
from parsim.schedule.ir import Schedule
from parsim.validate.model import Stage, WeightGradStore
from parsim.validate.scale import RUNTIME_COVERAGE
from parsim.validate.timing import Timer


@dataclass
class Layout:
    """Where this process sits: global rank = dp_rank * pp + pp_rank (tp = cp = 1)."""

    pp: int
    dp: int
    rank: int
    device: torch.device
    dtype: torch.dtype
    backend: str
    dp_group: object = None

    @property
    def pp_rank(self) -> int:
        return self.rank % self.pp

    @property
    def dp_rank(self) -> int:
        return self.rank // self.pp

    def global_rank(self, pp_rank: int) -> int:
        return self.dp_rank * self.pp + pp_rank


class FlatParams:
    """A stage's parameters seen as one flat buffer (padded to a multiple of dp) for DP/ZeRO."""

    def __init__(self, stage: Stage, dp: int, dp_rank: int, zero: int, opt_factory):
        self.params = [p for p in stage.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.padded = -(-self.numel // dp) * dp
        self.shard = self.padded // dp
        self.dp, self.dp_rank, self.zero = dp, dp_rank, zero
        p0 = self.params[0]
        if zero >= 1:
            full = self.flat_params()
            lo = dp_rank * self.shard
            self.master = torch.nn.Parameter(full[lo:lo + self.shard].clone())
            self.opt = opt_factory([self.master])
        else:
            self.opt = opt_factory(self.params)
        self.dtype, self.device = p0.dtype, p0.device

    def flat_params(self) -> torch.Tensor:
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        return torch.nn.functional.pad(flat, (0, self.padded - self.numel))

    def flat_grads(self) -> torch.Tensor:
        gs = [p.grad.reshape(-1) if p.grad is not None else torch.zeros(p.numel(), dtype=p.dtype, device=p.device)
              for p in self.params]
        return torch.nn.functional.pad(torch.cat(gs), (0, self.padded - self.numel))

    def load_flat(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            off = 0
            for p in self.params:
                n = p.numel()
                p.copy_(flat[off:off + n].view_as(p))
                off += n

    def set_grads(self, flat: torch.Tensor) -> None:
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p).clone()
            off += n


@dataclass
class StepState:
    """Everything one optimizer step keeps between actions."""

    inputs: dict = field(default_factory=dict)      # (stage, mb) -> stage input (leaf)
    outputs: dict = field(default_factory=dict)     # (stage, mb) -> output activation / scaled loss
    local: dict = field(default_factory=dict)       # (stage, "F"|"B", mb) -> tensor from a stage on this rank
    recvs: dict = field(default_factory=dict)       # (stage, "F"|"B", mb) -> (work, buffer)
    sends: list = field(default_factory=list)       # (work, tensor) kept alive until the step ends
    stores: dict = field(default_factory=dict)      # (stage, mb) -> WeightGradStore (I/W split)
    reduces: dict = field(default_factory=dict)     # stage -> (work, buffer)
    unshards: dict = field(default_factory=dict)    # stage -> (work, out, shard)
    losses: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)       # parity: stage -> reduced grads before the step


class RankRuntime:
    """Executes one rank's action list, step after step."""

    def __init__(self, schedule: Schedule, stages: dict[int, Stage], layout: Layout, data, act_shape,
                 zero: int, opt_factory, fault: dict | None = None, keep_grads: bool = False):
        check_runs(schedule, RUNTIME_COVERAGE)
        self.sched, self.stages, self.lay = schedule, stages, layout
        self.data, self.act_shape, self.zero = data, act_shape, zero
        self.actions = schedule.actions[layout.pp_rank]
        self.n_mb = schedule.n_microbatches
        self.scale = 1.0 / (self.n_mb * layout.dp)
        self.flat = {s: FlatParams(st, layout.dp, layout.dp_rank, zero, opt_factory) for s, st in stages.items()}
        self.fault, self.keep_grads = fault or {}, keep_grads
        self.timer = Timer(layout.device)

    # ---- helpers ---------------------------------------------------------------------
    def _peer(self, stage: int) -> int:
        return self.lay.global_rank(self.sched.rank_of(stage))

    def _tag(self, stage: int, kind: str, mb: int) -> int:
        return (stage * 2 + (kind == "B")) * self.n_mb + mb

    def _input(self, st: StepState, stage: int, kind: str, mb: int) -> torch.Tensor:
        key = (stage, kind, mb)
        if key in st.local:
            return st.local.pop(key)
        work, buf = st.recvs.pop(key)
        work.wait()
        self.timer.mark_recv(key)
        return buf

    def _wait_unshard(self, st: StepState, stage: int) -> None:
        pending = st.unshards.pop(stage, None)
        if pending is not None:
            work, out, _ = pending
            work.wait()
            self.flat[stage].load_flat(out)

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

    # ---- one step -------------------------------------------------------------------
    def run_step(self) -> StepState:
        st = StepState()
        self.timer.start_step()
        for a in self.actions:
            self._maybe_fault(a)
            getattr(self, f"_do_{a.op.value}")(st, a)
        for work, _ in st.sends:
            work.wait()
        self.timer.end_step()
        return st

    def _do_RECV_F(self, st, a):
        self._post_recv(st, a.stage, "F", a.microbatch, a.stage - 1)

    def _do_RECV_B(self, st, a):
        self._post_recv(st, a.stage, "B", a.microbatch, a.stage + 1)

    def _post_recv(self, st, stage, kind, mb, peer_stage):
        buf = torch.empty(self.act_shape, dtype=self.lay.dtype, device=self.lay.device)
        work = dist.irecv(buf, src=self._peer(peer_stage), tag=self._tag(stage, kind, mb))
        st.recvs[(stage, kind, mb)] = (work, buf)

    def _send(self, st, a, tensor, peer_stage, kind):
        t = tensor.detach().contiguous()
        t0 = self.timer.now()
        work = dist.isend(t, dst=self._peer(peer_stage), tag=self._tag(peer_stage, kind, a.microbatch))
        st.sends.append((work, t))
        self.timer.record_send(a, t0, t.numel() * t.element_size())

    def _do_SEND_F(self, st, a):
        self._send(st, a, st.outputs[(a.stage, a.microbatch)], a.stage + 1, "F")

    def _do_SEND_B(self, st, a):
        self._send(st, a, st.inputs[(a.stage, a.microbatch)].grad, a.stage - 1, "B")

    def _do_F(self, st, a):
        s, m = a.stage, a.microbatch
        tokens, targets = self.data[m]
        x = tokens if s == 0 else self._input(st, s, "F", m).detach().requires_grad_(True)
        self._wait_unshard(st, s)
        stage = self.stages[s]
        with self.timer.span(a):
            out = stage(x, targets) if stage.last else stage(x)
            if stage.last:
                st.losses.append(float(out.detach()))
                out = out * self.scale
        st.inputs[(s, m)], st.outputs[(s, m)] = x, out
        if not stage.last and self.sched.rank_of(s + 1) == self.lay.pp_rank:
            st.local[(s + 1, "F", m)] = out.detach().requires_grad_(True)

    def _backward(self, st, a, split: bool):
        s, m = a.stage, a.microbatch
        stage = self.stages[s]
        grad = None if stage.last else self._input(st, s, "B", m)
        self._wait_unshard(st, s)
        out = st.outputs.pop((s, m))
        with self.timer.span(a):
            if split:
                store = st.stores[(s, m)] = WeightGradStore()
                with store:
                    torch.autograd.backward(out, grad)
            else:
                torch.autograd.backward(out, grad)
        x = st.inputs[(s, m)]
        if s > 0 and self.sched.rank_of(s - 1) == self.lay.pp_rank:
            st.local[(s - 1, "B", m)] = x.grad
        if s == 0 or self.sched.rank_of(s - 1) == self.lay.pp_rank:
            st.inputs.pop((s, m))

    def _do_B(self, st, a):
        self._backward(st, a, split=False)

    def _do_I(self, st, a):
        self._backward(st, a, split=True)

    def _do_W(self, st, a):
        store = st.stores.pop((a.stage, a.microbatch))
        with self.timer.span(a):
            store.flush()
        st.inputs.pop((a.stage, a.microbatch), None)

    def _do_REDUCE_GRAD(self, st, a):
        if self.lay.dp == 1:
            return  # nothing to reduce (the simulator gives it zero time too)
        fp = self.flat[a.stage]
        t0 = self.timer.now()
        buf = fp.flat_grads()
        if self.zero >= 1 and self.lay.backend == "nccl":
            out = torch.empty(fp.shard, dtype=buf.dtype, device=buf.device)
            work = dist.reduce_scatter_tensor(out, buf, group=self.lay.dp_group, async_op=True)
            buf = out
        else:  # gloo has no reduce-scatter: all-reduce, keep the shard (documented)
            work = dist.all_reduce(buf, group=self.lay.dp_group, async_op=True)
        st.reduces[a.stage] = (work, buf)
        self.timer.record_async(a, t0, work, fp.padded * buf.element_size())

    def _do_UNSHARD(self, st, a):
        fp = self.flat[a.stage]
        t0 = self.timer.now()
        shard = fp.master.detach().to(fp.dtype) if self.zero >= 1 else fp.flat_params()[:fp.shard]
        out = torch.empty(fp.padded, dtype=fp.dtype, device=fp.device)
        work = dist.all_gather_into_tensor(out, shard.contiguous(), group=self.lay.dp_group, async_op=True) \
            if self.lay.backend == "nccl" else _gloo_all_gather(out, shard, self.lay)
        st.unshards[a.stage] = (work, out, shard)
        self.timer.record_async(a, t0, work, fp.padded * out.element_size())

    def _do_RESHARD(self, st, a):
        pass  # parameters stay allocated; the window is what the memory model accounts for

    def _do_STEP(self, st, a):
        s, fp = a.stage, self.flat[a.stage]
        pending = st.reduces.pop(s, None)
        if pending is not None:
            pending[0].wait()
            self.timer.mark_async_done(s)
        with self.timer.span(a):
            self._optimizer_step(st, s, fp, pending)
        if self.zero >= 1 and self.lay.dp > 1 and self.zero < 3:
            t0 = self.timer.now()
            out = torch.empty(fp.padded, dtype=fp.dtype, device=fp.device)
            shard = fp.master.detach().to(fp.dtype).contiguous()
            if self.lay.backend == "nccl":
                dist.all_gather_into_tensor(out, shard, group=self.lay.dp_group)
            else:
                _gloo_all_gather(out, shard, self.lay).wait()
            fp.load_flat(out)
            self.timer.record_sync("PARAM_GATHER", s, t0, fp.padded * out.element_size())

    def _optimizer_step(self, st, s, fp: FlatParams, pending) -> None:
        dp = self.lay.dp
        if self.zero >= 1:
            flat = pending[1] if pending is not None else fp.flat_grads()  # dp == 1: the whole stage
            shard = flat if flat.numel() == fp.shard else flat[fp.dp_rank * fp.shard:(fp.dp_rank + 1) * fp.shard]
            if self.keep_grads:
                st.grads[s] = shard.detach().clone()
            fp.master.grad = shard.to(fp.master.dtype)
            fp.opt.step()
            fp.master.grad = None
            for p in fp.params:
                p.grad = None
            if dp == 1:  # nothing to gather: the shard is the whole stage
                fp.load_flat(fp.master.detach())
            return
        if pending is not None:
            fp.set_grads(pending[1])
        if self.keep_grads:
            st.grads[s] = fp.flat_grads()[:fp.numel].detach().clone()
        fp.opt.step()
        for p in fp.params:
            p.grad = None


def _gloo_all_gather(out: torch.Tensor, shard: torch.Tensor, lay: Layout):
    """all_gather into one flat tensor with gloo (no all_gather_into_tensor there)."""
    parts = list(out.chunk(lay.dp))
    return dist.all_gather(parts, shard.contiguous(), group=lay.dp_group, async_op=True)
