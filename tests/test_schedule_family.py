"""The whole schedule family: every builder over a (pp, microbatches, vpp) grid validates,
lowers and dry-runs; closed forms of the new schedules under the dry run."""
from __future__ import annotations

import pytest
from conftest import published

from parsim.errors import ScheduleError
from parsim.schedule import (
    BUILDERS,
    Action,
    Op,
    Schedule,
    build,
    chimera,
    dry_run,
    dualpipe,
    dualpipe_v,
    lower,
    naive,
    parse,
    peak_in_flight,
    traits,
    validate,
    zbv,
)
from parsim.schedule.ir import overlap

NEW = ("Naive", "GPipeRemat", "PipeDream", "PipeDream2BW", "ZBV", "DualPipe", "DualPipeV", "Chimera")


def _grid():
    for name in BUILDERS:
        for pp in (1, 2, 3, 4, 6, 8):
            for m in (1, 2, 3, 4, 8, 12, 16, 24):
                for vpp in (1, 2, 3):
                    if pp * m * vpp > 256:
                        continue
                    try:
                        build(name, pp, m, vpp)
                    except ScheduleError:
                        continue
                    yield name, pp, m, vpp


GRID = list(_grid())


def test_grid_covers_every_builder():
    assert set(NEW) <= set(BUILDERS)
    assert {g[0] for g in GRID} == set(BUILDERS)


@pytest.mark.parametrize("name, pp, m, vpp", GRID)
def test_every_builder_validates_lowered_and_not(name, pp, m, vpp):
    s = build(name, pp, m, vpp)
    for sched in (s, lower(s), lower(s, zero3=True)):
        validate(sched, f=1.0, b=2.0, i=1.0, w=1.0, comm=0.5)
    # every (stage, microbatch of its chain): one F and one B, or one I and one W
    parts = [(p.op, p.stage, p.microbatch) for row in s.actions for a in row for p in a.parts]
    assert len(parts) == len(set(parts))
    for st in range(s.n_stages):
        for j in s.microbatches_of(st):
            assert (Op.F, st, j) in parts
            assert ((Op.B, st, j) in parts) != ((Op.I, st, j) in parts and (Op.W, st, j) in parts)
    text = s.to_csv()
    assert Schedule.from_csv(text, s.name, s.n_stages, s.n_microbatches, s.stage_to_rank, s.n_chains) == s


def test_overlap_action_text_round_trip_and_checks():
    a = overlap(Action(0, Op.F, 3), Action(7, Op.B, 1))
    assert str(a) == "(0F3;7B1)OVERLAP_F_B" and parse(str(a)) == a
    with pytest.raises(ValueError):
        Action(0, Op.OVERLAP_F_B)
    with pytest.raises(ValueError):
        Action(1, Op.OVERLAP_F_B, None, (Action(0, Op.F, 0), Action(1, Op.B, 0)))
    with pytest.raises(ValueError, match="not an action"):
        parse("(0F3)OVERLAP_F_B")


@pytest.mark.parametrize("name, args", [("DualPipe", (3, 8)), ("DualPipe", (4, 6)), ("DualPipeV", (4, 6)),
                                        ("Chimera", (3, 4)), ("ZBV", (4, 8, 3))])
def test_impossible_combinations(name, args):
    with pytest.raises(ScheduleError) as ei:
        build(name, *args)
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_naive_bubble(p):
    for m in (1, 3, 8):
        run = dry_run(naive(p, m), f=1, b=2, comm=0)
        assert run.makespan == p * m * 3
        assert run.bubble_fraction == pytest.approx((p - 1) / p)


def test_zbv_zero_bubble_and_memory():
    """ZB-V: every rank busy from its first to its last action when T_F = T_I = T_W; peak
    stash 2p half-size stage-microbatches = p full-rank microbatches (zb-formulas: p*M_B)."""
    assert published("zb-formulas")["expected"]["peak_activation_memory"]["ZB-V"].startswith("p*M_B")
    for p in (2, 3, 4, 8):
        for m in (2 * p, 3 * p, 4 * p):
            run = dry_run(zbv(p, m), f=1, i=1, w=1, comm=0)
            assert max(run.span_bubble(r) for r in range(p)) == 0
            assert max(peak_in_flight(zbv(p, m))) == 2 * p


@pytest.mark.parametrize("f, i, w, ov", [(1, 1, 1, 3), (1, 1, 1, 2.5), (2, 2, 1, 4), (3, 3, 2, 7), (3, 3, 3, 8)])
def test_dualpipe_bubble_deepseek_table2(f, i, w, ov):
    """DeepSeek-V3 Table 2: DualPipe bubble (PP/2-1)(F&B + B - 3W), activations PP+1 (here
    exact when the forward equals the input backward, F = B - W, the paper's setting),
    independent of the number of microbatches."""
    formula = published("deepseekv3-table2-pp-formulas")["expected"]
    assert formula["bubble"]["DualPipe"] == "(PP/2-1)(F&B+B-3W)" and formula["activation_memory"]["DualPipe"] == "PP+1"
    b = i + w
    for p in (2, 4, 6, 8):
        for m in (2 * p, 2 * p + 2, 4 * p):
            s = dualpipe(p, m)
            run = dry_run(s, f=f, b=b, i=i, w=w, comm=0, overlap=ov)
            assert max(run.makespan - x for x in run.busy) == pytest.approx((p / 2 - 1) * (ov + b - 3 * w))
            assert max(peak_in_flight(s)) == p + 1


def test_dualpipe_v_and_zb1p():
    """DualPipeV runs DualPipe's steps on a V (1x parameters); ZB1P (DeepSeek's table) is
    ZB-H1: (PP-1)(F+B-2W) with B the full backward = (p-1)(F+I-W)."""
    for p in (2, 4, 8):
        s = dualpipe_v(p, 4 * p)
        assert s.n_chains == 1 and sorted(s.stages_of(0)) == [0, 2 * p - 1]
        run = dry_run(s, f=1, b=2, i=1, w=1, comm=0, overlap=3)
        assert max(run.makespan - x for x in run.busy) < dry_run(build("1F1B", p, 4 * p), f=2, b=4, comm=0).bubble(0)
        h1 = dry_run(build("ZBH1", p, 3 * p), f=2, i=2, w=1, comm=0)
        assert max(h1.bubble(r) for r in range(p)) == (p - 1) * (2 + 3 - 2 * 1)


@pytest.mark.parametrize("p", [2, 4, 6, 8])
def test_chimera_bubble(p):
    """Chimera (Li & Hoefler Table 1): (D-2)/(2N+D-2) with equal F and B; at most D in flight."""
    pub = published("chimera-bubble")["expected"]
    assert pub["chimera_bubble_ratio"] == "(D-2)/(2N+D-2)"
    for m in (p, 2 * p, 4 * p):
        run = dry_run(chimera(p, m), f=1, b=1, comm=0)
        assert run.bubble_fraction == pytest.approx((p - 2) / (2 * m + p - 2))
        assert max(peak_in_flight(chimera(p, m))) <= p
    assert dry_run(chimera(4, 8), f=1, b=1, comm=0).bubble_fraction == pytest.approx(pub["example_D4_N8"], abs=1e-4)


def test_traits():
    assert traits("pipedream").weight_versions == "pipedream" and traits("PipeDream2BW").weight_versions == "2bw"
    assert traits("zb-v").stages_per_rank == 2 and traits("DualPipe").n_chains == 2
    assert traits("GPipeRemat").remat and traits("1F1B") == traits("nonexistent")


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_cli_prints_every_schedule(name, capsys):
    from parsim.cli.main import main
    vpp = ["--vpp", "2"] if name == "Interleaved1F1B" else []
    assert main(["schedule", name, "--pp", "4", "--microbatches", "8", *vpp]) == 0
    out = capsys.readouterr().out
    assert out.startswith(build(name, 4, 8, 2 if vpp else 1).name) and "makespan" in out
    assert main(["schedule", name, "--pp", "4", "--microbatches", "8", "--csv", *vpp]) == 0
