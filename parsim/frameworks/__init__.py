"""Importers: a training framework's own configuration -> a parsim scenario.

``megatron``: Megatron-LM ``pretrain_gpt.py`` arguments; ``torchtitan``: a torchtitan job
config (TOML, or the JSON dump of later releases). Each returns an
:class:`~parsim.frameworks.emit.Imported`, printed by :func:`~parsim.frameworks.emit.to_toml`
and checked by :func:`~parsim.frameworks.emit.check` (the scenario loader, errors named
after the framework's flag or key).
"""
from parsim.frameworks.emit import Imported, check, to_toml
from parsim.frameworks.megatron import import_megatron
from parsim.frameworks.torchtitan import import_torchtitan

__all__ = ["Imported", "check", "import_megatron", "import_torchtitan", "to_toml"]
