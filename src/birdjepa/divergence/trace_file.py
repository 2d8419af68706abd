"""A trace on disk: one zip file (readable with ``np.load``) of a JSON manifest and one ``.npy`` per
tensor kept whole.

The manifest keeps the order the step computes things in: ``entries`` lists every tensor as
``{"stage", "name", "shape", "dtype", "digest", "stats"}`` in that order (`birdjepa.train.digest`),
with ``"file"`` where the tensor itself is stored, beside the run, the step, the resolved config and
how the step was re-executed. Every zip member has a fixed timestamp and the manifest holds no
wall-clock time, so the same step traced twice gives the same bytes. bfloat16 and PRNG keys are stored
as their bits (uint16 / uint32), with the real dtype in the manifest.
"""

from __future__ import annotations

import dataclasses
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa import exit_codes

MANIFEST = "manifest.json"
FORMAT = 2  # 1: every tensor whole, with a CRC-32 (birdjepa before digests)
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the zip format's earliest date: no wall clock in the file


class TraceFileError(ValueError):
    """A file is not a readable trace."""


@dataclasses.dataclass(frozen=True)
class Entry:
    stage: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    digest: str
    """16 hex digits (`birdjepa.train.digest`): equal exactly when the bits are."""
    stats: tuple[float, ...]
    """`birdjepa.train.digest.STATS`."""
    array: np.ndarray | None = None
    """The tensor, where it was kept whole (``--keep``, or small)."""

    @property
    def key(self) -> str:
        return f"{self.stage}/{self.name}"


@dataclasses.dataclass
class Trace:
    manifest: dict[str, Any]
    """Run, step, config, how it was re-executed (no tensors)."""
    entries: list[Entry] = dataclasses.field(default_factory=list)

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
    tmp = path.with_name(path.name + ".tmp")
    try:
        _write_zip(trace, tmp)
    except BaseException:  # a SIGTERM (`Terminated`) or a full disk mid-write: no half file left beside it
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)


def _write_zip(trace: Trace, tmp: Path) -> None:
    rows = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for i, e in enumerate(trace.entries):
            row = {"stage": e.stage, "name": e.name, "shape": list(e.shape), "dtype": e.dtype,
                   "digest": e.digest, "stats": list(e.stats)}  # fmt: skip
            if e.array is not None:
                stored, _ = _stored(np.ascontiguousarray(e.array))
                buf = io.BytesIO()
                np.lib.format.write_array(buf, stored, allow_pickle=False)
                row["file"] = f"{i:05d}.npy"
                z.writestr(zipfile.ZipInfo(row["file"], _EPOCH), buf.getvalue())
            rows.append(row)
        manifest = {"format": FORMAT, **trace.manifest, "entries": rows}
        z.writestr(zipfile.ZipInfo(MANIFEST, _EPOCH), json.dumps(manifest, indent=1, sort_keys=False) + "\n")


def traced(returncode: int, path: Path) -> bool:
    """Whether a `birdjepa trace` process that exited ``returncode`` wrote its trace to ``path``: exit 0,
    or exit 1 with the file (the step's outputs differ from the run's: an answer, not a failure)."""
    return returncode == 0 or (returncode == exit_codes.FAILED and is_trace(path))


def is_trace(path: Path) -> bool:
    """Whether ``path`` holds a trace (a zip with its manifest), without reading it."""
    try:
        with zipfile.ZipFile(path) as z:
            return MANIFEST in z.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def traced_run(path: Path) -> str | None:
    """The run folder the trace in ``path`` re-executed, as it was given (None: no trace there)."""
    try:
        with zipfile.ZipFile(path) as z:
            return json.loads(z.read(MANIFEST)).get("run")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def read(path: Path) -> Trace:
    """The trace in ``path``; `TraceFileError` (naming the file) if it is not one."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as z:
            manifest = json.loads(z.read(MANIFEST))
            if manifest.get("format") != FORMAT:
                raise TraceFileError(f"{path}: trace format {manifest.get('format')}, this birdjepa reads "
                                     f"format {FORMAT}: trace the step again")  # fmt: skip
            trace = Trace({k: v for k, v in manifest.items() if k != "entries"})
            for row in manifest["entries"]:
                a = None
                if "file" in row:
                    with z.open(row["file"]) as f:
                        a = _restored(np.lib.format.read_array(f, allow_pickle=False), row["dtype"])
                trace.entries.append(Entry(row["stage"], row["name"], tuple(row["shape"]), row["dtype"],
                                           row["digest"], tuple(row["stats"]), a))  # fmt: skip
    except TraceFileError:
        raise
    except FileNotFoundError:
        raise TraceFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceFileError(f"{path}: a folder, not a trace file") from None
    except OSError as e:
        raise TraceFileError(f"{path}: cannot be read ({e.strerror or e})") from None
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, ValueError) as e:
        raise TraceFileError(f"{path}: not a birdjepa trace ({type(e).__name__}: {e})") from None
    return trace
