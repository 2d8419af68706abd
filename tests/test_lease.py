"""One writer per run: a second trainer on a held run directory says who holds it and touches nothing
(exit 2 by hand, exit 75 after waiting when Slurm started it), and a stale lease is taken over with a
WARNING and an event. Two real processes race for one run directory."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tyro

from birdjepa import exit_codes
from birdjepa.config import PretrainConfig
from birdjepa.pretrain.loop import pretrain
from birdjepa.train.lease import LEASE_FILE, LEASE_WAIT_ENV, acquire
from birdjepa.train.metrics_log import METRICS_FILE, read_metrics


def flags(demo_dir: Path, runs: Path, steps: int, *extra: str) -> list[str]:
    return ["--run", "r", "--log.runs-dir", str(runs), "--steps", str(steps), "--eval-every", "0",
            "--data.batch-size", "4", "--data.train", str(demo_dir / "train"), "--data.eval",
            str(demo_dir / "eval"), *extra]  # fmt: skip


def held_by(pid: int, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lease = {"host": socket.gethostname(), "pid": pid, "job": None, "started": time.time(),
             "token": "0123456789abcdef", "heartbeat": time.time()}  # fmt: skip
    (run_dir / LEASE_FILE).write_text(json.dumps(lease))


def test_two_trainers_race_for_one_run_directory(demo_dir: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain"]
    first = subprocess.Popen([*cmd, *flags(demo_dir, tmp_path, 40)], stdout=subprocess.PIPE, text=True)
    lease = tmp_path / "r" / LEASE_FILE
    deadline = time.monotonic() + 120
    while not lease.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    assert lease.exists(), "the first trainer never held the run"
    other = flags(demo_dir, tmp_path, 40, "--optim.lr", "0.003")
    second = subprocess.run([*cmd, *other], capture_output=True, text=True, timeout=300)
    assert first.wait(timeout=600) == 0
    lines = [line for line in second.stdout.splitlines() if "ERROR" in line]
    assert second.returncode == exit_codes.USAGE
    assert len(lines) == 1 and f"run r is held by pid {first.pid} on {socket.gethostname()}" in lines[0]
    logged = [r for r in read_metrics(tmp_path / "r") if "event" not in r]
    assert [r["step"] for r in logged] == list(range(40))  # one run, logged once
    assert {json.loads(Path(tmp_path / "r" / "config.json").read_text())["optim"]["lr"]} == {0.001}
    assert not lease.exists()  # released at the end


def test_a_slurm_requeue_waits_for_the_holder_then_exits_75_and_a_dead_holder_is_taken_over(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = subprocess.Popen(["sleep", "60"])
    held_by(holder.pid, tmp_path / "r")
    monkeypatch.setenv("SLURM_JOB_ID", "912345")
    monkeypatch.setenv(LEASE_WAIT_ENV, "1.5")
    t0 = time.monotonic()
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, tmp_path, 2))) == exit_codes.REQUEUE
    assert 1.5 <= time.monotonic() - t0 < 30
    assert f"is held by pid {holder.pid}" in capsys.readouterr().out
    assert not (tmp_path / "r" / METRICS_FILE).exists()  # nothing touched
    holder.kill()
    holder.wait()
    monkeypatch.delenv("SLURM_JOB_ID")
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, tmp_path, 2))) == 0
    assert "took over a stale lease of pid" in capsys.readouterr().out
    taken = [r for r in read_metrics(tmp_path / "r") if r.get("event") == "lease_taken_over"]
    assert len(taken) == 1 and taken[0]["pid"] == holder.pid and "no longer runs" in taken[0]["why"]


def test_a_lease_without_heartbeat_is_stale_and_a_live_one_is_not(tmp_path: Path) -> None:
    run = tmp_path / "r"
    held_by(os.getpid(), run)  # this process: alive
    with pytest.raises(RuntimeError, match="is held by pid"):
        acquire(run)
    lease = json.loads((run / LEASE_FILE).read_text())
    lease["host"], lease["heartbeat"] = "another-node", time.time() - 3600  # a node that went silent
    (run / LEASE_FILE).write_text(json.dumps(lease))
    taken = acquire(run)
    assert taken.took_over is not None and "no heartbeat for" in taken.took_over["why"]
    taken.release()
    assert not (run / LEASE_FILE).exists()
