"""Invariants 1 and 2: the batch stream is a pure function of (data, config, seed, position), and
a loader rebuilt from `state()` continues exactly, in this process or another."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from birdjepa.data import Features, Loader, StateError, take

KEYS = ("spectrogram", "crop_offset", "label", "index", "shard_id", "epoch")
# Masks on, so augmentation randomness is part of what must reproduce.
AUGMENTED = Features(time_mask_count=2, time_mask_width=40, freq_mask_count=2, freq_mask_width=16)


def train_loader(demo_dir: Path, **kw: object) -> Loader:
    opts: dict = {"seed": 3, "batch_size": 4, "n_workers": 2, "shuffle_buffer": 16, "interleave": 2}
    opts.update(kw)
    return Loader(demo_dir / "train", **opts)


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for k in KEYS:
            assert x[k].dtype == y[k].dtype, (i, k)
            assert np.array_equal(x[k], y[k]), f"batch {i} differs in {k}"


def test_batch_contract(demo_dir: Path) -> None:
    (batch,) = take(train_loader(demo_dir), 1)
    assert set(batch) == set(KEYS)
    assert batch["spectrogram"].shape == (4, 512, 128) and batch["spectrogram"].dtype == np.float32
    for k in ("crop_offset", "label", "index", "shard_id", "epoch"):
        assert batch[k].shape == (4,) and batch[k].dtype == np.int64
    assert np.isfinite(batch["spectrogram"]).all()
    (views,) = take(train_loader(demo_dir, n_views=3), 1)
    assert views["spectrogram"].shape == (4, 3, 512, 128)
    assert views["crop_offset"].shape == (4, 3) and views["crop_offset"].dtype == np.int64
    # Independent crops: the views of one recording differ.
    assert not np.array_equal(views["spectrogram"][0, 0], views["spectrogram"][0, 1])


def test_worker_count_does_not_change_the_stream(demo_dir: Path) -> None:
    runs = [take(train_loader(demo_dir, n_workers=w, features=AUGMENTED), 12) for w in (1, 2, 4)]
    assert_same_batches(runs[0], runs[1])
    assert_same_batches(runs[0], runs[2])


def test_seed_changes_the_stream(demo_dir: Path) -> None:
    a = take(train_loader(demo_dir, seed=1), 3)
    b = take(train_loader(demo_dir, seed=2), 3)
    assert not all(np.array_equal(x["index"], y["index"]) for x, y in zip(a, b, strict=True))


def test_epochs_cover_the_data_set(demo_dir: Path) -> None:
    loader = train_loader(demo_dir, shuffle_buffer=8)
    n = len(loader)
    batches = take(loader, (3 * n) // 4 + 2)
    index = np.concatenate([b["index"] for b in batches])
    epoch = np.concatenate([b["epoch"] for b in batches])
    for e in (0, 1):
        assert sorted(index[epoch == e].tolist()) == list(range(n)), f"epoch {e}"


def test_restore_at_every_step_equals_the_straight_run(demo_dir: Path) -> None:
    steps, ahead = 50, 3
    loader = train_loader(demo_dir, features=AUGMENTED)
    states = [loader.state()]
    straight = []
    for _ in range(steps + ahead):
        straight.extend(take(loader, 1))
        states.append(loader.state())
    for k in range(steps):
        # A fresh loader (other worker count too) from the state after k batches.
        state = json.loads(json.dumps(states[k]))
        resumed = train_loader(demo_dir, features=AUGMENTED, n_workers=1 + k % 3, state=state)
        assert_same_batches(take(resumed, ahead), straight[k : k + ahead])
        assert resumed.state() == states[k + ahead]


RESUME_SCRIPT = """
import json, sys
import numpy as np
from birdjepa.data import Loader, Features, take
state = json.load(open(sys.argv[2]))
feats = Features(time_mask_count=2, time_mask_width=40, freq_mask_count=2, freq_mask_width=16)
loader = Loader(sys.argv[1], seed=3, batch_size=4, n_workers=1, shuffle_buffer=16, interleave=2,
                features=feats, state=state)
batches = take(loader, 4)
np.savez(sys.argv[3], **{f"{k}_{i}": b[k] for i, b in enumerate(batches) for k in b})
json.dump(loader.state(), open(sys.argv[4], "w"))
"""


def test_restore_in_a_new_process(demo_dir: Path, tmp_path: Path) -> None:
    loader = train_loader(demo_dir, features=AUGMENTED)
    take(loader, 7)
    (tmp_path / "state.json").write_text(json.dumps(loader.state()))
    expected = take(loader, 4)
    subprocess.run(
        [
            sys.executable,
            "-c",
            RESUME_SCRIPT,
            str(demo_dir / "train"),
            str(tmp_path / "state.json"),
            str(tmp_path / "out.npz"),
            str(tmp_path / "after.json"),
        ],
        check=True,
    )
    got = np.load(tmp_path / "out.npz")
    for i, b in enumerate(expected):
        for k in KEYS:
            assert np.array_equal(got[f"{k}_{i}"], b[k]), (i, k)
    assert json.loads((tmp_path / "after.json").read_text()) == loader.state()


def test_a_warming_buffer_grows_and_resumes_exactly(demo_dir: Path) -> None:
    """shuffle_initial (webdataset's `initial`): draws start at 2 buffered samples and the buffer grows
    by one per draw up to 16; a state taken while it grows resumes exactly, and it is part of the
    stream's signature."""
    loader = train_loader(demo_dir, interleave=1, shuffle_initial=2)
    states, straight = [loader.state()], []
    for _ in range(6):
        straight.extend(take(loader, 1))
        states.append(loader.state())
    assert [len(st["plan"]["buffer"]) for st in states] == [0, 6, 10, 14, 16, 16, 16]
    for k in (1, 2, 3):
        resumed = train_loader(demo_dir, interleave=1, shuffle_initial=2, state=states[k])
        assert_same_batches(take(resumed, 3), straight[k : k + 3])
    filled = take(train_loader(demo_dir, interleave=1), 6)  # the default fills the buffer first
    assert not all(np.array_equal(a["index"], b["index"]) for a, b in zip(filled, straight, strict=True))
    with pytest.raises(StateError, match="shuffle_initial: saved 2 now"):
        train_loader(demo_dir, interleave=1, state=states[2])


def test_state_is_small_and_json(demo_dir: Path) -> None:
    loader = train_loader(demo_dir, shuffle_buffer=16)
    take(loader, 5)
    state = loader.state()
    text = json.dumps(state)
    assert len(state["plan"]["buffer"]) == 16
    assert state["counters"] == {"batches": 5, "samples": 20, "skipped": 0}
    # Counters and indices only: no decoded audio (one spectrogram alone is 256 KiB).
    assert len(text) < 4096


def test_restore_rejects_other_data_and_stream_config(demo_dir: Path) -> None:
    loader = train_loader(demo_dir)
    take(loader, 2)
    state = loader.state()
    with pytest.raises(StateError, match="other data"):
        Loader(demo_dir / "eval", seed=3, batch_size=4, shuffle_buffer=16, interleave=2, state=state)
    with pytest.raises(StateError, match="batch_size: saved 4 now 8"):
        train_loader(demo_dir, batch_size=8, state=state)
    with pytest.raises(StateError, match="seed: saved 3 now 4"):
        train_loader(demo_dir, seed=4, state=state)
    # A clip option: the field that changed, where both clips' whole debug texts were printed (400 chars).
    with pytest.raises(StateError, match=r"config: clip\.fbank\.n_mels: saved 128 now 64$"):
        train_loader(demo_dir, features=Features(n_mels=64), state=state)
    # Decoded otherwise (an MP3 1105 samples later): the run of a state saved before the option decodes
    # without it, and the two never meet.
    with pytest.raises(StateError, match=r"config: gapless: saved true now \(absent\)$"):
        train_loader(demo_dir, features=Features(gapless=False), state=state)
    # n_workers only changes speed, so it may change across a resume.
    take(train_loader(demo_dir, n_workers=1, state=state), 1)


def test_a_folder_a_glob_and_a_list_of_its_shards_are_one_data_set(demo_dir: Path) -> None:
    shards = sorted(str(p) for p in (demo_dir / "train").glob("*.arrow"))
    assert len(shards) > 1
    folder = take(Loader(demo_dir / "train", seed=3, batch_size=4), 3)
    pattern = str(demo_dir / "train" / "*.arrow")
    assert_same_batches(folder, take(Loader(pattern, seed=3, batch_size=4), 3))
    assert_same_batches(folder, take(Loader(shards[::-1], seed=3, batch_size=4), 3))  # sorted first


def test_a_shard_index_that_cannot_be_written_beside_its_shard_goes_under_the_cache_folder(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard's row index is cached beside it (``.NAME.bjindex.json``) or, where that cannot be
    written (a read-only data folder; here the name is taken by a folder, as root writes anywhere),
    under ``$BIRDJEPA_CACHE/index``: the next start finds it there."""
    data = tmp_path / "data"
    data.mkdir()
    for shard in sorted((demo_dir / "train").glob("*.arrow"))[:2]:
        (data / shard.name).write_bytes(shard.read_bytes())
        (data / f".{shard.name}.bjindex.json" / "taken").mkdir(parents=True)
    monkeypatch.setenv("BIRDJEPA_CACHE", str(tmp_path / "cache"))
    first = take(Loader(data, seed=3, batch_size=4), 2)
    cached = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "cache" / "index").glob("*.json"))
    assert cached == sorted(f"{p.name}.json" for p in data.glob("*.arrow"))
    assert_same_batches(first, take(Loader(data, seed=3, batch_size=4), 2))
