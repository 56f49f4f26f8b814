"""torchtitan job configuration -> a parsim scenario.

Three spellings of the same settings are read (facts from torchtitan's
``torchtitan/config/job_config.py`` and ``config/configs.py``):

* TOML of the releases up to v0.2.2 (Feb 2026): ``[model] name/flavor``, ``[training]
  local_batch_size global_batch_size seq_len`` (``batch_size`` before mid-2025), ``[parallelism]``
  degrees (``[training]``/``[experimental]`` in 2024 files), ``[activation_checkpoint]``,
  ``[compile]`` (``training.compile`` before), float8 via ``model.converters`` or ``[float8]``;
* the dataclass fields of later releases as ``--debug.save_config_file`` dumps them (JSON):
  ``model_spec.name/flavor``, ``training.num_tokens_per_microbatch_per_dp_rank``,
  ``num_tokens_per_train_step``, ``max_context_length``, ``parallelism.num_pp_microbatches``,
  ``enable_sequence_parallel``, ``compile.enable_async_tensor_parallel``, and the
  activation-checkpointing policy told by its fields.

torchtitan's rules the importer follows: data_parallel_shard_degree = -1 takes the GPUs
left over; shard > 1 is FSDP (parsim zero = 3), with replicate > 1 too HSDP; a pipeline
runs local_batch / microbatch_size microbatches per gradient-accumulation step; looped
schedules default to 2 stages per rank, or ceil((layers + 2 slots) / layers_per_stage) stages;
layers split as ``generate_llm_fqn_per_model_part`` does, the embedding and the output
counting first/last_stage_less_layers (default 1) layer slots.
"""
from __future__ import annotations

import itertools
import json
import math
import tomllib
from pathlib import Path

from parsim.errors import ConfigError
from parsim.files import read_input_text
from parsim.frameworks.emit import Imported, has_parallel_key, schedule_name, stage_layout
from parsim.model import PRESETS

FLAVORS = {
    ("llama3", "8b"): "llama3-8b", ("llama3", "8b_flex"): "llama3-8b", ("llama3", "8b_varlen"): "llama3-8b",
    ("llama3", "70b"): "llama3-70b", ("llama3", "405b"): "llama3-405b",
    ("llama2", "7b"): "llama2-7b", ("llama2", "70b"): "llama2-70b",
    ("deepseek_v3", "671b"): "deepseek-v3",
    ("qwen3", "30b-a3b"): "qwen3-30b-a3b", ("qwen3", "235b-a22b"): "qwen3-235b-a22b",
    ("gpt_oss", "20b"): "gpt-oss-20b", ("gpt_oss", "120b"): "gpt-oss-120b",
}
"""torchtitan (model name, flavor, lower case) -> parsim preset."""

TORCH_SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved1f1b": "Interleaved1F1B",
                   "loopedbfs": "LoopedBFS", "interleavedzerobubble": "InterleavedZeroBubble",
                   "zbvzerobubble": "ZBV", "dualpipev": "DualPipeV"}
"""torch.distributed.pipelining schedule names (as torchtitan's get_schedule_class reads
them, case-insensitive) -> parsim's."""
SINGLE_STAGE = ("1F1B", "GPipe")
V_SHAPED = ("ZBV", "DualPipeV")

DEGREES = {"replicate": "data_parallel_replicate_degree", "shard": "data_parallel_shard_degree",
           "tp": "tensor_parallel_degree", "pp": "pipeline_parallel_degree", "cp": "context_parallel_degree",
           "ep": "expert_parallel_degree", "etp": "expert_tensor_parallel_degree"}


class _Config:
    """The file's keys, flattened to dotted names, remembering which ones were read."""

    def __init__(self, doc: dict, file: str):
        self.file = file
        self.flat: dict[str, object] = {}
        self._flatten(doc, "")
        self.used: set[str] = set()

    def _flatten(self, d: dict, prefix: str) -> None:
        for k, v in d.items():
            key = prefix + k
            if key == "model_spec.model":  # the model's own fields: the preset stands for them
                self.flat[key] = "(the model's fields)"
            elif isinstance(v, dict) and v:
                self._flatten(v, key + ".")
            else:
                self.flat[key] = v

    def get(self, *keys: str, default=None):
        """(value, key it was found under) of the first of ``keys`` present."""
        for k in keys:
            if k in self.flat:
                self.used.add(k)
                return self.flat[k], k
        return default, keys[0]

    def int(self, *keys: str, default: int, low: int = 1) -> tuple[int, str]:
        v, k = self.get(*keys, default=default)
        if isinstance(v, bool) or not isinstance(v, int) or (v < low and v != default):
            raise ConfigError(self.file, k, f"expected an integer >= {low}, got {v!r}")
        return v, k

    def unread(self) -> tuple[str, ...]:
        return tuple(f"{k} = {json.dumps(v)}" for k, v in self.flat.items() if k not in self.used
                     and k != "model_spec.model") + (("model_spec.model (the model's fields; parsim uses the preset)",)
                                                      if "model_spec.model" in self.flat else ())


def read_config(path: str | Path) -> dict:
    """A torchtitan TOML file, or a JSON dump of its dataclass config."""
    path = Path(path)
    try:
        text = read_input_text(path)
    except FileNotFoundError:
        raise ConfigError(str(path), None, "no such file") from None
    except OSError as e:
        raise ConfigError(str(path), None, f"cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(str(path), None, f"not UTF-8 text (byte {e.start})") from None
    try:
        if path.suffix == ".json" or text.lstrip().startswith("{"):
            doc = json.loads(text)
        else:
            doc = tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise ConfigError(str(path), None, f"neither TOML nor JSON torchtitan config: {' '.join(str(e).split())}") from None
    if not isinstance(doc, dict):
        raise ConfigError(str(path), None, "expected a table of torchtitan config sections")
    return doc


def import_torchtitan(path: str | Path, hardware: str | None = None, gpus: int | None = None) -> Imported:
    """The scenario torchtitan would run with this job config."""
    c = _Config(read_config(path), str(path))
    notes: list[str] = []
    if hardware is None:
        hardware = "dgx-h100"
        notes.append("hardware dgx-h100 (no --hardware given)")
    preset = _preset(c)
    n_layers = PRESETS[preset].n_layers
    deg, keys = _degrees(c, gpus, notes)
    seq, mbs, m_per_run, global_batch, bkeys = _batch(c, deg, notes)
    keys.update(bkeys)
    name, vpp, skey = _schedule(c, deg["pp"], n_layers)
    keys["schedule.name"] = skey
    parallel = {"dp": deg["dp"], "tp": deg["tp"], "pp": deg["pp"]} | {
        k: x for k, x in (("cp", deg["cp"]), ("ep", deg["ep"]), ("vpp", vpp)) if x > 1}
    parallel["zero"] = 3 if deg["shard"] > 1 else 0  # FSDP2 shards parameters, gradients and optimizer state
    sp, _ = c.get("parallelism.enable_sequence_parallel", default=True)  # torchtitan's TP plan shards norms
    parallel["sequence_parallel"] = bool(sp) and deg["tp"] > 1
    if deg["replicate"] > 1 and deg["shard"] > 1:
        if has_parallel_key("dp_shard"):
            parallel["dp_shard"] = deg["shard"]
        else:
            notes.append(f"HSDP: torchtitan shards over dp_shard = {deg['shard']} ranks and replicates "
                         f"{deg['replicate']} times; parsim shards over all dp = {deg['dp']} (no parallel.dp_shard yet)")
    reduce, rkey = c.get("training.mixed_precision_reduce", default="float32")
    if parallel["zero"] == 3:
        # FSDP2's memory layout (fp32 sharded parameters and gradients); its reduce-scatter in
        # mixed_precision_reduce, float32 by default (parsim's "fsdp" default), else stated
        parallel["framework"] = "fsdp"
        if reduce == "bfloat16":
            parallel["grad_reduce_dtype"] = "bf16"
            keys["parallel.grad_reduce_dtype"] = rkey
    if deg["shard"] == 1 and deg["cp"] > 1:
        notes.append("torchtitan shards parameters over the cp ranks (FSDP on dp_shard*cp); parsim shards over dp only")
    schedule = {"name": name}
    if deg["pp"] > 1:
        per_stage, lkey = _stage_layers(c, n_layers, deg["pp"] * vpp)
        # torchtitan's default weights (one slot each for the embedding and the output) are parsim's account_for_*
        layout = stage_layout(n_layers, per_stage, vpp, name, {"account_for_embedding": True, "account_for_loss": True})
        schedule.update(layout)
        keys.update({f"schedule.{k}": lkey for k in layout})
        runs = global_batch // (deg["dp"] * mbs * m_per_run)
        if runs > 1:
            notes.append(f"gradient accumulation: torchtitan runs the pipeline schedule {runs} times per step "
                         f"({m_per_run} microbatches each); parsim runs one schedule of {runs * m_per_run}, "
                         "paying fill and drain once")
    tp_comm = _async_tp(c)
    compiled, ckey = _compiled(c)
    if ckey in c.flat:
        keys["training.fused_kernels"] = ckey
    recipe = _fp8_recipe(c)
    training = {"global_batch": global_batch, "microbatch_size": mbs, "seq_len": seq,
                "precision": "fp8" if recipe else _precision(c, notes), **({"fp8_recipe": recipe} if recipe else {}),
                "optimizer": _optimizer(c, notes),
                "recompute": _recompute(c, notes),
                # eager autograd adds each further microbatch's weight gradient in a separate kernel
                "grad_accumulation_fusion": global_batch == deg["dp"] * mbs,
                # torch.compile fuses the norms, rotary and SwiGLU; eager runs them op by op
                "fused_kernels": compiled}
    doc = {"name": f"torchtitan-{preset}", "hardware": hardware, "gpus": deg["gpus"], "model": {"preset": preset},
           "training": training, "parallel": parallel, "schedule": schedule,
           "overlap": {"grad_reduce": True, "tp_comm": tp_comm}}
    return Imported(c.file, doc, c.unread(), tuple(notes), keys)


def _preset(c: _Config) -> str:
    name, _ = c.get("model.name", "model_spec.name", default="llama3")
    flavor, fkey = c.get("model.flavor", "model_spec.flavor", default="debugmodel")
    preset = FLAVORS.get((str(name).lower(), str(flavor).lower()))
    if preset is None or preset not in PRESETS:
        known = ", ".join(f"{n} {f}" for (n, f), p in FLAVORS.items() if p in PRESETS)
        raise ConfigError(c.file, fkey, f"{name} {flavor!s} has no parsim preset (known: {known})")
    return preset


def _degrees(c: _Config, gpus: int | None, notes: list[str]) -> tuple[dict, dict]:
    deg, keys = {}, {}
    for short, field in DEGREES.items():
        deg[short], keys[short] = c.int(f"parallelism.{field}", f"training.{field}", f"experimental.{field}",
                                        *(("training.data_parallel_degree",) if short == "shard" else ()),
                                        default=-1 if short == "shard" else 1)
    others = deg["replicate"] * deg["cp"] * deg["tp"] * deg["pp"]
    if deg["shard"] == -1:
        if gpus is None:
            raise ConfigError(c.file, keys["shard"], "-1 takes the GPUs left over: give --gpus")
        if gpus % others:
            raise ConfigError(c.file, keys["shard"], f"-1 takes the GPUs left over, but --gpus {gpus} is not a "
                                                     f"multiple of replicate*cp*tp*pp = {others}")
        deg["shard"] = gpus // others
    total = deg["shard"] * others
    if gpus is not None and gpus != total:
        raise ConfigError(c.file, keys["shard"], f"the degrees multiply to replicate*shard*cp*tp*pp = {total} "
                                                 f"GPUs, but --gpus {gpus}")
    deg["gpus"], deg["dp"] = total, deg["replicate"] * deg["shard"]
    if deg["etp"] not in (1, deg["tp"]):
        notes.append(f"expert_tensor_parallel_degree {deg['etp']}: parsim's experts use the dense tp")
    m = {"gpus": keys["shard"], "parallel.dp": keys["shard"], "parallel.tp": keys["tp"], "parallel.pp": keys["pp"],
         "parallel.cp": keys["cp"], "parallel.ep": keys["ep"], "parallel.sequence_parallel": keys["tp"]}
    return deg, m


def _batch(c: _Config, deg: dict, notes: list[str]) -> tuple[int, int, int, int, dict]:
    """(seq_len, sequences per microbatch, microbatches per schedule run, global batch, key map)."""
    seq, skey = c.int("training.seq_len", "training.max_context_length", default=2048)
    pp = deg["pp"]
    tokens, tkey = c.get("training.num_tokens_per_microbatch_per_dp_rank")
    if tokens is not None:  # later releases count tokens; one microbatch is one forward
        if not isinstance(tokens, int) or tokens < seq or tokens % seq:
            raise ConfigError(c.file, tkey, f"{tokens!r} is not a whole number of {seq}-token sequences")
        mbs = tokens // seq
        m_run, mkey = c.int("parallelism.num_pp_microbatches", default=1)
        m_run = m_run if pp > 1 else 1
        step, gkey = c.get("training.num_tokens_per_train_step", default=-1)
        per = deg["dp"] * mbs * m_run * seq
        if step in (-1, None):
            step = per
        if not isinstance(step, int) or step < per or step % per:
            raise ConfigError(c.file, gkey, f"{step!r} is not a whole number of steps of dp*microbatch*microbatches "
                                            f"= {per} tokens")
        return seq, mbs, m_run, step // seq, {"training.global_batch": gkey, "training.seq_len": skey,
                                              "schedule.n_microbatches": mkey}
    local, lkey = c.int("training.local_batch_size", "training.batch_size", default=8)
    glob, gkey = c.int("training.global_batch_size", default=-1)
    if glob == -1:
        glob = local * deg["dp"]
    if glob % (local * deg["dp"]):
        raise ConfigError(c.file, gkey, f"{glob} is not a multiple of local_batch_size*dp = {local}*{deg['dp']}")
    if pp == 1:
        return seq, local, 1, glob, {"training.global_batch": gkey, "training.seq_len": skey}
    legacy = "experimental.pipeline_parallel_degree" in c.flat  # 2024 files: a count of microbatches, default pp
    n_mb, nkey = c.get("experimental.pipeline_parallel_microbatches")
    if n_mb is not None or legacy:
        n_mb = pp if n_mb is None else n_mb
        if not isinstance(n_mb, int) or n_mb < 1 or local % n_mb:
            raise ConfigError(c.file, nkey, f"{local} sequences per rank do not split into {n_mb!r} microbatches")
        return seq, local // n_mb, n_mb, glob, {"training.global_batch": gkey, "schedule.n_microbatches": nkey}
    mbs, mkey = c.int("parallelism.pipeline_parallel_microbatch_size", default=1)
    if local % mbs:
        raise ConfigError(c.file, mkey, f"local_batch_size {local} is not divisible by it ({mbs})")
    return seq, mbs, local // mbs, glob, {"training.global_batch": gkey, "training.seq_len": skey,
                                          "schedule.n_microbatches": lkey}


def _schedule(c: _Config, pp: int, n_layers: int) -> tuple[str, int, str]:
    raw, key = c.get("parallelism.pipeline_parallel_schedule", "experimental.pipeline_parallel_schedule",
                     default="1F1B")
    csv, _ = c.get("parallelism.pipeline_parallel_schedule_csv", "experimental.pipeline_parallel_schedule_csv")
    if csv:
        raise ConfigError(c.file, "parallelism.pipeline_parallel_schedule_csv",
                          "a CSV schedule: load it with parsim's schedule_from_csv and a [costs] scenario")
    torch_name = TORCH_SCHEDULES.get(str(raw).lower().removeprefix("schedule"))
    if torch_name is None:
        raise ConfigError(c.file, key, f"{raw!r} is not a torch.distributed.pipelining schedule torchtitan runs "
                                       f"(known: 1F1B, GPipe, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, "
                                       f"ZBVZeroBubble, DualPipeV)")
    if pp == 1:
        return "1F1B", 1, key  # no pipeline: the schedule is never built
    name = schedule_name(torch_name, c.file, key)
    lps, lkey = c.get("parallelism.pipeline_parallel_layers_per_stage")
    if lps is None:
        return name, 1 if torch_name in SINGLE_STAGE else 2, key
    first, _ = c.get("parallelism.pipeline_parallel_first_stage_less_layers", default=1)
    last, _ = c.get("parallelism.pipeline_parallel_last_stage_less_layers", default=1)
    if not isinstance(lps, int) or isinstance(lps, bool) or lps < 1:
        raise ConfigError(c.file, lkey, f"expected a positive integer, got {lps!r}")
    stages = math.ceil((n_layers + first + last) / lps)
    per_rank, rem = divmod(stages, pp)
    if rem or (torch_name in SINGLE_STAGE) != (per_rank == 1) or (torch_name in V_SHAPED and per_rank != 2):
        raise ConfigError(c.file, lkey, f"{lps} layers per stage make {stages} stages, {stages / pp:g} per rank; "
                                        f"{torch_name} needs {'1' if torch_name in SINGLE_STAGE else '2' if torch_name in V_SHAPED else 'a whole number >= 2'}")
    return name, per_rank, key


def _stage_layers(c: _Config, n_layers: int, n_stages: int) -> tuple[list[int], str]:
    """Transformer blocks per stage in model order, as torchtitan splits the model."""
    parts, pkey = c.get("parallelism.module_fqns_per_model_part")
    if parts is not None:
        counts = [sum(1 for m in part if str(m).startswith("layers.")) for part in parts]
        if len(counts) != n_stages or sum(counts) != n_layers:
            raise ConfigError(c.file, pkey, f"{len(counts)} parts holding {sum(counts)} layers; expected "
                                            f"{n_stages} stages holding {n_layers}")
        return counts, pkey
    points, skey = c.get("parallelism.pipeline_parallel_split_points", "experimental.pipeline_parallel_split_points")
    if points:
        try:
            cuts = [int(str(p).split(".")[1]) for p in points]
        except (IndexError, ValueError):
            raise ConfigError(c.file, skey, f"expected names like \"layers.8\", got {points!r}") from None
        edges = [0] + cuts + [n_layers]
        counts = [b - a for a, b in itertools.pairwise(edges)]
        if len(counts) != n_stages or min(counts) < 1:
            raise ConfigError(c.file, skey, f"{points!r} does not cut {n_layers} layers into {n_stages} stages")
        return counts, skey
    inw, ikey = c.int("parallelism.pipeline_parallel_first_stage_less_layers", default=1, low=0)
    outw, _ = c.int("parallelism.pipeline_parallel_last_stage_less_layers", default=1, low=0)
    return titan_stage_layers(n_layers, n_stages, inw, outw, c.file, ikey), ikey


def titan_stage_layers(n_layers: int, n_stages: int, input_weight: int, output_weight: int,
                       file: str, key: str) -> list[int]:
    """Blocks per stage as torchtitan's ``generate_llm_fqn_per_model_part`` assigns them:
    the embedding and the output count as layer slots; earlier stages take the extra."""
    eff = n_layers + input_weight + output_weight
    base, extra = divmod(eff, n_stages)
    if n_stages > eff or base == 0 or input_weight > base or output_weight > base:
        raise ConfigError(file, key, f"{n_stages} stages over {n_layers} layers + {input_weight} + {output_weight} "
                                     "slots: torchtitan refuses this split")
    counts, placed = [], 0
    for s in range(n_stages):
        k = base + (s < extra) - (input_weight if s == 0 else output_weight if s == n_stages - 1 else 0)
        k = max(0, min(k, n_layers - placed))
        counts.append(k)
        placed += k
    if placed != n_layers:
        raise ConfigError(file, key, f"torchtitan's split would leave {n_layers - placed} layers unplaced")
    return counts


def _compiled(c: _Config) -> tuple[bool, str]:
    """(torch.compile on, the key it was read from): ``[compile] enable``, ``training.compile`` before."""
    on, key = c.get("compile.enable", "training.compile", default=False)
    return bool(on), key


def _async_tp(c: _Config) -> bool:
    on, _ = c.get("compile.enable_async_tensor_parallel", "parallelism.enable_async_tensor_parallel",
                  "experimental.enable_async_tensor_parallel", default=False)
    compiled, _ = _compiled(c)
    return bool(on) and bool(compiled)  # torchtitan's async TP needs torch.compile


def _converters(c: _Config) -> list[str]:
    conv, _ = c.get("model.converters", default=[])
    return [str(x) for x in (conv if isinstance(conv, list) else [conv])]


def _fp8_recipe(c: _Config) -> str | None:
    """The low-precision recipe of the Linear converters: torchao's NVFP4 training prototype
    (an ``nvfp4`` converter) -> ``nvfp4``; MX (``mx``) -> ``mxfp8``; float8 with
    ``recipe_name = "rowwise"`` (or ``rowwise_with_gw_hp``) -> ``rowwise``, else its default
    tensorwise dynamic scaling -> ``current`` (per-tensor, on any GPU); None without one."""
    conv = _converters(c)
    if any("nvfp4" in x for x in conv):
        return "nvfp4"
    if any("mx" in x for x in conv):
        return "mxfp8"
    f8, _ = c.get("float8.enable_float8_linear", default=False)
    if f8 or any("float8" in x for x in conv):
        name, _ = c.get("float8.recipe_name", "quantize.linear.float8.recipe_name", default=None)
        return "rowwise" if name and str(name).startswith("rowwise") else "current"
    return None


def _precision(c: _Config, notes: list[str]) -> str:
    """The 16- or 32-bit training precision (a Linear converter's recipe makes it fp8: :func:`_fp8_recipe`)."""
    dtype, _ = c.get("training.dtype", default="float32")
    param, _ = c.get("training.mixed_precision_param", default="bfloat16")
    if dtype == "bfloat16":
        notes.append("training.dtype bfloat16: torchtitan keeps no fp32 master weights; parsim counts them")
        return "bf16"
    return "fp32" if param == "float32" else "bf16"


def _optimizer(c: _Config, notes: list[str]) -> str:
    name, _ = c.get("optimizer.name", default=None)
    groups, _ = c.get("optimizer.param_groups", default=[])  # later releases: one optimizer per param group
    if name is None and isinstance(groups, list):
        names = {g.get("optimizer_name") for g in groups if isinstance(g, dict)}
        name = names.pop() if len(names) == 1 else None
    name = "AdamW" if name is None else name
    opt = str(name).lower()
    if opt in ("adam", "adamw", "sgd"):
        return opt
    notes.append(f"optimizer {name}: parsim counts AdamW's state")
    return "adamw"


def _recompute(c: _Config, notes: list[str]) -> str:
    mode, mkey = c.get("activation_checkpoint.mode")
    option, _ = c.get("activation_checkpoint.selective_ac_option", default="2")
    if mode is None:
        mode, option = _policy(c) or ("selective", option)
    if mode in ("none", "full"):
        return mode
    if mode == "memory_budget":
        notes.append("activation_checkpoint memory_budget: the compiler picks what to recompute; parsim "
                     "recomputes selectively")
        return "selective"
    if mode != "selective":
        raise ConfigError(c.file, mkey, f"{mode!r} is not one of none, selective, full, memory_budget")
    if str(option) == "op":
        return "op"  # matmul/SDPA outputs saved, every second matmul and the rest rerun
    if not str(option).isdigit() or int(option) < 1:
        raise ConfigError(c.file, "activation_checkpoint.selective_ac_option", f"expected 'op' or a positive "
                                                                                f"integer, got {option!r}")
    if int(option) > 1:
        notes.append(f"selective_ac_option {option}: torchtitan recomputes one block in {option}; parsim "
                     "recomputes every block (\"full\")")
    return "full"


def _policy(c: _Config) -> tuple[str, str] | None:
    """Later releases name no mode: the checkpointing policy shows in the fields its config
    dumps (None when the file has no such table: torchtitan's default then applies)."""
    if "activation_checkpoint" in c.flat:  # null: checkpointing off
        c.used.add("activation_checkpoint")
        return ("none", "op") if c.flat["activation_checkpoint"] in (None, {}) else None
    ac = [k.removeprefix("activation_checkpoint.") for k in c.flat if k.startswith("activation_checkpoint.")]
    if not ac:
        return None
    c.used.update(f"activation_checkpoint.{k}" for k in ac)
    if "memory_budget" in ac:
        return "memory_budget", "op"
    if "force_recompute_mm_shapes_by_fqns" in ac:  # SelectiveAC.Config: op-level policy
        return "selective", "op"
    return "full", "op"  # FullAC.Config holds only the base fields
