"""The torch.distributed validation backend (gloo, 2 CPU ranks): gradient parity for every
synchronous schedule (two-copy, overlapped F&B and re-materialising ones included), DP/ZeRO,
the comparison with the simulator, and process hygiene. Asynchronous schedules:
tests/test_validate_async.py; tensor/context/expert parallelism: tests/test_validate_parallel.py.

Oracle for parity: single-process training of the same model on the same data
(parsim.validate.reference). Activation memory oracle: autograd's saved tensors.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import launch_parity

torch = pytest.importorskip("torch")
torch.set_num_threads(1)  # the reference runs beside 2+ rank processes on 2 cores

from parsim.cli.validate import run_validation  # noqa: E402
from parsim.validate.launch import RankFailure, launch  # noqa: E402
from parsim.validate.reference import check_parity  # noqa: E402
from parsim.validate.scale import Limits, prepare, scale_model  # noqa: E402

pytestmark = pytest.mark.torch
TINY = str(Path(__file__).parent / "data" / "validate-tiny.toml")

TWO_RANKS = {
    "GPipe": ["schedule.name=GPipe"],
    "1F1B": ["schedule.name=1F1B"],
    "ZBH1": ["schedule.name=ZBH1"],
    "ZBH2": ["schedule.name=ZBH2"],
    "Naive": ["schedule.name=Naive"],
    "ZBV": ["schedule.name=ZBV"],  # two stages per rank in a V: the loss on rank 0, local hand-offs
    # F and B overlapped (run as F then B), two model copies whose gradients are summed over ranks r, p-1-r
    "DualPipe": ["schedule.name=DualPipe"],
    "DualPipeV": ["schedule.name=DualPipeV"],
    "Chimera": ["schedule.name=Chimera"],
    "GPipeRemat": ["schedule.name=GPipeRemat"],  # F keeps the stage input only, B reruns F
    "Interleaved1F1B": ["schedule.name=Interleaved1F1B", "parallel.vpp=2"],
    # Llama structure: fused RMSNorm and SwiGLU, grouped-query attention (explicit and SDPA)
    "1F1B-llama": ["model.ffn=swiglu", "model.norm=rmsnorm", "model.n_kv_heads=2", "model.bias=false"],
    "ZBH1-llama-sdpa": ["schedule.name=ZBH1", "model.ffn=swiglu", "model.norm=rmsnorm", "model.n_kv_heads=2",
                        "training.flash_attention=true"],
    "dp2-zero0": ["parallel.pp=1", "parallel.dp=2", "parallel.zero=0"],
    "dp2-zero1": ["parallel.pp=1", "parallel.dp=2", "parallel.zero=1"],
    "dp2-zero3": ["parallel.pp=1", "parallel.dp=2", "parallel.zero=3"],  # gathers per microbatch, RS per microbatch
    "dp2-zero3-kept": ["parallel.pp=1", "parallel.dp=2", "parallel.zero=3", "parallel.reshard_after_forward=false"],
}
FOUR_RANKS = {  # pp=2 x dp=2 on 2 cores (oversubscribed; correctness only)
    "1F1B-dp2-zero0": ["gpus=4", "parallel.dp=2", "parallel.zero=0"],
    "ZBH1-dp2-zero1": ["gpus=4", "schedule.name=ZBH1", "parallel.dp=2", "parallel.zero=1"],
    # the copies' gradient sum and the data-parallel one in one group: ranks r, p-1-r of both replicas
    "DualPipe-dp2": ["gpus=4", "schedule.name=DualPipe", "parallel.dp=2", "training.global_batch=16"],
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes only once reaped; launch() reaps
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def parity_two(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity2")
    ranks = launch_parity(TINY, TWO_RANKS.values(), 2, out, 60, 120)
    return out, ranks


@pytest.mark.parametrize("i,name", list(enumerate(TWO_RANKS)))
def test_pipeline_and_dp_gradients_equal_single_process(parity_two, i, name):
    out, ranks = parity_two
    sc = prepare(TINY, TWO_RANKS[name], "gloo")
    res = check_parity(sc, out, [r["variants"][i] for r in ranks], variant=i)
    assert res["max_abs_diff"] < 1e-6


def test_every_registered_schedule_runs_and_is_checked_for_parity():
    """The runtime runs every registered schedule, and each one is a parity variant here
    (synchronous), in tests/test_validate_async.py, tests/test_validate_terapipe.py or (the
    message-driven one) tests/test_validate_ampnet.py."""
    from test_validate_ampnet import VARIANTS as MESSAGE_DRIVEN
    from test_validate_async import ASYNC
    from test_validate_terapipe import VARIANTS

    from parsim.schedule import BUILDERS
    from parsim.schedule.semantics import traits
    from parsim.validate.scale import RUNTIME_COVERAGE
    assert RUNTIME_COVERAGE.refuses == frozenset()
    checked = {o.split("=")[1] for v in [*TWO_RANKS.values(), *VARIANTS.values(), *MESSAGE_DRIVEN.values()]
               for o in v if o.startswith("schedule.name=")} | {"1F1B"}
    for name in BUILDERS:
        over = [f"schedule.name={name}"] + (["parallel.vpp=2"] if name == "Interleaved1F1B" else [])
        prepare(TINY, over, "gloo")  # accepted
        t = traits(name)
        assert name in (ASYNC if t.asynchronous and not t.message_driven else checked), name


def test_pp2_dp2_zero_gradients_equal_single_process(tmp_path):
    ranks = launch_parity(TINY, FOUR_RANKS.values(), 4, tmp_path, 60, 150)
    for i, name in enumerate(FOUR_RANKS):
        sc = prepare(TINY, FOUR_RANKS[name], "gloo")
        check_parity(sc, tmp_path, [r["variants"][i] for r in ranks], variant=i)


def test_validate_produces_comparison_and_memory_matches(tmp_path):
    c = run_validation(TINY, ["schedule.name=ZBH1"], "gloo", steps=2, warmup=1, timeout=120)
    for side in ("predicted", "measured"):
        assert c[side]["step_time_s"] > 0
        assert 0 <= c[side]["bubble_fraction"] < 1
        assert [s["rank"] for s in c[side]["stages"]] == [0, 1]
        assert all(s["busy_s"] > 0 for s in c[side]["stages"])
    err = c["relative_error"]
    assert set(err) >= {"step_time_s", "bubble_fraction", "stages", "activation_bytes"}
    # saved-tensor hooks vs StageCost.activation_bytes: the memory model is exact up to small buffers
    assert all(abs(e) < 0.05 for e in err["activation_bytes"]), err["activation_bytes"]
    ops = {(a["op"]) for a in c["actions"]}
    assert {"F", "I", "W", "STEP"} <= ops
    assert c["measured"]["probe_s"] > 0 and c["measured"]["minor_faults_per_step"] is not None
    assert c["recv"] == "early" and c["launches"] == 1 and len(c["measured"]["launch_step_time_s"]) == 1
    from parsim.validate.report import write_report
    write_report(c, tmp_path)
    assert (tmp_path / "gantt.png").stat().st_size > 0
    data = json.loads((tmp_path / "comparison.json").read_text())
    assert set(data) >= {"predicted", "measured", "relative_error"}


def test_crashing_rank_gives_clear_error_and_leaves_nothing(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as ei:
        launch({"scenario": TINY, "backend": "gloo", "steps": 1, "warmup": 0,
                "fault": {"rank": 1, "action": "1F1", "kind": "raise"}}, 2, tmp_path, 60)
    assert time.monotonic() - t0 < 60
    msg = str(ei.value)
    assert "rank 1" in msg and "injected fault" in msg
    assert not [p for p in ei.value.pids if _alive(p)]


def test_hung_rank_times_out_and_leaves_nothing(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as ei:
        launch({"scenario": TINY, "backend": "gloo", "steps": 1, "warmup": 0,
                "fault": {"rank": 0, "action": "0F1", "kind": "hang"}}, 2, tmp_path, 12)
    assert time.monotonic() - t0 < 12 + 10
    assert "timed out" in str(ei.value)
    assert not [p for p in ei.value.pids if _alive(p)]


def test_scale_model_keeps_structure():
    sc = prepare("scenarios/llama3-70b-h100.toml", ["parallel.tp=1", "parallel.dp=16", "parallel.sequence_parallel=false"],
                 "gloo")
    m = sc.model
    assert m.d_model <= 256 and m.n_layers == sc.parallel.pp * 2
    assert m.ffn == "swiglu" and m.n_heads % m.n_kv_heads == 0 and m.n_kv_heads < m.n_heads
    assert sc.training.precision == "fp32" and sc.training.seq_len <= 256
    small = sc.model
    assert scale_model(small, 4, 128, Limits()) is small


@pytest.mark.parametrize("over,key", [
    (["parallel.pp=1", "parallel.cp=2"], "training.flash_attention"),  # ring attention is the fused kernel's
    (["parallel.pp=1", "parallel.cp=2", "training.flash_attention=true", "parallel.cp_comm=all_gather"],
     "parallel.cp_comm"),
    (["parallel.pp=1", "parallel.tp=2", "model.n_kv_heads=1", "model.n_heads=2"], "model.n_kv_heads"),
    (["schedule.name=PipeDream", "gpus=4", "parallel.dp=2", "parallel.zero=1"], "parallel.zero"),
    (["schedule.name=DualPipe", "gpus=4", "parallel.dp=2", "parallel.zero=1", "training.global_batch=16"],
     "parallel.zero"),
    (["parallel.pp=1", "parallel.tp=2", "model.n_experts=4"], "parallel.tp"),
    (["parallel.pp=1", "parallel.cp=2", "model.n_experts=4", "training.flash_attention=true"], "parallel.cp"),
])
def test_what_the_runtime_does_not_build_is_a_one_line_error(over, key):
    from parsim.errors import ConfigError
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        prepare(TINY, over, "gloo")


def test_validate_refuses_before_any_rank_starts(capsys):
    """The CLI's torch-free check: exit 2, one line naming the file and key."""
    from parsim.cli.main import main
    assert main(["validate", TINY, "--set", "parallel.pp=1", "--set", "parallel.cp=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.flash_attention" in err[0] and "validate-tiny.toml" in err[0]


def test_fused_rmsnorm_and_swiglu_match_their_unfused_definitions():
    """gradcheck (float64) against autograd of the textbook formulas."""
    from parsim.validate.model import _RMSNormFn, swiglu
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _RMSNormFn.apply(a, b, 1e-6), (x, w))
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(_RMSNormFn.apply(x, w, 1e-6), ref)
    g = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(swiglu, (g, u))
    assert torch.allclose(swiglu(g, u), torch.nn.functional.silu(g) * u)


@pytest.mark.parametrize("flash", [False, True])
def test_gqa_attention_equals_repeated_kv_heads(flash):
    """Broadcast / enable_gqa attention == the textbook form with K/V repeated per query head."""
    import dataclasses
    import math

    from parsim.validate.model import Block
    sc = prepare("scenarios/tiny-llama-cpu.toml", None, "gloo")
    spec = dataclasses.replace(sc.model, d_model=64, n_heads=4, n_kv_heads=2, head_dim=None, d_ff=96)
    torch.manual_seed(0)
    blk = Block(spec, flash, torch.float64).double()
    x = torch.randn(2, 16, 64, dtype=torch.float64)
    mask = torch.full((16, 16), float("-inf"), dtype=torch.float64).triu(1)
    got = blk.attention(x, mask)
    qkv = blk.qkv(x)
    hd, nh, nkv = blk.hd, blk.nh, blk.nkv
    q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    q, k, v = (t.view(2, 16, -1, hd).transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
    p = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd) + mask, dim=-1)
    want = blk.proj((p @ v).transpose(1, 2).reshape(2, 16, nh * hd))
    assert torch.allclose(got, want, atol=1e-10)


def test_flat_params_keep_gradients_in_one_buffer_as_megatron_ddp():
    """Every .grad views the persistent buffer: backward adds into it in place (two
    microbatches sum), a step's reduction reads it without a copy, a per-microbatch reduction
    takes a copy and leaves zeros, and the step's clear zeroes it with the views kept."""
    import torch

    from parsim.validate.params import FlatParams
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    params = list(lin.parameters())
    fp = FlatParams(params, None, 3, 0, 0, lambda ps: torch.optim.SGD(ps, lr=0.1))
    assert fp.padded == 9 and fp.grads.numel() == 9  # 8 values padded to a multiple of 3
    x1, x2 = torch.randn(4, 3), torch.randn(5, 3)
    lin(x1).sum().backward()
    lin(x2).sum().backward()
    want_w = torch.ones(4, 2).t() @ x1 + torch.ones(5, 2).t() @ x2  # d(sum)/dW by hand
    assert torch.allclose(lin.weight.grad, want_w)
    assert lin.weight.grad.data_ptr() == fp.grads.data_ptr()  # still the buffer's view
    assert torch.allclose(fp.flat_grads()[:6], want_w.reshape(-1)) and fp.flat_grads() is fp.grads
    assert float(fp.grads[8]) == 0.0  # padding stays zero
    taken = fp.take_grads()
    assert torch.allclose(taken[:6], want_w.reshape(-1)) and float(fp.grads.abs().sum()) == 0.0
    fp.set_grads(taken * 2)
    assert torch.allclose(lin.weight.grad, 2 * want_w)
    fp.clear_grads()
    assert float(lin.bias.grad.abs().sum()) == 0.0 and lin.bias.grad.data_ptr() == fp.grads.data_ptr() + 6 * 4
