"""Run many independent evaluations: in-process, a local process pool, or dask.distributed.

Every finished evaluation is appended to a JSON-lines results file (one object per
line, ``{"key": ..., ...}``) and flushed at once, so a sweep that is killed loses at
most the evaluations in flight; rerun with the same file, keys already present are
not recomputed. A line cut short by the kill is ignored (and recomputed).

``fn`` must be a top-level (picklable) function ``payload -> dict``. A
:class:`parsim.errors.ParsimError` raised by it is a result (``{"error": line}``),
not a crash.
"""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from parsim.errors import ConfigError, ParsimError

EXECUTORS = ("local", "dask")


def load_done(path: str | Path | None) -> dict[str, dict]:
    """Records already in a results file, by key (unreadable/partial lines skipped)."""
    done: dict[str, dict] = {}
    if path is None or not Path(path).exists():
        return done
    with open(path) as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "key" in rec:
                done[rec["key"]] = rec
    return done


class _Appender:
    """Appends records as JSON lines, flushed and synced one by one."""

    def __init__(self, path: str | Path | None):
        self.f = None
        if path is None:
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = path.exists() and path.stat().st_size > 0 and not path.read_bytes().endswith(b"\n")
        self.f = open(path, "a")
        if needs_newline:  # a line cut short by a kill: terminate it so it stays unreadable alone
            self.f.write("\n")

    def write(self, rec: dict) -> None:
        if self.f is None:
            return
        self.f.write(json.dumps(rec, allow_nan=False, default=_jsonable) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


def _jsonable(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


class Progress:
    """A one-line progress bar on stderr; silent when stderr is not a terminal."""

    def __init__(self, total: int, label: str = "", enabled: bool | None = None, done: int = 0):
        self.total, self.label, self.n = total, label, done
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.monotonic()
        self._draw()

    def update(self, k: int = 1) -> None:
        self.n += k
        self._draw()

    def _draw(self) -> None:
        if not self.enabled or self.total <= 0:
            return
        width = 30
        fill = int(width * self.n / self.total)
        el = time.monotonic() - self.t0
        sys.stderr.write(f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.n}/{self.total}  {el:5.1f} s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.total > 0:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _call(fn: Callable[[object], dict], payload) -> dict:
    try:
        return fn(payload)
    except ParsimError as e:
        return {"error": str(e)}


def run_sweep(jobs: Iterable[tuple[str, object]], fn: Callable[[object], dict], *,
              results: str | Path | None = None, executor: str = "local", workers: int | None = None,
              scheduler: str | None = None, progress: bool | None = None, label: str = "sweep",
              connect_timeout: float = 10.0) -> dict[str, dict]:
    """Evaluate ``fn(payload)`` for every ``(key, payload)`` not already in ``results``.

    Returns every record by key (earlier ones included). ``workers=1`` runs in-process;
    ``executor="dask"`` submits to the dask.distributed scheduler at ``scheduler``
    (a local cluster when None); a scheduler that does not answer within ``connect_timeout``
    seconds is a one-line ConfigError naming ``--scheduler``.
    """
    if executor not in EXECUTORS:
        raise ConfigError(None, "--executor", f"{executor!r} is not one of {', '.join(EXECUTORS)}")
    jobs = list(jobs)
    done = load_done(results)
    todo = [(k, p) for k, p in jobs if k not in done]
    out = {k: done[k] for k, _ in jobs if k in done}
    bar = Progress(len(jobs), label, progress, done=len(jobs) - len(todo))
    app = _Appender(results)

    def finished(key: str, rec: dict) -> None:
        rec = {"key": key, **rec}
        app.write(rec)
        out[key] = rec
        bar.update()

    try:
        if not todo:
            pass
        elif executor == "dask":
            _run_dask(todo, fn, scheduler, finished, connect_timeout)
        elif (workers or os.cpu_count() or 1) <= 1 or len(todo) == 1:
            for key, payload in todo:
                finished(key, _call(fn, payload))
        else:
            _run_pool(todo, fn, workers or os.cpu_count() or 1, finished)
    finally:
        app.close()
        bar.close()
    return out


def _run_pool(todo, fn, workers: int, finished) -> None:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx) as pool:
        pending = {pool.submit(_call, fn, payload): key for key, payload in todo}
        try:
            while pending:
                ready, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in ready:
                    finished(pending.pop(fut), fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def _run_dask(todo, fn, scheduler: str | None, finished, connect_timeout: float = 10.0) -> None:
    try:
        from dask.distributed import Client, as_completed
    except ImportError:
        raise ConfigError(None, "--executor", "dask is not installed: pip install 'parsim[sweep]' "
                          "(dask[distributed]), or use --executor local") from None
    try:
        client = Client(scheduler, timeout=connect_timeout) if scheduler else Client(processes=True)
    except (OSError, TimeoutError, ValueError) as e:  # unreachable, refused, a malformed address
        why = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError(None, "--scheduler", f"cannot connect to the dask scheduler at {scheduler!r} within "
                          f"{connect_timeout:g} s ({why[:160]})") from None
    try:
        futures = {client.submit(_call, fn, payload, key=f"parsim-{key}", pure=False): key
                   for key, payload in todo}
        for fut in as_completed(list(futures)):
            finished(futures[fut], fut.result())
    finally:
        client.close()


def demo_job(payload: dict) -> dict:
    """A stand-in evaluation for tests and benchmarks: sleeps, returns x squared."""
    time.sleep(payload.get("sleep_s", 0.0))
    return {"value": payload["x"] ** 2}
