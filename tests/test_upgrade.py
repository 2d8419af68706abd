"""Upgrades between two segments of a run: a resume takes the run's options from its checkpoint's config
unless the command line sets them, so a default that changed never changes a running run; options set on
the command line still meet the breaking-change check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from birdjepa import exit_codes
from birdjepa.cli import main
from birdjepa.config import PretrainConfig
from birdjepa.resume.options import SEGMENT_ONLY, resume_defaults


def command(capsys: pytest.CaptureFixture, *args: object) -> tuple[int, str]:
    """``birdjepa ARGS`` through the console script's entry point in this process: (exit code, stdout)."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().out


def test_a_resume_keeps_the_run_s_options_and_checks_the_ones_given_again(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The loader's mixing as its defaults were before issue 16 (4 shards at a time, 1024 indices).
    old = ["--data.interleave", "4", "--data.shuffle-buffer", "1024"]
    data = ["--data.batch-size", "4", "--data.train", demo_dir / "train", "--data.eval", demo_dir / "eval"]
    first = ["--run", "r", "--log.runs-dir", tmp_path, "--steps", "4", "--eval-every", "0", *data]
    assert command(capsys, "pretrain", *first, *old, "--stop-at-step", "1")[0] == 0

    code, out = command(capsys, "pretrain", "--run", "r", "--log.runs-dir", tmp_path)  # a bare requeue
    assert code == 0, out
    assert "options from checkpoint 1's config unless set on the command line" in out
    assert "data.shuffle_buffer=1024 (default now 4096)" in out
    assert "RESUME_CHECK name=config ok=True" in out and "ok=False" not in out
    segment = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (segment["data"]["interleave"], segment["data"]["shuffle_buffer"]) == (4, 1024)
    assert (segment["steps"], segment["stop_at_step"]) == (4, None)  # the run's length; not the stop

    again = ["--run", "r", "--log.runs-dir", tmp_path, "--steps", "6", "--data.shuffle-buffer", "4096"]
    code, out = command(capsys, "pretrain", *again)
    assert code == exit_codes.RESUME_CHECK
    assert "got=data.shuffle_buffer:1024->4096,steps:4->6" in out


def test_what_steers_one_segment_is_never_taken_from_the_checkpoint() -> None:
    defaults, kept = resume_defaults({"stop_at_step": 3, "run": "x", "data": {"n_workers": 7}, "seed": 5})
    fresh = PretrainConfig()
    assert (defaults.stop_at_step, defaults.run, defaults.seed) == (None, "demo", 5)
    assert defaults.data.n_workers == fresh.data.n_workers != 7
    assert kept == ["seed=5 (default now 0)"]
    assert {"run", "stop_at_step", "resume", "data.n_workers", "log.runs_dir"} <= set(SEGMENT_ONLY)
