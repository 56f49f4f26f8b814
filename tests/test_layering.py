"""The package's layering (DESIGN.md §2): folders are concepts along the data flow; a module
imports its own folder and lower layers only, and there are no import cycles between
files or between folders. Imports are read from the source (function-level ones too)."""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "parsim"

# bottom up; a room may import its own folder and any room of a lower layer
LAYERS = [
    {"errors", "units", "files"},
    {"model", "cluster", "schedule"},
    {"config"},
    {"sim"},
    {"costs"},
    {"results", "scenario", "calibrate"},
    {"simulate", "federated"},
    {"parsim", "plan", "report", "frameworks", "infer", "autoplan", "goodput", "uncertainty"},   # "parsim": the public API in parsim/__init__.py
    {"validate"},
    {"cli"},
    {"__main__"},
]
LAYER_OF = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts).removesuffix(".__init__")] = p
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                while t and t not in modules:  # `import parsim.x.y` of a package attribute
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    graph[mod].add(t)
    return graph


def room(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "parsim"


MODULES = _modules()
GRAPH = _imports(MODULES)


def test_every_room_has_a_layer():
    rooms = {room(m) for m in MODULES}
    assert rooms - set(LAYER_OF) == set(), "a new top-level module or folder needs a place in LAYERS"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_point_down(mod):
    here = room(mod)
    bad = [t for t in sorted(GRAPH[mod]) if room(t) != here and LAYER_OF[room(t)] >= LAYER_OF[here]]
    assert not bad, f"{mod} (layer {LAYER_OF[here]}) imports {bad}: same or higher layer"


def test_no_cycle_between_files():
    # a package's __init__ re-exporting its own modules is not a cycle of the design: drop
    # the edges from a module to its own package's __init__
    g = {m: {t for t in deps if not m.startswith(t + ".")} for m, deps in GRAPH.items()}
    graphlib.TopologicalSorter(g).prepare()  # raises CycleError naming the cycle


def test_no_cycle_between_folders():
    g: dict[str, set[str]] = {}
    for m, deps in GRAPH.items():
        g.setdefault(room(m), set()).update(room(t) for t in deps if room(t) != room(m))
    graphlib.TopologicalSorter(g).prepare()


def test_layering_test_sees_a_violation(tmp_path):
    """The checker itself: an upward import is found."""
    pkg = tmp_path / "parsim"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "model" / "__init__.py").write_text("")
    (pkg / "model" / "spec.py").write_text("from parsim.cli.main import main\n")
    (pkg / "cli").mkdir()
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "main.py").write_text("from parsim.model.spec import x\n")
    global PKG
    old, PKG = PKG, pkg
    try:
        g = _imports(_modules())
    finally:
        PKG = old
    assert "parsim.cli.main" in g["parsim.model.spec"]
    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter(g).prepare()
