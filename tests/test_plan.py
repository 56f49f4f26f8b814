"""parsim plan: enumeration legality, pre-screen consistency with the simulator, ranking, CLI."""
from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from parsim.cli.main import main
from parsim.cluster.hardware import load_profile
from parsim.costs import ModelCosts
from parsim.model import get_preset, model_from_hf_config
from parsim.plan.prescreen import _bubble, estimate
from parsim.plan.run import run_plan, scenario_toml, to_csv, to_markdown, to_table
from parsim.plan.space import (
    PlanSpec,
    default_schedules,
    enumerate_candidates,
    make_scenario,
)
from parsim.schedule import build, dry_run
from parsim.simulate import simulate


def small_spec(**kw) -> PlanSpec:
    base = dict(model=get_preset("llama3-8b"), model_ref="llama3-8b", hardware=load_profile("dgx-h100"),
                gpus=32, global_batch=64, seq_len=4096, schedules=default_schedules(),
                recompute=("none", "full"), microbatch_sizes=(1, 2), max_cp=2)
    base.update(kw)
    return PlanSpec(**base)


def test_default_schedules_come_from_the_registry():
    names = default_schedules()
    assert {"1F1B", "GPipe", "Interleaved1F1B", "ZBH1"} <= set(names)


def test_every_enumerated_candidate_is_a_legal_scenario():
    spec = small_spec()
    cands, rejected = enumerate_candidates(spec)
    assert cands
    for c in cands[::7]:
        sc = make_scenario(spec, c)  # the scenario loader's own rules: raises if illegal
        assert sc.parallel.world_size == spec.gpus
        assert spec.global_batch % (c.dp * c.microbatch_size) == 0
        assert spec.model.n_heads % c.tp == 0
    assert len({c.key() for c in cands}) == len(cands)


def test_illegal_families_keep_their_reason():
    # 40 heads (a made-up width) cannot split over tp=8 or tp=16; pp > n_layers is impossible
    spec = small_spec(model=replace(get_preset("llama3-8b"), n_heads=40, n_kv_heads=8, d_model=5120,
                                    n_layers=4), max_tp=16, gpus=16)
    cands, rejected = enumerate_candidates(spec)
    text = " ".join(rejected)
    assert "not divisible by tp=16" in text
    assert "only 4 layers" in text
    assert all(c.tp in (1, 2, 4, 8) and c.pp <= 4 for c in cands)


@pytest.mark.parametrize("name", ["GPipe", "1F1B", "ZBH1", "ZBH2"])
@pytest.mark.parametrize("tf,ti,tw", [(1.0, 1.0, 1.0), (1.0, 1.3, 0.7), (1.0, 0.5, 1.5), (2.0, 1.0, 1.0)])
def test_closed_form_bubble_matches_the_dry_run(name, tf, ti, tw):
    p, m = 4, 12
    sched = build(name, p, m, 1)
    d = dry_run(sched, f=tf, b=ti + tw, i=ti, w=tw, comm=0.0, unshard=0.0, reduce=0.0, step=0.0)
    work = m * (tf + ti + tw)
    assert _bubble(name, p, 1, tf, ti, tw, m, (name, p, m, 1)) == pytest.approx(d.makespan - work, rel=1e-9)


def test_interleaved_bubble_is_megatrons():
    p, v, m = 4, 2, 8
    sched = build("Interleaved1F1B", p, m, v)
    d = dry_run(sched, f=1.0, b=2.0, comm=0.0, unshard=0.0, reduce=0.0, step=0.0)
    # (p-1)(t_F+t_B) with per-virtual-stage times = (p-1)/v of a rank's per-microbatch time
    assert _bubble("Interleaved1F1B", p, v, 1.0, 1.0, 1.0, m, ("Interleaved1F1B", p, m, v)) == \
        pytest.approx(d.makespan - m * v * 3.0)


def test_prescreen_memory_is_the_simulators():
    """ZeRO 0-2: the pre-screen's peak equals the event simulation's; ZeRO-3: an upper bound."""
    spec = small_spec()
    cands, _ = enumerate_candidates(spec)
    picked = {}
    for c in cands:
        picked.setdefault((c.schedule, c.zero == 3, c.recompute, c.pp > 1), c)
    assert len(picked) >= 12
    for c in picked.values():
        sc = make_scenario(spec, c)
        e = estimate(spec, c, ModelCosts.from_scenario(sc))
        mx = simulate(sc).metrics
        if c.zero < 3:
            assert e.peak_memory_bytes == pytest.approx(mx["peak_memory_bytes"], rel=1e-9), c.key()
        else:
            assert e.peak_memory_bytes >= mx["peak_memory_bytes"] * (1 - 1e-9), c.key()
        assert e.fits == (e.peak_memory_bytes <= mx["memory_capacity_bytes"])


def test_prescreen_time_tracks_the_simulation_without_pipeline():
    spec = small_spec()
    cands, _ = enumerate_candidates(spec)
    c = next(c for c in cands if c.pp == 1 and c.zero == 1 and c.recompute == "none")
    sc = make_scenario(spec, c)
    e = estimate(spec, c, ModelCosts.from_scenario(sc))
    assert e.step_time_s == pytest.approx(simulate(sc).metrics["step_time_s"], rel=0.02)


def test_run_plan_ranks_confirmed_configurations():
    spec = small_spec()
    res = run_plan(spec, "time", top=5, confirm=6, workers=1)
    assert 1 <= len(res.rows) <= 5
    times = [r["step_time_s"] for r in res.rows]
    assert times == sorted(times)
    for r in res.rows:
        assert r["fits_in_memory"] and r["peak_memory_bytes"] <= r["memory_capacity_bytes"]
        for k in ("parallel", "schedule", "recompute", "microbatch_size", "step_time_s", "tokens_per_s",
                  "tflops_per_gpu", "mfu", "bubble_fraction", "exposed_comm_s", "peak_memory_bytes",
                  "world_size", "params", "stages"):
            assert k in r
    assert res.rows[0]["rank"] == 1
    assert any(f["status"] == "winner" for f in res.families)
    assert "Winner" in res.explanation[0] and "headroom" in " ".join(res.explanation)
    assert to_csv(res).count("\n") == len(res.rows) + 1
    assert re.search(r"^\| family +\|", to_markdown(res), re.M) and "families" in to_table(res)


def test_plan_row_reproduces_as_a_scenario_file(tmp_path):
    spec = small_spec()
    res = run_plan(spec, "time", top=1, confirm=2, workers=1)
    path = tmp_path / "winner.toml"
    path.write_text(scenario_toml(spec, res.rows[0]))
    from parsim.scenario import load_scenario
    mx = simulate(load_scenario(path)).metrics
    assert mx["step_time_s"] == pytest.approx(res.rows[0]["step_time_s"], rel=1e-9)


def test_cost_objective_may_use_fewer_gpus(capsys):
    rc = main(["plan", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "32", "--global-batch", "64",
               "--seq-len", "4096", "--objective", "cost", "--top", "3", "--confirm", "4", "--workers", "1",
               "--max-cp", "1", "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    cost = [r["gpu_hours_per_million_tokens"] for r in rows]
    assert cost == sorted(cost)
    assert all(r["world_size"] in (8, 16, 32) for r in rows)


def test_cli_json_with_hf_config(capsys, root):
    cfg = root / "tests/data/hf/Mistral-7B-v0.1/config.json"
    assert model_from_hf_config(cfg).n_layers == 32
    rc = main(["plan", "--model", str(cfg), "--hardware", "dgx-h100", "--gpus", "16", "--global-batch", "32",
               "--seq-len", "4096", "--top", "2", "--confirm", "3", "--workers", "1", "--max-cp", "1", "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and rows[0]["world_size"] == 16 and rows[0]["fits_in_memory"]


@pytest.mark.parametrize("argv,word", [
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "llama3-8b", "--schedules", "NoSuch"], "NoSuch"),
    (["--model", "llama3-8b", "--zero", "7"], "--zero"),
    (["--model", "llama3-8b", "--recompute", "none,selective:mlpp"], "'mlpp' in 'selective:mlpp' is not one of"),
    (["--model", "llama3-8b", "--recompute", "selective:"], "names no module"),
    (["--model", "llama3-8b", "--recompute", "selective:mla_up_proj"], "needs multi-latent attention"),
])
def test_cli_bad_input_is_one_line(capsys, argv, word):
    rc = main(["plan", "--hardware", "dgx-h100", "--gpus", "8", "--global-batch", "8", "--seq-len", "2048", *argv])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and word in err[0]


def test_dask_missing_is_one_line(capsys):
    try:
        import dask.distributed  # noqa: F401
        pytest.skip("dask is installed")
    except ImportError:
        pass
    rc = main(["plan", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "8", "--global-batch", "8",
               "--seq-len", "2048", "--executor", "dask", "--scheduler", "tcp://127.0.0.1:8786"])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dask" in err[0] and "pip install" in err[0]


def test_llama3_70b_on_1024_h100_winner_fits():
    """The issue's case: Llama-3-70B, 1,024 H100, 4M tokens per step (512 x 8192)."""
    spec = PlanSpec(model=get_preset("llama3-70b"), model_ref="llama3-70b", hardware=load_profile("dgx-h100"),
                    gpus=1024, global_batch=512, seq_len=8192, schedules=("1F1B", "Interleaved1F1B", "ZBH1"),
                    recompute=("none", "full"), zero=(1, 3), microbatch_sizes=(1, 2))
    res = run_plan(spec, "time", top=3, confirm=3, workers=1)  # the full search: benchmarks/bench_plan.py
    assert res.n_candidates > 1000
    w = res.rows[0]
    assert w["fits_in_memory"] and w["peak_memory_bytes"] <= w["memory_capacity_bytes"]
    assert w["world_size"] == 1024
    assert w["prescreen_peak_memory_bytes"] >= w["peak_memory_bytes"] * (1 - 1e-9)


def test_cli_out_writes_every_format(tmp_path, capsys):
    out = tmp_path / "plan"
    rc = main(["plan", "--model", "llama3-8b", "--hardware", "dgx-h100", "--gpus", "16", "--global-batch", "32",
               "--seq-len", "4096", "--top", "2", "--confirm", "3", "--workers", "1", "--max-cp", "1",
               "--format", "csv", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("rank,dp,tp,pp")
    assert (out / "plan.csv").read_text() == printed
    assert json.loads((out / "plan.json").read_text())[0]["rank"] == 1
    assert "## Why the winner wins" in (out / "plan.md").read_text()
    assert "[parallel]" in (out / "winner.toml").read_text()


def test_tokens_pick_the_nearest_power_of_two_batch():
    import argparse

    from parsim.cli.plan import build_spec, register
    ap = argparse.ArgumentParser()
    register(ap.add_subparsers())
    args = ap.parse_args(["plan", "--model", "llama3-70b", "--hardware", "dgx-h100", "--gpus", "1024",
                          "--tokens", "4e6", "--seq-len", "8192"])
    spec = build_spec(args)
    assert spec.global_batch == 512 and spec.global_batch * spec.seq_len == 4 * 2**20


def test_module_recompute_modes_are_searched_and_emitted(tmp_path):
    """``--recompute selective:a+b`` puts Megatron's module recomputation in the search: its
    candidates are costed as the scenario would be, and the winner's scenario file names them."""
    from parsim.config.scenario import split_recompute
    from parsim.scenario import load_scenario
    assert split_recompute("selective:mla_up_proj+moe_act") == ("selective", ("mla_up_proj", "moe_act"))
    assert split_recompute("full") == ("full", None)
    spec = PlanSpec(model=get_preset("qwen3-30b-a3b"), model_ref="qwen3-30b-a3b", hardware=load_profile("dgx-h100"),
                    gpus=16, global_batch=64, seq_len=4096, schedules=("1F1B",),
                    recompute=("selective:moe_act", "selective:moe"), zero=(1,), microbatch_sizes=(1,), max_cp=1)
    cands = enumerate_candidates(spec)[0]
    assert {c.recompute for c in cands} == {"selective:moe_act", "selective:moe"}
    c = next(c for c in cands if c.recompute == "selective:moe")
    sc = make_scenario(spec, c)
    assert (sc.training.recompute, sc.training.recompute_modules) == ("selective", ("moe",))
    row = {"key": c.key(), "parallel": c.parallel_dict(), "schedule": c.schedule, "recompute": c.recompute,
           "microbatch_size": 1, "world_size": c.world}
    f = tmp_path / "w.toml"
    f.write_text(scenario_toml(spec, row))
    loaded = load_scenario(str(f))
    assert loaded.training.recompute_modules == ("moe",)
    assert simulate(loaded).metrics["step_time_s"] == pytest.approx(simulate(sc).metrics["step_time_s"], rel=1e-9)
