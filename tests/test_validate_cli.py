"""`parsim validate` end to end on the bundled tiny scenarios: every registered schedule, the
tensor-, context- and expert-parallel runs (exit 0, measured step times, the new ops in the
per-action table), and their gradient parity on the scenarios themselves. Each run starts
fresh rank processes: all of it is marked slow except the comparison's unit test (the fast
representatives of each capability are in test_validate*.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import launch_parity

from parsim.schedule import BUILDERS

TINY = "scenarios/tiny-cpu.toml"
MOE = "scenarios/tiny-moe-cpu.toml"
AXES = {
    "tp": (TINY, ["parallel.tp=2", "parallel.pp=1"]),
    "tp-sp": (TINY, ["parallel.tp=2", "parallel.pp=1", "parallel.sequence_parallel=true"]),
    "cp": (TINY, ["parallel.cp=2", "parallel.pp=1", "training.flash_attention=true"]),
    "ep": (MOE, []),
}


@pytest.fixture(autouse=True)
def _slow_only_when_asked(request):
    """The slow runs here start fresh rank processes for minutes: they run with ``-m slow``
    (the marker's documented meaning), not in everyone's default suite."""
    if request.node.get_closest_marker("slow") and "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("slow (fresh rank processes): run with -m slow")


def _validate(scenario: str, sets: list[str]) -> dict:
    cmd = [sys.executable, "-m", "parsim", "validate", scenario, "--steps", "1", "--warmup", "0", "--repeat", "1",
           "--json"] + [a for s in sets for a in ("--set", s)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_registered_schedule_validates(name):
    pytest.importorskip("torch")
    c = _validate(TINY, [f"schedule.name={name}"] + (["parallel.vpp=2"] if name == "Interleaved1F1B" else []))
    assert c["schedule"] == name
    assert c["measured"]["step_time_s"] > 0 and len(c["measured"]["step_time_all_s"]) == 1
    assert all(s["busy_s"] > 0 for s in c["measured"]["stages"])
    ops = {a["op"] for a in c["actions"] if a["duration_s_measured"] is not None}
    assert {"F", "STEP"} <= ops and ops & {"B", "I"}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("case", list(AXES))
def test_parallel_axes_validate_with_their_communication_in_the_table(case):
    pytest.importorskip("torch")
    scenario, sets = AXES[case]
    c = _validate(scenario, sets)
    stream = case.split("-")[0]
    rows = [a for a in c["actions"] if a["stream"] == stream]
    assert {a["op"] for a in rows} >= {"F", "B"}
    assert all(a["duration_s_measured"] and a["duration_s_measured"] > 0 for a in rows)
    if stream != "cp":  # the K/V ring may hide entirely under attention in the model (no exposed part)
        assert all(a["duration_s_predicted"] and a["duration_s_predicted"] > 0 for a in rows)
    assert c["world"] == 2 and c["measured"]["step_time_s"] > 0
    if case == "ep":  # the run's routing: 2 ranks x 2 microbatches x 256 tokens x top-2, per MoE layer
        mr = c["moe_routing"]
        assert [sum(row) for row in mr["histogram"]] == [2 * 2 * 256 * 2] * 4
        assert mr["predicted_step_time_s"] > 0
    else:
        assert "moe_routing" not in c


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("scenario,variants", [
    (TINY, [AXES["tp"][1], AXES["tp-sp"][1], AXES["cp"][1]]),
    (MOE, [[], ["parallel.ep=1"]]),  # ep = 1: the experts' gradients reduced over all dp ranks
])
def test_bundled_scenarios_pass_gradient_parity(tmp_path, scenario, variants):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from parsim.validate.reference import check_parity
    from parsim.validate.scale import prepare
    ranks = launch_parity(scenario, variants, 2, tmp_path, 120, 300)
    for i, over in enumerate(variants):
        res = check_parity(prepare(scenario, over, "gloo"), tmp_path, [r["variants"][i] for r in ranks], variant=i)
        assert res["max_abs_diff"] < 1e-5


def test_predicted_communication_rows_come_from_the_cost_parts():
    """tp = 2: F and B of the one stage carry tp_comm; the rows hold exactly those parts."""
    from parsim.scenario import load_scenario
    from parsim.simulate import simulate
    from parsim.validate.compare import predicted_comm
    res = simulate(load_scenario(TINY, ["parallel.tp=2", "parallel.pp=1", "gpus=2"]))
    rows = predicted_comm(res)
    assert set(rows["stream"]) == {"tp"} and {"F", "B"} <= set(rows["op"])
    for r in rows.itertuples():
        assert r.duration_s == res.tables.op(r.stage, r.op).parts.tp_comm
    assert len(predicted_comm(simulate(load_scenario(TINY)))) == 0
