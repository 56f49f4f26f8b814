"""parsim against what ``benchmarks/gpu/measure.py`` measured on one GPU: ``accuracy.json`` and
``accuracy.md`` beside the CSVs, regenerated from them alone (no GPU needed).

    python benchmarks/gpu/accuracy.py [--dir reports/gpu/h200] [--hardware dgx-h200]

Rows (``accuracy.json``: a list; every row has ``case`` and ``kind``):

* ``gemm`` / ``attention`` / ``elementwise``: ``predicted_s`` (the kernel model's burst time, what
  ``parsim kernel`` prints first and what the tests hold it to), ``predicted_sustained_s`` (the
  same kernel at the power-saturated clock the profile's MSMF/MAMF ratio gives), ``measured_s``
  (the median of the timed launches); ``sm_clock_mhz``, the median SM clock nvidia-smi sampled
  while the row was timed, where the CSV rows carry their time (measure.py writes ``t_unix`` since
  the first H200 run, whose GEMM sweep sat at the 700 W cap, 1,440-1,845 MHz, unrecorded per row);
* ``layer``: one block's forward (``F``), whole backward (``B``) and input-gradient backward
  (``I``) as parsim's cost model prices them (``layer_w``: the weight gradient ``W``, measured as
  B - I, a difference of two medians) inside ``parsim simulate`` (the per-layer difference
  of a 2-layer and a 1-layer one-GPU job: embedding and head cancel), against the measured block:
  the eager (Hugging Face op-for-op) block against ``training.fused_kernels = false``, the
  compiled block (norm, rotary, SwiGLU and residual as one generated kernel each) against
  ``fused_kernels = true``; SDPA's cuDNN backend against ``attention_kernel = "cudnn"``;
* ``memory``: ``predicted_bytes`` (the block's activation stash, parsim.costs.memory) against
  ``measured_bytes``: what the block keeps in a stack, from ``torch.cuda.memory_allocated`` after
  one forward minus before, less the block's output (the next block's input) plus its input where
  the block keeps it (fused-style norms and checkpoints do; the eager norm keeps its fp32 upcast
  instead).

Nothing is fitted here; the profile is used as it ships.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from parsim.cluster.hardware import load_profile  # noqa: E402
from parsim.costs import memory_ops as mo  # noqa: E402
from parsim.model import ModelSpec  # noqa: E402

LAYER_MODELS = {  # measure.py's LAYERS, as ModelSpecs of one TP rank's block
    "llama3-8b": dict(d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336, head_dim=128),
    "llama3-70b-tp8": dict(d_model=8192, n_heads=8, n_kv_heads=1, d_ff=3584, head_dim=128),
}
LAYER_MODELS.update({  # measure.py's GPT_LAYERS: Megatron-Core GPT blocks on one TP rank
    "mcore-gpt-1.7b": dict(d_model=2048, n_heads=16, n_kv_heads=16, d_ff=8192, head_dim=128),
    "mcore-gpt-7.1b-tp2": dict(d_model=4096, n_heads=16, n_kv_heads=16, d_ff=8192, head_dim=128),
})
LLAMA = dict(ffn="swiglu", position="rope", norm="rmsnorm", bias=False, tied_embeddings=False, vocab_size=32768)
GPT = dict(ffn="gelu", position="rope", norm="layernorm", bias=True, tied_embeddings=False, vocab_size=131072)
"""The Megatron-Core GPT of the weak-scaling table (the mcore-gpt-* presets); its blocks run dropout."""


def _family(name: str) -> dict:
    return GPT if name.startswith("mcore-gpt") else LLAMA
STYLE_FUSED = {"eager": False, "compiled": True, "fused": True}
"""The measured block style -> parsim's ``training.fused_kernels``."""
TIMED_STYLES = ("eager", "compiled")
"""Styles whose times are layer rows: the ``fused`` style (fused kernels' saved tensors, eager
arithmetic inside autograd functions) is no framework's speed, a memory case only."""
BACKEND_KERNEL = {"cudnn": "cudnn", "flash": "fa2"}
"""SDPA backend -> parsim's attention implementation (torch's flash backend is FlashAttention-2)."""


def _rel(p: float, m: float) -> float:
    return p / m - 1.0


# ---------------------------------------------------------------- clocks
def read_clocks(path: Path) -> pd.DataFrame | None:
    """``clocks.csv`` (nvidia-smi's ``timestamp`` in the machine's time, UTC on the device machines)
    as ``t_unix``, ``sm_mhz``, ``power_w`` rows; None when there is none."""
    if not path.is_file():
        return None
    c = pd.read_csv(path, skipinitialspace=True)
    c.columns = [x.strip() for x in c.columns]
    t = pd.to_datetime(c["timestamp"], format="%Y/%m/%d %H:%M:%S.%f", utc=True)
    secs = (t - pd.Timestamp("1970-01-01", tz="UTC")).dt.total_seconds()  # whatever unit pandas parsed to
    return pd.DataFrame({"t_unix": secs, "sm_mhz": pd.to_numeric(c.iloc[:, 1], errors="coerce"),
                         "power_w": pd.to_numeric(c.iloc[:, 3], errors="coerce")})


def row_clocks(rows: pd.DataFrame, clocks: pd.DataFrame | None) -> list[float | None]:
    """Median SM clock (MHz) over each row's window: from the row before it was written to its own
    write time (``t_unix``, measure.py records it), the nearest sample when none falls inside.
    None without timestamps or clocks (data measured before rows carried their time)."""
    if clocks is None or "t_unix" not in rows.columns or clocks.empty:
        return [None] * len(rows)
    out, prev = [], None
    ts, mhz = clocks["t_unix"].to_numpy(), clocks["sm_mhz"].to_numpy()
    for t in rows["t_unix"]:
        lo = prev if prev is not None else t - 1.0
        inside = mhz[(ts > lo) & (ts <= t)]
        out.append(float(statistics.median(inside)) if len(inside) else float(mhz[abs(ts - t).argmin()]))
        prev = t
    return out


# ---------------------------------------------------------------- kernels
def timed_rows(d: Path, name: str, clocks: pd.DataFrame | None):
    """``name``'s CSV rows, each with its SM-clock field (``{"sm_clock_mhz": ...}`` where the rows
    carry their time, else empty)."""
    df = pd.read_csv(d / name)
    for r, mhz in zip(df.itertuples(), row_clocks(df, clocks)):
        yield r, ({"sm_clock_mhz": mhz} if mhz is not None else {})


def gemm_rows(d: Path, hw, clocks: pd.DataFrame | None) -> list[dict]:
    from parsim.cluster.kernels import grouped_gemm_time
    out = []
    for r, clock in timed_rows(d, "gemm.csv", clocks):
        prec = "bf16" if r.precision in ("bf16", "bfloat16") else r.precision
        if r.group == "grouped":
            problems = ((int(r.rows_per_expert), int(r.n), int(r.k)),) * int(r.experts)
            pb, ps = (grouped_gemm_time(dev, problems, prec) for dev in (hw.device.burst(), hw.device))
        else:
            pb, ps = (dev.kernel_gemm_plan(int(r.m), int(r.n), int(r.k), prec)["time_s"]
                      for dev in (hw.device.burst(), hw.device))
        out.append({"case": f"gemm {r.group} {r.case} {prec}", "kind": "gemm", "group": r.group, "precision": prec,
                    "shape": [int(r.m), int(r.n), int(r.k)], "predicted_s": pb, "predicted_sustained_s": ps,
                    "measured_s": float(r.time_s), "measured_tflops": float(r.tflops), **clock})
    return out


def attention_rows(d: Path, hw, clocks: pd.DataFrame | None) -> list[dict]:
    out = []
    for r, clock in timed_rows(d, "attention.csv", clocks):
        if r.pass_ == "error":
            continue
        args = (int(r.batch), int(r.seq), int(r.seq), int(r.heads), int(r.kv_heads), int(r.head_dim), bool(r.causal),
                r.pass_ == "bwd", "bf16", BACKEND_KERNEL[r.backend])
        pb, ps = (dev.attention_kernel_time(*args) for dev in (hw.device.burst(), hw.device))
        out.append({"case": f"attention {r.backend} {r.pass_} b{r.batch} s{r.seq} h{r.heads}/{r.kv_heads} "
                            f"d{r.head_dim}{' causal' if r.causal else ''}", "kind": "attention",
                    "backend": r.backend, "pass": r.pass_, "seq": int(r.seq), "head_dim": int(r.head_dim),
                    "causal": bool(r.causal), "gqa": int(r.kv_heads) != int(r.heads),
                    "predicted_s": pb, "predicted_sustained_s": ps,
                    "measured_s": float(r.time_s), "measured_tflops": float(r.tflops), **clock})
    return out


def _work(case: str, variant: str, tokens: int) -> tuple[mo.MemoryWork, mo.MemoryWork] | None:
    """parsim's (forward, backward) memory-bound work for one measured elementwise case: the
    pieces ``parsim.costs.memory_ops`` prices inside a block, on measure.py's shapes (Llama-3-8B:
    d 4096, 32/8 heads of 128, d_ff 14336; GeLU at the same width)."""
    spec = ModelSpec(name="ew", n_layers=1, max_seq_len=tokens, **LAYER_MODELS["llama3-8b"], **LLAMA)
    gelu = ModelSpec(name="ew", n_layers=1, max_seq_len=tokens, **LAYER_MODELS["llama3-8b"],
                     **{**LLAMA, "ffn": "gelu"})
    ln = ModelSpec(name="ew", n_layers=1, max_seq_len=tokens, **LAYER_MODELS["llama3-8b"],
                   **{**LLAMA, "norm": "layernorm"})
    fused = variant in ("compiled", "native")
    pick = {"rmsnorm": (spec, "norm"), "layernorm": (ln, "norm"), "swiglu": (spec, "activation"),
            "gelu": (gelu, "activation"), "rotary": (spec, "rotary"), "residual": (spec, "residual")}
    if case not in pick:
        return None
    s, piece = pick[case]
    f = mo.forward_pieces(s, tokens, 1, False, 2.0, fused, False)[piece]
    if case == "residual":  # the piece is both of a block's adds (fused: bias-dropout-add); one add here
        f = mo.MemoryWork(3 * tokens * s.d_model * 2.0, 1)
    return f, f.scaled(2)


def elementwise_rows(d: Path, hw) -> list[dict]:
    burst, sus = hw.device.burst(), hw.device
    out = []
    for r in pd.read_csv(d / "elementwise.csv").itertuples():
        case, variant, tokens = r.case, r.variant, int(r.tokens)
        if case == "copy":
            w = mo.MemoryWork(float(r.bytes), 1)
        elif case.startswith("cross_entropy"):
            vocab = int(case.split("v")[-1])
            fw, bw = mo.loss_work(tokens * vocab, 2.0, False, False)
            w = fw if r.pass_ == "fwd" else bw
        elif case.startswith("adamw"):  # fp32 params, grads, m, v: parsim.costs.dp's fp32 step bytes,
            n = int(case.split()[-1])  # 2k + g + 2w with k = 8 (m, v), g = 4, w = 4: read p, g, m, v, write p, m, v
            pb = burst.optimizer_time(n * (2 * 8 + 4 + 2 * 4)) + burst.kernel_launch_s
            ps = sus.optimizer_time(n * (2 * 8 + 4 + 2 * 4)) + sus.kernel_launch_s
            out.append({"case": f"elementwise {case} {variant} {r.pass_}", "kind": "elementwise", "op": case,
                        "variant": variant, "predicted_s": pb, "predicted_sustained_s": ps, "measured_s": float(r.time_s)})
            continue
        else:
            pair = _work(case, variant, tokens)
            if pair is None:
                continue
            w = pair[0] if r.pass_ == "fwd" else pair[1]
        p = [mo.work_time(dev, w) + w.kernels * dev.kernel_launch_s for dev in (burst, sus)]
        out.append({"case": f"elementwise {case} {variant} {r.pass_}", "kind": "elementwise", "op": case.split()[0],
                    "variant": variant, "bytes_model": w.bytes, "kernels_model": w.kernels,
                    "predicted_s": p[0], "predicted_sustained_s": p[1], "measured_s": float(r.time_s)})
    return out


# ---------------------------------------------------------------- layers
def _doc(name: str, seq: int, n_layers: int, hardware: str, fused: bool, kernel: str, recompute: str) -> dict:
    return {"name": f"gpu-{name}", "hardware": hardware, "gpus": 1,
            "model": dict(LAYER_MODELS[name], **_family(name), n_layers=n_layers, max_seq_len=seq),
            "training": {"global_batch": 1, "microbatch_size": 1, "seq_len": seq, "precision": "bf16",
                         "flash_attention": True, "recompute": recompute, "fused_kernels": fused,
                         "attention_kernel": kernel, "dropout": name.startswith("mcore-gpt")}}


def head_rows(d: Path, hardware: str) -> list[dict]:
    """measure.py's ``head.csv``: the LM head GEMM and Megatron's op-by-op fp32 cross-entropy,
    forward and whole backward, against ``parsim.costs.stage.head_cost`` (sustained clock)."""
    from parsim.costs.inputs import cost_inputs, layer_inputs
    from parsim.costs.stage import head_cost
    from parsim.scenario import scenario_from_dict

    path = d / "head.csv"
    if not path.exists():
        return []
    rows = []
    for r in pd.read_csv(path).itertuples():
        doc = {"name": "gpu-head", "hardware": hardware, "gpus": 1,
               "model": dict(LAYER_MODELS["mcore-gpt-1.7b"], **dict(GPT, vocab_size=int(r.vocab)), n_layers=1,
                             d_model=int(r.d_model), max_seq_len=int(r.tokens)),
               "training": {"global_batch": 1, "microbatch_size": 1, "seq_len": int(r.tokens), "precision": "bf16",
                            "fused_kernels": True}}
        c = head_cost(layer_inputs(cost_inputs(scenario_from_dict(doc, "gpu"))))
        pred = c.forward.total if r.pass_ == "fwd" else c.backward_input.total + c.backward_weight.total
        rows.append({"case": f"head {r.case} {r.pass_}", "kind": "head", "pass": r.pass_, "predicted_s": pred,
                     "measured_s": float(r.time_s)})
    return rows


def predicted_layer(name: str, seq: int, hardware: str, fused: bool, kernel: str, recompute: str) -> dict:
    """One block's F, B (whole backward, recompute included), I (input gradient) seconds and
    activation bytes as ``parsim simulate`` prices them, with its compute breakdown."""
    from parsim.costs.compute import block_compute
    from parsim.costs.inputs import cost_inputs, layer_inputs
    from parsim.costs.layer import block_gemms
    from parsim.costs.model_costs import ModelCosts
    from parsim.scenario import scenario_from_dict
    from parsim.schedule.ir import Op

    mcs = [ModelCosts.from_scenario(scenario_from_dict(_doc(name, seq, n, hardware, fused, kernel, recompute), "gpu"))
           for n in (1, 2)]
    ops = [m.stage_ops(0) for m in mcs]
    per = {op.name: ops[1][op].duration_s - ops[0][op].duration_s for op in (Op.F, Op.B, Op.I, Op.W)}
    per["activation_bytes"] = mcs[1].stage_costs[0].activation_bytes - mcs[0].stage_costs[0].activation_bytes
    inp = layer_inputs(cost_inputs(scenario_from_dict(_doc(name, seq, 1, hardware, fused, kernel, "none"), "gpu")))
    bc = block_compute(inp, block_gemms(inp, False), False)
    per["breakdown_s"] = {"F": {"gemm": bc.gemm[0], "attention": bc.attention[0], "memory": bc.memory[0]},
                          "I": {"gemm": bc.gemm[1], "attention": bc.attention[1], "memory": bc.memory[1]},
                          "W": {"gemm": bc.gemm[2]}, "kernels": list(bc.kernels)}
    return per


def layer_rows(d: Path, hardware: str) -> list[dict]:
    rows = []
    df = pd.read_csv(d / "layers.csv")
    for (name, seq, style, backend, rc), g in df.groupby(["layer", "seq", "style", "backend", "recompute"], sort=False):
        by = {r.pass_: r for r in g.itertuples()}
        fused = STYLE_FUSED[style]
        pred = predicted_layer(name, int(seq), hardware, fused, BACKEND_KERNEL[backend], rc)
        tag = f"{name} seq {seq} {style} {backend} recompute {rc}"
        if style in TIMED_STYLES:
            for pass_, op in (("fwd", "F"), ("bwd", "B"), ("bwd_input", "I")):
                if pass_ in by:
                    rows.append({"case": f"layer {tag} {op}", "kind": "layer", "layer": name, "seq": int(seq),
                                 "style": style, "backend": backend, "recompute": rc, "pass": op,
                                 "fused_kernels": fused, "predicted_s": pred[op], "measured_s": float(by[pass_].time_s),
                                 "breakdown_s": pred["breakdown_s"]})
            if "bwd" in by and "bwd_input" in by:  # the weight gradient: no pass of its own to time
                rows.append({"case": f"layer_w {tag} W", "kind": "layer_w", "layer": name, "seq": int(seq),
                             "style": style, "backend": backend, "recompute": rc, "pass": "W", "derived": "B - I",
                             "fused_kernels": fused, "predicted_s": pred["W"],
                             "measured_s": float(by["bwd"].time_s - by["bwd_input"].time_s)})
        m = by["fwd"]
        # the stash a block keeps in a stack: what its forward left allocated, less its output (the
        # next block's input), plus its own input where it keeps it (a fused norm and a checkpoint
        # keep it; the eager norm keeps its fp32 upcast instead, and nothing else holds the input)
        keeps_input = style != "eager" or rc == "full"
        stash = float(m.allocated_after_fwd_bytes - m.output_bytes + (m.input_bytes if keeps_input else 0))
        rows.append({"case": f"memory {tag}", "kind": "memory", "layer": name, "seq": int(seq), "style": style,
                     "backend": backend, "recompute": rc, "predicted_bytes": pred["activation_bytes"],
                     "measured_bytes": stash, "peak_forward_bytes": float(m.peak_fwd_bytes)})
    return rows


# ---------------------------------------------------------------- report
def _err(r: dict) -> float:
    if r["kind"] == "memory":
        return _rel(r["predicted_bytes"], r["measured_bytes"])
    return _rel(r["predicted_s"], r["measured_s"])


def mape(rows: list[dict]) -> float:
    return statistics.fmean(abs(_err(r)) for r in rows) if rows else float("nan")


def markdown(rows: list[dict], env: dict, hardware: str, shipped: str | None = None) -> str:
    pct = lambda x: f"{x:+.1%}"
    kinds = ["gemm", "attention", "elementwise", "layer", "layer_w", "head", "memory"]
    smi = env.get("nvidia_smi", "").splitlines()
    lines = [f"# parsim against one {env.get('device', 'GPU')}", "",
             f"Measured by `benchmarks/gpu/measure.py` (torch {env.get('torch')}, CUDA {env.get('cuda')}, "
             f"cuDNN {env.get('cudnn')}; driver, power limit, max SM / memory clock: {smi[-1] if smi else 'n/a'}); "
             "this file and `accuracy.json` are regenerated from the CSVs beside them by "
             f"`python benchmarks/gpu/accuracy.py`. Predictions: profile `{hardware}` (the measured numbers it "
             "states: MAMF BF16 / FP8, copy bandwidth, the fused AdamW step)"
             + (f", and the shipped `{shipped}` beside it" if shipped else "") + ". Error = predicted / measured - 1. "
             "Kernel rows are predicted at the burst clock (`parsim kernel`'s headline), the sustained-clock "
             "prediction beside; layer rows are the per-block F (forward), B (whole backward, recompute included) "
             "and I (input gradient) that `parsim simulate` prices (sustained clock); memory rows the block's "
             "activation stash.", "",
             "| kind | rows | MAPE | median error | within 5% | within 10% |" + (" MAPE, shipped profile |" if shipped else ""),
             "|---|---:|---:|---:|---:|---:|" + ("---:|" if shipped else "")]
    for k in kinds:
        rs = [r for r in rows if r["kind"] == k]
        if not rs:
            continue
        e = [_err(r) for r in rs]
        row = (f"| {k} | {len(rs)} | {mape(rs):.1%} | {pct(statistics.median(e))} | "
               f"{sum(abs(x) <= 0.05 for x in e)} | {sum(abs(x) <= 0.10 for x in e)} |")
        if shipped:
            key = "bytes" if k == "memory" else "s"
            row += f" {statistics.fmean(abs(_rel(r[f'predicted_shipped_{key}'], r[f'measured_{key}'])) for r in rs):.1%} |"
        lines.append(row)
    fit = [r["case"] for r in rows if r.get("used_by_profile")]
    lines += ["", f"Rows the `{hardware}` profile takes a number from (`used_by_profile`): {len(fit)} "
              f"({', '.join(fit)}); every layer and memory row is held out of it."]
    gpu = [r for r in rows if r["kind"] == "layer" and not r.get("host_bound")]
    lines += ["", f"Layer rows the GPU paced (without the host-bound ones, `host_bound`: measured backward under 1.5 "
              f"times the forward): {len(gpu)}, MAPE {mape(gpu):.1%}; eager blocks "
              f"{mape([r for r in gpu if r['style'] == 'eager']):.1%}, compiled blocks "
              f"{mape([r for r in gpu if r['style'] == 'compiled']):.1%}. Weight gradients (B - I) of those blocks: "
              f"{mape([r for r in rows if r['kind'] == 'layer_w' and not r.get('host_bound')]):.1%}."]
    sus = [r for r in rows if "predicted_sustained_s" in r]
    if sus:
        lines += ["", "At the sustained clock instead (the same kernel rows): "
                  + ", ".join(f"{k} {statistics.fmean(abs(_rel(r['predicted_sustained_s'], r['measured_s'])) for r in sus if r['kind'] == k):.1%}"
                              for k in kinds[:3] if any(r["kind"] == k for r in sus)) + " MAPE."]
    lines += ["", "## Layers", "", "| case | predicted (ms) | measured (ms) | error |", "|---|---:|---:|---:|"]
    for r in rows:
        if r["kind"] == "layer":
            lines.append(f"| {r['case'][6:]}{' (host-bound)' if r.get('host_bound') else ''} | {r['predicted_s'] * 1e3:.3f} | "
                         f"{r['measured_s'] * 1e3:.3f} | {pct(_err(r))} |")
    lines += ["", "## Weight gradients (derived)", "",
              "W has no pass of its own to time: measured W is the whole backward less the input-gradient "
              "backward (B - I), two medians from separate loops, so a few percent of noise in either is "
              "tens of percent here.", "", "| case | predicted (ms) | measured B - I (ms) | error |", "|---|---:|---:|---:|"]
    for r in rows:
        if r["kind"] == "layer_w":
            lines.append(f"| {r['case'][8:]}{' (host-bound)' if r.get('host_bound') else ''} | "
                         f"{r['predicted_s'] * 1e3:.3f} | {r['measured_s'] * 1e3:.3f} | {pct(_err(r))} |")
    lines += ["", "## Activation memory", "", "| case | predicted (MB) | measured (MB) | error |", "|---|---:|---:|---:|"]
    for r in rows:
        if r["kind"] == "memory":
            lines.append(f"| {r['case'][7:]} | {r['predicted_bytes'] / 1e6:.1f} | {r['measured_bytes'] / 1e6:.1f} | {pct(_err(r))} |")
    for k, title in (("gemm", "GEMMs"), ("attention", "Attention"), ("elementwise", "Memory-bound kernels")):
        lines += ["", f"## {title}", "", "| case | predicted (us) | sustained (us) | measured (us) | error |",
                  "|---|---:|---:|---:|---:|"]
        for r in rows:
            if r["kind"] == k:
                lines.append(f"| {r['case'][len(k) + 1:]} | {r['predicted_s'] * 1e6:.1f} | "
                             f"{r['predicted_sustained_s'] * 1e6:.1f} | {r['measured_s'] * 1e6:.1f} | {pct(_err(r))} |")
    return "\n".join(lines) + "\n"


def rows_for(d: Path, hardware: str) -> list[dict]:
    hw = load_profile(hardware)
    clocks = read_clocks(d / "clocks.csv")  # read once, joined to each kernel CSV's rows
    rows = (gemm_rows(d, hw, clocks) + attention_rows(d, hw, clocks) + elementwise_rows(d, hw)
            + layer_rows(d, hardware) + head_rows(d, hardware))
    _flag_host_bound(rows)
    return rows


def _flag_host_bound(rows: list[dict]) -> None:
    """Mark layer rows whose measurement the host, not the GPU, paced: a block whose measured whole
    backward is under 1.5 times its forward (the backward runs twice the forward's GEMM FLOPs and
    2.5 times its attention FLOPs, so a GPU-paced block measures 2x or more): that configuration's
    F, B and I rows."""
    meas = {}
    for r in rows:
        if r["kind"] == "layer":
            meas[(r["layer"], r["seq"], r["style"], r["backend"], r["recompute"], r["pass"])] = r["measured_s"]
    for r in rows:
        if r["kind"] in ("layer", "layer_w"):
            key = (r["layer"], r["seq"], r["style"], r["backend"], r["recompute"])
            r["host_bound"] = meas.get(key + ("B",), 1.0) < 1.5 * meas.get(key + ("F",), 0.0)


FIT_ROWS = ("elementwise copy eager fwd", "elementwise rmsnorm hf fwd", "elementwise rmsnorm hf bwd",
            "elementwise rotary hf fwd", "elementwise rotary hf bwd")
"""Rows ``dgx-h200-measured`` takes a number from (with the two MAMF grid maxima, the fused AdamW
row and the multi-expert grouped GEMMs at 4,096 tokens): marked ``used_by_profile``; every layer and
memory row, and the grouped GEMMs at 8,192 tokens, are held out of it."""


def _mark_fit(rows: list[dict], d: Path) -> None:
    gemm = pd.read_csv(d / "gemm.csv")
    best = {f"gemm mamf {r.case} {r.precision}" for prec in ("bf16", "fp8")
            for r in [gemm.loc[gemm[(gemm.group == "mamf") & (gemm.precision == prec)].tflops.idxmax()]]}
    for r in rows:
        c = r["case"]
        # grouped_gemm_setup_us: the multi-expert launches at 4,096 tokens (mixtral's is one expert)
        grouped_fit = c.startswith("gemm grouped") and " t4096 " in c and "mixtral" not in c
        if c in FIT_ROWS or c in best or grouped_fit or (c.startswith("elementwise adamw") and " fused " in c):
            r["used_by_profile"] = True


def build(d: Path, hardware: str, shipped: str | None = None) -> tuple[list[dict], str]:
    """Rows predicted with ``hardware`` (``predicted_s``) and, when given, with the ``shipped``
    profile beside (``predicted_shipped_s``), and the markdown report."""
    rows = rows_for(d, hardware)
    if shipped:
        for r, o in zip(rows, rows_for(d, shipped)):
            assert r["case"] == o["case"]
            key = "predicted_bytes" if r["kind"] == "memory" else "predicted_s"
            r[key.replace("predicted", "predicted_shipped")] = o[key]
    _mark_fit(rows, d)
    for r in rows:
        r["error"] = _err(r)
    env = json.loads((d / "env.json").read_text())
    return rows, markdown(rows, env, hardware, shipped)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=str(ROOT / "reports" / "gpu" / "h200"))
    ap.add_argument("--hardware", default="dgx-h200-measured", help="the profile predicted_s comes from")
    ap.add_argument("--shipped", default="dgx-h200", help="the profile predicted_shipped_s comes from ('' for none)")
    args = ap.parse_args(argv)
    d = Path(args.dir)
    rows, text = build(d, args.hardware, args.shipped or None)
    (d / "accuracy.json").write_text(json.dumps(rows, indent=1) + "\n")
    (d / "accuracy.md").write_text(text)
    print(text.split("\n## ")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
