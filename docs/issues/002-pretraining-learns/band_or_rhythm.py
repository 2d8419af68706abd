"""Does a frozen encoder tell the band, the rhythm, or both?

    .venv/bin/python docs/issues/002-pretraining-learns/band_or_rhythm.py EVAL_DATA [RUN ...] > table.md

The v2 demo species come in band groups of two that share band and notes and differ only in how they
arrange the notes in time (``birdjepa.synthetic.songs``). So a probe's accuracy splits in two: how
often it names the right band group, and, among those clips, how often the right species of the group
(0.5 is a coin flip between the two partners, the score of a spectrum-only classifier).

For each run's newest checkpoint: the linear probe of ``birdjepa evaluate`` (fit on the run's train
split, scored on ``EVAL_DATA/eval``, a folder written by ``birdjepa demo-data`` whose manifest names
each species' band group), for the encoder, random init and the raw log-mel. Prints a markdown table
(no runs: its header only); reproduce.py calls it and appends the table to ``results.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np

from birdjepa.evaluation.cli import EvalData, embed_splits, restore_run
from birdjepa.evaluation.single_label_probes import linear_probe
from birdjepa.train.determinism import deterministic_xla


def band_groups(data: Path) -> np.ndarray:
    """Label -> band group, from a demo set's manifest."""
    species = json.loads((data / "manifest.json").read_text())["species"]
    return np.array([s["band_group"] for s in sorted(species, key=lambda s: s["index"])])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", metavar="EVAL_DATA", type=Path,
                   help="a set from `birdjepa demo-data`: its manifest.json and eval/ split")  # fmt: skip
    p.add_argument("runs", metavar="RUN", type=Path, nargs="*", default=[],
                   help="a run directory (its newest checkpoint)")  # fmt: skip
    args = p.parse_args()
    deterministic_xla()
    data, runs = args.data, args.runs
    group = band_groups(data)
    print("\n## Band or rhythm (big eval split, written by band_or_rhythm.py)\n")
    print("| run | features | linear top-1 | band group right | species right, given the group |")
    print("|---|---|---:|---:|---:|")
    for run in runs:
        with contextlib.redirect_stdout(sys.stderr):  # the restore's CKPT_RESTORE line: not a table row
            r = restore_run(run, data=EvalData(eval=str(data / "eval")))
        cfg = r.cfg
        params = {"encoder": r.params, "random init": r.random_init}
        train, held_out = embed_splits(
            r.train_files, r.eval_files, params, r.model_cfg, cfg.data.features,
            seed=cfg.seed, batch_size=cfg.data.batch_size, n_workers=2,
        )  # fmt: skip
        for name in ("encoder", "random init", "raw"):
            result = linear_probe(train.features[name], train.labels, held_out.features[name],
                                  held_out.labels, seed=cfg.seed)  # fmt: skip
            right_group = group[result.predictions] == group[held_out.labels]
            partner = (result.predictions == held_out.labels)[right_group].mean()
            print(f"| {run.name} | {name} | {result.acc:.3f} | {right_group.mean():.3f} | {partner:.3f} |")


if __name__ == "__main__":
    main()
