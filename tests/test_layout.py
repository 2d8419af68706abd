"""The house, read from the code's own imports: every import points down.

Python: the package's folders (and top-level modules) form floors, listed top first in `FLOORS`; a
module imports only from its own floor or below, no two modules import each other through any chain,
and no module is over 600 lines. Rust: no circle among the core crate's top-level modules
(``use crate::x`` / ``crate::x::``). The files are read as text; one test imports the modules that
must load without JAX, in a process of its own. The layout is described once, in docs/design.md's
"Layout", and one test holds that description to the tree.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "birdjepa"
RUST_CORE = ROOT / "rust" / "core" / "src"
DESIGN = ROOT / "docs" / "design.md"

#: Top floor first. A module may import from its own floor and every floor below it.
FLOORS = (
    "cli",
    "verify",
    "sweep",
    "analysis",
    "pretrain",
    "perf",
    "divergence",
    "benchmark",
    "slurm",
    "export",
    "evaluation",
    "resume",
    "train",
    "rundir",
    "multihost",
    "validation",
    "config",
    "objectives",
    "diagnostics",
    "model",
    "synthetic",
    "data",
    "reductions",
    "seams",
    "exit_codes",
    "outputs",
    "children",
    "host_memory",
    "cores",
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
            for a in node.names:  # `from birdjepa.rundir import checkpoint` names a module
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


def layout_entries(indent: str) -> dict[str, str]:
    """The entries of docs/design.md's layout tree whose name starts after ``indent``: name -> its
    description (the rest of its line and the deeper-indented lines under it)."""
    section = DESIGN.read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    tree = section.split("```\n", 1)[1].split("\n```", 1)[0]
    found = re.findall(rf"^{indent}([\w/]+?)(?:/|\.py)? +(.*(?:\n {{4,}}.*)*)", tree, flags=re.M)
    return dict(found)


def test_the_layout_in_the_design_names_every_floor_top_first_and_every_module() -> None:
    """docs/design.md describes the layout once: its tree lists the package's floors in the order of
    `FLOORS`, each a folder or module that exists, every module of a folder named in its description,
    and every top-level module of the Rust core."""
    floors = layout_entries("  ")  # the package's entries, two spaces in
    assert list(floors) == list(FLOORS), "the layout's floors, top first, are FLOORS"
    unnamed = []
    for name, said in floors.items():
        folder = PACKAGE / name
        if name == EXTENSION.split(".")[-1]:
            assert (PACKAGE / f"{name}.pyi").is_file()  # the extension's stub
        elif folder.is_dir():
            words = set(re.findall(r"\w+", said))
            stems = sorted({p.stem for p in folder.rglob("*.py")} - {"__init__"})
            unnamed += [f"{name}/{stem}" for stem in stems if stem not in words]
        else:
            assert (PACKAGE / f"{name}.py").is_file(), f"the layout names {name}, which does not exist"
    rust = set(re.findall(r"\w+", layout_entries("")["rust/core"]))
    unnamed += [
        f"rust/core/src/{p.stem}" for p in sorted(RUST_CORE.glob("*")) if p.stem not in rust | {"lib", "main"}
    ]
    assert not unnamed, f"modules the layout in docs/design.md does not name: {unnamed}"


def test_the_checker_sees_a_circle_and_an_import_that_runs_up() -> None:
    """The rules above on a made-up graph, so a green run means the tree obeys them."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert floor("birdjepa.train.step") > floor("birdjepa.pretrain.loop")


def test_the_options_and_their_checks_import_no_jax() -> None:
    """`birdjepa sweep` checks a sweep file's options before anything trains: config, validation, the
    verification wing's plants and faults (which the command registers first) and the exit codes load
    without JAX (seconds of import on a login node)."""
    code = (
        "import sys, birdjepa.config, birdjepa.validation, birdjepa.verify, birdjepa.exit_codes; "
        "print(sorted(m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_every_exit_code_is_spelled_once_in_exit_codes() -> None:
    """No command exits with a number written in place: `SystemExit(2)` elsewhere would be a second
    definition of what 2 means (a message, `SystemExit("...")`, exits `FAILED`)."""
    literal = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "exit_codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "SystemExit",
                "exit",
                "_exit",
            ):
                codes = [x for x in node.args if not isinstance(x, ast.JoinedStr)]  # not a message's numbers
                ints = [
                    a
                    for x in codes
                    for a in ast.walk(x)
                    if isinstance(a, ast.Constant) and type(a.value) is int
                ]
                literal += [f"{path.relative_to(PACKAGE)}:{node.lineno}" for a in ints if a.value != 0]
    assert not literal, literal
