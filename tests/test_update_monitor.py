"""Weight-update monitor: in-graph stats vs numpy, frozen/exploding/vanishing detection with a real optax
optimizer under jit, a healthy run without warnings, state round-trip, and names vs the model's."""

from __future__ import annotations

import json
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from birdjepa.diagnostics.monitor import (
    VECTOR_STATS,
    UpdateMonitor,
    empty_stats,
    maybe_update_stats,
    param_names,
    update_stats,
)
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import init_params, named_params
from birdjepa.train.revisions import REVISIONS, is_redefined

Params = dict[str, dict[str, jax.Array]]
NAMES = ["dense/bias", "dense/kernel", "head/bias", "head/kernel"]


def init(seed: int = 0, unused: bool = False) -> Params:
    """A 4 -> 3 -> 1 MLP; biases start non-zero so every update ratio is moderate."""
    k = jax.random.split(jax.random.key(seed), 5)
    p = {
        "dense": {"kernel": jax.random.normal(k[0], (4, 3)), "bias": 0.1 * jax.random.normal(k[1], (3,))},
        "head": {"kernel": jax.random.normal(k[2], (3, 1)), "bias": 0.1 * jax.random.normal(k[3], (1,))},
    }
    if unused:  # not in the loss: its gradient is exactly zero
        p["unused"] = {"kernel": jax.random.normal(k[4], (2, 2))}
    return p


def data(seed: int = 1) -> tuple[jax.Array, jax.Array]:
    kx, kw = jax.random.split(jax.random.key(seed))
    x = jax.random.normal(kx, (16, 4))
    return x, jnp.tanh(x @ jax.random.normal(kw, (4, 1)))


def scale_grad(x: jax.Array, s: float) -> jax.Array:
    """Identity forward, gradient multiplied by ``s``."""
    return x * s - jax.lax.stop_gradient(x * (s - 1.0))


def loss_fn(params: Params, x: jax.Array, y: jax.Array, bias_grad_scale: float = 1.0) -> jax.Array:
    d, h = params["dense"], params["head"]
    hidden = jnp.tanh(x @ d["kernel"] + scale_grad(d["bias"], bias_grad_scale))
    return jnp.mean(jnp.square(hidden @ h["kernel"] + h["bias"] - y))


def make_step(tx: optax.GradientTransformation, bias_grad_scale: float = 1.0) -> Callable:
    """Jitted ``(params, opt_state, x, y, monitor) -> (params, opt_state, stats)``; the stats are computed
    under ``lax.cond`` only when ``monitor`` is true (a traced flag: one compiled step)."""

    @jax.jit
    def step(params, opt_state, x, y, monitor):
        grads = jax.grad(loss_fn)(params, x, y, bias_grad_scale)
        updates, opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        return new_params, opt_state, maybe_update_stats(monitor, grads, params, new_params)

    return step


def run(
    tx: optax.GradientTransformation, steps: int, params: Params | None = None, **kw: float
) -> list[dict[str, np.ndarray]]:
    """Stats of every step (monitor on every step), as numpy."""
    params = init() if params is None else params
    opt_state = tx.init(params)
    step, (x, y) = make_step(tx, **kw), data()
    out = []
    for _ in range(steps):
        params, opt_state, stats = step(params, opt_state, x, y, True)
        out.append(jax.device_get(stats))
    return out


def frozen_head_kernel_tx() -> optax.GradientTransformation:
    """AdamW whose update of head/kernel is zeroed (its gradient is still non-zero)."""
    mask = {"dense": {"kernel": False, "bias": False}, "head": {"kernel": True, "bias": False}}
    return optax.chain(optax.adamw(1e-2), optax.masked(optax.set_to_zero(), mask))


def test_update_stats_matches_numpy_and_uses_the_actual_change():
    params = init()
    x, y = data()
    grads = jax.grad(loss_fn)(params, x, y)
    tx = optax.adamw(1e-2, weight_decay=0.1)
    updates, _ = tx.update(grads, tx.init(params), params)
    after = optax.apply_updates(params, updates)
    stats = jax.device_get(jax.jit(update_stats)(grads, params, after))

    assert param_names(params) == NAMES
    assert {k: v.shape for k, v in stats.items() if k in VECTOR_STATS} == {k: (4,) for k in VECTOR_STATS}
    flat = {
        name: [np.asarray(named_params(t)[name], np.float64) for t in (grads, params, after)]
        for name in NAMES
    }
    for i, name in enumerate(NAMES):
        g, w0, w1 = flat[name]
        want = {
            "grad_norm": np.linalg.norm(g.ravel()),
            "grad_max_abs": np.max(np.abs(g)),
            "grad_mean_abs": np.mean(np.abs(g)),
            "param_norm": np.linalg.norm(w0.ravel()),
            "update_norm": np.linalg.norm((w1 - w0).ravel()),
            "update_ratio": np.linalg.norm((w1 - w0).ravel()) / (np.linalg.norm(w0.ravel()) + 1e-12),
        }
        for k, v in want.items():
            # float32 sums of a dozen squares against float64: well inside rtol 1e-6.
            np.testing.assert_allclose(stats[k][i], v, rtol=1e-6, err_msg=f"{k} of {name}")
    assert stats["vanishing"] == 0 and stats["exploding"] == 0

    # The ratio comes from params_after - params_before, not from the gradient: moving one leaf by hand
    # (gradients unchanged) gives exactly that leaf a ratio, the others exactly 0.
    moved = jax.tree.map(lambda a: a, params)
    moved["head"]["bias"] = params["head"]["bias"] + 0.5
    stats = jax.device_get(jax.jit(update_stats)(grads, params, moved))
    j = NAMES.index("head/bias")
    expect = 0.5 / np.linalg.norm(np.asarray(params["head"]["bias"], np.float64))
    np.testing.assert_allclose(stats["update_ratio"][j], expect, rtol=1e-6)
    assert [float(r) for i, r in enumerate(stats["update_ratio"]) if i != j] == [0.0, 0.0, 0.0]


def test_masked_parameter_is_frozen_after_exactly_patience_checks():
    patience = 3
    tx = frozen_head_kernel_tx()
    params = init()
    opt_state = tx.init(params)
    step, (x, y) = make_step(tx), data()
    monitor = UpdateMonitor(param_names(params), patience=patience)
    checks = []
    for s in range(2 * patience + 2):
        params, opt_state, stats = step(params, opt_state, x, y, s % 2 == 0)  # monitor_interval = 2
        if s % 2:
            with pytest.raises(ValueError, match="placeholder"):
                monitor.observe(s, stats)  # the skipped branch's NaN / -1 placeholder is refused
            continue
        checks.append(monitor.observe(s, stats))

    frozen_counts = [m["monitor/frozen"] for m, _ in checks]
    assert frozen_counts == [0.0] * (patience - 1) + [1.0] * (len(checks) - patience + 1)
    # The only warning is the freeze, once, at the patience-th check, naming the parameter.
    warned = [(i, w) for i, (_, ws) in enumerate(checks) for w in ws]
    assert len(warned) == 1 and warned[0][0] == patience - 1
    assert "newly frozen" in warned[0][1] and "head/kernel" in warned[0][1]
    assert not any(n in warned[0][1] for n in ("dense/kernel", "dense/bias", "head/bias"))
    assert monitor.frozen == ["head/kernel"]
    metrics = checks[-1][0]
    assert metrics["monitor/smallest_ratio/head/kernel"] == 0.0
    assert metrics["monitor/update_ratio/min"] == 0.0
    assert metrics["monitor/vanishing"] == 0.0 and metrics["monitor/exploding"] == 0.0


def test_exploding_gradient_is_reported_by_name():
    stats = run(optax.adamw(1e-2), 2, bias_grad_scale=1e6)
    monitor = UpdateMonitor(NAMES)
    for s, st in enumerate(stats):
        assert int(st["exploding"]) == 1  # in-graph count
        metrics, warnings = monitor.observe(s, st)
        assert metrics["monitor/exploding"] == 1.0
        assert len(warnings) == 1 and "exploding" in warnings[0] and "dense/bias" in warnings[0]
        assert "dense/kernel" not in warnings[0] and "head/" not in warnings[0]
        assert metrics["monitor/grad_norm/max"] >= 1e2


def test_vanishing_gradient_is_reported_by_name():
    stats = run(optax.adamw(1e-2), 2, params=init(unused=True))
    monitor = UpdateMonitor(NAMES + ["unused/kernel"])
    for s, st in enumerate(stats):
        assert int(st["vanishing"]) == 1 and int(st["exploding"]) == 0
        metrics, warnings = monitor.observe(s, st)
        assert metrics["monitor/vanishing"] == 1.0 and metrics["monitor/frozen"] == 0.0
        assert len(warnings) == 1 and "vanishing" in warnings[0] and "unused/kernel" in warnings[0]
    # A parameter the objective builds and no loss reads (MAE's projector): warned at every check.
    idle = UpdateMonitor(NAMES + ["unused/kernel"], idle=("unused/",), patience=1, frozen_ratio=1.0)
    counted = UpdateMonitor(NAMES + ["unused/kernel"], patience=1, frozen_ratio=1.0)  # as before revision 6
    for s, st in enumerate(stats):
        metrics, warnings = idle.observe(s, st)
        assert metrics["monitor/vanishing"] == 0.0 and not any("unused/" in w for w in warnings), warnings
        # Nor its ratio of 0 every check's minimum and first smallest, hiding the ratios to watch.
        assert not any("unused/" in k for k in metrics) and metrics["monitor/update_ratio/min"] > 0, metrics
        # Every metric that moved is one the step's revision 6 declares redefined (`compare` leaves those
        # out of a run resumed across it): monitor/vanishing and monitor/frozen were not.
        before, _ = counted.observe(s, st)
        moved = {k for k in {*metrics, *before} if metrics.get(k) != before.get(k)}
        assert {"monitor/vanishing", "monitor/frozen"} <= moved, moved
        assert all(is_redefined(k, REVISIONS[5].redefines) for k in moved), moved
    assert "unused/kernel" not in idle.frozen and idle.frozen  # the others still are, at this ratio


def test_healthy_run_has_no_warnings():
    stats = run(optax.adamw(1e-2), 6)
    monitor = UpdateMonitor(NAMES, top_k=2)
    for s, st in enumerate(stats):
        metrics, warnings = monitor.observe(s, st)
        assert warnings == []
        assert (
            metrics["monitor/frozen"] == metrics["monitor/vanishing"] == metrics["monitor/exploding"] == 0.0
        )
        assert all(type(v) is float for v in metrics.values())
        assert len([k for k in metrics if k.startswith("monitor/smallest_ratio/")]) == 2
        ratio = metrics["monitor/update_ratio/min"], metrics["monitor/update_ratio/max"]
        assert 0.0 < ratio[0] <= metrics["monitor/update_ratio/median"] <= ratio[1]
    assert monitor.frozen == []


def test_state_round_trip_mid_run_gives_identical_outputs():
    stats = run(frozen_head_kernel_tx(), 7)
    kw = {"patience": 3, "top_k": 3}
    whole = UpdateMonitor(NAMES, **kw)
    expected = [whole.observe(s, st) for s, st in enumerate(stats)]

    first = UpdateMonitor(NAMES, **kw)
    for s in range(2):  # head/kernel is two checks into its streak: the counter must survive
        first.observe(s, stats[s])
    resumed = UpdateMonitor(NAMES, **kw)
    resumed.load_state(json.loads(json.dumps(first.state())))
    assert resumed.state() == first.state()
    assert [resumed.observe(s, stats[s]) for s in range(2, 7)] == expected[2:]
    assert resumed.state() == whole.state()

    # The check is sensitive: without the state the freeze is reported two checks late.
    fresh = UpdateMonitor(NAMES, **kw)
    assert [fresh.observe(s, stats[s]) for s in range(2, 7)] != expected[2:]
    with pytest.raises(ValueError, match="steps must increase"):
        resumed.observe(6, stats[6])


def test_names_match_model_named_params():
    params = init_params(ModelConfig(n_classes=4), jax.random.key(0))["params"]
    names = param_names(params)
    assert names == sorted(named_params(params)) and len(names) == len(jax.tree.leaves(params))
    assert "encoder/block_0/attn/qkv/kernel" in names and "probe/head/kernel" in names
    assert param_names({"params": params}) == names  # the init wrapper is dropped, as named_params does
    shapes = jax.eval_shape(update_stats, params, params, params)
    assert all(shapes[k].shape == (len(names),) for k in VECTOR_STATS)
    assert jax.eval_shape(empty_stats, params) == shapes
    UpdateMonitor(names)  # sorted and unique
