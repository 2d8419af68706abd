"""Parquet as the hub has it: a BirdSet-schema split written by HF `datasets` (``to_parquet``) becomes
shards (`birdjepa prepare`) whose batches equal those of the same rows in Arrow, with the audio bytes
copied unchanged and vocab.json from the ClassLabel names; a damaged file is one line naming the file
and the row group, and leaves no shard behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from birdjepa.cli import main
from birdjepa.data import Loader
from birdjepa.data.shards import read_shard


def hub_parquet(split: Path, out: Path) -> list[Path]:
    """Each shard of ``split`` as `datasets` writes Parquet: its features from the schema's metadata,
    row groups of 8 rows."""
    out.mkdir(parents=True)
    files = []
    for i, shard in enumerate(sorted(split.glob("*.arrow"))):
        files.append(out / f"{i:04d}.parquet")
        datasets.Dataset(read_shard(shard)).to_parquet(str(files[-1]), batch_size=8)
    return files


def prepare(src: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    capsys.readouterr()
    try:
        code = main(["prepare", str(src), str(out)])
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def task(birdset_dir: Path) -> Path:
    return sorted(p for p in birdset_dir.iterdir() if p.is_dir())[0]


def test_hub_parquet_becomes_shards_with_the_batches_of_the_same_rows(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for split, options in (
        ("train", {"train": True, "n_views": 2, "seed": 5}),
        ("test_5s", {"train": False, "multilabel_column": "ebird_code_multilabel"}),
    ):
        files = hub_parquet(task / split, tmp_path / "hub" / split)
        assert split != "train" or pq.ParquetFile(files[0]).num_row_groups > 1  # read group by group
        code, out, _ = prepare(tmp_path / "hub" / split, tmp_path / "shards" / split, capsys)
        assert code is None, out
        assert f"in {len(files)} shard(s) from {len(files)} Parquet file(s)" in out and "MiB/s" in out
        shards = sorted((tmp_path / "shards" / split).glob("*.arrow"))
        original = sorted((task / split).glob("*.arrow"))
        for ours, theirs, file in zip(shards, original, files, strict=True):  # every column unchanged
            assert read_shard(ours).equals(read_shard(theirs))
            assert read_shard(ours).schema.metadata[b"birdjepa.source"] == str(file).encode()  # traced back
        vocab = json.loads((tmp_path / "shards" / split / "vocab.json").read_text())
        assert vocab["names"] == json.loads((task / split / "vocab.json").read_text())["names"]
        assert vocab["label_column"] == "ebird_code"
        with Loader([str(s) for s in original], batch_size=4, **options) as a:
            with Loader([str(s) for s in shards], batch_size=4, **options) as b:
                pairs = (
                    list(zip(a, b, strict=True))
                    if not options["train"]
                    else [(next(a), next(b)) for _ in range(3)]
                )
        assert pairs
        for x, y in pairs:
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


def test_a_damaged_row_group_is_one_line_naming_the_file_and_row_group(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = hub_parquet(task / "train", tmp_path / "hub")
    damaged = files[-1]
    chunk = pq.ParquetFile(damaged).metadata.row_group(1).column(0)
    data = bytearray(damaged.read_bytes())
    start = chunk.data_page_offset
    data[start : start + 64] = b"\xff" * 64  # the page header of row group 1's first column
    damaged.write_bytes(bytes(data))
    code, _, err = prepare(tmp_path / "hub", tmp_path / "out", capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    line = err.strip()
    assert f"{damaged}: row group 1:" in line, line
    assert not list((tmp_path / "out").iterdir())  # the shards written before it are removed


def test_an_audio_column_no_reader_takes_is_refused_before_it_is_converted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Converted with exit 0, then refused by every command that read the shards.
    decoded = pa.struct(
        [("array", pa.list_(pa.float32())), ("path", pa.string()), ("sampling_rate", pa.int64())]
    )
    forms = {
        "decoded": pa.array([{"array": [0.0, 0.5], "path": "a.wav", "sampling_rate": 16000}], decoded),
        "categories": pa.array(["a.wav"]).dictionary_encode(),  # a pandas Categorical of paths
        "lists": pa.array([[b"RIFF"]], pa.list_(pa.binary())),
    }
    for name, audio in forms.items():
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"audio": audio, "ebird_code": [0]}), tmp_path / name / "x.parquet")
        code, _, err = prepare(tmp_path / name, tmp_path / f"out-{name}", capsys)
        assert code == 2 and f"{tmp_path / name / 'x.parquet'}: column 'audio' " in err, err
        assert not list((tmp_path / f"out-{name}").glob("*.arrow"))
    assert "holds decoded samples" in prepare(tmp_path / "decoded", tmp_path / "again", capsys)[2]


def test_the_benchmark_takes_class_names_from_a_datasets_file_without_vocab_json(
    task: Path, tmp_path: Path
) -> None:
    from birdjepa.benchmark.cli import BenchmarkError, load_task

    for split in ("train", "test_5s"):
        (tmp_path / split).mkdir()
        for shard in (task / split).glob("*.arrow"):
            (tmp_path / split / shard.name).write_bytes(shard.read_bytes())
    names = json.loads((task / "train" / "vocab.json").read_text())["names"]
    loaded = load_task("SYN", str(tmp_path / "train"), str(tmp_path / "test_5s"), None)
    assert (loaded.class_names, loaded.n_classes) == (names, len(names))
    # Without the metadata too, the one-line error says what to give.
    bare = tmp_path / "bare"
    bare.mkdir()
    table = read_shard(next((task / "train").glob("*.arrow"))).replace_schema_metadata(None)
    with pa.OSFile(str(bare / "x.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(BenchmarkError, match="no ClassLabel names in it: give --n-classes"):
        load_task("SYN", str(bare), str(bare), None)


@pytest.mark.slow
def test_parquet_and_path_only_sets_train_and_benchmark_with_the_commands_of_embedded_shards(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Users' commands on the two forms the hub's BirdSet takes: Parquet converted by `prepare`, and
    a loading script's cache (audio by path, under --data.audio-root): each pretrains, and benchmarks to
    the scores of the embedded shards (raw log-mel: the comparison needs no training)."""
    from path_only import path_only

    from birdjepa.benchmark import store

    forms: dict[str, tuple[Path, Path, list[str]]] = {"embedded": (task / "train", task / "test_5s", [])}
    for split in ("train", "test_5s"):
        hub_parquet(task / split, tmp_path / "hub" / split)
        assert prepare(tmp_path / "hub" / split, tmp_path / "parquet" / split, capsys)[0] is None
        for shard in sorted((task / split).glob("*.arrow")):
            path_only(shard, tmp_path / "cache" / split / shard.name, tmp_path / "archive" / split,
                      relative_to=tmp_path / "archive")  # fmt: skip
        (tmp_path / "cache" / split / "vocab.json").write_bytes((task / split / "vocab.json").read_bytes())
    forms["parquet"] = (tmp_path / "parquet" / "train", tmp_path / "parquet" / "test_5s", [])
    forms["by_path"] = (
        tmp_path / "cache" / "train",
        tmp_path / "cache" / "test_5s",
        [str(tmp_path / "archive")],
    )
    scores = {}
    for name, (train, test, root) in forms.items():
        audio_root = ["--data.audio-root", *root] if root else []
        # pretrain raises SystemExit on any failure
        main(["pretrain", "--run", name, "--log.runs-dir", str(tmp_path / "runs"), "--steps", "2",
              "--eval-every", "0", "--data.batch-size", "4", "--data.train", str(train),
              "--data.eval", str(test), *audio_root])  # fmt: skip
        assert (tmp_path / "runs" / name / "checkpoints").is_dir()
        results = tmp_path / f"results-{name}"
        main(["benchmark", "--backbone", "raw", "--train", str(train), "--test", str(test), "--task", "SYN",
              "--n-train", "-1", "--probe", "linear", "--results", str(results),
              *(["--audio-root", *root] if root else [])])  # fmt: skip
        scores[name] = sorted((r["cmap"], r["auroc"], r["top1"]) for r in store.read(results).to_pylist())
    assert scores["embedded"] and scores["parquet"] == scores["embedded"] == scores["by_path"]


def test_string_labels_give_their_sorted_vocabulary(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = read_shard(next((task / "train").glob("*.arrow"))).replace_schema_metadata(None)
    names = json.loads((task / "train" / "vocab.json").read_text())["names"]
    text = pa.array([names[i] for i in table.column("ebird_code").to_pylist()])
    table = table.set_column(table.schema.get_field_index("ebird_code"), "ebird_code", text)
    (tmp_path / "hub").mkdir()
    pq.write_table(table, tmp_path / "hub" / "0000.parquet", row_group_size=8)
    assert prepare(tmp_path / "hub", tmp_path / "out", capsys)[0] is None
    vocab = json.loads((tmp_path / "out" / "vocab.json").read_text())["names"]
    assert vocab == sorted(set(text.to_pylist()))
    # The same names as pandas' Categorical (a dictionary column): written out as strings. It was
    # converted as it came, with "0 labels", and every command refused its labels.
    at = table.schema.get_field_index("ebird_code")
    (tmp_path / "categorical").mkdir()
    pq.write_table(
        table.set_column(at, "ebird_code", text.dictionary_encode()), tmp_path / "categorical" / "0.parquet"
    )
    assert prepare(tmp_path / "categorical", tmp_path / "out2", capsys)[0] is None
    assert (tmp_path / "out2" / "vocab.json").read_text() == (tmp_path / "out" / "vocab.json").read_text()
    labels = [
        np.concatenate([b["label"] for b in Loader(tmp_path / o, train=False)]) for o in ("out", "out2")
    ]
    assert np.array_equal(*labels)
    # Ids as floats (pandas' integers with a missing value) and a file of no rows: refused, one line each.
    ids = pa.array([None, *map(float, range(len(table) - 1))])
    for name, bad, said in (("floats", table.set_column(at, "ebird_code", ids), "label column 'ebird_code' "
                             "has type double: class ids (integers) or names (strings) are read"),
                            ("empty", table.slice(0, 0), "0.parquet: no rows")):  # fmt: skip
        (tmp_path / name).mkdir()
        pq.write_table(bad, tmp_path / name / "0.parquet")
        code, _, err = prepare(tmp_path / name, tmp_path / f"out-{name}", capsys)
        assert code == 2 and said in err and err.count("\n") == 1, err
        assert not list((tmp_path / f"out-{name}").glob("*.arrow"))


def test_a_set_with_other_labels_is_refused_beside_shards_whose_vocabulary_it_would_replace(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The shards' labels index their folder's vocab.json; another set written there under another prefix
    # replaced it. Refused, with ClassLabel names before any row is copied, with string labels once they
    # are all read (the copied shards then removed).
    table = read_shard(next((task / "train").glob("*.arrow"))).replace_schema_metadata(None)
    column = table.schema.get_field_index("ebird_code")
    xy = pa.array(["x" if i % 2 else "y" for i in table.column("ebird_code").to_pylist()])
    (tmp_path / "xy").mkdir()
    pq.write_table(table.set_column(column, "ebird_code", xy), tmp_path / "xy" / "0000.parquet")
    out = tmp_path / "out"
    assert prepare(tmp_path / "xy", out, capsys)[0] is None
    shards, vocab = sorted(out.iterdir()), (out / "vocab.json").read_text()
    names = json.loads((task / "train" / "vocab.json").read_text())["names"]
    text = pa.array([names[i] for i in table.column("ebird_code").to_pylist()])
    (tmp_path / "text").mkdir()
    pq.write_table(table.set_column(column, "ebird_code", text), tmp_path / "text" / "0000.parquet")
    hub_parquet(task / "train", tmp_path / "classlabel")
    capsys.readouterr()
    for src, prefix in (("classlabel", "c"), ("text", "t")):
        with pytest.raises(SystemExit) as e:
            main(["prepare", str(tmp_path / src), str(out), "--prefix", prefix])
        err = capsys.readouterr().err
        said = (
            f"birdjepa prepare: error: {out / 'vocab.json'} is the vocabulary of the shards already in {out}"
        )
        assert e.value.code == 2 and err.startswith(f"{said} (e.g. data-00000.arrow), not of these"), err
        assert "would relabel those shards" in err and len(err.splitlines()) == 1, err
        assert sorted(out.iterdir()) == shards and (out / "vocab.json").read_text() == vocab


def test_files_whose_ids_would_mean_other_classes_are_refused_naming_the_file(
    task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Each was converted with exit 0: a second file's ClassLabel names in another order (its ids read as
    # the first file's names), bare ids beside named ones, an id past the names (the run's probe loss then
    # NaN, blamed on the learning rate); duplicate names left named shards without a vocab.json.
    table = read_shard(next((task / "train").glob("*.arrow")))
    meta = json.loads(table.schema.metadata[b"huggingface"])
    names = meta["info"]["features"]["ebird_code"]["names"]
    at = table.schema.get_field_index("ebird_code")

    def write(folder: str, name: str, rows: pa.Table, labels: list[str] | None) -> None:
        (tmp_path / folder).mkdir(exist_ok=True)
        if labels is None:
            rows = rows.replace_schema_metadata(None)
        else:
            meta["info"]["features"]["ebird_code"]["names"] = labels
            rows = rows.replace_schema_metadata({b"huggingface": json.dumps(meta).encode()})
        pq.write_table(rows, tmp_path / folder / name, row_group_size=8)

    write("order", "a.parquet", table, names)
    write("order", "b.parquet", table, names[::-1])
    write("bare", "a.parquet", table, names)
    write("bare", "b.parquet", table, None)
    past = table.column("ebird_code").to_pylist()
    past[9] = len(names) + 3
    write("past", "a.parquet", table.set_column(at, "ebird_code", pa.array(past, pa.int64())), names)
    write("twice", "a.parquet", table, [names[0]] * len(names))
    # A multilabel column whose names are in another order: its ids were read as ebird_code's classes.
    write("multi", "a.parquet", table, names)
    multi = json.loads(json.dumps(meta))
    multi["info"]["features"]["ebird_code"]["names"] = names
    multi["info"]["features"]["ebird_code_multilabel"]["feature"]["names"] = names[::-1]
    pq.write_table(table.replace_schema_metadata({b"huggingface": json.dumps(multi).encode()}),
                   tmp_path / "multi" / "a.parquet")  # fmt: skip
    # String labels beside ClassLabel ids: the vocabulary was the names alone, and a run stopped at its
    # first string outside them.
    write("strings", "a.parquet", table, names)
    strings = pa.array([f"new-{x}" for x in table.column("ebird_code").to_pylist()])
    write("strings", "b.parquet", table.set_column(at, "ebird_code", strings), None)
    write("categorical", "a.parquet", table, names)  # pandas' Categorical of names: passed, as strings did
    write("categorical", "b.parquet", table.set_column(at, "ebird_code", strings.dictionary_encode()), None)
    # String labels beside a multilabel column's ClassLabel ids in another order than the sorted strings
    # vocab.json holds: its ids named other classes, exit 0.
    named = pa.array([names[i] for i in table.column("ebird_code").to_pylist()])
    by_name = json.loads(json.dumps(meta))
    by_name["info"]["features"]["ebird_code"] = {"dtype": "string", "_type": "Value"}
    by_name["info"]["features"]["ebird_code_multilabel"]["feature"]["names"] = sorted(names)[::-1]
    (tmp_path / "strmulti").mkdir()
    pq.write_table(table.set_column(at, "ebird_code", named).replace_schema_metadata(
        {b"huggingface": json.dumps(by_name).encode()}), tmp_path / "strmulti" / "a.parquet")  # fmt: skip
    for folder, said in (
        ("order", "b.parquet: its ClassLabel names of 'ebird_code' are not "),
        ("bare", "b.parquet: integer labels without ClassLabel names beside "),
        ("strings", "b.parquet: string labels beside "),
        ("categorical", "b.parquet: string labels beside "),
        (
            "strmulti",
            "a.parquet: the ClassLabel names of 'ebird_code_multilabel' are not 'ebird_code''s "
            "string labels, sorted (or not in their order)",
        ),
        (
            "past",
            f"a.parquet: row group 1 (row 9): label {len(names) + 3} is outside its {len(names)} ClassLabel",
        ),
        ("twice", "a.parquet: its ClassLabel names cannot be a vocabulary: vocab names must be unique"),
        ("multi", "a.parquet: the ClassLabel names of 'ebird_code_multilabel' are not those of 'ebird_code'"),
    ):
        code, _, err = prepare(tmp_path / folder, tmp_path / f"out-{folder}", capsys)
        assert code == 2 and said in err and err.count("\n") == 1, err
        assert not [p for p in (tmp_path / f"out-{folder}").glob("*") if p.suffix in (".arrow", ".json")]
    # Bare ids in another column than ebird_code: no vocab.json recorded the column, and every reader read
    # ebird_code's labels, exit 0.
    write("species", "a.parquet", table.append_column("species", table.column("ebird_code")), None)
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(tmp_path / "species"), str(tmp_path / "o"), "--label-column", "species"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "a.parquet: --label-column species: its integer labels have no " in err, err
    # Bare ids, then a named set beside them: its vocab.json named the first set's ids, exit 0.
    write("ids", "a.parquet", table, None)
    code, _, err = prepare(tmp_path / "ids", tmp_path / "shared", capsys)
    assert code in (0, None) and not (tmp_path / "shared" / "vocab.json").exists(), err
    (tmp_path / "shared" / "data-00000.arrow").rename(tmp_path / "shared" / "ids-00000.arrow")
    code, _, err = prepare(tmp_path / "order" / "a.parquet", tmp_path / "shared", capsys)
    assert code == 2 and "(e.g. ids-00000.arrow) have no vocab.json: their labels are bare class ids" in err
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["ids-00000.arrow"]
    # The hub's layout (repo/data/*.parquet) named by its repo folder said "no audio files" only; a glob
    # matching nothing, "source folder ... does not exist"; a FIFO named *.parquet hung the conversion.
    (tmp_path / "repo" / "data").mkdir(parents=True)
    (tmp_path / "order" / "a.parquet").rename(tmp_path / "repo" / "data" / "a.parquet")
    code, _, err = prepare(tmp_path / "repo", tmp_path / "o", capsys)
    assert code == 2 and f"{tmp_path / 'repo' / 'data'} holds Parquet files: birdjepa prepare" in err, err
    code, _, err = prepare(tmp_path / "nothing-*.parquet", tmp_path / "o", capsys)
    assert code == 2 and "nothing-*.parquet matches no file" in err, err
    from birdjepa.data.parquet import parquet_files

    os.mkfifo(tmp_path / "repo" / "data" / "b.parquet")  # read as a file, it blocks for ever
    assert parquet_files(tmp_path / "repo" / "data") == [tmp_path / "repo" / "data" / "a.parquet"]
    # An audio folder's options, ignored without a word.
    with pytest.raises(SystemExit) as e:
        main(["prepare", str(tmp_path / "order"), str(tmp_path / "o"), "--check", "full"])
    assert e.value.code == 2 and "--check full: a folder of audio files' option" in capsys.readouterr().err
