"""The trainer's frozen-encoder evaluation: kNN at every evaluation, the linear probe at the end.

The baselines (random init, raw log-mel) do not change during a run: they are embedded at the first
evaluation of a process and kept (a resumed process recomputes the same features), so every later
evaluation embeds the two splits once, through the encoder being trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from birdjepa.data import Features, Loader
from birdjepa.evaluation.embed import RAW, Encode, Split, embed_split
from birdjepa.evaluation.report import ENCODER, RANDOM_INIT, Row, UnusableSplits, overlap, score, unusable


class PeriodicEval:
    def __init__(
        self,
        train_files: Sequence[str],
        eval_files: Sequence[str],
        *,
        features: Features,
        seed: int,
        batch_size: int,
        n_workers: int,
        random_init: Callable[[], Encode],
        audio_root: str | None = None,
    ) -> None:
        """``random_init`` makes the random-init encoder when the baselines are first embedded;
        ``audio_root``: ``--data.audio-root``."""

        def loader(files: Sequence[str]) -> Loader:
            return Loader(list(files), seed=seed, batch_size=batch_size, n_workers=n_workers, train=False,
                          features=features, audio_root=audio_root)  # fmt: skip

        self.train_loader, self.eval_loader = loader(train_files), loader(eval_files)
        self.files = (list(train_files), list(eval_files))
        fingerprints = (self.train_loader.fingerprint, self.eval_loader.fingerprint)
        self.overlap = overlap((train_files, eval_files), fingerprints)
        """Why the eval split is not held out (`birdjepa.evaluation.report.overlap`), or None."""
        self.seed = seed
        self.random_init = random_init
        self._baselines: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None

    def __call__(self, encode: Encode, *, linear: bool) -> tuple[dict[str, Row], Split, Split]:
        """Rows for the encoder and both baselines (kNN; the linear probe too when ``linear``), and the
        two splits with every feature set."""
        first = self._baselines is None
        encoders = {ENCODER: encode, **({RANDOM_INIT: self.random_init()} if first else {})}
        train = embed_split(self.train_loader, encoders, raw=first)
        held_out = embed_split(self.eval_loader, encoders, raw=first)
        if first:  # the splits' records read as they stay: a split all of whose records were skipped
            if (why := unusable(train, held_out, self.files)) is not None:
                loaders = (self.train_loader, self.eval_loader)
                if any(loader.diagnostics()["counters"]["skipped"] for loader in loaders):
                    why += " (the loader's WARNINGs above name the records it skipped)"
                raise UnusableSplits(f"{why}: the evaluation has nothing to score; --eval-every 0 for none")
            keep = (RANDOM_INIT, RAW)
            self._baselines = tuple({k: s.features[k] for k in keep} for s in (train, held_out))
        train_base, eval_base = self._baselines
        train = dataclasses.replace(train, features={**train.features, **train_base})
        held_out = dataclasses.replace(held_out, features={**held_out.features, **eval_base})
        return score(train, held_out, linear=linear, seed=self.seed), train, held_out

    def close(self) -> None:
        self.train_loader.close()
        self.eval_loader.close()
