"""Schedule IR, builders, lowering passes, validation and text grids.

See ``ir.py`` for the action grammar and runtime semantics shared by the simulator
and the torch runtime.
"""
from parsim.schedule import ampnet, bidirectional, pipedream, terapipe, zero_bubble  # noqa: F401  (register their builders)
from parsim.schedule.bidirectional import chimera, dualpipe, dualpipe_v
from parsim.schedule.builders import (
    BUILDERS,
    build,
    gpipe,
    interleaved_1f1b,
    lookup,
    one_f_one_b,
    one_f_one_b_iw,
    register,
    single_chunk,
    zero_bubble_h1,
    zero_bubble_h2,
)
from parsim.schedule.dryrun import (
    DryRun,
    Durations,
    dry_run,
    format_timeline_grid,
    peak_in_flight,
)
from parsim.schedule.grid import format_grid
from parsim.schedule.ir import Action, Op, Schedule, parse, schedule_from_csv
from parsim.schedule.passes import (
    add_grad_reduction,
    add_send_recv,
    add_unshard_reshard,
    lower,
    validate,
)
from parsim.schedule.pipedream import gpipe_remat, naive, pipedream_2bw
from parsim.schedule.pipedream import pipedream as pipedream_async
from parsim.schedule.semantics import ScheduleTraits, traits
from parsim.schedule.zero_bubble import zbv

__all__ = [
    "Action", "Op", "Schedule", "parse", "schedule_from_csv",
    "BUILDERS", "build", "lookup", "register", "single_chunk",
    "gpipe", "one_f_one_b", "one_f_one_b_iw", "interleaved_1f1b", "zero_bubble_h1", "zero_bubble_h2",
    "add_send_recv", "add_unshard_reshard", "add_grad_reduction", "lower", "validate",
    "DryRun", "Durations", "dry_run", "peak_in_flight",
    "format_grid", "format_timeline_grid",
    "naive", "gpipe_remat", "pipedream_async", "pipedream_2bw", "zbv", "dualpipe", "dualpipe_v", "chimera",
    "ScheduleTraits", "traits",
]
