"""A cache file written by HF `datasets` (stream-format IPC, Audio struct column) is read as-is."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
from datasets import Audio, ClassLabel, Dataset, Value
from datasets import Features as HFFeatures

from birdjepa.data import Loader


def demo_eval_rows(demo_dir: Path) -> tuple[list[dict], list[int | None], list[str]]:
    tables = []
    for path in sorted((demo_dir / "eval").glob("*.arrow")):
        with ipc.open_file(path) as f:
            tables.append(f.read_all())
    audio = [a for t in tables for a in t.column("audio").to_pylist()]
    labels = [x for t in tables for x in t.column("ebird_code").to_pylist()]
    names = json.loads((demo_dir / "eval" / "vocab.json").read_text())["names"]
    return audio, labels, names


def save_hf(rows: dict, label_feature: object, out: Path) -> Path:
    features = HFFeatures(
        {"audio": {"bytes": Value("binary"), "path": Value("string")}, "ebird_code": label_feature}
    )
    # Audio(decode=False) via a cast: encoding raw bytes needs torchcodec, casting the struct does not.
    ds = Dataset.from_dict(rows, features=features).cast_column("audio", Audio(decode=False))
    ds.save_to_disk(str(out))
    (arrow,) = out.glob("*.arrow")
    return arrow


def eval_batches(files: object) -> list[dict]:
    return list(Loader(files, seed=0, batch_size=4, n_workers=2, train=False))


def test_hf_classlabel_dataset_reads_like_our_shards(demo_dir: Path, tmp_path: Path) -> None:
    audio, labels, names = demo_eval_rows(demo_dir)
    arrow = save_hf({"audio": audio, "ebird_code": labels}, ClassLabel(names=names), tmp_path / "hf")
    assert arrow.read_bytes()[:4] == b"\xff\xff\xff\xff"  # stream format, as HF writes it
    ours = eval_batches(demo_dir / "eval")
    theirs = eval_batches(arrow)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a["spectrogram"], b["spectrogram"])
        assert np.array_equal(a["label"], b["label"])


def test_hf_string_labels_map_through_the_vocabulary(demo_dir: Path, tmp_path: Path) -> None:
    audio, labels, names = demo_eval_rows(demo_dir)
    as_text = [None if x is None else names[x] for x in labels]
    as_text[0] = None  # a missing label becomes -1
    arrow = save_hf({"audio": audio, "ebird_code": as_text}, Value("string"), tmp_path / "hf")
    (arrow.parent / "vocab.json").write_text(json.dumps({"label_column": "ebird_code", "names": names}))
    got = np.concatenate([b["label"] for b in eval_batches(arrow)])
    expected = [-1] + [(-1 if x is None else x) for x in labels[1:]]
    assert got.tolist() == expected
