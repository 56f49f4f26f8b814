"""`parsim import megatron|torchtitan`: a framework's configuration -> a scenario TOML (see parsim.frameworks)."""
from __future__ import annotations

import argparse
import shlex
import sys
import textwrap

from parsim.cli.common import write_text


def register(sub) -> None:
    p = sub.add_parser("import", help="translate a Megatron-LM or torchtitan configuration into a scenario TOML")
    kinds = p.add_subparsers(dest="framework", required=True)
    m = kinds.add_parser("megatron", help="Megatron-LM pretrain_gpt.py arguments (after --)",
                         description="parsim import megatron [--hardware H] [--gpus N] [--out FILE] -- "
                                     "<pretrain_gpt.py arguments>")
    _common(m)
    m.add_argument("args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="Megatron-LM arguments, after --")
    m.set_defaults(func=cmd_import_megatron)
    t = kinds.add_parser("torchtitan", help="a torchtitan job config (TOML, or a JSON config dump)")
    t.add_argument("file", help="torchtitan TOML (train_configs/*.toml) or --debug.save_config_file JSON")
    _common(t)
    t.set_defaults(func=cmd_import_torchtitan)


def _common(p) -> None:
    p.add_argument("--hardware", help="hardware profile name or path (default dgx-h100, noted in the output)")
    p.add_argument("--gpus", type=int, help="GPUs in the job (Megatron: default tp*pp*cp; torchtitan: needed "
                                            "when data_parallel_shard_degree = -1)")
    p.add_argument("--out", metavar="FILE", help="write the scenario there instead of printing it")


def cmd_import_megatron(args) -> int:
    from parsim.frameworks import check, import_megatron, to_toml

    argv = args.args[1:] if args.args[:1] == ["--"] else args.args
    imp = import_megatron(argv, args.hardware, args.gpus)
    check(imp)
    header = "Imported by `parsim import megatron` from these Megatron-LM arguments:\n" + "\n".join(
        textwrap.wrap(shlex.join(argv), 94, initial_indent="  ", subsequent_indent="  ",
                      break_long_words=False, break_on_hyphens=False))
    return _emit(to_toml(imp, header), args.out)


def cmd_import_torchtitan(args) -> int:
    from parsim.frameworks import check, import_torchtitan, to_toml

    imp = import_torchtitan(args.file, args.hardware, args.gpus)
    check(imp)
    return _emit(to_toml(imp, f"Imported by `parsim import torchtitan` from {args.file}"), args.out)


def _emit(text: str, out: str | None) -> int:
    if out:
        write_text(out, text)
        print(f"wrote {out} (run: parsim simulate {shlex.quote(out)})")
    else:
        sys.stdout.write(text)
    return 0
