"""Invariant 5: the LR applied at update s is schedule(s), from the first update on, checked against
what the optimizer actually did to the parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from birdjepa.config import OptimConfig
from birdjepa.train.optim import (
    accumulation_progress,
    applied_lr,
    make_optimizer,
    make_schedule,
    update_count,
)

# A linear loss has a constant gradient, for which Adam's bias-corrected step is exactly
# -lr * g / (|g| + eps) at every update: the parameter change reveals the LR that was applied.
GRAD = np.array([0.5, -2.0, 3.0], np.float32)


def run(cfg: OptimConfig, total: int, micro_steps: int) -> tuple[list[np.ndarray], list[float], object]:
    tx = make_optimizer(cfg, total)
    params = jnp.zeros(3, jnp.float32)
    state = tx.init(params)
    deltas, lrs = [], []
    update = jax.jit(tx.update)
    for _ in range(micro_steps):
        updates, state = update(jnp.asarray(GRAD), state, params)
        new = params + updates
        deltas.append(np.asarray(new - params))
        lrs.append(float(applied_lr(state)))
        params = new
    return deltas, lrs, state


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_applied_lr_is_schedule_of_the_update_index(schedule: str) -> None:
    cfg = OptimConfig(
        lr=0.1, weight_decay=0.0, clip_norm=0.0, warmup_steps=3, schedule=schedule, min_lr_ratio=0.1
    )
    total = 12
    sched = make_schedule(cfg, total)
    deltas, lrs, state = run(cfg, total, total)
    for s in range(total):
        expected = float(sched(s))
        assert lrs[s] == expected, (s, lrs[s], expected)
        # What the optimizer did: -lr * g / (|g| + 1e-8).
        implied = -deltas[s] * (np.abs(GRAD) + 1e-8) / GRAD
        np.testing.assert_allclose(implied, expected, rtol=2e-5)
    assert int(update_count(state)) == total
    # The first update already learns: schedule(0) > 0.
    assert lrs[0] > 0


def test_schedule_shapes() -> None:
    cos = make_schedule(OptimConfig(lr=1.0, warmup_steps=4, min_lr_ratio=0.0), 20)
    assert [float(cos(s)) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert float(cos(4)) == 1.0 and float(cos(19)) == pytest.approx(0.0, abs=1e-7)
    values = [float(cos(s)) for s in range(4, 20)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    wsd = make_schedule(
        OptimConfig(lr=1.0, warmup_steps=2, schedule="wsd", decay_fraction=0.25, min_lr_ratio=0.2), 20
    )
    assert [float(wsd(s)) for s in range(2, 15)] == [1.0] * 13
    assert float(wsd(19)) == pytest.approx(0.2)
    assert float(wsd(15)) < 1.0
    # A fraction of 0 decays nothing (it once put the last update at the floor).
    flat_cfg = OptimConfig(lr=1.0, warmup_steps=2, schedule="wsd", decay_fraction=0.0, min_lr_ratio=0.2)
    flat = make_schedule(flat_cfg, 20)
    assert [float(flat(s)) for s in range(2, 20)] == [1.0] * 18


def test_accumulation_applies_one_update_per_k_micro_steps() -> None:
    cfg = OptimConfig(lr=0.1, weight_decay=0.0, clip_norm=0.0, warmup_steps=2, grad_accum=3)
    sched = make_schedule(cfg, 4)
    tx = make_optimizer(cfg, 4)
    params = jnp.zeros(3, jnp.float32)
    state = tx.init(params)
    progress = []
    for micro in range(12):
        updates, state = tx.update(jnp.asarray(GRAD), state, params)
        delta = np.asarray(updates)
        progress.append(int(accumulation_progress(state)))
        if micro % 3 == 2:
            s = micro // 3
            assert float(applied_lr(state)) == float(sched(s))
            np.testing.assert_allclose(-delta * (np.abs(GRAD) + 1e-8) / GRAD, float(sched(s)), rtol=2e-5)
        else:
            assert not delta.any(), f"micro-step {micro} changed the parameters"
        params = params + updates
    assert progress == [1, 2, 0] * 4
    assert int(update_count(state)) == 4


def test_muon_builds_and_steps() -> None:
    cfg = OptimConfig(name="muon", lr=0.01, warmup_steps=1)
    tx = make_optimizer(cfg, 5)
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updates, state = tx.update(grads, state, params)
    assert float(applied_lr(state)) == float(make_schedule(cfg, 5)(0))
    assert all(np.isfinite(np.asarray(u)).all() for u in jax.tree.leaves(updates))


def test_the_update_s_grad_and_update_norm_metrics_are_the_norms_of_what_it_took_and_did() -> None:
    """`make_update`'s ``train/grad_norm`` (every gradient but the online probe's: what the clip bounds),
    ``train/probe_grad_norm`` and ``train/update_norm`` against float64 norms of the gradients and of
    the change the update applied: float32 sums of ~600 squares in another order, so within rtol 1e-6."""
    from birdjepa.train.step import make_update

    rng = np.random.default_rng(0)
    params = {"a": rng.normal(size=(16, 24)), "b": rng.normal(size=24), "c": np.zeros((0, 3)),
              "probe": rng.normal(size=(4, 5))}  # fmt: skip
    grads = {k: rng.normal(size=np.shape(v)) * 3 for k, v in params.items()}
    params, grads = (jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), t) for t in (params, grads))
    tx = make_optimizer(OptimConfig(), 10)
    update = jax.jit(make_update(tx))
    new, _, metrics, _, guard = update(params, tx.init(params), jnp.float32(1), {}, grads, False)
    assert bool(guard["finite"])

    def norm(tree: dict) -> float:
        return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in tree.values())))

    moved = {k: np.asarray(new[k], np.float64) - np.asarray(params[k], np.float64) for k in params}
    assert norm(moved) > 0
    rest, probe = {k: v for k, v in grads.items() if k != "probe"}, {"probe": grads["probe"]}
    np.testing.assert_allclose(float(metrics["train/grad_norm"]), norm(rest), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["train/probe_grad_norm"]), norm(probe), rtol=1e-6)
    np.testing.assert_allclose(float(metrics["train/update_norm"]), norm(moved), rtol=1e-6)


@pytest.mark.parametrize(
    "level", ["suite", pytest.param("default", marks=[pytest.mark.slow, pytest.mark.default_level])]
)
def test_the_online_probe_s_gradient_never_changes_the_other_parameters_updates(level: str) -> None:
    """The optimizer clips the probe's gradients apart from the rest's (`clip_apart`): over three
    updates whose encoder gradients are the same and whose probe gradients differ (as a labelled and an
    unlabelled batch make them), the encoder moves by the same bits, at the suite's -O0 and at XLA's
    default level. Each group is still clipped to ``clip_norm``, measured against float64 norms of what
    went in (rtol 1e-6: float32 arithmetic)."""
    from birdjepa.train.optim import clip_apart

    rng = np.random.default_rng(0)
    params = {"encoder": {"w": jnp.zeros((8, 4))}, "probe": {"head": {"kernel": jnp.zeros((4, 3))}}}
    encoder = [
        rng.normal(size=(8, 4)).astype(np.float32) * s for s in (0.5, 0.1, 0.3)
    ]  # norms ~2.8, 0.6, 1.7

    def moved(probe_scale: float) -> list[np.ndarray]:
        tx = make_optimizer(OptimConfig(clip_norm=1.0), 10)
        state, p, out = tx.init(params), params, []
        for g in encoder:
            probe = np.full((4, 3), probe_scale, np.float32)
            grads = {"encoder": {"w": jnp.asarray(g)}, "probe": {"head": {"kernel": jnp.asarray(probe)}}}
            updates, state = jax.jit(tx.update)(grads, state, p)
            p = optax.apply_updates(p, updates)
            out.append(np.asarray(p["encoder"]["w"]))
        return out

    labelled, unlabelled = moved(2.0), moved(0.0)
    assert all(np.array_equal(a, b) for a, b in zip(labelled, unlabelled, strict=True))

    grads = {"encoder": {"w": jnp.asarray(encoder[0])}, "probe": {"head": {"kernel": jnp.full((4, 3), 2.0)}}}
    clipped, _ = clip_apart(1.0).update(grads, None)
    for group, norm in (("encoder", np.linalg.norm(encoder[0].astype(np.float64))), ("probe", np.sqrt(48.0))):
        got = np.sqrt(
            sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(clipped[group]))
        )
        assert norm > 1.0
        np.testing.assert_allclose(got, 1.0, rtol=1e-6)
    small = jax.tree.map(lambda x: x / 10, grads)  # each group under the threshold: left as it is
    assert all(
        np.array_equal(a, b)
        for a, b in zip(
            jax.tree.leaves(clip_apart(1.0).update(small, None)[0]), jax.tree.leaves(small), strict=True
        )
    )
