"""View augmentations in the step: what each does to a known spectrogram, and local crops."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from birdjepa.config import AugmentConfig
from birdjepa.objectives.lejepa import local_crops
from birdjepa.train.augment import _warp, augment_views

MEAN, STD = -4.0, 4.0
DB = math.log(10) / 10


def only(**on: float | tuple[float, float]) -> AugmentConfig:
    """The named augmentations and nothing else (the warp is on by default)."""
    return AugmentConfig(**{"pitch_bins": 0.0, "stretch": 0.0, **on})


def views(b: int = 4, v: int = 2, t: int = 8, m: int = 6) -> jax.Array:
    x = np.arange(b * v * t * m, dtype=np.float32).reshape(b, v, t, m) / (b * v * t * m)
    return jnp.asarray(x)


def test_off_is_the_identity_and_each_view_draws_its_own_gain():
    x = views()
    assert augment_views(x, jax.random.key(0), only(), mean=MEAN, std=STD) is x
    y = np.asarray(augment_views(x, jax.random.key(0), only(gain_db=6.0), mean=MEAN, std=STD))
    # A gain adds the same dB to every bin of a view: in normalised units g * ln(10) / 10 / std.
    shift = (y - np.asarray(x)) * STD / DB  # dB per element
    per_view = shift.reshape(4, 2, -1)
    np.testing.assert_allclose(per_view, per_view[:, :, :1].repeat(per_view.shape[2], axis=2), atol=1e-3)
    gains = per_view[:, :, 0]
    assert np.all(np.abs(gains) <= 6.0 + 1e-3) and len(np.unique(np.round(gains, 3))) == 8
    # The same key gives the same views (a resumed step redraws them exactly).
    again = augment_views(x, jax.random.key(0), only(gain_db=6.0), mean=MEAN, std=STD)
    assert np.array_equal(np.asarray(again), y)


def test_tilt_is_linear_across_mel_bins():
    x = views()
    y = np.asarray(augment_views(x, jax.random.key(1), only(tilt_db=6.0), mean=MEAN, std=STD))
    shift = (y - np.asarray(x)) * STD / DB  # [B, V, T, M] in dB
    slope = shift[..., -1] - shift[..., 0]  # end-to-end change per row: 2 t
    np.testing.assert_allclose(
        np.diff(shift, axis=-1), np.diff(shift, axis=-1)[..., :1].repeat(5, -1), atol=1e-3
    )
    assert np.all(np.abs(slope) <= 12.0 + 1e-3)
    np.testing.assert_allclose(shift.mean(axis=-1), 0.0, atol=1e-3)  # a tilt keeps the level


def test_background_mixes_in_the_previous_sample_in_the_power_domain():
    x = views()
    cfg = only(mix_prob=1.0, mix_db=(-10.0, -10.0))
    y = np.asarray(augment_views(x, jax.random.key(2), cfg, mean=MEAN, std=STD))
    lp = np.asarray(x, np.float64) * STD + MEAN
    expected = np.log(np.exp(lp) + 0.1 * np.exp(np.roll(lp, 1, axis=0)))  # -10 dB = a tenth of the power
    np.testing.assert_allclose(y, (expected - MEAN) / STD, rtol=1e-5, atol=1e-5)


def test_local_crops_are_windows_of_the_views():
    x = views(b=3, v=2, t=16, m=4)
    crops = np.asarray(local_crops(x, jax.random.key(3), count=5, frames=4))
    assert crops.shape == (3, 5, 4, 4)
    xs = np.asarray(x)
    for b in range(3):
        for c in range(5):
            # Every crop is some view's rows [s, s + 4) for some start s.
            found = [
                (v, s)
                for v in range(2)
                for s in range(13)
                if np.array_equal(xs[b, v, s : s + 4], crops[b, c])
            ]
            assert found, (b, c)
    with pytest.raises(ValueError, match="local crops"):
        local_crops(x, jax.random.key(0), count=1, frames=32)


def test_warp_shifts_mel_bins_and_stretches_time_by_known_amounts():
    x = views(b=1, v=2, t=8, m=6)
    xs = np.asarray(x)
    # View 0: one bin higher, no stretch. View 1: twice as slow, no shift.
    y = np.asarray(_warp(x, jnp.array([[1.0, 0.0]]), jnp.array([[1.0, 2.0]]), reach=1.0))
    np.testing.assert_array_equal(y[0, 0, :, 1:], xs[0, 0, :, :-1])  # bin j now holds bin j - 1
    np.testing.assert_array_equal(y[0, 0, :, 0], xs[0, 0, :, 0])  # the lowest bin is held at the edge
    halfway = (xs[0, 1, :-1] + xs[0, 1, 1:]) / 2
    np.testing.assert_allclose(y[0, 1, 0::2], xs[0, 1, :4], rtol=0, atol=1e-7)  # frame 2i was frame i
    np.testing.assert_allclose(y[0, 1, 1::2], halfway[:4], rtol=0, atol=1e-6)  # and 2i+1 lies between
    # Through augment_views: each view draws its own warp, the same key redraws it exactly.
    cfg = only(pitch_bins=2.0, stretch=0.2)
    a = np.asarray(augment_views(x, jax.random.key(4), cfg, mean=MEAN, std=STD))
    assert a.shape == xs.shape and not np.array_equal(a[0, 0], a[0, 1])
    assert np.array_equal(a, np.asarray(augment_views(x, jax.random.key(4), cfg, mean=MEAN, std=STD)))


def gathered(x: jax.Array, pos: jax.Array, axis: int) -> jax.Array:
    """Linear interpolation along ``axis`` by two gathers, as the warp computed it until 2026-12-05."""
    n = x.shape[axis]
    pos = jnp.clip(pos, 0.0, n - 1.0)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, n - 1)
    shape = [1] * x.ndim
    shape[axis] = -1
    a, c = jnp.take(x, lo, axis=axis), jnp.take(x, hi, axis=axis)
    return a + (c - a) * (pos - lo).reshape(shape)


@pytest.mark.parametrize("reach", [0.0, 2.0, 2.5, 40.0])
def test_the_warp_gives_the_bits_of_gathers_along_both_axes(reach: float) -> None:
    """The mel shift selects among shifted copies instead of gathering: every bit as the gathers gave
    them (the step's digests rest on it), shifts at the reach and next to whole bins included, and a
    reach wider than the band (40 of 32 bins). A shift beyond the reach shows as NaN, not a wrong bin."""
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(3, 4, 64, 32)) * 3 - 5).astype(np.float32)
    shift = rng.uniform(-reach, reach, (3, 4)).astype(np.float32)
    shift[0] = [reach, -reach, min(reach, np.nextafter(np.float32(1), 0)), -min(reach, 1e-7)]
    stretch = np.exp(rng.uniform(-math.log1p(0.1), math.log1p(0.1), (3, 4))).astype(np.float32)
    stretch[1, :2] = [1.1, 1 / 1.1]

    def by_gathers(x: jax.Array, shift: jax.Array, stretch: jax.Array) -> jax.Array:
        t, m = x.shape[2:]

        def one(view: jax.Array, s: jax.Array, r: jax.Array) -> jax.Array:
            view = gathered(view, jnp.arange(m, dtype=jnp.float32) - s, axis=1)
            return gathered(view, jnp.arange(t, dtype=jnp.float32) / r, axis=0)

        return jax.vmap(jax.vmap(one))(x, shift, stretch)

    got = np.asarray(jax.jit(lambda *a: _warp(*a, reach=reach))(x, shift, stretch))
    want = np.asarray(jax.jit(by_gathers)(x, shift, stretch))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if reach == 2.0:
        beyond = np.asarray(_warp(x, shift + 3, stretch, reach=reach))
        assert np.isnan(beyond).any()


def test_noise_adds_power_at_the_views_own_floor_by_a_level_per_view():
    x = views(b=2, v=2, t=32, m=4)
    y = np.asarray(augment_views(x, jax.random.key(5), only(noise_db=10.0), mean=MEAN, std=STD))
    xs = np.asarray(x)
    assert np.all(y >= xs)  # noise only adds power
    # What was added, in power units over the view's own floor, is one level per view within 0..10 dB.
    lp, lq = xs * STD + MEAN, y.astype(np.float64) * STD + MEAN
    floor = np.quantile(lp.reshape(2, 2, 2, 16, 4).mean(axis=3), 0.2, axis=2)[:, :, None, :]
    level_db = 10 * np.log10((np.exp(lq) - np.exp(lp)) / np.exp(floor))
    per_view = level_db.reshape(2, 2, -1)
    np.testing.assert_allclose(per_view, per_view[:, :, :1].repeat(per_view.shape[2], 2), atol=0.05)
    assert np.all((per_view >= -0.05) & (per_view <= 10.05))
    assert len(np.unique(np.round(per_view[:, :, 0], 2))) == 4


def test_debug_disable_stochastic_draws_nothing_from_the_step_key() -> None:
    """The same batch under two step keys: with the flag every view, crop, mask, dropout draw and
    the loss are identical (==); without it they are not. Dropout, drop-path, augmentation, local
    views and the masked-span term are all on, so each draw has a chance to differ."""
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.model.vit import init_params
    from birdjepa.train.segment import model_config
    from birdjepa.train.step import StepConfig, init_key, make_loss_fn

    args = ["--model.preset", "tiny", "--model.dropout", "0.1", "--model.drop-path", "0.1",
            "--objective.lejepa.local-views", "2", "--objective.lejepa.span-weight", "0.5",
            "--model.predictor-depth", "1", "--augment.gain-db", "3"]  # fmt: skip
    batch = {
        "spectrogram": jax.random.normal(jax.random.key(3), (2, 2, 512, 128)),
        "label": jnp.array([0, 1]),
    }
    keys = jax.random.key(1), jax.random.key(2)
    for disabled in (True, False):
        cfg = tyro.cli(PretrainConfig, args=[*args, *(["--debug.disable-stochastic"] if disabled else [])])
        model_cfg = model_config(cfg, 4)
        params = init_params(model_cfg, init_key(cfg))["params"]
        loss = jax.jit(make_loss_fn(StepConfig.of(cfg, model_cfg), record=disabled))
        (la, aux_a), (lb, aux_b) = (loss(params, batch, k) for k in keys)
        if disabled:
            ra, rb = aux_a["record"], aux_b["record"]
            assert {k.split("|")[1].split("/")[0] for k in ra} >= {"keys", "draws", "forward"}
            assert [k for k in ra if not np.array_equal(np.asarray(ra[k]), np.asarray(rb[k]))] == []
            assert float(la) == float(lb)
        else:
            assert float(la) != float(lb)
