"""The MAE objective (`birdjepa.objectives.mae`): its masks, its loss, an encoder that sees only the
visible patches, and the harness's promises for a run that trains it (exact resume mid-accumulation
with its evaluation, monitor, IID diagnostics and non-finite guard; a trace that replays it). Its
virtual-shard step on 1, 2 and 4 devices is in `test_virtual_shards.py`, its bisect row in
`test_divergence.py`."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_resume import resumed_differs

import birdjepa
from birdjepa.divergence.trace import trace_step
from birdjepa.model.config import preset
from birdjepa.model.vit import BirdJepa, init_params
from birdjepa.objectives.mae import Mae, block_shape, patch_errors, patch_masks
from birdjepa.objectives.options import MaeConfig
from birdjepa.rundir.metrics_log import metrics_by_step


@pytest.mark.parametrize(
    ("masking", "grid", "block"),
    [
        ("random", (8, 4), (1, 1)),
        ("time", (8, 4), (2, 4)),
        ("freq", (8, 4), (8, 1)),
        ("block", (8, 4), (2, 2)),
    ],
)
def test_masks_hide_the_same_count_in_every_view_in_whole_blocks(
    masking: str, grid: tuple[int, int], block: tuple[int, int]
) -> None:
    options = MaeConfig(masking=masking, block_time=2, block_freq=1 if masking == "freq" else 2)
    assert block_shape(options, grid) == block
    n, hidden = grid[0] * grid[1], 24  # 0.75 of 32: a multiple of every block here
    keep, mask = patch_masks(jax.random.key(3), (5, 2), grid, block, hidden)
    keep, mask = np.asarray(keep), np.asarray(mask)
    assert keep.shape == (5, 2, n - hidden) and mask.shape == (5, 2, n)
    assert (mask.sum(-1) == hidden).all()
    for k, m in zip(keep.reshape(-1, n - hidden), mask.reshape(-1, n), strict=True):
        assert (np.diff(k) > 0).all() and not m[k].any()  # ascending, and every kept patch is visible
        # Each block (time-major grid) is all hidden or all visible.
        blocks = m.reshape(grid[0] // block[0], block[0], grid[1] // block[1], block[1])
        per_block = blocks.transpose(0, 2, 1, 3).reshape(-1, block[0] * block[1])
        assert (per_block.all(-1) | ~per_block.any(-1)).all()
    # Every view draws its own (of 4 ways to hide 3 of 4 time spans or bands, 28 of 6 of 8 blocks).
    distinct = len({m.tobytes() for m in mask.reshape(-1, n)})
    assert distinct > 1 and (masking != "random" or distinct == 10), distinct


def test_a_count_that_is_no_multiple_of_a_block_hides_one_block_in_part() -> None:
    _, mask = patch_masks(jax.random.key(0), (4,), (8, 1), (2, 1), 5)
    pairs = np.asarray(mask).reshape(4, 4, 2).sum(-1)  # hidden patches per block of 2
    assert (np.sort(pairs, axis=-1) == [0, 1, 2, 2]).all()


def test_the_loss_is_the_error_of_the_hidden_patches_only() -> None:
    rng = np.random.default_rng(0)
    patches = rng.normal(size=(2, 1, 4, 6)).astype(np.float32)
    mask = np.array([[[True, False, True, False]], [[False, True, True, False]]])
    target = (patches - patches.mean(-1, keepdims=True)) / np.sqrt(patches.var(-1, keepdims=True) + 1e-6)
    reconstruction = np.where(mask[..., None], target, 100.0)  # exact where hidden, far off elsewhere
    out = {"reconstruction": reconstruction, "patches": patches, "mask": mask}
    mae = Mae(MaeConfig(mask_ratio=0.5), preset("tiny", n_frames=64))
    assert float(mae.terms(out, {})["loss"]) < 1e-10
    errors = np.asarray(patch_errors(jnp.asarray(reconstruction + 1.0), jnp.asarray(patches), norm_pix=True))
    off = {**out, "reconstruction": reconstruction + 1.0}
    assert np.isclose(float(mae.terms(off, {})["loss"]), errors[mask].mean(), rtol=1e-6)  # float sums
    raw = {**out, "reconstruction": np.where(mask[..., None], patches, 0.0)}
    assert (
        float(
            Mae(MaeConfig(mask_ratio=0.5, norm_pix=False), preset("tiny", n_frames=64)).terms(raw, {})["loss"]
        )
        == 0.0
    )


def test_the_encoder_never_sees_the_hidden_patches() -> None:
    """Changing the hidden patches of the input leaves the embedding and the reconstruction as they were
    (the visible tokens alone enter the blocks), while their targets change."""
    cfg = preset("tiny", n_frames=64, input_norm="none")
    decoder = MaeConfig().decoder(cfg)
    params = init_params(cfg, jax.random.key(0), decoder)
    model = BirdJepa(cfg, decoder)
    x = np.asarray(jax.random.normal(jax.random.key(1), (2, 64, 128)))
    keep = jnp.array([[0, 2], [1, 3]])  # of 4 time patches of 16 frames
    y = x.copy()
    y[0, 16:32] += 5.0  # patch 1 of sample 0, hidden
    y[1, 0:16] -= 5.0  # patch 0 of sample 1, hidden
    a, b = (model.apply(params, v, deterministic=True, keep=keep) for v in (x, y))
    assert np.array_equal(a["embedding"], b["embedding"]) and np.array_equal(
        a["reconstruction"], b["reconstruction"]
    )
    assert a["tokens"].shape == (2, 2, cfg.dim) and a["reconstruction"].shape == (2, 4, 16 * 128)
    assert not np.array_equal(a["patches"], b["patches"])
    z = x.copy()
    z[0, 0:16] += 5.0  # a visible patch
    assert not np.array_equal(
        model.apply(params, z, deterministic=True, keep=keep)["embedding"], a["embedding"]
    )


MAE = ("--objective.kind", "mae", "--optim.grad-accum", "2", "--monitor-interval", "1",
       "--debug.nonfinite-steps", "4", "--on-nonfinite", "skip")  # fmt: skip


@pytest.mark.slow  # three segments and a trace, compiling at the default level (CI's last stage)
@pytest.mark.default_level
def test_an_mae_run_resumes_exactly_mid_accumulation_and_its_trace_replays(
    demo_dir: Path, tmp_path: Path
) -> None:
    """6 steps with kNN evaluations at steps 2 and 5 and the linear probe at the end, an update every 2
    steps, the weight-update monitor at every update, a NaN batch at step 4 skipped; resumed after
    step 2 (half an update done). Every logged metric is equal, evaluations included."""
    assert resumed_differs(demo_dir, tmp_path, *MAE) == []
    logged = metrics_by_step(tmp_path / "straight")
    assert logged[2]["train/accum_progress"] == 1.0  # the stop fell mid-update
    assert {"train/mse", "train/probe_acc", "train/embedding_rank", "eval/knn_acc"} <= set(
        logged[2] | logged[5]
    )
    assert "monitor/update_ratio/median" in logged[1] and "dataloader/window_batches" in logged[5]
    assert logged[5]["train/skipped_updates"] == 1.0  # the NaN step's update was not applied
    assert "train/projection_rank" not in logged[0]  # no loss reads MAE's projector
    # A trace of step 3 from checkpoint 2: its outputs are the run's, and it recorded the masks and
    # the decoder's calls.
    t = trace_step(tmp_path / "resumed", 3, keep=("draws",))
    matched = t.manifest["matches_run"]
    assert matched["logged_metrics_equal"] is True and False not in matched.values(), matched
    # Its checkpoints restore for `evaluate`, `export` and `benchmark` (the decoder is in their state).
    encoder = birdjepa.load_encoder(tmp_path / "resumed")
    assert encoder.identity.startswith("run:resumed@5#")
    names = {e.name for e in t.entries}
    assert "patch_mask" in names and any(n.startswith("global/decoder/") for n in names), sorted(names)[:20]


def test_an_mae_run_on_one_view_trains(demo_dir: Path, tmp_path: Path) -> None:
    """``--data.n-views 1`` (the loader's batches are then ``[B, T, M]``, one view each), which the
    options accept for MAE: two steps train, with the default augmentation (the step once stopped at
    ``augment_views`` with a traceback)."""
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.pretrain.loop import pretrain

    args = ["--objective.kind", "mae", "--data.n-views", "1", "--run", "one", "--log.runs-dir",
            str(tmp_path), "--steps", "2", "--data.batch-size", "4", "--eval-every", "0",
            "--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval")]  # fmt: skip
    assert pretrain(tyro.cli(PretrainConfig, args=args)) == 0
    logged = metrics_by_step(tmp_path / "one")
    assert sorted(logged) == [0, 1] and all(np.isfinite(m["train/mse"]) for m in logged.values())


def test_mae_options_that_cannot_work_are_refused() -> None:
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.validation import OptionError, check

    def refused(*args: str) -> str:
        with pytest.raises(OptionError) as e:
            check(tyro.cli(PretrainConfig, args=["--objective.kind", "mae", *args]), data=False)
        return str(e.value)

    assert refused("--objective.mae.masking", "freq") == (
        "--objective.mae.block-freq 2: must divide the 1 frequency patches "
        "(set --model.patch-freq to cut bands)"
    )
    assert refused("--objective.mae.masking", "time", "--objective.mae.block-time", "5").startswith(
        "--objective.mae.block-time 5: must divide the 32 time patches"
    )
    assert refused("--objective.mae.mask-ratio", "1.0") == "--objective.mae.mask-ratio 1.0: must be in (0, 1)"
    assert refused("--objective.mae.decoder-dim", "48", "--objective.mae.decoder-heads", "5").startswith(
        "--objective.mae.decoder-heads 5: must divide"
    )
    check(tyro.cli(PretrainConfig, args=["--objective.kind", "mae", "--data.n-views", "1"]), data=False)
