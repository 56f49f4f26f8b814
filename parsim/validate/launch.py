"""Local launcher: one OS process per rank, a hard timeout, nothing left behind.

Torch-free. Each rank is ``python -m <module> JOB.json`` with RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT set (the variables torchrun sets, so the same
workers run across nodes with ``torchrun --nnodes N --nproc-per-node K -m
parsim.validate.worker JOB.json``). Every rank gets its own session (process group);
when a rank fails or the deadline passes, every rank's group is killed and reaped and
one clear :class:`RankFailure` says which rank, how, and the tail of its stderr.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from parsim.errors import ParsimError


class RankFailure(ParsimError):
    """A rank crashed, exited non-zero, or the run passed its deadline."""

    def __init__(self, message: str, pids: list[int]):
        super().__init__(message)
        self.pids = pids


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


# glibc malloc returns every large freed block to the kernel (mmap/trim), so each step
# page-faults its activations in again (~1,100 minor faults per F+B of the tiny GPT here,
# ~2 us each in this VM, and their cost drifts with the host). Keeping freed memory in the
# heap, as a GPU caching allocator does, cut that to ~430 and takes the allocator out of
# both the microbenchmarks and the measured steps. The user's own settings win.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2 ** 30), "MALLOC_TRIM_THRESHOLD_": str(2 ** 30),
              "MALLOC_TOP_PAD_": str(2 ** 28)}


def local_rank_limit() -> int:
    """Most rank processes one launch may start on this machine: four per core (at least 8).
    Oversubscribed runs are allowed (they are reported, not gated), but each rank imports torch
    (~0.3 GB), so thousands of them would exhaust memory and the process table, not validate."""
    return max(8, 4 * (os.cpu_count() or 1))


LAUNCHER_PID = "PARSIM_LAUNCHER_PID"
"""Environment variable naming the launching process, for :func:`die_with_launcher`."""


def die_with_launcher() -> None:
    """First thing in a rank process (worker, bench): have the kernel send it SIGKILL when the
    process that launched it dies, however it dies (Linux ``prctl(PR_SET_PDEATHSIG)``), so a
    launcher killed by SIGKILL leaves no rank behind. If the launcher is already gone (it died
    before this ran, and the rank was re-parented), exit now. Elsewhere: nothing."""
    launcher = os.environ.get(LAUNCHER_PID)
    if sys.platform != "linux" or not launcher:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != launcher:
        os._exit(1)


def launch(job: dict, world: int, out_dir: str | Path, timeout_s: float,
           module: str = "parsim.validate.worker") -> list[dict]:
    """Run ``world`` ranks of ``module`` on ``job``; return each rank's JSON result."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    job_file = out / "job.json"
    job_file.write_text(json.dumps({**job, "out": str(out)}))
    port = free_port()
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for r in range(world):
            env = {**MALLOC_ENV, **os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                   "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                   "OMP_NUM_THREADS": str(job.get("threads", 1)), LAUNCHER_PID: str(os.getpid())}
            err = out / f"rank{r}.stderr"
            logs.append(err)
            with open(err, "w") as fe:
                procs.append(subprocess.Popen([sys.executable, "-m", module, str(job_file)], env=env,
                                              stdout=subprocess.DEVNULL, stderr=fe, start_new_session=True))
        _supervise(procs, logs, timeout_s)
    except BaseException:
        _kill_all(procs)
        raise
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def _supervise(procs: list[subprocess.Popen], logs: list[Path], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pids = [p.pid for p in procs]
    while True:
        codes = [p.poll() for p in procs]
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            r, c = bad[0]
            _kill_all(procs)
            how = f"was killed by signal {-c}" if c < 0 else f"exited with code {c}"
            raise RankFailure(f"validation run failed: rank {r} {how}: {_tail(logs[r]) or 'no output'}"
                              " (all ranks stopped)", pids)
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            stuck = [r for r, c in enumerate(codes) if c is None]
            _kill_all(procs)
            raise RankFailure(f"validation run timed out after {timeout_s:g} s: rank(s) "
                              f"{', '.join(map(str, stuck))} still running (hung or deadlocked); "
                              "all ranks killed", pids)
        time.sleep(0.02)
