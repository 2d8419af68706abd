"""Sweeps and preemption against a real Slurm controller (scripts/slurm_local.sh: slurmctld + slurmd +
munge on this machine, partitions `low` and `high`, where `high` preempts `low` by requeue).

They are slow tests (a cluster's start and 24-step jobs: ~2.5 min on 2 cores, with which `make
test` took 6:26), run by .ci/run's `pytest -m slow`, under CI=true (set by .ci/run) or
BIRDJEPA_SLURM_TESTS=1, and then a cluster that does not come up fails them. Elsewhere they skip,
because starting one installs Slurm and munge with apt and writes /etc/slurm: a test run never does
that to a machine merely because its user is root."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from birdjepa.resume.compare import compare_runs
from birdjepa.rundir.metrics_log import metrics_by_step, read_metrics

# One worker starts the one cluster and runs them all: .ci/run hands out whole files (--dist loadfile).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "slurm_local.sh"
STEPS = 24


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> None:
    if os.environ.get("CI") != "true" and os.environ.get("BIRDJEPA_SLURM_TESTS") != "1":
        pytest.skip("set BIRDJEPA_SLURM_TESTS=1 (root, apt) to start a local Slurm cluster; CI runs these")
    env = {**os.environ, "BIRDJEPA_SLURM_DIR": str(tmp_path_factory.mktemp("slurm"))}
    up = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600, env=env)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    yield
    subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120, env=env)


def write_sweep(tmp_path: Path, demo_dir: Path, n: int, name: str, eval_every: int = 12) -> Path:
    """``n`` configs (seeds 0..n-1). The kNN evaluations also give a preempting job time to arrive."""
    path = tmp_path / f"{name}.py"
    base = {
        "steps": STEPS, "eval_every": eval_every, "eval_linear": False, "ckpt_every": 6,
        "data.batch_size": 8, "data.train": str(demo_dir / "train"), "data.eval": str(demo_dir / "eval"),
    }  # fmt: skip
    cfgs = [{**base, "seed": i} for i in range(n)]
    path.write_text(f"def make_cfgs():\n    return {cfgs!r}\n")
    return path


def with_devices(devices: int) -> dict[str, str]:
    """The environment of a process with `devices` CPU devices (a job inherits it through sbatch)."""
    flags = os.environ.get("XLA_FLAGS", "")
    return {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}"}


def sweep(path: Path, runs: Path, *args: str, devices: int = 2) -> dict[int, tuple[str, Path]]:
    """Submit; returns config -> (job id, run dir) from the printed table. Each task of a job sees
    `devices` CPU devices: 2 for one task, as the straight run; 1 per task for two tasks."""
    done = subprocess.run(
        [sys.executable, "-m", "birdjepa.cli", "sweep", str(path), "--runs-dir", str(runs), *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=with_devices(devices),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = re.findall(r"^\s*(\d+)\s+(\S+)\s+(\S+)$", done.stdout, re.M)
    return {int(i): (job, Path(d)) for i, job, d in rows}


def job_state(job: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "UNKNOWN"


def wait_for(what: str, predicate, timeout: float = 300.0) -> None:  # noqa: ANN001
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(1.0)


def wait_done(job: str, run_dir: Path, timeout: float = 400.0) -> None:
    def finished() -> bool:
        state = job_state(job)
        if state in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            logs = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
            raise AssertionError(f"job {job} ended {state}:\n{logs[-4000:]}")
        return state == "COMPLETED"

    wait_for(f"job {job} to complete", finished, timeout)


def last_step(run_dir: Path) -> int:
    try:
        return max(metrics_by_step(run_dir), default=-1)
    except FileNotFoundError:
        return -1


@pytest.fixture(scope="module")
def two_configs(cluster: None, demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A sweep of two configs (seeds 0 and 1), one job each, both run to the end without a stop."""
    tmp = tmp_path_factory.mktemp("two")
    jobs = sweep(write_sweep(tmp, demo_dir, 2, "two"), tmp / "runs", "--slurm.partition", "low",
                 "--slurm.cpus", "1")  # fmt: skip
    for job, run_dir in jobs.values():
        wait_done(job, run_dir)
    return jobs


@pytest.fixture(scope="module")
def straight(two_configs: dict) -> Path:
    """The uninterrupted run every job of seed 0 must equal: config 0 of the two-config sweep (one
    process with two devices; a one-task job sees two devices too, a two-task job one each)."""
    return two_configs[0][1]


def identical(a: Path, b: Path) -> list[str]:
    return [f"{d.name} at step {d.first_step}: {d.first_values}" for d in compare_runs(a, b) if d.max_abs]


def test_two_config_sweep_completes(two_configs: dict) -> None:
    assert sorted(two_configs) == [0, 1]
    for _, run_dir in two_configs.values():
        assert last_step(run_dir) == STEPS - 1
        assert not [e for e in read_metrics(run_dir) if e.get("event") in ("stop", "resume")]
        assert (run_dir / "job.sbatch").exists() and "done:" in "".join(
            p.read_text() for p in run_dir.glob("slurm-*.out")
        )
    assert two_configs[0][1] != two_configs[1][1]
    assert identical(two_configs[0][1], two_configs[1][1]) != []  # seeds 0 and 1 train differently


def test_preempted_job_requeues_resumes_and_matches_the_straight_run(
    cluster: None, demo_dir: Path, straight: Path, tmp_path: Path
) -> None:
    path = write_sweep(tmp_path, demo_dir, 1, "pre")
    # The job takes the whole node, so the high-priority job can only run by preempting it.
    ((job, run_dir),) = sweep(
        path, tmp_path / "runs", "--slurm.partition", "low", "--slurm.cpus", "2"
    ).values()
    # As soon as it trains: the whole run takes a few seconds once its steps are compiled (cached).
    wait_for("the low job to train its first step", lambda: last_step(run_dir) >= 0)
    out = str(tmp_path / "high-%j.out")  # not slurm-<id>.out in the working directory
    high = subprocess.run(["sbatch", "--parsable", "-p", "high", "-c", "2", "-o", out, "--wrap", "sleep 3"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    wait_done(job, run_dir)
    assert job_state(high) == "COMPLETED"
    stops = [e for e in read_metrics(run_dir) if e.get("event") == "stop"]
    resumes = [e for e in read_metrics(run_dir) if e.get("event") == "resume"]
    assert stops and stops[0]["reason"] == "signal 10" and stops[0]["exit_code"] == 75, stops
    assert resumes and resumes[0]["restart"] == 1 and resumes[0]["step"] == stops[0]["step"] + 1
    assert identical(straight, run_dir) == []


def test_a_job_started_while_its_run_is_held_waits_for_the_holder_and_the_run_is_written_once(
    cluster: None, demo_dir: Path, straight: Path, tmp_path: Path
) -> None:
    ((job, run_dir),) = sweep(write_sweep(tmp_path, demo_dir, 1, "twice"), tmp_path / "runs",
                              "--slurm.partition", "low", "--slurm.cpus", "1").values()  # fmt: skip
    wait_for("the first job to train its first step", lambda: last_step(run_dir) >= 0)
    # The same job again, while the first trains: what a requeue racing its predecessor's save meets.
    second = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    wait_done(job, run_dir)
    wait_done(second, run_dir)
    said = (run_dir / f"slurm-{second}.out").read_text()
    assert f"job {job}, since" in said and "waiting up to" in said, said[-3000:]
    logged = [(r["step"], r["restart"]) for r in read_metrics(run_dir) if "train/loss" in r]
    assert logged == [(s, 0) for s in range(STEPS)]  # one writer: every step logged once, by the first
    assert identical(straight, run_dir) == []


def test_force_resume_at_requeues_once_and_matches(
    cluster: None, demo_dir: Path, straight: Path, tmp_path: Path
) -> None:
    ((job, run_dir),) = sweep(write_sweep(tmp_path, demo_dir, 1, "force"), tmp_path / "runs",
                              "--slurm.partition", "low", "--force-resume-at", "9").values()  # fmt: skip
    wait_done(job, run_dir)
    stops = [e for e in read_metrics(run_dir) if e.get("event") == "stop"]
    assert [(e["step"], e["reason"]) for e in stops] == [(9, "stop_at_step")]
    assert [e["restart"] for e in read_metrics(run_dir) if e.get("event") == "resume"] == [1]
    log = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    assert "requeueing" in log and log.count("birdjepa job") == 2, log[-3000:]
    assert identical(straight, run_dir) == []
    json.loads((run_dir / "config.json").read_text())  # the last segment wrote its config


def test_two_task_job_trains_the_global_batches_of_one_process(
    cluster: None, demo_dir: Path, straight: Path, tmp_path: Path
) -> None:
    # Two processes under srun (one CPU device each) against one process with two devices.
    path = write_sweep(tmp_path, demo_dir, 1, "two_tasks")
    ((job, run_dir),) = sweep(path, tmp_path / "runs", "--slurm.ntasks", "2", "--slurm.cpus", "1",
                              devices=1).values()  # fmt: skip
    wait_done(job, run_dir)
    log = "".join(p.read_text() for p in run_dir.glob("slurm-*.out"))
    assert "devices=2 (cpu) processes=2" in log, log[-3000:]
    crc = {s: m["dataloader/index_crc32"] for s, m in metrics_by_step(run_dir).items()}
    assert crc == {s: m["dataloader/index_crc32"] for s, m in metrics_by_step(straight).items()}
    assert len(crc) == STEPS and len(set(crc.values())) == STEPS
    assert "eval/knn_acc" in metrics_by_step(run_dir)[STEPS - 1]
    assert identical(straight, run_dir) == []
