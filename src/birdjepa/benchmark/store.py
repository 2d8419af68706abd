"""The results store: a folder of Parquet files, one per result, that `pyarrow.dataset` reads as one table.

A result is keyed by (backbone, task, probe, n, seed); the backbone's identity carries the checkpoint's
step and CRC, so a retrained run is a new key. Its file is named by a hash of the key and written
whole under a temporary name, then renamed, so:
- a second run skips every key whose file exists (`has`), unless it was fitted with another recipe
  (the fields its probe reads: `Recipe.read_by`), which is fitted again and replaced;
- two writers, on one machine or two Slurm nodes over a shared file system, never write the same
  file name half-way: distinct keys are distinct files, and the same key written twice holds the same
  metrics where both wrote on one kind of machine (the scores are deterministic there; on another kind
  the probes' last bits move, as a step's do: each row's ``config`` records ``machine``,
  `birdjepa.train.determinism.machine_kind`) and the last rename wins;
- a writer killed mid-write leaves only a ``.tmp-*`` file, which readers ignore.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from birdjepa.outputs import write_whole

ROWS = "rows"
KEY_FIELDS = ("backbone", "task", "probe", "n", "seed")


@dataclasses.dataclass(frozen=True)
class Key:
    backbone: str
    task: str
    probe: str
    n: int
    seed: int

    def file_name(self) -> str:
        text = json.dumps(dataclasses.astuple(self))
        return hashlib.sha256(text.encode()).hexdigest()[:24] + ".parquet"


SCHEMA = pa.schema(
    [
        ("backbone", pa.string()),
        ("task", pa.string()),
        ("probe", pa.string()),
        ("n", pa.int64()),
        ("seed", pa.int64()),
        ("cmap", pa.float64()),
        ("auroc", pa.float64()),
        ("top1", pa.float64()),
        ("n_train", pa.int64()),
        ("n_test", pa.int64()),
        ("fit_s", pa.float64()),
        ("config", pa.string()),
        ("written_at", pa.string()),
        ("written_by", pa.string()),
    ]
)


def has(results: Path, key: Key, recipe: dict[str, Any] | None = None) -> bool:
    """Whether ``key``'s result is stored, and, given ``recipe``, fitted with those recipe fields."""
    path = results / ROWS / key.file_name()
    if not path.is_file():
        return False
    if not recipe:
        return True
    stored = json.loads(pq.read_table(path, columns=["config"]).column("config")[0].as_py() or "{}")
    return all(stored.get("recipe", {}).get(k, None) == v for k, v in recipe.items())


def put(results: Path, key: Key, metrics: dict[str, float], *, n_train: int, n_test: int, fit_s: float,
        config: dict[str, Any]) -> Path:  # fmt: skip
    """Writes one result (atomically: a temporary file renamed into place)."""
    row = {
        **dataclasses.asdict(key),
        "cmap": metrics["cmap"],
        "auroc": metrics["auroc"],
        "top1": metrics["top1"],
        "n_train": n_train,
        "n_test": n_test,
        "fit_s": fit_s,
        "config": json.dumps(config, sort_keys=True),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "written_by": f"{socket.gethostname()}:{os.getpid()}",
    }
    folder = results / ROWS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / key.file_name()
    tmp = folder / f".tmp-{os.getpid()}-{path.name}"
    write_whole(path, lambda p: pq.write_table(pa.Table.from_pylist([row], schema=SCHEMA), p), partial=tmp)
    return path


def read(results: Path) -> pa.Table:
    """Every result in the store (an empty table when there is none)."""
    folder = results / ROWS
    # Not a writer's hidden `.tmp-*` (pathlib's glob matches dot files): one cut short by a kill locked the
    # store for good, and two processes sharing it failed each other's reads mid-write.
    files = (
        sorted(f for f in folder.glob("*.parquet") if not f.name.startswith(".")) if folder.is_dir() else []
    )
    if not files:
        return SCHEMA.empty_table()
    return pa.concat_tables([_row(f) for f in files])


def _row(path: Path) -> pa.Table:
    """One result file; ValueError naming a file of another tool's (read with the schema, its missing
    columns would be nulls that the tables then fail on) or a damaged one."""
    try:
        missing = [n for n in SCHEMA.names if n not in pq.read_schema(path).names]
        if missing:
            raise ValueError(f"no column {', '.join(missing[:3])}")
        return pq.read_table(path, schema=SCHEMA)
    except (pa.ArrowException, ValueError, OSError) as e:
        raise ValueError(f"{path}: not a result of this store ({e})") from None


def scored_on_other_files(
    results: Path, task: str, files: dict[str, list[str]], data: dict[str, str]
) -> str | None:
    """Where the store holds results of ``task`` scored on other files than ``files`` (split -> shard
    files), or on these files as they were before or read with other targets (``data``: the config's
    ``data``, absent from results stored before it was), one line saying so (None: it holds none): a
    stored result is found by its key, whose task is a name, so another set under the same name would
    get the first set's scores."""

    def real(paths: list[str]) -> list[str]:
        return sorted(os.path.realpath(f) for f in paths)

    for row in (r for r in read(results).to_pylist() if r["task"] == task):
        config = json.loads(row["config"] or "{}")  # null in a store of an older version: a TypeError
        for split, now in files.items():
            then = config.get(split)
            if then is not None and real(then) != real(now):
                was, new = (f"{fs[0]}{', ...' if len(fs) > 1 else ''}" for fs in (then, now))
                return (f"{results}: its results of task {task!r} were scored on other {split} files "
                        f"({was}; now {new}): a result is found by its task's name, so give these files a "
                        "--task of their own, or another --results")  # fmt: skip
        then = config.get("data")
        # What both record: a result stored before a stamp was taken has none to compare.
        differs = sorted(k for k in data if then is not None and k in then and then[k] != data[k])
        if differs:
            what = ("with other targets" if "targets" in differs else
                    "on these files as they were before (their sizes or times differ now)"
                    if differs[0] in ("test", "train") else
                    "on other audio files than its rows name now (replaced, or read under another "
                    "--audio-root)")  # fmt: skip
            return (f"{results}: its results of task {task!r} were scored {what} ({then} against {data}): "
                    "give another --results, or a --task of their own")  # fmt: skip
    return None
