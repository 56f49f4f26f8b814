"""Schedule IR: grammar, round trips, builders over a grid, lowering passes."""
from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parsim.errors import ScheduleError
from parsim.schedule import (
    BUILDERS,
    Action,
    Op,
    Schedule,
    add_grad_reduction,
    add_send_recv,
    add_unshard_reshard,
    build,
    format_grid,
    format_timeline_grid,
    gpipe,
    lower,
    one_f_one_b,
    one_f_one_b_iw,
    parse,
    schedule_from_csv,
    validate,
)

# ----------------------------------------------------------------------------- grammar


@pytest.mark.parametrize(
    "text, action",
    [
        ("2F0", Action(2, Op.F, 0)),
        ("0B11", Action(0, Op.B, 11)),
        ("12I3", Action(12, Op.I, 3)),
        ("1W0", Action(1, Op.W, 0)),
        ("3SEND_F1", Action(3, Op.SEND_F, 1)),
        ("3RECV_B10", Action(3, Op.RECV_B, 10)),
        ("1UNSHARD", Action(1, Op.UNSHARD)),
        ("1RESHARD", Action(1, Op.RESHARD)),
        ("0REDUCE_GRAD", Action(0, Op.REDUCE_GRAD)),
        ("0STEP", Action(0, Op.STEP)),
    ],
)
def test_text_form(text, action):
    assert str(action) == text
    assert parse(text) == action


@given(
    st.integers(0, 999),
    st.sampled_from([o for o in Op if o is not Op.OVERLAP_F_B]),
    st.integers(0, 9999),
)
def test_parse_inverts_str(stage, op, mb):
    a = Action(stage, op, mb if op.has_microbatch else None)
    assert parse(str(a)) == a


@pytest.mark.parametrize("bad", ["", "F0", "2X0", "2F", "2SEND_F", "1STEP3", "-1F0", "2F0 2F1", "2f0"])
def test_parse_rejects_with_the_text(bad):
    with pytest.raises(ValueError, match="not an action"):
        parse(bad)


def test_op_kinds():
    assert {o for o in Op if o.is_compute} == {Op.F, Op.B, Op.I, Op.W, Op.STEP, Op.OVERLAP_F_B}
    assert all(o.is_comm != o.is_compute for o in Op)
    assert Op.SEND_F.is_p2p and not Op.UNSHARD.is_p2p


# ----------------------------------------------------------------------------- builders

GRID = [
    (name, pp, m, vpp)
    for name in ("GPipe", "1F1B", "ZBH1", "ZBH2")
    for pp in (1, 2, 3, 4, 7, 8, 16)
    for m in (1, 2, 3, 5, 8, 17, 32, 64)
    for vpp in (1,)
    if pp * m <= 256 or (pp, m) == (16, 64)
] + [
    ("Interleaved1F1B", pp, m, vpp)
    for pp in (1, 2, 3, 4, 8, 16)
    for vpp in (2, 3, 4)
    for m in (pp, 2 * pp, 4 * pp)
    if pp * m * vpp <= 512 or (pp, m, vpp) == (16, 16, 4)
]


def _check_complete(s: Schedule) -> None:
    """Every (stage, microbatch): one F, and one B or one I and one W, on its rank."""
    c = Counter((a.op, a.stage, a.microbatch) for row in s.actions for a in row if a.op.is_compute)
    for stage in range(s.n_stages):
        for m in range(s.n_microbatches):
            assert c[(Op.F, stage, m)] == 1
            split = c[(Op.I, stage, m)]
            assert (c[(Op.B, stage, m)], split, c[(Op.W, stage, m)]) in ((1, 0, 0), (0, 1, 1))
    for r, row in enumerate(s.actions):
        assert all(s.rank_of(a.stage) == r for a in row)


@pytest.mark.parametrize("name, pp, m, vpp", GRID)
def test_builder_grid(name, pp, m, vpp):
    s = build(name, pp, m, vpp)
    assert (s.pp, s.n_stages, s.n_microbatches) == (pp, pp * vpp, m)
    _check_complete(s)
    validate(s)
    low = lower(s)
    validate(low)
    assert low.compute_only().actions == tuple(
        row + tuple(Action(st_, Op.STEP) for st_ in _step_order(row)) for row in s.actions
    )
    if pp == 1:
        assert not low.is_lowered  # one rank: no SEND/RECV at all
    for sched in (s, low):
        assert Schedule.from_csv(sched.to_csv(), sched.name, sched.n_stages, sched.n_microbatches,
                                 sched.stage_to_rank) == sched
        assert schedule_from_csv(sched.to_csv(), sched.name) == sched  # sizes inferred
        assert Schedule.from_text(sched.to_text(), sched.name) == sched
        assert all(parse(str(a)) == a for row in sched.actions for a in row)


def _step_order(row):
    last = {}
    for k, a in enumerate(row):
        if a.op in (Op.B, Op.W):
            last[a.stage] = k
    return [st_ for st_, _ in sorted(last.items(), key=lambda kv: kv[1])]


@pytest.mark.parametrize("name, pp, m, vpp", [g for g in GRID if g[1] * g[2] * g[3] <= 128][::3])
def test_zero3_lowering_validates(name, pp, m, vpp):
    low = lower(build(name, pp, m, vpp), zero3=True)
    validate(low)
    for r, row in enumerate(low.actions):
        for stage in low.stages_of(r):
            ops = [a.op for a in row if a.stage == stage and a.op in (Op.UNSHARD, Op.RESHARD)]
            assert ops and ops[0] is Op.UNSHARD and ops[-1] is Op.RESHARD
            assert ops == [Op.UNSHARD, Op.RESHARD] * (len(ops) // 2)


def test_one_f_one_b_is_megatron_order():
    s = one_f_one_b(4, 6)
    assert s.to_text().splitlines()[0] == "rank 0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5"
    assert s.to_text().splitlines()[3] == "rank 3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5"
    assert [str(a) for a in one_f_one_b(4, 2).actions[0]] == ["0F0", "0F1", "0B0", "0B1"]


def test_interleaved_placement_and_warmup():
    s = build("interleaved1f1b", 4, 8, 2)
    assert s.stage_to_rank == (0, 1, 2, 3, 0, 1, 2, 3)
    # rank 0 warm-up: (pp-1)*2 + (vpp-1)*pp = 10 forwards, chunk 0 then chunk 1 in groups of pp
    row = [str(a) for a in s.actions[0]]
    assert row[:11] == ["0F0", "0F1", "0F2", "0F3", "4F0", "4F1", "4F2", "4F3", "0F4", "0F5", "0F6"]
    assert row[11] == "4B0"  # first backward: last chunk first
    last = [str(a) for a in s.actions[3]]
    assert last[:8] == ["3F0", "3F1", "3F2", "3F3", "7F0", "7B0", "7F1", "7B1"]


def test_one_f_one_b_iw_splits_in_place():
    s = one_f_one_b_iw(3, 4)
    merged = [[a if a.op is not Op.I else Action(a.stage, Op.B, a.microbatch) for a in row if a.op is not Op.W]
              for row in s.actions]
    assert tuple(map(tuple, merged)) == one_f_one_b(3, 4).actions
    for row in s.actions:
        for k, a in enumerate(row):
            if a.op is Op.I:
                assert row[k + 1] == Action(a.stage, Op.W, a.microbatch)


# ----------------------------------------------------------------------------- registry


def test_registry_names_and_lookup():
    assert {"GPipe", "1F1B", "Interleaved1F1B", "ZBH1", "ZBH2"} <= set(BUILDERS)
    for alias in ("gpipe", "1f1b", "INTERLEAVED1F1B", "zb-h1", "zb_h2", "ZB H1"):
        build(alias, 4, 8, 2 if "INTER" in alias else 1)
    assert build("zbh1", 2, 2).name == "ZBH1"


@pytest.mark.parametrize(
    "args, words",
    [
        (("NoSuchPipe", 4, 8), ["unknown schedule", "GPipe", "1F1B", "ZBH2"]),
        (("Interleaved1F1B", 4, 8, 1), ["vpp >= 2"]),
        (("Interleaved1F1B", 4, 6, 2), ["multiple of pp=4"]),
        (("1F1B", 4, 8, 2), ["vpp must be 1"]),
        (("ZBH2", 4, 8, 3), ["vpp must be 1"]),
        (("GPipe", 4, 0), ["microbatches must be >= 1"]),
        (("GPipe", 0, 4), ["pp must be >= 1"]),
        (("1F1B", 4, 8, 0), ["vpp must be >= 1"]),
    ],
)
def test_build_rejects_impossible_combinations(args, words):
    with pytest.raises(ScheduleError) as ei:
        build(*args)
    msg = str(ei.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_registry_is_extensible():
    from parsim.schedule import register, single_chunk
    from parsim.schedule.builders import BUILDERS as reg

    def reversed_gpipe(pp, m):
        s = gpipe(pp, m)
        return s.with_actions(
            [[a for a in row if a.op is Op.F] + [a for a in row if a.op is Op.B][::-1] for row in s.actions]
        )

    register("TestReversedGPipe", single_chunk(reversed_gpipe))
    try:
        validate(build("test-reversed-gpipe", 3, 4))
        with pytest.raises(ScheduleError, match="vpp must be 1"):
            build("TestReversedGPipe", 3, 4, 2)
    finally:
        del reg["TestReversedGPipe"]


# ----------------------------------------------------------------------------- passes


def test_add_send_recv_positions():
    low = add_send_recv(one_f_one_b(2, 2))
    assert [str(a) for a in low.actions[0]] == [
        "0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0", "0B0", "0RECV_B1", "0B1"]
    assert [str(a) for a in low.actions[1]] == [
        "1RECV_F0", "1F0", "1B0", "1SEND_B0", "1RECV_F1", "1F1", "1B1", "1SEND_B1"]


def test_no_send_recv_between_stages_on_one_rank():
    s = build("Interleaved1F1B", 2, 2, 2)
    low = add_send_recv(s)
    for r, row in enumerate(low.actions):
        for a in row:
            if a.op in (Op.SEND_F, Op.RECV_B):
                assert low.rank_of(a.stage + 1) != r
            if a.op in (Op.SEND_B, Op.RECV_F):
                assert low.rank_of(a.stage - 1) != r
    # stage 3 (last) sends no F; stage 0 (first) receives no F
    ops = {str(a) for row in low.actions for a in row}
    assert not {"3SEND_F0", "0RECV_F0", "0SEND_B0", "3RECV_B0"} & ops
    # interleaving crosses rank 1 -> rank 0 between stage 1 and stage 2
    assert "1SEND_F0" in ops and "2RECV_F0" in ops and "2SEND_B0" in ops and "1RECV_B0" in ops


def test_grad_reduction_after_last_backward_and_steps_last():
    low = add_grad_reduction(add_send_recv(zero_bubble_h1_small()))
    for r, row in enumerate(low.actions):
        text = [str(a) for a in row]
        last_w = max(k for k, a in enumerate(row) if a.op is Op.W)
        assert text[last_w + 1] == f"{r}REDUCE_GRAD"
        assert text[-1] == f"{r}STEP"
    low = add_grad_reduction(add_send_recv(one_f_one_b(3, 3)))
    row = [str(a) for a in low.actions[1]]
    assert row[row.index("1B2") + 1] == "1SEND_B2"  # the send first: it is on the critical path
    assert row[row.index("1B2") + 2] == "1REDUCE_GRAD"
    no_reduce = add_grad_reduction(one_f_one_b(2, 2), reduce=False)
    assert [str(a) for a in no_reduce.actions[0]][-1] == "0STEP"
    validate(no_reduce)


def test_grad_reduction_without_overlap_waits_for_the_ranks_last_backward():
    # interleaved 1F1B, 2 ranks x 2 chunks: rank 0's chunk 2 finishes its backwards before chunk 0
    # does. Overlapped (Megatron-Core --overlap-grad-reduce) chunk 2's buckets launch at its own
    # last backward; without overlap (finalize_model_grads after the pipeline flush) every chunk's
    # reduction follows the rank's last backward, in the order the chunks finished
    sched = add_send_recv(build("Interleaved1F1B", 2, 4, 2))
    for r in range(2):
        over_row = add_grad_reduction(sched).actions[r]
        late_row = add_grad_reduction(sched, after_all_backward=True).actions[r]
        over, late = [str(a) for a in over_row], [str(a) for a in late_row]
        first, second = r + 2, r  # the rank's later chunk finishes its backwards first
        last_b = max(k for k, a in enumerate(late_row) if a.op is Op.B)
        assert over.index(f"{first}REDUCE_GRAD") < over.index(f"{second}B3")
        assert late.index(f"{first}REDUCE_GRAD") > last_b and late.index(f"{second}REDUCE_GRAD") > last_b
        assert late.index(f"{first}REDUCE_GRAD") < late.index(f"{second}REDUCE_GRAD")
        assert sorted(over) == sorted(late)  # the same actions, moved
        validate(add_grad_reduction(sched, after_all_backward=True))


def zero_bubble_h1_small():
    return build("ZBH1", 3, 4)


def test_unshard_reshard_windows():
    g = add_unshard_reshard(gpipe(2, 2))
    assert [str(a) for a in g.actions[0]] == [
        "0UNSHARD", "0F0", "0F1", "0RESHARD", "0UNSHARD", "0B0", "0B1", "0RESHARD"]
    o = add_unshard_reshard(one_f_one_b(2, 2))  # overlapping windows merge into one
    assert [str(a) for a in o.actions[1]] == ["1UNSHARD", "1F0", "1B0", "1F1", "1B1", "1RESHARD"]
    full = lower(gpipe(2, 2), zero3=True)
    assert [str(a) for a in full.actions[1]][:3] == ["1UNSHARD", "1RECV_F0", "1F0"]


def test_passes_refuse_to_run_twice():
    low = lower(one_f_one_b(2, 2))
    with pytest.raises(ScheduleError, match="already has"):
        add_send_recv(low)
    with pytest.raises(ScheduleError, match="already has"):
        add_grad_reduction(low)


def test_lower_keeps_the_name_and_shape():
    s = build("ZBH2", 4, 8)
    low = lower(s, zero3=True)
    assert (low.name, low.n_stages, low.n_microbatches, low.stage_to_rank) == (
        s.name, s.n_stages, s.n_microbatches, s.stage_to_rank)


def test_csv_is_pytorch_shaped():
    s = lower(one_f_one_b(2, 2))
    rows = s.to_csv().splitlines()
    assert len(rows) == 2
    assert rows[0].split(",")[:3] == ["0F0", "0SEND_F0", "0F1"]
    assert len(rows[0].split(",")) == len(rows[1].split(","))  # padded with empty cells
    assert "STEP" not in s.to_csv(torch_compatible=True)


def test_grids_render():
    s = build("1F1B", 3, 4)
    text = format_grid(s)
    assert text.splitlines()[1].split()[:3] == ["rank", "0", "0F0"]
    tl = format_timeline_grid(s)
    assert "makespan 12" in tl  # (m + p - 1) * (f + b) with unit times
    assert tl.splitlines()[2].split()[:3] == ["rank", "1", "."]  # rank 1 idles one unit first
    marked = format_grid(lower(s), mark=(1, 4), compute_only=False)
    assert "[1F1]" in marked and ">> rank 1" in marked and "^^^^^" in marked
