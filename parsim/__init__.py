"""parsim: a discrete-event performance model of distributed deep-learning training.

Public Python interface::

    import parsim
    sc = parsim.load_scenario("scenarios/gpt3-175b-1f1b.toml", ["parallel.pp=16"])
    res = parsim.simulate(sc)
    res.to_json()["step_time_s"], res.timeline  # metrics dict, span DataFrame
"""
from parsim.config.scenario import Scenario
from parsim.errors import ConfigError, ParsimError, ScheduleError
from parsim.scenario import load_scenario
from parsim.simulate import schedule_for, simulate

__all__ = ["ConfigError", "ParsimError", "ScheduleError", "Scenario", "load_scenario", "schedule_for", "simulate"]
__version__ = "0.1.0"
