"""The v2 demo set with only some kinds of per-recording nuisance: ``nuisance_variant.py OUT [KIND...]``.

KIND: ``background`` (other species singing behind), ``noise`` (the background noise's colour and
SNR), ``sources`` (insects or a stream, rumble, clicks), ``mic`` (high-pass, low-pass, EQ, peak
level), ``activity`` (the pauses between renditions x0.5-2). Each kind left out is fixed at one clean
value for every recording: pink noise 30 dB under the song, nothing else behind it, a flat
microphone, peak -6 dBFS, activity 1. The singer's pitch and tempo vary as in the demo set. No KIND:
every nuisance fixed. Same species, songs, codecs and rates as ``birdjepa demo-data``; ``--eval16``
writes 16 held-out recordings per species (and one train recording) instead of the demo's 24 + 4.

    .venv/bin/python docs/issues/002-pretraining-learns/nuisance_variant.py runs/issue-002/data-clean
    .venv/bin/birdjepa pretrain --run clean --log.runs-dir runs/issue-002 \\
        --data.train runs/issue-002/data-clean/train --data.eval runs/issue-002/data-clean/eval
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from birdjepa.synthetic import demo
from birdjepa.synthetic.channel import Nuisance
from birdjepa.synthetic.config import DemoConfig, RecordingPlan

KINDS = {
    "background": ("background",),
    "noise": ("noise_alpha", "snr_db"),
    "sources": ("band_noise", "rumble_db", "clicks"),
    "mic": ("highpass", "lowpass", "eq_db", "peak_dbfs"),
    "activity": ("activity",),
}
CLEAN = {
    "activity": 1.0,
    "noise_alpha": 1.0,
    "snr_db": 30.0,
    "band_noise": None,
    "rumble_db": None,
    "clicks": False,
    "background": (),
    "highpass": (40.0, 1),
    "lowpass": (18000.0, 1),
    "eq_db": (0.0, 0.0, 0.0, 0.0),
    "peak_dbfs": -6.0,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("kinds", nargs="*", choices=list(KINDS))
    p.add_argument("--eval16", action="store_true")
    args = p.parse_args()
    kept = {field for kind in args.kinds for field in KINDS[kind]}
    fixed = {field: value for field, value in CLEAN.items() if field not in kept}
    drawn = demo.draw_nuisance

    def draw(plan: RecordingPlan, n_species: int) -> Nuisance:
        # Draw as the demo set does (same generator, so every kept nuisance is the demo's), then fix the rest.
        return dataclasses.replace(drawn(plan, n_species), **fixed)

    # The parent process draws every recording's nuisance; the encoding workers only render it.
    # (generate_demo_data looks draw_nuisance up in demo's namespace, so that is the one to replace)
    demo.draw_nuisance = draw
    big = DemoConfig(per_species_train=1, per_species_eval=16)
    config = big if args.eval16 else demo.DEFAULT
    demo.generate_demo_data(args.out, config, verbose=False)


if __name__ == "__main__":  # the encoding workers are spawned and import this file
    main()
