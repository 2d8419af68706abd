"""Frozen-encoder evaluation cost on this machine: every figure measured side by side in this one run.

    python scripts/bench_eval.py [--presets tiny small] [--clips 448]

On the demo set (train and eval splits, eval-mode loader, centre crops), per model preset at random
init: seconds per 1,000 clips to decode and embed them (loader and encoder forward passes in batches of
16, compile excluded: one warm-up pass first), with the raw log-mel baseline computed in the same pass.
Then, on the features of those clips, the seconds each classifier takes: the linear probe (L2 search
on a split of the train clips, then the refit) and kNN, for the encoder's features and the raw ones.
``--clips`` caps the clips embedded per preset (the small preset is slow on a CPU); the per-1,000
figures are scaled from what was measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from birdjepa.data import Loader, resolve_files
from birdjepa.evaluation import single_label_probes as probes
from birdjepa.evaluation.embed import batched, raw_features
from birdjepa.model.config import preset
from birdjepa.model.vit import encoder_apply, init_params
from birdjepa.synthetic.demo import ensure_demo_data
from birdjepa.train.determinism import deterministic_xla

BATCH = 16


def embed(files: list[str], encode, max_clips: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(encoder features, raw features, labels, seconds) for the first ``max_clips`` clips."""
    feats, raws, labels = [], [], []
    t0 = time.perf_counter()
    with Loader(files, seed=0, batch_size=BATCH, n_workers=2, train=False) as loader:
        for batch in loader:
            feats.append(encode(batch["spectrogram"]))
            raws.append(raw_features(batch["spectrogram"]))
            labels.append(batch["label"])
            if sum(len(x) for x in labels) >= max_clips:
                break
    seconds = time.perf_counter() - t0
    n = min(max_clips, sum(len(x) for x in labels))
    return np.concatenate(feats)[:n], np.concatenate(raws)[:n], np.concatenate(labels)[:n], seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--clips", type=int, default=448, help="clips embedded per preset (train + eval)")
    args = ap.parse_args()
    deterministic_xla()
    demo = ensure_demo_data()
    train, held_out = resolve_files(demo / "train"), resolve_files(demo / "eval")
    import sklearn.linear_model  # noqa: F401  (imported here, not inside the first timed fit)

    print(f"jax {jax.__version__}, {jax.devices()[0].platform}; demo set {demo.name}; batch {BATCH}")
    print("| preset | clips | embed s/1k clips | linear probe s (encoder / raw) | kNN s (encoder / raw) |")
    print("|---|---:|---:|---:|---:|")
    for name in args.presets:
        cfg = dataclasses.replace(preset(name), n_classes=16)
        params = init_params(cfg, jax.random.key(0))["params"]
        apply = jax.jit(encoder_apply(cfg))
        encode = batched(lambda x, f=apply, p=params: f(p, x), BATCH)
        encode(np.zeros((BATCH, cfg.n_frames, cfg.n_mels), np.float32))  # compile outside the timing
        n_eval = min(64, args.clips // 4)
        tr = embed(train, encode, args.clips - n_eval)
        ev = embed(held_out, encode, n_eval)
        clips = len(tr[2]) + len(ev[2])
        per_k = (tr[3] + ev[3]) / clips * 1000
        timings = {}
        for kind, fit in (("linear", probes.linear_probe), ("knn", probes.knn)):
            for which, idx in (("encoder", 0), ("raw", 1)):
                t0 = time.perf_counter()
                fit(tr[idx], tr[2], ev[idx], ev[2])
                timings[kind, which] = time.perf_counter() - t0
        lin_enc, lin_raw = timings["linear", "encoder"], timings["linear", "raw"]
        print(f"| {name} | {clips} | {per_k:.1f} | {lin_enc:.2f} / {lin_raw:.2f} | "
              f"{timings['knn', 'encoder']:.3f} / {timings['knn', 'raw']:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
