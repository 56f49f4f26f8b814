"""Parallel configuration, the rank grid and layer -> stage partitioning.

The rank grid orders the axes (dp, pp, cp, ep, tp) from slowest to fastest varying by
default, so the tensor-parallel group is made of consecutive global ranks and lands
inside one node (Megatron's default placement). ``order`` makes that configurable;
what crosses the node boundary follows from the placement, never from a flag.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from parsim.cluster.precision import PRECISION_TABLE
from parsim.errors import ConfigError

AXES = ("dp", "pp", "cp", "ep", "tp")
CP_COMMS = ("p2p", "all_gather", "a2a")
"""Values of ``parallel.cp_comm`` (``parsim.costs.context``)."""
FRAMEWORKS = ("zero", "megatron", "deepspeed", "fsdp")
"""Memory conventions ``parallel.framework`` names (parsim.costs.framework)."""
GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
"""Values of ``parallel.grad_reduce_dtype``."""


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees of each parallel axis and the sharding options around them."""

    dp: int = 1
    """Data-parallel degree (replicas of the model; with ep>1, experts are sharded inside it)."""
    tp: int = 1
    """Tensor-parallel degree (Megatron column/row sharding of every linear layer)."""
    pp: int = 1
    """Pipeline-parallel degree (pipeline ranks)."""
    cp: int = 1
    """Context-parallel degree (the sequence is split; K/V exchanged in a ring in attention)."""
    ep: int = 1
    """Expert-parallel degree (experts sharded over ep ranks inside dp*cp)."""
    vpp: int = 1
    """Virtual stages per pipeline rank (interleaved schedules); n_stages = pp * vpp."""
    zero: int = 0
    """ZeRO stage 0..3 over the data-parallel axis (3 = FSDP-style parameter sharding)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism: norms/dropout sharded over tp; all-gather/reduce-scatter replace all-reduce."""
    dp_comm: str = "allreduce"
    """How data-parallel gradients are combined: "allreduce" (NCCL collectives; ZeRO's
    reduce-scatter/all-gather) or "parameter_server" (push to one server rank, pull back:
    the pre-all-reduce design, for comparison; needs zero = 0)."""
    cp_comm: str = "p2p"
    """How context-parallel attention communicates (Transformer Engine's ``cp_comm_type``):
    "p2p" (a K/V ring overlapped with blockwise attention: Megatron's default, torchtitan's
    ring attention), "all_gather" (K/V gathered before attention: the Llama 3 paper's CP) or
    "a2a" (DeepSpeed-Ulysses: all-to-all from a sequence split to a head split)."""
    order: tuple[str, ...] = field(default=AXES)
    """Axis order of the rank grid, slowest-varying first; the last axis is the innermost (consecutive ranks)."""
    reshard_after_forward: bool = True
    """ZeRO-3/FSDP (FSDP2's flag): free each unit's gathered parameters after its forward and
    gather them again before its backward (true, FSDP's and DeepSpeed ZeRO-3's default); false
    keeps the stage gathered from its first forward to its last backward (ZeRO-2 style for params)."""
    grad_reduce: str | None = None
    """When gradients are reduced: "microbatch" (reduce-scatter after every microbatch's backward:
    DeepSpeed ZeRO-2/3 and FSDP) or "step" (once per step after the last backward, unsharded
    gradients accumulated in between: more memory; DDP's no_sync, Megatron). None: the
    frameworks' default, "microbatch" for zero >= 2, "step" otherwise."""
    dp_shard: int | None = None
    """HSDP: shard ZeRO states within groups of this many data-parallel ranks and replicate
    across the dp / dp_shard groups (reduce-scatter and all-gather inside a shard group, an
    all-reduce of the shard across replicas). None: shard over all dp ranks."""
    framework: str = "zero"
    """Whose model-state and buffer memory: "zero" (the ZeRO paper's 2+2+K bytes per
    parameter, no buffers), "megatron" (fp32 main gradients, distributed-optimizer buffers),
    "deepspeed" (ZeRO's states plus its reduce/prefetch buckets), "fsdp" (FSDP2: fp32 sharded
    parameters and gradients, unit buffers). See parsim.costs.framework."""
    grad_reduce_dtype: str | None = None
    """Dtype the gradients are reduced in over dp x cp: "fp32" | "bf16" | "fp16"; None: the
    framework's default (:func:`grad_reduce_bytes`): fp32 under Megatron with
    bf16/FP8 (its arguments force ``accumulate_allreduce_grads_in_fp32`` for bf16 unless
    ``--grad-reduce-in-bf16``) and under FSDP2 (torchtitan's ``mixed_precision_reduce``
    default); the 16-bit training dtype otherwise. Under ``framework = "megatron"`` it is also
    the dtype of the main-gradient buffer."""

    def grad_bytes(self, precision: str) -> int:
        """Bytes per gradient element the dp x cp reduction moves under ``precision`` training:
        :func:`grad_reduce_bytes` of this framework and ``grad_reduce_dtype``."""
        return grad_reduce_bytes(self.framework, precision, self.grad_reduce_dtype)

    @property
    def grad_degree(self) -> int:
        """Ranks that hold the same dense weights and sum their gradients: dp x cp. Context
        parallel ranks see different tokens of the same sequences through the same weights, so
        their gradients are reduced together with the data-parallel replicas' (Megatron-Core's
        data-parallel group "with context parallel", which also shards its distributed
        optimizer; torchtitan's ``dp_shard_cp`` mesh that FSDP shards over)."""
        return self.dp * self.cp

    @property
    def shard_degree(self) -> int:
        """Ranks the ZeRO states are sharded over: dp x cp, or dp_shard x cp with HSDP (the
        replicas across dp / dp_shard groups each hold a whole copy)."""
        return (self.dp if self.dp_shard is None else self.dp_shard) * self.cp

    @property
    def grad_per_microbatch(self) -> bool:
        """Gradients reduced after every microbatch (see ``grad_reduce``)."""
        if self.grad_reduce is None:
            return self.zero >= 2
        return self.grad_reduce == "microbatch"

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def n_stages(self) -> int:
        return self.pp * self.vpp

    def stride(self, axis: str) -> int:
        """Distance in global rank between neighbours along ``axis``.

        ep is carved out of dp*cp (it does not multiply the world size); it gets
        the stride of the innermost of dp/cp so experts of one group sit close.
        """
        if axis == "ep":
            return self.stride("cp") if self.cp > 1 else self.stride("dp")
        s = 1
        for a in reversed(self.order):
            if a == axis:
                return s
            if a != "ep":
                s *= getattr(self, a)
        raise ValueError(axis)

    def group_ranks(self, axis: str, rank0: int = 0) -> list[int]:
        """Global ranks of the ``axis`` group that contains ``rank0``."""
        n = getattr(self, axis)
        st = self.stride(axis)
        base = rank0 - ((rank0 // st) % n) * st
        return [base + i * st for i in range(n)]

    def grad_group_ranks(self, rank0: int = 0) -> list[int]:
        """Global ranks of the gradient-reduction group (dp x cp, :attr:`grad_degree`) that
        contains ``rank0``, dp-major: the first ``dp_shard * cp`` of them are one HSDP shard group."""
        return [r for d in self.group_ranks("dp", rank0) for r in self.group_ranks("cp", d)]

    def pipeline_ranks(self) -> list[int]:
        """Global ranks of the pipeline of the first replica (stage rank 0..pp-1)."""
        return self.group_ranks("pp", 0)


def check_parallel(par: ParallelConfig, gpus: int, file: str | None) -> None:
    """Divisibility and range rules; raise a ConfigError naming the key."""
    for axis in ("dp", "tp", "pp", "cp", "ep", "vpp"):
        v = getattr(par, axis)
        if not isinstance(v, int) or v < 1:
            raise ConfigError(file, f"parallel.{axis}", f"must be a positive integer, got {v!r}")
    if par.zero not in (0, 1, 2, 3):
        raise ConfigError(file, "parallel.zero", f"must be 0, 1, 2 or 3, got {par.zero!r}")
    if par.dp_comm not in ("allreduce", "parameter_server"):
        raise ConfigError(file, "parallel.dp_comm", f"must be \"allreduce\" or \"parameter_server\", got {par.dp_comm!r}")
    if par.dp_comm == "parameter_server" and par.zero:
        raise ConfigError(file, "parallel.dp_comm", f"a parameter server keeps whole optimizer state: needs zero = 0, got {par.zero}")
    if par.cp_comm not in CP_COMMS:
        raise ConfigError(file, "parallel.cp_comm", f"must be one of {', '.join(CP_COMMS)}, got {par.cp_comm!r}")
    if par.grad_reduce not in (None, "microbatch", "step"):
        raise ConfigError(file, "parallel.grad_reduce", f"must be \"microbatch\" or \"step\", got {par.grad_reduce!r}")
    if par.dp_shard is not None:
        if isinstance(par.dp_shard, bool) or not isinstance(par.dp_shard, int) or par.dp_shard < 1 \
                or par.dp % par.dp_shard:
            raise ConfigError(file, "parallel.dp_shard", f"must be a positive divisor of dp={par.dp}, got {par.dp_shard!r}")
        if par.zero == 0:
            raise ConfigError(file, "parallel.dp_shard", "HSDP shards ZeRO states: needs zero >= 1")
    if par.framework not in FRAMEWORKS:
        raise ConfigError(file, "parallel.framework", f"must be one of {', '.join(FRAMEWORKS)}, got {par.framework!r}")
    if par.framework == "fsdp" and par.zero != 3:
        raise ConfigError(file, "parallel.framework", f"FSDP2 shards parameters (fully_shard): needs zero = 3 "
                                                      f"(reshard_after_forward = false for ZeRO-2 style), got {par.zero}")
    if par.framework == "megatron" and par.zero > 1:
        raise ConfigError(file, "parallel.framework", f"Megatron's distributed optimizer is ZeRO-1: needs zero <= 1, "
                                                      f"got {par.zero}")
    if par.grad_reduce_dtype is not None and par.grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
        raise ConfigError(file, "parallel.grad_reduce_dtype", f"must be one of {', '.join(GRAD_REDUCE_DTYPES)}, "
                                                              f"got {par.grad_reduce_dtype!r}")
    if par.world_size != gpus:
        raise ConfigError(
            file, "gpus",
            f"{gpus} GPUs but dp*tp*pp*cp = {par.dp}*{par.tp}*{par.pp}*{par.cp} = {par.world_size}",
        )
    if (par.dp * par.cp) % par.ep:
        raise ConfigError(file, "parallel.ep", f"ep={par.ep} must divide dp*cp={par.dp * par.cp}")
    if sorted(par.order) != sorted(AXES):
        raise ConfigError(file, "parallel.order", f"must be a permutation of {list(AXES)}, got {list(par.order)}")


def partition_layers(n_layers: int, n_stages: int, *, file: str | None = None, interleaved: bool = False,
                     first: int | None = None, last: int | None = None,
                     embedding: bool = False, loss: bool = False) -> tuple[int, ...]:
    """Transformer blocks per stage (model order: stage 0 holds the embedding, the last the loss).

    * ``first`` / ``last`` given (``[schedule] first_stage_layers`` / ``last_stage_layers``):
      the first / last model chunk holds that many blocks and every other stage the same
      share of the rest, which must divide exactly (Megatron's uneven-pipeline rule, applied
      per model chunk). 0 is allowed there: a chunk holding only the embedding or the loss,
      as the Llama 3 paper runs.
    * ``embedding`` / ``loss`` (``account_for_embedding`` / ``account_for_loss``): the
      embedding / the loss counts as one more layer in the split, then the first / last
      stage builds one block fewer (Megatron's --account-for-*-in-pipeline-split;
      torchtitan's input/output weight 1).
    * Otherwise as even as possible, earlier stages getting the extra; interleaved
      schedules need an exact split (Megatron's rule: every virtual stage carries the same
      number of layers, embedding and loss slots counted).
    """
    if first is not None or last is not None:
        if embedding or loss:
            raise ConfigError(file, "schedule.account_for_embedding" if embedding else "schedule.account_for_loss",
                              "counts the embedding/loss in an even split; first_stage_layers/last_stage_layers "
                              "already state the split (Megatron refuses both together too)")
        return _uneven(n_layers, n_stages, first, last, file)
    slots = n_layers + embedding + loss  # the embedding / loss each take one layer's slot
    if n_stages > slots:
        raise ConfigError(file, "parallel.pp",
                          f"{n_stages} stages (pp*vpp) but only {n_layers} layers")
    if interleaved and slots % n_stages:
        counted = "".join([" + embedding"] * embedding + [" + loss"] * loss)
        raise ConfigError(file, "parallel.vpp",
                          f"interleaving needs n_layers{counted}={slots} divisible by pp*vpp={n_stages} "
                          f"(Megatron's rule){_what_would(n_layers, n_stages)}")
    base, extra = divmod(slots, n_stages)
    out = [base + (1 if s < extra else 0) for s in range(n_stages)]
    out[0] -= embedding
    out[-1] -= loss
    return tuple(out)


def _uneven(n: int, S: int, first: int | None, last: int | None, file: str | None) -> tuple[int, ...]:
    """First / last chunk stated; the other stages share the rest exactly."""
    key = "schedule.first_stage_layers" if first is not None else "schedule.last_stage_layers"
    if S < 2:
        raise ConfigError(file, key, "needs at least two pipeline stages (pp*vpp >= 2)")
    given = (first or 0) + (last or 0)
    middle = S - (first is not None) - (last is not None)
    rest = n - given
    if middle == 0:
        if rest:
            raise ConfigError(file, key, f"two stages hold all n_layers={n}: first_stage_layers + "
                                         f"last_stage_layers must be {n}, got {given}")
        return (first, last)  # type: ignore[return-value]
    if rest < middle or rest % middle:
        raise ConfigError(file, key, f"n_layers={n} minus {given} leaves {rest} layers, which do not split "
                                     f"evenly over the other {middle} stages{_fix_hint(n, middle, first, last)}")
    q = rest // middle
    return ((q if first is None else first),) + (q,) * (S - 2) + ((q if last is None else last),)


def _fix_hint(n: int, middle: int, first: int | None, last: int | None) -> str:
    """The nearest stated layers that would divide (one line, to be appended)."""
    both = first is not None and last is not None
    given = (first or 0) + (last or 0)
    best = None
    for q in range(1, n // middle + 1):
        total = n - q * middle  # what first (+ last) must then hold
        if total >= 0 and (best is None or abs(total - given) < abs(best[1] - given)):
            best = (q, total)
    if best is None:
        return ""
    q, total = best
    if both:
        f = max(0, min(total, first + (total - given) // 2))  # spread the change over both ends
        return f"; {total} in first and last together would ({q} per other stage), e.g. {f} and {total - f}"
    name = "first_stage_layers" if first is not None else "last_stage_layers"
    return f"; {name} = {total} would ({q} per other stage)"


def _what_would(n: int, S: int) -> str:
    """For a refused interleaved split: first/last chunk sizes that make the rest divide."""
    if S < 3:
        return ""
    best = None
    for q in range(1, n // (S - 2) + 1):
        total = n - q * (S - 2)
        f, l = (total + 1) // 2, total // 2
        slowest = max(f, q)
        if total >= 0 and (best is None or slowest < best[0]):
            best = (slowest, f, l, q)
    if best is None:
        return ""
    _, f, l, q = best
    return (f"; [schedule] first_stage_layers = {f}, last_stage_layers = {l} "
            f"would leave {q} per other stage, or give layers_per_stage")


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes per element of the dtypes ``parallel.grad_reduce_dtype`` names."""


def grad_reduce_bytes(framework: str, precision: str, dtype: str | None = None) -> int:
    """Bytes per gradient element the data-parallel reduction moves (and, under Megatron, its
    main-gradient buffer keeps).

    ``dtype`` (``parallel.grad_reduce_dtype``) when given; else the framework's default:

    * ``megatron`` -- fp32 with bf16 or FP8 training: Megatron-LM's argument checks set
      ``accumulate_allreduce_grads_in_fp32`` for bf16 ("bfloat16 requires gradient
      accumulation and all-reduce to be done in fp32", megatron/training/arguments.py) unless
      ``--grad-reduce-in-bf16``; FP8 runs keep bf16 parameters (``--bf16``), so the same;
      fp16 training reduces its fp16 gradients (the flag is off by default).
    * ``fsdp`` -- fp32: torchtitan's ``training.mixed_precision_reduce`` defaults to float32
      (FSDP2's ``MixedPrecisionPolicy(reduce_dtype=torch.float32)``).
    * ``zero``, ``deepspeed`` -- the gradients' own 16-bit dtype (DeepSpeed reduces in the
      model dtype unless ``communication_data_type`` says otherwise).
    """
    if dtype is not None:
        return DTYPE_BYTES[dtype]
    if framework == "fsdp" or (framework == "megatron" and precision in ("bf16", "fp8")):
        return 4
    return PRECISION_TABLE[precision].weight_bytes  # fp8 training keeps bf16 gradients
