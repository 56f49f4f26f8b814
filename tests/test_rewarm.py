"""A CPU rank's compute re-warms after each blocking collective (``Device.comm_rewarm_s``).

The fit (mean over the blocking kinds, at least 0), the profile key, and the cost model's
count of blocking calls per pass, held to a hand count of the runtime's calls: tensor
parallelism's f/g all-reduces (2 a block each way), sequence parallelism's all-gathers and
reduce-scatters (4 a block each way; the backward's re-gathers run beside their GEMMs and are not
blocking), the vocabulary-parallel embedding (1 forward; under sequence parallelism 1 backward)
and LM head + loss (3 loss all-reduces forward, plus the input's gather under sequence
parallelism; 1 backward), the expert all-to-alls (2 each way, plus the forward's count exchange),
the context-parallel ring (cp - 1 waits forward, cp backward). A GPU profile states no re-warm:
its predictions do not move.
"""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from parsim import load_scenario
from parsim.calibrate.fit import fit_profile, fit_rewarm
from parsim.cluster.contention import rewarm_s
from parsim.cluster.hardware import dumps_profile, load_profile
from parsim.costs.inputs import cost_inputs, layer_inputs
from parsim.costs.layer import layer_cost, moe_phase
from parsim.costs.stage import embedding_cost, head_cost
from parsim.errors import ConfigError

R = 1e-4  # 0.1 ms a call: the order calibration measured on the 2-core VM


def _rows(seconds):
    return pd.DataFrame([{"kind": "rewarm", "name": k, "seconds": s, "bytes": 262144.0, "group": 2, "rank": 0,
                          "host": "h"} for k, s in zip(("all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
                                                        seconds)])


def test_fit_takes_the_mean_over_kinds_at_least_zero(tmp_path):
    assert fit_rewarm(_rows([1.7e-4, 1.85e-4, -0.1e-4, 1.25e-4])) == pytest.approx(1.175e-4)
    assert fit_rewarm(_rows([-1e-4, -2e-4, 0.5e-4, 0.0])) == 0.0  # noise below zero: no re-warm
    base = load_profile("cpu-gloo")
    assert base.device.comm_rewarm_s is None
    fit = fit_profile(base, _rows([1e-4, 2e-4, 1e-4, 2e-4]), "rewarmed")
    assert fit.profile.device.comm_rewarm_s == pytest.approx(1.5e-4)
    assert "comm_rewarm_us" in " ".join(fit.sources)
    path = tmp_path / "rewarmed.toml"
    path.write_text(dumps_profile(fit.profile, fit.sources, {}))
    assert load_profile(str(path)).device.comm_rewarm_s == pytest.approx(1.5e-4)
    bad = tmp_path / "bad.toml"
    bad.write_text(path.read_text().replace("comm_rewarm_us = 150.0", "comm_rewarm_us = -3.0"))
    assert "comm_rewarm_us = -3.0" in bad.read_text()
    with pytest.raises(ConfigError, match="comm_rewarm_us"):
        load_profile(str(bad))


def test_rewarm_is_per_call_and_zero_without_the_key():
    dev = load_profile("cpu-gloo").device
    assert rewarm_s(dev, 5) == 0.0
    warm = replace(dev, comm_rewarm_s=R)
    assert rewarm_s(warm, 5) == pytest.approx(5 * R) and rewarm_s(warm, 0) == 0.0


def _profile(tmp_path, rewarm: float | None) -> str:
    base = load_profile("cpu-gloo")
    path = tmp_path / f"gloo-{rewarm}.toml"
    path.write_text(dumps_profile(replace(base, device=replace(base.device, comm_rewarm_s=rewarm)), {}, {}))
    return str(path)


def _inp(scenario: str, overrides: list[str], hardware: str):
    sc = load_scenario(scenario, overrides + [f"hardware={hardware}"])
    return layer_inputs(cost_inputs(sc))


def _compute(inp):
    lc = layer_cost(inp, False)
    return lc.forward.compute, lc.backward_input.compute


@pytest.mark.parametrize("overrides, block, embedding, head", [
    (["parallel.pp=1", "parallel.tp=2"], (2, 2), (1, 0), (3, 1)),
    (["parallel.pp=1", "parallel.tp=2", "parallel.sequence_parallel=true"], (4, 4), (1, 1), (4, 1)),
    (["parallel.pp=1", "parallel.cp=2", "training.flash_attention=true"], (1, 2), (0, 0), (0, 0)),
    (["parallel.pp=1", "parallel.dp=2"], (0, 0), (0, 0), (0, 0)),
])
def test_blocking_calls_per_pass_as_the_runtime_makes_them(tmp_path, overrides, block, embedding, head):
    cold, warm = _profile(tmp_path, None), _profile(tmp_path, R)
    a, b = _inp("scenarios/tiny-cpu.toml", overrides, cold), _inp("scenarios/tiny-cpu.toml", overrides, warm)
    (f0, i0), (f1, i1) = _compute(a), _compute(b)
    assert (f1 - f0, i1 - i0) == pytest.approx((block[0] * R, block[1] * R), abs=1e-12)
    e0, e1 = embedding_cost(a), embedding_cost(b)
    assert (e1.forward.compute - e0.forward.compute, e1.backward_input.compute - e0.backward_input.compute) == \
        pytest.approx((embedding[0] * R, embedding[1] * R), abs=1e-12)
    h0, h1 = head_cost(a), head_cost(b)
    assert (h1.forward.compute - h0.forward.compute, h1.backward_input.compute - h0.backward_input.compute) == \
        pytest.approx((head[0] * R, head[1] * R), abs=1e-12)


def test_expert_all_to_alls_and_the_count_exchange(tmp_path):
    cold, warm = _profile(tmp_path, None), _profile(tmp_path, R)
    a, b = (_inp("scenarios/tiny-moe-cpu.toml", [], hw) for hw in (cold, warm))
    # the torch runtime exchanges the token counts before its dispatch (Megatron-Core's all-to-all
    # dispatcher does too): a third blocking call in the forward
    assert moe_phase(a).count_exchange_s > 0
    la, lb = layer_cost(a, True), layer_cost(b, True)
    assert lb.forward.compute - la.forward.compute == pytest.approx(3 * R, abs=1e-12)
    assert lb.backward_input.compute - la.backward_input.compute == pytest.approx(2 * R, abs=1e-12)


def test_only_a_cpu_calibration_states_it():
    from parsim.cluster.hardware import list_profiles
    for name in list_profiles():
        dev = load_profile(name).device
        assert dev.comm_rewarm_s is None or dev.eager_op_forward_s is not None, name
