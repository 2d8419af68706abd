"""Multi-process data parallel on this machine (2 processes over gloo, the group formed through
BIRDJEPA_* variables as `birdjepa sweep --local --slurm.ntasks 2` does): two processes train and
checkpoint, one process with as many devices resumes, two processes resume again (a requeued
two-task job), and the whole run equals the one-process run bit for bit; a group whose run is taken
over stops together."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from birdjepa import exit_codes
from birdjepa.resume.compare import compare_runs
from birdjepa.rundir.layout import LEASE_FILE
from birdjepa.rundir.lease import HEARTBEAT_S
from birdjepa.rundir.metrics_log import metrics_by_step
from birdjepa.slurm.sweep import launch_local

# Five processes: four minutes of the suite. CI runs it beside the suite; in the suite,
# tests/test_checkpoint.py restores four devices' save on one and the virtual-shard tests take any count.
pytestmark = pytest.mark.slow

STEPS = 6


def flags(demo_dir: Path, runs: Path, run: str, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", run, "--log.runs-dir", str(runs),
        "--steps", str(STEPS), "--eval-every", "3", "--no-eval-linear", "--ckpt-every", "3",
        "--data.batch-size", "8",
        "--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval"), *extra,
    ]  # fmt: skip


def one_process_two_devices(argv: list[str]) -> None:
    env = {
        **os.environ,
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2",
    }
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def differing(a: Path, b: Path) -> list[str]:
    return [f"{d.name} at step {d.first_step}: {d.first_values}" for d in compare_runs(a, b) if d.max_abs]


def test_two_processes_train_the_one_process_run_and_resume_in_one_and_in_two(
    demo_dir: Path, tmp_path: Path
) -> None:
    one_process_two_devices(flags(demo_dir, tmp_path, "one"))
    # Two processes train steps 0-2 (with a kNN evaluation at step 2) and checkpoint; one process with
    # two devices resumes from that checkpoint for step 3; two processes resume again (reading the run's
    # checkpoint before they join their group would start JAX too early) and finish: the whole run
    # equals the one-process run bit for bit.
    assert launch_local(flags(demo_dir, tmp_path, "mixed", "--stop-at-step", "2"), ntasks=2) == 0
    # The global batches of the two processes (their indices, put together from both processes' rows).
    crc = [m["dataloader/index_crc32"] for _, m in sorted(metrics_by_step(tmp_path / "mixed").items())]
    assert len(crc) == 3 and len(set(crc)) == 3
    assert "eval/knn_acc" in metrics_by_step(tmp_path / "mixed")[2]
    one_process_two_devices(flags(demo_dir, tmp_path, "mixed", "--stop-at-step", "3"))
    assert launch_local(flags(demo_dir, tmp_path, "mixed"), ntasks=2) == 0
    assert differing(tmp_path / "one", tmp_path / "mixed") == []


def test_a_group_whose_run_is_taken_over_stops_together(demo_dir: Path, tmp_path: Path) -> None:
    # Process 0 alone holds the lease: when it found the run taken, it alone stopped, and the two waited
    # for each other for ever (process 1 in its next collective, process 0 in its exit).
    argv = flags(demo_dir, tmp_path, "taken")
    argv[argv.index("--steps") + 1] = "100000"  # until the lease is found taken: a heartbeat's wait
    lease = tmp_path / "taken" / LEASE_FILE
    taker: dict = {}

    def take_over() -> None:  # as another host's trainer would, once this group holds the run
        while not lease.exists():
            time.sleep(0.05)
        holder = json.loads(lease.read_text())
        taker.update({**holder, "token": "f" * 16, "pid": 4242, "heartbeat": time.time() + 3600})
        lease.with_suffix(".tmp").write_text(json.dumps(taker))
        lease.with_suffix(".tmp").replace(lease)

    hung: list[bool] = []

    def kill() -> None:
        hung.append(True)
        subprocess.run(["pkill", "-9", "-f", str(tmp_path)], check=False)

    threading.Thread(target=take_over, daemon=True).start()
    watchdog = threading.Timer(HEARTBEAT_S + 240, kill)
    watchdog.start()
    try:
        code = launch_local(argv, ntasks=2)  # in the main thread: it sets a SIGINT handler
    finally:
        watchdog.cancel()
    assert not hung, "the group did not stop"
    assert code == exit_codes.USAGE
    assert json.loads(lease.read_text()) == taker


def test_a_process_killed_mid_run_stops_its_group_at_once_in_one_line(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Process 1 killed (the OOM killer, a lost node): process 0 raised a traceback from a collective naming
    # no process, then waited out the group's shutdown barrier (100 s) and aborted with a C++ stack.
    import signal
    import socket

    from birdjepa.slurm.sweep import wait_group

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = {"BIRDJEPA_NUM_PROCESSES": "2", "BIRDJEPA_COORDINATOR": f"127.0.0.1:{port}"}
    argv = flags(demo_dir, tmp_path, "killed")
    argv[argv.index("--steps") + 1] = "100000"
    argv[argv.index("--ckpt-every") + 1] = "1"  # a save in flight when it dies: waited for, not hung on
    out = [tmp_path / f"out{i}.txt" for i in range(2)]
    procs = [subprocess.Popen(argv, env={**os.environ, **group, "BIRDJEPA_PROCESS_ID": str(i)},
                              stdout=out[i].open("w"), stderr=subprocess.STDOUT)
             for i in range(2)]  # fmt: skip
    log = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (log.exists() and '"step": 2,' in log.read_text()):
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    assert wait_group(procs) == -signal.SIGKILL
    assert time.monotonic() - killed < 30  # process 0 out on its own, before the launcher's grace ends
    said = out[0].read_text()
    assert procs[0].returncode == exit_codes.GROUP_BROKEN, said[-3000:]
    assert "ERROR: another process of the group stopped while this one waited for it (" in said
    assert "Traceback" not in said and "Check failure" not in said, said[-3000:]
    assert capsys.readouterr().err == "sweep: process 1 of 2 was killed by SIGKILL\n"
    assert not (tmp_path / "killed" / LEASE_FILE).exists()  # released: the next start is not refused


@pytest.mark.slow  # two processes that start JAX and read the data: ~20 s
def test_processes_started_with_other_options_or_data_are_refused_together(
    demo_dir: Path, tmp_path: Path
) -> None:
    # Another --seed in one process was a JAX assertion with hundreds of parameter arrays; another copy
    # of the shards trained a run none of its records described, exit 0.
    import shutil
    import socket

    shutil.copytree(demo_dir / "train", tmp_path / "other")
    next(iter(sorted((tmp_path / "other").glob("*.arrow")))).unlink()
    other_data = ["--data.train", str(tmp_path / "other")]
    for extra, said in ((["--seed", "1"], "--seed (processes 0 and 1)"),
                        (other_data, "--data.train (processes 0 and 1)")):  # fmt: skip
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        group = {"BIRDJEPA_NUM_PROCESSES": "2", "BIRDJEPA_COORDINATOR": f"127.0.0.1:{port}"}
        procs = [subprocess.Popen([*flags(demo_dir, tmp_path, "apart"), *(extra if i else [])],
                                  env={**os.environ, **group, "BIRDJEPA_PROCESS_ID": str(i)},
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(2)]  # fmt: skip
        outs = [p.communicate(timeout=300) for p in procs]
        assert [p.returncode for p in procs] == [2, 2], outs
        line = f"error: the processes of the group were started with another {said}: give each the same"
        assert outs[0][1].startswith(line), outs[0][1][-2000:]
    assert not (tmp_path / "apart").exists()  # refused before anything was written
    # One run folder's name on each node's own disk (a relative --log.runs-dir here, each process in
    # another folder): the resume, read in one process alone, aborted the group in gloo with a C++ stack.
    (tmp_path / "a" / "runs" / "apart" / "checkpoints" / "3").mkdir(parents=True)
    (tmp_path / "b").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = {"BIRDJEPA_NUM_PROCESSES": "2", "BIRDJEPA_COORDINATOR": f"127.0.0.1:{port}"}
    procs = [subprocess.Popen(flags(demo_dir, Path("runs"), "apart"), cwd=tmp_path / where,
                              env={**os.environ, **group, "BIRDJEPA_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, where in enumerate("ab")]  # fmt: skip
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs
    line = "error: the processes of the group find other checkpoints (processes 0 and 1) in runs/apart: it"
    assert all(err.startswith(line) for _, err in outs), outs
    assert "a shared file system, not a node's own disk" in outs[0][1]
    # A mistyped option in one process: process 0 waited 2 min for it, then a traceback.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = {"BIRDJEPA_NUM_PROCESSES": "2", "BIRDJEPA_COORDINATOR": f"127.0.0.1:{port}"}
    procs = [subprocess.Popen([*flags(demo_dir, tmp_path, "apart"), *(["--sed", "1"] if i else [])],
                              env={**os.environ, **group, "BIRDJEPA_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [2, 2], outs
    assert outs[0][1].startswith("error: another process of the group refused its options"), outs[0][1]
    assert "--sed" in outs[1][1] and "Traceback" not in outs[0][1] + outs[1][1], outs[1][1]


def test_a_ctrl_c_that_reaches_one_process_while_the_group_opens_stops_the_group_after_a_step(
    demo_dir: Path, tmp_path: Path
) -> None:
    # Before the loop a Ctrl-C was immediate in each process: the one it reached left, and the other
    # aborted 300 s later in a collective with a C++ stack; once in the loop, one process's Ctrl-C gave
    # the group exits 75 and 130. Now the group saves after its first step and exits 130 in both.
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    group = {"BIRDJEPA_NUM_PROCESSES": "2", "BIRDJEPA_COORDINATOR": f"127.0.0.1:{port}"}
    # SIGINT as a terminal's Python has it (a test runner's worker may ignore it, and a child inherits that).
    start = (
        "import signal, runpy; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('birdjepa.cli', run_name='__main__')"
    )
    argv = [sys.executable, "-c", start, *flags(demo_dir, tmp_path, "int")[3:]]
    procs = [subprocess.Popen(argv, env={**os.environ, **group, "BIRDJEPA_PROCESS_ID": str(i)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]  # fmt: skip
    assert procs[0].stdout is not None
    for line in procs[0].stdout:  # the group formed and checked (process 1 is past its handlers too)
        if line.startswith("devices="):
            break
    procs[1].send_signal(signal.SIGINT)
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [exit_codes.INTERRUPTED] * 2, outs
    (stop,) = [
        x for x in map(json.loads, (tmp_path / "int" / "metrics.jsonl").open()) if x.get("event") == "stop"
    ]
    assert (stop["reason"], stop["exit_code"]) == (f"signal {int(signal.SIGINT)}", exit_codes.INTERRUPTED)
    assert "Ctrl-C: stopping after this step" not in outs[1][1]  # said once, by process 0's console alone
