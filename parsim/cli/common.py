"""What every sub-command shares: the exit codes and the one way outputs are written.

Every file parsim writes goes through :func:`atomic_write`:

* ``-`` writes to standard output (``--trace -`` streams the JSON);
* a regular file is written to a temporary name beside it and renamed, so an interrupted
  or failed run never leaves a half-written file; the new file gets the mode ``open()``
  would give it (0666 less the umask: 0644 under umask 022), not mkstemp's private 0600;
* a symlink is followed (the link stays, its target is replaced), and a target that is
  not a regular file (a FIFO, ``/dev/null``, a terminal) is written through, never
  replaced by a regular file;
* a path that cannot be written (no permission, a directory, a file where a directory
  must be) is a :class:`ConfigError` naming the path: one line, exit 2.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from parsim.errors import ConfigError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
STDOUT = "-"


def _umask() -> int:
    old = os.umask(0)  # the only portable way to read it
    os.umask(old)
    return old


def _refuse(path, e: OSError) -> ConfigError:
    return ConfigError(str(path), None, f"cannot write: {e.strerror or e}")


def _copy_to(tmp: str, dest, mode: str = "wb") -> None:
    with open(tmp, "rb") as src:
        if dest == STDOUT:
            sys.stdout.flush()
            shutil.copyfileobj(src, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            with open(dest, mode) as f:
                shutil.copyfileobj(src, f)


def atomic_write(path: str | Path, write) -> None:
    """Call ``write(tmp)`` to produce the file's content at a temporary path, then put it at
    ``path`` (see the module docstring for ``-``, links, FIFOs, modes and errors)."""
    if str(path) == STDOUT:
        with tempfile.TemporaryDirectory(prefix="parsim-") as d:
            tmp = os.path.join(d, "out")
            write(tmp)
            _copy_to(tmp, STDOUT)
        return
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _refuse(path, e) from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(str(path), None, "cannot write: is a directory")
    if st is not None and not stat.S_ISREG(st.st_mode):
        # FIFO, character device: write through; a temp copy keeps the writer's own errors first
        with tempfile.TemporaryDirectory(prefix="parsim-") as d:
            tmp = os.path.join(d, "out")
            write(tmp)
            try:
                _copy_to(tmp, real)
            except OSError as e:
                raise _refuse(path, e) from None
        return
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
        os.close(fd)
    except OSError as e:
        raise _refuse(path, e) from None
    try:
        write(tmp)
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, real)
    except OSError as e:  # disk full, a read-only file system, a directory removed under us
        raise _refuse(path, e) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path, text: str) -> None:
    def w(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    atomic_write(path, w)


def write_bytes(path, data: bytes) -> None:
    def w(tmp):
        with open(tmp, "wb") as f:
            f.write(data)
    atomic_write(path, w)


def out_file(path: str | Path) -> None:
    """Refuse in one line, before any work, an output file that cannot be written: a directory,
    a path below a file, a place without write permission (the write itself, atomic_write, may
    still fail later: a full disk). Standard output and an existing FIFO or device pass;
    nothing is created."""
    if str(path) == STDOUT:
        return
    real = Path(os.path.realpath(path))
    if real.is_dir():
        raise ConfigError(str(path), None, "cannot write: is a directory")
    if real.exists() and not real.is_file():
        return  # a FIFO or a device: written through
    probe = real.parent  # a regular file is replaced through a temporary one beside it
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(str(path), None, f"cannot write: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK) or (real.exists() and not os.access(real, os.W_OK)):
        raise ConfigError(str(path), None, "cannot write: permission denied")


def out_files(command: str, named: dict[str, str | Path | None]) -> list[str]:
    """Check a command's output options (option -> path or None) before any work: each one
    writable (:func:`out_file`), at most one on standard output, and no two naming the same file
    (the second would replace the first: a trace holding a CSV timeline). Returns the paths given."""
    given = {opt: str(p) for opt, p in named.items() if p}
    on_stdout = [opt for opt, p in given.items() if p == STDOUT]
    if len(on_stdout) > 1:
        raise ConfigError(command, " and ".join(on_stdout), "only one output can be standard output")
    seen: dict[str, str] = {}
    for opt, p in given.items():
        out_file(p)
        if p == STDOUT:
            continue
        real = os.path.realpath(p)
        if real in seen:
            raise ConfigError(command, f"{seen[real]} and {opt}", f"both name {p}: each output needs its own file")
        seen[real] = opt
    return list(given.values())


def out_dir(path: str | Path, create: bool = False) -> Path:
    """A report directory: refused in one line if it is a file, standard output, or in a place
    that cannot be written; created only with ``create`` (a refused run leaves nothing behind)."""
    p = Path(path)
    if str(path) == STDOUT:
        raise ConfigError(str(path), None, "a report directory cannot be standard output")
    probe = p
    while not probe.exists() and probe != probe.parent:  # the nearest existing ancestor decides
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(str(path), None, "cannot write: not a directory" if probe == p
                          else f"cannot write: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(str(path), None, "cannot write: permission denied")
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _refuse(path, e) from None
    return p


INSTALL_HINT = ("parsim: error: torch is not installed; install the validation extra CPU-only with "
                "`pip install -e '.[validate]' -c constraints/cpu.txt`")


def default_precision(device) -> str:
    """The compute precision a search or kernel query takes when none is given: BF16 where the GPU
    has BF16 tensor cores, else FP16 (V100 and older), as a user of that GPU would train."""
    return "bf16" if "bf16" in device.peak_flops else "fp16"


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None
