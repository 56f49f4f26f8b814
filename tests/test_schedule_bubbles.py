"""Dry-run timing of the builders against closed forms and published bubble rates."""
from __future__ import annotations

import pytest
from conftest import published, published_cases

from parsim.schedule import (
    build,
    dry_run,
    gpipe,
    interleaved_1f1b,
    lower,
    one_f_one_b,
    one_f_one_b_iw,
    peak_in_flight,
    zero_bubble_h1,
    zero_bubble_h2,
)

PP = (1, 2, 3, 4, 5, 8)
TIMES = [(1, 1), (1, 2), (2, 3), (3, 1)]


@pytest.mark.parametrize("fn", [gpipe, one_f_one_b])
@pytest.mark.parametrize("f, b", TIMES)
def test_gpipe_and_1f1b_makespan(fn, f, b):
    """(m + p - 1)(f + b), i.e. bubble fraction (p-1)/(m+p-1), with zero p2p cost."""
    for p in PP:
        for m in (1, 2, 3, p, 2 * p + 1, 16):
            run = dry_run(fn(p, m), f=f, b=b, comm=0)
            assert run.makespan == (m + p - 1) * (f + b)
            assert run.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("f, b", TIMES)
def test_interleaved_makespan(f, b):
    """Per-stage times f, b: (m*v + p - 1)(f + b), so the bubble is (p-1)(t_f+t_b)/v for a
    rank's whole model piece (t_f = v f): Megatron's (p-1)/(v m) bubble ratio."""
    for p in (1, 2, 3, 4, 8):
        for v in (2, 3, 4):
            for m in (p, 2 * p, 3 * p):
                run = dry_run(interleaved_1f1b(p, m, v), f=f, b=b, comm=0)
                assert run.makespan == (m * v + p - 1) * (f + b)
                # the same model as 1F1B with v-times longer stages
                if p > 1:
                    assert run.makespan < dry_run(one_f_one_b(p, m), f=v * f, b=v * b, comm=0).makespan


def test_megatron_published_bubble_examples():
    ex = published("megatron21-bubble-formulas")["expected"]["examples"]
    for key, (p, m, v) in {"p8_m32": (8, 32, 1), "p8_m32_v3": (8, 32, 3), "p16_m64_v4": (16, 64, 4)}.items():
        s = one_f_one_b(p, m) if v == 1 else interleaved_1f1b(p, m, v)
        run = dry_run(s, f=1, b=2, comm=0)
        ideal = m * v * 3
        assert (run.makespan - ideal) / ideal == pytest.approx(ex[key], abs=5e-4)  # bubble / ideal time


def test_gpipe_published_bubble_examples():
    ex = published("gpipe-bubble")["expected"]["examples"]
    for key, (k, m) in {"K4_M4": (4, 4), "K4_M16": (4, 16), "K8_M32": (8, 32)}.items():
        assert dry_run(gpipe(k, m), comm=0).bubble_fraction == pytest.approx(ex[key], abs=5e-5)


@pytest.mark.parametrize("f, i, w", [(1, 1, 1), (2, 2, 1), (3, 2, 1), (2, 3, 2), (1, 2, 1), (3, 3, 2)])
def test_zero_bubble_formulas(f, i, w):
    """zb-formulas (T_B there = input backward I): ZB-H1 (p-1)(T_F+T_B-T_W) once m >= p;
    ZB-H2 (p-1)(T_F+T_B-2T_W) once m >= 2p-1, counted from each rank's own first action
    (the paper's parallelogram: no synchronised start). 1F1B-IW: (p-1)(T_F+T_B), since
    the W's no longer gate the gradient chain (fused 1F1B: (p-1)(T_F+T_B+T_W))."""
    for p in (2, 3, 4, 8):
        for m in (2 * p - 1, 2 * p, 3 * p + 1):
            h1 = dry_run(zero_bubble_h1(p, m), f=f, i=i, w=w, comm=0)
            assert max(h1.bubble(r) for r in range(p)) == (p - 1) * (f + i - w)
            h2 = dry_run(zero_bubble_h2(p, m), f=f, i=i, w=w, comm=0)
            assert max(h2.span_bubble(r) for r in range(p)) == (p - 1) * (f + i - 2 * w)
            iw = dry_run(one_f_one_b_iw(p, m), f=f, i=i, w=w, comm=0)
            assert max(iw.bubble(r) for r in range(p)) == (p - 1) * (f + i)
            fused = dry_run(one_f_one_b(p, m), f=f, b=i + w, comm=0)
            assert max(fused.bubble(r) for r in range(p)) == (p - 1) * (f + i + w)


def test_zero_bubble_h1_small_m():
    """ZB-H1 never loses to 1F1B or 1F1B-IW; with equal times its bubble is a third of
    1F1B's once m >= p ("ZB-H1 bubble is ~1/3 of 1F1B when T_F=T_B=T_W")."""
    for p in (2, 4, 8):
        for m in range(1, 3 * p):
            h1 = dry_run(zero_bubble_h1(p, m), f=1, i=1, w=1, comm=0).makespan
            iw = dry_run(one_f_one_b_iw(p, m), f=1, i=1, w=1, comm=0).makespan
            base = dry_run(one_f_one_b(p, m), f=1, b=2, comm=0).makespan
            assert h1 <= iw <= base
            if m >= p:
                assert h1 - 3 * m == (base - 3 * m) / 3


ZB_ROWS = published_cases("zb-table5-")


@pytest.mark.parametrize("row", ZB_ROWS, ids=[r["id"] for r in ZB_ROWS])
def test_zero_bubble_table5_bubble_rates(row):
    """Qi et al. Table 5 from their profiled T_F/T_B/T_W/T_comm, lowered and raw alike.

    cost = max over ranks of (last compute end - first compute start), the paper's
    definition; for 1F1B and ZB-H1 that is the plain makespan.
    """
    x, expected = row["inputs"], row["expected"]["bubble_rate"]
    p, m, tf, tb, tw, tc = x["p"], x["m"], x["T_F"], x["T_B"], x["T_W"], x["T_comm"]
    ideal = m * (tf + tb + tw)
    for key, fn in (("1F1B", one_f_one_b), ("ZB-H1", zero_bubble_h1), ("ZB-H2", zero_bubble_h2)):
        lowered = [lower(fn(p, m), reduce_grad=False, optimizer_step=False)] if p * m <= 512 else []
        for sched in [fn(p, m)] + lowered:
            run = dry_run(sched, f=tf, b=tb + tw, i=tb, w=tw, comm=tc)
            cost = max(run.compute_end[r] - run.compute_start[r] for r in range(p))
            assert (cost - ideal) / cost == pytest.approx(expected[key], abs=6e-5), key
            if key != "ZB-H2":
                assert cost == run.makespan


def test_peak_in_flight_activations():
    """Rank 0's stash: GPipe m, 1F1B and ZB-H1 min(p, m), ZB-H2 min(2p-1, m)
    (zb-formulas peak_activation_memory); interleaved: its warm-up + 1."""
    pk = published("zb-formulas")["expected"]["peak_activation_memory"]
    assert pk["1F1B"] == pk["ZB-H1"] == "p*M_B" and pk["ZB-H2"] == "(2p-1)*M_B"
    for p in (1, 2, 4, 8):
        for m in (1, 3, p, 2 * p, 5 * p):
            assert peak_in_flight(gpipe(p, m))[0] == m
            assert peak_in_flight(one_f_one_b(p, m))[0] == min(p, m)
            assert peak_in_flight(zero_bubble_h1(p, m))[0] == min(p, m)
            assert peak_in_flight(zero_bubble_h2(p, m))[0] == min(2 * p - 1, m)
            assert peak_in_flight(one_f_one_b(p, m)) == tuple(min(p - r, m) for r in range(p))
    for p, v, m in ((4, 2, 8), (4, 3, 4), (2, 4, 6)):
        assert peak_in_flight(interleaved_1f1b(p, m, v))[0] == min(2 * (p - 1) + (v - 1) * p + 1, m * v)


def test_lowered_dry_run_matches_implicit_dependencies():
    """SEND/RECV placement costs nothing extra under eager delivery."""
    for name, vpp in (("1F1B", 1), ("Interleaved1F1B", 2), ("ZBH2", 1), ("GPipe", 1)):
        s = build(name, 4, 8, vpp)
        raw = dry_run(s, comm=0.5)
        low = dry_run(lower(s, reduce_grad=False, optimizer_step=False), comm=0.5)
        assert low.makespan == raw.makespan
        assert low.busy == raw.busy


def test_rendezvous_delivery_is_never_faster():
    s = lower(build("1F1B", 4, 8), reduce_grad=False, optimizer_step=False)
    assert dry_run(s, comm=1, rendezvous=True).makespan >= dry_run(s, comm=1).makespan


def test_reduce_grad_overlaps_and_step_waits():
    s = lower(one_f_one_b(2, 4))
    run = dry_run(s, f=1, b=2, comm=0, reduce=5, step=1)
    row = s.actions[1]
    k_red = next(k for k, a in enumerate(row) if a.op.value == "REDUCE_GRAD")
    k_step = len(row) - 1
    assert run.spans[1][k_step][0] == run.spans[1][k_red][1]  # STEP starts when the reduction ends
    # rank 1 (last stage) finishes its backwards first; its reduction overlaps rank 0's cool-down
    assert run.spans[1][k_red][0] < run.spans[0][len(s.actions[0]) - 3][1]


@pytest.mark.parametrize("name, vpp", [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("ZBH1", 1), ("ZBH2", 1)])
def test_dry_run_times_respect_every_dependency(name, vpp):
    """Independent of the engine's bookkeeping: read the spans back and check causality."""
    for sched in (build(name, 4, 8, vpp), lower(build(name, 4, 8, vpp), zero3=True)):
        run = dry_run(sched, f=1.5, b=2.5, i=1.25, w=1.0, comm=0.75)
        at = {}
        for r, row in enumerate(sched.actions):
            prev_end = 0.0
            for a, (start, end) in zip(row, run.spans[r]):
                if a.op.is_compute:
                    assert start >= prev_end  # one compute at a time per rank
                    prev_end = end
                    at[(a.op.value, a.stage, a.microbatch)] = (start, end, r)
        for (op, s, m), (start, _, r) in at.items():
            if op == "F" and s > 0:
                _, e, r2 = at[("F", s - 1, m)]
                assert start >= e + (0.75 if r2 != r else 0)
            if op in ("B", "I"):
                assert start >= at[("F", s, m)][1]
                if s < sched.n_stages - 1:
                    up = at.get(("B", s + 1, m)) or at[("I", s + 1, m)]
                    assert start >= up[1] + (0.75 if up[2] != r else 0)
            if op == "W":
                assert start >= at[("I", s, m)][1]


# ----------------------------------------------------------------------------- closed forms, names


def _closed_form_builders():
    from parsim.schedule import one_f_one_b_iw
    return {"gpipe": (gpipe, 1), "1f1b": (one_f_one_b, 1), "1f1biw": (one_f_one_b_iw, 1),
            "interleaved1f1b": (lambda p, m: interleaved_1f1b(p, m, 2), 2), "zbh1": (zero_bubble_h1, 1),
            "zbh2": (zero_bubble_h2, 1)}


@pytest.mark.parametrize("f, i, w", [(1, 1, 1), (2, 2, 1), (3, 2, 1), (2, 3, 2), (1, 2, 1), (1, 1, 3)])
def test_closed_form_bubbles_equal_the_dry_run(f, i, w):
    """parsim.schedule.semantics' closed forms (what the planner charges) against brute force,
    wherever they claim to be exact: makespan - m v (t_F + t_I + t_W)."""
    from parsim.schedule.semantics import CLOSED_FORMS, bubble_fraction, bubble_time
    builders = _closed_form_builders()
    assert set(builders) == set(CLOSED_FORMS)
    for key, (fn, v) in builders.items():
        for p in (2, 3, 4, 8):
            start = CLOSED_FORMS[key].exact_from(p)
            for m in sorted({start, start + 1, 2 * start + 1, 3 * p}):
                if key == "interleaved1f1b" and m % p:
                    continue
                run = dry_run(fn(p, m), f=f, b=i + w, i=i, w=w, comm=0, unshard=0, reduce=0, step=0)
                assert run.makespan - m * v * (f + i + w) == pytest.approx(bubble_time(key, p, f, i, w)), (key, p, m)
                assert run.bubble_fraction == pytest.approx(bubble_fraction(key, p, m, v, f, i, w)), (key, p, m)


def test_bubble_fraction_is_designs_formula_and_unknown_families_have_none():
    from parsim.schedule.semantics import bubble_fraction, bubble_time, closed_form
    assert bubble_fraction("GPipe", 4, 8) == pytest.approx(3 / 11)          # (p-1)/(m+p-1)
    assert bubble_fraction("Interleaved1F1B", 4, 8, v=2) == pytest.approx(3 / 19)  # (p-1)/(mv+p-1)
    assert bubble_time("1F1B", 1, 1.0, 1.0, 1.0) == 0.0
    for name in ("ZBV", "DualPipe", "Chimera", "Naive"):
        assert closed_form(name) is None and bubble_fraction(name, 4, 8) is None


def test_names_and_aliases_resolve_in_one_place():
    from parsim.schedule import register, single_chunk, traits
    from parsim.schedule.semantics import ALIASES, canonical_key, name_key
    assert name_key("ZB-V") == name_key("zb_v") == name_key("Zb V") == "zbv"
    assert build("PipeDream-Flush", 4, 8).name == build("DAPPLE", 4, 8).name == "1F1B"
    assert build("1F1B-RR", 4, 8).name == "PipeDream" and traits("1F1B-RR") == traits("PipeDream")
    for alias, target in ALIASES.items():
        assert canonical_key(alias) == name_key(target) and build(target, 2, 4).name == target
    with pytest.raises(ValueError, match="alias"):
        register("Pipedream_Flush", single_chunk(one_f_one_b))
