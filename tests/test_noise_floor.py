"""The noise floor of `birdjepa trace --repeat` and `bisect` on a step that is not the same in two
executions (``--debug.plant noisy_execution``), at XLA's default level (CI runs it with
BIRDJEPA_TEST_XLA_DEFAULT=1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from birdjepa.divergence import trace_file
from birdjepa.divergence.bisect import bisect
from birdjepa.divergence.trace import trace_step
from birdjepa.verify.divergence_matrix import flags
from birdjepa.verify.plants import NOISE_PHASE_ENV


def data(demo_dir: Path) -> tuple[str, ...]:
    return ("--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval"))


@pytest.mark.slow  # two runs and four traces of their own, compiling at the default level: ~4 min
@pytest.mark.default_level
def test_bisect_calls_a_step_that_varies_between_executions_noise(demo_dir: Path, tmp_path: Path) -> None:
    """``--debug.plant noisy_execution`` scales the first block's input on every other execution of the
    step, from a phase the environment gives (as a GPU's scheduling would): twin runs started in
    opposite phases differ from step 0. The noise floor of ``--repeat`` catches it, and bisect, finding
    that run A's step 0 does not even execute the same twice, calls the difference noise, not a bug."""
    for run, phase in (("A", "1"), ("B", "0")):
        args = flags(tmp_path, run, data(demo_dir), "--steps", "1", "--debug.plant", "noisy_execution")
        env = {**os.environ, NOISE_PHASE_ENV: phase}
        done = subprocess.run([sys.executable, "-m", "birdjepa.cli", "pretrain", *args], env=env,
                              capture_output=True, text=True)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # The first execution here is in phase 0: A's step 0 differs from its log, and again from itself.
    code, report, _ = bisect(tmp_path / "A", tmp_path / "B", save=tmp_path / "saved")
    assert code == 1
    assert [trace_file.read(tmp_path / "saved" / f"{r}-step0.npz").manifest["step"] for r in "AB"] == [0, 0]
    assert "step 0 is not the same in two executions on its inputs here" in report, report
    assert "tracing it with --repeat 2 to measure its noise floor" in report, report
    verdict = report.split("VERDICT: ")[1]
    assert "noise floor" in verdict and "not a bug" in verdict, report
    first_block = "forward/global/encoder/block_0.__call__#0/in/0"
    assert first_block in trace_step(tmp_path / "A", 0, repeat=2).manifest["noise"]
