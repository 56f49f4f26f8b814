"""A blocking collective's in-situ cost after more or less compute (``comm_gap_<kind>_<n>``):
the profile keys, the slope fit, the pricing of a block's tensor- and expert-parallel calls.
Oracles: hand-computed lines, synthetic rows generated from a known slope, and the unchanged
prices of every profile that did not measure the dependence."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from parsim.calibrate.fit import fit_collective_gaps, fit_profile
from parsim.cluster.collectives import at_gap, collective_time, in_pass_time
from parsim.cluster.hardware import dumps_profile, load_profile
from parsim.errors import ConfigError

REF, LO, HI, SLOPE = 1.5e-3, 0.75e-3, 6e-3, 0.3


def _gapped(base, tmp_path, extra=None):
    cal = {"collective_all_reduce_2": [[float("inf"), 400.0, 1.0]],
           "comm_gap_all_reduce_2": [REF * 1e6, LO * 1e6, HI * 1e6, SLOPE], **(extra or {})}
    path = tmp_path / "gapped.toml"
    path.write_text(dumps_profile(base, {}, cal))
    return load_profile(str(path))


def test_profile_keys_load_and_bad_rows_name_the_key(tmp_path):
    prof = _gapped(load_profile("cpu-gloo"), tmp_path)
    assert prof.collective_gaps == (("all_reduce", 2, pytest.approx(REF), pytest.approx(LO), pytest.approx(HI), SLOPE),)
    assert load_profile("cpu-gloo").collective_gaps == ()
    for bad in ([1500.0, 750.0, 6000.0], [1500.0, 2000.0, 6000.0, 0.3], [1500.0, 750.0, 6000.0, 11.0],
                [1500.0, 750.0, 6000.0, True], [1500.0, 0.0, 6000.0, 0.3]):
        path = tmp_path / "bad.toml"
        path.write_text(dumps_profile(load_profile("cpu-gloo"), {}, {"comm_gap_all_reduce_2": bad}))
        with pytest.raises(ConfigError, match="calibration.comm_gap_all_reduce_2"):
            load_profile(str(path))


def test_a_call_moves_along_the_measured_line_and_stops_at_its_ends(tmp_path):
    prof = _gapped(load_profile("cpu-gloo"), tmp_path)
    base = collective_time(prof, "all_reduce", 262144.0, [0, 1])
    assert base == pytest.approx(2 * 400e-6 + 262144 / 1e9)  # the fit, at the reference gap
    assert at_gap(prof, "all_reduce", [0, 1], base, REF) == base
    assert at_gap(prof, "all_reduce", [0, 1], base, 3.8e-3) == pytest.approx(base + 0.3 * 2.3e-3)
    assert at_gap(prof, "all_reduce", [0, 1], base, 10e-3) == pytest.approx(base + 0.3 * 4.5e-3)  # longest: 6 ms
    assert at_gap(prof, "all_reduce", [0, 1], base, 0.0) == pytest.approx(base - 0.3 * 0.75e-3)  # shortest: 0.75 ms
    # another kind or group size: not measured, the time it was given
    assert at_gap(prof, "all_gather", [0, 1], base, 3.8e-3) == base
    assert at_gap(prof, "all_reduce", [0, 1, 2], base, 3.8e-3) == base
    # calls in a pass: priced at their mean gap; on the line, the split of the compute does not matter
    two = in_pass_time(prof, "all_reduce", 262144.0, [0, 1], 2, 3.0e-3)
    assert two == pytest.approx(at_gap(prof, "all_reduce", [0, 1], base, 2.0e-3)
                                + at_gap(prof, "all_reduce", [0, 1], base, 4.0e-3))
    assert in_pass_time(prof, "all_reduce", 262144.0, [0], 2, 3.0e-3) == 0.0


def test_slope_fit_recovers_a_known_line_through_the_reference():
    rows = [{"kind": "collective_gap", "name": kind, "group": 2, "bytes": 262144.0, "gap_s": g,
             "reference_gap_s": REF, "seconds": t0 + s * (g - REF)}
            for kind, t0, s in (("all_reduce", 1.6e-3, 0.3), ("all_to_all", 1.1e-3, 0.12))
            for g in (0.75e-3, REF, 3e-3, 6e-3)]
    rows.append({"kind": "collective_gap", "name": "all_gather", "group": 2, "bytes": 262144.0, "gap_s": 3e-3,
                 "reference_gap_s": REF, "seconds": 1e-3})  # no reference row: left out
    gaps = {(g.kind, g.group): g for g in fit_collective_gaps(pd.DataFrame(rows))}
    assert set(gaps) == {("all_reduce", 2), ("all_to_all", 2)}
    assert gaps["all_reduce", 2].slope == pytest.approx(0.3, rel=1e-9)
    assert gaps["all_to_all", 2].slope == pytest.approx(0.12, rel=1e-9)
    assert gaps["all_reduce", 2].as_row() == pytest.approx([1500.0, 750.0, 6000.0, 0.3])


def test_fit_profile_writes_the_slopes_and_prices_the_gap_rows_by_them(tmp_path):
    base = load_profile("cpu-gloo")
    coll = [{"kind": "collective", "name": "all_reduce", "group": 2, "bytes": float(s),
             "seconds": 2 * 300e-6 + s / 1.5e9} for s in (4 ** i * 1024 for i in range(8))]
    gap_rows = [{"kind": "collective_gap", "name": "all_reduce", "group": 2, "bytes": 262144.0, "gap_s": g,
                 "reference_gap_s": REF, "seconds": 2 * 300e-6 + 262144 / 1.5e9 + 0.25 * (g - REF)}
                for g in (0.75e-3, REF, 3e-3, 6e-3)]
    fit = fit_profile(base, pd.DataFrame(coll + gap_rows), "gaps")
    assert fit.quality["collective_gap"] < 1e-9  # the fit at this size, moved along the slope
    table = fit.calibration_table()
    assert table["comm_gap_all_reduce_2"] == pytest.approx([1500.0, 750.0, 6000.0, 0.25])
    path = tmp_path / "gaps.toml"
    path.write_text(dumps_profile(fit.profile, fit.sources, table))
    assert load_profile(str(path)).collective_gaps == fit.profile.collective_gaps != ()


def _tp2_f(hw):
    from parsim.costs import ModelCosts
    from parsim.scenario import load_scenario
    from parsim.schedule.ir import Op
    sc = load_scenario("scenarios/tiny-cpu.toml", ["parallel.pp=1", "parallel.tp=2"])
    sc = dataclasses.replace(sc, hardware=hw)
    (row,) = [r for r in ModelCosts.from_scenario(sc).tables((0,)).ops if r.stage == 0 and r.op == Op.F.name]
    return row


def test_a_tp_block_pays_its_all_reduces_at_the_gap_its_forward_leaves(tmp_path):
    """Hand-computed: tp = 2 without sequence parallelism makes 2 all-reduces in each block's
    forward; with the slope each costs slope x (the forward's compute / 2 - the reference gap)
    more (within the measured gaps), so a stage of L blocks pays 2 L x that."""
    from parsim.costs import cost_inputs, layer_inputs
    from parsim.scenario import load_scenario
    plain = _gapped(load_profile("cpu-gloo"), tmp_path)
    flat = dataclasses.replace(plain, collective_gaps=())
    with_gap, without = _tp2_f(plain), _tp2_f(flat)
    sc = dataclasses.replace(load_scenario("scenarios/tiny-cpu.toml", ["parallel.pp=1", "parallel.tp=2"]), hardware=plain)
    from parsim.costs.layer import layer_cost
    lc = layer_cost(layer_inputs(cost_inputs(sc)), moe_layer=False)
    gap = min(HI, max(LO, lc.forward.compute / 2))
    want = sc.model.n_layers * 2 * SLOPE * (gap - REF)
    assert with_gap.parts.tp_comm - without.parts.tp_comm == pytest.approx(want, rel=1e-9)
    assert with_gap.parts.compute == without.parts.compute
    assert want > 0  # the tiny GPT's forward computes longer than the reference gap between its calls


def test_an_expert_layer_pays_its_all_to_alls_at_their_gaps(tmp_path):
    """Hand-computed on the tiny MoE (ep = 2, no overlap): the forward's dispatch and combine
    follow a third of its compute each (its token-count all-gather is the third call), the
    backward's two all-to-alls half of its compute; only the all-to-all was measured here, so
    the count exchange keeps its time."""
    from parsim.costs import cost_inputs, layer_inputs
    from parsim.costs.layer import layer_cost
    from parsim.scenario import load_scenario
    cal = {"comm_gap_all_to_all_2": [REF * 1e6, LO * 1e6, HI * 1e6, SLOPE]}
    gapped = _gapped(load_profile("cpu-gloo"), tmp_path, cal)
    gapped = dataclasses.replace(gapped, collective_gaps=tuple(g for g in gapped.collective_gaps if g[0] == "all_to_all"))

    def layer(hw):
        sc = dataclasses.replace(load_scenario("scenarios/tiny-moe-cpu.toml"), hardware=hw)
        return layer_cost(layer_inputs(cost_inputs(sc)), moe_layer=True)
    a, b = layer(gapped), layer(dataclasses.replace(gapped, collective_gaps=()))
    clamp = lambda g: min(HI, max(LO, g))  # noqa: E731
    assert a.forward.compute == b.forward.compute
    assert a.forward.ep_comm - b.forward.ep_comm == pytest.approx(2 * SLOPE * (clamp(a.forward.compute / 3) - REF))
    back = a.backward_input.compute + a.backward_weight.compute
    assert a.backward_input.ep_comm - b.backward_input.ep_comm == pytest.approx(2 * SLOPE * (clamp(back / 2) - REF))


def test_sequence_parallel_gathers_follow_the_norms_and_scatters_the_gemms(tmp_path):
    """Hand-computed on tp2 + sp: the forward's two all-gathers are priced at half its
    memory-bound time each, its two reduce-scatters at half the rest; the backward's
    reduce-scatters at a quarter of the rest (the re-gathers, priced at the reference gap as
    before, split those GEMMs too)."""
    from parsim.costs import cost_inputs, layer_inputs
    from parsim.costs.layer import tp_layer_comm
    from parsim.scenario import load_scenario
    cal = {"comm_gap_all_gather_2": [REF * 1e6, LO * 1e6, HI * 1e6, 0.05],
           "comm_gap_reduce_scatter_2": [REF * 1e6, LO * 1e6, HI * 1e6, 0.2]}
    prof = _gapped(load_profile("cpu-gloo"), tmp_path, cal)
    flat = dataclasses.replace(prof, collective_gaps=())
    over = ["parallel.pp=1", "parallel.tp=2", "parallel.sequence_parallel=true"]
    act, gemm, mem, total = 262144.0, 2e-3, 1.2e-3, 7e-3
    clamp = lambda g: min(HI, max(LO, g))  # noqa: E731

    def comm(hw, backward):
        inp = layer_inputs(cost_inputs(dataclasses.replace(load_scenario("scenarios/tiny-cpu.toml", over), hardware=hw)))
        return tp_layer_comm(inp, act, gemm, backward=backward, pass_s=total, memory_s=mem)[0]
    fwd = comm(prof, False) - comm(flat, False)
    assert fwd == pytest.approx(2 * 0.05 * (clamp(mem / 2) - REF) + 2 * 0.2 * (clamp((total - mem) / 2) - REF))
    bwd = comm(prof, True) - comm(flat, True)
    assert bwd == pytest.approx(2 * 0.05 * (clamp(mem / 2) - REF) + 2 * 0.2 * (clamp((total - mem) / 4) - REF))
