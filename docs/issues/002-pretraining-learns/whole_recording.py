"""Is the 5 s centre crop what holds the probes back? ``whole_recording.py EVAL_DATA RUN...``

The v2 recordings last 8-40 s, and `birdjepa evaluate` embeds one 5 s centre crop of each. This
scores, on the same splits as `band_or_rhythm.py` (the run's train split, ``EVAL_DATA/eval``), the
linear probe and kNN of three protocols side by side:

- centre: one 5.12 s window at the centre (what `birdjepa evaluate` does);
- tiled: ceil(L / 5 s) windows spread evenly over the recording's L frames, embeddings averaged;
- for the raw baseline, "tiled" is the log-mel mean and std over the whole recording.

Each recording is featurised once, 41 s long; frames past its end hold the log floor in every mel
bin (zero samples), which is how its length is found. Windows are cut from that map, so a window is
the loader's crop at a frame-aligned offset. Prints a markdown table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import jax
import numpy as np

from birdjepa.data import Features, Loader
from birdjepa.evaluation.cli import EvalData, restore_run
from birdjepa.evaluation.embed import raw_features
from birdjepa.evaluation.single_label_probes import knn, linear_probe
from birdjepa.model.vit import encoder_apply
from birdjepa.train.determinism import deterministic_xla

LONG_SECONDS = 41.0  # longer than any v2 recording (max 40 s)
BATCH = 64  # windows per forward pass: a 41 s recording has at most 9


def frames(f: Features, seconds: float) -> int:
    return 1 + (round(seconds * f.target_rate) - f.win_length) // f.hop_length


def windows(spec: np.ndarray, f: Features) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``spec`` [frames of 41 s, M] -> (tiled windows [K, n_frames, M], centre window [1, n_frames, M],
    the recording's frames [L, M])."""
    spec = spec[: frames(f, LONG_SECONDS)]
    floor = spec.min()
    sounding = np.flatnonzero(np.any(spec > floor + 1e-3, axis=1))
    n = int(sounding[-1]) + 1
    w = frames(f, f.clip_seconds)
    k = max(1, -(-n // w))
    offsets = [*np.round(np.linspace(0, max(n - w, 0), k)).astype(int), max(n - w, 0) // 2]
    out = np.zeros((len(offsets), f.n_frames, spec.shape[1]), np.float32)
    for i, o in enumerate(offsets):
        seg = spec[o : min(o + w, n)]
        out[i, : len(seg)] = seg
    return out[:-1], out[-1:], spec[:n]


def embed(files: list[str], f: Features, encoders: dict[str, Callable], seed: int) -> tuple[dict, np.ndarray]:
    long = dataclasses.replace(f, clip_seconds=LONG_SECONDS, n_frames=frames(f, LONG_SECONDS))
    feats: dict[str, list[np.ndarray]] = {}
    labels = []
    with Loader(files, seed=seed, batch_size=8, n_workers=2, train=False, features=long) as loader:
        for batch in loader:
            for spec, label in zip(batch["spectrogram"], batch["label"], strict=True):
                if label < 0:
                    continue
                tiled, centre, whole = windows(spec, f)
                x = np.concatenate([tiled, centre])
                padded = np.concatenate([x, np.zeros((BATCH - len(x), *x.shape[1:]), np.float32)])
                for name, encode in encoders.items():
                    e = np.asarray(encode(padded))[: len(x)]
                    feats.setdefault(f"{name}, tiled", []).append(e[:-1].mean(axis=0))
                    feats.setdefault(f"{name}, centre", []).append(e[-1])
                w = frames(f, f.clip_seconds)
                feats.setdefault("raw, whole recording", []).append(raw_features(whole[None])[0])
                feats.setdefault("raw, centre", []).append(raw_features(centre[:, :w])[0])
                labels.append(int(label))
    return {k: np.stack(v) for k, v in feats.items()}, np.array(labels, np.int64)


def main() -> None:
    deterministic_xla()
    data, runs = Path(sys.argv[1]), [Path(a) for a in sys.argv[2:]]
    print("\n## Centre crop or whole recording (big eval split, written by whole_recording.py)\n")
    print("| run | features | linear top-1 | kNN top-1 |")
    print("|---|---|---:|---:|")
    for run in runs:
        with contextlib.redirect_stdout(sys.stderr):  # the restore's CKPT_RESTORE line: not a table row
            r = restore_run(run, data=EvalData(eval=str(data / "eval")))
        apply = jax.jit(encoder_apply(r.model_cfg))
        encoders = {"encoder": partial(apply, r.params), "random init": partial(apply, r.random_init)}
        f, seed = r.cfg.data.features, r.cfg.seed
        train, y_train = embed(r.train_files, f, encoders, seed)
        held_out, y_eval = embed(r.eval_files, f, encoders, seed)
        for name in train:
            lp = linear_probe(train[name], y_train, held_out[name], y_eval, seed=seed)
            nn = knn(train[name], y_train, held_out[name], y_eval)
            print(f"| {run.name} | {name} | {lp.acc:.3f} | {nn.acc:.3f} |", flush=True)


if __name__ == "__main__":
    main()
