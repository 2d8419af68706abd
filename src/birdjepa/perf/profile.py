"""Where the training step's time goes, from an XLA profile of the compiled step.

JAX's profiler records every operation XLA executed (a CPU thunk, a GPU kernel) with the name of its
HLO instruction; on a CPU an operation runs from its launch to its end mark (`tails`), and each moment
goes to the operations running then (`split_wall`). The compiled module's text gives each
instruction's metadata, the JAX name stack of the code that made it
(``jit(run)/jvp(BirdJepa)/encoder/block_0/attn/...``; the step names its parts with
``jax.named_scope``: ``optimizer``, ``guard``, ``metrics``, ``monitor``, ``record``, ``augment``,
``sigreg``, ``collapse``, and the model's ``noise_floor``), and whether it is or holds a matrix
product. Each operation's share (less what it contains, a cond's branches) goes to the first part
that claims it, in `PARTS` order.
XLA names a fusion after its root alone; a part of the step around the model (`AROUND_THE_MODEL`)
also claims a fusion without a matrix product that holds any operation of its own: the guard's
select, fused into the optimizer's pass over the state as its root, would otherwise take the whole
AdamW update. A copy that no code of the step made is XLA's own (`ADDED_COPY`), a part of its own.

On a GPU, XLA runs most kernels inside command buffers (CUDA graphs), and the profile names the buffer
as their instruction (``command_buffer_12``); the kernel's own name then finds it: XLA names the kernel
of a fusion after it, dots made underscores (``input_reduce_fusion_1175``). A library's kernel (cuBLAS,
cuSOLVER) has the library's name: a matrix product's goes to the matrix products (`LIBRARY_MATMUL`), a
solver's to the collapse diagnostic (`LIBRARY_SOLVER`: the step's only solver calls are its SVDs), any
other to `NOT_ATTRIBUTED`, with whatever else no instruction names (measured on an H200, 2026-11-30:
before the kernels' names were read, three quarters of the small step's kernels went unnamed, all
counted as norms and elementwise).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

#: The name stack given to a copy that no code of the step made (see `ADDED_COPY`).
XLA_COPY = "(a copy XLA adds)"
#: The collapse diagnostic's part (`birdjepa.diagnostics.collapse`), where a solver library's kernel goes.
SOLVER_PART = "collapse diagnostic (SVD)"
#: (part, test on (name stack, holds a matrix product)), the first that matches claims an operation.
PARTS: tuple[tuple[str, Callable[[str, bool], bool]], ...] = (
    ("SIGReg", lambda name, mm: "sigreg" in name),
    ("optimizer update", lambda name, mm: "optimizer" in name),
    ("guard, metrics and monitor", lambda name, mm: any(s in name for s in ("guard", "metrics", "monitor"))),
    ("record conds (off)", lambda name, mm: "record" in name),
    ("augmentation", lambda name, mm: "augment" in name),
    ("input floor (a quantile)", lambda name, mm: "noise_floor" in name),
    ("attention", lambda name, mm: "/attn/" in name and not re.search(r"/attn/(qkv|proj)\b", name)),
    (SOLVER_PART, lambda name, mm: re.search(r"(^|/)collapse/", name) is not None),
    ("matrix products", lambda name, mm: mm),
    ("copies XLA adds", lambda name, mm: name == XLA_COPY),
    ("norms and elementwise", lambda name, mm: True),
)
#: An operation no instruction of the module names (see the module doc): a part of its own, so that what
#: the profile could not place is shown, not counted as another part.
NOT_ATTRIBUTED = "not attributed (a library's kernel, or unnamed)"
#: Every part an operation can go to, in the tables' order.
PART_NAMES = (*(part for part, _ in PARTS), NOT_ATTRIBUTED)
#: A library's matrix-product kernel on a GPU (cuBLAS, cuBLASLt, CUTLASS).
LIBRARY_MATMUL = re.compile(r"gemm|xmma|nvjet|cutlass|cublas", re.IGNORECASE)
#: A solver library's kernel on a GPU (cuSOLVER: the H200 ran ``svd_column_rotate_batch`` and
#: tridiagonal reductions): in the step, only the collapse diagnostic's SVDs call one.
LIBRARY_SOLVER = re.compile(r"svd|syev|sytrd|jacobi|cusolver|tridiag", re.IGNORECASE)
#: The parts that claim a fusion holding any operation of theirs (see the module doc); the model's parts
#: (attention, matrix products, the rest) go by a fusion's root.
AROUND_THE_MODEL = frozenset(part for part, _ in PARTS[: [p for p, _ in PARTS].index("attention")])
MATMUL = re.compile(r"\b(dot|convolution)\(|custom_call_target=\"[^\"]*(gemm|matmul|cublas)", re.IGNORECASE)
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = .*$")
CALLS = re.compile(r"calls=%?([\w.\-]+)")
OP_NAME = re.compile(r'op_name="([^"]*)"')
#: A copy that no code of the step made (no name stack): XLA's, to keep a value that a later operation
#: reads while its buffer is written in place (the donated state: a parameter read after its update).
ADDED_COPY = re.compile(r"[\]}] copy\(")


@dataclasses.dataclass(frozen=True)
class Instruction:
    name_stack: str
    matmul: bool
    inside: tuple[str, ...] = ()
    """The name stacks of the operations a fusion (or call) holds."""
    control_flow: bool = False
    """A conditional or loop: its operations are profiled inside it, so it has no tail (`tails`)."""


CONTROL_FLOW = re.compile(r"[\])}] (conditional|while)\(")


def instructions(hlo_text: str) -> dict[str, Instruction]:
    """Every instruction of a compiled module's text: its name stack, and whether it is a matrix
    product or a fusion (or call) whose computation holds one."""
    bodies: dict[str, list[str]] = {}
    current = ""
    for line in hlo_text.splitlines():
        if line and not line.startswith(" ") and "{" in line:  # a computation's header
            current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
            bodies[current] = []
        elif INSTRUCTION.match(line):
            bodies.setdefault(current, []).append(line)

    holds: dict[str, bool] = {}
    names: dict[str, tuple[str, ...]] = {}

    def names_in(computation: str) -> tuple[str, ...]:
        if computation not in names:
            names[computation] = ()  # a cycle adds nothing twice
            lines = bodies.get(computation, [])
            own = tuple(m.group(1) for x in lines if (m := OP_NAME.search(x)))
            names[computation] = own + tuple(n for x in lines for c in CALLS.findall(x) for n in names_in(c))
        return names[computation]

    def holds_matmul(computation: str) -> bool:
        if computation not in holds:
            holds[computation] = False  # a cycle cannot hold one more than once
            lines = bodies.get(computation, [])
            holds[computation] = any(MATMUL.search(x) for x in lines) or any(
                holds_matmul(c) for x in lines for c in CALLS.findall(x)
            )
        return holds[computation]

    out = {}
    for lines in bodies.values():
        for line in lines:
            name = INSTRUCTION.match(line).group(1)  # type: ignore[union-attr]
            op = OP_NAME.search(line)
            fused = "fusion(" in line or " call(" in line
            matmul = bool(MATMUL.search(line)) or (
                fused and any(holds_matmul(c) for c in CALLS.findall(line))
            )
            inside = tuple(n for c in CALLS.findall(line) for n in names_in(c)) if fused else ()
            stack = op.group(1) if op else XLA_COPY if ADDED_COPY.search(line) else ""
            out[name] = Instruction(stack, matmul, inside, bool(CONTROL_FLOW.search(line)))
    return out


def kernel_names(table: dict[str, Instruction]) -> dict[str, Instruction]:
    """The instructions of ``table`` by the name XLA gives their GPU kernel (dots made underscores),
    where that name is one instruction's alone."""
    by_kernel: dict[str, list[Instruction]] = collections.defaultdict(list)
    for name, instruction in table.items():
        by_kernel[name.replace(".", "_")].append(instruction)
    return {kernel: found[0] for kernel, found in by_kernel.items() if len(found) == 1}


def attribute(table: dict[str, Instruction], kernels: dict[str, Instruction], op: str, kernel: str) -> str:
    """The part of an operation the profile names ``op`` (its ``hlo_op``) and ``kernel`` (its event's
    name): by its instruction, else by its kernel's name (see the module doc)."""
    instruction = table.get(op) or kernels.get(kernel)
    if instruction is not None:
        return part_of(instruction)
    if LIBRARY_MATMUL.search(kernel):
        return "matrix products"
    return SOLVER_PART if LIBRARY_SOLVER.search(kernel) else NOT_ATTRIBUTED


def part_of(instruction: Instruction) -> str:
    i = instruction
    for part, claims in PARTS:
        held = i.inside if part in AROUND_THE_MODEL and not i.matmul else ()
        if any(claims(name, i.matmul) for name in (i.name_stack, *held)):
            return part
    raise AssertionError("the last part claims every operation")


@dataclasses.dataclass(frozen=True)
class Profiled:
    """Where the profiled steps' time went, per step."""

    parts: dict[str, float]
    """Wall seconds of each part of `PARTS`: each moment of the profile split equally among the
    operations running then (`split_wall`), so the parts sum to the time any operation ran."""
    operations_s: float
    """The operations' own times summed (on a CPU, each to its end mark): more than the wall time
    where they ran side by side."""
    wall_s: float


def time_by_part(hlo_text: str, run: Callable[[], None], steps: int) -> Profiled:
    """Where the time of ``run`` (``steps`` executions of the compiled module ``hlo_text``, outputs
    ready) goes, by part of `PARTS`, from a profile of it. XLA runs independent operations at once on
    its thread pool (a CPU) or streams: an operation's own time then stretches while others share its
    cores, so a part that runs beside the matrix products would count their time as its own. Each
    moment is split among the operations running then instead (on a 2-core CPU, 8 threads, the base
    step's AdamW pass held 39 % of the summed operation time, 22-23 % of the wall time split so, and
    takes 16 % of the step's time run alone: `docs/issues/007-step-limit/optimizer_alone.py`)."""
    table = instructions(hlo_text)
    kernels = kernel_names(table)
    module = hlo_text.split(None, 2)[1].rstrip(",")  # "HloModule jit_run, ..."
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            t0 = time.perf_counter()
            run()
            wall = time.perf_counter() - t0
        (path,) = Path(tmp).rglob("*.xplane.pb")
        data = jax.profiler.ProfileData.from_file(str(path))
    timelines: list[list[tuple[float, float, str]]] = []
    parts: dict[tuple[str, str], str] = {}

    def part(name: tuple[str, str]) -> str:
        if name not in parts:
            parts[name] = attribute(table, kernels, *name)
        return parts[name]

    # A GPU's operations are its kernels, on its planes; a CPU's run on the host's threads, where on a GPU
    # only their launches would be (counted beside the kernels, they would take a share of each moment).
    planes = [p for p in data.planes if p.name.startswith("/device:")]
    launches: list[tuple[float, float, tuple[str, str], Any]] = []
    ends: dict[Any, float] = {}
    for plane in planes or [p for p in data.planes if p.name == "/host:CPU"]:
        for line in plane.lines:
            events = []
            for e in line.events:
                stats = dict(e.stats)
                if stats.get("hlo_module") == module and "hlo_op" in stats:
                    name = (str(stats["hlo_op"]), e.name)
                    events.append((e.start_ns / 1e9, e.end_ns / 1e9, name))
                    instruction = table.get(name[0])
                    if "_p" in stats and not (instruction and instruction.control_flow):
                        launches.append((e.start_ns / 1e9, e.end_ns / 1e9, name, stats["_p"]))
                elif e.name.startswith("end: ") and "_c" in stats:
                    ends[stats["_c"]] = e.start_ns / 1e9
            timelines.append([(start, end, part(name)) for start, end, name in segments(events)])
    timelines.append([(start, end, part(name)) for start, end, name in tails(launches, ends)])
    operations = sum(end - start for pieces in timelines for start, end, _ in pieces)
    split = split_wall(timelines)
    return Profiled({part: s / steps for part, s in split.items()}, operations / steps, wall / steps)


def tails(
    launches: list[tuple[float, float, Any, Any]], ends: dict[Any, float]
) -> list[tuple[float, float, Any]]:
    """The time each operation ran after its launch returned: on a CPU, XLA's thunk executor records an
    operation's launch (``dot.48``, its ``_p`` id) and, when its work is done, a mark (``end: dot.48``,
    the same id as ``_c``); a matrix product or a loop split across threads returns at once and goes on
    in the thread pool's tasks, which name no operation. Without its tail, the tiny step's patch-embedding
    gradient left 2-9 ms a step with no operation running (`docs/issues/007-step-limit/README.md`)."""
    return [(end, ends[id_], name) for _, end, name, id_ in launches if ends.get(id_, end) > end]


def segments(events: list[tuple[float, float, Any]]) -> list[tuple[float, float, Any]]:
    """The pieces of one timeline's events where each is the innermost open one: an event's own time
    (its duration less that of the events inside it, a cond's branches) is the sum of its pieces."""
    out: list[tuple[float, float, Any]] = []
    stack: list[tuple[float, Any]] = []  # (end, name) of the events still open, innermost last
    at = -math.inf

    def close_until(t: float) -> None:
        nonlocal at
        while stack and stack[-1][0] <= t:
            end, name = stack.pop()
            if end > at:
                out.append((at, end, name))
                at = end
        if stack and t > at:
            out.append((at, t, stack[-1][1]))
        at = max(at, t)

    for start, end, name in sorted(events, key=lambda e: (e[0], -e[1])):
        close_until(start)
        stack.append((end, name))
    close_until(math.inf)
    return out


def split_wall(timelines: list[list[tuple[float, float, Any]]]) -> dict[Any, float]:
    """Each name's share of the wall time over timelines of pieces (`segments`, `tails`): every moment
    split equally among the pieces running then, on any timeline."""
    edges = sorted(
        (t, opens, i, k)
        for i, pieces in enumerate(timelines)
        for k, (start, end, _) in enumerate(pieces)
        if end > start
        for t, opens in ((start, True), (end, False))
    )
    shares: dict[Any, float] = collections.Counter()
    running: set[tuple[int, int]] = set()
    last = 0.0
    for t, opens, i, k in edges:
        if running and t > last:
            each = (t - last) / len(running)
            for j, m in running:
                shares[timelines[j][m][2]] += each
        last = t
        (running.add if opens else running.discard)((i, k))
    return dict(shares)
