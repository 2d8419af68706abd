"""The divergence plants of ``--debug.plant`` (`birdjepa.verify.catalogue`), each a `birdjepa.seams.Seams`
that changes a run in one place, registered under its name when this module is imported.

JAX, flax and the loader are imported where a hook runs, not here: the `birdjepa` command imports this
module for every subcommand, `birdjepa demo-data` too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from birdjepa import seams
from birdjepa.seams import OpenLoader, Seams
from birdjepa.verify.catalogue import DATA_PLANTS, LATE_STEP, PLANT_SCALE, PLANTS

NOISE_PHASE_ENV = "BIRDJEPA_DEBUG_NOISE_PHASE"
"""``--debug.plant noisy_execution``: whether a process's first execution of a step is the scaled one
(1) or not (0, the default); this stands in for what makes a GPU's atomics differ from run to run."""


class StepPlant(Seams):
    """A plant inside the step: its compilation is its own."""

    in_step = True


class LrShifted(StepPlant):
    """``lr_schedule_shifted``: the scheduler advanced before the update, ``schedule(u + 1)``."""

    def lr_table(self, table: np.ndarray, peak: float) -> np.ndarray:
        return np.append(table[1:], table[-1])


class FirstUpdateAtPeak(StepPlant):
    """``first_update_at_peak``: no warmup for the first update."""

    def lr_table(self, table: np.ndarray, peak: float) -> np.ndarray:
        out = table.copy()
        out[0] = peak
        return out


class DecayMatricesOnly(StepPlant):
    """``decay_skips_biases_and_norms``: the common variant that decays matrices only."""

    def decay_mask(self) -> Callable[[Any], Any]:
        import jax

        return lambda params: jax.tree.map(lambda x: x.ndim > 1, params)


class PosEmbedBf16(StepPlant):
    """``pos_embed_bf16``: the encoder's position embedding rounded to bfloat16."""

    def refuses(self, cfg: Any) -> str | None:
        if cfg.model.rope:  # a KeyError's traceback, the run folder half made
            return "the model has no position embedding to round (--model.rope)"
        if cfg.model.dtype == "bfloat16":
            return "a bfloat16 model computes with its position embedding in bfloat16 already: no change"
        return None

    def forward_params(self, params: Any) -> Any:
        import jax.numpy as jnp

        encoder = dict(params["encoder"])
        encoder["pos_embed"] = encoder["pos_embed"].astype(jnp.bfloat16).astype(jnp.float32)
        return {**params, "encoder": encoder}


class OtherDropoutKey(StepPlant):
    """``dropout_key_folded``: the dropout key folded once more."""

    def dropout(self, key: Any) -> Any:
        import jax

        return jax.random.fold_in(key, 1)


def execution_parity() -> Any:
    """0 or 1, alternating on every execution of the function being compiled (its own count, starting at
    $BIRDJEPA_DEBUG_NOISE_PHASE): a host callback, so no two consecutive executions are the same. One
    device only (each device would count)."""
    import jax
    import jax.numpy as jnp

    count = itertools.count(int(os.environ.get(NOISE_PHASE_ENV, "0")))
    return jax.pure_callback(lambda: np.float32(next(count) % 2), jax.ShapeDtypeStruct((), jnp.float32))


class ScaledCall(StepPlant):
    """A code change inside a module: the ``nth`` call of the submodule named ``module`` gets its input
    scaled by `PLANT_SCALE` on its way from the caller, as if the caller's code between two calls
    changed. ``noisy``: scaled on every other execution only (`execution_parity`)."""

    def __init__(self, module: str, nth: int, *, noisy: bool = False, decoder: bool = False) -> None:
        self.module, self.nth, self.noisy, self.decoder = module, nth, noisy, decoder

    def refuses(self, cfg: Any) -> str | None:
        if self.decoder and cfg.objective.options.decoder(cfg.model) is None:
            return (
                f"a call of the decoder's {self.module!r}, and --objective.kind {cfg.objective.kind} has none"
            )
        return None

    @contextlib.contextmanager
    def around_model_call(self) -> Iterator[None]:
        import flax.linen as nn
        import jax.numpy as jnp

        scale = 1.0 + (PLANT_SCALE - 1.0) * execution_parity() if self.noisy else PLANT_SCALE
        calls: dict[tuple, int] = {}

        def interceptor(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
            module = context.module
            if module.name == self.module and context.method_name == "__call__":
                k = calls.get(module.path, 0)
                calls[module.path] = k + 1
                if k == self.nth:  # this module's k-th call
                    # At least one step of the input's dtype: 1 + 2^-10 is 1.0 in bfloat16 (no change).
                    step = max(PLANT_SCALE - 1.0, float(jnp.finfo(args[0].dtype).eps))
                    by = 1.0 + (scale - 1.0) * step / (PLANT_SCALE - 1.0)
                    args = (args[0] * jnp.asarray(by, args[0].dtype), *args[1:])
            return next_fun(*args, **kwargs)

        with nn.intercept_methods(interceptor):
            yield


class LoaderSeed(Seams):
    """``loader_seed``: the loader's seed is the run's + 1, so other samples."""

    def open_loader(self, open_at: OpenLoader, seed: int) -> tuple[Any, str | None]:
        return open_at(seed + 1)


class BatchReordered(Seams):
    """``batch_reordered``: the loader's batches with their rows in reverse order."""

    def open_loader(self, open_at: OpenLoader, seed: int) -> tuple[Any, str | None]:
        from birdjepa.data import Loader

        class Reversed(Loader):
            def __init__(self, loader: Loader) -> None:  # noqa: D107 (wraps, does not open)
                self.__dict__.update(loader.__dict__)

            def __next__(self) -> dict[str, np.ndarray]:
                return {k: np.ascontiguousarray(v[::-1]) for k, v in super().__next__().items()}

        loader, error = open_at(seed)
        return Reversed(loader), error


class CropShifted(Seams):
    """``crop_shifted`` (step 0) and ``crop_shifted_late`` (step `LATE_STEP`): the crops of the first
    sample of that step's batch one hop later, through the Rust loader's crop-shift option."""

    def __init__(self, step: int) -> None:
        self.step = step

    def open_loader(self, open_at: OpenLoader, seed: int) -> tuple[Any, str | None]:
        first, _ = open_at(seed, fresh=True)
        with first:
            index = int(next(itertools.islice(first, self.step, None))["index"][0])
        return open_at(seed, debug_crop_shift_index=index)


BY_NAME: dict[str, Seams] = {
    "lr_schedule_shifted": LrShifted(),
    "first_update_at_peak": FirstUpdateAtPeak(),
    "pos_embed_bf16": PosEmbedBf16(),
    "loader_seed": LoaderSeed(),
    "batch_reordered": BatchReordered(),
    "crop_shifted": CropShifted(0),
    "crop_shifted_late": CropShifted(LATE_STEP),
    "dropout_key_folded": OtherDropoutKey(),
    "decay_skips_biases_and_norms": DecayMatricesOnly(),
    "mlp_between_fc1_and_fc2": ScaledCall("fc2", 0),
    "block_residual_scale": ScaledCall("DropPath_0", 1),
    "decoder_input_scaled": ScaledCall("embed", 0, decoder=True),  # the MAE decoder's first layer
    "noisy_execution": ScaledCall("block_0", 0, noisy=True),
}
assert tuple(BY_NAME) == PLANTS, "every plant of the catalogue has its seams, in its order"
assert all(not BY_NAME[p].in_step for p in DATA_PLANTS)

for _name, _seams in BY_NAME.items():
    seams.register("plant", _name, _seams)
