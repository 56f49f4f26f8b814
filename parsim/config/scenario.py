"""The Scenario and its tables, typed only: what the loader (parsim.scenario) builds and the cost model reads."""
from __future__ import annotations

from dataclasses import dataclass, field

from parsim.cluster.attention_kernels import KERNELS, resolve
from parsim.cluster.hardware import HardwareProfile
from parsim.cluster.precision import TRAINING_PRECISIONS
from parsim.config.faults import FaultsConfig
from parsim.config.moe import MoEConfig
from parsim.config.offload import OffloadConfig
from parsim.config.parallel import ParallelConfig
from parsim.config.sharding import ShardingConfig
from parsim.config.stragglers import StragglerConfig
from parsim.errors import ConfigError
from parsim.model import ModelSpec

PRECISIONS = TRAINING_PRECISIONS


OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "muon", "adafactor")


RECOMPUTE = ("none", "selective", "op", "full")


RECOMPUTE_METHODS = ("uniform", "block")
"""Megatron's ``--recompute-method`` under full recomputation."""


RECOMPUTE_MODULES = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "mla_up_proj", "shared_experts")
"""Megatron-Core's ``--recompute-modules`` (``TransformerConfig.recompute_modules`` under
``--recompute-granularity selective``) that parsim models. Normal checkpointing keeps a module's
input and reruns it in the backward: ``core_attn`` (the attention core), ``mlp`` (a dense
block's MLP, its fused pre-MLP norm included), ``moe`` (the whole MoE layer: router, dispatch,
experts, combine), ``shared_experts``. Output-discarding checkpointing frees one output after
its consumers have saved it and rebuilds it before their backward: ``moe_act`` (the grouped
experts' activation output, FC2's input), ``layernorm`` (the output of a norm that runs as its
own module: MLA's input norm and an MoE block's pre-MLP norm; Transformer Engine fuses the others
into the next linear, where Megatron has nothing to recompute), ``mla_up_proj`` (MLA's Q and KV
up-projections and rotary: the attention core's Q, K and V)."""


DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
"""What selective recomputation reruns when no modules are named: Megatron-Core's default
(``--recompute-activations`` / ``--recompute-granularity selective``), the attention core."""


def split_recompute(mode: str) -> tuple[str, tuple[str, ...] | None]:
    """A recompute mode as planners write it -> (``training.recompute``, ``recompute_modules``):
    ``"selective:mla_up_proj+moe_act"`` is selective recomputation of those Megatron modules;
    any other mode is itself, with Megatron's default modules."""
    if mode.startswith("selective:"):
        return "selective", tuple(x for x in mode.split(":", 1)[1].split("+") if x)
    return mode, None


@dataclass(frozen=True)
class TrainingConfig:
    """What one optimizer step processes, and how."""

    global_batch: int
    """Sequences per optimizer step, over all data-parallel replicas."""
    seq_len: int
    """Tokens per sequence."""
    microbatch_size: int = 1
    """Sequences per microbatch."""
    precision: str = "bf16"
    """Compute precision: bf16 | fp16 | fp32 | fp8 (mixed precision keeps fp32 master weights)."""
    optimizer: str = "adam"
    """sgd | momentum | adam | adamw | muon | adafactor."""
    recompute: str = "none"
    """Activation recomputation: none | selective (Megatron: the attention core) | op (torchtitan's
    op-level selective checkpointing: matmul and attention outputs kept, every second matmul and
    all other ops rerun) | full (only each block's input kept)."""
    flash_attention: bool = True
    """FlashAttention-style attention: scores never stored; causal blocks skipped."""
    dropout: bool | None = None
    """Dropout masks stored; default: on for GeLU (GPT-style) models, off for SwiGLU (Llama-style)."""
    grad_accumulation_fusion: bool = True
    """Weight gradients accumulate inside the dW GEMM (Megatron's --gradient-accumulation-fusion);
    false: a separate memory-bound add into the gradient buffer per microbatch (plain PyTorch autograd)."""
    fused_kernels: bool = True
    """Memory-bound work runs as the fused kernels of Megatron-Core / Transformer Engine (norm, rotary,
    bias-activation, bias-dropout-add each one kernel); false: eager PyTorch op by op (Hugging Face
    modules: more kernels and more HBM passes; ``parsim.costs.memory_ops``), keeping what those ops
    save for the backward (RMSNorm's fp32 upcast, SwiGLU's SiLU output:
    ``parsim.costs.memory.ActivationOptions.eager_modules``)."""
    fp8_recipe: str | None = None
    """Low-precision recipe (``precision = "fp8"``): delayed | current | mxfp8 | blockwise | rowwise
    (torchao.float8's per-row scales: every tensor cast once per scaling axis) | nvfp4 (Blackwell's
    4-bit E2M1 with E4M3 scales per 16: Transformer Engine's NVFP4BlockScaling, Megatron's
    ``--fp4-recipe nvfp4``; the linear layers' GEMMs at the FP4 rate); None: the device's default
    (mxfp8 where it has block-scaled FP8 GEMMs, i.e. Blackwell; current otherwise)."""
    attention_kernel: str | None = None
    """The fused-attention implementation the framework calls: fa2 | fa3 | fa4 | cudnn (each fitted
    per GPU architecture to published bars, ``parsim.cluster.attention_kernels``); None: the
    device's own (FA2 on Ampere, FA3 on Hopper, FA4 on Blackwell)."""
    cross_entropy_fusion: bool = False
    """The loss runs as one fused kernel per pass (Megatron's ``--cross-entropy-loss-fusion``, Liger,
    a compiled loss); false (Megatron-Core's default): the vocabulary-parallel cross-entropy op by op
    over fp32 logits (``parsim.costs.memory_ops.loss_work``)."""
    recompute_modules: tuple[str, ...] | None = None
    """Under ``recompute = "selective"``: the submodules rerun in the backward, as Megatron-Core's
    ``--recompute-modules`` names them (core_attn, mlp, moe, moe_act, layernorm, mla_up_proj,
    shared_experts: :data:`RECOMPUTE_MODULES`); None: Megatron's default, the
    attention core alone."""

    recompute_method: str | None = None
    """Under ``recompute = "full"``: which blocks of each model chunk are recomputed, as Megatron's
    ``--recompute-method`` says: ``uniform`` (every block, in units of ``recompute_num_layers``
    blocks whose input alone is kept) or ``block`` (the first ``recompute_num_layers`` blocks of
    each chunk one by one; the others keep all their activations); None: uniform, one block a unit."""
    recompute_num_layers: int | None = None
    """Megatron's ``--recompute-num-layers`` for ``recompute_method`` (None: 1)."""
    bf16_first_layers: int = 0
    """Under ``precision = "fp8"``: this many leading blocks stay BF16 (their GEMMs 16-bit, no casts),
    as Megatron's ``--first-last-layers-bf16 --num-layers-at-start-in-bf16 N`` keeps them; NVFP4
    recipes keep a few precision-sensitive blocks (Pretraining LLMs with NVFP4: the first 2 and the
    last 8 of a 12B model)."""
    bf16_last_layers: int = 0
    """Likewise the trailing blocks (``--num-layers-at-end-in-bf16``; torchtitan's NVFP4 recipe:
    the last ~15%)."""
    persist_layer_norm: bool = True
    """A LayerNorm model's fused norms run as the persistent kernel (Apex's ``FastLayerNorm``, which
    Megatron-LM has called since a2fdcdf061, 2021-10-08, unless ``--no-persist-layer-norm``; Transformer
    Engine's norms read and write each tensor once too); false: Apex's earlier ``FusedLayerNorm``
    kernels, which Megatron-LM ran before (``parsim.costs.memory_ops.LEGACY_LAYER_NORM_TIME``)."""

    @property
    def recompute_modules_(self) -> tuple[str, ...]:
        """The modules selective recomputation reruns (Megatron's default: the attention core)."""
        return self.recompute_modules if self.recompute_modules is not None else DEFAULT_RECOMPUTE_MODULES


@dataclass(frozen=True)
class ScheduleConfig:
    """Which pipeline schedule runs, and on how many microbatches."""

    name: str = "1F1B"
    """Registered schedule name (GPipe, 1F1B, Interleaved1F1B, ZBH1, ...)."""
    n_microbatches: int | None = None
    """Microbatches per step and pipeline; default global_batch / (dp * microbatch_size)."""
    partition: str = "even"
    """Layers -> stages: "even" (as equal as possible) | "balanced" (dynamic programming over
    per-layer times, embedding and LM head included, under the memory limit; parsim/partition.py)."""
    layers_per_stage: tuple[int, ...] | None = None
    """Explicit transformer blocks per stage, in model order (stage s = the s-th model chunk:
    pp*vpp entries summing to n_layers, or one chain's entries for two-copy schedules);
    overrides partition. Interleaved: stage s runs on rank s % pp; V-shaped: s < pp on rank
    s, then back (rank 2pp-1-s). 0 is allowed on a chain's first/last stage only."""
    first_stage_layers: int | None = None
    """Blocks in the first model chunk (stage 0: the first virtual stage of rank 0); the
    other stages share the rest exactly. None: an even share."""
    last_stage_layers: int | None = None
    """Blocks in the last model chunk (the last stage: on the last rank when interleaved,
    on rank 0 when V-shaped). None: an even share."""
    account_for_embedding: bool = False
    """The embedding counts as one layer in the even split (the first chunk builds one block
    fewer; Megatron's --account-for-embedding-in-pipeline-split)."""
    account_for_loss: bool = False
    """The LM head and loss count as one layer in the even split (the last chunk builds one
    block fewer; Megatron's --account-for-loss-in-pipeline-split)."""
    token_slices: int | str | None = None
    """TeraPipe only: token slices per sequence, K (equal slices) or "auto" (TeraPipe's
    dynamic program over slice lengths, ``parsim.schedule.terapipe``); None: 1."""
    max_in_flight: int | None = None
    """AMPNet only: most microbatch instances active in the pipeline at once; None: 1."""
    update_every: int | None = None
    """AMPNet only: a stage applies its update after this many backward messages; None: 1."""
    stage_replication: tuple[int, ...] | str | None = None
    """PipeDream only (1F1B-RR): workers per stage, summing to pp (a stage replicated r times
    takes microbatches round robin; its replicas synchronise gradients), or "auto": PipeDream's
    partitioner chooses the stage boundaries and the replication together; None: one worker
    per stage on the scenario's split."""
    weight_stashing: bool = True
    """PipeDream only: a stage keeps the weight version each in-flight microbatch's forward used,
    for its backward (false: the backward uses the newest weights)."""
    vertical_sync: bool = False
    """PipeDream only: every stage uses the weight version the input stage had when the
    microbatch entered the pipeline (staler, consistent across stages)."""


@dataclass(frozen=True)
class OverlapConfig:
    """Which communication overlaps with compute: stated here, visible in the result."""

    grad_reduce: bool = True
    """Bucketed DP gradient reduction launched during the last backward (DDP / Megatron --overlap-grad-reduce)."""
    param_gather: bool = False
    """ZeRO parameter all-gather overlapped with the next step's forward (--overlap-param-gather)."""
    tp_comm: bool = False
    """TP collectives pipelined with their GEMMs (--tp-comm-overlap)."""
    ep_comm: bool = False
    """Expert all-to-alls hidden behind another microbatch's compute (DualPipe-style overlap)."""
    bucket_bytes: int = 0
    """Gradient bucket of the DP reduction, bytes (PyTorch DDP ``bucket_cap_mb`` = 25 MiB); 0: Megatron-core's
    default, max(40M, 1M x dp) parameters of gradient. One collective per bucket, each with its latency."""
    prefetch: int = 1
    """ZeRO-3/FSDP units whose parameter all-gather is issued ahead of the unit computing
    (FSDP2's default 1; 0: each unit gathered only when reached, nothing hidden)."""
    tp_grad_allreduce: bool | None = None
    """Each column-parallel linear's input-gradient all-reduce (a reduce-scatter under sequence
    parallelism) runs asynchronously beside its weight-gradient GEMM and is waited for after it,
    when ``tp_comm`` does not pipeline it instead. Unset: as the framework does -- on under
    ``parallel.framework = "megatron"`` (Megatron-LM's
    ``LinearWithGradAccumulationAndAsyncCommunication``, on by default since September 2021 -- commit
    3f65246911 -- unless ``--no-async-tensor-model-parallel-allreduce``; Transformer Engine's ``Linear`` backward,
    ``allreduce(dgrad, async_op=True)``); false: it blocks after the input-gradient GEMM
    (Megatron-LM before that, e.g. the April 2021 runs of Narayanan et al.), and off elsewhere: PyTorch's
    DTensor tensor parallelism (torchtitan) reduces the input gradient in its own autograd node, after the
    linear's backward has computed both gradients."""
    p2p: bool = True
    """Pipeline sends run on their own stream while the sender computes on (torch ``isend``,
    Megatron); false: a send holds the sender's compute until the data has arrived (blocking
    ``dist.broadcast``/``send`` on the compute stream, as TeraPipe's reference runtime does)."""


@dataclass(frozen=True)
class SimulationConfig:
    """How the engine simulates the job."""

    mode: str = "fast"
    """"fast": one replica, cross-replica collectives costed on the topology; "full": every
    replica in true time order with all traffic as flows on the shared network (contention)."""


SIM_MODES = ("fast", "full")


@dataclass(frozen=True)
class MeasuredCosts:
    """A ``[costs]`` table: measured per-microbatch times that replace the cost model."""

    forward_s: tuple[float, ...]
    """Forward time of one microbatch, per stage."""
    backward_s: tuple[float, ...] | None
    """Full backward (B) per stage; or None when given as input + weight parts."""
    backward_input_s: tuple[float, ...] | None
    """Backward for inputs (I) per stage."""
    backward_weight_s: tuple[float, ...] | None
    """Backward for weights (W) per stage."""
    p2p_s: float = 0.0
    """One activation/gradient transfer between neighbouring stages."""
    overlap_f_b_s: tuple[float, ...] | None = None
    """Duration of one overlapped F&B pair (DualPipe's OVERLAP_F_B), per stage of its F; None: F + B."""


@dataclass(frozen=True)
class Scenario:
    """Everything a simulation needs; built by :func:`load_scenario`."""

    name: str
    file: str
    hardware: HardwareProfile
    gpus: int
    model: ModelSpec
    training: TrainingConfig
    parallel: ParallelConfig
    schedule: ScheduleConfig
    overlap: OverlapConfig = field(default_factory=OverlapConfig)
    costs: MeasuredCosts | None = None
    layers_per_stage: tuple[int, ...] = ()
    """Transformer blocks on each stage (n_stages entries)."""
    moe: MoEConfig = field(default_factory=MoEConfig)
    """The ``[moe]`` table: routing imbalance, expert TP, token dropping (MoE models)."""
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    """The ``[simulation]`` table: engine mode."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """The ``[offload]`` table: model states on the CPU or NVMe (ZeRO-Offload / ZeRO-Infinity)."""
    sharding: ShardingConfig | None = None
    """The ``[sharding]`` annotations the parallel axes came from (None: stated as ``[parallel]``)."""
    faults: FaultsConfig | None = None
    """The ``[faults]`` table: failure rates, checkpointing, restarts (``parsim goodput``); None: not given."""
    stragglers: StragglerConfig | None = None
    """The ``[stragglers]`` table: slow GPUs/nodes/NICs, failed NICs, pipeline ranks on other GPUs; None: all alike."""

    @property
    def n_microbatches(self) -> int:
        if self.schedule.n_microbatches is not None:
            return self.schedule.n_microbatches
        return self.training.global_batch // (self.parallel.dp * self.training.microbatch_size)

    @property
    def dropout(self) -> bool:
        return dropout_enabled(self.model, self.training.dropout)

    @property
    def tokens_per_step(self) -> int:
        """Tokens the simulated step trains: its microbatches' (``schedule.n_microbatches``, when
        stated, overrides the global batch's count; throughput and MFU follow what is simulated)."""
        return self.n_microbatches * self.parallel.dp * self.training.microbatch_size * self.training.seq_len


def check_model_parallel(model: ModelSpec, tr: TrainingConfig, par: ParallelConfig, file: str) -> None:
    if model.n_heads % par.tp:
        raise ConfigError(file, "parallel.tp", f"{model.n_heads} attention heads are not divisible by tp={par.tp}")
    if model.n_kv_heads % par.tp and par.tp % model.n_kv_heads:
        raise ConfigError(file, "parallel.tp", f"{model.n_kv_heads} KV heads do not divide or split evenly over tp={par.tp}")
    if tr.seq_len % par.cp:
        raise ConfigError(file, "parallel.cp", f"seq_len={tr.seq_len} is not divisible by cp={par.cp}")
    if par.cp > 1 and par.cp_comm == "a2a":  # Ulysses splits each TP rank's heads over cp
        heads = model.n_heads // par.tp
        kv = model.n_kv_heads // par.tp if model.n_kv_heads >= par.tp else 1
        if heads % par.cp or (kv % par.cp if kv >= par.cp else par.cp % kv):
            raise ConfigError(file, "parallel.cp_comm", f"a2a splits heads over cp={par.cp}: {heads} attention "
                                                        f"and {kv} KV heads per TP rank do not split evenly")
    if par.sequence_parallel and tr.seq_len % par.tp:
        raise ConfigError(file, "parallel.sequence_parallel", f"seq_len={tr.seq_len} is not divisible by tp={par.tp}")
    if par.ep > 1 and not model.is_moe:
        raise ConfigError(file, "parallel.ep", f"ep={par.ep} but model {model.name} has no experts")
    if model.is_moe and model.n_experts % par.ep:
        raise ConfigError(file, "parallel.ep", f"{model.n_experts} experts are not divisible by ep={par.ep}")
    if not tr.persist_layer_norm and (model.norm != "layernorm" or not tr.fused_kernels):
        why = f"{model.name} uses {model.norm}" if model.norm != "layernorm" else "fused_kernels = false runs nn.LayerNorm"
        raise ConfigError(file, "training.persist_layer_norm", f"false names Apex's fused LayerNorm kernels "
                          f"(Megatron's --no-persist-layer-norm); {why}")


def check_hybrid(model: ModelSpec, tr: TrainingConfig, par: ParallelConfig, hardware: HardwareProfile,
                 file: str) -> None:
    """What parsim's model of a hybrid (Mamba-2) model does not cover, refused in one line: its
    Mamba layers are costed by their kernels (a profile with kernel facts), without context
    torchtitan's op-level checkpointing or Muon; and Megatron-Core's own limits: tensor
    parallelism splits Mamba heads and groups evenly (``MambaMixer`` asserts it), context
    parallelism gives each rank a whole number of a TP rank's heads and groups, or repeats groups
    a whole number of times (``MambaContextParallel`` asserts it); Gated DeltaNet layers split their
    key and value heads evenly over tensor and context parallelism (``GatedDeltaNet``)."""
    if not model.hybrid_pattern:
        return
    mamba = "M" in model.hybrid_pattern
    if mamba and hardware.device.kernels is None:
        raise ConfigError(file, "hardware", f"{model.name}'s Mamba-2 layers are costed by their kernels; "
                          f"{hardware.device.name} gives no kernel facts (a GPU profile)")
    if mamba and (model.mamba_heads % par.tp or model.mamba_groups % par.tp):
        raise ConfigError(file, "parallel.tp", f"tp={par.tp} must divide the Mamba-2 heads ({model.mamba_heads}) "
                          f"and groups ({model.mamba_groups}) (Megatron-Core's MambaMixer splits both)")
    if mamba and par.cp > 1:
        heads, groups = model.mamba_heads // par.tp, model.mamba_groups // par.tp
        if heads % par.cp or (groups % par.cp if groups >= par.cp else par.cp % groups):
            raise ConfigError(file, "parallel.cp", f"cp={par.cp} must split a TP rank's {heads} Mamba-2 heads and "
                              f"{groups} groups evenly, or be a multiple of the groups (MambaContextParallel)")
    gdn = "G" in model.hybrid_pattern
    if gdn and hardware.device.kernels is None:
        raise ConfigError(file, "hardware", f"{model.name}'s Gated DeltaNet layers are costed by their kernels; "
                          f"{hardware.device.name} gives no kernel facts (a GPU profile)")
    split = par.tp * par.cp
    if gdn and (model.gdn_key_heads % split or model.gdn_value_heads % split):
        axis = "parallel.tp" if model.gdn_key_heads % par.tp or model.gdn_value_heads % par.tp else "parallel.cp"
        raise ConfigError(file, axis, f"tp x cp = {split} must divide the Gated DeltaNet key heads "
                          f"({model.gdn_key_heads}) and value heads ({model.gdn_value_heads}) (Megatron-Core's "
                          "GatedDeltaNet splits both over tensor, then context parallelism)")
    if tr.recompute == "op":
        raise ConfigError(file, "training.recompute", "\"op\" (torchtitan's op-level checkpointing) is not "
                          f"modelled for hybrid models such as {model.name}")
    if tr.optimizer == "muon":
        raise ConfigError(file, "training.optimizer", f"Muon's orthogonalisation is not modelled for hybrid models "
                          f"such as {model.name}")


def dropout_enabled(model: ModelSpec, dropout: bool | None) -> bool:
    """``training.dropout``, or its default when None: on for GeLU (GPT-style) models, off for
    SwiGLU (Llama-style) ones."""
    return model.ffn == "gelu" if dropout is None else dropout


def check_attention_head_dim(model: ModelSpec, training: TrainingConfig, hardware: HardwareProfile, file: str,
                             key: str = "model.head_dim",
                             fix: str = "set training.flash_attention = false to cost unfused attention") -> None:
    """A fused-attention kernel takes head dims up to its largest tile row (FlashAttention-2/3 and
    cuDNN: 256): beyond it the job cannot run that kernel, so the scenario is refused in one line
    (training.flash_attention = false costs the unfused attention instead)."""
    kf = hardware.device.kernels
    if not training.flash_attention or kf is None or kf.attention_kernel is None:
        return
    name = (resolve(training.attention_kernel, kf.mma_style) if training.attention_kernel
            else kf.attention_kernel)
    kernel = KERNELS[name]
    most = min(kernel.fwd_tiles[-1][0], kernel.bwd_tiles[-1][0])
    hd = model.kernel_head_dim
    if hd > most:
        raise ConfigError(file, key, f"head dim {hd} is more than {kernel.name} on {hardware.device.name} "
                          f"takes ({most}); {fix}")


def check_recompute_modules(training: TrainingConfig, model: ModelSpec, file: str) -> None:
    """What Megatron-Core refuses in ``recompute_modules`` (transformer_config.py)."""
    mods = training.recompute_modules or ()
    key = "training.recompute_modules"
    if "mla_up_proj" in mods and not model.is_mla:
        raise ConfigError(file, key, f"'mla_up_proj' needs multi-latent attention; {model.name} has none")
    if training.precision == "fp8" and training.fp8_recipe == "delayed":
        for x in ("moe_act", "layernorm"):
            if x in mods:
                raise ConfigError(file, key, f"{x!r} under fp8 needs current, blockwise or MX scaling "
                                  "(Megatron: delayed scaling does not support it)")


def check_batch(sc: Scenario) -> None:
    tr, par = sc.training, sc.parallel
    per_replica = par.dp * tr.microbatch_size
    if sc.schedule.n_microbatches is None and tr.global_batch % per_replica:
        raise ConfigError(sc.file, "training.global_batch",
                          f"{tr.global_batch} is not divisible by dp*microbatch_size = {per_replica}")
    if sc.n_microbatches < 1:
        raise ConfigError(sc.file, "schedule.n_microbatches", "must be at least 1")
    slices = sc.schedule.token_slices if isinstance(sc.schedule.token_slices, int) else 1
    actions = schedule_actions(sc.n_microbatches, par.pp * par.vpp, slices)
    if actions > MAX_SCHEDULE_ACTIONS:
        key = "schedule.n_microbatches" if sc.schedule.n_microbatches is not None else "training.global_batch"
        raise ConfigError(sc.file, key, f"{sc.n_microbatches:,} microbatches make ~{actions:,} schedule actions per step "
                                        f"(microbatches x stages x F/B/W{' x token slices' if slices > 1 else ''}), "
                                        f"more than parsim simulates ({MAX_SCHEDULE_ACTIONS:,})")


def schedule_actions(microbatches: int, stages: int, token_slices: int = 1) -> int:
    """Actions a schedule of ``stages`` (pp * vpp) runs per step: microbatches x stages x F/B/W
    (x token slices): what MAX_SCHEDULE_ACTIONS bounds."""
    return microbatches * stages * 3 * max(1, token_slices)


MAX_SCHEDULE_ACTIONS = 2_000_000
"""Largest schedule (actions per step) a scenario may ask for: ~10x the largest real one (16k GPUs,
pp 16 x vpp 8, 512 microbatches, F/B/W: ~200k); the engine needs ~0.8 kB and ~5 us per action."""
