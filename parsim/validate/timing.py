"""Per-action timing: perf_counter on CPU, CUDA events on GPU, in the simulator's span format.

Times are absolute host clock readings (``time.perf_counter``, CLOCK_MONOTONIC: one clock
for every process of a machine); the launcher turns them into step-relative seconds.
On GPU every span is a pair of CUDA events on the compute stream, resolved at the end of
the step against a reference event taken together with a host reading.
"""
from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch


def start_worker(job_file: str) -> tuple[dict, int, int, int]:
    """Common start of a rank process: (job, rank, world, local rank) from torchrun's
    environment; one compute thread, optional niceness and core pinning."""
    job = json.loads(Path(job_file).read_text())
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.set_num_threads(int(job.get("threads", 1)))
    if job.get("nice"):  # measurement hygiene on a shared machine (needs the privilege to lower it)
        try:
            os.nice(int(job["nice"]))
        except OSError:
            pass
    if job.get("pin") and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[local % len(cpus)]})
    return job, rank, world, local


def join_group(job: dict, rank: int, world: int, local: int, default_timeout_s: float) -> torch.device:
    """This rank's device (its local GPU on nccl, the CPU on gloo) and the joined process group."""
    import datetime

    import torch.distributed as dist

    backend = job["backend"]
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=float(job.get("timeout", default_timeout_s))))
    return device


class Timer:
    """Collects one step's spans and p2p/collective records."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self) -> None:
        self.spans: list[list] = []        # [stream, op, stage, mb, start, end, bytes]
        self.sends: list[list] = []        # [op, stage, mb, issue_time, bytes, posted_time]
        self.recvs: dict[tuple, object] = {}  # (stage, kind, mb) -> time the data was there
        self.asyncs: dict[tuple, list] = {}  # (op, stage, mb) -> [op, stage, start, end|None, bytes]
        self._events: list = []            # CUDA: (target list, index, event)

    def now(self) -> float:
        return time.perf_counter()

    # ---- step boundaries ---------------------------------------------------------------
    def start_step(self) -> None:
        self.reset()
        if self.cuda:
            torch.cuda.synchronize()
            self._ref = torch.cuda.Event(enable_timing=True)
            self._ref.record()
            self._ref_host = time.perf_counter()
        self.step_start = time.perf_counter()

    def end_step(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            for target, idx, ev in self._events:
                target[idx] = self._ref_host + self._ref.elapsed_time(ev) / 1e3
            self._events = []
        self.step_end = time.perf_counter()

    def _stamp(self, target, idx) -> None:
        """Write the current time into target[idx] (a CUDA event on GPU, resolved later)."""
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self._events.append((target, idx, ev))
        target[idx] = time.perf_counter()

    # ---- records ------------------------------------------------------------------------
    @contextmanager
    def span(self, action, stream: str = "compute"):
        row = [stream, action.op.value, action.stage, -1 if action.microbatch is None else action.microbatch,
               0.0, 0.0, 0.0]
        self._stamp(row, 4)
        yield
        self._stamp(row, 5)
        self.spans.append(row)

    def record_comm(self, action, rows: list) -> None:
        """The tensor-/context-/expert-parallel communication inside one compute action, one
        span per stream (tp, cp, ep): from its first collective's start, as long as all of
        them together (the simulator's tp_comm / cp_comm / ep_comm part of that op)."""
        if not rows:  # (host clock: on NCCL, where collectives are asynchronous, launch times only)
            return
        by: dict[str, list] = {}
        for stream, t0, t1, nbytes in rows:
            acc = by.setdefault(stream, [t0, 0.0, 0.0])
            acc[1] += t1 - t0
            acc[2] += nbytes
        mb = -1 if action.microbatch is None else action.microbatch
        for stream, (t0, dur, nbytes) in by.items():
            self.spans.append([stream, action.op.value, action.stage, mb, t0, t0 + dur, nbytes])

    def mark_recv(self, key: tuple) -> None:
        box = [0.0]
        self._stamp(box, 0)
        self.recvs[key] = box

    def record_send(self, action, t0: float, nbytes: float, posted: float | None = None) -> None:
        """A send issued at ``t0``; ``posted``: when its ``isend`` returned (None: at once)."""
        self.sends.append([action.op.value, action.stage, action.microbatch, t0, nbytes, t0 if posted is None else posted])

    def record_async(self, action, t0: float, work, nbytes: float) -> None:
        rec = [action.op.value, action.stage, t0, None, nbytes]
        self.asyncs[(action.op.value, action.stage, action.microbatch)] = rec
        try:
            fut = work.get_future()
            fut.add_done_callback(lambda _f, r=rec: r.__setitem__(3, time.perf_counter()))
        except (RuntimeError, AttributeError):
            pass  # no future on this backend/op: the end is taken when it is waited on

    def mark_async_done(self, stage: int, op: str = "REDUCE_GRAD") -> None:
        """Collectives of ``op`` on ``stage`` whose end no callback took end now (they were waited on)."""
        for (o, s, _), rec in self.asyncs.items():
            if o == op and s == stage and rec[3] is None:
                rec[3] = time.perf_counter()

    def record_sync(self, op: str, stage: int, t0: float, nbytes: float) -> None:
        self.spans.append(["dp", op, stage, -1, t0, time.perf_counter(), nbytes])

    def export(self) -> dict:
        """JSON-ready record of the step (absolute clock readings)."""
        recvs = {f"{k[0]}:{k[1]}:{k[2]}": v[0] for k, v in self.recvs.items()}
        asyncs = [[op, s, t0, t1 if t1 is not None else self.step_end, b]
                  for op, s, t0, t1, b in self.asyncs.values()]
        return {"start": self.step_start, "end": self.step_end, "spans": self.spans,
                "sends": self.sends, "recvs": recvs, "asyncs": asyncs}
