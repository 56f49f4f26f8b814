"""Corrupted schedules raise ScheduleError whose grid marks the failing step."""
from __future__ import annotations

import pytest

from parsim.errors import ScheduleError
from parsim.schedule import (
    Action,
    Op,
    Schedule,
    dry_run,
    gpipe,
    lower,
    one_f_one_b,
    parse,
    validate,
)


def _with_row(s: Schedule, rank: int, texts: list[str]) -> Schedule:
    rows = list(s.actions)
    rows[rank] = tuple(parse(t) for t in texts)
    return s.with_actions(rows)


def _raises(s: Schedule, *words: str) -> ScheduleError:
    with pytest.raises(ScheduleError) as ei:
        validate(s)
    err = ei.value
    assert "\n" not in str(err)
    for w in words:
        assert w in str(err), str(err)
    assert err.grid and ">> rank" in err.grid
    return err


def _marked_cell(grid: str) -> str:
    """The text of the [marked] cell."""
    line = next(ln for ln in grid.splitlines() if ln.startswith(">>"))
    return line[line.index("[") + 1: line.index("]")]


def test_backward_before_forward():
    s = _with_row(one_f_one_b(2, 2), 1, ["1B0", "1F0", "1F1", "1B1"])
    err = _raises(s, "rank 1 step 0 (1B0)", "before its forward 1F0")
    assert _marked_cell(err.grid) == "1B0"
    assert "^^^^^ rank 1 step 0" in err.grid


def test_missing_forward_is_found_at_its_backward():
    s = _with_row(gpipe(3, 3), 2, ["2F0", "2F2", "2B0", "2B1", "2B2"])
    err = _raises(s, "rank 2 step 3 (2B1)")
    assert _marked_cell(err.grid) == "2B1"


def test_missing_forward_and_backward():
    s = _with_row(gpipe(2, 3), 1, ["1F0", "1F2", "1B0", "1B2"])
    err = _raises(s, "stage 1 microbatch 1 has no F")
    assert ">> rank 1" in err.grid


def test_missing_backward_marks_the_forward():
    s = _with_row(gpipe(2, 2), 0, ["0F0", "0F1", "0B0"])
    err = _raises(s, "no B (or I+W)")
    assert _marked_cell(err.grid) == "0F1"


def test_weight_grad_before_input_grad():
    s = _with_row(one_f_one_b(1, 2), 0, ["0F0", "0W0", "0I0", "0F1", "0I1", "0W1"])
    err = _raises(s, "rank 0 step 1 (0W0)", "before its 0I0")
    assert _marked_cell(err.grid) == "0W0"


def test_duplicate_action():
    s = _with_row(gpipe(2, 2), 1, ["1F0", "1F1", "1F1", "1B0", "1B1"])
    err = _raises(s, "rank 1 step 2 (1F1)", "twice")
    assert _marked_cell(err.grid) == "1F1"


def test_action_on_the_wrong_rank():
    s = _with_row(gpipe(2, 1), 0, ["0F0", "1F0", "0B0"])
    _raises(s, "stage 1 lives on rank 1")


def test_cross_rank_cycle_deadlocks():
    """Rank 0 waits for 1B0 before sending 0F1; rank 1 wants 0F1 before doing 1B0."""
    s = _with_row(one_f_one_b(2, 2), 0, ["0F0", "0B0", "0F1", "0B1"])
    s = _with_row(s, 1, ["1F0", "1F1", "1B0", "1B1"])
    for sched in (s, lower(s)):
        err = _raises(sched, "deadlock", "rank 0 step", "waits for", "rank 1 step")
        assert _marked_cell(err.grid) in ("0B0", "0RECV_B0")
    err = _raises(s, "rank 0 step 1 (0B0) waits for 1B0/1I0 on rank 1", "rank 1 step 1 (1F1) waits for 0F1")
    assert _marked_cell(err.grid) == "0B0"


def test_lowered_missing_recv_and_send():
    low = lower(one_f_one_b(2, 2))
    row = [str(a) for a in low.actions[1] if str(a) != "1RECV_F1"]
    err = _raises(_with_row(low, 1, row), "(1F1)", "no 1RECV_F1 posted before it")
    assert _marked_cell(err.grid) == "1F1"
    row0 = [str(a) for a in low.actions[0] if str(a) != "0SEND_F1"]
    err = _raises(_with_row(low, 0, row0), "0F1 has no 0SEND_F1")
    assert _marked_cell(err.grid) == "0F1"


def test_send_before_its_producer():
    low = lower(one_f_one_b(2, 1))
    row = [str(a) for a in low.actions[0]]
    k = row.index("0F0")
    row[k], row[k + 1] = row[k + 1], row[k]
    err = _raises(_with_row(low, 0, row), "0SEND_F0", "before its 0F0")
    assert _marked_cell(err.grid) == "0SEND_F0"


def test_send_between_stages_of_one_rank():
    s = Schedule("v", 2, 1, (0, 0), [[parse(t) for t in ("0F0", "0SEND_F0", "1RECV_F0", "1F0", "1B0", "0B0")]])
    _raises(s, "share rank 0", "no SEND/RECV")


def test_same_rank_stage_order():
    s = Schedule("v", 2, 1, (0, 0), [[parse(t) for t in ("1F0", "0F0", "1B0", "0B0")]])
    err = _raises(s, "(1F0)", "before its input 0F0 on the same rank")
    assert _marked_cell(err.grid) == "1F0"


def test_reduce_grad_and_step_order():
    low = lower(one_f_one_b(2, 2))
    row = [str(a) for a in low.actions[0]]
    row.remove("0REDUCE_GRAD")
    row.insert(row.index("0B1"), "0REDUCE_GRAD")
    _raises(_with_row(low, 0, row), "0REDUCE_GRAD", "before the last backward of stage 0")
    row = [str(a) for a in low.actions[0]]
    row.remove("0STEP")
    row.insert(row.index("0REDUCE_GRAD"), "0STEP")
    _raises(_with_row(low, 0, row), "0STEP", "before")


def test_zero3_compute_outside_its_window():
    low = lower(gpipe(1, 2), zero3=True)
    row = [str(a) for a in low.actions[0]]
    row.remove("0RESHARD")  # the first one: between forwards and backwards
    row.insert(row.index("0F1"), "0RESHARD")
    err = _raises(_with_row(low, 0, row), "(0F1)", "not gathered")
    assert _marked_cell(err.grid) == "0F1"


def test_dry_run_alone_reports_deadlock_and_local_errors():
    s = _with_row(gpipe(1, 1), 0, ["0B0", "0F0"])
    with pytest.raises(ScheduleError, match="0F0"):
        dry_run(s)
    with pytest.raises(TypeError, match="unknown duration"):
        dry_run(gpipe(1, 1), t_f=1)


def test_long_rows_are_windowed_around_the_mark():
    s = gpipe(2, 64)
    row = [str(a) for a in s.actions[1]]
    row.remove("1B63")
    row.insert(10, "1B63")
    err = _raises(_with_row(s, 1, row), "rank 1 step 10 (1B63)")
    assert "[1B63]" in err.grid and "steps" in err.grid
    assert max(len(ln) for ln in err.grid.splitlines()) < 200


def test_action_validation():
    with pytest.raises(ValueError):
        Action(0, Op.F)
    with pytest.raises(ValueError):
        Action(0, Op.STEP, 1)
    with pytest.raises(ValueError):
        Action(-1, Op.F, 0)
    with pytest.raises(ValueError, match="stage_to_rank"):
        Schedule("x", 2, 1, (0,), [[]])
