"""The persistent compilation cache (`birdjepa.train.compile_cache`): a requeued segment loads the step
the first segment compiled, and the run's bits are those of a run that compiled every step itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from birdjepa.resume.compare import compare_runs

HIT = (
    "Persistent compilation cache hit for 'jit_run'"  # JAX's log line (JAX_LOG_COMPILES=1); jit_run: the step
)


def pretrain(runs: Path, run: str, cache: str, demo_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}  # the suite's own cache
    env.update(BIRDJEPA_COMPILE_CACHE=cache, JAX_LOG_COMPILES="1")
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", run, "--log.runs-dir", str(runs),
           "--steps", "4", "--eval-every", "0", "--ckpt-every", "2", "--data.batch-size", "8",
           "--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval"),
           *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow  # three processes, two of them compiling without any cache: ~70 s at -O0
@pytest.mark.default_level  # the bits users get: CI runs it with BIRDJEPA_TEST_XLA_DEFAULT=1
def test_a_run_is_bit_identical_with_the_cache_cold_warm_and_off(tmp_path: Path, demo_dir: Path) -> None:
    cache = tmp_path / "cache"
    cold = pretrain(tmp_path, "resumed", str(cache), demo_dir, "--stop-at-step", "1")
    assert HIT not in cold.stderr and any(cache.glob("jit_run-*")), "the first segment compiles, and keeps it"
    warm = pretrain(tmp_path, "resumed", str(cache), demo_dir)
    assert HIT in warm.stderr, "the requeued segment loads the step instead of compiling it"
    off = pretrain(tmp_path, "straight", "off", demo_dir)
    assert "Persistent compilation cache" not in off.stderr
    differences = [(d.name, d.max_abs) for d in compare_runs(tmp_path / "straight", tmp_path / "resumed")]
    assert differences and all(m == 0.0 for _, m in differences), differences
