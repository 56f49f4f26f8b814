"""``parsim autoplan``: Alpa's two levels on parsim's cost model, confirmed by the engine.

For every submesh shape Alpa allows (1 x 2^k inside a node, n x M whole nodes) that tiles the
GPUs into ``pp`` equal stages, every 2-D logical mesh of it (inner axis on consecutive ranks),
every microbatch count and recomputation mode: the intra-op ILP (``parsim.autoplan.ilp``, in
the space the engine runs) picks the block's sharding on the most loaded stage, then the stage
DP (``parsim.autoplan.interop``) cuts the layers. The leaders by that estimate are written as
``[sharding]`` scenarios and simulated (``parsim.simulate``); the fastest that fits wins.

One submesh shape per plan: the engine and the torch runtime run the same axes on every stage
(Alpa also lets stages differ in shape).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from parsim.autoplan.blocks import block_graph
from parsim.autoplan.graph import Setting, families, serves
from parsim.autoplan.ilp import Problem, evaluate, solve
from parsim.autoplan.interop import Pipeline, StageModel, best_split
from parsim.autoplan.mesh import Mesh
from parsim.cluster.hardware import HardwareProfile
from parsim.config.sharding import sharding_from_table, to_parallel_table
from parsim.errors import ConfigError
from parsim.model import ModelSpec

FILE = "parsim autoplan"


@dataclass(frozen=True)
class AutoplanSpec:
    """The question."""

    model: ModelSpec
    model_ref: str
    """How the user named the model (a preset, or a config.json path)."""
    hardware: HardwareProfile
    gpus: int
    global_batch: int
    seq_len: int
    precision: str = "bf16"
    optimizer: str = "adam"
    recompute: tuple[str, ...] = ("none", "full")
    confirm: int = 4
    """Leaders by the estimate that are simulated (more, up to 4x, until one fits in the engine's memory)."""
    max_microbatch_per_gpu: int = 8
    """Largest microbatch, in sequences per GPU of a stage, considered."""
    flash_attention: bool = True
    """``training.flash_attention`` of every plan (false: the unfused s x s attention core)."""
    dropout: bool | None = None
    """``training.dropout`` of every plan (None: the model family's default)."""


@dataclass(frozen=True)
class Plan:
    """One candidate: submesh, logical mesh, axes family, microbatches, stages."""

    pp: int
    mesh: tuple[tuple[str, int], ...]
    """The stage's logical mesh (outer to inner)."""
    family: tuple[str, ...]
    """Role of each mesh axis (B data, Z data with sharded weights, T tensor) and sp/nosp."""
    n_microbatches: int
    recompute: str
    pipeline: Pipeline
    annotations: dict = field(hash=False, compare=False)
    """Per weight: replicate / split(dim, axis)."""

    @property
    def estimate_s(self) -> float:
        return self.pipeline.step_s


def _submesh_sizes(gpus: int, per_node: int) -> list[int]:
    out = [1 << k for k in range(per_node.bit_length()) if (1 << k) <= min(per_node, gpus)]
    out += [n * per_node for n in range(2, gpus // per_node + 1)]
    return [d for d in out if gpus % d == 0]


def logical_meshes(d: int, per_node: int) -> list[tuple[tuple[str, int], ...]]:
    """2-D meshes (a outer, b inner) of d devices, b a power of two no larger than a node."""
    out = []
    b = 2 if d > 1 else 1  # b = 1 is the mesh a = 1, b = d again
    while b <= min(d, per_node):
        if d % b == 0:
            out.append((("a", d // b), ("b", b)))
        b *= 2
    return out


def family_choice(g, fam) -> tuple[int, ...] | None:
    out = []
    for op in g.ops:
        s = [i for i, st in enumerate(op.strategies) if serves(op, st, fam)]
        if not s:
            return None
        out.append(s[0])
    return tuple(out)


def _family_of(g, choice) -> tuple[str, ...]:
    for fam in families(g.mesh, g.n_experts):
        if all(serves(op, op.strategies[c], fam) for op, c in zip(g.ops, choice)):
            return fam
    raise AssertionError("runnable ILP answer outside every family")


def _stage_model(spec: AutoplanSpec, graphs: dict, fam, rc: str, m: int) -> StageModel | None:
    """Linear stage model of a family (interop.StageModel) from three evaluations per graph."""
    hw = spec.hardware
    ch = {k: family_choice(g, fam) for k, g in graphs.items()}
    if any(c is None for c in ch.values()):
        return None

    def ev(key, k, flight):
        return evaluate(Problem(graphs[key], hw, n_blocks=k, n_microbatches=m, recompute=rc, in_flight=flight),
                        ch[key])
    t1, m11 = ev("mid", 1, 1)
    _, m21 = ev("mid", 2, 1)
    _, m12 = ev("mid", 1, 2)
    c = m12 - m11
    b = m21 - m11 - c
    a = m11 - b - c
    tf, mf = ev("first", 1, 1)
    tl, ml = ev("last", 1, 1)
    return StageModel(t1, tf - t1, tl - t1, a, b, c, mf - m11, ml - m11)


def search(spec: AutoplanSpec, progress=None) -> tuple[list[Plan], dict]:
    """Every candidate plan the two levels find, best estimate first, and search statistics."""
    hw, m = spec.hardware, spec.model
    per_node = hw.gpus_per_node
    budget = hw.device.usable_memory_bytes
    plans: list[Plan] = []
    stats = {"ilps": 0, "meshes": 0, "ilp_s": 0.0, "dp_s": 0.0}
    for d in _submesh_sizes(spec.gpus, per_node):
        pp = spec.gpus // d
        if pp > m.n_layers:
            continue
        for axes in logical_meshes(d, per_node):
            stats["meshes"] += 1
            for mb in _microbatches(spec, d, pp):
                sequences = spec.global_batch // mb
                st_base = Setting(m, hw, sequences, spec.seq_len, spec.precision, spec.optimizer,
                                  flash_attention=spec.flash_attention, dropout=spec.dropout)
                graphs = _graphs(st_base, axes, pp)
                for rc in spec.recompute:
                    st = Setting(m, hw, sequences, spec.seq_len, spec.precision, spec.optimizer, rc,
                                 flash_attention=spec.flash_attention, dropout=spec.dropout)
                    gs = graphs if rc == "none" else _graphs(st, axes, pp)
                    plan = _one(spec, gs, pp, mb, rc, budget, stats)
                    if plan is not None:
                        plans.append(plan)
    plans.sort(key=lambda p: p.estimate_s)
    seen, out = set(), []
    for p in plans:  # logical meshes that amount to the same axes (all data-parallel, say) once
        key = (p.n_microbatches, p.recompute, p.pipeline.layers_per_stage,
               str(sorted(to_parallel_table(sharding_from_table(sharding_table(p), FILE), spec.gpus, FILE).items())))
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out, stats


def _microbatches(spec: AutoplanSpec, d: int, pp: int) -> list[int]:
    out = []
    for mb in range(pp, spec.global_batch + 1):
        if spec.global_batch % mb == 0 and spec.global_batch // mb <= spec.max_microbatch_per_gpu * d:
            out.append(mb)
    return out


def _graphs(st: Setting, axes, pp: int) -> dict:
    mesh = Mesh(axes)
    if pp == 1:  # one stage holds both ends: counted once, as "first"
        g = block_graph(st, mesh, first=True, last=True, runnable=True)
        mid = block_graph(st, mesh, runnable=True)
        return {"mid": mid, "first": g, "last": mid, "ilp": g}
    first = block_graph(st, mesh, first=True, runnable=True)
    return {"mid": block_graph(st, mesh, runnable=True), "first": first,
            "last": block_graph(st, mesh, last=True, runnable=True), "ilp": first}


def _one(spec: AutoplanSpec, graphs: dict, pp: int, mb: int, rc: str, budget: float, stats: dict) -> Plan | None:
    m = spec.model
    k0 = -(-m.n_layers // pp)
    t0 = time.perf_counter()
    sol = solve(Problem(graphs["ilp"], spec.hardware, n_blocks=k0, n_microbatches=mb, recompute=rc,
                        in_flight=min(mb, pp), memory_budget=budget, runnable=True))
    stats["ilps"] += 1
    stats["ilp_s"] += time.perf_counter() - t0
    if sol is None:
        return None
    fam = _family_of(graphs["ilp"], sol.choice)
    sm = _stage_model(spec, graphs, fam, rc, mb)
    if sm is None:
        return None
    t1 = time.perf_counter()
    pipe = best_split(sm, m.n_layers, pp, mb, budget)
    stats["dp_s"] += time.perf_counter() - t1
    if pipe is None:
        return None
    g = graphs["ilp"]
    from parsim.autoplan.sharding import annotations_of
    return Plan(pp, g.mesh.axes, fam, mb, rc, pipe, annotations_of(graphs["first"], family_choice(graphs["first"], fam))
                | annotations_of(graphs["last"], family_choice(graphs["last"], fam)))


# ------------------------------------------------------------------------------ scenarios

def sharding_table(plan: Plan) -> dict:
    """The plan's ``[sharding]`` table (pipeline axis outermost, the stage mesh inside it)."""
    mesh = {"pp": plan.pp}
    roles = plan.family[:-1]
    batch, fsdp, tensor = [], [], None
    for (a, n), r in zip(plan.mesh, roles):
        if n == 1:
            continue
        mesh[a] = n
        if r in "BZEY":
            batch.append(a)
        if r in "ZY":
            fsdp.append(a)
        if r == "T":
            tensor = a
    t: dict = {"mesh": mesh, "pipeline": "pp"}
    if batch:
        t["batch"] = batch
    if fsdp:
        t["fsdp"] = fsdp
    if tensor is not None and plan.family[-1] == "sp":
        t["sequence"] = tensor
    w = {k: v for k, v in sorted(plan.annotations.items()) if v != "replicate"}
    if w:
        t["weights"] = w
    return t


def scenario_doc(spec: AutoplanSpec, plan: Plan) -> dict:
    """A scenario document (``parsim.scenario.scenario_from_dict``) running the plan."""
    ref = spec.model_ref
    model = {"hf_config": str(Path(ref).resolve())} if (ref.endswith(".json") or "/" in ref) else {"preset": ref}
    dp = 1
    for (a, n), r in zip(plan.mesh, plan.family[:-1]):
        if r in "BZEY":
            dp *= n
    mbs = spec.global_batch // (plan.n_microbatches * dp)
    return {
        "name": f"{spec.model.name}-autoplan", "hardware": spec.hardware.name, "gpus": spec.gpus, "model": model,
        "training": {"global_batch": spec.global_batch, "seq_len": spec.seq_len, "microbatch_size": mbs,
                     "precision": spec.precision, "optimizer": spec.optimizer, "recompute": plan.recompute,
                     **({} if spec.flash_attention else {"flash_attention": False}),
                     **({} if spec.dropout is None else {"dropout": spec.dropout})},
        "sharding": sharding_table(plan),
        "schedule": {"name": "1F1B", "n_microbatches": plan.n_microbatches,
                     **({"layers_per_stage": list(plan.pipeline.layers_per_stage)} if plan.pp > 1 else {})},
    }


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    return repr(v)


def to_toml(doc: dict, header: str = "") -> str:
    """A scenario document as TOML (tables after the top-level keys; ``mesh`` inline, in order)."""
    lines = [f"# {h}" for h in header.splitlines()] if header else []
    for k, v in doc.items():
        if not isinstance(v, dict):
            lines.append(f"{k} = {_toml_value(v)}")
    for k, v in doc.items():
        if isinstance(v, dict):
            lines += ["", f"[{k}]"]
            subs = {}
            for kk, vv in v.items():
                if isinstance(vv, dict) and kk != "mesh":
                    subs[kk] = vv
                else:
                    lines.append(f"{kk} = {_toml_value(vv)}")
            for kk, vv in subs.items():
                lines += ["", f"[{k}.{kk}]"] + [f"{a} = {_toml_value(b)}" for a, b in vv.items()]
    return "\n".join(lines) + "\n"


@dataclass
class AutoplanResult:
    spec: AutoplanSpec
    best: Plan | None
    metrics: dict | None
    """The simulated metrics of the winner (``parsim simulate --json``'s)."""
    doc: dict | None
    """The winner's scenario document."""
    confirmed: list[tuple[Plan, dict]]
    """(plan, simulated metrics) of every simulated leader, in estimate order."""
    n_plans: int
    stats: dict
    elapsed_s: float


def autoplan(spec: AutoplanSpec) -> AutoplanResult:
    """Search, then confirm the leaders in the engine (module docstring)."""
    from parsim.scenario import scenario_from_dict
    from parsim.simulate import simulate
    t0 = time.perf_counter()
    plans, stats = search(spec)
    confirmed = []
    for i, plan in enumerate(plans):
        # the leaders by the estimate, and past them until one fits (the ILP's memory is an estimate)
        if i >= spec.confirm and (any(mx.get("fits_in_memory") for _, mx in confirmed) or i >= 4 * spec.confirm):
            break
        doc = scenario_doc(spec, plan)
        try:
            res = simulate(scenario_from_dict(doc, FILE))
        except ConfigError as e:  # a plan the engine's rules refuse (reported, not fatal)
            stats.setdefault("refused", []).append(e.problem)
            continue
        confirmed.append((plan, res.to_json()))
    fits = [(p, mx) for p, mx in confirmed if mx.get("fits_in_memory")]
    best = min(fits, key=lambda x: x[1]["step_time_s"]) if fits else None
    return AutoplanResult(spec, best[0] if best else None, best[1] if best else None,
                          scenario_doc(spec, best[0]) if best else None, confirmed, len(plans), stats,
                          time.perf_counter() - t0)


def to_json(res: AutoplanResult) -> dict:
    """``parsim autoplan --json``: ``step_time_s``, ``stages``, ``sharding`` and the search."""
    if res.best is None:
        return {"step_time_s": None, "stages": [], "sharding": None, "plans_considered": res.n_plans}
    p, mx = res.best, res.metrics
    doc = res.doc
    stages = []
    for i, (k, t) in enumerate(zip(p.pipeline.layers_per_stage, p.pipeline.stage_s)):
        sim = mx["stages"][i] if i < len(mx.get("stages", [])) else {}
        stages.append({"stage": i, "layers": k, "submesh": [n for _, n in p.mesh],
                       "devices": [i * _size(p) + j for j in range(_size(p))],
                       "estimated_microbatch_s": t, "busy_s": sim.get("busy_s"),
                       "peak_memory_bytes": sim.get("peak_memory_bytes")})
    return {"step_time_s": mx["step_time_s"], "estimated_step_time_s": p.estimate_s, "stages": stages,
            "sharding": doc["sharding"], "schedule": doc["schedule"], "training": doc["training"],
            "parallel": _parallel(doc), "mfu": mx.get("mfu"), "fits_in_memory": mx.get("fits_in_memory"),
            "peak_memory_bytes": mx.get("peak_memory_bytes"), "plans_considered": res.n_plans,
            "simulated": [{"sharding": sharding_table(q), "recompute": q.recompute, "n_microbatches": q.n_microbatches,
                           "estimated_step_time_s": q.estimate_s, "step_time_s": m2["step_time_s"],
                           "fits_in_memory": m2["fits_in_memory"]} for q, m2 in res.confirmed],
            "ilps_solved": res.stats["ilps"], "search_s": res.elapsed_s}


def _size(p: Plan) -> int:
    out = 1
    for _, n in p.mesh:
        out *= n
    return out


def _parallel(doc: dict) -> dict:
    """The parallel axes the plan's annotations amount to (``parsim.config.sharding``)."""
    par = to_parallel_table(sharding_from_table(doc["sharding"], FILE), doc["gpus"], FILE)
    return {k: v for k, v in par.items() if k != "order"} | {"zero": par.get("zero", 0)}
