"""The demo set (`birdjepa demo-data OUT`): the synthetic bird song of `birdjepa.synthetic` at the
size of a quick experiment, cached on first use (`ensure_demo_data`). This is its entry point: its
presets (`DEFAULT`, `SMALL`), its recordings' plan (`plan_recordings`) and the writing of its shards
and manifest (`generate_demo_data`). Species, songs, recording channel, codecs and the shared writing
machinery are in `synth`; the 10^5-recording scale set is in `scale_set`, the command line of both in
`demo_data`. `ensure_birdset_data` caches the BirdSet stand-in (`birdset_standin`) the same way.

Output::

    OUT/train/train-00000.arrow ...  OUT/train/vocab.json
    OUT/eval/eval-00000.arrow ...    OUT/eval/vocab.json
    OUT/manifest.json                counts, seed, generator version, species table (band groups,
                                     patterns), every recording's nuisance parameters
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from birdjepa.cores import schedulable_cpus
from birdjepa.data import DataError
from birdjepa.data.shards import DEFAULT_LABEL_COLUMN, ShardWriter, write_vocab
from birdjepa.synthetic import GENERATOR, GENERATOR_VERSION
from birdjepa.synthetic.birdset_standin import DEFAULT_BIRDSET, BirdsetConfig, generate_birdset
from birdjepa.synthetic.birdset_standin import GENERATOR_VERSION as BIRDSET_VERSION
from birdjepa.synthetic.channel import draw_nuisance
from birdjepa.synthetic.codecs import CODEC_MIX, CODECS, draw_formats
from birdjepa.synthetic.config import SPLIT_KEY, DemoConfig, RecordingPlan, rng_for
from birdjepa.synthetic.songs import make_species
from birdjepa.synthetic.writer import (
    MANIFEST_FILE,
    SPLITS,
    encoded,
    nuisance_json,
    species_json,
    written,
)

DEFAULT = DemoConfig()
"""16 species x (24 train + 4 eval), 8-40 s: ~450 recordings, ~6 train shards."""
SMALL = DemoConfig(
    n_species=12, per_species_train=4, per_species_eval=2, min_seconds=8.0, max_seconds=12.0, shard_mb=4.0
)
"""12 species x (4 train + 2 eval), 8-12 s: the preset for tests (a few seconds to generate)."""


def plan_recordings(config: DemoConfig) -> dict[str, list[RecordingPlan]]:
    """Every recording of every split, in the order written to the shards (`config.order`)."""
    counts = {"train": config.per_species_train, "eval": config.per_species_eval}
    total = config.n_species * sum(counts.values())
    id_numbers = 100000 + rng_for(config.seed, SPLIT_KEY["order"]).permutation(total)
    plans: dict[str, list[RecordingPlan]] = {}
    offset = 0
    for split in SPLITS:
        keys = [(s, k) for s in range(config.n_species) for k in range(counts[split])]
        rng = rng_for(config.seed, SPLIT_KEY[split])
        n = len(keys)
        formats = draw_formats(n, CODEC_MIX, config.min_seconds, config.max_seconds, rng)
        codecs, rates, channels, seconds = formats
        shuffled = rng.permutation(n)  # drawn in both orders, so the recordings do not depend on it
        order = shuffled if config.order == "shuffled" else range(n)
        plans[split] = [
            RecordingPlan(
                split=split,
                species=keys[i][0],
                k=keys[i][1],
                recording_id=f"XD{id_numbers[offset + i]}",
                codec=codecs[i],
                sample_rate=int(rates[i]),
                channels=int(channels[i]),
                seconds=float(seconds[i]),
                entropy=(config.seed, SPLIT_KEY[split], keys[i][0], keys[i][1]),
            )
            for i in (int(j) for j in order)
        ]
        offset += n
    return plans


def generate_demo_data(
    out: Path,
    config: DemoConfig = DEFAULT,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    verbose: bool = False,
    said_as: Path | None = None,
) -> Path:
    """Writes the demo set into `out` (see the module docstring) and returns `out`; `said_as`: the
    folder its closing line names (the cache's, where `out` is a temporary folder renamed into it).

    `workers` processes render and encode recordings (default: all available cores); the bytes written
    do not depend on it. A set already in `out` (a manifest or shards) is replaced with `overwrite`,
    once this one is whole (`birdjepa.synthetic.writer.written`); otherwise it is an error.
    """
    out = Path(out)
    shown = out if said_as is None else Path(said_as)
    written(out, overwrite, SPLITS, lambda folder: _write_demo_data(folder, shown, config, workers, verbose))
    return out


def _write_demo_data(folder: Path, out: Path, config: DemoConfig, workers: int | None, verbose: bool) -> None:
    """The demo set into ``folder``, said to be ``out``."""
    t0 = time.perf_counter()
    species = make_species(config)
    plans = plan_recordings(config)
    names = [s.code for s in species]

    target = int(config.shard_mb * 2**20)
    tasks = [(p, species, draw_nuisance(p, len(species))) for split in SPLITS for p in plans[split]]
    n_workers = schedulable_cpus() if workers is None else workers
    stats: dict[str, Counter] = {split: Counter() for split in SPLITS}
    shards: dict[str, list[tuple[Path, int]]] = {}
    with contextlib.ExitStack() as stack:  # on error every writer deletes what it wrote
        writers = {
            split: stack.enter_context(ShardWriter(folder / split, split, target))
            for split in SPLITS
            if plans[split]
        }
        for i, ((plan, _, _), data) in enumerate(zip(tasks, encoded(tasks, n_workers), strict=True)):
            ext = CODECS[plan.codec][2]
            writers[plan.split].add(data, f"{plan.recording_id}.{ext}", plan.species, plan.recording_id)
            st = stats[plan.split]
            st["bytes"] += len(data)
            st["seconds"] += plan.seconds
            if verbose and (i + 1) % 50 == 0:
                print(f"  {i + 1}/{len(tasks)} recordings, {time.perf_counter() - t0:.1f} s", flush=True)
        for split, writer in writers.items():
            shards[split] = list(zip(writer.close(), writer.rows_per_shard, strict=True))
            write_vocab(folder / split, names)

    manifest: dict = {
        "generator": GENERATOR,
        "generator_version": GENERATOR_VERSION,
        "seed": config.seed,
        "config": dataclasses.asdict(config),
        "label_column": DEFAULT_LABEL_COLUMN,
        "n_species": len(species),
        "splits": {},
        "species": species_json(species),
        "recordings": [
            {
                "id": plan.recording_id,
                "split": plan.split,
                "species": names[plan.species],
                "codec": plan.codec,
                "sample_rate": plan.sample_rate,
                "channels": plan.channels,
                "seconds": plan.seconds,
                **nuisance_json(nz, names),
            }
            for plan, _, nz in tasks
        ],
        "note": "Synthetic bird song from birdjepa demo-data; species and codes are invented.",
    }
    for split, split_shards in shards.items():
        ps = plans[split]
        manifest["splits"][split] = {
            "recordings": len(ps),
            "seconds": round(stats[split]["seconds"], 3),
            "audio_bytes": stats[split]["bytes"],
            "shards": [{"file": p.name, "rows": r, "bytes": p.stat().st_size} for p, r in split_shards],
            "per_species": dict(sorted(Counter(names[p.species] for p in ps).items())),
            "codecs": dict(sorted(Counter(p.codec for p in ps).items())),
            "sample_rates": {str(k): v for k, v in sorted(Counter(p.sample_rate for p in ps).items())},
            "channels": {str(k): v for k, v in sorted(Counter(p.channels for p in ps).items())},
        }
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    if verbose:
        total = sum(s["bytes"] for s in stats.values())
        print(
            f"wrote {len(tasks)} recordings ({total / 2**20:.1f} MiB of audio) to {out} "
            f"in {time.perf_counter() - t0:.1f} s with {n_workers} worker(s)"
        )


def default_cache_dir() -> Path:
    """`$BIRDJEPA_CACHE`, else `$XDG_CACHE_HOME/birdjepa`, else `~/.cache/birdjepa`; a `DataError` naming
    what to set where there is no home (HOME unset, and the user in no passwd: a container's UID)."""
    if os.environ.get("BIRDJEPA_CACHE"):
        return Path(os.environ["BIRDJEPA_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "birdjepa"
    try:
        home = Path.home()  # RuntimeError: "Could not determine home directory." (a traceback, exit 1)
    except (RuntimeError, KeyError):
        raise DataError("no home folder for birdjepa's cache (HOME unset, this user in no passwd): set "
                        "BIRDJEPA_CACHE") from None  # fmt: skip
    return home / ".cache" / "birdjepa"


def ensure_demo_data(
    config: DemoConfig = DEFAULT,
    cache_dir: Path | None = None,
    *,
    workers: int | None = None,
    verbose: bool = True,
) -> Path:
    """The demo set of `config` in the cache (`cache_dir` or `default_cache_dir()`), generated on first
    use. The folder name holds the generator version and a hash of the config, so a changed generator
    or config never reuses stale data. Generation goes to a temporary folder renamed into place, so
    concurrent callers (e.g. several Slurm tasks) never see a half-written set."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"demo-v{GENERATOR_VERSION}-{_config_key(config)}"
    return _cached(
        final,
        lambda tmp: generate_demo_data(tmp, config, workers=workers, verbose=verbose, said_as=final),
        verbose,
    )


def ensure_birdset_data(
    config: BirdsetConfig = DEFAULT_BIRDSET,
    cache_dir: Path | None = None,
    *,
    workers: int | None = None,
    verbose: bool = True,
) -> Path:
    """The BirdSet stand-in (`birdjepa.synthetic.birdset_standin`) of `config` in the cache, generated on
    first use, as `ensure_demo_data` does (folder `birdset-v<version>-<config hash>`): tests and
    benchmark scripts build it once."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / f"birdset-v{BIRDSET_VERSION}-{_config_key(config)}"
    return _cached(final, lambda tmp: generate_birdset(tmp, config, workers=workers), verbose)


def _config_key(config: DemoConfig | BirdsetConfig) -> str:
    return hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode()).hexdigest()[:12]


def _cached(final: Path, generate: Callable[[Path], object], verbose: bool) -> Path:
    """`final`, generated by `generate(tmp)` into a temporary folder beside it and renamed into place
    unless a manifest is there already (a concurrent caller that finished first wins)."""
    if (final / MANIFEST_FILE).is_file():
        return final
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    except OSError as e:  # a file where the folder goes, a read-only cache: a traceback, exit 1
        raise DataError(f"{final.parent}: cannot write the synthetic set there ({e.strerror or e}); set "
                        "BIRDJEPA_CACHE to a folder you can write (default: $XDG_CACHE_HOME/birdjepa, else "
                        "~/.cache/birdjepa)") from None  # fmt: skip
    try:
        if verbose:
            print(f"generating {final.name} into {final} (once)", flush=True)
        generate(tmp)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / MANIFEST_FILE).is_file():  # not a concurrent winner: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
