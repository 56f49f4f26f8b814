"""AMPNet's registry entry (Gaunt et al. 2017): the order of one instance at a time.

AMPNet is message-driven: each stage runs forward and backward messages as they arrive, so
its order is an *output* of the costs and of ``max_in_flight`` (``parsim.sim.ampnet`` realizes
it; ``simulate`` runs that engine for ``[schedule] name = "AMPNet"``). What the registry can
build without costs is the order with one instance in flight, which is the same whatever the
costs: rank r runs F0 B0 F1 B1 ... (synchronous naive model parallelism), lowered with one
update per stage at the end (``update_every`` = the step's microbatches).
"""
from __future__ import annotations

from parsim.schedule.builders import register, single_chunk
from parsim.schedule.ir import Schedule
from parsim.schedule.pipedream import _renamed, naive
from parsim.schedule.semantics import ScheduleTraits, set_traits


def ampnet_one_in_flight(pp: int, m: int) -> Schedule:
    """AMPNet with ``max_in_flight = 1``: the naive order (see the module doc)."""
    return _renamed(naive(pp, m), "AMPNet")


register("AMPNet", single_chunk(ampnet_one_in_flight, "AMPNet"))
set_traits("AMPNet", ScheduleTraits(asynchronous=True, message_driven=True))
