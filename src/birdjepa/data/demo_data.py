"""`birdjepa demo-data`: the command line of the two synthetic sets, the demo set (`demo`) or, with
`--recordings N --shards K`, the scale set (`scale_set`). It sits above both, so neither imports the
other; the generator they share is `synth`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import tyro

from birdjepa.data.demo import DEFAULT, generate_demo_data
from birdjepa.data.scale_set import ScaleConfig, generate_scale_set
from birdjepa.data.synth.config import DemoConfig


def cli(
    out: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="OUT")],
    config: Annotated[DemoConfig, tyro.conf.OmitArgPrefixes] = DEFAULT,
    recordings: int | None = None,
    shards: int = 500,
    pool: int = 2048,
    workers: int | None = None,
    overwrite: bool = False,
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
        pool: Distinct renders the scale set's train rows reuse.
        workers: Processes for synthesis and encoding (default: all cores); output does not depend on it.
        overwrite: Replace a data set already in OUT.
    """
    try:
        if recordings is None:
            generate_demo_data(out, config, workers=workers, overwrite=overwrite, verbose=True)
        else:
            scale = ScaleConfig(recordings=recordings, shards=shards, pool=pool, n_species=config.n_species,
                                eval_recordings=config.n_species * config.per_species_eval,
                                seed=config.seed)  # fmt: skip
            generate_scale_set(out, scale, workers=workers, overwrite=overwrite, verbose=True)
    except (FileExistsError, ValueError) as e:
        print(f"birdjepa demo-data: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
