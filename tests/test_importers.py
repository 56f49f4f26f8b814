"""`parsim import megatron|torchtitan`: framework configurations -> scenarios that simulate like
the scenarios written by hand for the same job; the frameworks' own rules (vocabulary padding,
layer splits, batch arithmetic) against hand-computed cases; bad input as one line, exit 2."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from parsim.errors import ConfigError
from parsim.frameworks import check, import_megatron, import_torchtitan, to_toml
from parsim.frameworks.megatron_args import FLAGS
from parsim.frameworks.torchtitan import TORCH_SCHEDULES
from parsim.scenario import load_scenario
from parsim.schedule import BUILDERS
from parsim.simulate import simulate

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "frameworks"
SCRIPT = DATA / "megatron-train_gpt3_175b_distributed.sh"
TITAN_TOML = DATA / "torchtitan-llama3_8b.toml"
TITAN_JSON = DATA / "torchtitan-llama3_8b-config.json"
SMALL = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "4096",
         "--vocab-size", "32000"]


def run(*args):
    return subprocess.run([sys.executable, "-m", "parsim", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def script_args(path: Path = SCRIPT) -> list[str]:
    """The pretrain_gpt.py arguments of Megatron's example script: its bash arrays, in the
    order the torchrun line passes them, shell variables left as their names."""
    text = path.read_text()
    order = re.search(r"pretrain_gpt\.py(.*)", text, re.DOTALL).group(1)
    out = []
    for name in re.findall(r"\$\{(\w+)\[@\]\}", order):
        body = re.search(rf"^{name}=\((.*?)^\)", text, re.DOTALL | re.MULTILINE).group(1)
        out += shlex.split(body, comments=True)
    return out


def gpt3_like_bundled() -> list[str]:
    """The example's arguments for the job scenarios/gpt3-175b-1f1b.toml describes: its pp (8,
    not the script's 16) and precision (bf16), and the settings the script leaves at Megatron's
    defaults while the scenario states them (sequence parallel, distributed optimizer, full
    recompute of every layer, overlapped gradient reduction)."""
    args = script_args()
    i = args.index("--pipeline-model-parallel-size")
    args[i + 1] = "8"
    args[args.index("--fp16")] = "--bf16"
    return args + ["--sequence-parallel", "--use-distributed-optimizer", "--recompute-granularity", "full",
                   "--recompute-method", "uniform", "--recompute-num-layers", "1", "--overlap-grad-reduce"]


def close(a: dict, b: dict, keys=("step_time_s", "mfu", "bubble_fraction", "peak_memory_bytes", "exposed_comm_s"),
          rel=0.01):
    for k in keys:
        assert a[k] == pytest.approx(b[k], rel=rel), k


# ------------------------------------------------------------------------------------- Megatron


def test_example_script_is_read_as_megatron_runs_it():
    args = script_args()
    assert args[:4] == ["--num-layers", "96", "--hidden-size", "12288"]
    assert args[args.index("--rampup-batch-size") + 1:][:3] == ["16", "16", "5859375"]
    assert "--pipeline-model-parallel-size" in args and "$CHECKPOINT_PATH" in args


def test_megatron_gpt3_example_simulates_like_the_bundled_scenario(tmp_path):
    out = tmp_path / "gpt3.toml"
    r = run("import", "megatron", "--hardware", "dgx-a100-80g", "--gpus", "1024", "--out", out, "--",
            *gpt3_like_bundled())
    assert r.returncode == 0, r.stderr
    imported = simulate(load_scenario(out)).to_json()
    # Megatron blocks on its pipeline sends unless --overlap-p2p-communication: the bundled
    # scenario (asynchronous sends) says so with overlap.p2p = false; and Megatron keeps (and
    # reduces) fp32 main gradients under bf16: parallel.framework = "megatron"
    bundled = simulate(load_scenario(ROOT / "scenarios" / "gpt3-175b-1f1b.toml",
                                     ["overlap.p2p=false", 'parallel.framework="megatron"'])).to_json()
    close(imported, bundled)
    # the padded GPT-2 vocabulary (51200) is the only difference in the weights
    assert imported["params"] - bundled["params"] == (51200 - 50257) * 12288


def test_every_megatron_argument_is_read_or_listed():
    args = script_args()
    text = to_toml(import_megatron(args, "dgx-a100-80g", 128))
    listed = text.split("# Not modelled by parsim")[1].split("\nname =")[0]
    for flag in (a for a in args if a.startswith("--")):
        assert (flag in FLAGS) != (flag in listed), flag
    assert "--rampup-batch-size 16 16 5859375" in listed and "--save $CHECKPOINT_PATH" in listed


def test_megatron_model_follows_megatron_defaults():
    doc = import_megatron(["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
                           "--seq-length", "4096", "--swiglu", "--group-query-attention", "--num-query-groups", "8",
                           "--normalization", "RMSNorm", "--position-embedding-type", "rope",
                           "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                           "--tokenizer-type", "GPT2BPETokenizer", "--tensor-model-parallel-size", "4",
                           "--attention-dropout", "0", "--hidden-dropout", "0"]).doc
    m, t = doc["model"], doc["training"]
    # SwiGLU FFN int((4h * 2/3) / 64) * 64 = int(170.67) * 64; vocab 50257 padded to 128*tp = 512
    assert (m["d_ff"], m["vocab_size"], m["n_kv_heads"]) == (10880, 50688, 8)
    assert (m["ffn"], m["norm"], m["position"], m["tied_embeddings"], m["bias"]) == (
        "swiglu", "rmsnorm", "rope", False, False)
    assert (t["precision"], t["dropout"], t["recompute"], doc["parallel"]["zero"]) == ("fp32", False, "none", 0)
    gpt = import_megatron(SMALL[:-2] + ["--merge-file", "m.txt"]).doc["model"]
    assert (gpt["d_ff"], gpt["vocab_size"], gpt["n_kv_heads"], gpt["ffn"], gpt["tied_embeddings"]) == (
        4 * 2048, 50304, 16, "gelu", True)  # 50257 padded to a multiple of 128 (tp = 1)


def test_megatron_padded_vocab_is_taken_as_given():
    assert import_megatron(SMALL + ["--padded-vocab-size", "50000", "--tensor-model-parallel-size", "8"]
                           ).doc["model"]["vocab_size"] == 50000


@pytest.mark.parametrize("extra, per_stage, keys", [
    # first rank 6, last 6, the two middle ranks share 30 - 12 = 18
    (["--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "6",
      "--decoder-last-pipeline-num-layers", "6"], [6, 9, 9, 6], {"first_stage_layers", "last_stage_layers"}),
    # 32 layers, 8 per rank, 4 per virtual stage: vpp 2, an even split (no keys needed)
    (["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "4"],
     [4, 4, 4, 4, 4, 4, 4, 4], set()),
    (["--pipeline-model-parallel-size", "4", "--account-for-embedding-in-pipeline-split",
      "--account-for-loss-in-pipeline-split"], [7, 8, 8, 7], {"account_for_embedding", "account_for_loss"}),
    (["--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2",
      "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"],
     [3, 4, 4, 4, 4, 4, 4, 3], {"account_for_embedding", "account_for_loss"}),
])
def test_megatron_stage_split_hand_computed(extra, per_stage, keys):
    args = ["--num-layers", str(sum(per_stage)), *SMALL[2:], *extra]
    imp = import_megatron(args)
    sc = check(imp)
    assert list(sc.layers_per_stage) == per_stage
    assert set(imp.doc["schedule"]) - {"name"} == keys


def test_megatron_first_last_count_the_whole_rank_over_its_virtual_stages():
    # 24 layers, pp 4, vpp 2: rank 0 and rank 3 hold 4 layers each, 2 per model chunk;
    # ranks 1 and 2 hold (24 - 8) / 2 = 8, 4 per chunk. Model order: chunk c of rank r is stage c*4 + r.
    imp = import_megatron(SMALL + ["--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank",
                                   "2", "--decoder-first-pipeline-num-layers", "4",
                                   "--decoder-last-pipeline-num-layers", "4"])
    assert imp.doc["schedule"] == {"name": "Interleaved1F1B", "layers_per_stage": [2, 4, 4, 2, 2, 4, 4, 2]}
    assert list(check(imp).layers_per_stage) == [2, 4, 4, 2, 2, 4, 4, 2]


def test_megatron_parallel_settings():
    doc = import_megatron(SMALL + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                   "--context-parallel-size", "2", "--sequence-parallel", "--micro-batch-size", "2",
                                   "--use-distributed-optimizer", "--overlap-param-gather", "--tp-comm-overlap",
                                   "--recompute-activations", "--fp8-format", "hybrid"], gpus=32).doc
    # Megatron's memory layout; FP8 runs with bf16 parameters: fp32 gradient reduction, its default
    assert doc["parallel"] == {"dp": 4, "tp": 2, "pp": 2, "cp": 2, "zero": 1, "sequence_parallel": True,
                               "framework": "megatron"}
    assert doc["training"]["global_batch"] == 8  # Megatron's default: micro batch * dp
    assert (doc["training"]["recompute"], doc["training"]["precision"]) == ("selective", "fp8")
    # no --overlap-p2p-communication: Megatron's pipeline sends block
    assert doc["overlap"] == {"grad_reduce": False, "param_gather": True, "tp_comm": True, "p2p": False}
    # Megatron drops sequence parallelism at tp = 1
    assert import_megatron(SMALL + ["--sequence-parallel"]).doc["parallel"]["sequence_parallel"] is False


def test_megatron_moe():
    doc = import_megatron(SMALL + ["--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "1024",
                                   "--expert-model-parallel-size", "4", "--moe-layer-freq", "[0]*2+[1,0]*11"],
                          gpus=8).doc
    m = doc["model"]
    assert (m["n_experts"], m["top_k"], m["d_ff_expert"], m["first_dense_layers"], m["moe_every"]) == (8, 2, 1024, 2, 2)
    assert doc["moe"] == {"drop_tokens": False} and doc["parallel"]["ep"] == 4
    sc = check(import_megatron(SMALL + ["--num-experts", "8", "--moe-layer-freq", "[0]*2+[1,0]*11",
                                        "--expert-model-parallel-size", "4"], gpus=8))
    assert sc.model.n_moe_layers == 11


def test_megatron_router_groups_are_the_models_group_limited_routing():
    moe = SMALL + ["--num-experts", "16", "--moe-router-topk", "4", "--expert-model-parallel-size", "8"]
    doc = import_megatron(moe + ["--moe-router-num-groups", "4", "--moe-router-group-topk", "2"], gpus=8).doc
    assert (doc["model"]["expert_groups"], doc["model"]["expert_groups_per_token"]) == (4, 2)
    assert check(import_megatron(moe + ["--moe-router-num-groups", "4", "--moe-router-group-topk", "2"],
                                 gpus=8)).model.expert_groups_per_token == 2
    assert "expert_groups" not in import_megatron(moe, gpus=8).doc["model"]
    with pytest.raises(ConfigError) as err:  # 3 groups do not divide 16 experts: the flag is named
        check(import_megatron(moe + ["--moe-router-num-groups", "3", "--moe-router-group-topk", "2"], gpus=8))
    assert "--moe-router-num-groups" in str(err.value)


def test_megatron_mtp_num_layers_is_the_models_mtp_depth():
    doc = import_megatron(SMALL + ["--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2"], gpus=2).doc
    assert doc["model"]["mtp_layers"] == 1
    sc = check(import_megatron(SMALL + ["--mtp-num-layers", "1", "--pipeline-model-parallel-size", "2"], gpus=2))
    assert sc.model.mtp_layers == 1
    assert "mtp_layers" not in import_megatron(SMALL, gpus=1).doc["model"]


def test_megatron_flex_dispatcher_and_ep_overlap():
    moe = SMALL + ["--num-experts", "8", "--expert-model-parallel-size", "4"]
    imp = import_megatron(moe + ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep",
                                 "--moe-hybridep-num-sms", "32", "--moe-deepep-num-sms", "20",
                                 "--overlap-moe-expert-parallel-comm"], gpus=8)
    assert imp.doc["moe"] == {"drop_tokens": False, "dispatcher": "hybridep", "dispatcher_sms": 32}
    assert imp.doc["overlap"]["ep_comm"] is True
    assert any(a.startswith("--moe-deepep-num-sms 20 (ignored: flex backend hybridep)") for a in imp.not_modelled)
    # Megatron-Core's flex dispatcher defaults to DeepEP; alltoall leaves the backend idle
    assert import_megatron(moe + ["--moe-token-dispatcher-type", "flex"], gpus=8).doc["moe"]["dispatcher"] == "deepep"
    idle = import_megatron(moe + ["--moe-token-dispatcher-type", "alltoall", "--moe-flex-dispatcher-backend",
                                  "deepep"], gpus=8)
    assert "dispatcher" not in idle.doc["moe"]
    assert any("ignored: no --moe-token-dispatcher-type flex" in a for a in idle.not_modelled)
    check(imp)
    r = run("import", "megatron", "--", *moe, "--moe-token-dispatcher-type", "allgather")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--moe-token-dispatcher-type" in r.stderr


@pytest.mark.parametrize("args, key", [
    (SMALL + ["--tensor-model-parallel-size", "x"], "--tensor-model-parallel-size: expected an integer"),
    (SMALL + ["--recompute-granularity", "sometimes"], "--recompute-granularity: 'sometimes' is not one of"),
    (SMALL + ["--recompute-granularity", "full"], "--recompute-method: missing"),
    (SMALL + ["--tensor-model-parallel-size", "3"], "--tensor-model-parallel-size: 16 attention heads"),
    (SMALL + ["--pipeline-model-parallel-size", "5"], "--num-layers: 24 layers are not divisible"),
    (SMALL + ["--global-batch-size", "7", "--micro-batch-size", "2"],
     "--global-batch-size: 7 is not divisible by dp*microbatch_size = 2"),
    (SMALL[2:], "--num-layers: missing"),
    (SMALL[:-2] + ["--tokenizer-type", "HuggingFaceTokenizer"], "--tokenizer-type: the vocabulary of"),
    (SMALL + ["--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "5"],
     "--decoder-first-pipeline-num-layers: the other 3 pipeline ranks"),
])
def test_megatron_bad_input_is_one_line(args, key):
    r = run("import", "megatron", "--", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("parsim: error: megatron arguments: ")
    assert key in r.stderr, r.stderr


@pytest.mark.parametrize("flags, recipe", [
    (["--fp8-format", "hybrid"], "delayed"),  # TransformerConfig.fp8_recipe's default
    (["--fp8-format", "e4m3", "--fp8-recipe", "tensorwise"], "current"),  # Megatron's name for current scaling
    (["--fp8-format", "e4m3", "--fp8-recipe", "blockwise"], "blockwise"),
    (["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"], "mxfp8"),
    (["--fp4-format", "e2m1"], "nvfp4"),  # Fp4Recipe's default, NVFP4BlockScaling through TE's FP8 path
    (["--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"], "nvfp4"),
])
def test_megatron_low_precision_recipes(flags, recipe):
    doc = import_megatron(SMALL + ["--bf16"] + flags, hardware="dgx-b200").doc
    assert (doc["training"]["precision"], doc["training"]["fp8_recipe"]) == ("fp8", recipe)


def test_megatron_fp4_and_fp8_together_are_refused():
    with pytest.raises(ConfigError, match="--fp4-format"):
        import_megatron(SMALL + ["--fp8-format", "e4m3", "--fp4-format", "e2m1"], hardware="dgx-b200")
    imp = import_megatron(SMALL + ["--fp8-recipe", "mxfp8", "--fp4-recipe", "nvfp4"])
    listed = " ".join(imp.not_modelled)
    assert "--fp8-recipe mxfp8 (ignored: no --fp8-format)" in listed and "--fp4-recipe nvfp4" in listed


def test_megatron_flags_without_effect_here_are_listed():
    imp = import_megatron(SMALL + ["--moe-layer-freq", "2", "--num-query-groups", "4", "--recompute-method", "block",
                                   "--sgd-momentum", "0.5"])
    listed = " ".join(imp.not_modelled)
    for flag in ("--moe-layer-freq 2", "--num-query-groups 4", "--recompute-method block", "--sgd-momentum 0.5"):
        assert flag in listed, flag
    assert imp.doc["model"]["n_kv_heads"] == 16 and "n_experts" not in imp.doc["model"]


def test_megatron_inconsistent_gpus():
    with pytest.raises(ConfigError, match="--gpus: 12 GPUs are not a multiple of tp\\*pp\\*cp"):
        import_megatron(SMALL + ["--tensor-model-parallel-size", "8"], gpus=12)


# ------------------------------------------------------------------------------------- torchtitan


def test_torchtitan_llama3_8b_simulates_like_the_hand_written_scenario(tmp_path):
    out = tmp_path / "titan.toml"
    r = run("import", "torchtitan", TITAN_TOML, "--hardware", "dgx-a100-80g", "--gpus", "64", "--out", out)
    assert r.returncode == 0, r.stderr
    imported = simulate(load_scenario(out)).to_json()
    hand = simulate(load_scenario(DATA / "llama3-8b-64gpu-hand.toml")).to_json()
    close(imported, hand)
    assert imported["params"] == hand["params"]


def test_torchtitan_later_spelling_is_the_same_job():
    toml_doc = import_torchtitan(TITAN_TOML, "dgx-a100-80g", 64).doc
    json_doc = import_torchtitan(TITAN_JSON, "dgx-a100-80g", 64).doc
    assert toml_doc == json_doc
    assert toml_doc["parallel"]["zero"] == 3 and toml_doc["training"]["recompute"] == "op"


def _titan(tmp_path, text: str, gpus=None, **kw):
    p = tmp_path / "job.toml"
    p.write_text(text)
    return import_torchtitan(p, "dgx-h100", gpus, **kw)


def _job(pp=4, schedule="1F1B", flavor="8B", extra_par="", extra=""):
    return (f'[model]\nname = "llama3"\nflavor = "{flavor}"\n[training]\nlocal_batch_size = 8\nseq_len = 4096\n'
            f'[parallelism]\ndata_parallel_shard_degree = -1\npipeline_parallel_degree = {pp}\n'
            f'pipeline_parallel_schedule = "{schedule}"\n{extra_par}{extra}')


@pytest.mark.parametrize("torch_name", sorted(TORCH_SCHEDULES.values()))
def test_torchtitan_schedule_names(tmp_path, torch_name):
    raw = {"ZBV": "ZBVZeroBubble"}.get(torch_name, torch_name)
    if torch_name in BUILDERS:
        imp = _titan(tmp_path, _job(schedule=raw), gpus=8)
        assert imp.doc["schedule"]["name"] == torch_name
        single = torch_name in ("1F1B", "GPipe")
        assert imp.doc["parallel"].get("vpp", 1) == (1 if single else 2)  # torchtitan's default stages per rank
        check(imp)
    else:  # a torch schedule parsim has not registered: refused, naming the key
        with pytest.raises(ConfigError, match="parallelism.pipeline_parallel_schedule: parsim has no schedule"):
            _titan(tmp_path, _job(schedule=raw), gpus=8)


@pytest.mark.parametrize("schedule, pp, per_stage", [
    # 32 layers + 2 slots = 34 over 4 stages: 9, 9, 8, 8, less the embedding on the first and the output on the last
    ("1F1B", 4, [8, 9, 8, 7]),
    ("Interleaved1F1B", 2, [8, 9, 8, 7]),  # 2 stages per rank by default: the same 4 stages
    ("ZBVZeroBubble", 2, [8, 9, 8, 7]),
])
def test_torchtitan_layer_split_hand_computed(tmp_path, schedule, pp, per_stage):
    sc = check(_titan(tmp_path, _job(pp=pp, schedule=schedule), gpus=pp * 2))
    assert list(sc.layers_per_stage) == per_stage


def test_torchtitan_70b_interleaved_split(tmp_path):
    # 80 + 2 = 82 slots over 16 stages: 6, 6, then 5s; stage 0 and 15 give one slot each to embedding / output
    sc = check(_titan(tmp_path, _job(pp=8, schedule="Interleaved1F1B", flavor="70B"), gpus=8))
    assert list(sc.layers_per_stage) == [5, 6] + [5] * 13 + [4]


def test_torchtitan_batch_and_gradient_accumulation(tmp_path):
    text = _job(pp=2, extra_par="pipeline_parallel_microbatch_size = 2\n") + ""
    text = text.replace("local_batch_size = 8\n", "local_batch_size = 8\nglobal_batch_size = 256\n")
    imp = _titan(tmp_path, text, gpus=16)  # dp = 16 / 2 = 8; 256 / (8 * 8) = 4 schedule runs of 8 / 2 = 4
    assert (imp.doc["training"]["global_batch"], imp.doc["training"]["microbatch_size"]) == (256, 2)
    assert check(imp).n_microbatches == 16
    assert any("runs the pipeline schedule 4 times" in n for n in imp.notes)


def test_torchtitan_hsdp_and_degrees(tmp_path):
    par = "data_parallel_replicate_degree = 2\ntensor_parallel_degree = 2\n"
    imp = _titan(tmp_path, _job(pp=1, extra_par=par).replace("data_parallel_shard_degree = -1",
                                                             "data_parallel_shard_degree = 4"), gpus=16)
    assert imp.doc["parallel"]["dp"] == 8 and imp.doc["parallel"]["zero"] == 3
    assert imp.doc["parallel"]["sequence_parallel"] is True
    stated = "dp_shard" in imp.doc["parallel"] or any("dp_shard = 4" in n for n in imp.notes)
    assert stated
    with pytest.raises(ConfigError, match="multiply to replicate\\*shard\\*cp\\*tp\\*pp = 16 GPUs, but --gpus 32"):
        _titan(tmp_path, _job(pp=1, extra_par=par).replace("= -1", "= 4"), gpus=32)
    with pytest.raises(ConfigError, match="data_parallel_shard_degree: -1 takes the GPUs left over: give --gpus"):
        _titan(tmp_path, _job(pp=1))


def test_torchtitan_recompute_precision_and_async_tp(tmp_path):
    extra = ('[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "2"\n'
             '[compile]\nenable = true\n[float8]\nenable_float8_linear = true\n')
    imp = _titan(tmp_path, _job(pp=1, extra_par="tensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n",
                                extra=extra), gpus=8)
    assert (imp.doc["training"]["recompute"], imp.doc["training"]["precision"]) == ("full", "fp8")
    assert imp.doc["overlap"]["tp_comm"] is True
    assert any("recomputes one block in 2" in n for n in imp.notes)


@pytest.mark.parametrize("extra, recipe", [
    ('[float8]\nenable_float8_linear = true\n', "current"),  # torchao's tensorwise dynamic scaling
    ('[float8]\nenable_float8_linear = true\nrecipe_name = "rowwise"\n', "rowwise"),
    ('[model]\nconverters = ["mx"]\n', "mxfp8"),
    ('[model]\nconverters = ["nvfp4"]\n', "nvfp4"),  # torchao's NVFP4 training prototype
])
def test_torchtitan_low_precision_recipes(tmp_path, extra, recipe):
    if extra.startswith("[model]"):  # one [model] table: the converter line joins it
        text = _job(pp=1).replace('name = "llama3"', 'name = "llama3"\n' + extra.split("\n", 1)[1].rstrip(), 1)
    else:
        text = _job(pp=1, extra=extra)
    p = tmp_path / "job.toml"
    p.write_text(text)
    t = import_torchtitan(p, "dgx-b200", 8).doc["training"]
    assert (t["precision"], t["fp8_recipe"]) == ("fp8", recipe)


@pytest.mark.parametrize("text, line", [
    ('[model]\nname = "llama3"\nflavor = "debugmodel"\n', "model.flavor: llama3 debugmodel has no parsim preset"),
    ("[model\n", "neither TOML nor JSON"),
    (_job(schedule="Bogus"), "pipeline_parallel_schedule: 'Bogus' is not a torch.distributed.pipelining schedule"),
    (_job(pp=1, extra='[activation_checkpoint]\nmode = "sometimes"\n'), "activation_checkpoint.mode: 'sometimes'"),
])
def test_torchtitan_bad_input_is_one_line(tmp_path, text, line):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    r = run("import", "torchtitan", p, "--gpus", "8")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and line in r.stderr, r.stderr


def test_torchtitan_missing_file():
    r = run("import", "torchtitan", "no/such/job.toml")
    assert r.returncode == 2 and r.stderr.strip() == "parsim: error: no/such/job.toml: no such file"


def test_printed_scenario_is_valid_toml_with_comments_first():
    r = run("import", "torchtitan", TITAN_TOML, "--gpus", "64")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    first_key = next(i for i, ln in enumerate(lines) if not ln.startswith("#"))
    assert any("dgx-h100 (no --hardware given)" in ln for ln in lines[:first_key])
    assert tomllib.loads(r.stdout)["model"] == {"preset": "llama3-8b"}


def test_megatron_overlap_p2p_communication_makes_sends_asynchronous():
    base = ["--num-layers", "8", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
            "--micro-batch-size", "1", "--global-batch-size", "64", "--pipeline-model-parallel-size", "4",
            "--num-layers-per-virtual-pipeline-stage", "1", "--vocab-size", "32000"]
    assert import_megatron(base, "dgx-h100", 32).doc["overlap"]["p2p"] is False
    assert import_megatron([*base, "--overlap-p2p-communication"], "dgx-h100", 32).doc["overlap"]["p2p"] is True


def test_megatron_ep_overlap_without_virtual_pipeline_names_the_flag():
    r = run("import", "megatron", "--gpus", "16", "--", *SMALL, "--num-experts", "8", "--expert-model-parallel-size",
            "4", "--pipeline-model-parallel-size", "2", "--overlap-moe-expert-parallel-comm", "--bf16")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--overlap-moe-expert-parallel-comm: Megatron-Core's EP overlap needs a virtual pipeline" in r.stderr


DSV3 = ["--num-layers", "61", "--hidden-size", "7168", "--ffn-hidden-size", "18432", "--num-attention-heads", "128",
        "--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512", "--qk-head-dim", "128",
        "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128", "--num-experts", "256", "--moe-router-topk", "8",
        "--moe-ffn-hidden-size", "2048", "--moe-shared-expert-intermediate-size", "2048",
        "--moe-layer-freq", "[0]*3+[1]*58", "--moe-router-num-groups", "8", "--moe-router-group-topk", "4",
        "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        "--position-embedding-type", "rope", "--vocab-size", "129280", "--seq-length", "4096",
        "--max-position-embeddings", "163840", "--bf16"]
"""DeepSeek-V3's shapes (its config.json, the deepseek-v3 preset) as Megatron-LM's flags spell them."""


def test_megatron_multi_latent_attention_is_deepseek_v3():
    from parsim.model import get_preset
    from parsim.model.shapes import active_params, total_params
    sc = check(import_megatron(DSV3, gpus=1))
    ref = get_preset("deepseek-v3")
    m = sc.model
    for key in ("n_layers", "d_model", "n_heads", "n_kv_heads", "vocab_size", "q_lora_rank", "kv_lora_rank",
                "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_experts", "top_k", "first_dense_layers",
                "expert_groups", "expert_groups_per_token"):
        assert getattr(m, key) == getattr(ref, key), key
    assert total_params(m) == total_params(ref) and active_params(m) == active_params(ref)


def test_megatron_mla_defaults_qk_layernorm_and_squared_relu():
    doc = import_megatron(SMALL + ["--multi-latent-attention"]).doc["model"]
    # Megatron's MLA defaults: no query down-projection, kv rank 32, 128 + 64 query/key dims, 128 value dims
    assert (doc["q_lora_rank"], doc["kv_lora_rank"], doc["qk_nope_head_dim"], doc["qk_rope_head_dim"],
            doc["v_head_dim"], doc["n_kv_heads"]) == (0, 32, 128, 64, 128, 16)
    assert import_megatron(SMALL + ["--qk-layernorm"]).doc["model"]["qk_norm"] is True
    assert import_megatron(SMALL + ["--squared-relu"]).doc["model"]["ffn"] == "gelu"  # up, down: two matrices
    imp = import_megatron(SMALL + ["--kv-lora-rank", "512"])
    assert "kv_lora_rank" not in imp.doc["model"] and any("without --multi-latent-attention" in n for n in imp.notes)
    with pytest.raises(ConfigError) as e:
        import_megatron(SMALL + ["--squared-relu", "--swiglu"])
    assert e.value.key == "--squared-relu"


def test_megatron_window_attention_layers():
    # GPT-OSS as Megatron-Bridge runs it: window (128, 0) on every layer but each 2nd (1-based)
    doc = import_megatron(SMALL + ["--window-size", "128,0", "--window-attn-skip-freq", "2"]).doc["model"]
    assert doc["sliding_window"] == 129 and doc["layer_types"][:4] == ["sliding", "full", "sliding", "full"]
    assert len(doc["layer_types"]) == 24
    every = import_megatron(SMALL + ["--window-size", "(4096,0)"]).doc["model"]
    assert set(every["layer_types"]) == {"sliding"} and every["sliding_window"] == 4097
    listed = import_megatron(SMALL + ["--window-size", "512,0", "--window-attn-skip-freq", "[1,1,1,0]*6"]).doc["model"]
    assert listed["layer_types"][:4] == ["sliding", "sliding", "sliding", "full"]
    check(import_megatron(SMALL + ["--window-size", "128,0", "--window-attn-skip-freq", "2"]))  # it simulates
    for bad, key in ((["--window-size", "128,4"], "--window-size"), (["--window-size", "x"], "--window-size"),
                     (["--window-size", "128,0", "--window-attn-skip-freq", "[1,0]*3"], "--window-attn-skip-freq")):
        with pytest.raises(ConfigError) as e:
            import_megatron(SMALL + bad)
        assert e.value.key == key
