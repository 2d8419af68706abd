"""The frozen-encoder evaluation table: each feature set scored by the linear probe and kNN.

Rows are named feature sets: ``encoder`` (the checkpoint being judged), ``random_init`` (the same
architecture and seed, untrained) and ``raw`` (per-clip log-mel mean and std, nothing learned). Logged
metrics follow the design's names: ``eval/linear_acc``, ``eval/knn_acc`` (and ``…_macro_acc``) for the
encoder, with ``_random_init`` and ``_raw`` appended for the baselines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa.data import DataError, Features
from birdjepa.data.row_columns import MULTILABEL_COLUMN, SAME_LENGTH_S, several_species, window_lengths
from birdjepa.data.shards import read_shard, shard_recording_ids
from birdjepa.evaluation import single_label_probes as probes
from birdjepa.evaluation.embed import RAW, Split
from birdjepa.outputs import write_whole
from birdjepa.rundir import layout
from birdjepa.train.determinism import machine_kind

ENCODER, RANDOM_INIT = "encoder", "random_init"
ROW_TITLES = {ENCODER: "encoder", RANDOM_INIT: "random init", RAW: "raw log-mel mean+std"}
PROTOCOL = {
    "crop": (
        "one crop per recording (eval-mode loader): its window's start where the row has one "
        "(start_time, end_time), else its centre; no crop averaging"
    ),
    "linear": (
        f"multinomial logistic regression (scikit-learn L-BFGS, tol {probes.TOL}) on features standardised "
        f"with train statistics; L2 strength C from {list(probes.L2_GRID)} chosen by stratified "
        f"{probes.FOLDS}-fold cross-validation on the train split, then refit on all of it"
    ),
    "knn": (
        f"cosine similarity of standardised features, k={probes.KNN_K}, votes weighted "
        f"exp(similarity / {probes.KNN_TEMPERATURE})"
    ),
    "macro": "mean over classes present in the eval split of per-class recall",
}


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    dim: int
    knn_acc: float
    knn_macro_acc: float
    linear_acc: float | None = None
    linear_macro_acc: float | None = None
    linear: dict[str, Any] | None = None
    """The linear probe's details (chosen C, validation accuracies, iterations, train accuracy)."""


class UnusableSplits(ValueError):
    """Splits the probes cannot score (`unusable`)."""


def unusable(train: Split, held_out: Split, files: tuple[Sequence[str], Sequence[str]]) -> str | None:
    """Why the embedded splits give the probes nothing to score (None: they do): a split without a
    labelled clip it could read, or a train split of one class (every row 1/C, 'converged' with 0
    iterations)."""

    def split(where: Sequence[str]) -> str:  # a split of hundreds of shards: its first, and a count
        return f"{where[0]}{f' and {len(where) - 1} more' if len(where) > 1 else ''}"

    for name, embedded, where in (("train", train, files[0]), ("eval", held_out, files[1])):
        if len(embedded.labels) == 0:
            return f"the {name} split ({split(where)}) has no labelled clip"
    if len(np.unique(train.labels)) < 2:
        one = "holds clips of one class: a probe has nothing to tell apart"
        return f"the train split ({split(files[0])}) {one}"
    return None


def score(train: Split, held_out: Split, *, linear: bool, seed: int = 0) -> dict[str, Row]:
    """Every feature set the two splits share, scored on ``held_out`` (kNN always, the linear probe
    when ``linear``)."""
    rows = {}
    for name, x in train.features.items():
        y = held_out.features[name]
        nn = probes.knn(x, train.labels, y, held_out.labels)
        row = Row(name, int(x.shape[1]), nn.acc, nn.macro_acc)
        if linear:
            lp = probes.linear_probe(x, train.labels, y, held_out.labels, seed=seed)
            row = dataclasses.replace(
                row, linear_acc=lp.acc, linear_macro_acc=lp.macro_acc, linear=lp.details
            )
        rows[name] = row
    return rows


def metrics(rows: dict[str, Row]) -> dict[str, float]:
    """``eval/…`` metrics of the rows: the encoder unsuffixed, the baselines with their name appended."""
    out = {}
    for name, row in rows.items():
        suffix = "" if name == ENCODER else f"_{name}"
        for field in ("knn_acc", "knn_macro_acc", "linear_acc", "linear_macro_acc"):
            if (value := getattr(row, field)) is not None:
                out[f"eval/{field}{suffix}"] = value
    return out


def chance(train_labels: np.ndarray, eval_labels: np.ndarray) -> float:
    """The eval accuracy of guessing the train split's most common class for every clip (of tied ones,
    their mean): what a probe that learned nothing from the features scores. 1 / classes on a balanced set;
    on an unbalanced one (real recordings are), more, where 1 / classes made such a probe look better."""
    if len(train_labels) == 0 or len(eval_labels) == 0:
        return 0.0
    counts = np.bincount(train_labels)
    common = np.flatnonzero(counts == counts.max())
    return float(np.mean([np.mean(eval_labels == c) for c in common]))


def info(
    run_dir: Path,
    step: int,
    seed: int,
    model: Any,
    files: tuple[list[str], list[str]],
    splits: tuple[Split, Split],
    n_classes: int,
) -> dict[str, Any]:
    """What an evaluation document says besides its rows: which checkpoint, model and data, and the kind
    of machine that scored them (a probe's last bits follow it, as a step's do)."""
    (train_files, eval_files), (train, held_out) = files, splits
    return {
        "run": str(run_dir),
        "step": step,
        "checkpoint": str(layout.checkpoint(run_dir, step)),
        "seed": seed,
        "machine": machine_kind(),
        "model": dataclasses.asdict(model),
        "data": {
            "train": train_files,
            "eval": eval_files,
            "n_train": len(train.labels),
            "n_eval": len(held_out.labels),
            "unlabelled_skipped": train.skipped_unlabelled + held_out.skipped_unlabelled,
            "n_classes": n_classes,
            "chance": chance(train.labels, held_out.labels),
            "overlap": overlap(files, (train.fingerprint, held_out.fingerprint)),
        },
    }


def overlap(files: tuple[Sequence[str], Sequence[str]], fingerprints: tuple[str, str]) -> str | None:
    """Why the eval split is not held out from the train split (``files`` and ``fingerprints`` of both),
    or None: they share a shard file, or hold the same data under other names."""
    train, held_out = ({os.path.realpath(f) for f in split} for split in files)
    shared = sorted(train & held_out)
    if shared:
        more = f" and {len(shared) - 1} more" if len(shared) > 1 else ""
        return (f"the train and eval splits share the shard {shared[0]}{more}: the eval scores are not "
                "held out")  # fmt: skip
    copied = same_bytes(*files)
    if copied is not None:
        return (f"the eval shard {copied[1]} holds the bytes of the train shard {copied[0]}: the eval scores "
                "are not held out")  # fmt: skip
    if fingerprints[0] and fingerprints[0] == fingerprints[1]:
        return (f"the train and eval splits hold the same data (fingerprint {fingerprints[0]}): the eval "
                "scores are not held out")  # fmt: skip
    both = shared_recordings(*files)
    if both:
        return (f"{len(both)} recordings are in the train and the eval split (recording_id and audio, e.g. "
                f"{sorted(both)[0]}): the eval scores are not held out")  # fmt: skip
    return None


def shared_recordings(train: Sequence[str], held_out: Sequence[str], checked: int = 64) -> set[str]:
    """The recording ids both splits hold with the same audio (rows repacked into other shards, which no
    shard or byte check sees; it scored 1.000 unsaid); empty where a split's shards have no
    ``recording_id`` column. An id is a path relative to the folder `prepare` read: two splits that each
    number their files (``aaa/0001.wav``) share ids, not recordings, and were called not held out. The
    audio (its bytes, or the path a row reads it from) of the first ``checked`` shared ids decides."""
    where: list[dict[str, tuple[str, int]]] = []
    for files in (train, held_out):
        found: dict[str, tuple[str, int]] = {}
        for f in files:
            try:
                column = shard_recording_ids(Path(f))
            except (OSError, DataError):  # a path that is no shard: the loader says so
                return set()
            if column is None:
                return set()
            found.update((x, (f, r)) for r, x in enumerate(column) if x)
        where.append(found)
    both = sorted(where[0].keys() & where[1].keys())
    tables: dict[str, Any] = {}

    def audio(shard: str, row: int) -> Any:  # as the loader reads it: its bytes, or the path they're at
        table = tables.setdefault(shard, read_shard(Path(shard)))
        if "audio" not in table.schema.names:
            return None
        value = table.column("audio")[row].as_py()
        return (value.get("bytes") or value.get("path")) if isinstance(value, dict) else value

    same = [i for i in both[:checked] if audio(*where[0][i]) == audio(*where[1][i])]
    return set(both) if same else set()


def same_bytes(train: Sequence[str], held_out: Sequence[str]) -> tuple[str, str] | None:
    """A train shard and an eval shard with the same bytes under other names (a shard copied into the
    eval folder), or None. Only shards of equal size are read, and only their first and last MiB, which
    hold their first and last record batches: shards of other recordings differ there."""

    def size(f: str) -> int | None:
        try:
            return os.path.getsize(f)
        except OSError:  # a path that is no file: nothing to compare
            return None

    def ends(f: str, n: int) -> bytes:
        with open(f, "rb") as fh:
            head = fh.read(1 << 20)
            fh.seek(max(0, n - (1 << 20)))
            return hashlib.sha256(head + fh.read()).digest()

    by_size: dict[int, list[str]] = {}
    for f in train:
        if (n := size(f)) is not None:
            by_size.setdefault(n, []).append(f)
    for g in held_out:
        n = size(g)
        for f in by_size.get(n, []) if n is not None else []:
            if ends(f, n) == ends(g, n):
                return f, g
    return None


def _cell(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def table(rows: dict[str, Row], *, encoder_title: str = "encoder", overlap: str | None = None) -> str:
    """A plain-text table, one line per row, encoder first; marked NOT HELD OUT above its header when
    the splits ``overlap`` (`overlap`)."""
    titles = {**ROW_TITLES, ENCODER: encoder_title}
    order = [n for n in (ENCODER, RANDOM_INIT, RAW) if n in rows] + [
        n for n in rows if n not in (ENCODER, RANDOM_INIT, RAW)
    ]
    width = max(len(titles.get(n, n)) for n in order)
    lines = [f"NOT HELD OUT: {overlap}"] if overlap else []
    lines.append(f"{'features':<{width}}   dim  linear top1  linear macro  kNN top1  kNN macro")
    for n in order:
        r = rows[n]
        lines.append(
            f"{titles.get(n, n):<{width}}  {r.dim:>4}  {_cell(r.linear_acc):>11}  "
            f"{_cell(r.linear_macro_acc):>12}  {_cell(r.knn_acc):>8}  {_cell(r.knn_macro_acc):>9}"
        )
    return "\n".join(lines)


def write_json(path: Path, rows: dict[str, Row], info: dict[str, Any]) -> Path:
    """``info`` (run, step, data, ...), the protocol and every row, as indented JSON."""
    doc = {**info, "protocol": PROTOCOL, "rows": {n: dataclasses.asdict(r) for n, r in rows.items()}}
    doc["metrics"] = metrics(rows)
    write_whole(path, (json.dumps(doc, indent=1) + "\n").encode())  # an earlier record kept on a full disk
    return path


def thin_train_split(
    train: np.ndarray, held_out: np.ndarray, rows: dict[str, Row], names: Sequence[str] | None = None
) -> list[str]:
    """What the scores cannot say, from a train split too thin for the protocol: eval classes it lacks
    (their clips count wrong in every row; by their ``names`` where the vocabulary gives them), and
    cross-validation it could not hold (C left at 1.0)."""
    out = []
    lacking = sorted(set(held_out.tolist()) - set(train.tolist()))
    if lacking:
        n = int(np.isin(held_out, lacking).sum())
        ids = ", ".join(names[c] if names and c < len(names) else str(c) for c in lacking)
        out.append(f"{len(lacking)} eval classes have no train clip (classes {ids}): their {n} clips count "
                   "as wrong in every row")  # fmt: skip
    if any(r.linear is not None and not r.linear["folds"] for r in rows.values()):
        out.append("too few train clips per class to hold any out: the linear probe's C was not chosen by "
                   "cross-validation, it is 1.0")  # fmt: skip
    return out


def what_a_row_holds_past_its_label(eval_files: Sequence[str], features: Features) -> list[str]:
    """What the eval split's rows hold that a single-label score of one clip each does not see: several
    species in one window (BirdSet's soundscapes; each is scored against its ``ebird_code`` alone), and
    windows longer or shorter than the encoder's clip (it sees their first seconds, or zeros past their
    end). Their scores stood as if neither were so."""
    out = []
    tables = [read_shard(Path(f)) for f in eval_files]  # each read once (memory-mapped)
    n_rows = sum(len(t) for t in tables)
    if several := sum(several_species(t) for t in tables):
        out.append(f"{several} of the eval split's {n_rows} rows hold several species ({MULTILABEL_COLUMN}): "
                   "each is scored against its one label; `birdjepa benchmark` scores every species "
                   "(cmAP)")  # fmt: skip
    lengths, clip = window_lengths(tables), features.clip_seconds
    if (longer := int((lengths > clip + SAME_LENGTH_S).sum())) > 0:
        out.append(f"{longer} eval rows have windows longer than the encoder's {clip:g} s clip (up to "
                   f"{lengths.max():g} s): each is scored on its window's first {clip:g} s")  # fmt: skip
    if (shorter := int((lengths < clip - SAME_LENGTH_S).sum())) > 0:
        out.append(f"{shorter} eval rows have windows shorter than the encoder's {clip:g} s clip (down to "
                   f"{lengths.min():g} s): past its window's end each clip is zeros")  # fmt: skip
    return out
