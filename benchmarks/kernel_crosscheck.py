"""parsim's GEMM, attention and collective models against kernel times they were not built from:
aiconfigurator's measured grids (and its nccl-tests runs).

    python benchmarks/kernel_crosscheck.py [--markdown reports/kernel-crosscheck.md]

Data: ``benchmarks/data/aiconfigurator_gemm_times.csv`` -- TensorRT-LLM's cuBLASLt GEMMs (BF16, and
per-tensor FP8 with BF16 output) timed by ai-dynamo/aiconfigurator on seven GPUs at m, n, k in
{1024 ... 16384} (the file's header names the source). None of these numbers went into a profile:
the profiles' GEMM efficiencies come from ml-engineering's MAMF / MSMF tables and the tile-and-wave
model (``parsim.cluster.kernels``).

For each GPU and precision it prints the median and the spread of parsim's time over the measured
one, for the burst model (a kernel alone at the boost clock, ``Device.burst``) and the sustained one
(the power-saturated clock of training, ``Device``): which of the two the measurements resemble is
itself a finding (their collector replays CUDA graphs of a few back-to-back calls). The FP8 times
include the collector's dynamic quantization of the input (:func:`quantize_time` adds it to parsim's).
Nothing here is fitted.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.cluster.attention_kernels import attention_flops  # noqa: E402
from parsim.cluster.hardware import load_profile  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "aiconfigurator_gemm_times.csv"
ATTENTION = ROOT / "benchmarks" / "data" / "aiconfigurator_attention_times.csv"
PROFILES = {"A100 SXM 80GB": "dgx-a100-80g", "H100 SXM": "dgx-h100", "H200 SXM": "dgx-h200", "B200": "dgx-b200",
            "GB200": "gb200-nvl72", "B300": "dgx-b300", "GB300": "gb300-nvl72"}


def rows() -> list[dict]:
    with open(DATA) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def quantize_time(dev, precision: str, m: int, k: int) -> float:
    """The collector's FP8 Linear quantizes its BF16 input per call (TensorRT-LLM's FP8QDQ dynamic path:
    collector/trtllm/collect_gemm.py says the fp8 times include it): an amax pass reading A and a cast
    reading A and writing its FP8 copy, through HBM; none for BF16."""
    return dev.memory_time(m * k * (2 + 2 + 1)) if precision == "fp8" else 0.0


def ratios() -> dict[tuple[str, str], dict[str, list[float]]]:
    """(gpu, precision) -> {"burst": [...], "sustained": [...], "big_burst": [...]}: parsim / measured."""
    out: dict = {}
    devs = {g: load_profile(p).device for g, p in PROFILES.items()}
    for r in rows():
        dev = devs[r["gpu"]]
        m, n, k = int(r["m"]), int(r["n"]), int(r["k"])
        t = float(r["ms"]) * 1e-3
        d = out.setdefault((r["gpu"], r["precision"]), {"burst": [], "sustained": [], "big_burst": [], "light_quant": [],
                                                          "tflops": []})
        burst, sustained = (x.gemm_time(m, n, k, r["precision"]) + quantize_time(x, r["precision"], m, k)
                            for x in (dev.burst(), dev))
        if quantize_time(dev.burst(), r["precision"], m, k) < 0.1 * dev.burst().gemm_time(m, n, k, r["precision"]):
            d["light_quant"].append(burst / t)  # the input's quantization under a tenth of the GEMM
        d["burst"].append(burst / t)
        d["sustained"].append(sustained / t)
        if min(m, n, k) >= 4096:
            d["big_burst"].append(burst / t)
        d["tflops"].append(2.0 * m * n * k / t / 1e12)
    return out


def attention_ratios() -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(gpu, measured kernel) -> [(seq, parsim / measured)]: a causal forward of the GPU's own attention
    kernel in parsim (FlashAttention-3 on Hopper, FA4 / cuDNN on Blackwell) against vLLM's measured
    backend (``benchmarks/data/aiconfigurator_attention_times.csv``)."""
    devs = {g: load_profile(p).device.burst() for g, p in PROFILES.items()}
    out: dict = {}
    with open(ATTENTION) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            b, s, h, kv, d = (int(r[k]) for k in ("batch", "seq", "heads", "kv_heads", "head_dim"))
            p = devs[r["gpu"]].attention_kernel_time(b, s, s, h, kv, d, True, False, "bf16")
            out.setdefault((r["gpu"], r["kernel"]), []).append((s, p / (float(r["ms"]) * 1e-3)))
    return out


def attention_table() -> list[str]:
    lines = ["| GPU | measured kernel | shapes | parsim / measured: median (p10-p90) | seq 16384: median |",
             "|---|---|---|---|---|"]
    for (g, kern), v in attention_ratios().items():
        r = [x for _, x in v]
        long = [x for s, x in v if s == 16384]
        lines.append(f"| {g} | {kern} | {len(r)} | {statistics.median(r):.2f} ({_q(r, 0.1):.2f}-{_q(r, 0.9):.2f}) | "
                     f"{statistics.median(long):.2f} |")
    return lines


CUDNN_91 = ROOT / "benchmarks" / "data" / "cudnn_sdpa_h200_91.csv"


def cudnn_ratios() -> list[tuple[int, bool, str, float]]:
    """(seq, causal, pass, parsim / measured TFLOP/s) of parsim's cuDNN kernel model on dgx-h200 at its
    burst clock (fitted to the FlashAttention-3 paper's cuDNN bars, 2024) against cuDNN 9.1.0's own H200
    benchmark (cudnn-frontend's benchmark_results.csv, clocks locked at 1,980 MHz): forward and
    backward, causal and not, 4k to 64k tokens. Below 1: parsim is slower."""
    dev = load_profile("dgx-h200").device.burst()
    out = []
    with open(CUDNN_91) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            b, h, s, d = (int(r[k]) for k in ("batch", "heads", "seq", "head_dim"))
            causal = r["causal"] == "True"
            for back, key in ((False, "fwd"), (True, "bwd")):
                t = dev.attention_kernel_time(b, s, s, h, h, d, causal, back, "bf16", "cudnn")
                flops = attention_flops(b, s, s, h, d, causal, back)  # as the benchmark's script counts them
                out.append((s, causal, key, flops / t / 1e12 / float(r[f"{key}_tflops"])))
    return out


def cudnn_table() -> list[str]:
    lines = ["| cuDNN 9.1.0 on H200 (measured) | 4k | 8k | 16k | 32k | 64k |", "|---|---|---|---|---|---|"]
    v = cudnn_ratios()
    for causal in (True, False):
        for key in ("fwd", "bwd"):
            cells = [f"{x:.2f}" for s, c, k, x in v if c == causal and k == key]
            lines.append(f"| {'causal' if causal else 'full'} {key}: parsim / measured TFLOP/s | {' | '.join(cells)} |")
    return lines


NCCL = ROOT / "benchmarks" / "data" / "nccl_tests_times.csv"
NCCL_PROFILES = {"A100 SXM": "dgx-a100-80g", "H100 SXM": "dgx-h100", "H200 SXM": "dgx-h200", "B200": "dgx-b200",
                 "GB200": "gb200-nvl72", "B300": "dgx-b300", "GB300": "gb300-nvl72"}


def collective_ratios() -> dict[tuple[str, str, str], list[float]]:
    """(gpu, kind, size band) -> parsim / measured for nccl-tests inside one node
    (``benchmarks/data/nccl_tests_times.csv``); bands: under 1 MiB, 1-64 MiB, 64 MiB and over."""
    from parsim.cluster.collectives import collective_time
    hws = {g: load_profile(p) for g, p in NCCL_PROFILES.items()}
    out: dict = {}
    with open(NCCL) as f:
        for r in csv.DictReader(line for line in f if not line.startswith("#")):
            b, n = int(r["bytes"]), int(r["gpus"])
            band = "< 1 MiB" if b < 2 ** 20 else "1-64 MiB" if b < 2 ** 26 else ">= 64 MiB"
            p = collective_time(hws[r["gpu"]], r["kind"], b, list(range(n)))
            out.setdefault((r["gpu"], r["kind"], band), []).append(p / (float(r["ms"]) * 1e-3))
    return out


def collective_table() -> list[str]:
    rows = collective_ratios()
    lines = ["| GPU | collective | parsim / measured, < 1 MiB | 1-64 MiB | >= 64 MiB |", "|---|---|---|---|---|"]
    for gpu in NCCL_PROFILES:
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
            cells = [f"{statistics.median(rows[(gpu, kind, b)]):.2f}" if (gpu, kind, b) in rows else ""
                     for b in ("< 1 MiB", "1-64 MiB", ">= 64 MiB")]
            lines.append(f"| {gpu} | {kind} | " + " | ".join(cells) + " |")
    return lines


def _q(v: list[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def table() -> list[str]:
    lines = ["| GPU | precision | shapes | parsim / measured, burst: median (p10-p90) | sustained: median | "
             "m, n, k >= 4096, burst: median | FP8, quantization < 1/10 of the GEMM: median (shapes) | "
             "best measured TFLOP/s |",
             "|---|---|---|---|---|---|---|---|"]
    for (g, p), d in ratios().items():
        light = (f"{statistics.median(d['light_quant']):.2f} ({len(d['light_quant'])})"
                 if p == "fp8" and d["light_quant"] else "")
        lines.append(f"| {g} | {p} | {len(d['burst'])} | {statistics.median(d['burst']):.2f} "
                     f"({_q(d['burst'], 0.1):.2f}-{_q(d['burst'], 0.9):.2f}) | {statistics.median(d['sustained']):.2f} | "
                     f"{statistics.median(d['big_burst']):.2f} | {light} | {max(d['tflops']):.0f} |")
    return lines


FINDINGS = [
    "What it said when written (the tables above are regenerated; this paragraph is not). BF16: the "
    "tile-and-wave model built on ml-engineering's MAMF holds on 875 GEMMs nobody tuned it to, the medians "
    "within 2-7% on every GPU, closer to the burst model than to the sustained one (the collector replays a "
    "few calls). FP8, the collector's dynamic input quantization added: Hopper within 13-17% (3-5% at m, n, "
    "k >= 4096); Blackwell 25-32% too fast at the median. The collector's quantization (TensorRT-LLM's "
    "dynamic FP8QDQ path) costs more than the two HBM passes counted here -- at m = 16,384, k = 16,384 on an "
    "H100 the measured FP8 call takes as long as the BF16 GEMM -- so the clean comparison is the shapes whose "
    "quantization is under a tenth of the GEMM: Hopper 0.92-0.93, Blackwell 0.71-0.87 at the median. There "
    "parsim's FP8 GEMMs reach their MAMF (B200: 3,432 TFLOP/s, ml-engineering's best shape) where TensorRT-LLM's "
    "cuBLASLt FP8 does not (its best on this grid: 2,878); the model names no FP8-specific roll-off on "
    "Blackwell, and nothing was fitted to this -- the 21 held-out Blackwell FP8 dense training rows (Transformer "
    "Engine's cuBLASLt FP8 GEMMs, the casts fused into the preceding ops) land at -0.1% mean error, so the gap "
    "does not carry to them as measured. Attention: parsim's FlashAttention-3 (fitted to the FA3 paper's curves) is "
    "6-12% faster than vLLM's FA3 on H100 / H200 (paged, variable-length inference calls); on Blackwell the "
    "measured kernel is FlashInfer's TensorRT-LLM-gen prefill, not the FA4 / cuDNN kernel parsim models, "
    "which it trails by 0-30%. parsim's cuDNN kernel (fitted to the FA3 paper's cuDNN bars) against cuDNN 9.1.0's "
    "own published H200 benchmark (cudnn-frontend, clocks locked): MAPE 4.7% over 20 forward / backward, causal / "
    "full ratios from 4k to 64k tokens, the causal backward 2-10% fast, the full-mask forward at 4-8k 13% slow. "
    "Collectives inside a node (nccl-tests, NCCL 2.29; NVLS reduce-scatter and "
    "all-gather costed as the rings they measure like -- 335 GB/s on 8 H100 at 512 MiB, not the 480 the NVLS "
    "all-reduce's formula gave them; Blackwell's NVLink efficiency these runs' 0.684, not H100's 0.82 "
    "carried over): parsim is too fast nearly everywhere. From 64 MiB H100 0.77-0.86, B200 0.76-0.98, "
    "GB200 0.62-0.91 of the measured time; below 64 MiB 0.27-0.73 -- NCCL's bandwidth ramps up with the "
    "message through its protocols and channels, which one per-step latency and one efficiency do not "
    "describe. Since then the profiles of these GPUs carry NCCL's measured lines (per collective, group size and "
    "size range a per-step latency and link bandwidth, fitted on the even powers of two: "
    "benchmarks/fit_nccl_intranode.py, reports/fit-nccl-intranode.md, median 3.3% on the 352 held-out sizes), "
    "so the collective table above now compares those lines with their own data.", ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", help="write the report here")
    args = ap.parse_args()
    lines = table() + [""] + attention_table() + [""] + cudnn_table() + [""] + collective_table()
    print("\n".join(lines))
    if args.markdown:
        text = ["# parsim's GEMM model against aiconfigurator's measured GEMMs", "",
                "Generated by `python benchmarks/kernel_crosscheck.py --markdown reports/kernel-crosscheck.md`; "
                "the data and what it is: `benchmarks/data/aiconfigurator_gemm_times.csv`. A ratio below 1: "
                "parsim's GEMM is faster than the measured one. Nothing in parsim is fitted to these.", "", *lines, ""]
        Path(args.markdown).write_text("\n".join(text + FINDINGS))


if __name__ == "__main__":
    main()
