"""The results store as tables: its rows per (task, backbone, probe, n) over seeds, and its tasks as
columns (`birdjepa benchmark --table`, the benchmark notebook)."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa.benchmark import fewshot, store
from birdjepa.benchmark.recipe import Recipe


class BenchmarkError(RuntimeError):
    """Bad options or data: said in one line, exit 2."""


def stored_results(table: Path) -> list[dict[str, Any]]:
    """The results of store ``table`` (`birdjepa benchmark --table`, the benchmark notebook), or a
    `BenchmarkError` where no table can be made of them: no store (a typo printed an empty table), no
    results yet, or seeds of one cell fitted with two recipes (their mean mixes them)."""
    if not (table / store.ROWS).is_dir():
        raise BenchmarkError(f"{table}: no results store (no {store.ROWS}/ folder in it)")
    rows = store.read(table).to_pylist()
    if not rows:  # the headers alone, then --plot's traceback
        raise BenchmarkError(f"{table}: the store holds no results yet")
    if (mixed := mixed_recipes(rows)) is not None:
        raise BenchmarkError(f"{table}: {mixed}")
    return rows


def format_table(rows: list[dict], metrics: tuple[str, ...] = ("cmap", "auroc", "top1")) -> str:
    """One line per (task, backbone, probe, n): each metric's mean over seeds (± half the spread,
    (max - min) / 2, when there are several)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["backbone"], r["probe"], r["n"])].append(r)
    head = ["task", "backbone", "probe", "n", *metrics, "seeds"]
    lines = [head]
    # "all" (n = -1) sorts after every n.
    order = sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3] if k[3] != fewshot.ALL else 1 << 62))
    for task, backbone, probe, n in order:
        rs = groups[(task, backbone, probe, n)]
        cells = []
        for m in metrics:
            v = np.array([r[m] for r in rs], float)
            cells.append(f"{v.mean():.3f}" + (f" ±{(v.max() - v.min()) / 2:.3f}" if len(v) > 1 else ""))
        lines.append([task, backbone, probe, "all" if n == fewshot.ALL else str(n), *cells, str(len(rs))])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines)


def mixed_recipes(rows: list[dict]) -> str | None:
    """Where a cell of the store's table (backbone, task, probe, n) holds seeds fitted with other recipes
    (a `--probe-steps` or `--loss` changed between two runs into one store, each replacing only its own
    seeds' rows), what differs (None: nothing): the table averaged them as seeds of one recipe."""
    cells: dict[tuple, list[tuple[int, dict]]] = defaultdict(list)
    for r in rows:
        recipe = json.loads(r["config"] or "{}").get("recipe", {})
        read = Recipe().read_by(r["probe"])  # a field the probe never reads refused a store it cannot mend
        recipe = {k: v for k, v in recipe.items() if k in read}
        cells[(r["backbone"], r["task"], r["probe"], r["n"])].append((r["seed"], recipe))
    for (backbone, task, probe, n), fits in sorted(cells.items(), key=str):
        (seed, first), *rest = sorted(fits, key=lambda f: f[0])
        other = next(((s, r) for s, r in rest if r != first), None)
        if other is not None:
            keys = sorted(k for k in {*first, *other[1]} if first.get(k) != other[1].get(k))
            said = [", ".join(f"{k} {r.get(k)}" for k in keys) for r in (other[1], first)]
            where = f"({backbone}, {task}, {probe}, n = {'all' if n == fewshot.ALL else n})"
            return (f"{where}: seed {other[0]} fitted with {said[0]}, seed {seed} with {said[1]}: their mean "
                    "would mix two recipes; fit them again with one (the benchmark with the same options), "
                    "or keep each recipe in a --results of its own")  # fmt: skip
    return None


def format_store(rows: list[dict], metric: str = "cmap") -> str:
    """The store as tasks (columns) by backbone, probe and n (rows): ``metric``'s mean over seeds."""
    if metric not in ("cmap", "auroc", "top1"):
        raise BenchmarkError(f"--metric is cmap, auroc or top1, got {metric!r}")
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r["backbone"], r["probe"], r["n"])][r["task"]].append(r[metric])
    tasks = sorted({r["task"] for r in rows})
    mean = ["mean"] if len(tasks) > 1 else []
    lines = [["backbone", "probe", "n", *tasks, *mean]]
    for backbone, probe, n in sorted(
        cells, key=lambda k: (natural(k[0]), k[1], k[2] if k[2] != fewshot.ALL else 1 << 62)
    ):
        by_task = cells[(backbone, probe, n)]
        values = [f"{np.mean(by_task[t]):.3f}" if t in by_task else "-" for t in tasks]
        if mean:  # over the tasks, where every task has the row
            values.append(
                f"{np.mean([np.mean(by_task[t]) for t in tasks]):.3f}" if len(by_task) == len(tasks) else "-"
            )
        lines.append([backbone, probe, "all" if n == fewshot.ALL else str(n), *values])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    title = f"{metric}, mean over seeds" + (" (mean: over the tasks)" if mean else "")
    return (
        title
        + "\n"
        + "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines)
    )


def natural(name: str) -> list[int | str]:
    """``name`` as a sort key whose runs of digits compare as numbers: run:r@34 before run:r@100 (as
    strings, a checkpoint sweep listed step 1000 before step 500)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]
