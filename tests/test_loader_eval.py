"""Eval mode: one ordered pass, every sample exactly once, centre crops, re-iterable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc
import pytest

from birdjepa.data import Features, Loader, take


def eval_loader(demo_dir: Path, **kw: object) -> Loader:
    opts: dict = {"seed": 0, "batch_size": 5, "n_workers": 2, "train": False}
    opts.update(kw)
    return Loader(demo_dir / "eval", **opts)


def labels_in_file_order(folder: Path) -> list[int]:
    labels: list[int] = []
    for path in sorted(folder.glob("*.arrow")):
        with ipc.open_file(path) as f:
            labels.extend(f.read_all().column("ebird_code").fill_null(-1).to_pylist())
    return labels


def test_every_sample_once_in_order_with_labels(demo_dir: Path) -> None:
    loader = eval_loader(demo_dir)
    batches = list(loader)
    index = np.concatenate([b["index"] for b in batches])
    assert index.tolist() == list(range(len(loader)))
    assert np.concatenate([b["label"] for b in batches]).tolist() == labels_in_file_order(demo_dir / "eval")
    assert all(len(b["index"]) == 5 for b in batches[:-1])
    assert sum(len(b["index"]) for b in batches) == len(loader)


def test_iterating_again_gives_the_same_pass(demo_dir: Path) -> None:
    loader = eval_loader(demo_dir)
    first = list(loader)
    second = list(loader)
    assert len(first) == len(second) > 0
    for a, b in zip(first, second, strict=True):
        for k in a:
            assert np.array_equal(a[k], b[k])


def test_a_pass_begun_by_next_is_followed_by_a_whole_one_and_a_closed_loader_keeps_its_state(
    demo_dir: Path,
) -> None:
    # A `for` after a `next()` gave the rest of the first pass only; an index past the end panicked in
    # the core with its lock held (every later call a PoisonError); a second close(), or state() after
    # a `with` block, was an AttributeError.
    whole = [i for b in eval_loader(demo_dir) for i in b["index"].tolist()]
    loader = eval_loader(demo_dir)
    next(loader)
    after_one = loader.state()
    assert [i for b in loader for i in b["index"].tolist()] == whole
    # Restored, a loader gives the rest of its pass, then whole ones (a pass began again at the state it
    # was restored from: restored at a pass's end, it gave empty passes for ever).
    for state, rest in ((after_one, whole[5:]), (loader.state(), [])):
        restored = eval_loader(demo_dir, state=state)
        assert [[i for b in restored for i in b["index"].tolist()] for _ in "ab"] == [rest, whole]
    with pytest.raises(IndexError, match=f"sample index {len(loader)}: the loader has {len(loader)} samples"):
        loader.encoded_audio(len(loader))
    state = loader.state()
    loader.close()
    loader.close()
    assert loader.state() == state and loader.diagnostics()["counters"] == state["counters"]
    with pytest.raises(ValueError, match="the loader is closed"):
        next(loader)


def test_drop_last(demo_dir: Path) -> None:
    n = len(eval_loader(demo_dir))
    batch_size = 7 if n % 7 else 5
    kept = list(eval_loader(demo_dir, batch_size=batch_size))
    dropped = list(eval_loader(demo_dir, batch_size=batch_size, drop_last=True))
    assert len(kept[-1]["index"]) == n % batch_size
    assert len(dropped) == n // batch_size
    assert all(len(b["index"]) == batch_size for b in dropped)
    # A batch larger than the set: every pass empty, without a word.
    with pytest.raises(ValueError, match=f"drop_last with batch_size {n + 1} drops every batch of a pass: "
                                         f"the set holds {n} rows"):  # fmt: skip
        eval_loader(demo_dir, batch_size=n + 1, drop_last=True)


def test_eval_has_no_augmentation(demo_dir: Path) -> None:
    masks = Features(time_mask_count=3, time_mask_width=50, freq_mask_count=3, freq_mask_width=20)
    plain = take(eval_loader(demo_dir, seed=1), 2)
    masked_seed = take(eval_loader(demo_dir, seed=2, features=masks), 2)
    for a, b in zip(plain, masked_seed, strict=True):
        assert np.array_equal(a["spectrogram"], b["spectrogram"])


def test_train_masks_zero_whole_frames_and_bins(demo_dir: Path) -> None:
    masks = Features(time_mask_count=2, time_mask_width=60, freq_mask_count=2, freq_mask_width=24)
    common = {"seed": 5, "batch_size": 8, "shuffle_buffer": 8}
    clean = take(Loader(demo_dir / "train", **common), 1)[0]["spectrogram"]
    masked = take(Loader(demo_dir / "train", features=masks, **common), 1)[0]["spectrogram"]
    changed = masked != clean
    assert changed.any()
    for c, m in zip(changed, masked, strict=True):
        # Every changed value lies in a fully zeroed time row or a fully zeroed mel column.
        rows = (m == 0).all(axis=1)
        cols = (m == 0).all(axis=0)
        assert (~changed_outside(c, rows, cols)).all()
        assert rows.sum() <= 2 * 60 and cols.sum() <= 2 * 24


def changed_outside(changed: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    return changed & ~rows[:, None] & ~cols[None, :]
