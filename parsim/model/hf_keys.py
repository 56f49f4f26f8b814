"""Typed, error-naming access to one Hugging Face config.json object (the importer's reader).

Every read names the file and the HF key in its error (``.../config.json: text_config.n_layer:
missing ...``); ``prefix`` is "text_config." when the language model is nested in a wrapper.
"""
from __future__ import annotations

from parsim.errors import ConfigError


class HFKeys:
    """One JSON object of a config.json, read key by key with one-line errors."""

    def __init__(self, data: dict, file: str, model_type: str, prefix: str = ""):
        self.data, self.file, self.model_type, self.prefix = data, file, model_type, prefix

    def error(self, key: str | None, problem: str) -> ConfigError:
        """A ConfigError naming this file and ``key`` (with the wrapper prefix)."""
        return ConfigError(self.file, f"{self.prefix}{key}" if key else self.prefix.rstrip(".") or None, problem)

    def has(self, key: str) -> bool:
        """The key is present with a non-null value."""
        return self.data.get(key) is not None

    def int(self, key: str, default: int | None = None, required: bool = True) -> int | None:
        """An integer; ``default`` when absent or null; missing and required: an error."""
        v = self.data.get(key)
        if v is None:
            if default is not None or not required:
                return default
            raise self.error(key, f"missing (required for model_type {self.model_type!r})")
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.error(key, f"expected an integer, got {v!r}")
        return v

    def first_int(self, *keys: str, default: int | None = None) -> int:
        """The first of ``keys`` that is present (HF aliases such as n_embed / hidden_size)."""
        for key in keys:
            if self.has(key):
                return self.int(key)
        if default is not None:
            return default
        also = f"; also looked for {', '.join(keys[1:])}" if len(keys) > 1 else ""
        raise self.error(keys[0], f"missing (required for model_type {self.model_type!r}{also})")

    def bool(self, key: str, default: bool) -> bool:
        """true/false; ``default`` when absent or null."""
        v = self.data.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.error(key, f"expected true or false, got {v!r}")
        return v

    def int_list(self, key: str) -> list[int] | None:
        """A list of integers, or None when absent or null."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise self.error(key, f"expected a list of integers, got {v!r}")
        return v

    def str_list(self, key: str) -> list[str] | None:
        """A list of strings, or None when absent or null."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.error(key, f"expected a list of strings, got {v!r}")
        return v

    def expect(self, key: str, default: object, wanted: object, why: str) -> None:
        """Refuse a value parsim does not model: the key must read ``wanted`` (absent = ``default``)."""
        v = self.data.get(key, default)
        if v is None:
            v = default
        if v != wanted:
            raise self.error(key, f"{v!r} is not supported ({why})")
