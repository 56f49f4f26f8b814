"""Process replay: record what the command line prints for a fixed set of inputs, so a
restructuring can be shown to change nothing but the defects it means to fix.

    python benchmarks/replay.py record DIR     # write one file per command into DIR
    python benchmarks/replay.py diff A B       # list the files that differ

The set: `parsim simulate S --json` for every bundled scenario, `tiny-cpu` under every
registered schedule, `parsim schedule NAME --pp 4 --microbatches 8 --csv` for every
schedule and one `parsim plan --json`.
"""
from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = ["GPipe", "1F1B", "Interleaved1F1B", "ZBH1", "ZBH2", "DualPipe", "DualPipeV", "Chimera",
             "Naive", "GPipeRemat", "PipeDream", "PipeDream2BW", "ZBV"]
PLAN = ["plan", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "64", "--global-batch", "256",
        "--seq-len", "4096", "--top", "5", "--json"]


def commands() -> dict[str, list[str]]:
    cmds: dict[str, list[str]] = {}
    for sc in sorted((ROOT / "scenarios").glob("*.toml")):
        fl = sc.name.startswith("fl-")  # federated scenarios run with `parsim fl`
        cmds[f"{'fl' if fl else 'simulate'}-{sc.stem}"] = ["fl" if fl else "simulate", str(sc), "--json"]
    for name in SCHEDULES:
        vpp = ["--set", "parallel.vpp=2"] if name == "Interleaved1F1B" else []
        cmds[f"tiny-{name}"] = ["simulate", str(ROOT / "scenarios/tiny-cpu.toml"), "--json",
                                "--set", f"schedule.name={name}", *vpp]
        cmds[f"schedule-{name}"] = ["schedule", name, "--pp", "4", "--microbatches", "8", "--csv",
                                    *(["--vpp", "2"] if vpp else [])]
    cmds["plan"] = PLAN
    return cmds


def record(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for key, args in commands().items():
        p = subprocess.run([sys.executable, "-m", "parsim", *args], capture_output=True, text=True, cwd=ROOT)
        (out / f"{key}.txt").write_text(f"rc={p.returncode}\n{p.stdout}{p.stderr}")
        print(f"{key}: rc={p.returncode}", flush=True)


def diff(a: Path, b: Path) -> int:
    changed = 0
    for fa in sorted(a.glob("*.txt")):
        fb = b / fa.name
        ta, tb = fa.read_text(), fb.read_text() if fb.exists() else "<missing>"
        if ta != tb:
            changed += 1
            print(f"=== {fa.stem}")
            sys.stdout.writelines(list(difflib.unified_diff(ta.splitlines(True), tb.splitlines(True), n=0))[:40])
    print(f"{changed} of {len(list(a.glob('*.txt')))} differ")
    return changed


if __name__ == "__main__":
    if sys.argv[1] == "record":
        record(Path(sys.argv[2]))
    else:
        sys.exit(1 if diff(Path(sys.argv[2]), Path(sys.argv[3])) else 0)
