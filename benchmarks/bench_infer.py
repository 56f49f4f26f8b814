"""Wall time of `parsim infer` on the bundled BLOOM-176B scenario as the generation grows (a reported
number, not a timed test): the prefill and every decode step are simulated, so the time is linear
in ``generate_tokens``; the shape-only costs (GEMMs, all-reduces) are computed once per request.

    python benchmarks/bench_infer.py [--repeat N]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.infer import load_inference, run_inference

SCENARIO = ROOT / "scenarios" / "inference" / "bloom-176b-a100-inference.toml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for tokens in (92, 2_000, 20_000):
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            mx, _ = run_inference(load_inference(str(SCENARIO), [f"inference.generate_tokens={tokens}"]))
            best = min(best, time.perf_counter() - t0)
        print(f"generate_tokens={tokens:>6}: {best:.2f} s best of {args.repeat} "
              f"({best / tokens * 1e3:.3f} ms per token; decode {mx['decode_s_per_token'] * 1e3:.2f} ms simulated)")


if __name__ == "__main__":
    main()
