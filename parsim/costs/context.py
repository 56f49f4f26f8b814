"""Context parallelism (CP) as the frameworks run it: one block's attention on one CP rank.

The sequence is split over ``cp`` ranks; the linear layers see only this rank's tokens, but
every query must meet every earlier key. Three ways to do that (``parallel.cp_comm``, the
names of Transformer Engine's ``cp_comm_type``):

* ``"p2p"`` (default; Megatron-Core / TE ``AttnFuncWithCPAndKVP2P``, torchtitan's ring
  attention): a ring of ``cp`` steps. At step ``k`` a rank runs blockwise attention of its
  queries against the K/V chunk that started ``k`` ranks upstream, while it sends that chunk on
  and receives the next one; a transfer that outlasts its step's attention is exposed. The
  backward walks the same ring with the K/V chunks and the partial dK/dV travelling together
  (TE sends K/V alone at the first step, K/V and dK/dV in between, dK/dV alone at the last:
  twice the forward's bytes).
* ``"all_gather"`` (TE ``AttnFuncWithCPAndKVAllGather``, the Llama 3 paper's CP): all-gather the
  whole sequence's K/V before attention (not overlapped, as TE's documentation says), and in
  the backward all-gather them again and reduce-scatter dK/dV.
* ``"a2a"`` (DeepSpeed-Ulysses): all-to-all Q, K, V from a sequence split to a head split,
  full-sequence attention over ``heads / cp`` heads, all-to-all the output back (and the same
  for dO, dQ, dK, dV in the backward); not overlapped.

Causal load balance. With a causal mask a contiguous split gives the last rank ``cp`` times
the first rank's work. Megatron and torchtitan cut the sequence into ``2 cp`` chunks and give
rank ``i`` chunks ``i`` and ``2cp-1-i`` (the zig-zag split): then at every ring step every rank
does the same work -- the diagonal step is one causal ``2c x 2c`` block (``c = seq / 2cp``), a
step whose K/V comes from an earlier rank is both query chunks against that rank's first chunk
(``2c x c``, no mask), one from a later rank is this rank's second chunk against both of its
chunks (``c x 2c``, no mask); everything else is masked and skipped. :func:`zigzag_steps` lists
those blocks; :func:`contiguous_steps` the unbalanced split, for comparison.

Each block is timed by the device's fused-attention kernel model
(``Device.attention_kernel_time``): short blocks run at the kernel's short-sequence efficiency,
which is where long-context CP loses against one big attention. Attention runs in BF16 unless
the training runs in fp16 (Transformer Engine keeps dot-product attention out of FP8 unless
``fp8_dpa`` is set). Without a fused kernel (``training.flash_attention = false``) or kernel facts
in the profile the caller's attention time (its FLOP model) stands in, spread evenly over the
ring's steps, each later step still paying its merge / gradient accumulation (memory-bound). The
ring step's transfer is the link's latency plus the chunk at its bandwidth, or, on a calibrated
profile that measured it (``collective_p2p_<cp>``), the ring step as the torch runtime pays it,
timed in situ between stretches of compute, posting included: on one CPU host about 1.9 ms for
2 x 128 KiB (the link's one-way fit said 0.18 ms; post and wait timed right after a short GEMM,
0.9 ms).

On a CPU rank the compute after each wait of the ring (and after each blocking gather or
all-to-all) re-warms the core the wait idled (``device.comm_rewarm_us``, charged with the
attention; 0 on a GPU).

K/V heads per rank follow tensor parallelism (``n_kv_heads / tp``, or one replicated head when
there are fewer KV heads than TP ranks): GQA shrinks the bytes on the ring.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from parsim.cluster.attention_kernels import ATTENTION_PRECISIONS
from parsim.cluster.collectives import collective_time
from parsim.cluster.contention import rewarm_s, shared_slowdown_s
from parsim.cluster.precision import PRECISION_TABLE
from parsim.config.parallel import CP_COMMS
from parsim.costs.inputs import Cluster, LayerInputs, Ranks
from parsim.model import attention_kind, causal_pairs


@dataclass(frozen=True)
class Block:
    """One blockwise-attention kernel call of a ring step."""

    seq_q: int
    """Query rows of the block (tokens of this rank)."""
    seq_k: int
    """Key/value columns of the block (tokens of the K/V chunk at hand)."""
    causal: bool
    """The causal mask cuts the block (the diagonal); False: every pair is computed."""

    @property
    def pairs(self) -> float:
        """Query-key pairs the mask keeps (the kernel's work): causal masks are bottom-right
        aligned as the kernels align them (a square keeps ``s (s + 1) / 2``); unmasked blocks
        keep ``seq_q * seq_k``."""
        if self.causal:  # bottom-right aligned, as the kernels mask
            q, k = self.seq_q, self.seq_k
            return q * (k - q) + q * (q + 1) / 2 if k >= q else k * (k + 1) / 2
        return float(self.seq_q * self.seq_k)


def zigzag_steps(seq: int, cp: int, rank: int) -> tuple[tuple[Block, ...], ...]:
    """Blocks rank ``rank`` computes at each of the ``cp`` ring steps under the zig-zag split
    (chunks ``rank`` and ``2cp-1-rank`` of ``2cp``; step ``k`` holds the K/V of rank
    ``rank - k``, cyclically)."""
    c = max(1, seq // (2 * cp))
    out = []
    for step in range(cp):
        src = (rank - step) % cp
        if step == 0:
            out.append((Block(2 * c, 2 * c, True),))
        elif src < rank:  # its chunks src and 2cp-1-src: only src precedes both query chunks
            out.append((Block(2 * c, c, False),))
        else:  # src > rank: both of its chunks precede query chunk 2cp-1-rank, follow chunk rank
            out.append((Block(c, 2 * c, False),))
    return tuple(out)


def contiguous_steps(seq: int, cp: int, rank: int) -> tuple[tuple[Block, ...], ...]:
    """The same ring over a contiguous split (rank ``i`` holds tokens ``[i L, (i+1) L)``): K/V
    of an earlier rank is a full block, of a later rank masked out entirely (no block)."""
    L = max(1, seq // cp)
    out = []
    for step in range(cp):
        src = (rank - step) % cp
        if step == 0:
            out.append((Block(L, L, True),))
        elif src < rank:
            out.append((Block(L, L, False),))
        else:
            out.append(())
    return tuple(out)


def ring_exposed(compute_s: Sequence[float], transfer_s: Sequence[float], share: float = 0.0) -> float:
    """Exposed communication of a ring: step ``i``'s transfer runs beside step ``i``'s
    attention; what it lasts beyond that attention is exposed (the next step needs its data).
    ``share``: the fraction of the attention's rate the transfer takes while in flight
    (:func:`ring_share`): the attention beside it then runs slower
    (``parsim.cluster.contention.shared_slowdown_s``), and a step costs the longer of the
    transfer and the slowed attention."""
    return sum(max(0.0, t - c, shared_slowdown_s(share, t, c)) for c, t in zip(compute_s, transfer_s))


def ring_share(inp: LayerInputs) -> float:
    """What a ring step's transfer takes from the attention beside it (:func:`ring_exposed`):
    all of it where the transport runs on the rank's own processor (a profile with
    ``transport_core_share``: gloo on CPU ranks, every core running a rank), whose threads move
    the data only when the rank's thread yields the core -- the torch runtime's tiny GPT at
    cp = 2 computes 0.8 ms of attention after posting a step and then still waits 1.7 ms, longer
    than the step alone (1.56 ms): nothing overlapped. On a GPU, 0: the SMs NCCL's
    point-to-point kernels hold beside the attention have no source here (the collectives'
    CTA counts, ``device.collective_ctas``, are for collectives)."""
    return 1.0 if inp.hardware.device.transport_core_share is not None else 0.0


def forward_transfers(cp: int, step_s: float) -> list[float]:
    """Transfer beside each forward step: the next K/V chunk, at every step but the last."""
    return [step_s] * (cp - 1) + [0.0]


def backward_transfers(cp: int, step_s: float) -> list[float]:
    """Transfer beside each backward step (``step_s``: one K/V chunk): K/V alone at the first
    step, K/V and the partial dK/dV in between, dK/dV alone at the last (TE's backward ring)."""
    if cp <= 1:
        return [0.0]
    return [step_s] + [2.0 * step_s] * (cp - 2) + [step_s]


@dataclass(frozen=True)
class CPAttention:
    """One block's attention under context parallelism, one microbatch, one CP rank."""

    forward_s: float
    """Attention kernels of the forward (every ring step, or the gathered / head-split pass)."""
    backward_s: float
    """Attention kernels of the backward."""
    forward_comm_s: float
    """Exposed CP communication of the forward."""
    backward_comm_s: float
    """Exposed CP communication of the backward."""
    forward_bytes: float
    """Bytes this rank sends in the forward (ring: the K/V chunks passed on; collectives:
    nccl-tests' bus bytes)."""
    backward_bytes: float
    """Bytes this rank sends in the backward."""


def attention_precision(training_precision: str) -> str:
    """Precision the attention kernel runs in: fp16 stays fp16, everything else BF16 (FP8
    training keeps attention in BF16: TE's ``fp8_dpa`` is off by default)."""
    return "fp16" if training_precision == "fp16" else "bf16"


def local_heads(inp: LayerInputs) -> tuple[int, int]:
    """(query heads, K/V heads) on one TP rank: KV heads split over tp, or one replicated head
    when there are fewer KV heads than TP ranks. MLA expands K/V to every query head."""
    m, tp = inp.model, inp.shard.tp
    q = max(1, m.n_heads // tp)
    if m.is_mla:
        return q, q
    kv = m.n_kv_heads // tp if m.n_kv_heads >= tp else 1
    return q, max(1, kv)


def kernel_head_dim(inp: LayerInputs) -> int:
    """Head dimension the kernel sees (MLA: the mean of its query/key and value dims, so the
    FLOPs match ``attention_core_flops``)."""
    m = inp.model
    if m.is_mla:
        return max(1, round((m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2))
    return m.head_dim_


def kv_chunk_bytes(inp: LayerInputs) -> float:
    """Bytes of the K and V chunk one CP rank holds and passes on at a ring step (its seq/cp
    tokens, its KV heads), in the attention's precision: activation bytes (FP8 training keeps
    K and V in BF16 for the attention that reads them, so they travel as BF16)."""
    m, sh = inp.model, inp.shard
    if sh.cp <= 1:
        return 0.0
    wire = PRECISION_TABLE[inp.options.precision].activation_bytes
    kv = m.n_kv_heads // sh.tp if m.n_kv_heads >= sh.tp else 1
    return 2 * sh.microbatch_size * (sh.seq_len // sh.cp) * kv * m.head_dim_ * wire


def uses_kernels(inp: LayerInputs) -> bool:
    """The attention goes through the device's fused-attention kernel model."""
    kf = inp.hardware.device.kernels
    return (inp.options.flash_attention and kf is not None and kf.attention_kernel is not None
            and attention_precision(inp.options.precision) in ATTENTION_PRECISIONS)


def window_share(inp: LayerInputs) -> float:
    """Mean over the model's blocks of the share of a full causal block's query-key pairs a
    block keeps (1 for full attention; sliding-window or chunked blocks keep fewer, and the
    kernel skips the K/V blocks outside the window as it skips those above the diagonal) --
    the averaging ``parsim.costs.compute`` applies without CP."""
    m, s = inp.model, inp.shard.seq_len
    if m.layer_types is None:
        return 1.0
    full = s * (s + 1) / 2
    shares = [causal_pairs(m, s, li) / full if attention_kind(m, li) != "full" else 1.0 for li in range(m.n_layers)]
    return sum(shares) / len(shares)


def _block_s(inp: LayerInputs, blocks: Sequence[Block], heads: int, kv_heads: int, backward: bool) -> float:
    """Kernel seconds of one ring step's blocks on this rank."""
    dev, b, d = inp.hardware.device, inp.shard.microbatch_size, kernel_head_dim(inp)
    prec = attention_precision(inp.options.precision)
    impl = inp.options.attention_kernel
    return sum(dev.attention_kernel_time(b, x.seq_q, x.seq_k, heads, kv_heads, d, x.causal, backward, prec, impl)
               for x in blocks)


def _correction_s(inp: LayerInputs, blocks: Sequence[Block], heads: int) -> float:
    """Merging a step's partial output into the running one (TE's output / softmax-LSE
    correction, memory-bound): read the step's bf16 output and LSE, read and write the fp32
    accumulator and its LSE."""
    b, d = inp.shard.microbatch_size, kernel_head_dim(inp)
    rows = sum(x.seq_q for x in blocks)
    return inp.hardware.device.layer_memory_time(b * rows * heads * (d * (2 + 4 + 4) + 3 * 4))


def _accumulate_s(inp: LayerInputs, blocks: Sequence[Block], heads: int, kv_heads: int) -> float:
    """A backward step's gradient accumulation (memory-bound, TE's ``dq.add_`` / ``dkv.add_``):
    the step's dQ rows added into the fp32 dQ (read bf16 + read and write fp32), its dK/dV
    columns into the travelling bf16 dK/dV (read both, write one)."""
    b, d = inp.shard.microbatch_size, kernel_head_dim(inp)
    rows = sum(x.seq_q for x in blocks)
    cols = sum(x.seq_k for x in blocks)
    return inp.hardware.device.layer_memory_time(b * d * (rows * heads * (2 + 4 + 4) + 2 * cols * kv_heads * 3 * 2))


@lru_cache(maxsize=4096)
def _collective(cluster: Cluster, kind: str, nbytes: float, group: Ranks) -> float:
    return collective_time(cluster.profile, kind, nbytes, group)


def p2p_step_s(inp: LayerInputs) -> float:
    """One ring step's K/V transfer on the CP group's bottleneck link (every rank sends to
    its successor and receives from its predecessor at once; the slowest pair sets the pace).
    A calibrated profile that measured the ring step itself (``collective_p2p_<cp>``: both
    directions at once, K and V as two sends, as the torch runtime runs it) is charged that;
    otherwise one latency plus the chunk at the link's bandwidth (full duplex: the way back
    costs nothing more)."""
    return collective_time(inp.hardware, "p2p", kv_chunk_bytes(inp), list(inp.shard.cp_group))


@lru_cache(maxsize=4096)
def cp_attention(inp: LayerInputs, flat_s: tuple[float, float] = (0.0, 0.0)) -> CPAttention:
    """Attention of one block under CP (``inp.shard.cp > 1``), by ``inp.shard.cp_comm``.

    With the fused-attention kernel model (:func:`uses_kernels`) every block is timed by it.
    Otherwise ``flat_s`` -- the caller's (forward, backward) seconds of this rank's attention
    -- stands in, spread evenly over the ring's steps."""
    sh = inp.shard
    if sh.cp <= 1:
        raise ValueError("cp_attention needs cp > 1")
    if sh.cp_comm not in CP_COMMS:
        raise ValueError(f"cp_comm {sh.cp_comm!r} not one of {', '.join(CP_COMMS)}")
    fallback = None if uses_kernels(inp) else flat_s
    if sh.cp_comm == "a2a":
        return _ulysses(inp, fallback)
    if sh.cp_comm == "all_gather":
        return _all_gather(inp, fallback)
    return _ring(inp, fallback)


def _ring(inp: LayerInputs, fallback: tuple[float, float] | None) -> CPAttention:
    """The p2p ring over the zig-zag split."""
    sh = inp.shard
    cp = sh.cp
    heads, kv = local_heads(inp)
    steps = zigzag_steps(sh.seq_len, cp, 0)  # every rank does the same work: rank 0 stands for all
    if fallback is None:  # every block through the kernel model, at the blocks' window share
        scale = window_share(inp)
        blocks_f = [_block_s(inp, s, heads, kv, False) for s in steps]
        blocks_b = [_block_s(inp, s, heads, kv, True) for s in steps]
    else:  # the caller's flat attention spread evenly over the steps
        scale = 1.0
        blocks_f, blocks_b = [fallback[0] / cp] * cp, [fallback[1] / cp] * cp
    # every step after the first merges its partial output (forward) / adds its partial gradients (backward)
    fwd = [scale * (x + (_correction_s(inp, s, heads) if k else 0.0)) for k, (x, s) in enumerate(zip(blocks_f, steps))]
    bwd = [scale * (x + (_accumulate_s(inp, s, heads, kv) if k else 0.0))
           for k, (x, s) in enumerate(zip(blocks_b, steps))]
    t = p2p_step_s(inp)
    chunk = kv_chunk_bytes(inp)
    share = ring_share(inp)
    tf, tb = forward_transfers(cp, t), backward_transfers(cp, t)
    # the compute after each step's wait re-warms (a CPU rank, whose wait idles it; 0 on a GPU)
    dev = inp.hardware.device
    warm_f, warm_b = rewarm_s(dev, sum(1 for x in tf if x > 0)), rewarm_s(dev, sum(1 for x in tb if x > 0))
    return CPAttention(sum(fwd) + warm_f, sum(bwd) + warm_b, ring_exposed(fwd, tf, share), ring_exposed(bwd, tb, share),
                       (cp - 1) * chunk, 2 * (cp - 1) * chunk)


def _all_gather(inp: LayerInputs, fallback: tuple[float, float] | None) -> CPAttention:
    """All-gathered K/V: query chunk ``i`` (of ``2cp``) against the keys up to its end, causal;
    the gather (and in the backward the gather again and dK/dV's reduce-scatter) exposed."""
    sh = inp.shard
    cp = sh.cp
    if fallback is None:
        heads, kv = local_heads(inp)
        c = max(1, sh.seq_len // (2 * cp))
        blocks = (Block(c, c, True), Block(c, 2 * cp * c, True))  # rank 0: chunks 0 and 2cp-1
        share = window_share(inp)
        fwd = share * _block_s(inp, blocks, heads, kv, False)
        bwd = share * _block_s(inp, blocks, heads, kv, True)
    else:
        fwd, bwd = fallback
    chunk = kv_chunk_bytes(inp)
    gather = _collective(inp.cluster, "all_gather", cp * chunk, sh.cp_group)
    scatter = _collective(inp.cluster, "reduce_scatter", cp * chunk, sh.cp_group)
    dev = inp.hardware.device  # blocking calls: the compute after each re-warms (a CPU rank)
    return CPAttention(fwd + rewarm_s(dev, 1), bwd + rewarm_s(dev, 2), gather, gather + scatter,
                       (cp - 1) * chunk, 2 * (cp - 1) * chunk)


def ulysses_heads(inp: LayerInputs) -> tuple[int, int]:
    """(query heads, K/V heads) each rank attends over after the all-to-all: ``heads / cp``;
    K/V heads fewer than cp are replicated first (each rank needs the one its queries use)."""
    heads, kv = local_heads(inp)
    cp = inp.shard.cp
    return max(1, heads // cp), max(1, kv // cp)


def ulysses_buffers(inp: LayerInputs) -> tuple[float, float]:
    """(Q, K, V buffer, output buffer) one rank hands each all-to-all (nccl-tests' size S):
    its seq/cp tokens of every local head, K/V heads replicated up to cp when fewer."""
    sh = inp.shard
    heads, kv = local_heads(inp)
    kv = max(kv, sh.cp)
    per_head = (sh.microbatch_size * (sh.seq_len // sh.cp) * kernel_head_dim(inp)
                * PRECISION_TABLE[inp.options.precision].activation_bytes)
    return (heads + 2 * kv) * per_head, heads * per_head


def _ulysses(inp: LayerInputs, fallback: tuple[float, float] | None) -> CPAttention:
    """DeepSpeed-Ulysses: Q, K, V all-to-all to a head split, whole-sequence attention, the
    output all-to-all back; the backward moves dO in and dQ, dK, dV back (the same bytes)."""
    sh = inp.shard
    cp = sh.cp
    if fallback is None:
        heads, kv = ulysses_heads(inp)
        whole = (Block(sh.seq_len, sh.seq_len, True),)
        share = window_share(inp)
        fwd = share * _block_s(inp, whole, heads, kv, False)
        bwd = share * _block_s(inp, whole, heads, kv, True)
    else:
        fwd, bwd = fallback
    qkv, out = ulysses_buffers(inp)
    comm = (_collective(inp.cluster, "all_to_all", qkv, sh.cp_group)
            + _collective(inp.cluster, "all_to_all", out, sh.cp_group))
    sent = (cp - 1) / cp * (qkv + out)
    dev = inp.hardware.device  # blocking calls: the compute after each re-warms (a CPU rank)
    return CPAttention(fwd + rewarm_s(dev, 2), bwd + rewarm_s(dev, 2), comm, comm, sent, sent)


def clear_caches() -> None:
    """Empty this module's caches (a cold start)."""
    for fn in (_collective, cp_attention):
        fn.cache_clear()
