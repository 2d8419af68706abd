"""The model's calls as an objective sees them (`birdjepa.objectives.base.Model`), and what wraps them:
the divergence plants of ``--debug.plant`` (`birdjepa.faults`) and the recording of `birdjepa trace`.
Neither lives in an objective or in the loss function: an objective calls the model and draws its keys
through `ModelCalls`, which plants and records around those calls."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from birdjepa.train.calls import recorded


def plant_pos_embed_bf16(params: Any) -> Any:
    """``params`` with the encoder's position embedding rounded to bfloat16 (``--debug.plant``)."""
    encoder = dict(params["encoder"])
    encoder["pos_embed"] = encoder["pos_embed"].astype(jnp.bfloat16).astype(jnp.float32)
    return {**params, "encoder": encoder}


PLANT_SCALE = 1.0 + 2.0**-10
"""How much the forward plants scale one call's input: a few hundred ulps, as a changed constant would."""

NOISE_PHASE_ENV = "BIRDJEPA_DEBUG_NOISE_PHASE"
"""``--debug.plant noisy_execution``: whether a process's first execution of a step is the scaled one
(1) or not (0, the default); this stands in for what makes a GPU's atomics differ from run to run."""


def execution_parity() -> jax.Array:
    """0 or 1, alternating on every execution of the function being compiled (its own count, starting at
    $BIRDJEPA_DEBUG_NOISE_PHASE): a host callback, so no two consecutive executions are the same. One
    device only (each device would count)."""
    count = itertools.count(int(os.environ.get(NOISE_PHASE_ENV, "0")))
    return jax.pure_callback(lambda: np.float32(next(count) % 2), jax.ShapeDtypeStruct((), jnp.float32))


@contextlib.contextmanager
def planted(plant: str | None) -> Iterator[None]:
    """``--debug.plant`` of a code change inside a module (`birdjepa.faults`): one call's input scaled
    by `PLANT_SCALE` on its way from the caller, as if the caller's code between two calls changed;
    ``noisy_execution``: the first block's input scaled on every other execution (`execution_parity`)."""
    targets = {
        "mlp_between_fc1_and_fc2": ("fc2", 0),
        "block_residual_scale": ("DropPath_0", 1),
        "decoder_input_scaled": ("embed", 0),  # the MAE decoder's first layer
        "noisy_execution": ("block_0", 0),
    }
    target = targets.get(plant or "")
    if target is None:
        yield
        return
    scale = 1.0 + (PLANT_SCALE - 1.0) * execution_parity() if plant == "noisy_execution" else PLANT_SCALE
    calls: dict[tuple, int] = {}

    def interceptor(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        if module.name == target[0] and context.method_name == "__call__":
            k = calls.get(module.path, 0)
            calls[module.path] = k + 1
            if k == target[1]:  # this module's k-th call
                args = (args[0] * jnp.asarray(scale, args[0].dtype), *args[1:])
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield


class ModelCalls:
    """The `birdjepa.objectives.base.Model` an objective's forward sees: the model's calls and the
    step's draws, with the divergence plants (`planted`) and the recording of `birdjepa trace`
    around them."""

    def __init__(
        self,
        plant: str | None,
        deterministic: bool,
        model: nn.Module,
        params: Any,
        keys: tuple,
        record: list | None,
    ) -> None:
        """``keys``: (the key of the draws, the main call's dropout key, the shared key)."""
        if plant == "pos_embed_bf16":  # --debug.plant: one parameter computed in bfloat16
            params = plant_pos_embed_bf16(params)
        key, dropout, shared_key = keys
        if plant == "dropout_key":  # --debug.plant: another dropout key
            dropout = jax.random.fold_in(dropout, 1)
        self.plant, self.deterministic, self.model = plant, deterministic, model
        self.params, self.rec = params, record
        self.key, self.dropout, self.shared_key = key, dropout, shared_key
        self.model_cfg = model.cfg.resolved()
        self.recording = record is not None

    def apply(self, call: str, x: jax.Array, dropout: jax.Array, **kw: Any) -> dict[str, jax.Array]:
        def run() -> dict[str, jax.Array]:
            rngs = {"dropout": dropout}
            variables = {"params": self.params}
            return self.model.apply(variables, x, deterministic=self.deterministic, rngs=rngs, **kw)

        with planted(self.plant):  # outside the recording: it records what each module received
            if self.rec is None:
                return run()
            self.rec.append((f"keys/dropout_{call}", jax.random.key_data(dropout)))
            out, calls = recorded(run)
        self.rec.extend((f"forward/{call}/{name}", value) for name, value in calls)
        return out

    def draw(self, name: str, constant: int) -> jax.Array:
        key = jax.random.fold_in(self.key, constant)
        self.note(f"keys/{name}", jax.random.key_data(key))
        return key

    def note(self, name: str, value: jax.Array) -> None:
        if self.rec is not None:
            self.rec.append((name, value))
