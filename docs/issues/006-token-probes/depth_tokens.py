"""External backbones for ``depth.py``: the tokens of ``BIRDJEPA_DEPTH_RUN``'s encoder (step 599) after
its first k blocks, then its final norm. ``trained_k<k>``: the checkpoint's params; ``random_k<k>``: the
same architecture at its random init. And nothing learned: ``floored``, the patches as that encoder
receives them (its ``input_norm``: each bin's noise floor subtracted, the clip standardised; the
benchmark's ``raw`` tokens are the log-mel's patches without it), and ``patches_norm`` /
``floored_norm``, each token (the raw patch, the floored one) standardised over its own values, as a
LayerNorm without parameters; ``floored_meanstd``, raw's pooled form (each bin's mean and std over
time) of the floored log-mel: embeddings ``[B, 2M]``, no tokens. Called by ``birdjepa benchmark`` with
log-mel ``[B, T, M]``; returns tokens ``[B, N, D]`` (embeddings ``[B, D]``)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

STEP = 599


@functools.cache
def _restored() -> Any:
    from birdjepa.evaluation.cli import restore_checkpoint

    return restore_checkpoint(Path(os.environ["BIRDJEPA_DEPTH_RUN"]), STEP)


@functools.cache
def _tokens(kind: str, k: int) -> Callable[[np.ndarray], np.ndarray]:
    import jax

    from birdjepa.model.vit import Encoder

    restored = _restored()
    params = (restored.params if kind == "trained" else restored.random_init)["encoder"]
    if not 0 <= k <= restored.model_cfg.depth:
        raise ValueError(f"k={k}: the encoder has {restored.model_cfg.depth} blocks")
    kept = {n: v for n, v in params.items() if not n.startswith("block_") or int(n.split("_")[1]) < k}
    encoder = Encoder(dataclasses.replace(restored.model_cfg, depth=k))
    apply = jax.jit(lambda x: encoder.apply({"params": kept}, x, deterministic=True)[1])
    return lambda x: np.asarray(apply(np.asarray(x, np.float32)))


@functools.cache
def _patches(floored: bool, norm: bool) -> Callable[[np.ndarray], np.ndarray]:
    import jax
    import jax.numpy as jnp

    from birdjepa.model.vit import input_patches, patchify

    cfg = _restored().model_cfg.resolved()

    def tokens(x: jax.Array) -> jax.Array:
        p = input_patches(cfg, x) if floored else patchify(x, cfg.patch, cfg.patch_mels)
        if norm:
            p = (p - p.mean(-1, keepdims=True)) / jnp.sqrt(p.var(-1, keepdims=True) + 1e-6)
        return p

    apply = jax.jit(tokens)
    return lambda x: np.asarray(apply(np.asarray(x, np.float32)))


@functools.cache
def _floored_meanstd() -> Callable[[np.ndarray], np.ndarray]:
    import jax

    from birdjepa.evaluation.embed import raw_features
    from birdjepa.model.vit import normalised_input

    cfg = _restored().model_cfg.resolved()
    apply = jax.jit(lambda x: normalised_input(cfg, x))
    return lambda x: raw_features(np.asarray(apply(np.asarray(x, np.float32))))


def __getattr__(name: str) -> Callable[[np.ndarray], np.ndarray]:
    if match := re.fullmatch(r"(trained|random)_k(\d+)", name):
        return _tokens(match[1], int(match[2]))
    if match := re.fullmatch(r"(patches|floored)(_norm)?", name):
        if match[0] != "patches":  # the benchmark's own raw tokens
            return _patches(match[1] == "floored", match[2] is not None)
    if name == "floored_meanstd":
        return _floored_meanstd()
    raise AttributeError(name)
