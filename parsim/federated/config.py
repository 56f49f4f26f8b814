"""A federated-learning scenario: its TOML tables and the strict loader.

A federated scenario is its own kind of file (no hardware, gpus, [parallel] or [training]):

    name = "fl-mobile"
    [federated]            # the population, the task, the server's rules
    [model]                # optional: preset = "...", or explicit fields (the update's tensors)
    [compression]          # optional: the uplink encoding (Konečný et al. 2016)

The model is one of: a ``[model]`` table (a preset or explicit fields, as in training
scenarios), ``federated.layer_shapes = [[784, 200], [200, 10]]`` (a dense network: a weight
matrix and a bias per layer), or ``federated.model_params = N`` (one flat vector). Units at
the edge are the ones people quote (Mbit/s); inside they are SI (bit/s, s).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from parsim.errors import ConfigError
from parsim.federated.compression import METHODS, Tensor, check_chain, model_tensors
from parsim.files import read_input_text
from parsim.model import model_from_table, total_params
from parsim.model.spec import MAX_WIDTH
from parsim.scenario import read_scenario_doc

MODES = ("sync", "async")
AVAILABILITY = ("always", "probability", "trace")
MBIT = 1e6
TOP_KEYS = ("name", "description", "federated", "model", "compression")


@dataclass(frozen=True)
class DeviceClass:
    """One kind of client device (a share of the population with its own medians)."""

    name: str
    """Label in the summary."""
    fraction: float
    """Share of the clients in this class (the classes' fractions sum to 1)."""
    seconds_per_sample: float
    """Median forward (inference) seconds per training sample (FedScale's ms/sample / 1000)."""
    uplink_bit_per_s: float
    """Median uplink bandwidth, bit/s."""
    downlink_bit_per_s: float
    """Median downlink bandwidth, bit/s."""


@dataclass(frozen=True)
class AvailabilityTrace:
    """Client on/off behaviour in FedScale's client_behave_trace format: per trace, the
    starts (``active``) and ends (``inactive``) of its online intervals within a period of
    ``finish_time`` seconds that repeats. Client i follows trace i mod len(traces)."""

    finish_time: tuple[float, ...]
    """Period of each trace, s."""
    active: tuple[tuple[float, ...], ...]
    """Starts of the online intervals, s, ascending, per trace."""
    inactive: tuple[tuple[float, ...], ...]
    """Ends of the online intervals, s, per trace."""


@dataclass(frozen=True)
class FederatedConfig:
    """The ``[federated]`` table."""

    clients: int
    """Clients in the population."""
    clients_per_round: int
    """Sync: updates the server aggregates per round (K). Async: clients training at once (concurrency)."""
    rounds: int
    """Rounds to run (sync: attempted rounds; async: aggregations of buffer_size updates)."""
    mode: str
    """"sync" (FedAvg rounds) or "async" (FedBuff: aggregate every buffer_size updates)."""
    buffer_size: int
    """Async: updates per aggregation (FedBuff's K; 10 in Nguyen et al. 2022)."""
    local_steps: int
    """Local SGD steps per task."""
    batch_size: int
    """Samples per local step."""
    seconds_per_sample: float
    """Median forward seconds per sample (when no device classes)."""
    compute_sigma: float
    """Lognormal spread of seconds_per_sample (sigma of its log); 0: every client the same."""
    train_factor: float
    """Training cost per sample over the forward's: 3 (backward = 2 forwards, FedScale's augmentation_factor)."""
    uplink_bit_per_s: float
    """Median uplink, bit/s (when no device classes)."""
    downlink_bit_per_s: float
    """Median downlink, bit/s (when no device classes)."""
    uplink_sigma: float
    """Lognormal spread of the uplink."""
    downlink_sigma: float
    """Lognormal spread of the downlink."""
    device_classes: tuple[DeviceClass, ...]
    """Device classes (replace the three medians above), or empty."""
    availability: str
    """"always", "probability" (each client online with availability_probability at each
    selection) or "trace" (availability_trace)."""
    availability_probability: float
    """Probability that a client is online when the server selects."""
    availability_trace: AvailabilityTrace | None
    """FedScale-format on/off trace (availability = "trace")."""
    over_commitment: float
    """Selected clients = floor(clients_per_round x over_commitment) (FedScale default 1.3, Bonawitz et al. 2019 use 130%)."""
    deadline_s: float | None
    """Sync: the round closes at this time after it starts even with fewer than K updates;
    async: a task longer than this is dropped. None: no deadline."""
    min_fraction: float
    """Sync: a round that closes with fewer than min_fraction x K updates fails (no aggregation)."""
    max_staleness: int | None
    """Async: an update more than this many model versions old is dropped (FedScale's
    max_staleness); None: every update is aggregated."""
    weight_bits: int
    """Bits per model value sent down and per uncompressed update value sent up (32: float32)."""
    seed: int
    """Seed of the population and of every draw (fixed seed, same result)."""


@dataclass(frozen=True)
class CompressionConfig:
    """The ``[compression]`` table: uplink encoding steps applied in order."""

    methods: tuple[str, ...]
    """Steps: low_rank | random_mask (structured, at most one, first), subsample, quantize (last); () = none."""
    rank: int | None
    """low_rank: k (each d1 x d2 update is A B with A d1 x k from a seed; B k x d2 is sent)."""
    keep_fraction: float | None
    """random_mask / subsample: share of values kept (the positions come from a seed)."""
    bits: int | None
    """quantize: bits per value (plus two floats per tensor: its min and max)."""
    rotation: bool
    """quantize: random Hadamard rotation first (each tensor padded to a power of two)."""


@dataclass(frozen=True)
class FLScenario:
    """A loaded federated scenario."""

    name: str
    """Scenario name."""
    file: str
    """Where it was read from."""
    federated: FederatedConfig
    """Population, task and server rules."""
    compression: CompressionConfig
    """Uplink encoding."""
    params: int
    """Model parameters P."""
    tensors: tuple[Tensor, ...]
    """The update's tensors (shapes with multiplicity); their sizes sum to params."""
    model_name: str
    """Preset or label of the model."""


def load_fl_scenario(path: str | Path, overrides: list[str] | None = None) -> FLScenario:
    """Read a federated scenario file; ``overrides`` are ``section.key=value`` strings."""
    doc, file = read_scenario_doc(path, overrides)
    return fl_scenario_from_dict(doc, file, base_dir=Path(path).parent)


class _Table:
    """Typed, strict reads from one TOML table; every problem names file and dotted key."""

    def __init__(self, doc, file: str, prefix: str, known):
        if not isinstance(doc, dict):
            raise ConfigError(file, prefix.rstrip("."), f"expected a table, got {doc!r}")
        for k in doc:
            if k not in known:
                raise ConfigError(file, f"{prefix}{k}", f"unknown key (known: {', '.join(sorted(known))})")
        self.doc, self.file, self.prefix = doc, file, prefix

    def bad(self, key: str, problem: str) -> ConfigError:
        return ConfigError(self.file, f"{self.prefix}{key}", problem)

    def has(self, key: str) -> bool:
        return key in self.doc

    def int(self, key: str, default=None, minimum: int = 1, maximum: int | None = None):
        if key not in self.doc:
            if default is None:
                raise self.bad(key, "missing (required)")
            return default
        v = self.doc[key]
        if not isinstance(v, int) or isinstance(v, bool):
            raise self.bad(key, f"expected an integer, got {v!r}")
        if v < minimum:
            raise self.bad(key, f"must be at least {minimum}, got {v}")
        if maximum is not None and v > maximum:
            raise self.bad(key, f"{v:,} is more than parsim models ({maximum:,})")
        return v

    def num(self, key: str, default=None, lo: float = 0.0, lo_open: bool = True, hi: float | None = None):
        if key not in self.doc:
            if default is None:
                raise self.bad(key, "missing (required)")
            return default
        v = self.doc[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.bad(key, f"expected a number, got {v!r}")
        v = float(v)
        if not math.isfinite(v):
            raise self.bad(key, f"must be a finite number, got {v!r}")
        if v < lo or (lo_open and v == lo):
            raise self.bad(key, f"must be {'above' if lo_open else 'at least'} {lo:g}, got {v:g}")
        if hi is not None and v > hi:
            raise self.bad(key, f"must be at most {hi:g}, got {v:g}")
        return v

    def str(self, key: str, choices, default: str) -> str:
        v = self.doc.get(key, default)
        if v not in choices:
            raise self.bad(key, f"{v!r} is not one of {', '.join(choices)}")
        return v


FED_KEYS = ("clients", "clients_per_round", "rounds", "mode", "buffer_size", "local_steps", "batch_size",
            "seconds_per_sample", "compute_sigma", "train_factor", "uplink_mbit_per_s", "downlink_mbit_per_s",
            "uplink_sigma", "downlink_sigma", "device_classes", "availability", "availability_probability",
            "availability_trace", "over_commitment", "deadline_s", "min_fraction", "weight_bits", "seed",
            "model_params", "layer_shapes", "max_staleness")
CLASS_KEYS = ("name", "fraction", "seconds_per_sample", "uplink_mbit_per_s", "downlink_mbit_per_s")
COMP_KEYS = ("method", "rank", "keep_fraction", "bits", "rotation")


def fl_scenario_from_dict(doc: dict, file: str, base_dir: Path | None = None) -> FLScenario:
    """A parsed TOML document -> FLScenario (strict: unknown keys and bad values refused)."""
    top = _Table(doc, file, "", TOP_KEYS)
    if "federated" not in doc:
        raise ConfigError(file, "federated", "missing (a federated scenario needs a [federated] table)")
    name = doc.get("name", Path(file).stem)
    if not isinstance(name, str):
        raise top.bad("name", f"expected a string, got {name!r}")
    t = _Table(doc["federated"], file, "federated.", FED_KEYS)
    fed = _federated(t, base_dir or Path(file).parent)
    params, tensors, model_name = _model(doc, t, file)
    comp = _compression(_Table(doc.get("compression", {}), file, "compression.", COMP_KEYS))
    for m, key in (("low_rank", "rank"), ("random_mask", "keep_fraction"), ("subsample", "keep_fraction"),
                   ("quantize", "bits")):
        if m in comp.methods and getattr(comp, key) is None:
            raise ConfigError(file, f"compression.{key}", f"missing (method {m} needs it)")
    return FLScenario(name=name, file=file, federated=fed, compression=comp, params=params, tensors=tensors,
                      model_name=model_name)


MAX_CLIENTS = 2 ** 24
"""Most clients a population may have (16,777,216; per-client arrays: ~1 GB here, 4M take 1.5 s)."""
MAX_UPDATES = 5_000_000
"""Most client updates a run may simulate (rounds x clients_per_round; 1M take ~6 s here, 10M took 55 s)."""
MAX_ROUNDS = 10_000
"""Most rounds a run may simulate: each round has a fixed cost beside its clients' (~2.4 ms on a
2-core VM: 10,000 rounds of one client took 24 s, 100,000 took 179 s); 10,000 covers the FedAvg
paper's runs to target accuracy and keeps a run within ~30 s."""


def _federated(t: _Table, base_dir: Path) -> FederatedConfig:
    clients = t.int("clients")
    if clients > MAX_CLIENTS:
        raise t.bad("clients", f"{clients:,} is more than parsim simulates ({MAX_CLIENTS:,})")
    k = t.int("clients_per_round")
    if k > clients:
        raise t.bad("clients_per_round", f"{k} is more than the {clients} clients")
    if t.int("rounds") > MAX_ROUNDS:
        raise t.bad("rounds", f"{t.int('rounds'):,} is more rounds than parsim simulates ({MAX_ROUNDS:,})")
    if t.int("rounds") * k > MAX_UPDATES:
        raise t.bad("rounds", f"{t.int('rounds'):,} rounds x {k:,} clients per round is more client updates than "
                              f"parsim simulates ({MAX_UPDATES:,})")
    classes = _classes(t)
    if classes and any(t.has(x) for x in ("seconds_per_sample", "uplink_mbit_per_s", "downlink_mbit_per_s")):
        raise t.bad("device_classes", "give device classes or the population medians "
                                      "(seconds_per_sample, uplink_mbit_per_s, downlink_mbit_per_s), not both")
    need = not classes
    mode = t.str("mode", MODES, "sync")
    avail = t.str("availability", AVAILABILITY, "always")
    if avail == "probability" and not t.has("availability_probability"):
        raise t.bad("availability_probability", "missing (availability = \"probability\" needs it)")
    if avail == "trace" and not t.has("availability_trace"):
        raise t.bad("availability_trace", "missing (availability = \"trace\" needs a FedScale-format JSON file)")
    trace = _trace(t, base_dir) if avail == "trace" else None
    unused = {"availability_probability": avail != "probability", "availability_trace": avail != "trace",
              "over_commitment": mode == "async", "min_fraction": mode == "async", "max_staleness": mode == "sync"}
    for key, idle in unused.items():
        if idle and t.has(key):
            raise t.bad(key, f"not used with availability = {avail!r}, mode = {mode!r}")
    return FederatedConfig(
        clients=clients, clients_per_round=k, rounds=t.int("rounds"), mode=mode,
        buffer_size=_buffer(t, mode, k), local_steps=t.int("local_steps"), batch_size=t.int("batch_size"),
        seconds_per_sample=t.num("seconds_per_sample", hi=1e6) if need else 0.0,
        compute_sigma=t.num("compute_sigma", 0.0, lo_open=False, hi=5.0), train_factor=t.num("train_factor", 3.0, hi=1e3),
        uplink_bit_per_s=t.num("uplink_mbit_per_s", lo=1e-6, lo_open=False, hi=1e7) * MBIT if need else 0.0,
        downlink_bit_per_s=t.num("downlink_mbit_per_s", lo=1e-6, lo_open=False, hi=1e7) * MBIT if need else 0.0,
        uplink_sigma=t.num("uplink_sigma", 0.0, lo_open=False, hi=5.0),
        downlink_sigma=t.num("downlink_sigma", 0.0, lo_open=False, hi=5.0),
        device_classes=classes, availability=avail,
        availability_probability=t.num("availability_probability", 1.0, hi=1.0), availability_trace=trace,
        over_commitment=t.num("over_commitment", 1.3, lo=1.0, lo_open=False),
        deadline_s=t.num("deadline_s", lo=1e-3, lo_open=False, hi=1e9) if t.has("deadline_s") else None,
        min_fraction=t.num("min_fraction", 1.0, hi=1.0),
        max_staleness=t.int("max_staleness", minimum=0) if t.has("max_staleness") else None,
        weight_bits=t.int("weight_bits", 32, maximum=64),
        seed=t.int("seed", 0, minimum=0))


def _buffer(t: _Table, mode: str, k: int) -> int:
    if mode == "sync":
        if t.has("buffer_size"):
            raise t.bad("buffer_size", "only for mode = \"async\" (FedBuff)")
        return 0
    b = t.int("buffer_size", 10)
    if b > k:
        raise t.bad("buffer_size", f"{b} is more than the {k} clients training at once (clients_per_round)")
    return b


def _classes(t: _Table) -> tuple[DeviceClass, ...]:
    raw = t.doc.get("device_classes", [])
    if not isinstance(raw, list) or not all(isinstance(c, dict) for c in raw):
        raise t.bad("device_classes", "expected an array of tables ([[federated.device_classes]])")
    out = []
    for i, c in enumerate(raw):
        ct = _Table(c, t.file, f"federated.device_classes[{i}].", CLASS_KEYS)
        label = c.get("name", f"class{i}")
        if not isinstance(label, str):
            raise ct.bad("name", f"expected a string, got {label!r}")
        out.append(DeviceClass(name=label, fraction=ct.num("fraction", hi=1.0),
                               seconds_per_sample=ct.num("seconds_per_sample"),
                               uplink_bit_per_s=ct.num("uplink_mbit_per_s") * MBIT,
                               downlink_bit_per_s=ct.num("downlink_mbit_per_s") * MBIT))
    if out and abs(sum(c.fraction for c in out) - 1.0) > 1e-9:
        raise t.bad("device_classes", f"fractions sum to {sum(c.fraction for c in out):g}, not 1")
    return tuple(out)


def _trace(t: _Table, base_dir: Path) -> AvailabilityTrace:
    """FedScale's client_behave_trace (a dict client -> {active, inactive, finish_time}), as JSON."""
    raw = t.doc["availability_trace"]
    if not isinstance(raw, str):
        raise t.bad("availability_trace", f"expected a path string, got {raw!r}")
    p = Path(raw) if Path(raw).is_absolute() else base_dir / raw
    try:
        doc = json.loads(read_input_text(p))
    except OSError as e:
        raise t.bad("availability_trace", f"cannot read {p}: {e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise t.bad("availability_trace", f"{p} is not JSON: {e}") from None
    if not isinstance(doc, dict) or not doc:
        raise t.bad("availability_trace", f"{p}: expected a non-empty object of client -> trace")
    fin, act, ina = [], [], []
    for cid in sorted(doc, key=lambda s: (len(s), s)):
        fin_i, act_i, ina_i = _one_trace(t, p, cid, doc[cid])
        fin.append(fin_i), act.append(act_i), ina.append(ina_i)
    return AvailabilityTrace(finish_time=tuple(fin), active=tuple(act), inactive=tuple(ina))


def _one_trace(t: _Table, p: Path, cid: str, tr) -> tuple[float, tuple, tuple]:
    def bad(problem):
        return t.bad("availability_trace", f"{p}: client {cid}: {problem}")
    if not isinstance(tr, dict) or not {"active", "inactive", "finish_time"} <= set(tr):
        raise bad("needs active, inactive and finish_time")
    a, b, fin = tr["active"], tr["inactive"], tr["finish_time"]
    nums = (int, float)
    if not (isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and a
            and all(isinstance(x, nums) and not isinstance(x, bool) and math.isfinite(x) for x in a + b)):
        raise bad("active and inactive must be equally long non-empty lists of numbers")
    if not isinstance(fin, nums) or isinstance(fin, bool) or not math.isfinite(fin) or fin <= 0:
        raise bad(f"finish_time must be a positive number, got {fin!r}")
    for i in range(len(a)):
        if not (0 <= a[i] <= b[i]) or (i and a[i] < b[i - 1]):
            raise bad(f"interval {i} [{a[i]}, {b[i]}] is not ordered after the previous one")
    return float(fin), tuple(map(float, a)), tuple(map(float, b))


def _model(doc: dict, t: _Table, file: str) -> tuple[int, tuple[Tensor, ...], str]:
    given = [k for k in ("model_params", "layer_shapes") if t.has(k)] + (["model"] if "model" in doc else [])
    if len(given) != 1:
        raise ConfigError(file, "federated.model_params",
                          "give exactly one model: [model] (preset or fields), federated.layer_shapes or "
                          f"federated.model_params (got {', '.join(given) or 'none'})")
    if given[0] == "model_params":
        n = t.int("model_params", maximum=2 ** 44)
        return n, (Tensor(rows=1, cols=n),), f"{n:,} parameters"
    if given[0] == "layer_shapes":
        shapes = t.doc["layer_shapes"]
        if (not isinstance(shapes, list) or not shapes or not all(
                isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) and not isinstance(x, bool)
                                                           and 0 < x <= MAX_WIDTH for x in s) for s in shapes)):
            raise t.bad("layer_shapes", f"expected a list of [inputs, outputs] pairs of positive integers (each at "
                        f"most {MAX_WIDTH:,})")
        tensors = tuple(x for d_in, d_out in shapes for x in (Tensor(rows=d_in, cols=d_out), Tensor(rows=1, cols=d_out)))
        return sum(x.size for x in tensors), tensors, "dense " + "-".join(str(s[0]) for s in shapes) + f"-{shapes[-1][1]}"
    spec = model_from_table(doc["model"], file)
    tensors = model_tensors(spec)
    return total_params(spec), tensors, spec.name


def _compression(t: _Table) -> CompressionConfig:
    raw = t.doc.get("method", "none")
    methods = [raw] if isinstance(raw, str) else raw
    if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
        raise t.bad("method", f"expected a method name or a list of them, got {raw!r}")
    for m in methods:
        if m not in METHODS:
            raise t.bad("method", f"{m!r} is not one of {', '.join(METHODS)}")
    methods = tuple(m for m in methods if m != "none")
    problem = check_chain(methods)
    if problem:
        raise t.bad("method", problem)
    used = {"rank": "low_rank" in methods, "keep_fraction": bool({"random_mask", "subsample"} & set(methods)),
            "bits": "quantize" in methods, "rotation": "quantize" in methods}
    for key, ok in used.items():
        if t.has(key) and not ok:
            raise t.bad(key, f"not used by method {list(methods) or 'none'}")
    bits = t.int("bits") if t.has("bits") else None
    if bits is not None and bits > 32:
        raise t.bad("bits", f"must be at most 32, got {bits}")
    rotation = t.doc.get("rotation", False)
    if not isinstance(rotation, bool):
        raise t.bad("rotation", f"expected true or false, got {rotation!r}")
    return CompressionConfig(
        methods=methods, rank=t.int("rank") if t.has("rank") else None,
        keep_fraction=t.num("keep_fraction", hi=1.0) if t.has("keep_fraction") else None,
        bits=bits, rotation=rotation)

