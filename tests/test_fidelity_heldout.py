"""The held-out fidelity benchmark's rule set (benchmarks/fidelity_heldout.py): hand-computed
scenarios for a few rows, the reasons for rows it cannot express, and full coverage of the
data set (every row converts into a scenario parsim accepts, or says why not)."""
import copy
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import fidelity_heldout as fh

from parsim.model import total_params
from parsim.scenario import scenario_from_dict
from parsim.simulate import simulate

ROWS = {r["id"]: r for r in fh.load_rows()}
MEGATRON_ORDER = ["pp", "dp", "ep", "cp", "tp"]  # Megatron's tp-cp-ep-dp-pp, slowest first
MEGATRON_OVERLAP = {"grad_reduce": True, "param_gather": True, "tp_comm": True,
                    "p2p": False}  # Megatron blocks on its pipeline sends (batch_isend_irecv + wait + sync)


def test_the_data_set_has_239_rows_with_unique_ids():
    assert len(fh.load_rows()) == 239 == len(ROWS)


def test_nemotron_3_rows_run_their_hybrid_presets_with_the_recipes_mtp():
    # Nemotron 3 Nano (hybrid Mamba-2 / MoE) on its preset with the perf recipe's HybridEP dispatcher;
    # Super and Ultra (LatentMoE) and Lightning (Nano's backbone) train the recipes' two depths of one
    # shared "*E" MTP block; Super's NVFP4 recipe keeps its last 14 layers in BF16
    doc = fh.scenario_for(ROWS["mb-26.04.01-b200-nemotron3nano-mxfp8"])
    assert doc["model"] == {"preset": "nemotron-3-nano-30b-a3b"} and doc["hardware"] == "dgx-b200"
    assert doc["moe"]["dispatcher"] == "hybridep" and doc["moe"]["dispatcher_sms"] == 32
    assert doc["parallel"]["ep"] == 8 and doc["training"]["microbatch_size"] == 2
    mtp = {"mtp_layers": 2, "mtp_pattern": "*E", "mtp_shared": True}
    for rid, preset in (("mb-26.08-gb300-nemotron3super-nvfp4", "nemotron-3-super-120b-a12b"),
                        ("mb-26.08-gb300-nemotron3ultra-mxfp8", "nemotron-3-ultra-550b-a55b"),
                        ("mb-26.08-gb200-nemotron35lightning-mxfp8", "nemotron-3-nano-30b-a3b")):
        doc = fh.scenario_for(ROWS[rid])
        assert doc["model"] == {"preset": preset, **mtp}, rid
    assert fh.scenario_for(ROWS["mb-26.08-gb300-nemotron3super-nvfp4"])["training"]["bf16_last_layers"] == 14


def test_a_recipe_that_never_sets_tp_overlap_runs_without_it():
    # nemotron_3_super_pretrain_64gpu_gb200_fp8mx_config (TP 2, SP) sets no comm_overlap and its base
    # recipe starts from _pretrain_common(comm_overlap=None): Megatron-Core's tp_comm_overlap = False.
    # The asynchronous input-gradient reductions stay (overlap.tp_grad_allreduce unset: Megatron's default)
    row = ROWS["mb-26.08-gb200-nemotron3super-mxfp8"]
    assert fh._mb_moe_recipes()[row["id"]]["tp_comm_overlap"] is None
    doc = fh.scenario_for(row)
    assert doc["parallel"]["tp"] == 2 and doc["parallel"]["sequence_parallel"]
    assert doc["overlap"]["tp_comm"] is False and "tp_grad_allreduce" not in doc["overlap"]
    assert any("TP overlap off (never set" in n for n in fh.convert(row)[1])
    # a recipe that states it keeps what it states (the H100 Qwen3-235B recipe: False), and a TP 1
    # recipe that never sets it has nothing to overlap
    assert fh.scenario_for(ROWS["mb-25.11-h100-qwen3235ba22b-fp8cs"])["overlap"]["tp_comm"] is False
    tp1 = fh.scenario_for(ROWS["mb-26.08-gb300-nemotron3super-mxfp8"])
    assert tp1["parallel"]["tp"] == 1 and tp1["overlap"]["tp_comm"] is False


def test_megatron_bridge_llama3_70b_fp8_row():
    # | LLAMA3_70B | 64 | FP8-CS | GBS 128 | MBS 1 | 8192 | FSDP 0 | TP 4 | PP 8 | CP 1 | VP 5 | ... | 1602 |
    doc = fh.scenario_for(ROWS["mb-25.11-h100-llama370b-fp8cs"])
    assert doc == {
        "name": "mb-25.11-h100-llama370b-fp8cs", "hardware": "dgx-h100", "gpus": 64,
        "model": {"preset": "llama3-70b"},
        "training": {"global_batch": 128, "microbatch_size": 1, "seq_len": 8192, "precision": "fp8",
                     "optimizer": "adam", "recompute": "none",
                     "fp8_recipe": "current",  # the table's FP8-CS: Transformer Engine's current scaling
                     "attention_kernel": "cudnn",  # Transformer Engine's FusedAttention on Hopper
                     "cross_entropy_fusion": True},  # Megatron-Bridge's providers fuse the loss
        # dp = 64 / (4*8*1) = 2; distributed optimizer (zero 1); SP because tp > 1 in Megatron;
        # Megatron's memory layout, gradients reduced in bf16 as Bridge's performance recipes set
        "parallel": {"dp": 2, "tp": 4, "pp": 8, "cp": 1, "ep": 1, "vpp": 5, "zero": 1,
                     "sequence_parallel": True, "order": MEGATRON_ORDER, "framework": "megatron",
                     "grad_reduce_dtype": "bf16"},
        "schedule": {"name": "Interleaved1F1B"},  # 80 layers over 8*5 stages: 2 each, even
        "overlap": MEGATRON_OVERLAP,
    }


def test_megatron_bridge_llama3_8b_fp8_row_with_the_fsdp_column_is_zero3():
    doc = fh.scenario_for(ROWS["mb-25.11-h100-llama38b-fp8cs"])
    assert doc["model"] == {"preset": "llama3-8b"}
    assert doc["parallel"] == {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "zero": 3,
                               "sequence_parallel": False, "order": MEGATRON_ORDER, "grad_reduce_dtype": "bf16"}
    # its perf recipe (llama3_8b_pretrain_8gpu_h100_fp8cs_config) recomputes the first 5 blocks
    t = doc["training"]
    assert t["precision"] == "fp8" and (t["recompute"], t["recompute_method"], t["recompute_num_layers"]) == (
        "full", "block", 5)
    assert doc["schedule"] == {"name": "1F1B"} and doc["overlap"] == MEGATRON_OVERLAP


def test_llm_foundry_mpt70b_row():
    row = ROWS["llmfoundry-h10080gb-mpt70b-seq2048-128gpu"]
    doc = fh.scenario_for(row)
    assert doc == {
        "name": "llmfoundry-h10080gb-mpt70b-seq2048-128gpu", "hardware": "dgx-h100", "gpus": 128,
        "model": {"name": "mpt-70b", "n_layers": 80, "d_model": 8192, "n_heads": 64, "n_kv_heads": 64,
                  "vocab_size": 50368, "d_ff": 32768, "ffn": "gelu", "norm": "layernorm", "bias": True,
                  "tied_embeddings": True, "position": "learned", "max_seq_len": 2048},
        "training": {"global_batch": 1024, "microbatch_size": 8, "seq_len": 2048, "precision": "bf16",
                     "optimizer": "adam", "recompute": "full",  # "activation checkpointing ON"
                     "attention_kernel": "triton"},  # the benchmark runs: attn_impl triton (submit_benchmarks.py default)
        "parallel": {"dp": 128, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "vpp": 1, "zero": 3,  # FULL_SHARD
                     "sequence_parallel": False, "order": MEGATRON_ORDER},
        "schedule": {"name": "1F1B"},
        "overlap": {"grad_reduce": True, "param_gather": True, "tp_comm": False},
    }


def test_mpt_fields_reproduce_the_published_parameter_counts():
    checked = 0
    for row in ROWS.values():
        doc = fh.scenario_for(row)
        if row["model"]["name"].startswith("MPT") and isinstance(doc, dict):
            spec = scenario_from_dict(doc, row["id"]).model
            assert total_params(spec) == int(row["published"]["NumParams"]), row["id"]
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("rid, kind, words", [
    ("tt-mxfp8doc-b200-8gpu-none-bfloat16", "hardware: power-limited GPU", "power-capped"),
    ("deepseekv3-report-h800-2048-pretrain", "global batch not one number", "ramp"),
    ("megatronlm-strongscale-h100-gpt177b-96gpu", "no per-GPU throughput published", "mfu"),
    ("megatronlm-dsv3-gb200-guide-mxfp8", "no GPU count", "number of GPUs"),
])
def test_rows_that_must_be_skipped_say_why(rid, kind, words):
    skip = fh.scenario_for(ROWS[rid])
    assert isinstance(skip, fh.Skip)
    assert skip.kind == kind and words in skip.reason


@pytest.mark.parametrize("rid, hardware", [("mb-26.06-gb300-llama31405b-nvfp4", "gb300-nvl72"),
                                           ("mb-26.06-gb200-llama31405b-nvfp4", "gb200-nvl72")])
def test_nvfp4_rows_run_as_nvfp4_not_as_bf16(rid, hardware):
    doc = fh.scenario_for(ROWS[rid])
    assert isinstance(doc, dict) and doc["hardware"] == hardware
    assert doc["training"]["precision"] == "fp8" and doc["training"]["fp8_recipe"] == "nvfp4"


def test_b300_rows_run_on_the_dgx_b300_profile():
    doc = fh.scenario_for(ROWS["mb-26.06-b300-qwen330ba3b-mxfp8"])
    assert isinstance(doc, dict) and doc["hardware"] == "dgx-b300"


def test_a_gpu_count_the_layout_contradicts_is_skipped():
    row = copy.deepcopy(ROWS["nemo-longseq-b200-llama3-8b-32k"])
    row["hardware"] = {**row["hardware"], "count": row["hardware"]["count_published"]}
    del row["hardware"]["count_note"]
    skip = fh.scenario_for(row)
    assert isinstance(skip, fh.Skip)
    assert skip.kind == "layout inconsistent" and "stated dp 4" in skip.reason


def test_nemo_b200_long_sequence_rows_run_on_their_layout():
    # the page's GPU column is 4x TP*PP*DP*CP in every row (it repeats the sequence length in
    # K); 4x would leave 512K's batch of 8 and 1024K's of 4 short of dp = 16, so the data set
    # takes the layout as stated, and the row says so
    for rid, gpus, dp in (("nemo-longseq-b200-llama3-8b-32k", 8, 4), ("nemo-longseq-b200-llama3-8b-512k", 128, 4),
                          ("nemo-longseq-b200-llama3-8b-1024k", 256, 4)):
        row = ROWS[rid]
        p = row["parallel"]
        assert row["hardware"]["count_published"] == 4 * p["tp"] * p["pp"] * p["dp"] * p["cp"]
        doc, notes = fh.convert(row)
        assert doc["gpus"] == gpus and doc["parallel"]["dp"] == dp
        assert any(n.startswith(f"GPU count {gpus}, not the page's {4 * gpus}") for n in notes)
        assert doc["training"]["global_batch"] % dp == 0


def test_a100_40gb_rows_run_on_their_own_profile():
    out = fh.scenario_for(ROWS["llmfoundry-a10040gb-mpt70b-seq2048-128gpu"])
    assert out["hardware"] == "dgx-a100-40g"


def test_torchtitan_grand_teton_rows_as_torchtitan_ran_them():
    # the 500 W H100 96GB HBM2e of torchtitan's 2024-12 tables has a profile of its own
    eager, notes = fh.convert(ROWS["tt2412-llama31-8b-fsdp8-eager-bf16"])
    assert eager["hardware"] == "grand-teton-h100"
    # "Selective activation checkpointing" with the default op policy; no torch.compile
    assert eager["training"]["recompute"] == "op" and eager["training"]["fused_kernels"] is False
    assert eager["training"]["attention_kernel"] == "fa2"  # SDPA's FlashAttention-2 on Hopper
    assert "eager PyTorch: memory-bound ops unfused" in notes
    compiled, _ = fh.convert(ROWS["tt2412-llama31-8b-fsdp8-compile-bf16"])
    assert compiled["training"]["recompute"] == "op" and "fused_kernels" not in compiled["training"]
    full, _ = fh.convert(ROWS["tt2412-llama31-8b-cp1-seq32k"])
    assert full["training"]["recompute"] == "full"


def test_expert_parallel_group_with_tp_maps_to_parsim_ep_and_expert_tp_1():
    doc = fh.scenario_for(ROWS["mb-25.11-h100-qwen3235ba22b-fp8cs"])  # TP2 PP8 EP32 VP4, 256 GPUs
    assert doc["parallel"]["ep"] == 16 and doc["moe"] == {"routing": "balanced", "drop_tokens": False,
                                                          "expert_tp": 1}
    # 94 layers + embedding + loss = 96 over 8*4 stages
    assert doc["schedule"] == {"name": "Interleaved1F1B", "account_for_embedding": True, "account_for_loss": True}


def test_layer_split_rule():
    assert fh.split_for(80, 8, 5)[0] == {}
    assert fh.split_for(126, 16, 1)[0] == {"account_for_embedding": True, "account_for_loss": True}
    assert fh.split_for(61, 8, 4)[0] == {"first_stage_layers": 1, "last_stage_layers": 0}  # Et|(tt|)*30L
    assert fh.split_for(61, 16, 1)[0] == {}  # parsim's as-even-as-possible split
    # Megatron-Bridge's DeepSeek-V3 layouts (E + 4 | 4 x 14 | 1 + MTP + loss on 16 stages)
    assert fh.split_for(61, 16, 1, fh.MB_DSV3_LAYOUTS)[0] == {"first_stage_layers": 4, "last_stage_layers": 1}
    assert fh.split_for(61, 4, 1, fh.MB_DSV3_LAYOUTS)[0] == {"first_stage_layers": 16, "last_stage_layers": 13}
    assert fh.split_for(61, 8, 4, fh.MB_DSV3_LAYOUTS)[0] == {"first_stage_layers": 1, "last_stage_layers": 0}
    for (pp, vpp), (first, last) in fh.MB_DSV3_LAYOUTS.items():  # every layout holds the 61 blocks
        stages = pp * vpp
        assert first + last + (stages - 2) * ((61 - first - last) // (stages - 2)) == 61
    doc = fh.scenario_for(ROWS["mb-25.11-b200-deepseekv3wmtp-fp8mx"])  # pp 16, its recipe's layout
    assert (doc["schedule"]["first_stage_layers"], doc["schedule"]["last_stage_layers"]) == (4, 1)


def test_every_row_converts_into_an_accepted_scenario_or_has_a_reason():
    converted = 0
    for row in ROWS.values():
        out, _notes = fh.convert(row)
        if isinstance(out, fh.Skip):
            assert out.kind and len(out.reason) > 10, row["id"]
            continue
        assert fh.published_metric(row) is not None, row["id"]
        sc = scenario_from_dict(out, row["id"])  # raises if parsim refuses it
        assert sc.gpus == row["hardware"]["count"]
        converted += 1
    assert converted >= 100


def test_one_row_end_to_end():
    r = fh.run_row(ROWS["mb-25.11-h100-llama38b-fp8cs"])
    assert r["status"] == "compared" and r["metric"] == "tokens/s/GPU" and r["published"] == 14451.0
    assert r["error"] == pytest.approx((r["predicted"] - 14451.0) / 14451.0)
    assert 0.0 <= r["compute_frac"] <= 1.0 and 0.0 <= r["bubble_frac"] <= 1.0
    s = fh.summarise([r, fh.run_row(ROWS["tt-mxfp8doc-b200-8gpu-none-bfloat16"])])
    assert s["compared"] == 1 and s["skipped"] == 1 and s["skip_reasons"] == {"hardware: power-limited GPU": 1}


@pytest.mark.parametrize("row_id, schedule, vpp", [("tt2412-llama31-405b-3d-1f1b", "1F1B", 1),
                                                     ("tt2412-llama31-405b-3d-interleaved1f1b", "Interleaved1F1B", 2)])
def test_torchtitan_pipeline_rows_take_torchtitans_defaults(tmp_path, row_id, schedule, vpp):
    """The 2024 torchtitan 405B rows state pp 8, a local batch of 32 and the schedule, not the
    microbatches or (interleaved) the stages per rank. torchtitan at the commit they cite
    (9dec370) splits the local batch into pp = 8 microbatches (of 4) and gives a looped schedule
    2 stages per rank; ``parsim import torchtitan`` reads a 2024 file ([experimental] keys) the
    same way, so the row's scenario and the imported one agree."""
    from parsim.frameworks.torchtitan import import_torchtitan
    doc = fh.scenario_for(ROWS[row_id])
    assert (doc["parallel"]["pp"], doc["parallel"]["vpp"], doc["schedule"]["name"]) == (8, vpp, schedule)
    assert doc["training"]["microbatch_size"] == 32 // 8  # local batch 32 over 8 microbatches
    sc = scenario_from_dict(doc, "row.toml")
    assert sc.n_microbatches == 8
    job = tmp_path / "job.toml"
    job.write_text('[model]\nname = "llama3"\nflavor = "405B"\n[training]\nbatch_size = 32\nseq_len = 8192\n'
                   'data_parallel_degree = -1\ntensor_parallel_degree = 8\n'
                   f'[experimental]\npipeline_parallel_degree = 8\npipeline_parallel_schedule = "{schedule}"\n')
    imp = scenario_from_dict(import_torchtitan(job, "grand-teton-h100", 512).doc, "imported.toml")
    assert (imp.n_microbatches, imp.training.microbatch_size, imp.parallel.vpp) == (8, 4, vpp)
    assert tuple(imp.layers_per_stage) == tuple(sc.layers_per_stage)  # 1F1B: 15, 16 x 6, 15; interleaved: 7, 8 x 14, 7


@pytest.mark.parametrize("rid, mtp", [
    ("mb-25.11-b200-deepseekv3wmtp-fp8mx", 1),      # "DeepSeekV3 (w/ MTP)"
    ("mb-25.11-gb200-deepseekv3womtp-bf16", 0),     # "DeepSeekV3 (w/o MTP)"
    ("mb-26.04.01-gb200-deepseekv3-mxfp8", 1),      # Megatron-Bridge's recipes set mtp_num_layers = 1
    ("tt-dsv3-gb300-256-pp2vpp8-mtp1", 1),
    ("tt-dsv3-gb300-256-pp2vpp8-nomtp", 0),
    ("automodel-h100-bf16-deepseekv3-256gpu", 0),   # the run does not say: none, noted
])
def test_deepseek_v3_rows_train_mtp_only_where_the_run_does(rid, mtp):
    doc = fh.scenario_for(ROWS[rid])
    assert doc["model"].get("mtp_layers", 0) == mtp
    said = fh.mtp_trained(ROWS[rid])
    assert bool(said) == bool(mtp) and (said is None) == rid.startswith("automodel")


def test_automodel_fake_balanced_gate_is_one_group_of_consecutive_experts_a_token():
    # FakeBalancedGate: token i gets experts i*k .. i*k + k - 1 (mod E): one of E/k groups
    doc = fh.scenario_for(ROWS["automodel-h100-bf16-deepseekv3-256gpu"])
    assert (doc["model"]["expert_groups"], doc["model"]["expert_groups_per_token"]) == (256 // 8, 1)
    sc = scenario_from_dict(doc, "automodel")
    from parsim.costs.moe import distinct_nodes
    assert distinct_nodes(256, 8, 8, 32, 1) == pytest.approx(1.0)  # a token's experts on one node
    assert sc.model.expert_groups == 32
    # a Megatron-Bridge row keeps the model's own group-limited routing (8 groups, 4 a token)
    mb = fh.scenario_for(ROWS["mb-26.04.01-gb200-deepseekv3-mxfp8"])
    assert "expert_groups" not in mb["model"] and mb["model"]["preset"] == "deepseek-v3"


@pytest.mark.xfail(strict=True, reason=(
    "open: the NVFP4 row's recipe runs tensor-parallel communication without overlap, so its NCCL "
    "all-gathers and reduce-scatters (the reduce-scatters 16-bit, the gathers NVFP4) are exposed at the "
    "rates nccl-tests measures on 4 GB200 (benchmarks/fit_nccl_intranode.py); that row is 14% too slow "
    "and the ratio 1.25 (1.35 with the overlap on). Passed while NCCL was costed at the formulas' "
    "faster rates and FP8 reduce-scatters at 1 byte per element."))
def test_nvfp4_over_fp8_speedup_on_gb200_as_published():
    """Megatron-Bridge 26.06, Llama 3.1 405B on 256 GB200, each at its published layout: NVFP4
    1,166 and FP8 843 tokens/s/GPU (1.38x). Nothing in the model was fitted to either row."""
    def tps(rid: str) -> float:
        sc = scenario_from_dict(fh.scenario_for(ROWS[rid]), rid)
        return simulate(sc).metrics["tokens_per_s"] / sc.gpus
    nv, fp8 = "mb-26.06-gb200-llama31405b-nvfp4", "mb-26.06-gb200-llama31405b-fp8"
    published = ROWS[nv]["published"]["tokens_per_sec_per_gpu"] / ROWS[fp8]["published"]["tokens_per_sec_per_gpu"]
    assert tps(nv) / tps(fp8) == pytest.approx(published, rel=0.05)
