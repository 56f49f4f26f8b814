"""Reading parsim's input files (scenarios, hardware profiles, Hugging Face configs, framework
configs, validation records) with a size bound.

Every loader reads its whole file before parsing it. A path that never ends (``/dev/zero``, a
stream) or a file far larger than any configuration would then grow memory until the kernel
kills the process; :func:`read_input_text` stops at :data:`MAX_INPUT_BYTES` instead and raises
an ``OSError`` whose ``strerror`` says so, which every loader already turns into one line.
"""
from __future__ import annotations

import errno
from pathlib import Path

MAX_INPUT_BYTES = 64 * 2 ** 20
"""Largest input file read (64 MiB): the largest bundled input, a measured routing histogram or
a calibration CSV, is under 1 MiB; a Hugging Face config.json is a few kB."""


class InputTooLarge(OSError):
    """An input file (or stream) longer than :data:`MAX_INPUT_BYTES`."""

    def __init__(self, path: str | Path):
        super().__init__(errno.EFBIG, f"more than {MAX_INPUT_BYTES // 2 ** 20} MiB: not a parsim input file", str(path))


def read_input_bytes(path: str | Path) -> bytes:
    """The file's bytes, at most :data:`MAX_INPUT_BYTES` (:class:`InputTooLarge` beyond)."""
    with open(path, "rb") as f:
        data = f.read(MAX_INPUT_BYTES + 1)
    if len(data) > MAX_INPUT_BYTES:
        raise InputTooLarge(path)
    return data


def read_input_text(path: str | Path, encoding: str = "utf-8-sig") -> str:
    """The file decoded (UTF-8, a leading BOM skipped, by default): ``UnicodeDecodeError`` for
    other text, :class:`InputTooLarge` past the bound, the ``OSError`` of ``open`` otherwise."""
    return read_input_bytes(path).decode(encoding)
