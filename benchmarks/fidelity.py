"""Fidelity benchmark: predicted vs published TFLOP/s per GPU and iteration time.

    python benchmarks/fidelity.py [--markdown reports/fidelity.md] [--json]

Every throughput case of ``shared/reference/published.json`` becomes a scenario
(``scenario_for``), one hardware profile per GPU type (``dgx-a100-80g``, ``dgx-h100``),
the same rules for every row and no per-case or per-GPU factor: every kernel's time comes
from its kernel model (``parsim.costs.compute``: GEMMs calibrated to the GPU's measured MAMF,
FlashAttention fitted to its paper's curves, memory-bound ops at HBM bandwidth, one host
dispatch time per kernel), nothing is fitted to these rows. The rows the retired
``device.sustained_fraction`` was fitted on (every other row of each family) are still shown
apart from the rest (``fit_subset``), so the two halves can be compared with the old report. Printed: predicted and published
TFLOP/s per GPU (Megatron's FLOP formula, as the sources count), iteration time, the
per-case error and the mean absolute percentage error (MAPE) per family.

Rules (documented defaults; the sources do not give these):

* Megatron-LM 2021 Table 1 (A100): fp16, full recompute, no FlashAttention (2022; the
  s x s scores go through HBM, with dropout), the microbatch size, virtual pipeline stages and
  DDP implementation of Megatron-LM's script for that table (``SC21_TABLE_1``: its own
  source, not a default), no ZeRO, no sequence parallelism (2022); with PyTorch DDP (pp = 1)
  the gradient all-reduce in 25 MiB buckets under the last backward, with Megatron's local DDP
  (pp > 1) every model chunk's once the pipeline has flushed (it does not overlap it); no
  gradient accumulation fusion (added to Megatron-LM in February 2022: each microbatch's dW is
  added into the fp16 ``main_grad`` buffer by the DDP hook,
  ``training.grad_accumulation_fusion = false``); Apex's FusedLayerNorm kernels, not the persistent
  one (megatron/model/fused_layer_norm.py at 6985e589; Megatron-LM a2fdcdf061 made FastLayerNorm the
  default in October 2021: ``training.persist_layer_norm = false``); the input-gradient all-reduces of the
  column-parallel linears block (``overlap.tp_grad_allreduce = false``: the asynchronous one, on by
  default, came in September 2021, Megatron-LM 3f65246911); the scatter/gather p2p optimisation (each TP
  rank sends 1/tp of the activation on its own NIC) is what sequence-sharded p2p models.
* Megatron-Core r0.8.0 weak scaling (H100): bf16, microbatch 1, no recompute,
  distributed optimizer (ZeRO-1) with --overlap-grad-reduce --overlap-param-gather
  --tp-comm-overlap (sequence parallelism on when tp > 1), 1F1B; attention through
  Transformer Engine's FusedAttention, i.e. cuDNN (``training.attention_kernel = "cudnn"``).
* Both: Megatron's memory layout and gradient dtype (``parallel.framework = "megatron"``):
  under bf16 Megatron-LM accumulates and reduces fp32 main gradients (its arguments.py forces
  ``accumulate_allreduce_grads_in_fp32`` for bf16: "bfloat16 requires gradient accumulation
  and all-reduce to be done in fp32"), so the H100 rows' reduce-scatter moves 4 bytes per
  gradient; fp16 (2021) reduces fp16 gradients.
* Both: pipeline sends block (``overlap.p2p = false``): Megatron's ``_communicate`` waits on
  its ``batch_isend_irecv`` requests and then synchronises the device ("to protect against race
  condition when using batch_isend_irecv()"), in 2021's Megatron-LM and in Megatron-Core's
  default ``batch_p2p_comm`` path alike.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parsim.scenario import scenario_from_dict  # noqa: E402
from parsim.simulate import simulate  # noqa: E402

PUBLISHED = ROOT / "tests" / "data" / "published.json"  # a copy of ../shared/reference/published.json

A100_PRESETS = {"1.7B": "megatron-1.7b", "3.6B": "megatron-3.6b", "7.5B": "megatron-7.5b", "18B": "megatron-18b",
                "39B": "megatron-39b", "76B": "megatron-76b", "145B": "megatron-145b", "310B": "megatron-310b",
                "530B": "megatron-530b", "1T": "megatron-1t"}


def load_cases(path: Path = PUBLISHED) -> list[dict]:
    """The throughput cases of published.json (Megatron 2021 Table 1, Megatron-Core H100)."""
    data = json.loads(Path(path).read_text())
    return [c for c in data if c.get("kind") == "throughput" and "tp" in c.get("inputs", {})]


SC21_TABLE_1 = {
    # size: (--micro-batch-size, --num-layers-per-virtual-pipeline-stage or None, --DDP-impl)
    "1.7B": (16, None, "torch"), "3.6B": (16, None, "torch"), "7.5B": (16, None, "torch"),
    "18B": (8, None, "torch"), "39B": (4, None, "local"), "76B": (2, 5, "local"), "145B": (2, 5, "local"),
    "310B": (1, 3, "local"), "530B": (1, 1, "local"), "1T": (1, None, "local"),
}
"""What Megatron-LM's own script for Table 1 runs each row with
(``examples/academic_paper_scripts/sc21/run_table_1.sh``, the paper's scripts, at Megatron-LM commit
6985e589; its CONFIG.sh: ``--fp16 --loss-scale 8192 --seq-length 2048``, full recompute by
``--activations-checkpoint-method uniform``): the microbatch size, the layers per virtual pipeline
stage (None: the non-interleaved 1F1B) and the data-parallel implementation (``torch``: PyTorch DDP,
whose bucketed all-reduce (25 MiB buckets) overlaps the last microbatch's backward -- Megatron's
``no_sync`` for the others; ``local``: Megatron's own DDP, all-reduced after the backward)."""
TORCH_DDP_BUCKET_BYTES = 25 * 2 ** 20
"""PyTorch DDP's ``bucket_cap_mb`` default."""


def scenario_for(case: dict) -> dict:
    """The scenario document (TOML as a dict) of one published case."""
    i, cid = case["inputs"], case["id"]
    tp, pp, dp = i["tp"], i["pp"], i["dp"]
    if cid.startswith("megatron21-"):
        size = cid.split("-")[-1]
        mbs, per_virtual, ddp = SC21_TABLE_1[size]
        vpp = i["layers"] // pp // per_virtual if per_virtual else 1
        return {
            "name": cid, "hardware": "dgx-a100-80g", "gpus": i["gpus"],
            "model": {"preset": A100_PRESETS[size]},
            # the April 2021 code's norms: Apex's FusedLayerNorm kernels (megatron/model/fused_layer_norm.py
            # at 6985e589, fused_mix_prec_layer_norm_cuda); the persistent kernel came in October 2021
            # (a2fdcdf061)
            "training": {"global_batch": i["global_batch"], "microbatch_size": mbs, "seq_len": i["seq_len"],
                         "precision": "fp16", "recompute": "full", "flash_attention": False,
                         "grad_accumulation_fusion": False, "persist_layer_norm": False},
            "parallel": {"dp": dp, "tp": tp, "pp": pp, "vpp": vpp, "zero": 0, "sequence_parallel": False,
                         "framework": "megatron"},
            "schedule": {"name": "Interleaved1F1B" if vpp > 1 else "1F1B"},
            # the April 2021 code: the input-gradient all-reduces blocked (the asynchronous one, on by
            # default, came in September 2021: Megatron-LM 3f65246911, --no-async-tensor-model-parallel-allreduce)
            "overlap": {"grad_reduce": ddp == "torch", "param_gather": False, "tp_comm": False, "p2p": False,
                        "tp_grad_allreduce": False,
                        **({"bucket_bytes": TORCH_DDP_BUCKET_BYTES} if ddp == "torch" else {})},
        }
    size = i["model"].split()[-1].lower()
    return {
        "name": cid, "hardware": "dgx-h100", "gpus": i["gpus"],
        "model": {"preset": f"mcore-gpt-{size}"},
        "training": {"global_batch": i["global_batch"], "microbatch_size": 1, "seq_len": i["seq_len"],
                     "precision": "bf16", "recompute": "none", "attention_kernel": "cudnn"},
        "parallel": {"dp": dp, "tp": tp, "pp": pp, "zero": 1, "sequence_parallel": tp > 1, "framework": "megatron"},
        "schedule": {"name": "1F1B"},
        "overlap": {"grad_reduce": True, "param_gather": True, "tp_comm": True, "p2p": False},
    }


def published_tflops(case: dict) -> float:
    e = case["expected"]
    return e.get("achieved_TFLOPs_per_GPU", e.get("TFLOPs_per_GPU"))


MEASURED_COMPUTE_KEYS = ("mamf_bf16_tflops", "mamf_bf16_shape", "mamf_fp8_tflops", "mamf_fp8_shape")
"""The profile keys a GPU measurement (``parsim/cluster/profiles/calibrated/dgx-h200-measured.toml``,
reports/gpu/h200) carries over to the H100 rows: the H200 is the H100's GH100 compute with its own
memory, so its measured GEMM maxima are the H100's; bandwidth-bound numbers stay the H100's."""


def measured_h100_profile(calibrated: str, folder: Path) -> Path:
    """``dgx-h100.toml`` with the compute facts of the measured profile ``calibrated`` (written to
    ``folder``), as a path a scenario's ``hardware`` can name."""
    import re

    from parsim.cluster.hardware import PROFILE_DIR, find_calibrated
    src = find_calibrated(calibrated) or Path(calibrated)
    measured = {k: v for k, v in re.findall(r"^(\w+) = (.*)$", src.read_text(), flags=re.M) if k in MEASURED_COMPUTE_KEYS}
    text = (PROFILE_DIR / "dgx-h100.toml").read_text()
    for k, v in measured.items():
        text, n = re.subn(rf"^{k} = .*$", f"{k} = {v}", text, flags=re.M)
        assert n == 1, k
    text = re.sub(r'^name = "dgx-h100"', 'name = "dgx-h100-measured-compute"', text, flags=re.M)
    out = folder / "dgx-h100-measured-compute.toml"
    out.write_text(text)
    return out


def run_case(case: dict, h100_profile: Path | None = None) -> dict:
    doc = scenario_for(case)
    if h100_profile is not None and doc["hardware"] == "dgx-h100":
        doc["hardware"] = str(h100_profile)
    sc = scenario_from_dict(doc, f"<fidelity:{case['id']}>")
    mx = simulate(sc).metrics
    pub = published_tflops(case)
    pred = mx["megatron_tflops_per_gpu"]
    pub_t = mx["step_time_s"] * pred / pub  # the published iteration time under the same FLOP count
    return {"id": case["id"], "family": "a100" if case["id"].startswith("megatron21") else "h100",
            "gpus": sc.gpus, "tp": sc.parallel.tp, "pp": sc.parallel.pp, "dp": sc.parallel.dp,
            "vpp": sc.parallel.vpp, "predicted_tflops": pred, "published_tflops": pub,
            "predicted_step_s": mx["step_time_s"], "published_step_s": pub_t,
            "error": pred / pub - 1.0, "exposed_comm_s": mx["exposed_comm_s"],
            "params_per_gpu": mx["params"] / (sc.parallel.tp * sc.parallel.pp),
            "exposed_by_axis": mx["exposed_comm_by_axis_s"], "bubble": mx["bubble_fraction"]}


KORTHIKANTI_PRESETS = {"22B": "megatron-18b", "175B": "gpt3-175b", "530B": "megatron-530b", "1T": "megatron-1t"}
"""The preset whose hidden size and block each Korthikanti et al. 2022 model shares (layers, heads
and vocabulary are set from the row; 22B is megatron-18b's 6144-wide block, 48 layers, 64 heads)."""
CLASSIC_MODES = {"full_recompute_s": ("full", False), "seq_parallel_selective_s": ("selective", True)}
"""Table 5's two columns: (training.recompute, parallel.sequence_parallel)."""


def load_classic(path: Path = PUBLISHED) -> list[dict]:
    """Korthikanti et al. 2022 Table 5 (published.json ``korthikanti-table5-*``): measured
    iteration times of Megatron-LM on A100, held out of everything (no fit, no calibration)."""
    data = json.loads(Path(path).read_text())
    return [c for c in data if c["id"].startswith("korthikanti-table5-")]


def classic_scenario(case: dict, column: str) -> dict:
    """The scenario of one Table 5 cell: Megatron-LM of 2022 (fp16, the unfused attention core,
    gradient accumulation fused into the weight-gradient GEMM since February 2022, blocking
    pipeline sends, the column-parallel input gradients' all-reduces -- reduce-scatters under
    sequence parallelism -- beside the weight-gradient GEMMs as that code launches them
    (``async_op=True``: Megatron's default ``overlap.tp_grad_allreduce``), no other overlap), one
    data-parallel replica."""
    i, name = case["inputs"], case["id"].split("-")[-1]
    recompute, sp = CLASSIC_MODES[column]
    model = {"preset": KORTHIKANTI_PRESETS[name], "n_layers": i["layers"], "n_heads": i["heads"],
             "n_kv_heads": i["heads"], "vocab_size": i["vocab"]}
    return {
        "name": f"{case['id']}-{recompute}", "hardware": "dgx-a100-80g", "gpus": i["gpus"], "model": model,
        "training": {"global_batch": i["global_batch"], "microbatch_size": i["microbatch"], "seq_len": i["seq_len"],
                     "precision": "fp16", "recompute": recompute, "flash_attention": False,
                     "grad_accumulation_fusion": True},
        "parallel": {"dp": i["dp"], "tp": i["tp"], "pp": i["pp"], "vpp": i["vpp"], "zero": 0,
                     "sequence_parallel": sp, "framework": "megatron"},
        "schedule": {"name": "Interleaved1F1B" if i["vpp"] > 1 else "1F1B"},
        "overlap": {"grad_reduce": False, "param_gather": False, "tp_comm": False, "p2p": False},
    }


def run_classic(case: dict) -> list[dict]:
    """Both Table 5 columns of one row: predicted and measured iteration seconds. Error =
    measured / predicted - 1 (+: parsim predicts the run faster than it ran, as above)."""
    out = []
    for column, (recompute, sp) in CLASSIC_MODES.items():
        sc = scenario_from_dict(classic_scenario(case, column), f"<fidelity:{case['id']}>")
        if sc.model.d_model != case["inputs"]["hidden"]:
            raise ValueError(f"{case['id']}: preset hidden size {sc.model.d_model} != {case['inputs']['hidden']}")
        mx = simulate(sc).metrics
        pub = case["expected"][column]
        out.append({"id": case["id"], "mode": "seq+sel" if sp else recompute, "pp": sc.parallel.pp,
                    "vpp": sc.parallel.vpp, "predicted_step_s": mx["step_time_s"], "published_step_s": pub,
                    "error": pub / mx["step_time_s"] - 1.0, "exposed_comm_s": mx["exposed_comm_s"],
                    "bubble": mx["bubble_fraction"]})
    return out


def classic_table(rows: list[dict]) -> str:
    head = ("| case | recomputation | pp (vpp) | predicted s | published s | error | exposed comm s | bubble |\n"
            "|---|---|---|---|---|---|---|---|\n")
    return head + "\n".join(
        f"| {r['id']} | {r['mode']} | {r['pp']} ({r['vpp']}) | {r['predicted_step_s']:.2f} | "
        f"{r['published_step_s']:.2f} | {100 * r['error']:+.1f}% | {r['exposed_comm_s']:.2f} | {r['bubble']:.3f} |"
        for r in rows)


def fit_subset(rows_or_cases: list) -> list:
    """The rows the retired ``sustained_fraction`` was fitted on: every other case of each
    family (1st, 3rd, ...). Nothing is fitted on them now; they are kept apart for comparison."""
    out = []
    for fam in ("megatron21", "megatron-core"):
        out += [c for c in rows_or_cases if c["id"].startswith(fam)][0::2]
    return out


def mape(rows: list[dict]) -> float:
    return 100.0 * sum(abs(r["error"]) for r in rows) / len(rows) if rows else 0.0


def table(rows: list[dict]) -> str:
    head = ("| case | GPUs | tp·pp·dp (vpp) | predicted TFLOP/s | published TFLOP/s | predicted step s "
            "| published step s | error | exposed comm s | bubble |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r['id']} | {r['gpus']} | {r['tp']}·{r['pp']}·{r['dp']} ({r['vpp']}) | "
                     f"{r['predicted_tflops']:.1f} | {r['published_tflops']:.1f} | {r['predicted_step_s']:.2f} | "
                     f"{r['published_step_s']:.2f} | {100 * r['error']:+.1f}% | {r['exposed_comm_s']:.3f} | "
                     f"{r['bubble']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", help="write the table to this Markdown file")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--calibrated", default="dgx-h200-measured",
                    help="a measured profile whose GEMM maxima the H100 rows are also run with, reported beside "
                         "('' to skip)")
    args = ap.parse_args()
    rows = [run_case(c) for c in load_cases()]
    a100 = [r for r in rows if r["family"] == "a100"]
    h100 = [r for r in rows if r["family"] == "h100"]
    fit_ids = {r["id"] for r in fit_subset(rows)}
    held = [r for r in rows if r["id"] not in fit_ids]
    summary = {"mape_a100_pct": mape(a100), "mape_h100_pct": mape(h100), "mape_all_pct": mape(rows),
               "mape_a100_heldout_pct": mape([r for r in held if r["family"] == "a100"]),
               "mape_h100_heldout_pct": mape([r for r in held if r["family"] == "h100"]),
               "mape_a100_fitrows_pct": mape([r for r in rows if r["id"] in fit_ids and r["family"] == "a100"]),
               "mape_h100_fitrows_pct": mape([r for r in rows if r["id"] in fit_ids and r["family"] == "h100"]),
               "mape_a100_no_pipeline_pct": mape([r for r in a100 if r["pp"] == 1]),
               "fit_rows": sorted(fit_ids)}
    classic = [r for c in load_classic() for r in run_classic(c)]
    summary["mape_classic_pct"] = mape(classic)
    if args.calibrated:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            prof = measured_h100_profile(args.calibrated, Path(tmp))
            cal = [run_case(c, prof) for c in load_cases()]
        summary["calibrated_profile"] = args.calibrated
        summary["mape_all_calibrated_pct"] = mape(cal)
        summary["mape_h100_calibrated_pct"] = mape([r for r in cal if r["family"] == "h100"])
    if args.json:
        print(json.dumps({"rows": rows, "classic_rows": classic, **summary}, indent=1))
    else:
        print(table(rows))
        print("\n" + classic_table(classic))
        print(f"\nMAPE: Megatron-LM 2021 A100 {summary['mape_a100_pct']:.1f}%  "
              f"Megatron-Core H100 {summary['mape_h100_pct']:.1f}%  all {summary['mape_all_pct']:.1f}%\n"
              f"rows the retired sustained_fraction was fitted on: A100 {summary['mape_a100_fitrows_pct']:.1f}%  "
              f"H100 {summary['mape_h100_fitrows_pct']:.1f}%; the other rows: A100 "
              f"{summary['mape_a100_heldout_pct']:.1f}%  H100 {summary['mape_h100_heldout_pct']:.1f}%\n"
              f"A100 rows without pipeline parallelism: {summary['mape_a100_no_pipeline_pct']:.1f}%\n"
              f"held out, Korthikanti et al. 2022 Table 5 (A100): {summary['mape_classic_pct']:.1f}%")
        if args.calibrated:
            print(f"H100 rows with the GEMM maxima measured on an H200 ({args.calibrated}): H100 "
                  f"{summary['mape_h100_calibrated_pct']:.1f}%, all {summary['mape_all_calibrated_pct']:.1f}% "
                  f"(shipped profile: {summary['mape_h100_pct']:.1f}%, {summary['mape_all_pct']:.1f}%)")
    if args.markdown:
        Path(args.markdown).write_text(_report(rows, summary, classic))


HELDOUT_BEFORE = {"b200_gb200": (24, 84.7), "bf16_fsdp_zero3_hsdp": (12, 10.6), "fine_grained_moe": (15, 58.4),
                  "fp8_dense": (16, 40.6), "large_scale_dp_series": (41, 14.3), "long_context_cp": (9, 97.4),
                  "all": (117, 44.0)}
"""Held-out modern set, MAPE per category before this round (reports/fidelity-heldout.md at
commit 606e2b1: shape GEMM model, one attention efficiency, sustained_fraction 0.82/0.67)."""
BEFORE = {"a100": 6.1, "h100": 6.8, "all": 6.4}
"""This benchmark's MAPE before this round (the same commit, with sustained_fraction fitted on half the rows)."""

KERNEL_GPUS = (("dgx-a100-80g", "fp16"), ("dgx-h100", "bf16"), ("dgx-h200", "bf16"), ("dgx-b200", "bf16"),
               ("dgx-b300", "bf16"), ("gb200-nvl72", "bf16"))
LOW_PRECISION = ("fp8", "mxfp8", "nvfp4")
"""The 8192^3 GEMM at each low precision the GPU has (the linear layers' rates under FP8 recipes)."""
KERNEL_GEMMS = ((4096, 2048, 2048), (4096, 6144, 2048), (2048, 3072, 12288), (8192, 8192, 8192))


def kernel_table() -> str:
    """The kernels the cost model runs, per GPU: GEMM and fused-attention TFLOP/s at training shapes."""
    from parsim.cluster.hardware import load_profile
    head = ("| GPU | " + " | ".join(f"GEMM {m}x{n}x{k}" for m, n, k in KERNEL_GEMMS)
            + " | 8192^3 " + " / ".join(LOW_PRECISION)
            + " | attention fwd / bwd, seq 2k | seq 8k | seq 32k | MAMF (measured) |")
    lines = [head, "|" + "---|" * (len(KERNEL_GEMMS) + 6)]
    for hw, p in KERNEL_GPUS:
        d = load_profile(hw).device
        cells = [f"{2 * m * n * k / d.gemm_time(m, n, k, p) / 1e12:.0f}" for m, n, k in KERNEL_GEMMS]
        big = 2.0 * 8192 ** 3
        cells.append(" / ".join(f"{big / d.gemm_time(8192, 8192, 8192, q) / 1e12:.0f}" if q in d.peak_flops else "-"
                                for q in LOW_PRECISION))
        for s in (2048, 8192, 32768):
            fl = 4.0 * s * s * 32 * 128 / 2  # causal forward FLOPs, 32 heads x 128
            f = fl / d.attention_kernel_time(1, s, s, 32, 8, 128, True, False, "bf16") / 1e12
            b = 2.5 * fl / d.attention_kernel_time(1, s, s, 32, 8, 128, True, True, "bf16") / 1e12
            cells.append(f"{f:.0f} / {b:.0f}")
        mamf = d.kernels.mamf.get(p) or d.kernels.mamf.get("bf16")
        cells.append(f"{mamf[0] / 1e12:.0f}" if mamf else "-")
        lines.append(f"| {hw} ({d.kernels.attention_kernel}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


HELDOUT_NEW_PROFILES = ("grand-teton-h100", "dgx-a100-40g")
"""Profiles added after the 'before' column was taken: their rows were not expressible then."""
HELDOUT_NEW_ROWS = ("nemo-longseq-b200-", "nemofw2502-b200-mixtral8x22b-", "mb-26.06-", "mb-26.06.01-", "zoo-")
"""Rows (id prefixes) made expressible after the 'before' column by the data set or a preset: the
NeMo B200 long-sequence table's GPU count taken from its layout (its page's column is 4x it), the
mixtral-8x22b preset, and rows added to the data set since (Megatron-Bridge's 26.06 and 26.06.01
pre-training tables, Megatron-MoE-ModelZoo's Qwen3 best-practice table)."""
HELDOUT_NEW_MODELS = ("nemotron3",)
"""Row ids naming a model family added to the data set after the 'before' column (Megatron-Bridge's
Nemotron 3 rows, added with parsim's hybrid Mamba-2 models)."""


def heldout_summary() -> dict[str, tuple[int, float, float]]:
    """Per category of the held-out modern set now (benchmarks/fidelity_heldout.py): (rows
    compared, MAPE over them, MAPE over the rows that were expressible before)."""
    import fidelity_heldout as fh
    rows = [fh.run_row(r) for r in fh.load_rows()]
    done = [r for r in rows if r.get("status") == "compared"]

    def mape_of(rs: list[dict]) -> float:
        return 100.0 * sum(abs(r["error"]) for r in rs) / len(rs) if rs else float("nan")

    out = {}
    for cat in sorted({r["category"] for r in done}) + ["all"]:
        rs = [r for r in done if cat in ("all", r["category"])]
        old = [r for r in rs if r["scenario"]["hardware"] not in HELDOUT_NEW_PROFILES
               and not r["id"].startswith(HELDOUT_NEW_ROWS) and not any(m in r["id"] for m in HELDOUT_NEW_MODELS)]
        out[cat] = (len(rs), mape_of(rs), mape_of(old))
    return out



def _by_id(rows: list[dict], rid: str) -> dict:
    return next(r for r in rows if r["id"] == rid)


def _err(rows: list[dict], rid: str) -> str:
    """One row's error in words ("12.0% fast" / "17.3% slow"), as the report quotes it."""
    e = 100 * _by_id(rows, rid)["error"]
    return f"{abs(e):.1f}% {'fast' if e >= 0 else 'slow'}"


def _comm_share(rows: list[dict], rid: str) -> str:
    r = _by_id(rows, rid)
    return f"{100 * r['exposed_comm_s'] / r['predicted_step_s']:.1f}%"


def _step(rows: list[dict], rid: str) -> str:
    r = _by_id(rows, rid)
    return f"{r['predicted_step_s']:.2f} s predicted against {r['published_step_s']:.2f} s published"


def _unexplained_per_param(r: dict) -> float:
    """Seconds per 10^9 parameters a GPU holds that the published step of row ``r`` adds to the
    predicted step less its exposed data-parallel communication."""
    rest = r["predicted_step_s"] - r["exposed_by_axis"]["dp"]
    return (r["published_step_s"] - rest) / (r["params_per_gpu"] / 1e9)


H100_NO_PP = ("1.7B", "7.1B", "16B", "32B")
"""The Megatron-Core H100 rows without pipeline parallelism (tp 1, 2, 4, 8; dp 48 each)."""


def _slowest_chip_sentence(rows: list[dict]) -> str:
    """How the H100 rows' slowest chip is read from the profile (its numbers, not restated)."""
    from parsim.cluster.hardware import load_profile
    from parsim.cluster.pace import chip_sigma
    kf = load_profile("dgx-h100").device.kernels
    spread, chips = kf.msmf_chip_range
    gpus = sorted(r["gpus"] for r in rows if r["family"] == "h100")
    return (f"That {kf.msmf[0]:g} is the node's mean chip, and a synchronous job waits on its slowest: the "
            f"same runs spanned {100 * spread:g}% across the node's {chips} GPUs (each keeping to its own "
            f"part of the range), read as a chip-to-chip sigma of {100 * chip_sigma(spread, chips):.1f}%, so "
            f"the slowest of the {gpus[0]:,} to {gpus[-1]:,} GPUs of these rows sustains "
            f"{100 * (1 - kf.slowest_chip_share(gpus[0])):.1f}-{100 * (1 - kf.slowest_chip_share(gpus[-1])):.1f}% "
            "less (`device.msmf_chip_range_pct`, `parsim.cluster.pace`), which took the H100 MAPE from 8.7% to 7.6%.")


def _per_param_sentence(rows: list[dict]) -> str:
    from parsim.costs.dp import megatron_grad_scaling_bytes
    picked = {size: _by_id(rows, f"megatron-core-h100-weak-{size}") for size in H100_NO_PP}
    vals = {size: _unexplained_per_param(r) for size, r in picked.items()}
    listed = ", ".join(f"{size} {v * 1e3:.0f} ms" for size, v in vals.items())
    exp = [r["exposed_by_axis"]["dp"] for r in picked.values()]
    fp32_grad_bytes = 4  # the H100 rows' main gradients (module docstring: fp32 under bf16)
    return (f" Taken together, the published step less the predicted step without its exposed data-parallel "
            f"time comes to {min(vals.values()) * 1e3:.0f}-{max(vals.values()) * 1e3:.0f} ms per 10^9 "
            f"parameters a GPU holds on all four rows without pipelining ({listed}), whatever share of "
            f"the NICs their dp groups have (8, 4, 2 and 1 GPUs per node), while the modelled exposure "
            f"runs from {exp[0] * 1e3:.0f} to {exp[-1] * 1e3:.0f} ms: what the real runs add beyond "
            "the blocks follows the parameters a GPU holds (within a factor of two), not the network -- "
            "a lead, not a model (the gradient buffer's scaling before the reduction, "
            f"{megatron_grad_scaling_bytes(fp32_grad_bytes)} bytes per parameter, is already counted).")


def _span(rows: list[dict], family: str, which: int) -> str:
    """Signed error range of a row family, as the report's headings quote it: ``family`` the id
    prefix; ``which`` 1 = the rows with pp = 1 (A100) or tp <= 4 (H100), 2 = pp > 1 (A100),
    8 = tp = 8 (H100)."""
    sel = [r for r in rows if r["id"].startswith(family)]
    if family == "megatron21":
        sel = [r for r in sel if (r["pp"] == 1) == (which == 1)]
    else:
        sel = [r for r in sel if (r["tp"] == 8) == (which == 8)]
    lo, hi = min(100 * r["error"] for r in sel), max(100 * r["error"] for r in sel)
    return f"{lo:+.1f}% to {hi:+.1f}%"


def _a100_clock_sentence() -> str:
    """The A100 profile's measured sustained rate over the model's burst at the same shape."""
    from parsim.cluster.hardware import load_profile
    sustained, burst = load_profile("dgx-a100-80g").device.kernels.msmf
    return f"{sustained:g} TFLOP/s over the {burst:g} the GEMM model gives that shape in a burst: {sustained / burst:.3f}"


def _classic_span(classic: list[dict], mode: str, piped: bool) -> str:
    errs = [100 * r["error"] for r in classic if r["mode"] == mode and (r["pp"] > 1) == piped]
    return ", ".join(f"{e:+.1f}%" for e in errs) if errs else "n/a"


SAME_BLOCK = ("megatron21-table1-18B", "korthikanti-table5-22B")
"""Two measured runs of the same 6144-wide GPT block on the same machine (Selene's DGX A100 80GB), tensor
parallel over 8 GPUs with every layer recomputed: Table 1's 18B (Megatron-LM of April 2021) and Table 5's
22B (Megatron-LM of 2022, full recomputation column)."""


def per_layer_sequence(step_s: float, case: dict) -> float:
    """Seconds of one step per layer and per sequence one data-parallel replica trains: the step over
    (layers x sequences per replica), so runs of one block but different depths and batches compare."""
    i = case["inputs"]
    return step_s / (i["layers"] * i["global_batch"] / i["dp"])


def same_block(rows: list[dict], classic: list[dict]) -> dict | None:
    """:data:`SAME_BLOCK`'s two runs per layer and sequence, measured and predicted: (table1_measured,
    table1_predicted, table5_measured, table5_predicted) seconds, or None if either row is missing."""
    t1_id, t5_id = SAME_BLOCK
    r1 = next((r for r in rows if r["id"] == t1_id), None)
    r5 = next((r for r in classic if r["id"] == t5_id and r["mode"] == "full"), None)
    c1 = next((c for c in load_cases() if c["id"] == t1_id), None)
    c5 = next((c for c in load_classic() if c["id"] == t5_id), None)
    if None in (r1, r5, c1, c5):
        return None
    return {"table1_measured": per_layer_sequence(r1["published_step_s"], c1),
            "table1_predicted": per_layer_sequence(r1["predicted_step_s"], c1),
            "table5_measured": per_layer_sequence(r5["published_step_s"], c5),
            "table5_predicted": per_layer_sequence(r5["predicted_step_s"], c5)}


def _same_block_sentence(rows: list[dict], classic: list[dict]) -> str:
    sb = same_block(rows, classic)
    if sb is None:
        return ""
    ms = {k: 1e3 * v for k, v in sb.items()}
    pred = sb["table1_predicted"] / sb["table5_predicted"] - 1.0
    meas = sb["table1_measured"] / sb["table5_measured"] - 1.0
    r1 = sb["table1_measured"] / sb["table1_predicted"] - 1.0
    r5 = sb["table5_measured"] / sb["table5_predicted"] - 1.0
    return ("One block, measured twice. Table 1's 18B and Table 5's 22B share the 6144-wide block, the machine, "
            "tensor parallelism over 8 GPUs and full recomputation; per layer and per sequence a replica trains "
            f"the 2021 run took {ms['table1_measured']:.2f} ms and the 2022 run {ms['table5_measured']:.2f} ms "
            f"({100 * meas:+.1f}%). parsim predicts {ms['table1_predicted']:.2f} and {ms['table5_predicted']:.2f} ms "
            f"({100 * pred:+.1f}%): the 2021 configuration does less per layer-sequence (48 heads of 128 against 64 "
            "of 96, so fewer s x s scores; microbatches of 8 against 4; the optimizer step spread over 32 "
            "sequences against 4), while its input-gradient all-reduces block where the 2022 code runs them "
            "beside the weight-gradient GEMMs (`overlap.tp_grad_allreduce`, Megatron-LM 3f65246911, September "
            "2021). Measured, the 2021 run cost as much per layer-sequence as the 2022 run. So of Table 1's "
            f"{100 * r1:+.1f}%, {100 * r5:+.1f}% is common to both runs -- the kernels' or costs both codes share "
            f"-- and {100 * (r1 - r5):+.1f} points are the 2021 code's own, a year before the changes Table 5's runs "
            "carried besides that overlap (gradient accumulation fused into the weight-gradient GEMM and Apex's "
            "persistent LayerNorm kernel, October 2021, both of which parsim models). `same_block` computes this "
            "from the two rows.\n\n")


def _classic_section(classic: list[dict], summary: dict, rows: list[dict]) -> str:
    """The held-out classic rows and what they say, computed from them."""
    return ("## Held out: Korthikanti et al. 2022 Table 5 (Megatron-LM, A100)\n\n"
            "Measured iteration times of four GPT models (22B on 8 GPUs to 1T on 512), each with full "
            "activation recomputation and with sequence parallelism + selective recomputation. No "
            "part of the model was fitted or checked against them before they were added here "
            "(`benchmarks/fidelity.py` runs them beside the table above; `load_classic`). Error = "
            "published / predicted - 1.\n\n" + classic_table(classic) + "\n\n"
            f"MAPE {summary['mape_classic_pct']:.1f}%. Full recomputation: "
            f"{_classic_span(classic, 'full', False)} without pipeline parallelism, "
            f"{_classic_span(classic, 'full', True)} with it; sequence parallelism + selective: "
            f"{_classic_span(classic, 'seq+sel', False)} and {_classic_span(classic, 'seq+sel', True)}. "
            "parsim predicts the recomputation's saving larger than measured: what selective "
            "recomputation and sequence parallelism cost beyond the attention core's forward (the "
            "sequence-parallel all-gathers redone for the weight gradients, the layer norms and "
            "dropouts on 1/t of the tokens) is where the rows differ, not identified. What the "
            "pipelined rows leave: PTD-P's scatter/gather of the pipeline sends (each tensor-parallel "
            "rank sends 1/t of the activation, then an NVLink all-gather: Narayanan et al. 2021 "
            "Sec. 4.1, `--scatter-gather-tensors-in-pipeline`, on by default in that code) is not "
            "modelled: parsim sends the whole activation from every tensor-parallel rank when "
            "sequence parallelism is off. Modelled, it would move the full-recomputation pipelined "
            f"rows ({_classic_span(classic, 'full', True)}) and Table 1's pipelined rows (above) to the "
            "fast side alike, where the sequence-parallel pipelined rows (whose sends are already 1/t) "
            "are; it stays out until the rows say which way the rest of the pipeline's cost goes.\n\n"
            + _same_block_sentence(rows, classic))


def _report(rows: list[dict], summary: dict, classic: list[dict]) -> str:
    fit_ids = set(summary["fit_rows"])
    first = [r for r in rows if r["id"] in fit_ids]
    other = [r for r in rows if r["id"] not in fit_ids]
    try:
        held = heldout_summary()
    except Exception as exc:  # the held-out set needs every preset; say so rather than fail the report
        held = {"error": str(exc)}
    held_lines = ["| category | rows before | MAPE before | MAPE now, same rows | rows now | MAPE now, all rows |",
                  "|---|---|---|---|---|---|"]
    for cat, (n_before, before) in HELDOUT_BEFORE.items():
        now = held.get(cat)
        cells = (f"{now[2]:.1f}% | {now[0]} | {now[1]:.1f}%" if isinstance(now, tuple) else "n/a | n/a | n/a")
        held_lines.append(f"| {cat} | {n_before} | {before:.1f}% | {cells} |")
    return ("# Fidelity: predicted vs published throughput\n\n"
            "Generated by `python benchmarks/fidelity.py --markdown reports/fidelity.md`.\n\n"
            + (__doc__.split("Rules", 1)[1].join(["Rules", ""]) if "Rules" in __doc__ else "") + "\n\n"
            "## No fitted factor\n\n"
            "Nothing in this model is fitted to these rows. `device.sustained_fraction` (0.82 for "
            "dgx-a100-80g, 0.67 for dgx-h100, fitted here on every other row) is removed; every "
            "kernel's time comes from a kernel model whose numbers come from kernel measurements "
            "(MAMF per GPU and precision, stas00/ml-engineering) or kernel papers (FlashAttention-2/3 "
            "TFLOP/s by sequence length), memory-bound ops from their bytes at HBM bandwidth, and one "
            "documented host time per kernel launch. One number is a documented fit, of one physically "
            "named quantity on data outside this table: the fraction of HBM bandwidth the A100's "
            "memory-bound layer kernels reach (`device.layer_memory_efficiency`, 0.725 against a copy's "
            "0.85), fitted on the per-layer forward and backward times of Korthikanti et al. 2022 Table 4 "
            "(`benchmarks/fit_layer_memory.py`, reports/fit-layer-memory.md); every row here and Table 5 "
            "below are held out of it. The two halves below are the rows the old "
            "factor was fitted on and the rows it never saw; neither is fitted now.\n\n"
            "### Rows the retired factor was fitted on\n\n" + table(first) + "\n\n"
            "### The other rows\n\n" + table(other) + "\n\n"
            f"MAPE now: Megatron-LM 2021 Table 1 (A100) **{summary['mape_a100_pct']:.1f}%** "
            f"(before {BEFORE['a100']:.1f}% with the factor), Megatron-Core weak scaling (H100) "
            f"**{summary['mape_h100_pct']:.1f}%** (before {BEFORE['h100']:.1f}%), all rows "
            f"{summary['mape_all_pct']:.1f}% (before {BEFORE['all']:.1f}%). On the rows the factor was "
            f"fitted on: A100 {summary['mape_a100_fitrows_pct']:.1f}%, H100 {summary['mape_h100_fitrows_pct']:.1f}%; "
            f"on the others: A100 {summary['mape_a100_heldout_pct']:.1f}%, H100 {summary['mape_h100_heldout_pct']:.1f}%. "
            f"A100 rows without pipeline parallelism (1.7B-18B): {summary['mape_a100_no_pipeline_pct']:.1f}%.\n\n"
            + (f"With the GEMM maxima measured on an H200 (profile `{summary['calibrated_profile']}`, "
               "reports/gpu/h200: BF16 MAMF 815.9 TFLOP/s at 2048x2048x13312, FP8 1442.3; the H200 is the H100's "
               "compute) in place of the published H100 MAMF, the H100 rows are "
               f"**{summary['mape_h100_calibrated_pct']:.1f}%** and all rows {summary['mape_all_calibrated_pct']:.1f}% "
               f"(shipped profile: {summary['mape_h100_pct']:.1f}% and {summary['mape_all_pct']:.1f}%).\n\n"
               if "calibrated_profile" in summary else "")
            + "## Where it lands, and why\n\n"
            f"The 5% aim: {summary['mape_all_pct']:.1f}% over the 19 rows. Errors are predicted over published TFLOP/s, less 1: + means parsim "
            "predicts the run faster than it ran. What the factor hid, row family by row family:\n\n"
            f"* **A100, no pipeline (1.7B-18B): {_span(rows, 'megatron21', 1)}, no factor.** Run as Megatron-LM's own "
            "script for this table runs them (`examples/academic_paper_scripts/sc21/run_table_1.sh` at the paper's "
            "commit 6985e589, `SC21_TABLE_1` above): microbatches of 16, 16, 16 and 8 sequences (one microbatch a "
            "step for 1.7B-7.5B, four for 18B) and PyTorch DDP, whose 25 MiB buckets all-reduce under the last "
            "backward. Until this round these rows ran with microbatches of one sequence (an assumption where the "
            "script was not read), which charged 8-16x the per-microbatch costs (the unfused dW accumulation "
            "into `main_grad`, launches, the embedding's dense gradient pass) and the gradient all-reduce after the "
            "backward, and so hid the compute model's optimism: A100 MAPE 4.3% then. The kernel models: GEMMs at "
            "their shapes against the A100 MAMF at the power-limited clock below (255 TFLOP/s on these layers' "
            "GEMMs), the unfused attention core's batched GEMMs in one strided-batched launch, its s x s scores "
            "through HBM with dropout and Megatron's fused upper-triangular softmax, which reads only the causal "
            "half of each row (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h, March 2021). The "
            "scores' passes are the largest memory-bound term (a third of a 1.7B layer's forward); they, the "
            "norms and the dropouts run at the fraction of HBM bandwidth the layer kernels reach. No "
            "microbenchmark of those 2021-22 kernels on an A100 is published, so that one number is fitted on "
            "Korthikanti et al.'s per-layer Table 4 (the same block family, 2022 code: ten times, each within "
            "1.2% after the fit, all 3-5% short at a copy's rate): 0.725. These rows are held out of that fit; "
            "they were 6.6% at a copy's rate. The norms are the 2021 code's own: Apex's FusedLayerNorm "
            "(megatron/model/fused_layer_norm.py at 6985e589; the persistent FastLayerNorm came with a2fdcdf061 "
            "in October 2021), which apex #1037 timed at 1.40x (forward) and 2.04x (backward) the persistent "
            "kernel on the same GA100 tensor (`training.persist_layer_norm = false`): 3.8% with the persistent "
            "norm the code did not have yet. What is left on the 18B row: below, 'One block, measured twice'.\n"
            f"* **A100 with pipeline parallelism (39B-1T): {_span(rows, 'megatron21', 2)}.** The same script "
            "sets the microbatch (4, 2, 2, 1, 1, 1 sequences), interleaving only where it says so "
            "(`--num-layers-per-virtual-pipeline-stage`: 76B, 145B, 310B and 530B; 39B and 1T plain 1F1B) and "
            "Megatron's local DDP (every model chunk all-reduced after the pipeline has flushed). The clock: "
            "a matmul on random data holds an A100 at its 400 W limit. Horace He measured an 8192^3 "
            "cuBLAS matmul at 257-258 TFLOP/s with torch.randn inputs and at 295 on all-zero inputs, "
            "which flip too few transistors to reach the limit (thonking.ai, 2024). The A100 profiles' "
            f"sustained pair ({_a100_clock_sentence()}) runs every compute-bound kernel at that clock. "
            "Megatron's pipeline sends "
            "block (its `_communicate` waits on the batch_isend_irecv requests and synchronises: "
            "`overlap.p2p = false`).\n"
            f"* **H100 Megatron-Core: {_span(rows, 'megatron-core', 1)} (tp <= 4), {_span(rows, 'megatron-core', 8)} "
            "(tp = 8).** The GEMM model is checked against "
            "OpenXLA's measured H100 table (64 shapes, held-out MAPE 6%, tests/test_gemm_tables.py), "
            "so the gap is not the GEMM in isolation. What the old factor (0.67) stood for, piece by "
            "piece, each from a source and none fitted: the largest is the clock. A chip held at its "
            "power limit, as in training, runs compute-bound kernels at the maximum *sustainable* "
            "matmul rate (MSMF), not the burst rate microbenchmarks and kernel papers report: one "
            "mamf-finder run on all 8 GPUs of a node at once (stas00/ml-engineering) measured 698.6 "
            "against a 823.9 TFLOP/s burst (0.848, `device.msmf_bf16_tflops`), which took the H100 "
            "MAPE from 21.1% to 9.2%. " + _slowest_chip_sentence(rows) + " The others: Megatron's op-by-op fp32 cross-entropy over the 131k "
            "vocabulary (34 + 14 bytes per logit, `training.cross_entropy_fusion`); the overlapped "
            "distributed-optimizer gather waiting bucket by bucket under the first forward; each GEMM "
            "kernel's fixed ~4 us; attention through the kernel Transformer Engine calls on Hopper "
            "(cuDNN, fitted to the FlashAttention-3 paper's cuDNN bars); gradients reduced in fp32 "
            "under bf16 (core_r0.8.0's arguments.py) with the NDR NIC at the 46-48 GB/s NCCL's "
            "maintainers state; --tp-comm-overlap as Transformer Engine runs it (QKV's and FC1's "
            "forward and the projection's and FC2's input gradients as one GEMM per TP rank's slice, "
            "the projection's and FC2's forward as 4, round-robin on 3 compute streams: "
            "`parsim.costs.inputs.tp_overlap_splits`); and the SMs the overlapped communication holds "
            "(NCCL's 24 CTAs inside a node and 16 across nodes, userbuffers' 1-24 per overlap method: "
            "`parsim.cluster.contention`, 22% slower when fully overlapped on an H100 against 18.9% "
            "measured on average by Lee et al. 2025).\n"
            f"  What is left: the 1.7B and 7.1B rows (tp <= 2) are {_err(rows, 'megatron-core-h100-weak-1.7B')} and "
            f"{_err(rows, 'megatron-core-h100-weak-7.1B')} -- compute, not communication (exposed communication "
            f"{_comm_share(rows, 'megatron-core-h100-weak-1.7B')} and {_comm_share(rows, 'megatron-core-h100-weak-7.1B')} "
            "of the predicted step). The model's blocks there are small (hidden 2048 "
            "and 4096/2 per GPU) and nothing in it charges the framework's host time per Transformer "
            "Engine module beyond one launch per kernel; no source gives that time, so it is not "
            f"fitted. The 32B row (tp = 8) is {_err(rows, 'megatron-core-h100-weak-32B')} "
            f"({_step(rows, 'megatron-core-h100-weak-32B')}): its data-parallel reduce-scatter (one GPU "
            "per node, 4 bytes per gradient through one NIC, hidden only under the last microbatch's "
            "backward: Megatron's no_sync) is its largest exposed cost, while the 16B row, the same "
            "FLOPs per GPU with two GPUs per node in each dp group, is published only 0.045 s faster: "
            "something hides more of that reduction in the real run, not identified (a strict xfail in "
            "tests/test_fidelity.py)." + _per_param_sentence(rows) + " A measurement on an H100 (the "
            "issue's 'ground truth on a real GPU') is what would settle both.\n\n"
            + _classic_section(classic, summary, rows) +
            "## Kernels the cost model runs (TFLOP/s)\n\n"
            "GEMM columns: M x N x K through the kernel model (tiles, waves, Stream-K, calibrated to the "
            "MAMF at its measured shape). Attention: causal, 32 heads x 128, 8 KV heads, batch 1, by the "
            "device's kernel (FlashAttention-2 on A100, -3 on Hopper, -4 on Blackwell), forward / "
            "backward; bf16. All at the power-saturated clock a training run holds (the MAMF column is the "
            "burst measurement the model is calibrated to); the low-precision column is the 8192^3 GEMM "
            "at FP8, MXFP8 and NVFP4 where the GPU has them.\n\n" + kernel_table() + "\n\n"
            "## Held-out modern set (benchmarks/fidelity_heldout.py), before and after\n\n"
            "Before: with the shape GEMM model, one attention efficiency and the fitted factor. Now: "
            "the cost model of the tree that generated this report (this round's other work on MoE, "
            "context and data parallelism moves these rows too). 'Same rows': the rows that were "
            "expressible then; 'all rows' adds those that profiles added since make expressible "
            f"({', '.join(HELDOUT_NEW_PROFILES)}), the mixtral-8x22b preset, the NeMo B200 "
            "long-sequence rows, whose GPU count the data set takes from their layout (the page's "
            "column is 4x it in every row), and the rows added since (Megatron-Bridge's 26.06 and "
            "26.06.01 pre-training tables, and its Nemotron 3 rows: hybrid Mamba-2 models, Super's "
            "and Ultra's with LatentMoE and multi-token prediction). Full rows: "
            "reports/fidelity-heldout.md.\n\n"
            + "\n".join(held_lines) + "\n")


if __name__ == "__main__":
    main()
