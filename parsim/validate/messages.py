"""Message-driven execution on torch.distributed: AMPNet as Gaunt et al. (2017) run it.

AMPNet has no per-rank action list to replay: its order is what the messages' arrival makes
it (``parsim.sim.ampnet`` predicts that order from the costs). This interpreter runs the
same rules on real ranks (one stage per pipeline rank, gloo):

* each stage has two message streams, forwards from the previous stage and backwards from
  the next, both in instance order (a FIFO link, and every stage forwards in the order it
  received); a receiver thread per stream posts the ``irecv`` of the next instance, waits
  for it and queues it with the clock reading of its arrival;
* when the stage is free it runs the queued message that arrived first (ties: backward);
  the last stage queues an instance's backward (its loss) when that forward ends;
* stage 0 is the data source: ``max_in_flight`` instances enter at the start, and a new
  one each time an instance's backward leaves stage 0;
* each stage applies its own update after every ``update_every`` backwards it ran; the
  gradients of a step's last ``m mod update_every`` backwards join the next step's first
  update. There is no weight stashing: a backward uses the weights of now
  (``FlatParams.update_unversioned``), ``staleness`` updates newer than its forward's.

A step is one batch's ``m`` instances from an empty pipeline to a drained one: the span
the simulator's one-step AMPNet timeline covers. The realized order (F, B, STEP per stage,
in execution order) is kept in the step's state; the parity oracle replays it in one process
(``parsim.validate.reference.ampnet_reference``).
"""
from __future__ import annotations

import queue
import threading

import torch
import torch.distributed as dist

from parsim.schedule.ir import Op, act
from parsim.validate.runtime import RankRuntime, StepState

FORWARD, BACKWARD = "F", "B"


class MessageDrivenRuntime(RankRuntime):
    """One pipeline rank of an AMPNet run (see the module doc)."""

    message_driven = True

    def __init__(self, *args, max_in_flight: int = 1, update_every: int = 1, **kw):
        super().__init__(*args, **kw)
        if len(self.stages) != 1 or self.lay.dp * self.lay.par.tp * self.lay.par.cp != 1:
            raise ValueError("message-driven execution runs one stage per rank and one model replica")
        if max_in_flight < 1 or update_every < 1:
            raise ValueError("max_in_flight and update_every must be >= 1")
        self.mif, self.every = max_in_flight, update_every
        (self.s,) = self.stages
        self.n_stages = self.sched.n_stages
        for fp in self.flat[self.s]:
            fp.update_unversioned()
        self.b_count = 0  # backwards since the run began (updates every ``every``)

    def _receiver(self, kind: str, peer_stage: int, inbox: queue.Queue) -> threading.Thread:
        """A thread that receives this stage's ``kind`` messages, instance after instance."""
        def loop():
            try:
                for j in range(self.n_mb):
                    buf = torch.empty(self.act_shape, dtype=self.lay.dtype, device=self.lay.device)
                    dist.irecv(buf, src=self._peer(peer_stage), tag=self._tag(self.s, kind, j)).wait()
                    inbox.put((self.timer.now(), kind, j, buf))
            except RuntimeError as e:  # (gloo's errors) surfaces in the main loop, which is waiting on the inbox
                inbox.put((float("inf"), "error", -1, e))
        t = threading.Thread(target=loop, name=f"recv-{kind}-stage{self.s}", daemon=True)
        t.start()
        return t

    def _run(self, st: StepState, a) -> None:
        """One action, as the list interpreter runs it (an injected fault first)."""
        self._maybe_fault(a)
        getattr(self, f"_do_{a.op.value}")(st, a)

    def run_step(self) -> StepState:
        st = StepState()
        s, m = self.s, self.n_mb
        first, last = s == 0, s == self.n_stages - 1
        inbox: queue.Queue = queue.Queue()
        self.timer.start_step()
        threads = []
        if not first:
            threads.append(self._receiver(FORWARD, s - 1, inbox))
        if not last:
            threads.append(self._receiver(BACKWARD, s + 1, inbox))
        waiting: list = []  # (arrival, 0 = backward / 1 = forward, instance, buffer)
        injected = 0
        if first:
            for _ in range(min(self.mif, m)):
                waiting.append((self.timer.now(), 1, injected, None))
                injected += 1
        order, done = st.order, 0
        while done < m:
            while True:  # everything that has arrived so far
                try:
                    t, kind, j, buf = inbox.get(block=not waiting)
                except queue.Empty:
                    break
                if kind == "error":
                    raise buf
                waiting.append((t, 0 if kind == BACKWARD else 1, j, buf))
                self.timer.recvs[(s, kind, j)] = [t]
            msg = min(waiting, key=lambda x: (x[0], x[1], x[2]))
            waiting.remove(msg)
            _, is_f, j, buf = msg
            if is_f:
                if buf is not None:
                    st.local[(s, FORWARD, j)] = buf
                self._run(st, act(s, Op.F, j))
                order.append(("F", j))
                if last:
                    waiting.append((self.timer.now(), 0, j, None))  # the loss: its backward is ready
                else:
                    self._run(st, act(s, Op.SEND_F, j))
                continue
            if buf is not None:
                st.local[(s, BACKWARD, j)] = buf
            self._run(st, act(s, Op.B, j))
            b_end = self.timer.now()
            order.append(("B", j))
            done += 1
            if not first:
                self._run(st, act(s, Op.SEND_B, j))
            self.b_count += 1
            if self.b_count % self.every == 0:
                self._run(st, act(s, Op.STEP))
                order.append(("STEP", -1))
                if self.keep_grads:
                    for fp in self.flat[s]:
                        st.update_grads.setdefault(fp.kind, []).append(st.grads.pop((s, fp.kind)))
            if first and injected < m:  # the next instance enters when this one's backward left
                waiting.append((b_end, 1, injected, None))
                injected += 1
        for th in threads:
            th.join()
        for work, _ in st.sends:
            work.wait()
        self.timer.end_step()
        return st
