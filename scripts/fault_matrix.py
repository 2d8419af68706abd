"""Print the fault matrix: each injected resume fault against each resume check.

    python scripts/fault_matrix.py [--resume-at 150] [any `birdjepa pretrain` flag]

Trains the run (default: 300 demo steps, 2-batch gradient accumulation, checkpointed PRNG, so every
kind of state a resume can lose exists) to ``--resume-at`` and stops; then resumes copies of it cleanly
and with each fault of `birdjepa.verify.faults`, and prints which checks failed on the first resumed
step. The default resume point is mid-update: after step 150, 151 micro-batches are done, one into an update.
Exit status 1 if the clean resume raised any flag or a fault did not trip its expected check; a fault
that cannot change anything at the resume point (e.g. dropping an empty accumulator) is shown as
"no effect here", not as a miss.
"""

from __future__ import annotations

import sys
from typing import Annotated

import tyro

from birdjepa.config import OptimConfig, PretrainConfig
from birdjepa.train.determinism import deterministic_xla
from birdjepa.verify.fault_matrix import format_matrix, not_as_expected, run_matrix

DEFAULT = PretrainConfig(
    run="fault-matrix", steps=300, prng="checkpointed", optim=OptimConfig(grad_accum=2), eval_every=0
)


def main(cfg: Annotated[PretrainConfig, tyro.conf.arg(name="")] = DEFAULT, resume_at: int = 150) -> None:
    """Resume a run cleanly and with each injected fault; print fault x check."""
    deterministic_xla()
    try:
        rows = run_matrix(cfg, resume_at)
    except ValueError as e:  # a run of the user's (--run) was removed whole
        sys.exit(f"--run {e}")
    print()
    print(
        f"resumed after step {resume_at} of {cfg.run_dir}"
        f" (grad_accum {cfg.optim.grad_accum}, prng {cfg.prng})"
    )
    print(format_matrix(rows))
    bad = not_as_expected(rows)
    if bad:
        print(f"NOT AS EXPECTED: {', '.join(bad)}")
        sys.exit(1)


if __name__ == "__main__":
    tyro.cli(main)
