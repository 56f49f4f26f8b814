"""Uneven pipeline stages ([schedule] first_stage_layers / last_stage_layers / account_for_*,
layers_per_stage in model order) and the inferred parallel.dp.

Oracles: Megatron-LM's and torchtitan's split rules worked by hand (documented at each
case), and per-rank compute that must scale with the blocks a rank holds.
"""
from __future__ import annotations

import pytest
from helpers import TINY_GPT

from parsim import simulate
from parsim.config.parallel import partition_layers
from parsim.errors import ConfigError
from parsim.scenario import load_scenario, scenario_from_dict
from parsim.schedule import BUILDERS, traits

# families by their declared shape (schedules registered later fall into theirs)
TWO_CHAINS = {n for n in BUILDERS if traits(n).n_chains == 2}
V_SHAPED = {n for n in BUILDERS if traits(n).stages_per_rank == 2} - TWO_CHAINS


def _doc(model, gpus, parallel, schedule, global_batch=16, seq_len=8192, hardware="dgx-h100", recompute="full"):
    return {"name": "t", "hardware": hardware, "gpus": gpus, "model": model,
            "training": {"global_batch": global_batch, "seq_len": seq_len, "recompute": recompute},
            "parallel": parallel, "schedule": schedule}


# ---- the split rule, by hand ------------------------------------------------------------------

@pytest.mark.parametrize("args, kw, want", [
    # first/last chunk stated; the rest must divide: 126 - 3 - 3 = 120 over 30 -> 4
    ((126, 32), {"first": 3, "last": 3}, (3,) + (4,) * 30 + (3,)),
    ((126, 64), {"first": 1, "last": 1}, (1,) + (2,) * 62 + (1,)),
    # one end stated, the other end is an ordinary stage: 10 - 1 = 9 over 3 -> 3
    ((10, 4), {"first": 1}, (1, 3, 3, 3)),
    ((10, 4), {"last": 4}, (2, 2, 2, 4)),
    ((10, 2), {"first": 4, "last": 6}, (4, 6)),
    # Megatron --account-for-*: (126 + 2) / 32 = 4 per chunk, the ends build one block fewer
    ((126, 32), {"embedding": True, "loss": True, "interleaved": True}, (3,) + (4,) * 30 + (3,)),
    ((126, 16), {"embedding": True, "loss": True}, (7,) + (8,) * 14 + (7,)),
    # the Llama 3 paper's shape: 128 chunks of one slot, the first holds only the embedding,
    # the last only the output projection and the loss
    ((126, 128), {"embedding": True, "loss": True, "interleaved": True}, (0,) + (1,) * 126 + (0,)),
    # torchtitan's rule when it does not divide: 11 slots over 4 = (3,3,3,2), then the weights
    ((10, 4), {"embedding": True}, (2, 3, 3, 2)),
    ((10, 4), {"loss": True}, (3, 3, 3, 1)),
    # unchanged default: as even as possible, earlier stages get the extra
    ((10, 4), {}, (3, 3, 2, 2)),
])
def test_partition_by_hand(args, kw, want):
    got = partition_layers(*args, **kw)
    assert got == want and sum(got) == args[0]


@pytest.mark.parametrize("args, kw, key, says", [
    ((126, 32), {"first": 2, "last": 2}, "schedule.first_stage_layers", "e.g. 3 and 3"),
    ((126, 32), {"first": 3}, "schedule.first_stage_layers", "first_stage_layers = 2 would"),
    ((126, 32), {"last": 5}, "schedule.last_stage_layers", "last_stage_layers = 2 would"),
    ((10, 2), {"first": 4, "last": 5}, "schedule.first_stage_layers", "must be 10"),
    ((10, 1), {"first": 10}, "schedule.first_stage_layers", "two pipeline stages"),
    ((126, 32), {"interleaved": True}, "parallel.vpp", "first_stage_layers = 3, last_stage_layers = 3"),
    ((126, 64), {"interleaved": True}, "parallel.vpp", "first_stage_layers = 1, last_stage_layers = 1"),
    ((126, 32), {"embedding": True, "interleaved": True}, "parallel.vpp", "n_layers + embedding=127"),
    ((126, 32), {"first": 3, "last": 3, "loss": True}, "schedule.account_for_loss", "already state"),
    ((4, 8), {"embedding": True}, "parallel.pp", "only 4 layers"),
])
def test_refusals_name_the_key_and_what_would(args, kw, key, says):
    with pytest.raises(ConfigError) as e:
        partition_layers(*args, file="s.toml", **kw)
    assert e.value.key == key and says in e.value.problem and "\n" not in str(e.value)


def test_the_suggestions_are_right():
    # what the refusals propose, fed back, is accepted
    assert partition_layers(126, 32, first=3, last=3)[1] == 4
    assert partition_layers(126, 32, first=2) == (2,) + (4,) * 31
    assert partition_layers(126, 32, last=2) == (4,) * 31 + (2,)


# ---- Llama-3-405B as Megatron builds it -------------------------------------------------------

LLAMA_CASES = [
    # pp 16, vpp 2: chunk c sits on rank c % 16 (Megatron's virtual stage v of rank r is
    # chunk v*16 + r). Megatron's --account-for-embedding/loss: (126+2)/16 = 8 per rank,
    # 4 per chunk, the first and last chunk one fewer -> 3, 4 x 30, 3; ranks 0 and 15 hold 7.
    (16, 2, 3, (3,) + (4,) * 30 + (3,), (7,) + (8,) * 14 + (7,)),
    # pp 8, vpp 8: (126+2)/8 = 16 per rank, 2 per chunk -> 1, 2 x 62, 1; ranks 0 and 7 hold 15.
    (8, 8, 1, (1,) + (2,) * 62 + (1,), (15,) + (16,) * 6 + (15,)),
]


@pytest.mark.parametrize("pp, vpp, ends, chunks, ranks", LLAMA_CASES)
def test_llama3_405b_uneven_interleaved(pp, vpp, ends, chunks, ranks):
    model = {"preset": "llama3-405b"}
    par = {"tp": 8, "pp": pp, "vpp": vpp, "sequence_parallel": True}  # dp inferred: 1
    stated = scenario_from_dict(_doc(model, 8 * pp, par, {"name": "Interleaved1F1B", "first_stage_layers": ends,
                                                          "last_stage_layers": ends}), "t.toml")
    assert stated.model.n_layers == 126 and stated.parallel.dp == 1
    mx = simulate(stated).to_json()
    assert tuple(mx["layers_per_stage"]) == chunks
    assert tuple(s["layers"] for s in mx["stages"]) == ranks
    assert mx["step_time_s"] > 0 and 0 < mx["bubble_fraction"] < 1
    # the same split stated the other two ways (Megatron's flags; the explicit list) runs the same
    flags = scenario_from_dict(_doc(model, 8 * pp, par, {"name": "Interleaved1F1B", "account_for_embedding": True,
                                                         "account_for_loss": True}), "t.toml")
    listed = scenario_from_dict(_doc(model, 8 * pp, par, {"name": "Interleaved1F1B",
                                                          "layers_per_stage": list(chunks)}), "t.toml")
    assert flags.layers_per_stage == listed.layers_per_stage == chunks
    assert simulate(listed).to_json()["step_time_s"] == mx["step_time_s"]
    # and an even split is refused, saying what would work
    with pytest.raises(ConfigError, match=f"first_stage_layers = {ends}, last_stage_layers = {ends}"):
        scenario_from_dict(_doc(model, 8 * pp, par, {"name": "Interleaved1F1B"}), "t.toml")


def test_llama3_paper_chunks_of_embedding_and_loss_only():
    # Llama 3 paper (sec. 3.3.2): first chunk only the embedding, last only output + loss
    doc = _doc({"preset": "llama3-405b"}, 128, {"tp": 8, "pp": 16, "vpp": 8},
               {"name": "Interleaved1F1B", "first_stage_layers": 0, "last_stage_layers": 0})
    mx = simulate(scenario_from_dict(doc, "t.toml")).to_json()
    assert tuple(mx["layers_per_stage"]) == (0,) + (1,) * 126 + (0,)
    assert tuple(s["layers"] for s in mx["stages"]) == (7,) + (8,) * 14 + (7,)


# ---- every schedule takes an uneven split -----------------------------------------------------

def _placement(name: str, pp: int, n: int) -> list[int]:
    """Rank of each stage, written out by hand per family (not read from the builders)."""
    if name in V_SHAPED or name in TWO_CHAINS:
        return [s if s < pp else 2 * pp - 1 - s for s in range(n)]
    return [s % pp for s in range(n)]


def _uneven_list(name: str) -> list[int]:
    if name in TWO_CHAINS:  # two model copies, each summing to 16; rank 1 = 3 + 4, rank 2 = 5 + 6
        return [2, 3, 5, 6, 1, 6, 4, 5]
    if name in V_SHAPED:    # rank 1 holds stages 1 and 6, rank 2 stages 2 and 5
        return [2, 1, 3, 2, 2, 4, 2, 0]
    if name == "Interleaved1F1B":  # rank 1 holds stages 1 and 5, rank 2 stages 2 and 6
        return [2, 1, 3, 2, 2, 2, 4, 0]
    return [2, 3, 5, 6]


def _tiny(name, schedule_keys):
    vpp = 2 if name == "Interleaved1F1B" else 1
    doc = {"name": "t", "hardware": "dgx-a100-80g", "gpus": 4, "model": {**TINY_GPT, "n_layers": 16},
           "training": {"global_batch": 8, "seq_len": 512}, "parallel": {"pp": 4, "vpp": vpp},
           "schedule": {"name": name, "n_microbatches": 8, **schedule_keys}}
    return scenario_from_dict(doc, "t.toml")


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_schedule_runs_an_explicit_uneven_split(name):
    lps = _uneven_list(name)
    mx = simulate(_tiny(name, {"layers_per_stage": lps})).to_json()
    place = _placement(name, 4, len(lps))
    held = [sum(k for s, k in enumerate(lps) if place[s] == r) for r in range(4)]
    assert mx["layers_per_stage"] == lps
    assert [s["layers"] for s in mx["stages"]] == held
    # ranks 1 and 2 hold only middle stages (no embedding, no head): identical blocks, so their
    # compute is in the ratio of the blocks they hold
    busy = [s["busy_s"] for s in mx["stages"]]
    assert held[1] != held[2]
    assert busy[2] / busy[1] == pytest.approx(held[2] / held[1], rel=1e-9)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_every_schedule_takes_first_and_last_stage_layers(name):
    sc = _tiny(name, {"first_stage_layers": 1, "last_stage_layers": 3})
    n = 8 if (name in V_SHAPED or name == "Interleaved1F1B") else 4
    # 16 - 1 - 3 = 12 over the other n-2 stages (per model copy for two-chain schedules)
    want = [1] + [12 // (n - 2)] * (n - 2) + [3]
    want = want * 2 if name in TWO_CHAINS else want
    mx = simulate(sc).to_json()
    assert mx["layers_per_stage"] == want and mx["step_time_s"] > 0


# ---- scenario-level refusals -----------------------------------------------------------------

@pytest.mark.parametrize("keys, key", [
    ({"first_stage_layers": 2, "layers_per_stage": [4, 4, 4, 4]}, "schedule.first_stage_layers"),
    ({"last_stage_layers": 0, "layers_per_stage": [4, 4, 8, 0]}, "schedule.last_stage_layers"),
    ({"account_for_loss": True, "partition": "balanced"}, "schedule.account_for_loss"),
    ({"first_stage_layers": -1}, "schedule.first_stage_layers"),
    ({"last_stage_layers": True}, "schedule.last_stage_layers"),
    ({"account_for_embedding": 1}, "schedule.account_for_embedding"),
    ({"layers_per_stage": [4, 0, 8, 4]}, "schedule.layers_per_stage"),  # 0 only at a chunk end
])
def test_scenario_refusals(keys, key):
    with pytest.raises(ConfigError) as e:
        _tiny("1F1B", keys)
    assert e.value.key == key and e.value.file == "t.toml"


def test_families():
    assert TWO_CHAINS >= {"DualPipe", "Chimera"} and V_SHAPED >= {"ZBV", "DualPipeV"}


def test_two_chain_list_must_hold_the_model_in_each_copy():
    with pytest.raises(ConfigError, match="layers_per_stage"):
        _tiny("DualPipe", {"layers_per_stage": [4, 4, 4, 4, 2, 2, 2, 2]})  # 16 + 8, sums to 24 != 32
    with pytest.raises(ConfigError, match="layers_per_stage"):
        _tiny("DualPipe", {"layers_per_stage": [8, 8, 8, 8, 1, 1, 1, 5]})  # 32 in all, but 32 + 8 per copy


def test_zero_blocks_at_the_ends_of_an_explicit_list():
    mx = simulate(_tiny("1F1B", {"layers_per_stage": [0, 8, 8, 0]})).to_json()
    assert [s["layers"] for s in mx["stages"]] == [0, 8, 8, 0]


# ---- parallel.dp inferred ---------------------------------------------------------------------

@pytest.mark.parametrize("gpus, par, dp", [
    (64, {"tp": 8}, 8),
    (64, {"tp": 4, "pp": 2}, 8),
    (64, {"tp": 2, "pp": 2, "cp": 2}, 8),
    (8, {"tp": 8}, 1),
])
def test_dp_inferred(gpus, par, dp):
    sc = scenario_from_dict(_doc({"preset": "llama3-8b"}, gpus, par, {}, global_batch=64, seq_len=4096), "t.toml")
    assert sc.parallel.dp == dp and sc.parallel.world_size == gpus


def test_dp_inferred_with_experts_carved_out_of_dp():
    doc = _doc({"preset": "mixtral-8x7b"}, 64, {"tp": 2, "ep": 8}, {}, global_batch=64, seq_len=4096)
    sc = scenario_from_dict(doc, "t.toml")
    assert (sc.parallel.dp, sc.parallel.ep, sc.parallel.world_size) == (32, 8, 64)


def test_dp_not_dividing_is_one_line():
    with pytest.raises(ConfigError) as e:
        scenario_from_dict(_doc({"preset": "llama3-8b"}, 64, {"tp": 8, "pp": 3}, {}, global_batch=64), "t.toml")
    assert e.value.key == "parallel.dp" and "8*3*1 = 24" in e.value.problem


def test_set_dp_still_decides(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text('hardware = "dgx-h100"\ngpus = 64\n[model]\npreset = "llama3-8b"\n'
                 '[training]\nglobal_batch = 64\nseq_len = 4096\n[parallel]\ntp = 8\n')
    assert load_scenario(p).parallel.dp == 8
    assert load_scenario(p, ["parallel.dp=8"]).parallel == load_scenario(p).parallel
    with pytest.raises(ConfigError, match="dp\\*tp\\*pp\\*cp = 4\\*8\\*1\\*1 = 32") as e:
        load_scenario(p, ["parallel.dp=4"])
    assert e.value.key == "gpus"
