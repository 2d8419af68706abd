"""`birdjepa demo-data`: the command line of the synthetic sets, the demo set (`demo`), with
`--recordings N --shards K` the scale set (`scale_set`), with `--birdset` the BirdSet stand-in
(`birdset_standin`). It sits above them, so none imports another; the generator they share is `synth`.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import tyro

from birdjepa.exit_codes import INTERRUPTED, USAGE
from birdjepa.synthetic.birdset_standin import DEFAULT_BIRDSET, generate_birdset
from birdjepa.synthetic.config import DemoConfig
from birdjepa.synthetic.demo import DEFAULT, generate_demo_data
from birdjepa.synthetic.scale_set import ScaleConfig, generate_scale_set


def cli(
    out: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="OUT")],
    config: Annotated[DemoConfig, tyro.conf.OmitArgPrefixes] = DEFAULT,
    recordings: int | None = None,
    shards: int = 500,
    pool: int | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    birdset: bool = False,
) -> None:
    """Generate a deterministic synthetic bird-song set: OUT/train, OUT/eval (Arrow shards + vocab.json)
    and OUT/manifest.json.

    Args:
        out: Output folder.
        config: Size and seed of the set.
        recordings: Write the scale set instead: this many train recordings of 5-30 s in --shards shards
            of unequal size, reusing the bytes of --pool distinct renders of the config's species and seed,
            and n_species x per_species_eval eval recordings (e.g. --recordings 100000 --shards 500:
            14 GB, 8 min on 2 cores).
        shards: Train shards of the scale set.
        pool: Distinct renders the scale set's train rows reuse (default: 2048, or --recordings where
            fewer).
        workers: Processes for synthesis and encoding (default: all cores); output does not depend on it.
        overwrite: Replace a data set already in OUT.
        birdset: Write the BirdSet stand-in instead (of the config, only --seed counts): 3 synthetic
            tasks OUT/SYN1..SYN3, each with train (focal recordings) and test_5s (5 s windows of 30 s
            soundscapes, 0-3 species each) in BirdSet's columns; SYN3 has 2 test classes without train
            recordings, like BirdSet's UHH (about 165 MiB, 1 min on 2 cores).
    """
    for option, value, least in (("workers", workers, 1), ("shards", shards, 1), ("pool", pool, 1)):
        if value is not None and value < least:  # --workers -1 was taken, and said "-1 worker(s)"
            print(f"birdjepa demo-data: error: --{option} {value}: must be >= {least}", file=sys.stderr)
            raise SystemExit(USAGE)
    try:
        if birdset:
            t0 = time.perf_counter()
            generate_birdset(out, dataclasses.replace(DEFAULT_BIRDSET, seed=config.seed), workers=workers,
                             overwrite=overwrite)  # fmt: skip
            print_birdset(out, time.perf_counter() - t0)
        elif recordings is None:
            generate_demo_data(out, config, workers=workers, overwrite=overwrite, verbose=True)
        else:
            # The default pool is capped: --recordings 100 failed on a pool of 2048 it never set.
            pool = min(ScaleConfig.pool, recordings) if pool is None else pool
            scale = ScaleConfig(recordings=recordings, shards=shards, pool=pool, n_species=config.n_species,
                                eval_recordings=config.n_species * config.per_species_eval,
                                seed=config.seed)  # fmt: skip
            generate_scale_set(out, scale, workers=workers, overwrite=overwrite, verbose=True)
    except FileExistsError as e:
        print(f"birdjepa demo-data: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None
    except KeyboardInterrupt:  # a 40-line traceback, for a stop asked for
        print(f"birdjepa demo-data: interrupted; {out} holds what it held before", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except ValueError as e:  # options that cannot work together (`ScaleConfig`): a usage error
        print(f"birdjepa demo-data: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None


def print_birdset(out: Path, seconds: float) -> None:
    """What `generate_birdset` wrote, from its manifest: rows, shards and MiB per task and split."""
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    total = 0
    for name, task in manifest["tasks"].items():
        for split in ("train", "test_5s"):
            shards = task[split]["shards"]
            size = sum(s["bytes"] for s in shards)
            total += size
            print(f"  {out / name / split}: {sum(s['rows'] for s in shards)} rows in {len(shards)} shard(s), "
                  f"{size / 2**20:.1f} MiB, {len(task['classes'])} classes")  # fmt: skip
        counts = task["test_5s"]["species_per_segment"]
        unseen = ", ".join(task["test_only_classes"]) or "none"
        print(f"    test_5s windows with 0/1/2/3 species: {'/'.join(str(counts[k]) for k in '0123')}; "
              f"test-only classes: {unseen}")  # fmt: skip
    print(f"wrote the BirdSet stand-in ({len(manifest['tasks'])} tasks, {total / 2**20:.1f} MiB) to {out} "
          f"in {seconds:.1f} s")  # fmt: skip
