"""A trace on disk: one zip file (readable with ``np.load``) of a JSON manifest and one ``.npy`` per tensor.

The manifest keeps the order the step computes things in: ``entries`` lists every tensor as
``{"stage", "name", "file", "shape", "dtype", "crc32"}`` in that order, beside the run, the step, the
resolved config and how the step was re-executed. Every zip member has a fixed timestamp and the
manifest holds no wall-clock time, so the same step traced twice gives the same bytes. bfloat16 and
PRNG keys are stored as their bits (uint16 / uint32), with the real dtype in the manifest.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa.train.checkpoint import leaf_hash

MANIFEST = "manifest.json"
FORMAT = 1
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest date: no wall clock in the file


class TraceFileError(ValueError):
    """A file is not a readable trace."""


@dataclasses.dataclass(frozen=True)
class Entry:
    stage: str
    name: str
    array: np.ndarray

    @property
    def key(self) -> str:
        return f"{self.stage}/{self.name}"


@dataclasses.dataclass
class Trace:
    manifest: dict[str, Any]
    """Run, step, config, how it was re-executed (no tensors)."""
    entries: list[Entry] = dataclasses.field(default_factory=list)

    def add(self, stage: str, name: str, value: Any) -> None:
        self.entries.append(Entry(stage, name, np.asarray(value)))

    def stages(self) -> list[str]:
        return list(dict.fromkeys(e.stage for e in self.entries))

    def by_key(self) -> dict[str, Entry]:
        return {e.key: e for e in self.entries}


def _stored(a: np.ndarray) -> tuple[np.ndarray, str]:
    """The array as ``np.save`` can write it, and its real dtype's name."""
    name = a.dtype.name
    if a.dtype.kind == "V" or name == "bfloat16":  # ml_dtypes types: store the bits
        return a.view(np.uint16 if a.dtype.itemsize == 2 else np.uint8), name
    return a, name


def _restored(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        import ml_dtypes

        return a.view(ml_dtypes.bfloat16)
    return a


def write(trace: Trace, path: Path) -> None:
    """Write ``trace`` to ``path`` (replaced atomically)."""
    path = Path(path)
    rows = []
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for i, e in enumerate(trace.entries):
            stored, dtype = _stored(np.ascontiguousarray(e.array))
            buf = io.BytesIO()
            np.lib.format.write_array(buf, stored, allow_pickle=False)
            member = f"{i:05d}.npy"
            z.writestr(zipfile.ZipInfo(member, _EPOCH), buf.getvalue())
            rows.append({"stage": e.stage, "name": e.name, "file": member, "shape": list(e.array.shape),
                         "dtype": dtype, "crc32": leaf_hash(stored)})  # fmt: skip
        manifest = {"format": FORMAT, **trace.manifest, "entries": rows}
        z.writestr(zipfile.ZipInfo(MANIFEST, _EPOCH), json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


def read(path: Path) -> Trace:
    """The trace in ``path``; `TraceFileError` (naming the file) if it is not one."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read(MANIFEST))
            trace = Trace({k: v for k, v in manifest.items() if k != "entries"})
            for row in manifest["entries"]:
                with z.open(row["file"]) as f:
                    a = np.lib.format.read_array(f, allow_pickle=False)
                trace.entries.append(Entry(row["stage"], row["name"], _restored(a, row["dtype"])))
    except FileNotFoundError:
        raise TraceFileError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, ValueError) as e:
        raise TraceFileError(f"{path}: not a birdjepa trace ({type(e).__name__}: {e})") from None
    return trace
