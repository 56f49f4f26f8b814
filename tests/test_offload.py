"""Training with model states off the GPU ([offload]): ZeRO-Offload's CPU-Adam step and its
transfers as spans on their own streams, the delayed update, NVMe swaps, parameter and
activation offload, the states that leave the GPU, and the published figures
(tests/data/offload_published.json). Oracles: closed forms from the profile's numbers."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from parsim.cluster.hardware import load_profile
from parsim.config.offload import OffloadConfig
from parsim.costs.offload import CPU_ADAM_BYTES_PER_PARAM, largest_model_params, tiers
from parsim.model import total_params
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate

PUB = json.loads((ROOT / "tests" / "data" / "offload_published.json").read_text())
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def ten_b(**offload) -> dict:
    """DeepSpeed's ZeRO-Offload tutorial job: GPT-2 10B (50 x 4096) on one DGX-2 V100."""
    doc = {"name": "zero-offload-10b", "hardware": "dgx2-v100", "gpus": 1,
           "model": {"n_layers": 50, "d_model": 4096, "n_heads": 32, "d_ff": 16384, "vocab_size": 50257,
                     "ffn": "gelu"},
           "training": {"global_batch": 10, "microbatch_size": 10, "seq_len": 1024, "precision": "fp16",
                        "recompute": "full"},
           "parallel": {"zero": 2}}
    if offload:
        doc["offload"] = offload
    return doc


def run(doc):
    sc = scenario_from_dict(doc, "<test>")
    return sc, simulate(sc)


def spans(res, stream):
    tl = res.timeline
    return tl[tl["stream"] == stream]


def test_cpu_adam_and_transfers_are_spans_with_closed_form_lengths():
    sc, res = run(ten_b(optimizer="cpu"))
    hw = sc.hardware
    P = total_params(sc.model)
    adam = spans(res, "cpu")
    assert list(adam["op"]) == ["CPU_ADAM"]
    # DRAM-bound: 30 bytes per parameter at STREAM bandwidth (one GPU offloads: it gets all of it)
    expect = P * CPU_ADAM_BYTES_PER_PARAM / (hw.host.cpu_memory_bandwidth * hw.host.cpu_memory_efficiency)
    assert float(adam["end_s"].iloc[0] - adam["start_s"].iloc[0]) == pytest.approx(expect, rel=1e-9)
    pcie = spans(res, "pcie").set_index("op")
    link = hw.pcie.bandwidth * hw.pcie.efficiency
    for op in ("D2H_GRADS", "H2D_PARAMS"):  # fp16 gradients out, fp16 parameters back
        assert pcie.loc[op, "bytes"] == pytest.approx(2 * P)
        assert pcie.loc[op, "end_s"] - pcie.loc[op, "start_s"] == pytest.approx(2 * P / link)
    # the gradient copy hides under the backward (shorter than it here); the rest is the STEP
    step = res.timeline[res.timeline["op"] == "STEP"].iloc[0]
    assert step["end_s"] - step["start_s"] == pytest.approx(expect + 2 * P / link, rel=1e-9)
    assert res.metrics["tier_time_s"]["cpu"] == pytest.approx(expect)
    assert res.metrics["step_time_s"] == pytest.approx(float(res.timeline["end_s"].max()))


def test_offloaded_states_leave_the_gpu_and_land_on_the_host():
    sc, res = run(ten_b(optimizer="cpu"))
    P = total_params(sc.model)
    mem = res.metrics["stages"][0]["memory"]
    assert mem["optimizer"] == 0 and mem["grads"] == 0
    assert mem["params"] == pytest.approx(2 * P)  # fp16 weights stay (DeepSpeed's estimator: 2P per GPU)
    assert res.metrics["host_memory_bytes_per_node"] == pytest.approx(16 * P)  # fp32 master, grads, m, v
    assert res.metrics["fits_in_memory"]
    _, plain = run(ten_b())
    assert not plain.metrics["fits_in_memory"]  # without offload 10B does not fit a 32 GB V100


def test_delayed_update_hides_the_cpu_step_under_the_next_compute():
    _, eager = run(ten_b(optimizer="cpu"))
    _, dpu = run(ten_b(optimizer="cpu", delayed_update=True))
    step = dpu.timeline[dpu.timeline["op"] == "STEP"].iloc[0]
    assert step["end_s"] - step["start_s"] == pytest.approx(0.0)  # 3.3 s of chain under 11.5 s of F+B
    cpu = spans(dpu, "cpu").iloc[0]
    assert cpu["end_s"] <= step["end_s"] + 1e-12
    assert dpu.metrics["step_time_s"] < eager.metrics["step_time_s"]


def test_nvme_swaps_the_states_through_the_drives():
    sc, res = run(ten_b(optimizer="nvme"))
    P = total_params(sc.model)
    assert res.metrics["nvme_bytes_per_node"] == pytest.approx(16 * P)
    t = tiers(sc.hardware, 1)
    nv = spans(res, "nvme").set_index("op")
    assert nv.loc["NVME_READ", "end_s"] - nv.loc["NVME_READ", "start_s"] == pytest.approx(12 * P / t.nvme_read)
    assert nv.loc["NVME_WRITE", "end_s"] - nv.loc["NVME_WRITE", "start_s"] == pytest.approx(12 * P / t.nvme_write)


def test_twin_flow_ratio_splits_the_update():
    sc, half = run(ten_b(optimizer="cpu", optimizer_ratio=0.5))
    _, full = run(ten_b(optimizer="cpu"))
    assert half.metrics["tier_time_s"]["cpu"] == pytest.approx(full.metrics["tier_time_s"]["cpu"] / 2)
    assert half.metrics["host_memory_bytes_per_node"] == pytest.approx(full.metrics["host_memory_bytes_per_node"] / 2)
    P = total_params(sc.model)
    assert half.metrics["stages"][0]["memory"]["optimizer"] == pytest.approx(0.5 * 12 * P)


def test_parameter_offload_fetches_under_each_forward_and_backward():
    doc = ten_b(optimizer="cpu", params="cpu")
    doc["parallel"]["zero"] = 3
    sc, res = run(doc)
    P = total_params(sc.model)
    fetch = spans(res, "pcie")
    fetch = fetch[fetch["op"] == "H2D_PARAMS"]
    assert len(fetch) == 3 and all(b == pytest.approx(2 * P) for b in fetch["bytes"])  # F, B, updated params
    assert res.metrics["stages"][0]["memory"]["params"] < 0.05 * 2 * P  # two layers' worth
    assert res.metrics["host_memory_bytes_per_node"] == pytest.approx(18 * P)  # DeepSpeed's 18 bytes


def test_offload_needs_a_host_tier():
    doc = ten_b(optimizer="cpu")
    doc["hardware"] = "dgx-h100"
    from parsim.errors import ConfigError
    with pytest.raises(ConfigError, match="no \\[host\\] table"):
        run(doc)


def test_model_scale_on_one_dgx2_in_the_published_order():
    case = PUB["zero-infinity-model-scale-dgx2"]
    hw = load_profile("dgx2-v100")
    configs = {"dp": (0, OffloadConfig()), "zero-offload": (2, OffloadConfig(optimizer="cpu")),
               "zero-3": (3, OffloadConfig()), "infinity-cpu": (3, OffloadConfig(optimizer="cpu", params="cpu")),
               "infinity-nvme": (3, OffloadConfig(optimizer="nvme", params="nvme"))}
    sizes = {k: largest_model_params(hw=hw, gpus=16, zero=z, off=o)[0] for k, (z, o) in configs.items()}
    order = sorted(sizes, key=sizes.get)
    assert order == case["order"], sizes
    assert sizes["infinity-nvme"] >= case["infinity_nvme_params_at_least"]


def test_zero_offload_10b_on_one_v100_published_throughput():
    """Published 40 TFLOPS; parsim: 43.5 model TFLOPS (+9%) with the fitted DGX-2 host link
    (benchmarks/fit_host_link.py; 44.3, +11%, with the 0.8 estimate); counted with
    the recompute (Megatron's 96BslH^2 convention) it would be 58.8 (+47%): the paper does
    not say which it used (see the data file)."""
    case = PUB["zero-offload-10b-v100"]
    _, res = run(ten_b(optimizer="cpu"))
    got = res.metrics["tflops_per_gpu"]
    err = got / case["tflops_per_gpu"] - 1
    assert abs(err) <= case["tolerance"], f"{got:.1f} TFLOPS vs {case['tflops_per_gpu']}: {err:+.1%}"


@pytest.mark.parametrize("key, value, needle", [
    ("optimizer", "gpu", "offload.optimizer"),
    ("params", "cpu", "offload.params"),
    ("optimizer_ratio", 1.5, "offload.optimizer_ratio"),
    ("activations", "nvme", "offload.activations"),
    ("delayed_update", 1, "offload.delayed_update"),
    ("swap", True, "offload.swap"),
])
def test_bad_offload_values_are_one_line(tmp_path: Path, key, value, needle):
    doc = ten_b(optimizer="cpu")
    doc["offload"][key] = value
    lines = [f'name = "x"', 'hardware = "dgx2-v100"', "gpus = 1", "[model]", 'preset = "megatron-1.7b"',
             "[training]", "global_batch = 1", "seq_len = 128", 'precision = "fp16"', "[parallel]", "zero = 2",
             "[offload]"] + [f"{k} = {json.dumps(v)}" for k, v in doc["offload"].items()]
    path = tmp_path / "s.toml"
    path.write_text("\n".join(lines) + "\n")
    p = subprocess.run([sys.executable, "-m", "parsim", "simulate", str(path)], capture_output=True, text=True,
                       env=ENV, cwd=ROOT)
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr, p.stderr


def test_a6000_workstation_fine_tunes_7b_only_with_offload():
    doc = {"name": "ws", "hardware": "a6000-workstation", "gpus": 1, "model": {"preset": "llama2-7b"},
           "training": {"global_batch": 4, "microbatch_size": 1, "seq_len": 2048, "precision": "bf16",
                        "recompute": "full"},
           "parallel": {"zero": 2}}
    _, plain = run(doc)
    _, off = run({**doc, "offload": {"optimizer": "cpu"}})
    assert not plain.metrics["fits_in_memory"] and off.metrics["fits_in_memory"]
    assert off.metrics["host_fits"]


def test_grace_blackwell_copies_over_c2c_not_pcie():
    doc = {"name": "gb", "hardware": "gb200-nvl72", "gpus": 8, "model": {"preset": "llama3-8b"},
           "training": {"global_batch": 8, "seq_len": 4096, "recompute": "full"},
           "parallel": {"zero": 2}, "offload": {"optimizer": "cpu"}}
    sc, res = run(doc)
    assert set(res.metrics["tier_time_s"]) == {"c2c", "cpu"}
    c2c = spans(res, "c2c")
    d2h = c2c[c2c["op"] == "D2H_GRADS"].iloc[0]
    host = sc.hardware.host
    assert d2h["end_s"] - d2h["start_s"] == pytest.approx(d2h["bytes"] / (host.c2c_bandwidth * host.c2c_efficiency))


def _blockwise(layers):
    from parsim.costs.inputs import cost_inputs
    from parsim.costs.model_costs import ModelCosts
    from parsim.schedule.ir import Op
    doc = {"name": "gb", "hardware": "gb200-nvl72", "gpus": 8, "model": {"preset": "llama3-8b"},
           "training": {"global_batch": 8, "seq_len": 8192}, "parallel": {"zero": 1}}
    if layers is not None:
        doc["offload"] = {"activations": "cpu", "activation_layers": layers}
    mc = ModelCosts(cost_inputs(scenario_from_dict(doc, "<test>")))
    st = mc.stage_costs[0]
    return st, mc.op_cost(0, Op.F), mc.op_cost(0, Op.B)


@pytest.mark.parametrize("k", [1, 10, 32, 40])
def test_blockwise_activation_offload_moves_k_blocks_two_at_a_time(k):
    """Megatron-Core's --cpu-offloading-num-layers k (Transformer Engine's offload context): of the
    32 blocks' stash (the stage's less the embedding's and the loss's, which stay), k blocks' go
    to the host; two of them are on the GPU at once while they move (the block computing and the
    one in flight); the copy runs under the op's compute over NVLink-C2C."""
    st, f0, b0 = _blockwise(None)
    _, f, b = _blockwise(k)
    per_block = (st.activation_bytes - st.ends_activation_bytes) / 32
    moved = min(k, 32) * per_block
    assert f.stash_bytes == pytest.approx(f0.stash_bytes - moved, rel=1e-12)
    assert f.transient_bytes - f0.transient_bytes == pytest.approx(min(k, 2) * per_block, rel=1e-12)
    assert b.free_bytes == pytest.approx(b0.free_bytes - moved, rel=1e-12)
    copy = next(p for p in f.phases if p[1] == "D2H_ACTS")
    assert copy[4] == pytest.approx(moved, rel=1e-12)


@pytest.mark.parametrize("table, needle", [
    ({"activation_layers": 4}, "needs offload.activations = \"cpu\""),
    ({"activations": "cpu", "activation_layers": 0}, "expected a positive number of blocks"),
    ({"activations": "cpu", "activation_layers": True}, "expected a positive number of blocks"),
])
def test_bad_activation_layers_are_one_line(table, needle):
    from parsim.errors import ConfigError
    doc = {"name": "gb", "hardware": "gb200-nvl72", "gpus": 8, "model": {"preset": "llama3-8b"},
           "training": {"global_batch": 8, "seq_len": 4096}, "parallel": {"zero": 1}, "offload": table}
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(doc, "<test>")
    assert "offload.activation_layers" in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("change, needle", [
    ({"parallel": {"zero": 1, "framework": "megatron", "pp": 2}}, "does not support pipeline parallelism"),
    ({"parallel": {"zero": 1, "framework": "megatron"}, "training": {"global_batch": 8, "seq_len": 4096,
                                                                      "recompute": "selective"}},
     "does not work with activation recomputation"),
    ({"parallel": {"zero": 1, "framework": "megatron"}, "offload": {"activations": "cpu", "activation_layers": 32}},
     "fewer blocks than the model has (32)"),
])
def test_what_megatron_refuses_with_cpu_offloading(change, needle):
    from parsim.errors import ConfigError
    doc = {"name": "gb", "hardware": "gb200-nvl72", "gpus": 8, "model": {"preset": "llama3-8b"},
           "training": {"global_batch": 8, "seq_len": 4096}, "parallel": {"zero": 1},
           "offload": {"activations": "cpu", "activation_layers": 4}} | change
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(doc, "<test>")
    assert "offload.activation_layers" in str(e.value) and needle in str(e.value)


def test_megatron_import_reads_cpu_offloading():
    from parsim.frameworks import import_megatron
    small = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "4096",
             "--vocab-size", "32000"]
    imp = import_megatron(small + ["--cpu-offloading-num-layers", "10"], gpus=8)
    assert imp.doc["offload"] == {"activations": "cpu", "activation_layers": 10}
    assert "offload" not in import_megatron(small + ["--cpu-offloading"], gpus=8).doc
