"""Federated learning rounds on a virtual clock: a population of edge clients (compute speed,
links, availability), the server's selection rules, sync FedAvg rounds or buffered async
aggregation (FedBuff), and Konečný et al.'s structured and sketched uplink updates.

``load_fl_scenario(path)`` -> FLScenario; ``simulate_fl(scenario)`` -> FLResult (rows per round,
metrics). See README "Federated learning rounds".
"""
from parsim.federated.compression import Encoding, encode
from parsim.federated.config import (
           CompressionConfig,
           DeviceClass,
           FederatedConfig,
           FLScenario,
           load_fl_scenario,
)
from parsim.federated.population import Population, completion_time_s, make_population
from parsim.federated.results import FLResult
from parsim.federated.sim import simulate_fl

__all__ = [
           "CompressionConfig",
           "DeviceClass",
           "Encoding",
           "FLResult",
           "FLScenario",
           "FederatedConfig",
           "Population",
           "completion_time_s",
           "encode",
           "load_fl_scenario",
           "make_population",
           "simulate_fl",
]
