"""The scale set: the synthetic bird song of `birdjepa.synthetic` (the demo set's species) at the size
users train on (`birdjepa demo-data OUT --recordings 100000 --shards 500`). Like the demo set
(`demo`), an entry point on top of `synth`; the command line of both is `demo_data`.

Rendering and encoding 10^5 recordings of 5-30 s would take this 2-core machine about a day, so the
train split reuses pieces: a *pool* of `pool` distinct recordings is rendered and encoded once (the
demo's species, songs and recording nuisances, in parallel), and train row `r` carries the encoded
bytes of pool entry `pool_of[r]` (a concatenation of seeded permutations of the pool, so every entry
is used equally often), under its own recording id. Every row is a whole file on disk, as in a real
set: nothing is shared between rows, so reading, decoding, page cache and memory cost what they would
with distinct recordings. The eval split holds its own distinct renders.

Shards hold unequal numbers of rows (weights uniform in [0.5, 1.5], as real shards written per download
batch differ), because shard sizes change the IID statistics of the stream (see `docs/benchmarks.md`).

Codec mix (`SCALE_CODEC_MIX`): the demo's six codecs, each decoded by its own path, but with PCM WAV
and FLAC far rarer than in the demo. At the demo's mix (9 % PCM WAV, 11 % FLAC: 27.5 kB per second of
audio, measured on the demo set) 10^5 recordings of 5-30 s (mean 14 s) would take ~38 GB; this mix
(~10 kB/s) keeps the set near 14 GB. Sample rates and channels follow the demo's mix.

Same config -> byte-identical files, whatever the number of workers (everything is drawn from the
config's seed). Output::

    OUT/train/train-00000.arrow ... (shards), OUT/train/vocab.json
    OUT/eval/eval-00000.arrow, OUT/eval/vocab.json
    OUT/manifest.json    config, species, the pool's and eval's recordings (nuisances included),
                         each train row's pool entry, the shards
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from birdjepa.cores import schedulable_cpus
from birdjepa.data.shards import DEFAULT_LABEL_COLUMN, ShardWriter, write_vocab
from birdjepa.synthetic import GENERATOR, GENERATOR_VERSION
from birdjepa.synthetic.channel import draw_nuisance
from birdjepa.synthetic.codecs import CODECS, draw_formats
from birdjepa.synthetic.config import DemoConfig, RecordingPlan, largest_remainder, rng_for
from birdjepa.synthetic.songs import make_species
from birdjepa.synthetic.writer import (
    MANIFEST_FILE,
    SPLITS,
    encoded,
    nuisance_json,
    species_json,
    written,
)

SCALE_CODEC_MIX: dict[str, float] = {
    "ogg_vorbis": 0.80,
    "mp3": 0.19,
    "flac_pcm16": 0.005,
    "wav_pcm16": 0.002,
    "wav_pcm24": 0.0015,
    "wav_float": 0.0015,
}
_KEY = {"pool": 11, "eval": 12, "rows": 13, "shards": 14}
"""Entropy keys of the scale set's draws (`synth.config.SPLIT_KEY` uses 1-4: the demo set's recordings
are not these)."""


@dataclass(frozen=True)
class ScaleConfig:
    """Size and randomness of the scale set."""

    recordings: int = 100_000
    """Train rows."""
    shards: int = 500
    """Train shards (unequal sizes)."""
    pool: int = 2048
    """Distinct rendered train recordings whose encoded bytes the rows reuse."""
    eval_recordings: int = 64
    """Distinct rendered eval recordings (one shard)."""
    n_species: int = 16
    min_seconds: float = 5.0
    max_seconds: float = 30.0
    seed: int = 0

    def __post_init__(self) -> None:
        # Worded as `birdjepa demo-data`'s flags, whose values these are.
        if self.recordings < self.n_species:  # first: --recordings 0 named --shards
            raise ValueError(f"--recordings {self.recordings}: must be >= --n-species ({self.n_species})")
        if not 1 <= self.shards <= self.recordings:
            raise ValueError(f"--shards {self.shards}: must be in [1, --recordings ({self.recordings})]")
        if not self.n_species <= self.pool <= self.recordings:
            raise ValueError(f"--pool {self.pool}: must be in [--n-species ({self.n_species}), --recordings "
                             f"({self.recordings})]")  # fmt: skip
        if self.eval_recordings < 0:
            raise ValueError(f"eval_recordings must be >= 0, got {self.eval_recordings}")
        DemoConfig(n_species=self.n_species, min_seconds=self.min_seconds, max_seconds=self.max_seconds)

    @property
    def species_config(self) -> DemoConfig:
        """The demo config whose species table this set sings (the same seed gives the same species)."""
        return DemoConfig(n_species=self.n_species, seed=self.seed)


def plan_pool(config: ScaleConfig, split: str, n: int) -> list[RecordingPlan]:
    """`n` distinct recordings, species balanced (entry j sings species j mod n_species), codecs, rates
    and channels in exact stratified counts, durations log-uniform in [min_seconds, max_seconds]."""
    rng = rng_for(config.seed, _KEY[split])
    formats = draw_formats(n, SCALE_CODEC_MIX, config.min_seconds, config.max_seconds, rng)
    codecs, rates, channels, seconds = formats
    letter = "P" if split == "pool" else "E"
    return [
        RecordingPlan(
            split="train" if split == "pool" else "eval",
            species=j % config.n_species,
            k=j // config.n_species,
            recording_id=f"XS{letter}{j:06d}",
            codec=codecs[j],
            sample_rate=int(rates[j]),
            channels=int(channels[j]),
            seconds=float(seconds[j]),
            entropy=(config.seed, _KEY[split], j % config.n_species, j // config.n_species),
        )
        for j in range(n)
    ]


def pool_of_rows(config: ScaleConfig) -> np.ndarray:
    """Pool entry of every train row: seeded permutations of the pool, one after another."""
    rng = rng_for(config.seed, _KEY["rows"])
    rounds = -(-config.recordings // config.pool)
    return np.concatenate([rng.permutation(config.pool) for _ in range(rounds)])[: config.recordings]


def shard_rows(config: ScaleConfig) -> list[int]:
    """Rows per train shard: weights uniform in [0.5, 1.5], exact (largest-remainder) counts >= 1."""
    w = rng_for(config.seed, _KEY["shards"]).uniform(0.5, 1.5, size=config.shards)
    spare = config.recordings - config.shards  # one row each first, the rest by weight
    return [int(c) + 1 for c in largest_remainder(spare, w)]


def generate_scale_set(
    out: Path,
    config: ScaleConfig,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    verbose: bool = False,
) -> Path:
    """Writes the scale set into `out` (see the module docstring) and returns `out`."""
    out = Path(out)
    written(out, overwrite, SPLITS, lambda folder: _write_scale_set(folder, out, config, workers, verbose))
    return out


def _write_scale_set(
    folder: Path, out: Path, config: ScaleConfig, workers: int | None, verbose: bool
) -> None:
    """The scale set into ``folder``, said to be ``out``."""
    t0 = time.perf_counter()
    species = make_species(config.species_config)
    names = [s.code for s in species]
    pool = plan_pool(config, "pool", config.pool)
    evals = plan_pool(config, "eval", config.eval_recordings)
    tasks = [(p, species, draw_nuisance(p, len(species))) for p in pool + evals]
    n_workers = schedulable_cpus() if workers is None else workers
    rendered = []
    for i, d in enumerate(encoded(tasks, n_workers)):
        rendered.append(d)
        if verbose and (i + 1) % 200 == 0:
            print(f"  rendered {i + 1}/{len(tasks)}, {time.perf_counter() - t0:.0f} s", flush=True)
    pool_bytes, eval_bytes = rendered[: len(pool)], rendered[len(pool) :]
    pool_of = pool_of_rows(config)
    rows = shard_rows(config)
    audio_bytes = 0
    with contextlib.ExitStack() as stack:  # on error every writer deletes what it wrote
        train = stack.enter_context(ShardWriter(folder / "train", "train", target_bytes=1 << 62))
        r = 0
        for s, n in enumerate(rows):
            for entry in pool_of[r : r + n].tolist():
                p, data = pool[entry], pool_bytes[entry]
                rid = f"XS{r:07d}"
                train.add(data, f"{rid}.{CODECS[p.codec][2]}", p.species, rid)
                audio_bytes += len(data)
                r += 1
            train.end_shard()
            if verbose and (s + 1) % 50 == 0:
                print(f"  wrote {s + 1}/{len(rows)} shards, {time.perf_counter() - t0:.0f} s", flush=True)
        train_paths = train.close()
        write_vocab(folder / "train", names)
        if evals:
            ev = stack.enter_context(ShardWriter(folder / "eval", "eval", target_bytes=1 << 62))
            for p, d in zip(evals, eval_bytes, strict=True):
                ev.add(d, f"{p.recording_id}.{CODECS[p.codec][2]}", p.species, p.recording_id)
            ev.close()
            write_vocab(folder / "eval", names)

    seconds = float(sum(pool[int(j)].seconds for j in pool_of))
    manifest = {
        "generator": GENERATOR,
        "generator_version": GENERATOR_VERSION,
        "kind": "scale",
        "seed": config.seed,
        "config": dataclasses.asdict(config),
        "label_column": DEFAULT_LABEL_COLUMN,
        "n_species": len(species),
        "codec_mix": SCALE_CODEC_MIX,
        "splits": {
            "train": {
                "recordings": config.recordings,
                "seconds": round(seconds, 3),
                "audio_bytes": audio_bytes,
                "shards": [
                    {"file": p.name, "rows": n, "bytes": p.stat().st_size}
                    for p, n in zip(train_paths, rows, strict=True)
                ],
                "codecs": dict(sorted(Counter(pool[int(j)].codec for j in pool_of).items())),
            },
            "eval": {"recordings": len(evals), "audio_bytes": sum(len(d) for d in eval_bytes)},
        },
        "species": species_json(species),
        "recordings": [
            {
                "id": p.recording_id,
                "split": p.split,
                "species": names[p.species],
                "codec": p.codec,
                "sample_rate": p.sample_rate,
                "channels": p.channels,
                "seconds": p.seconds,
                **nuisance_json(nz, names),
            }
            for p, _, nz in tasks
        ],  # fmt: skip
        "train_pool_index": [int(j) for j in pool_of],
        "note": "Synthetic bird song from birdjepa demo-data (scale set); train rows reuse the pool's bytes.",
    }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest) + "\n", encoding="utf-8")
    if verbose:
        print(
            f"wrote {config.recordings} train recordings in {config.shards} shards "
            f"({audio_bytes / 2**30:.2f} GiB of audio, {seconds / 3600:.0f} h) and {len(evals)} eval "
            f"recordings to {out} in {time.perf_counter() - t0:.0f} s with {n_workers} worker(s)"
        )
