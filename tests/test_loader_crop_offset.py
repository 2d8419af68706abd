"""Batches name each view's crop offset, and ``debug_crop_shift_index`` moves one sample's crops by one
hop on purpose (for tools that must find a planted difference)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from birdjepa.data import DEFAULTS, Features, Loader, StateError, take

HOP = Features().hop_length


def train_loader(demo_dir: Path, **kw: object) -> Loader:
    opts: dict = {"seed": 7, "batch_size": 4, "n_workers": 2, "shuffle_buffer": 16}
    opts.update(kw)
    return Loader(demo_dir / "train", **opts)


@pytest.mark.parametrize("n_views", [1, 2])
def test_crop_offsets_have_the_batch_shape_and_reproduce(demo_dir: Path, n_views: int) -> None:
    a = take(train_loader(demo_dir, n_views=n_views), 2)
    b = take(train_loader(demo_dir, n_views=n_views, n_workers=1), 2)
    shape = (4,) if n_views == 1 else (4, n_views)
    for x, y in zip(a, b, strict=True):
        assert x["crop_offset"].dtype == np.int64 and x["crop_offset"].shape == shape
        assert x["spectrogram"].shape[: len(shape)] == shape
        assert np.array_equal(x["crop_offset"], y["crop_offset"])
        # Demo recordings are 8-12 s and clips 5 s: offsets lie in [0, 7 s].
        assert (x["crop_offset"] >= 0).all() and (x["crop_offset"] <= 7 * Features().target_rate).all()
    assert any((x["crop_offset"] > 0).any() for x in a)
    if n_views == 2:
        assert any((x["crop_offset"][:, 0] != x["crop_offset"][:, 1]).any() for x in a)


def test_the_debug_shift_moves_only_its_samples_crops_by_one_hop(demo_dir: Path) -> None:
    assert DEFAULTS["debug_crop_shift_index"] == -1
    (plain,) = take(train_loader(demo_dir, n_views=2), 1)
    k = 2
    target = int(plain["index"][k])
    (moved,) = take(train_loader(demo_dir, n_views=2, debug_crop_shift_index=target), 1)
    for key in ("index", "label", "epoch", "shard_id"):
        assert np.array_equal(plain[key], moved[key])
    others = np.arange(4) != k
    assert np.array_equal(plain["crop_offset"][others], moved["crop_offset"][others])
    assert np.array_equal(plain["spectrogram"][others], moved["spectrogram"][others])
    step = moved["crop_offset"][k] - plain["crop_offset"][k]
    # One hop forward; less, or backward, only for a crop within a hop of the recording's end.
    assert ((step != 0) & (np.abs(step) <= HOP)).all(), step
    for v in range(2):
        assert not np.array_equal(plain["spectrogram"][k, v], moved["spectrogram"][k, v])


def test_the_debug_shift_moves_centre_crops_and_is_part_of_the_stream(demo_dir: Path) -> None:
    common = {"seed": 0, "batch_size": 5, "n_workers": 2, "train": False}
    (centre,) = take(Loader(demo_dir / "eval", **common), 1)
    assert centre["crop_offset"].shape == (5,) and (centre["crop_offset"] > 0).all()
    (moved,) = take(Loader(demo_dir / "eval", debug_crop_shift_index=3, **common), 1)
    assert (moved["crop_offset"] - centre["crop_offset"]).tolist() == [0, 0, 0, HOP, 0]
    # A state saved without the shift is refused by a loader with it (and the option is checked).
    loader = train_loader(demo_dir)
    take(loader, 1)
    with pytest.raises(StateError, match=r"debug_crop_shift_index: saved \(absent\) now 5"):
        train_loader(demo_dir, debug_crop_shift_index=5, state=loader.state())
    with pytest.raises(ValueError, match="debug_crop_shift_index must be >= -1"):
        train_loader(demo_dir, debug_crop_shift_index=-2)
