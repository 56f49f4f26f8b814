"""The argument parser every sub-command uses: help with defaults and choices shown, an
example under each command, usage errors as one line (exit 2), and option types that
refuse zero, negative, NaN and infinite values by naming the option."""
from __future__ import annotations

import argparse
import math
import sys

from parsim.cli.common import EXIT_BAD_INPUT


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions and examples as written; ``(default: X)`` after every option that has one."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower():
            return text
        if action.default in (None, False, [], argparse.SUPPRESS) or not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class HelpParser(argparse.ArgumentParser):
    """argparse with :class:`HelpFormatter` by default (sub-commands inherit it) and one-line errors."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        print(f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _number(option: str, text: str, conv, what: str):
    try:
        v = conv(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if isinstance(v, float) and not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return v


def add_attention_flags(p: argparse.ArgumentParser) -> None:
    """``--no-flash-attention`` and ``--no-dropout``: the searches' ``training.flash_attention`` and
    ``training.dropout`` (``args.flash_attention``: bool; ``args.dropout``: False or None, the default)."""
    p.add_argument("--no-flash-attention", dest="flash_attention", action="store_false",
                   help="run the unfused attention core (training.flash_attention = false), as pre-2022 frameworks did")
    p.add_argument("--no-dropout", dest="dropout", action="store_false", default=None,
                   help="no dropout (training.dropout = false; default: the model family's)")


MAX_SAMPLES = 100_000
"""Most Monte Carlo samples a command takes (--samples): parsim goodput keeps 41 checkpoint
intervals x samples x 8 arrays (~260 MB and ~50 s at this bound)."""


def niceness(option: str):
    """A niceness increment: an integer from -20 to 19 (nice(2)'s range; beyond it the kernel clamps)."""

    def conv(text: str) -> int:
        v = _number(option, text, int, "an integer from -20 to 19")
        if not -20 <= v <= 19:
            raise argparse.ArgumentTypeError(f"expected an integer from -20 to 19, got {text!r}")
        return v
    return conv


def positive_int(option: str, minimum: int = 1, most: int | None = None):
    """An integer option >= ``minimum`` (1: positive; 0: non-negative) and, with ``most``, at most that."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def conv(text: str) -> int:
        v = _number(option, text, int, what)
        if v < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if most is not None and v > most:
            raise argparse.ArgumentTypeError(f"at most {most:,}, got {v:,}")
        return v
    conv.__name__ = what
    return conv


def finite_positive(option: str, lo: float = 0.0, hi: float = math.inf):
    """A float option that is finite and > 0 (``300e9`` is fine), within [lo, hi] when given."""
    def conv(text: str) -> float:
        v = _number(option, text, float, "a finite positive number")
        if v <= 0:
            raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}")
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"expected {lo:g} to {hi:g}, got {text!r}")
        return v
    conv.__name__ = "a finite positive number" if (lo, hi) == (0.0, math.inf) else f"a number from {lo:g} to {hi:g}"
    return conv


TRAIN_TOKENS_RANGE = (1.0, 1e18)
"""--train-tokens: at least one token, at most 10^18 (~20,000x Llama 3's 15T-token run)."""
GPU_HOUR_PRICE_RANGE = (1e-6, 1e6)
"""--gpu-hour-price: from a millionth to a million of a currency unit per GPU-hour."""
