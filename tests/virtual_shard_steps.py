"""Run by `test_virtual_shards.py` in a process with several simulated devices: two steps of the
virtual-shard step on the first D devices, for each D given, from the same state and batches; writes
every output to ``OUT/D.npz`` (named as `birdjepa.train.recording.leaves` names them)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from birdjepa.train.determinism import deterministic_xla

deterministic_xla()

import jax  # noqa: E402  (after the flags)
import tyro  # noqa: E402

from birdjepa.config import PretrainConfig  # noqa: E402
from birdjepa.train.compiled import _build  # noqa: E402
from birdjepa.train.recording import leaves  # noqa: E402
from birdjepa.train.segment import fresh_state, model_config  # noqa: E402
from birdjepa.train.step import StepConfig  # noqa: E402


def main(out: Path, counts: list[int], args: list[str]) -> None:
    cfg = tyro.cli(PretrainConfig, args=args)
    model_cfg = model_config(cfg, 4)
    spec = StepConfig.of(cfg, model_cfg)
    batch_size = cfg.data.batch_size
    for d in counts:
        fns = _build(spec, cfg.optim, 10, tuple(jax.devices()[:d]))
        state = fns.place(fresh_state(cfg, model_cfg, fns.tx))
        params, opt_state = state.params, state.opt_state
        rng = np.random.default_rng(0)
        outputs = {}
        for step in range(2):  # with --optim.grad-accum 2: one step accumulates, the next updates
            shape = (batch_size, cfg.data.n_views, cfg.model.n_frames, cfg.model.n_mels)
            batch = {
                "spectrogram": rng.normal(size=shape).astype(np.float32),
                "label": rng.integers(-1, 4, size=batch_size),  # -1: unlabelled
            }
            key = jax.random.key(step)
            params, opt_state, metrics, stats, guard = fns.train_step(
                params, opt_state, fns.on_device(batch), key, step == 1
            )
            for name, value in leaves((params, opt_state, metrics, stats, guard)):
                outputs[f"{step}{name}"] = np.asarray(value)
        np.savez(out / f"{d}.npz", **outputs)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(d) for d in sys.argv[2].split(",")], sys.argv[3:])
