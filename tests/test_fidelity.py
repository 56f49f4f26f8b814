"""Fidelity against published runs (benchmarks/fidelity.py), with no fitted factor.

The kernel models alone must reproduce the rows whose physics they claim (Megatron-LM 2021 on
A100 without pipeline parallelism: GEMMs, the unfused attention core, memory-bound ops). The
issue's aim -- <= 10% (then 5%) on every row with no per-GPU factor -- is met at 10% on the A100
rows (6% since the A100's power-limited clock, a kernel microbenchmark) and, since compute-bound kernels run at the measured power-saturated clock (the profiles'
``msmf_*`` pair: a kernel microbenchmark, not a fit to these rows), on the H100 rows (9.2%);
5% is not met (reports/fidelity.md says where).
"""
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import fidelity  # noqa: E402


@pytest.fixture(scope="module")
def rows():
    return [fidelity.run_case(c) for c in fidelity.load_cases()]


def test_every_published_throughput_case_is_a_scenario():
    cases = fidelity.load_cases()
    assert sum(c["id"].startswith("megatron21-table1") for c in cases) == 10
    assert sum(c["id"].startswith("megatron-core-h100-weak") for c in cases) == 9


A100_FLAT = ("megatron21-table1-1.7B", "megatron21-table1-3.6B", "megatron21-table1-7.5B", "megatron21-table1-18B")
"""Table 1's rows without pipeline parallelism."""


def test_a100_rows_without_pipeline_within_five_percent(rows):
    # the kernel models alone, at the A100's power-limited clock, with the unfused attention as
    # Megatron ran it (batched GEMMs in one launch, its fused upper-triangular softmax), the layer
    # kernels at the bandwidth Korthikanti's Table 4 gives them and the 2021 code's Apex
    # FusedLayerNorm at the time apex #1037 measured for it: +1.6..+3.1% (+2.5..+6.0% with the
    # persistent norm the code did not have yet; 8.6% MAPE at a copy's rate)
    flat = [r for r in rows if r["id"] in A100_FLAT]
    assert len(flat) == 4 and all(r["family"] == "a100" and r["pp"] == 1 for r in flat)
    assert all(abs(r["error"]) <= 0.05 for r in flat)


OPEN_SLOW_ROW = "megatron-core-h100-weak-32B"
"""The H100 row predicted more than 5% slow (see the strict xfail below)."""


def test_no_row_is_predicted_slower_than_published_by_more_than_five_percent(rows):
    # nothing left in the model slows a run down without a kernel behind it
    assert min(r["error"] for r in rows if r["id"] != OPEN_SLOW_ROW) >= -0.05


@pytest.mark.xfail(strict=True, reason="Megatron-LM reduces bf16 gradients in fp32 (arguments.py, core_r0.8.0): the "
                                       "32B row's dp groups have one GPU per node, so 15.7 GB of fp32 gradients "
                                       "and 7.9 GB of parameters cross one 47 GB/s NIC per GPU with only the last "
                                       "microbatch's backward and the first forward to hide under (Megatron's "
                                       "no_sync): predicted 1.08 s against 0.89 s published (-17% at the "
                                       "power-saturated clock, -9% at the burst clock), while the 16B "
                                       "row, the same FLOPs per GPU with two GPUs per node in each dp group, is "
                                       "published only 0.045 s faster. What hides more of that reduction in the "
                                       "real run is not identified")
def test_the_32b_row_is_not_predicted_slower_than_published_by_more_than_five_percent(rows):
    assert next(r for r in rows if r["id"] == OPEN_SLOW_ROW)["error"] >= -0.05


def test_mape_within_three_percent_on_the_a100_rows(rows):
    # 2.3%: the layer kernels' bandwidth fraction fitted on Korthikanti's per-layer Table 4
    # (benchmarks/fit_layer_memory.py), these rows held out of that fit, and the April 2021 code's
    # Apex FusedLayerNorm (training.persist_layer_norm = false); 3.8% with the persistent norm,
    # 6.6% at a copy's rate
    a100 = [r for r in rows if r["family"] == "a100"]
    assert len(a100) == 10
    assert fidelity.mape(a100) <= 3.0


def test_public_set_mape_within_five_percent(rows):
    """The issue's must-show on the public set (Megatron-LM 2021 Table 1 on A100 and Megatron-Core's
    H100 weak scaling, 19 rows): 4.9%, with no per-GPU or per-row factor (7.1% before the A100's
    layer-kernel bandwidth and the 2021 code's norm)."""
    assert len(rows) == 19
    assert fidelity.mape(rows) <= 5.0


def test_mape_within_ten_percent_on_the_h100_rows(rows):
    # 21.1% at the kernels' burst clocks; 9.2% with the measured MSMF/MAMF ratio (no fit)
    h100 = [r for r in rows if r["family"] == "h100"]
    assert fidelity.mape(h100) <= 10.0


@pytest.fixture(scope="module")
def classic():
    return [r for c in fidelity.load_classic() for r in fidelity.run_classic(c)]


def test_held_out_classic_rows_within_the_project_gate(classic):
    """Korthikanti et al. 2022 Table 5 (Megatron-LM on A100, measured iteration times), never used
    by any fit: the 15% gate the validation backend uses for its own runs, per cell, and <= 10% over
    the table. run_classic refuses a preset whose hidden size differs from the row's."""
    assert len(classic) == 8 and {r["mode"] for r in classic} == {"full", "seq+sel"}
    assert all(abs(r["error"]) <= 0.15 for r in classic), [(r["id"], r["mode"], r["error"]) for r in classic]
    assert fidelity.mape(classic) <= 10.0


def test_held_out_classic_rows_within_five_percent_at_the_power_limited_clock(classic):
    """With the A100's power-limited clock (a kernel microbenchmark, not a fit to these rows) and the
    2022 code's asynchronous input-gradient reductions (``overlap.tp_grad_allreduce``) the table stays
    within 5% (4.7%; 3.0% with those reductions blocking), every cell within 10%."""
    assert fidelity.mape(classic) <= 5.0
    assert all(abs(r["error"]) <= 0.10 for r in classic)


def test_held_out_classic_rows_within_four_percent_with_the_fitted_layer_bandwidth(classic):
    """Table 5's end-to-end iteration times, held out of the fit of the A100's
    ``layer_memory_efficiency`` on Table 4's per-layer times of the same paper
    (benchmarks/fit_layer_memory.py): 3.2% (4.7% at a copy's rate), every cell within 9%."""
    assert fidelity.mape(classic) <= 4.0
    assert all(abs(r["error"]) <= 0.09 for r in classic)


def test_same_block_compares_per_layer_and_sequence(rows, classic):
    """``same_block`` divides each run's step by its layers and by the sequences one replica trains:
    Table 1's 18B (40 layers, 1,024 sequences over 32 replicas) and Table 5's 22B (48 layers, 4
    sequences, one replica), hand-computed from the rows."""
    sb = fidelity.same_block(rows, classic)
    r1 = next(r for r in rows if r["id"] == "megatron21-table1-18B")
    r5 = next(r for r in classic if r["id"] == "korthikanti-table5-22B" and r["mode"] == "full")
    assert sb["table1_measured"] == pytest.approx(r1["published_step_s"] / (40 * 32))
    assert sb["table1_predicted"] == pytest.approx(r1["predicted_step_s"] / (40 * 32))
    assert sb["table5_measured"] == pytest.approx(1.42 / (48 * 4))
    assert sb["table5_predicted"] == pytest.approx(r5["predicted_step_s"] / (48 * 4))


def test_the_2022_run_of_the_shared_block_is_predicted_within_five_percent(rows, classic):
    """The kernel model on the 6144-wide block as Megatron-LM ran it in 2022 (Table 5, full
    recomputation), per layer and sequence: the residual of Table 1's 2021 run of the same block
    (reports/fidelity.md, 'One block, measured twice') is not the kernels'."""
    sb = fidelity.same_block(rows, classic)
    assert abs(sb["table5_measured"] / sb["table5_predicted"] - 1.0) <= 0.05
