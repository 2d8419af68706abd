"""Objectives: SIGReg / Epps–Pulley, invariance, LeJEPA total, supervised and probe metrics."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from step_digests import ADDED, CONFIGS, by_the_old_code, metric, recorded, revised, step_digests

from birdjepa.objectives.lejepa import invariance_loss, lejepa_loss
from birdjepa.objectives.sigreg import (
    epps_pulley,
    epps_pulley_integrand,
    epps_pulley_knots,
    sigreg,
    sigreg_directions,
)
from birdjepa.objectives.span import span_loss, span_mask
from birdjepa.objectives.supervised import probe_metrics, supervised_loss


def np_trapezoid_doubled(f: np.ndarray, t: np.ndarray) -> float:
    """2 * trapezoid rule of f on knots t, written out."""
    return float(2.0 * np.sum((f[1:] + f[:-1]) * np.diff(t) / 2.0))


def test_sigreg_separates_gaussian_from_non_gaussian():
    kz, kd = jax.random.split(jax.random.key(0))
    sigreg_jit = jax.jit(sigreg)
    n, p = 2048, 16
    gauss = jax.random.normal(kz, (n, p))
    g = float(sigreg_jit(gauss, kd))
    # E[EP] for an i.i.d. N(0, 1) sample is ∫(1 - e^{-t²})e^{-t²/2} dt ≈ 1.06, independent of N.
    assert 0.5 < g < 2.0
    collapsed = float(sigreg_jit(jnp.full((n, p), 0.3), kd))
    scaled = float(sigreg_jit(10.0 * gauss, kd))
    uniform = float(sigreg_jit(jax.random.uniform(kz, (n, p)), kd))  # U[0, 1): wrong mean and variance
    for bad in (collapsed, scaled, uniform):
        assert bad > 100 * g
    # A standardised uniform (mean 0, var 1) is only caught in low dimension (random projections of many
    # independent coordinates are close to Gaussian); in 1-D it is still far from N(0, 1).
    u1 = jax.random.uniform(kz, (4096, 1), minval=-(3**0.5), maxval=3**0.5)
    assert float(sigreg_jit(u1, kd)) > 20 * float(sigreg_jit(jax.random.normal(kz, (4096, 1)), kd))


def test_epps_pulley_closed_form_single_point_at_zero():
    # N = 1, x = 0: φ_emp(t) = 1, integrand (1 - e^{-t²/2})² e^{-t²/2}.
    t_np = np.linspace(0.0, 3.0, 17)
    f_np = (1.0 - np.exp(-(t_np**2) / 2)) ** 2 * np.exp(-(t_np**2) / 2)
    t, _ = epps_pulley_knots(17, 3.0)
    np.testing.assert_allclose(np.asarray(t), t_np, rtol=0, atol=1e-7)
    integrand = np.asarray(epps_pulley_integrand(jnp.zeros((1, 1)), t))[0]
    np.testing.assert_allclose(integrand, f_np, rtol=1e-6, atol=1e-7)
    expected = 1 * np_trapezoid_doubled(f_np, t_np)
    np.testing.assert_allclose(float(epps_pulley(jnp.zeros((1, 1)))[0]), expected, rtol=1e-6)
    # ... and the quadrature is close to the exact full-line integral √(2π)(1 - 2/√2 + 1/√3).
    exact = np.sqrt(2 * np.pi) * (1 - 2 / np.sqrt(2) + 1 / np.sqrt(3))
    assert abs(expected - exact) / exact < 0.03


def test_epps_pulley_closed_form_symmetric_pair():
    # N = 2, x = ±a: φ_emp(t) = cos(a t) (the sines cancel); EP = 2 * ∫ (cos(at) - e^{-t²/2})² e^{-t²/2}.
    a = 1.3
    t_np = np.linspace(0.0, 3.0, 17)
    f_np = (np.cos(a * t_np) - np.exp(-(t_np**2) / 2)) ** 2 * np.exp(-(t_np**2) / 2)
    x = jnp.array([[a], [-a]], jnp.float32)
    np.testing.assert_allclose(float(epps_pulley(x)[0]), 2 * np_trapezoid_doubled(f_np, t_np), rtol=1e-5)


def test_invariance_zero_for_equal_views_and_positive_otherwise():
    z = jax.random.normal(jax.random.key(0), (4, 1, 8))
    same = jnp.repeat(z, 3, axis=1)
    assert float(invariance_loss(same)) == 0.0
    assert float(lejepa_loss(same, jax.random.key(1))["invariance"]) == 0.0
    noisy = same + 0.1 * jax.random.normal(jax.random.key(2), same.shape)
    assert float(invariance_loss(noisy)) > 0.0
    # Hand value: views [0, 0] and [2, 2] -> centre [1, 1], every squared deviation is 1.
    hand = jnp.array([[[0.0, 0.0], [2.0, 2.0]]])
    assert float(invariance_loss(hand)) == 1.0


def test_sigreg_directions_follow_the_key():
    k1, k2 = jax.random.key(3), jax.random.key(4)
    a1, a1_again, a2 = (
        sigreg_directions(k1, 32, 256),
        sigreg_directions(k1, 32, 256),
        sigreg_directions(k2, 32, 256),
    )
    assert a1.shape == (32, 256)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(a1), axis=0), 1.0, rtol=1e-5)
    assert np.array_equal(np.asarray(a1), np.asarray(a1_again))
    assert not np.allclose(np.asarray(a1), np.asarray(a2))
    z = jax.random.normal(jax.random.key(5), (8, 2, 32))
    assert np.array_equal(np.asarray(sigreg(z, k1)), np.asarray(sigreg(z, k1)))
    assert float(sigreg(z, k1)) != float(sigreg(z, k2))


def test_lejepa_total_and_determinism():
    z = jax.random.normal(jax.random.key(6), (8, 2, 16))
    key = jax.random.key(7)
    out = lejepa_loss(z, key, lam=0.05)
    assert set(out) == {"loss", "invariance", "sigreg"}
    np.testing.assert_allclose(
        float(out["loss"]), 0.95 * float(out["invariance"]) + 0.05 * float(out["sigreg"]), rtol=1e-6
    )
    # SIGReg pools the views: the same as on the [B*V, P] flattening.
    assert np.array_equal(np.asarray(out["sigreg"]), np.asarray(sigreg(z.reshape(16, 16), key)))
    again = lejepa_loss(z, key, lam=0.05)
    for k in out:
        assert np.array_equal(np.asarray(out[k]), np.asarray(again[k]))


def np_ce(logits: np.ndarray, label: int) -> float:
    logits = logits.astype(np.float64)
    return float(np.log(np.sum(np.exp(logits))) - logits[label])


def test_supervised_and_probe_ignore_missing_labels():
    logits = jnp.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [5.0, 0.0, 0.0]])
    labels = jnp.array([0, 2, -1, -1])
    l_np = np.asarray(logits)
    ce = (np_ce(l_np[0], 0) + np_ce(l_np[1], 2)) / 2  # only the two labelled samples
    sup = supervised_loss(logits, labels)
    np.testing.assert_allclose(float(sup["ce"]), ce, rtol=1e-6)
    np.testing.assert_allclose(float(sup["loss"]), ce, rtol=1e-6)
    assert float(sup["acc"]) == 0.5  # sample 0 right, sample 1 wrong (argmax 1, label 2)
    assert float(sup["n_labelled"]) == 2
    probe = probe_metrics(logits, labels)
    np.testing.assert_allclose(float(probe["probe_ce"]), ce, rtol=1e-6)
    assert float(probe["probe_acc"]) == 0.5
    assert float(probe["probe_n_labelled"]) == 2
    # Changing the logits of unlabelled rows changes nothing.
    moved = logits.at[2:].set(jnp.array([[9.0, -9.0, 0.0], [0.0, 0.0, 9.0]]))
    assert float(probe_metrics(moved, labels)["probe_ce"]) == float(probe["probe_ce"])
    # Multi-view logits [B, V, C] with per-sample labels [B]: labels broadcast over views.
    mv = jnp.stack([logits, logits], axis=1)
    np.testing.assert_allclose(float(probe_metrics(mv, labels)["probe_ce"]), ce, rtol=1e-6)
    assert float(probe_metrics(mv, labels)["probe_n_labelled"]) == 4


def test_no_labels_gives_zero_loss_and_zero_grad():
    logits = jnp.ones((3, 4))
    labels = jnp.full((3,), -1)
    sup = supervised_loss(logits, labels)
    assert float(sup["loss"]) == 0.0 and float(sup["acc"]) == 0.0 and float(sup["n_labelled"]) == 0.0
    g = jax.grad(lambda x: supervised_loss(x, labels)["loss"])(logits)
    assert np.all(np.asarray(g) == 0.0)


def test_label_shape_mismatch_is_loud():
    with pytest.raises(ValueError, match="do not match"):
        probe_metrics(jnp.zeros((3, 4)), jnp.zeros((2,), jnp.int32))


def test_jit_and_grad_are_finite():
    z = jax.random.normal(jax.random.key(8), (8, 2, 16))
    key = jax.random.key(9)
    eager = lejepa_loss(z, key)
    jitted = jax.jit(lejepa_loss)(z, key)
    for k in eager:
        np.testing.assert_allclose(float(jitted[k]), float(eager[k]), rtol=1e-5)
    grad_fn = jax.jit(jax.grad(lambda z, key: lejepa_loss(z, key)["loss"]))
    g = np.asarray(grad_fn(z, key))
    assert np.all(np.isfinite(g)) and np.any(g != 0.0)
    # Also finite at a collapsed point (all embeddings equal, zero invariance).
    g_collapsed = np.asarray(grad_fn(jnp.zeros((8, 2, 16)), key))
    assert np.all(np.isfinite(g_collapsed))
    labels = jnp.array([0, -1, 2, 1, -1, 0, 1, 2])
    logits = jax.random.normal(jax.random.key(10), (8, 3))
    g_sup = jax.jit(jax.grad(lambda x: supervised_loss(x, labels)["loss"]))(logits)
    assert np.all(np.isfinite(np.asarray(g_sup)))
    assert np.all(np.asarray(g_sup)[np.asarray(labels) < 0] == 0.0)


def test_multi_crop_invariance_centres_on_the_global_views():
    # Two equal global views at a, one local view at a + 3: only the local view is off the centre.
    a = jnp.arange(4.0).reshape(1, 1, 4)
    z = jnp.concatenate([a, a, a + 3.0], axis=1)  # [B=1, V=3, P=4]
    assert float(invariance_loss(z, n_global=2)) == 9.0 / 3  # (3² on 4 dims of 1 view) / (3 views x 4)
    assert float(invariance_loss(z)) == pytest.approx(float(jnp.mean(jnp.square(z - z.mean(1)))))


def test_per_view_sigreg_is_the_mean_of_each_views_statistic():
    z = jax.random.normal(jax.random.key(0), (64, 3, 8)) * jnp.array([1.0, 2.0, 0.5])[None, :, None]
    key = jax.random.key(1)
    per_view = float(sigreg(z, key, per_view=True))
    separately = [float(sigreg(z[:, v], key)) for v in range(3)]
    assert per_view == pytest.approx(np.mean(separately), rel=1e-5)
    assert per_view != pytest.approx(float(sigreg(z, key)), rel=1e-2)  # pooling tests another sample


def test_span_mask_hides_whole_time_spans():
    # 8 time steps x 2 mel patches, spans of 2 steps: 4 spans, round(0.5 * 4) = 2 hidden per sample.
    mask = np.asarray(span_mask(jax.random.key(0), (3, 2), (8, 2), 2, 0.5))
    assert mask.shape == (3, 2, 16)
    per_step = mask.reshape(3, 2, 8, 2)
    assert np.array_equal(per_step[..., 0], per_step[..., 1])  # every mel patch of a hidden step
    per_span = per_step[..., 0].reshape(3, 2, 4, 2)
    assert np.array_equal(per_span[..., 0], per_span[..., 1])  # whole spans
    assert (per_span[..., 0].sum(axis=-1) == 2).all()
    assert len({m.tobytes() for m in mask.reshape(6, 16)}) > 1  # drawn per view
    with pytest.raises(ValueError, match="does not divide"):
        span_mask(jax.random.key(0), (1,), (8, 1), 3, 0.5)


def test_span_loss_counts_hidden_tokens_only():
    target = jnp.zeros((1, 3, 2))
    prediction = jnp.array([[[1.0, 1.0], [2.0, 2.0], [100.0, 100.0]]])
    mask = jnp.array([[True, True, False]])
    assert float(span_loss(prediction, target, mask)) == 2.5  # (1 + 4) / 2; the visible 100s ignored


@pytest.mark.parametrize("per_view", [False, True])
def test_sigreg_of_summed_shard_statistics_and_its_surrogate_gradient_are_the_batchs(per_view: bool) -> None:
    """What the virtual-shard step computes (`birdjepa.train.virtual_shards`): SIGReg from the sums of
    four shards' statistics is the whole batch's SIGReg, and the shards' surrogates ``<G, sums>`` give
    its gradient. Not bit for bit: the batch's mean adds its N terms in another order (float32, 1e-5)."""
    from birdjepa.objectives.sigreg import sigreg, sigreg_from_sums, sigreg_partial_sums

    z = jax.random.normal(jax.random.key(0), (16, 3, 8)) * 1.3 + 0.2
    key = jax.random.key(1)
    kw = {"num_directions": 32, "num_knots": 17, "t_max": 3.0}
    shards = jnp.split(z, 4)

    def parts(shard: jax.Array) -> jax.Array:
        return sigreg_partial_sums(shard, key, per_view=per_view, **kw)

    sums = sum(parts(s) for s in shards)
    n = 16 if per_view else 16 * 3
    reg = lambda s: sigreg_from_sums(s, n, num_knots=17, t_max=3.0)  # noqa: E731
    value, g = jax.value_and_grad(reg)(sums)
    whole = sigreg(z, key, per_view=per_view, **kw)
    np.testing.assert_allclose(value, whole, rtol=1e-5)

    surrogate = [jax.grad(lambda s: jnp.sum(g * parts(s)))(s) for s in shards]
    np.testing.assert_allclose(
        jnp.concatenate(surrogate),
        jax.grad(lambda x: sigreg(x, key, per_view=per_view, **kw))(z),
        rtol=1e-4,
        atol=1e-6,
    )


def test_every_registered_objective_is_a_unit() -> None:
    """`--objective.kind` offers exactly the registry's names, each with its options group, and each
    class has the protocol's methods (`birdjepa.objectives.base.Objective`)."""
    import dataclasses
    import importlib
    import typing

    from birdjepa.objectives.base import Objective
    from birdjepa.objectives.options import REGISTRY, ObjectiveConfig, Options

    kinds = typing.get_args(typing.get_type_hints(ObjectiveConfig)["kind"])
    assert set(kinds) == set(REGISTRY)
    fields = {f.name: f.type for f in dataclasses.fields(ObjectiveConfig)}
    methods = [m for m in dir(Objective) if not m.startswith("_")]
    assert sorted(methods) == ["combine", "forward", "parts", "statistics", "terms", "totals"]
    for name, registration in REGISTRY.items():
        assert name in fields and isinstance(getattr(ObjectiveConfig(), name), registration.options)
        assert issubclass(registration.options, Options)
        module, cls = registration.implementation.split(":")
        implementation = getattr(importlib.import_module(module), cls)
        assert all(callable(getattr(implementation, m, None)) for m in methods), name


_OLD: dict[str, dict[str, str]] = {}


def _old_digests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """This machine's recording, or the old code's digests computed once per process."""
    if not _OLD:
        _OLD.update(recorded() or by_the_old_code(tmp_path_factory.mktemp("pre_registry")))
    return _OLD


@pytest.mark.parametrize(
    "name",
    # The default objective with every draw on in the suite; the other two steps' compiles run in CI,
    # and the default objective's again at XLA's default level, where a change's bits are the users'.
    [pytest.param(n, marks=[] if n == "lejepa" else [pytest.mark.slow]) for n in CONFIGS]
    + [pytest.param("lejepa", id="at-default-level", marks=[pytest.mark.slow, pytest.mark.default_level])],
)
def test_the_steps_compute_the_bits_they_computed_before_objectives_became_units(
    name: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Two steps (an accumulation, then an update, recorded as `trace` records it) of LeJEPA with every
    draw on, of the supervised objective, and of LeJEPA's virtual-shard step: every output, every
    recorded tensor's summary, as sha256 digests, equal to those the code before the objective
    registry computes on this kind of machine (`step_digests.py`: recorded for the kinds CI has run on,
    an AVX2 and two AVX-512 EPYCs whose LAPACK kernels differ, the last at XLA's default level too; on
    another kind, that code computes them here from git's history),
    but for the outputs a declared revision of the step moved since (`revised`)."""
    then = _old_digests(tmp_path_factory)[name]
    now = step_digests(CONFIGS[name])
    added = {k for k in now if metric(k) in ADDED}
    assert sorted(set(now) - added) == sorted(then), (name, set(now) ^ set(then))
    assert [k for k in then if now[k] != then[k] and not revised(k, CONFIGS[name])] == [], name


def test_the_patch_term_reads_each_token_back_to_its_own_patch_and_adds_up_over_shards() -> None:
    """``--objective.lejepa.patch-weight``: a linear map of each final token (the decoder at depth 0)
    against its own input patch, standardised over its values, added to LeJEPA's loss; a read-out
    with patches hidden is refused; the virtual-shard step's parts of two shards combine to the batch's
    terms. Expected values in float64 numpy (the model's float32: 1e-5)."""
    from birdjepa.model.config import preset
    from birdjepa.model.vit import BirdJepa, init_params
    from birdjepa.objectives.lejepa import LeJepa
    from birdjepa.objectives.options import LeJepaConfig

    cfg = preset("tiny", n_frames=64)
    options = LeJepaConfig(patch_weight=0.5)
    decoder = options.decoder(cfg)
    assert decoder is not None and decoder.depth == 0 and LeJepaConfig().decoder(cfg) is None
    params = init_params(cfg, jax.random.key(0), decoder)
    assert set(params["params"]["decoder"]) == {"out"}  # no mask token, no position: nothing unused
    model = BirdJepa(cfg, decoder)
    x = jax.random.normal(jax.random.key(1), (4, 2, 64, 128)) * 2.0 + 1.0
    every = jnp.broadcast_to(jnp.arange(4, dtype=jnp.int32), (4, 2, 4))
    out = model.apply(params, x, deterministic=True, readout=True)
    out["z"], out["sigreg_key"] = out["projection"], jax.random.key(2)
    kernel, bias = (np.asarray(params["params"]["decoder"]["out"][k], np.float64) for k in ("kernel", "bias"))
    tokens = np.asarray(out["tokens"], np.float64)
    np.testing.assert_allclose(out["reconstruction"], tokens @ kernel + bias, atol=1e-5)
    patches = np.asarray(out["patches"], np.float64)
    target = (patches - patches.mean(-1, keepdims=True)) / np.sqrt(patches.var(-1, keepdims=True) + 1e-6)
    patch = np.mean(np.square(tokens @ kernel + bias - target))
    objective = LeJepa(options, cfg)
    terms = objective.terms(out, {})
    np.testing.assert_allclose(float(terms["patch"]), patch, rtol=1e-5)
    inv, reg = float(terms["invariance"]), float(terms["sigreg"])
    np.testing.assert_allclose(float(terms["loss"]), 0.95 * inv + 0.05 * reg + 0.5 * patch, rtol=1e-5)
    with pytest.raises(ValueError, match="needs all 4 patches visible"):
        model.apply(params, x, deterministic=True, keep=every[..., :3])

    halves = [{k: v if k == "sigreg_key" else v[i : i + 2] for k, v in out.items()} for i in (0, 2)]
    sums = jax.tree.map(lambda a, b: a + b, *(objective.statistics(h, {}) for h in halves))
    totals = objective.totals(sums)
    parts = [objective.parts(h, {}, totals, batch_size=4) for h in halves]
    combined = objective.combine(jax.tree.map(lambda *a: jnp.stack(a), *parts), totals)
    for name in ("patch", "invariance", "sigreg", "loss"):
        np.testing.assert_allclose(float(combined[name]), float(terms[name]), rtol=1e-5)
