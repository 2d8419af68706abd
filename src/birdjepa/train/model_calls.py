"""The model's calls as an objective sees them (`birdjepa.objectives.base.Model`), and what wraps them:
the verification wing's seams in the forward (`birdjepa.seams`) and the recording of `birdjepa trace`.
Neither lives in an objective or in the loss function: an objective calls the model and draws its keys
through `ModelCalls`, which applies the seams and records around those calls."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

from birdjepa.seams import Seams
from birdjepa.train.calls import recorded


class ModelCalls:
    """The `birdjepa.objectives.base.Model` an objective's forward sees: the model's calls and the
    step's draws, with the seams (`birdjepa.seams.NONE` in a real run) and the recording of
    `birdjepa trace` around them."""

    def __init__(
        self,
        seams: Seams,
        deterministic: bool,
        model: nn.Module,
        params: Any,
        keys: tuple,
        record: list | None,
    ) -> None:
        """``keys``: (the key of the draws, the main call's dropout key, the shared key)."""
        key, dropout, shared_key = keys
        self.seams, self.deterministic, self.model = seams, deterministic, model
        self.params, self.rec = seams.forward_params(params), record
        dropout = seams.dropout(dropout)
        self.key, self.dropout, self.shared_key = key, dropout, shared_key
        self.model_cfg = model.cfg.resolved()
        self.recording = record is not None

    def apply(self, call: str, x: jax.Array, dropout: jax.Array, **kw: Any) -> dict[str, jax.Array]:
        def run() -> dict[str, jax.Array]:
            rngs = {"dropout": dropout}
            variables = {"params": self.params}
            return self.model.apply(variables, x, deterministic=self.deterministic, rngs=rngs, **kw)

        with self.seams.around_model_call():  # outside the recording: it records what each module received
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
