"""One schema for the loader's options: Rust holds the names, types and defaults; Python agrees."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tyro

from birdjepa import _rs
from birdjepa.config import PretrainConfig
from birdjepa.data import (
    DEFAULTS,
    TRAIN_VIEWS,
    DataConfig,
    DataError,
    Features,
    Loader,
    StateError,
    plan_indices,
)
from birdjepa.pretrain.loop import pretrain
from birdjepa.validation import OptionError, check

# Loader options that no config exposes: set per call by the trainer, the evaluation or tests.
PER_CALL = {"seed", "train", "augment", "prefetch_batches", "drop_last", "audio_column", "label_column",
            "debug_panic_index", "debug_crop_shift_index",
            # Set by `Loader` itself where a split spans folders of different vocabularies.
            "label_names",
            # Evaluation's (BirdSet's multi-label and window columns): pretraining reads neither.
            "multilabel_column", "n_classes", "window_start_column", "window_end_column"}  # fmt: skip


def test_python_exposes_every_rust_option_with_the_rust_default() -> None:
    rust = json.loads(_rs.loader_defaults())
    features = {f.name: f.default for f in dataclasses.fields(Features)}
    data = DataConfig().loader_options()
    assert set(features) | set(data) | PER_CALL == set(rust)
    assert not set(features) & set(data) and not (set(features) | set(data)) & PER_CALL
    assert {k: rust[k] for k in features} == features
    # The trainer's views are its own choice (LeJEPA compares two); every other default is the loader's.
    assert data.pop("n_views") == TRAIN_VIEWS == 2 and rust["n_views"] == 1
    assert {k: rust[k] for k in data} == data
    assert DEFAULTS == rust


def test_an_unknown_or_mistyped_option_is_named(demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown field `shuffle_bufer`"):
        Loader(demo_dir / "train", shuffle_bufer=8)
    with pytest.raises(ValueError, match="invalid type"):
        Loader(demo_dir / "train", batch_size="eight")
    # None of these named the option: a traceback's IndexError, JSON's NaN, serde's "expected usize",
    # and a batch of 2^40 rows aborted the process.
    with pytest.raises(DataError, match="no shard files given"):
        Loader([])
    with pytest.raises(DataError, match="an empty path names no shard file"):
        Loader("")
    with pytest.raises(DataError, match=r"vocab.json: not an Arrow shard \(no IPC file or stream"):
        Loader(demo_dir / "train" / "vocab.json")  # "truncated shard"
    with pytest.raises(ValueError, match=r"f_min must be a finite number \(got nan\)"):
        Loader(demo_dir / "train", features=Features(f_min=float("nan")))
    with pytest.raises(ValueError, match=r"n_workers must be >= 0 \(got -1\)"):
        Loader(demo_dir / "train", n_workers=-1)
    with pytest.raises(ValueError, match="batch_size x n_views x n_frames x n_mels must be at most 2"):
        Loader(demo_dir / "train", batch_size=2**40)
    # One shard under two names was read twice an epoch.
    shard = sorted((demo_dir / "train").glob("*.arrow"))[0]
    with pytest.raises(DataError, match="are one shard file: name it once"):
        Loader([str(shard), os.path.relpath(shard)])
    # A path in bytes (os.listdir(b".")'s): a TypeError from a list of its ints.
    from birdjepa.data import resolve_files

    assert resolve_files(os.fsencode(demo_dir / "train")) == resolve_files(demo_dir / "train")
    assert resolve_files([os.fsencode(shard)]) == [str(shard)]
    # A file not there was "[Errno 2] No such file or directory" at its opening, where a pattern or a
    # folder that matched nothing said so with where a relative path was read from.
    with pytest.raises(DataError, match=r"^no shard files match 'gone/a.arrow' \(a relative path: read "):
        Loader(["gone/a.arrow"])
    # A batch's bound is in values: checked with the features that read it (the defaults' refused a
    # valid batch of small clips, and passed one of large clips to the loader's traceback).
    from birdjepa.data.loader import loader_refusal

    assert loader_refusal(40_000, 0, Features(n_mels=32, n_frames=128, clip_seconds=1.2)) is None
    large = Features(n_frames=1024, clip_seconds=10.0)
    assert (loader_refusal(20_000, 0, large) or "").startswith("--batch-size 20000: batch_size x n_views")
    assert loader_refusal(20_000, 0) is None and loader_refusal(None, 2000).startswith("--n-workers 2000: ")
    # An audio root that is no folder was taken without a word (rows naming their audio by path were then
    # all skipped, or it was never read): refused by every command, pretrain's check with the flag.
    root = "audio_root must be a folder, where rows whose audio is a relative path find it"
    with pytest.raises(ValueError, match=f"^{root}$"):
        Loader(demo_dir / "train", audio_root=str(demo_dir / "no-such-folder"))
    assert loader_refusal(None, 0, audio_root="/no/such") == f"--audio-root /no/such: {root}"
    assert loader_refusal(None, 0, audio_root=str(demo_dir)) is None
    relative = f"--audio-root no/such: {root} (a relative path: read from {os.getcwd()})"
    assert loader_refusal(None, 0, audio_root="no/such") == relative
    with pytest.raises(
        OptionError, match=f"^--data.audio-root '/no/such': {root.removeprefix('audio_root ')}$"
    ):
        check(PretrainConfig(data=DataConfig(audio_root="/no/such")), data=False)
    # A data set's top folder, its splits below: said as a path that names nothing.
    said = f": it holds folders of shards, {demo_dir / 'eval'}, {demo_dir / 'train'}: give one of them"
    with pytest.raises(DataError, match=re.escape(said) + "$"):
        Loader(demo_dir)
    # A folder that may not be listed (chmod 711): "no shard files match" it, as if it held none.
    real_listdir = os.listdir

    def denied(path: object) -> list[str]:
        if str(path) == str(demo_dir / "train"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", denied)
    with pytest.raises(DataError, match=r"train: the folder cannot be listed \(Permission denied\): name"):
        resolve_files(demo_dir / "train")
    monkeypatch.undo()
    with pytest.raises(ValueError, match="unknown field `sample_rate`"):
        _rs.log_mel(np.zeros(1000, np.float32), sample_rate=16000)
    # A helper's hunt: a feature option beside the loader's was overwritten by Features' default without
    # a word; a dict for features, an AttributeError; 2**64 "invalid type: floating point"; 100000
    # workers a Rust panic with 600 threads left waiting; n_fft 2^28 built its FFT for minutes, deaf to
    # Ctrl-C; 2^40 masks took each sample for ever; numpy's integers "not JSON serializable".
    train = demo_dir / "train"
    with pytest.raises(TypeError, match=r"^clip_seconds, n_mels: feature options go in features=Features"):
        Loader(train, n_mels=64, clip_seconds=2.0)
    with pytest.raises(TypeError, match="features must be a birdjepa.data.Features, got dict"):
        Loader(train, features={"n_mels": 64})
    with pytest.raises(ValueError, match=r"seed must be below 2\*\*64 \(got 18446744073709551616\)"):
        Loader(train, seed=2**64)
    for features, said in (
        (Features(n_fft=2**28), "n_fft must be at most 65536"),
        (Features(time_mask_count=2**40, time_mask_width=1), "time_mask_count (1099511627776) exceeds"),
    ):
        with pytest.raises(ValueError, match=re.escape(said)):
            Loader(train, features=features)
    with pytest.raises(ValueError, match=re.escape("n_workers must be in 0..=1024")):
        Loader(train, n_workers=100_000)
    with pytest.raises(ValueError, match="at most 268435456 samples are planned at once"):
        plan_indices([10], 2**40)
    ld = Loader(train, seed=np.uint64(3), batch_size=np.int64(2), n_workers=1)
    assert np.array_equal(next(ld)["index"], next(Loader(train, seed=3, batch_size=2, n_workers=1))["index"])
    # An edited state near 2^64 was taken, and the loader waited for ever.
    state = ld.state()
    state["plan"]["position"] = 2**64 - 2
    with pytest.raises(StateError, match="position 18446744073709551614 and .* do not fit epoch"):
        Loader(train, seed=3, batch_size=2, n_workers=1, state=state)
    # Closed: every method said "'NoneType' object has no attribute ..." but next() and state().
    ld.close()
    for use in (len, lambda x: x.fingerprint, lambda x: x.n_workers, lambda x: x.shard_sizes, iter, next):
        with pytest.raises(ValueError, match="the loader is closed"):
            use(ld)
    assert ld.state()["plan"]["position"] == 2


def test_the_stub_declares_what_the_extension_exports() -> None:
    stub = ast.parse((Path(_rs.__file__).parent / "_rs.pyi").read_text())
    declared = {n.name for n in stub.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    constants = (n.target for n in stub.body if isinstance(n, ast.AnnAssign))
    declared |= {t.id for t in constants if isinstance(t, ast.Name)}
    assert declared == {n for n in dir(_rs) if not n.startswith("_")}
    (loader,) = (n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "Loader")
    methods = {n.name for n in loader.body if isinstance(n, ast.FunctionDef)}
    assert methods - {"__init__"} == {n for n in dir(_rs.Loader) if not n.startswith("_")} | {"__len__"}


def test_the_default_worker_count_is_one_per_cpu_the_process_may_run_on(demo_dir: Path) -> None:
    """``n_workers=0`` (the default): one decode thread per CPU in the process's affinity mask, as a
    Slurm job's --cpus-per-task sets it (Rust's `available_parallelism` reads the calling thread's)."""
    files = demo_dir / "train"
    assert DEFAULTS["n_workers"] == DataConfig().n_workers == 0
    allowed = os.sched_getaffinity(0)
    assert Loader(files, seed=0, batch_size=2).n_workers == len(allowed)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        one = Loader(files, seed=0, batch_size=2)
    finally:
        os.sched_setaffinity(0, allowed)
    assert one.n_workers == 1
    assert Loader(files, seed=0, batch_size=2, n_workers=3).n_workers == 3


def test_a_run_says_how_many_decode_threads_its_loader_runs(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default resolves on the machine the run lands on: its console says what it resolved to."""
    # test_torn_log's run, whose step the suite's compilation cache holds.
    args = ["--run", "cpus", "--log.runs-dir", str(tmp_path), "--steps", "4", "--eval-every", "0",
            "--ckpt-every", "2", "--data.batch-size", "4", "--data.train", str(demo_dir / "train"),
            "--data.eval", str(demo_dir / "eval")]  # fmt: skip
    assert pretrain(tyro.cli(PretrainConfig, args=args)) == 0
    threads = Loader(demo_dir / "train", seed=0, batch_size=4).n_workers  # the resolution: the test above
    out = capsys.readouterr().out
    assert f"loader: {threads} decode thread{'s' * (threads != 1)}\n" in out
    # ... and that its warmup (10, the default) outlasts its 4 updates: a try, or a mistyped --steps.
    assert "WARNING --optim.warmup-steps 10 >= the run's 4 optimizer updates: its LR never reaches" in out
    # More threads than cores: said (they take turns with each other and the step's).
    more = len(os.sched_getaffinity(0)) + 1
    assert pretrain(tyro.cli(PretrainConfig, args=[*args, "--data.n-workers", str(more)])) == 0
    said = f"loader: {more} decode threads (more than the {more - 1} CPUs this process may run on: they take"
    assert said in capsys.readouterr().out


def test_a_shard_index_goes_to_the_user_cache_where_an_empty_variable_is_unset(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An empty XDG_CACHE_HOME (or BIRDJEPA_CACHE) put the index of a shard in a read-only folder into the
    # job's working folder (the Python side reads empty as unset); a 250-byte shard name was never cached.
    import shutil

    shard = sorted((demo_dir / "train").glob("*.arrow"))[0]
    data = tmp_path / "data"
    data.mkdir()
    long_name = "s" * 244 + ".arrow"
    for name in (shard.name, long_name):
        shutil.copy(shard, data / name)
    # The index cannot go beside either: a folder in its place (as a read-only folder), a name too long.
    (data / f".{shard.name}.bjindex.json").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("BIRDJEPA_CACHE", "")
    monkeypatch.chdir(tmp_path)
    Loader([str(data / shard.name), str(data / long_name)], batch_size=2, train=False).close()
    cached = sorted(p.name for p in (tmp_path / "home" / ".cache" / "birdjepa" / "index").iterdir())
    assert len(cached) == 2 and not (tmp_path / "birdjepa").exists() and not (tmp_path / "index").exists()
    assert all(len(name.encode()) <= 255 for name in cached), cached
