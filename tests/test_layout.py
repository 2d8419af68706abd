"""The house, read from the code's own imports: every import points down.

Python: the package's folders (and top-level modules) form floors, listed top first in `FLOORS`; a
module imports only from its own floor or below, no two modules import each other through any chain,
and no module is over 600 lines. Rust: no circle among the core crate's top-level modules
(``use crate::x`` / ``crate::x::``). No JAX is imported; the files are read as text.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "birdjepa"
RUST_CORE = ROOT / "rust" / "core" / "src"

#: Top floor first. A module may import from its own floor and every floor below it.
FLOORS = (
    "cli",
    "analysis",
    "pretrain",
    "divergence",
    "benchmark",
    "slurm",
    "export",
    "evaluation",
    "resume",
    "train",
    "multihost",
    "validation",
    "config",
    "diagnostics",
    "model",
    "data",
    "faults",
    "exit_codes",
    "_rs",
)
MAX_LINES = 600
EXTENSION = "birdjepa._rs"  # the Rust extension: no .py file, the bottom floor


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The birdjepa modules ``path`` imports anywhere (in functions and under TYPE_CHECKING too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("birdjepa"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("birdjepa"):
            for a in node.names:  # `from birdjepa.train import checkpoint` names a module
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in known | {EXTENSION} else node.module)
    return {m for m in out if m in known | {EXTENSION}}


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 else 0


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {m: imports(p, known) - {m} for m, p in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_python_import_points_down_and_no_module_is_too_long() -> None:
    edges = graph()
    assert "birdjepa.pretrain.loop" in edges and "birdjepa.train.step" in edges  # the walk found the tree
    unplaced = sorted({m.split(".")[1] for m in edges if "." in m} - set(FLOORS))
    assert not unplaced, f"give these a floor in FLOORS: {unplaced}"
    up = [
        f"{a} -> {b}" for a, targets in sorted(edges.items()) for b in sorted(targets) if floor(b) < floor(a)
    ]
    assert not up, "imports that run back up:\n" + "\n".join(up)
    assert not cycles(edges)
    long = {m: n for m, p in modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_rust_core_has_no_circle_among_its_top_level_modules() -> None:
    edges: dict[str, set[str]] = {}
    for path in sorted(RUST_CORE.rglob("*.rs")):
        rel = path.relative_to(RUST_CORE).with_suffix("").parts
        top = rel[0]
        if top in ("lib", "main"):
            continue
        used = set(re.findall(r"\bcrate::(\w+)", path.read_text()))
        used |= {name for group in re.findall(r"\bcrate::\{([^}]*)\}", path.read_text())
                 for name in re.findall(r"(\w+)", group)}  # fmt: skip
        edges.setdefault(top, set()).update(used - {top})
    assert {"loader", "dataset", "options", "audio"} <= set(edges)
    assert not cycles(edges), f"circles: {cycles(edges)}"


def test_the_checker_sees_a_circle_and_an_import_that_runs_up() -> None:
    """The rules above on a made-up graph, so a green run means the tree obeys them."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert floor("birdjepa.train.step") > floor("birdjepa.pretrain.loop")
