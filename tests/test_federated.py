"""Federated rounds (parsim fl): FedScale's client completion time, Konečný et al.'s encodings,
selection rules, availability, and sync vs async (FedBuff) on the same virtual clock."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parsim.errors import ConfigError
from parsim.federated import encode, load_fl_scenario, make_population, simulate_fl
from parsim.federated.compression import Tensor, model_tensors
from parsim.federated.config import fl_scenario_from_dict
from parsim.federated.population import Availability, completion_time_s
from parsim.model import get_preset, total_params

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
FEDSCALE = json.loads((DATA / "fedscale_completion.json").read_text())
KONECNY = json.loads((DATA / "konecny2016.json").read_text())


def fl(federated: dict, compression: dict | None = None, model: dict | None = None, file="t.toml"):
    doc = {"name": "t", "federated": federated}
    if compression is not None:
        doc["compression"] = compression
    if model is not None:
        doc["model"] = model
    return fl_scenario_from_dict(doc, file, base_dir=Path(file).parent)


BASE = {"clients": 1, "clients_per_round": 1, "rounds": 1, "local_steps": 1, "batch_size": 1,
        "seconds_per_sample": 0.01, "uplink_mbit_per_s": 1.0, "downlink_mbit_per_s": 1.0, "model_params": 1000,
        "over_commitment": 1.0}


def fedscale_completion(case) -> float:
    """FedScale's ClientMetadata.get_completion_time (see tests/data/fedscale_completion.json),
    transcribed: augmentation 3, ms per sample, kbits over kbit/s, upload + download."""
    comp = 3.0 * case["batch_size"] * case["local_steps"] * case["compute_speed_ms_per_sample"] / 1000.0
    return comp + (case["model_update_size_kbit"] * 2) / case["bandwidth_kbps"]


# ------------------------------------------------------------------ FedScale's completion time
@pytest.mark.parametrize("case", FEDSCALE["cases"], ids=lambda c: f"{c['compute_speed_ms_per_sample']}ms")
def test_single_client_round_is_fedscales_completion_time(case):
    """One client, one round, no compression: the round lasts exactly FedScale's completion time
    (our units: s per sample and Mbit/s; FedScale's: ms per sample, kbit and kbit/s)."""
    params = int(case["model_update_size_kbit"] * 1000 / 32)
    assert params * 32 == case["model_update_size_kbit"] * 1000
    sc = fl({**BASE, "batch_size": case["batch_size"], "local_steps": case["local_steps"],
             "seconds_per_sample": case["compute_speed_ms_per_sample"] / 1000.0,
             "uplink_mbit_per_s": case["bandwidth_kbps"] / 1000.0, "downlink_mbit_per_s": case["bandwidth_kbps"] / 1000.0,
             "model_params": params})
    res = simulate_fl(sc)
    expect = fedscale_completion(case)
    assert expect == pytest.approx(case["completion_s"], rel=1e-12)  # the file's hand-computed value
    assert res.rows[0].duration_s == pytest.approx(expect, rel=1e-12)
    assert res.rows[0].compute_s_mean == pytest.approx(case["computation_s"], rel=1e-12)
    assert res.rows[0].comm_s_mean == pytest.approx(case["communication_s"], rel=1e-12)
    assert res.metrics["uplink_bits_per_param"] == 32.0


def test_completion_time_vectorised_equals_fedscale_per_client():
    rng = np.random.default_rng(3)
    ms, kbps = rng.uniform(1, 300, 50), rng.uniform(50, 5000, 50)
    size_kbit = 4096.0
    ours = completion_time_s(ms / 1000, kbps * 1000, kbps * 1000, batch_size=16, local_steps=7,
                             upload_bits=size_kbit * 1000, download_bits=size_kbit * 1000)
    theirs = [fedscale_completion({"batch_size": 16, "local_steps": 7, "compute_speed_ms_per_sample": m,
                                   "model_update_size_kbit": size_kbit, "bandwidth_kbps": b}) for m, b in zip(ms, kbps)]
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def _durations(sc) -> np.ndarray:
    """Every client's task time, from the population the simulation draws first from its seed."""
    f = sc.federated
    pop = make_population(f, np.random.default_rng(f.seed))
    return completion_time_s(pop.seconds_per_sample, pop.uplink_bit_per_s, pop.downlink_bit_per_s,
                             batch_size=f.batch_size, local_steps=f.local_steps, upload_bits=sc.params * 32,
                             download_bits=sc.params * 32)


HETERO = {"clients": 130, "clients_per_round": 100, "rounds": 3, "local_steps": 5, "batch_size": 10,
          "seconds_per_sample": 0.02, "compute_sigma": 0.7, "uplink_mbit_per_s": 1.0, "downlink_mbit_per_s": 8.0,
          "uplink_sigma": 0.6, "downlink_sigma": 0.6, "model_params": 200_000, "over_commitment": 1.3, "seed": 5}


def test_over_commitment_round_ends_at_the_kth_fastest_and_drops_the_rest():
    """FedScale's tictak_client_tasks: sample floor(1.3 K), keep the K fastest; the round lasts
    the K-th completion. With clients = floor(1.3 K) every client is selected every round."""
    sc = fl(HETERO)
    d = np.sort(_durations(sc))
    res = simulate_fl(sc)
    for r in res.rows:
        assert r.selected == 130 and r.participants == 100 and r.dropped == 30 and not r.failed
        assert r.duration_s == pytest.approx(d[99], rel=1e-12)
    assert res.metrics["dropped_fraction"] == pytest.approx(30 / 130)
    assert res.metrics["total_time_s"] == pytest.approx(3 * d[99], rel=1e-12)


def test_deadline_drops_stragglers_and_min_fraction_fails_rounds():
    d = np.sort(_durations(fl(HETERO)))
    deadline = float(d[60])  # 61 clients make it
    res = simulate_fl(fl({**HETERO, "deadline_s": deadline, "min_fraction": 0.5}))
    for r in res.rows:
        assert r.duration_s == pytest.approx(deadline) and r.participants == 61 and r.dropped == 69 and not r.failed
    res = simulate_fl(fl({**HETERO, "deadline_s": deadline, "min_fraction": 0.8}))
    assert all(r.failed and r.participants == 0 and r.dropped == 130 and r.bytes_up == 61 * 200_000 * 32 / 8 for r in res.rows)
    assert res.metrics["failed_rounds"] == 3


# ------------------------------------------------------------------ availability
def fedscale_is_active(tr: dict, t: float) -> bool:
    """FedScale's ClientMetadata.is_active, read as interval membership of t mod finish_time."""
    norm = t % tr["finish_time"]
    return any(a <= norm <= b for a, b in zip(tr["active"], tr["inactive"]))


def test_trace_availability_matches_fedscale_and_drops_clients_going_offline(tmp_path):
    rng = np.random.default_rng(0)
    traces = {}
    for cid in range(1, 8):
        edges = np.sort(rng.uniform(0, 1000, 6))
        traces[str(cid)] = {"active": edges[0::2].tolist(), "inactive": edges[1::2].tolist(), "finish_time": 1000.0,
                            "duration": 1000.0}
    p = tmp_path / "trace.json"
    p.write_text(json.dumps(traces))
    sc = fl({**BASE, "clients": 70, "clients_per_round": 10, "availability": "trace",
             "availability_trace": str(p)}, file=str(tmp_path / "s.toml"))
    av = Availability(sc.federated, rng)
    clients = np.arange(70)
    for t in rng.uniform(0, 5000, 40):
        ours = av.online(clients, t)
        theirs = [fedscale_is_active(traces[str(c % 7 + 1)], t) for c in clients]
        assert ours.tolist() == theirs
    # every selected client was online at the round's start
    res = simulate_fl(sc)
    assert res.rows[0].selected == int(sum(fedscale_is_active(traces[str(c % 7 + 1)], 0.0) for c in clients[:70]))


def test_trace_client_offline_before_its_upload_is_dropped(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text(json.dumps({"1": {"active": [0.0], "inactive": [1e9], "finish_time": 2e9},
                             "2": {"active": [0.0], "inactive": [0.5], "finish_time": 100.0}}))
    # task: 3 x 1 x 1 x 0.01 s + 2 x 1000 x 32 bit / 1 Mbit/s = 0.094 s; client 2 online [0, 0.5] of 100 s
    sc = fl({**BASE, "clients": 2, "clients_per_round": 2, "availability": "trace", "availability_trace": str(p),
             "local_steps": 10}, file=str(tmp_path / "s.toml"))  # 0.364 s task: both finish online
    assert simulate_fl(sc).rows[0].participants == 2
    sc = fl({**BASE, "clients": 2, "clients_per_round": 2, "availability": "trace", "availability_trace": str(p),
             "local_steps": 20}, file=str(tmp_path / "s.toml"))  # 0.664 s: client 2 is offline by then
    r = simulate_fl(sc).rows[0]
    # min_fraction 1: the round needs both; it fails, nothing is aggregated, one update was uploaded
    assert r.participants == 0 and r.dropped == 2 and r.failed and r.bytes_up == 1000 * 32 / 8


def test_probability_availability_selects_among_online_clients():
    sc = fl({**BASE, "clients": 4000, "clients_per_round": 2000, "rounds": 20, "availability": "probability",
             "availability_probability": 0.1})
    sel = np.array([r.selected for r in simulate_fl(sc).rows])
    mean, sd = 4000 * 0.1, math.sqrt(4000 * 0.1 * 0.9)  # Binomial(4000, 0.1) online, all of them selected
    assert abs(sel.mean() - mean) < 4 * sd / math.sqrt(len(sel)) and sel.max() < 2000


# ------------------------------------------------------------------ compression
def test_bits_per_param_by_definition_on_a_dense_network():
    shapes = [(784, 200), (200, 10)]
    t = tuple(x for a, b in shapes for x in (Tensor(a, b), Tensor(1, b)))
    P = 784 * 200 + 200 + 200 * 10 + 10
    cases = {  # (methods, kwargs): bits, by the definitions in the module docstring
        ("none",): ({}, 32 * P),
        ("low_rank",): ({"rank": 8}, 32 * (8 * 200 + 200 + 8 * 10 + 10) + 32),
        ("random_mask",): ({"keep_fraction": 0.1}, 32 * (15680 + 20 + 200 + 1) + 32),
        ("subsample",): ({"keep_fraction": 0.1}, 32 * (15680 + 20 + 200 + 1) + 32),
        ("quantize",): ({"bits": 2}, 2 * P + 4 * 64),
        ("quantize", "rot"): ({"bits": 2, "rotation": True}, 2 * (262144 + 256 + 2048 + 16) + 4 * 64 + 32),
        ("subsample", "quantize"): ({"keep_fraction": 0.1, "bits": 1}, (15680 + 20 + 200 + 1) + 4 * 64 + 32),
        ("low_rank", "quantize"): ({"rank": 8, "bits": 4}, 4 * (1600 + 200 + 80 + 10) + 4 * 64 + 32),
    }
    for key, (kw, bits) in cases.items():
        methods = tuple(m for m in key if m not in ("none", "rot"))
        e = encode(t, methods, **kw)
        assert e.bits == bits, key
        assert e.bits_per_param == pytest.approx(bits / P), key


@pytest.mark.parametrize("ratio", KONECNY["structured_ratios"])
def test_konecny_structured_ratios(ratio):
    """Low rank k = ratio x d1 and a random mask keeping ratio of the values send ratio of the
    floats (plus one seed and the uncompressed biases)."""
    d1, d2 = 1024, 1024
    t = (Tensor(d1, d2),)
    k = int(ratio * d1)
    lr = encode(t, ("low_rank",), rank=k)
    mask = encode(t, ("random_mask",), keep_fraction=ratio)
    assert lr.bits == 32 * k * d2 + 32 and mask.bits == 32 * math.ceil(ratio * d1 * d2) + 32
    for e in (lr, mask):  # the ratio, plus one 32-bit seed per update
        assert e.bits_per_param / KONECNY["float_bits"] == pytest.approx(ratio + 1 / (d1 * d2), rel=1e-12)
        assert e.bits_per_param / KONECNY["float_bits"] == pytest.approx(ratio, rel=3e-4)


def test_konecny_sketch_one_bit_of_a_sixteenth_is_a_sixteenth_of_a_bit():
    spec = get_preset("llama2-7b")
    t = model_tensors(spec)
    assert sum(x.size for x in t) == total_params(spec)
    e = encode(t, ("subsample", "quantize"), keep_fraction=KONECNY["subsample_keep_fraction"],
               bits=KONECNY["quantize_bits"])
    n_tensors = sum(x.count for x in t)
    kept = sum(math.ceil(0.0625 * x.rows * x.cols) * x.count for x in t)
    assert e.bits == kept + 64 * n_tensors + 32  # 1 bit per kept value, min and max per tensor, one seed
    assert e.bits_per_param == pytest.approx(KONECNY["sketch_bits_per_param"], rel=1e-4)  # 0.06250155
    assert e.bits_per_param > KONECNY["sketch_bits_per_param"]  # seeds and per-tensor floats on top
    rot = encode(t, ("subsample", "quantize"), keep_fraction=0.0625, bits=1, rotation=True)
    assert rot.bits > e.bits and rot.ops > e.ops  # padding to powers of two; log2(n) butterfly passes


def test_each_encoding_adds_its_client_compute():
    base = {**HETERO, "clients": 1, "clients_per_round": 1, "rounds": 1, "compute_sigma": 0.0, "uplink_sigma": 0.0,
            "downlink_sigma": 0.0, "over_commitment": 1.0, "layer_shapes": [[512, 512], [512, 10]]}
    del base["model_params"]
    plain = simulate_fl(fl(base)).rows[0].compute_s_mean
    for comp in ({"method": "low_rank", "rank": 16}, {"method": "random_mask", "keep_fraction": 0.25},
                 {"method": "subsample", "keep_fraction": 0.25}, {"method": "quantize", "bits": 4},
                 {"method": "quantize", "bits": 4, "rotation": True},
                 {"method": ["subsample", "quantize"], "keep_fraction": 0.25, "bits": 1}):
        sc = fl(base, comp)
        e = simulate_fl(sc)
        extra = e.metrics["compression_ops_per_update"] * 0.02 / (2 * sc.params)
        assert extra > 0
        assert e.rows[0].compute_s_mean == pytest.approx(plain + extra, rel=1e-12), comp


# ------------------------------------------------------------------ sync vs async
def test_async_fedbuff_finishes_more_rounds_in_the_same_virtual_time():
    """A heterogeneous population (two device classes, lognormal spreads): FedBuff aggregating
    every 10 of 100 concurrent updates completes more rounds by the time sync FedAvg with
    K = 100 finishes its 10 (Nguyen et al. 2022; FedScale's async aggregator)."""
    fed = {"clients": 5000, "clients_per_round": 100, "rounds": 10, "local_steps": 10, "batch_size": 20,
           "model_params": 1_000_000, "compute_sigma": 0.5, "uplink_sigma": 0.7, "downlink_sigma": 0.7, "seed": 11,
           "device_classes": [
               {"name": "fast", "fraction": 0.7, "seconds_per_sample": 0.005, "uplink_mbit_per_s": 10,
                "downlink_mbit_per_s": 50},
               {"name": "slow", "fraction": 0.3, "seconds_per_sample": 0.05, "uplink_mbit_per_s": 1,
                "downlink_mbit_per_s": 5}]}
    sync = simulate_fl(fl(fed))
    horizon = sync.metrics["total_time_s"]
    asyn = simulate_fl(fl({**fed, "mode": "async", "buffer_size": 10, "rounds": 400}))
    n_sync, n_async = sync.rounds_by(horizon), asyn.rounds_by(horizon)
    assert n_sync == 10 and asyn.metrics["total_time_s"] > horizon
    assert n_async > n_sync
    assert asyn.metrics["staleness_mean"] > 0  # the price: updates from older model versions
    assert all(r.participants == 10 for r in asyn.rows)


def test_same_seed_same_result():
    a, b = simulate_fl(fl(HETERO)), simulate_fl(fl(HETERO))
    assert a.metrics == b.metrics and a.rows == b.rows


# ------------------------------------------------------------------ loader and CLI
@pytest.mark.parametrize("fed,comp,key", [
    ({"clients": 0}, None, "federated.clients"),
    ({"clients_per_round": 5000}, None, "federated.clients_per_round"),
    ({"mode": "semi"}, None, "federated.mode"),
    ({"buffer_size": 4}, None, "federated.buffer_size"),
    ({"bogus": 1}, None, "federated.bogus"),
    ({"uplink_mbit_per_s": -1}, None, "federated.uplink_mbit_per_s"),
    ({"seconds_per_sample": float("nan")}, None, "federated.seconds_per_sample"),
    ({"availability": "probability"}, None, "federated.availability_probability"),
    ({"availability": "trace"}, None, "federated.availability_trace"),
    ({"layer_shapes": [[1, 2]]}, None, "federated.model_params"),
    ({"over_commitment": 0.5}, None, "federated.over_commitment"),
    ({"max_staleness": 2}, None, "federated.max_staleness"),
    ({"availability_probability": 0.5}, None, "federated.availability_probability"),
    ({"mode": "async", "buffer_size": 10}, None, "federated.over_commitment"),
    ({"device_classes": [{"fraction": 1.0, "seconds_per_sample": 0.1, "uplink_mbit_per_s": 1,
                          "downlink_mbit_per_s": 1}]}, None, "federated.device_classes"),
    ({}, {"method": "zip"}, "compression.method"),
    ({}, {"method": ["quantize", "subsample"], "bits": 1, "keep_fraction": 0.1}, "compression.method"),
    ({}, {"method": ["subsample", "low_rank"], "rank": 1, "keep_fraction": 0.1}, "compression.method"),
    ({}, {"method": "low_rank"}, "compression.rank"),
    ({}, {"method": "quantize", "bits": 64}, "compression.bits"),
    ({}, {"method": "subsample", "keep_fraction": 1.5}, "compression.keep_fraction"),
    ({}, {"method": "none", "bits": 2}, "compression.bits"),
])
def test_bad_input_names_the_key(fed, comp, key):
    with pytest.raises(ConfigError) as e:
        fl({**HETERO, **fed}, comp)
    assert e.value.key == key, str(e.value)


def test_model_from_a_preset_table():
    sc = fl({k: v for k, v in BASE.items() if k != "model_params"}, model={"preset": "llama2-7b"})
    assert sc.params == total_params(get_preset("llama2-7b"))


def run(*args):
    return subprocess.run([sys.executable, "-m", "parsim", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)


def test_cli_json_report_and_bad_input(tmp_path):
    sc = ROOT / "scenarios" / "fl-mobile.toml"
    r = run("fl", sc, "--json", "--set", "federated.rounds=5", "--out", tmp_path / "rep")
    assert r.returncode == 0, r.stderr
    mx = json.loads(r.stdout)
    for k in ("round_time_s_p50", "total_time_s", "uplink_bits_per_param", "dropped_fraction"):
        assert k in mx
    assert mx["rounds"] == 5 and mx["uplink_bits_per_param"] == pytest.approx(0.0625, rel=0.01)
    for f in ("report.md", "result.json", "rounds.csv", "round_times.png", "time_to_rounds.png"):
        assert (tmp_path / "rep" / f).stat().st_size > 0
    rows = (tmp_path / "rep" / "rounds.csv").read_text().splitlines()
    assert len(rows) == 6 and rows[0].startswith("round,start_s,end_s,duration_s,selected,participants,dropped")
    bad = tmp_path / "bad.toml"
    bad.write_text(sc.read_text().replace("clients_per_round = 1000", "clients_per_round = 1000\nfoo = 1"))
    r = run("fl", bad)
    assert r.returncode == 2 and "federated.foo" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert load_fl_scenario(sc).federated.clients == 100_000
    r = run("fl", tmp_path / "missing.toml")
    assert r.returncode == 2 and "no such scenario file" in r.stderr
    r = run("fl", sc, "--set", "federated.rounds=3", "--rounds-csv", "-")
    assert r.returncode == 0 and r.stdout.splitlines()[0].startswith("round,") and "fl-mobile" in r.stderr


def test_fedbuff_with_identical_clients_aggregates_in_waves():
    """Every task lasting D: the C concurrent clients finish together at D, 2D, ...; each wave
    gives C / B aggregations at that instant. The first wave's updates all started from version
    0, so the aggregation of versions 0..9 sees staleness 0..9."""
    fed = {**BASE, "clients": 1000, "clients_per_round": 100, "rounds": 30, "mode": "async", "buffer_size": 10}
    del fed["over_commitment"]
    res = simulate_fl(fl(fed))
    D = 3 * 0.01 + 2 * 1000 * 32 / 1e6
    assert [r.end_s for r in res.rows] == pytest.approx([D * (r // 10 + 1) for r in range(30)], rel=1e-12)
    assert [r.staleness_mean for r in res.rows[:10]] == list(range(10))
    assert all(r.participants == 10 and r.dropped == 0 for r in res.rows)
    # FedScale's max_staleness: older updates are dropped, the rest wait for fresh ones
    res = simulate_fl(fl({**fed, "max_staleness": 3}))
    assert all(r.staleness_mean <= 3 for r in res.rows) and sum(r.dropped for r in res.rows) > 0
    assert [r.staleness_mean for r in res.rows[:4]] == [0, 1, 2, 3] and res.rows[4].start_s == pytest.approx(D)


def test_population_medians_spreads_and_device_class_shares():
    fed = fl({**HETERO, "clients": 100_000, "clients_per_round": 10, "compute_sigma": 0.6, "seconds_per_sample": 0.005,
              "uplink_mbit_per_s": 5, "uplink_sigma": 0.8}).federated
    pop = make_population(fed, np.random.default_rng(0))
    n = 100_000
    # median of a lognormal = its median parameter; sd of the sample median ~ 1.2533 sigma / sqrt(n) in log
    for arr, med, sigma in ((pop.seconds_per_sample, 0.005, 0.6), (pop.uplink_bit_per_s, 5e6, 0.8)):
        assert abs(math.log(np.median(arr) / med)) < 4 * 1.2533 * sigma / math.sqrt(n)
        assert np.std(np.log(arr)) == pytest.approx(sigma, rel=0.02)
    classes = [{"name": "a", "fraction": 0.25, "seconds_per_sample": 0.1, "uplink_mbit_per_s": 1, "downlink_mbit_per_s": 2},
               {"name": "b", "fraction": 0.75, "seconds_per_sample": 0.01, "uplink_mbit_per_s": 10, "downlink_mbit_per_s": 20}]
    fed = {k: v for k, v in HETERO.items() if k not in ("seconds_per_sample", "uplink_mbit_per_s", "downlink_mbit_per_s",
                                                        "compute_sigma", "uplink_sigma", "downlink_sigma")}
    pop = make_population(fl({**fed, "clients": n, "device_classes": classes}).federated, np.random.default_rng(0))
    share = np.mean(pop.device_class == 0)
    assert abs(share - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n)
    assert set(pop.seconds_per_sample[pop.device_class == 0]) == {0.1}


def test_help_has_an_example(capsys):
    from parsim.cli.main import main
    with pytest.raises(SystemExit) as e:
        main(["fl", "--help"])
    assert e.value.code == 0
    assert "example: parsim fl scenarios/fl-mobile.toml" in " ".join(capsys.readouterr().out.split())


def test_readme_output_is_what_the_bundled_scenario_prints():
    """The README section quotes the summary of scenarios/fl-mobile.toml: keep it true."""
    res = simulate_fl(load_fl_scenario(ROOT / "scenarios" / "fl-mobile.toml"))
    readme = (ROOT / "README.md").read_text()
    for line in res.summary().splitlines():
        assert line in readme, line
