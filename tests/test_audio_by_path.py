"""Audio by path: BirdSet's rows as a `datasets` loading script caches them (HF's Audio struct with null
``bytes`` and a ``path`` to the extracted file) give the batches of the same audio embedded in the
shard; a relative path is found under the shard's folder or ``audio_root``; a missing file is a
counted skip naming the shard, the row and the path; a changed file is refused at resume."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from path_only import path_only

from birdjepa.data import Loader, StateError
from birdjepa.data.shards import read_shard


def batches(files: list[str], *, train: bool, **options: object) -> list[dict[str, np.ndarray]]:
    """An eval pass, or the first 4 train batches."""
    with Loader(files, batch_size=4, n_workers=2, train=train, **options) as loader:
        return [next(loader) for _ in range(4)] if train else list(loader)


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for k in x:
            assert np.array_equal(x[k], y[k]), k


@pytest.fixture(scope="module")
def birdset_task(birdset_dir: Path) -> Path:
    return sorted(p for p in birdset_dir.iterdir() if p.is_dir())[0]


def train_shard_by_path(birdset_task: Path, folder: Path) -> Path:
    """The task's first train shard rewritten into ``folder`` with its audio by relative path (under
    ``folder/audio``), its vocab.json beside it."""
    (shard, *_) = sorted((birdset_task / "train").glob("*.arrow"))
    (folder / "vocab.json").parent.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_bytes((shard.parent / "vocab.json").read_bytes())
    return path_only(shard, folder / shard.name, folder / "audio", relative_to=folder)


def test_path_only_birdset_rows_give_the_batches_of_their_embedded_bytes(
    birdset_task: Path, tmp_path: Path
) -> None:
    for split, options in (
        ("train", {"train": True, "n_views": 2, "seed": 3}),
        ("test_5s", {"train": False, "multilabel_column": "ebird_code_multilabel"}),
    ):
        shards = sorted((birdset_task / split).glob("*.arrow"))
        # Relative to the shard's folder, where the loading script's cache would sit beside its files.
        here = tmp_path / split
        mine = [path_only(s, here / s.name, here / "audio", relative_to=here) for s in shards]
        (tmp_path / split / "vocab.json").write_bytes((birdset_task / split / "vocab.json").read_bytes())
        assert_same(batches([str(s) for s in shards], **options), batches([str(s) for s in mine], **options))


def test_audio_root_finds_relative_paths_for_shards_kept_elsewhere(
    birdset_task: Path, tmp_path: Path
) -> None:
    (shard, *_) = sorted((birdset_task / "train").glob("*.arrow"))
    root = tmp_path / "archive"
    moved = path_only(shard, tmp_path / "cache" / shard.name, root / "extracted", relative_to=root)
    (moved.parent / "vocab.json").write_bytes((shard.parent / "vocab.json").read_bytes())
    eval_mode = {"train": False}
    assert_same(batches([str(shard)], **eval_mode), batches([str(moved)], audio_root=str(root), **eval_mode))
    # What the benchmark's `audio_stamp` asks: whether the fingerprint holds the named files' stamps.
    for files, by_path in (([shard], False), ([moved], True), ([shard, moved], True)):
        with Loader([str(f) for f in files], batch_size=4, train=False, audio_root=str(root)) as loader:
            assert loader.reads_audio_by_path is by_path
    # Without the root every path is looked for beside the shard: each row is a counted skip.
    with Loader([str(moved)], batch_size=4, train=False) as loader:
        assert list(loader) == []
        assert loader.diagnostics()["counters"]["skipped"] == len(read_shard(moved))


def test_a_missing_or_unreadable_file_is_a_counted_skip_naming_shard_row_and_path(
    birdset_task: Path, tmp_path: Path
) -> None:
    # A file no decoder takes was named by its shard and row alone ("decode: unrecognised container").
    mine = train_shard_by_path(birdset_task, tmp_path)
    paths = read_shard(mine).column("audio").combine_chunks().field("path")
    gone, damaged = paths[2].as_py(), paths[5].as_py()
    (tmp_path / gone).unlink()
    (tmp_path / damaged).write_bytes(b"RIFF\x00\x00\x00\x00junk" * 8)
    with Loader([str(mine)], batch_size=4, train=False) as loader:
        rows = np.concatenate([b["index"] for b in loader])
        diagnostics = loader.diagnostics()
    assert 2 not in rows and 5 not in rows and len(rows) == len(read_shard(mine)) - 2
    assert diagnostics["counters"]["skipped"] == 2
    missing, unreadable = diagnostics["skipped"]
    assert (missing["file"], missing["row"], unreadable["file"], unreadable["row"]) == (
        str(mine),
        2,
        str(mine),
        5,
    )
    assert gone in missing["reason"] and "No such file" in missing["reason"], missing
    assert unreadable["reason"].startswith(f"audio file {tmp_path / damaged}: decode: "), unreadable


def test_a_file_opened_with_no_descriptor_left_stops_the_loader_in_one_line_and_is_no_skip(
    birdset_task: Path, tmp_path: Path
) -> None:
    # Under `ulimit -n` healthy files were counted skips ("Too many open files"), another set at every
    # run: a data stream that depends on the process's load, its resume unequal to the straight run.
    import resource
    import subprocess
    import sys

    mine = train_shard_by_path(birdset_task, tmp_path)
    # Two records decoded ahead at most: the rest are opened once the descriptors are gone.
    code = ("import os, sys; from birdjepa.data import DataError, Loader\n"
            "with Loader([sys.argv[1]], batch_size=1, n_workers=1, prefetch_batches=1,\n"
            "            train=False) as loader:\n"
            "    held = []\n"
            "    try:\n"
            "        while True: held.append(os.open(os.devnull, os.O_RDONLY))\n"
            "    except OSError: pass\n"
            "    try: list(loader)\n"
            "    except DataError as e: print('DataError', e)\n"
            "    print('skipped', loader.diagnostics()['counters']['skipped'])\n")  # fmt: skip
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    few = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # noqa: E731
    done = subprocess.run(
        [sys.executable, "-c", code, str(mine)], capture_output=True, text=True, timeout=120, preexec_fn=few
    )
    said = done.stdout.splitlines()
    assert said[-1] == "skipped 0" and said[0].startswith("DataError audio file "), done.stdout + done.stderr
    assert said[0].endswith("this process's limit on open files (ulimit -n) was met, not this file's fault")


def test_a_path_to_a_pipe_or_a_folder_is_a_counted_skip_not_a_wait_for_ever(
    birdset_task: Path, tmp_path: Path
) -> None:
    # A FIFO's open waits for a writer: the loader hung for ever, deaf to Ctrl-C, and so did pretrain.
    import subprocess
    import sys

    mine = train_shard_by_path(birdset_task, tmp_path)
    paths = read_shard(mine).column("audio").combine_chunks().field("path").to_pylist()
    (tmp_path / paths[2]).unlink()
    os.mkfifo(tmp_path / paths[2])
    (tmp_path / paths[3]).unlink()
    (tmp_path / paths[3]).mkdir()
    code = ("import sys; from birdjepa.data import Loader\n"
            "with Loader([sys.argv[1]], batch_size=4, train=False) as loader:\n"
            "    list(loader)\n"
            "    for s in loader.diagnostics()['skipped']: print(s['row'], s['reason'])\n")  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code, str(mine)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stdout.splitlines() if not line.startswith("WARNING")]
    assert said[0].startswith("2 ") and said[0].endswith(
        "cannot open: not a regular file (a pipe, socket or device)"
    )
    assert said[1].startswith("3 ") and said[1].endswith("cannot open: a folder"), said


def test_a_file_changed_between_segments_is_refused_at_resume(birdset_task: Path, tmp_path: Path) -> None:
    mine = train_shard_by_path(birdset_task, tmp_path)
    with Loader([str(mine)], batch_size=4, seed=1) as loader:
        next(loader)
        state = loader.state()
    with Loader([str(mine)], batch_size=4, seed=1, state=state) as same:  # unchanged: resumes
        next(same)
    touched = tmp_path / read_shard(mine).column("audio").combine_chunks().field("path")[0].as_py()
    stat = touched.stat()
    os.utime(touched, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # same bytes, a new time
    with pytest.raises(StateError, match="fingerprint"):
        Loader([str(mine)], batch_size=4, seed=1, state=state)


def test_a_plain_column_of_paths_reads_like_the_struct(birdset_task: Path, tmp_path: Path) -> None:
    """Audio as a string column of paths (no struct), as a hand-made table holds it."""
    (shard, *_) = sorted((birdset_task / "train").glob("*.arrow"))
    by_struct = path_only(shard, tmp_path / "struct" / shard.name, tmp_path / "audio", relative_to=tmp_path)
    table = read_shard(by_struct)
    paths = table.column("audio").combine_chunks().field("path")
    plain = table.set_column(table.schema.get_field_index("audio"), "audio", paths)
    (tmp_path / "plain").mkdir()
    with (
        pa.OSFile(str(tmp_path / "plain" / shard.name), "wb") as sink,
        pa.ipc.new_file(sink, plain.schema) as w,
    ):
        w.write_table(plain)
    for folder in ("struct", "plain"):
        (tmp_path / folder / "vocab.json").write_bytes((shard.parent / "vocab.json").read_bytes())
    eval_mode = {"train": False, "audio_root": str(tmp_path)}
    assert_same(
        batches([str(by_struct)], **eval_mode), batches([str(tmp_path / "plain" / shard.name)], **eval_mode)
    )


def test_a_resume_refused_for_audio_copied_without_its_times_says_the_times_count(
    birdset_task: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Audio copied to node-local disk with `cp -r` (the same bytes, new times): "the data changed", where
    # nothing named the times, and the advice (warn) trained on another batch stream.
    from birdjepa.cli import main

    train_shard_by_path(birdset_task, tmp_path / "data")
    run = ["pretrain", "--run", "r", "--log.runs-dir", str(tmp_path / "runs"), "--data.train",
           str(tmp_path / "data"), "--steps", "4", "--eval-every", "0", "--data.batch-size", "4"]  # fmt: skip
    assert main([*run, "--stop-at-step", "1"]) is None
    for audio in (tmp_path / "data" / "audio").rglob("*"):
        if audio.is_file():
            os.utime(audio, ns=(audio.stat().st_atime_ns, audio.stat().st_mtime_ns + 1_000_000_000))
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(run)
    assert e.value.code == 65
    assert ("The data changed since checkpoint 1 (audio read by path counts its files' sizes and "
            "modification times: a copy that did not keep the times, cp -r where cp -a or rsync -a keeps "
            "them, reads as changed)") in capsys.readouterr().out  # fmt: skip
    # evaluate says the same of the split it reads as the run's (it blamed the folder it was run from).
    with pytest.raises(SystemExit) as e:
        main(["evaluate", str(tmp_path / "runs" / "r"), "--data.eval", str(birdset_task / "test_5s"),
              "--out", str(tmp_path / "e.json")])  # fmt: skip
    err = capsys.readouterr().err
    assert (
        e.value.code == 2 and "names its audio by path, and the files under each shard folder differ" in err
    )
    assert "differ from those the run trained on in size or modification time" in err and "cp -a" in err, err
