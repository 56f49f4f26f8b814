"""What every sub-command shares: the exit code for bad input and atomic output writes."""
from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

EXIT_BAD_INPUT = 2


def atomic_write(path: str | Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path, text: str) -> None:
    def w(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    atomic_write(path, w)


INSTALL_HINT = ("parsim: error: torch is not installed; install the validation extra CPU-only with "
                "`pip install -e '.[validate]' -c constraints/cpu.txt`")


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None
