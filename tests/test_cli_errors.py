"""Bad input to `birdjepa compare`, `birdjepa loader-demo` and `birdjepa demo-data` is one line naming the
argument that is wrong, and exit 2.

(`trace`, `diff-trace` and `bisect`: tests/test_divergence.py; `export` and `embed`:
tests/test_evaluation.py; `analyze`: tests/test_analysis.py.)"""

from __future__ import annotations

import json
import os
import runpy
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from birdjepa.cli import main


def test_compare_leaves_out_what_a_revision_crossed_by_a_resume_redefines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An MAE run resumed across revision 6 (its monitor summaries over other parameters) differed from
    # its straight twin by either code, max_abs_diff=inf, exit 1, and nothing said why.
    import json

    def write(run: str, lines: list[dict]) -> None:
        (tmp_path / run).mkdir(exist_ok=True)
        (tmp_path / run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

    rows = [{"step": s, "train/loss": 1.0 / (s + 1), "monitor/update_ratio/min": 0.0} for s in range(4)]
    write("straight", rows)
    revised = {"event": "step_revised", "step": 2, "revision": [5, 6], "redefined": ["monitor/update_ratio/"]}
    write("resumed", [*rows[:2], revised, *({**r, "monitor/update_ratio/min": 2.5e-4} for r in rows[2:])])
    main(["compare", str(tmp_path / "straight"), str(tmp_path / "resumed")])
    out = capsys.readouterr().out
    said = (f"not compared: monitor/update_ratio/*, which a revision of the step crossed by a resume "
            f"redefines ({tmp_path / 'resumed'} at step 2; `birdjepa analyze` says which)")  # fmt: skip
    assert said in out.splitlines() and out.endswith("max_abs_diff=0.0\n"), out
    # A run the crossed revisions redefine nothing in (a LeJEPA run across revision 6): all compared.
    write("resumed", [*rows[:2], {**revised, "redefined": []},
                      *({**r, "monitor/update_ratio/min": 2.5e-4} for r in rows[2:])])  # fmt: skip
    with pytest.raises(SystemExit) as e:
        main(["compare", str(tmp_path / "straight"), str(tmp_path / "resumed")])
    assert e.value.code == 1 and "not compared" not in capsys.readouterr().out
    # Another metric still counts; and an event written before events named them: every metric the
    # crossed revisions redefine (revision 4's train/grad_norm here).
    write(
        "resumed",
        [
            {"event": "step_revised", "step": 2, "revision": [3, 4]},
            *({**r, "train/loss": 2.0, "train/grad_norm": float(r["step"])} for r in rows),
        ],
    )
    with pytest.raises(SystemExit) as e:
        main(["compare", str(tmp_path / "straight"), str(tmp_path / "resumed")])
    out = capsys.readouterr().out
    assert e.value.code == 1 and "not compared: train/grad_norm, which a revision" in out, out
    assert "train/loss" in out and "monitor/update_ratio/min" in out, out


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("nosuch", "nosuch: no such folder (runs in {tmp}: good)"),  # the runs beside it
        ("afile", "afile: not a run folder (a file)"),
        ("bare", "bare: not a run folder (no metrics.jsonl in it)"),
    ],
)
def test_compare_names_the_run_folder_that_is_not_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, message: str
) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "metrics.jsonl").write_text('{"step": 0, "train/loss": 1.0}\n')
    (tmp_path / "afile").write_text("")
    (tmp_path / "bare").mkdir()
    for args in ([tmp_path / name, good], [good, tmp_path / name]):  # either argument
        with pytest.raises(SystemExit) as e:
            main(["compare", *map(str, args)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err == f"error: {tmp_path}/{message.format(tmp=tmp_path)}\n", err


def test_compare_of_a_metric_neither_run_logged_is_an_error_not_equal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # --metrics train/los (a typo) printed max_abs_diff=0.0 and exit 0: a resume check that passed; then
    # the first 8 names logged, all dataloader/*, never the one meant.
    row = {"step": 0, **{f"dataloader/m{i}": 1.0 for i in range(9)}, "train/loss": 1.0}
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    first = ", ".join(f"dataloader/m{i}" for i in range(8))
    for typo, hint in (("train/los", "did you mean train/loss?"), ("zzz", f"they log {first}, ... (10)")):
        with pytest.raises(SystemExit) as e:
            main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--metrics", typo])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err == f"error: --metrics {typo}: neither run logged it; {hint}\n", err
    for run in ("a", "b"):
        (tmp_path / run / "metrics.jsonl").write_text('{"step": 0, "train/loss": 1.0}\n')
    with pytest.raises(SystemExit) as e:  # logged, not compared: it said "neither run logged it"
        main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--metrics", "time", "train/step_time"])
    said = "error: --metrics time train/step_time: not compared (wall-clock time or bookkeeping, which differ"
    assert e.value.code == 2 and capsys.readouterr().err.startswith(said)
    with pytest.raises(SystemExit) as e:  # none: max_abs_diff=inf, exit 1, a run unequal to itself
        main(["compare", str(tmp_path / "a"), str(tmp_path / "a"), "--metrics"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith("error: --metrics: give at least one")
    for run in ("a", "b"):  # no step in either: a header-only table, max_abs_diff=inf, exit 1
        (tmp_path / run / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit) as e:
        main(["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert (
        e.value.code == 2
        and capsys.readouterr().err == f"error: neither {tmp_path / 'a'} nor {tmp_path / 'b'} logged a step\n"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--batches", "0"], "--batches 0: must be >= 1"),  # it ran forever
        (["--batches", "-2"], "--batches -2: must be >= 1"),
        (["--batch-size", "0"], "--batch-size 0: must be >= 1"),
        (["--n-workers", "-1"], "--n-workers -1: must be >= 0"),
        (["--data", "{tmp}"], "no shard files match"),  # a traceback before
    ],
)
def test_loader_demo_options_that_cannot_work_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["loader-demo", *[f.format(tmp=tmp_path) for f in flags]])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and message in err, err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "-1"], "--workers -1: must be >= 1"),  # taken, "with -1 worker(s)"
        (["--recordings", "20"], "--shards 500: must be in [1, --recordings (20)]"),  # "got 500, 20"
        (["--recordings", "0"], "--recordings 0: must be >= --n-species (16)"),  # it named --shards
        (["--recordings", "50", "--pool", "0"], "--pool 0: must be >= 1"),
        # Exit 1, "need n_species <= pool <= recordings, got 60", with --pool or without.
        (
            ["--recordings", "50", "--shards", "5", "--pool", "60"],
            "--pool 60: must be in [--n-species (16), --recordings (50)]",
        ),
        (
            ["--recordings", "10", "--shards", "5", "--n-species", "20"],
            "--recordings 10: must be >= --n-species (20)",
        ),
    ],
)
def test_demo_data_options_that_cannot_work_are_one_line_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["demo-data", str(tmp_path / "out"), *flags])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err == f"birdjepa demo-data: error: {message}", err
    assert not (tmp_path / "out").exists()


def test_a_wandb_mirror_that_cannot_start_is_a_warning_not_the_end_of_the_run(tmp_path: Path) -> None:
    # --log.wandb online without an API key (or a compute node without network) stopped the run with
    # wandb's traceback; the log in the run directory is the source of truth. In a process of its own:
    # wandb's threads outlive the failed start (one parsed source beside tyro's in a test worker, and
    # CPython 3.11's AST state is not per thread: "AST constructor recursion depth mismatch").
    code = "from birdjepa.pretrain.wandb_mirror import open_run; import sys; print(open_run('online', " \
           f"__import__('pathlib').Path({str(tmp_path)!r}), 'r', 'p', {{}}, 0))"  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {"HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    warning, result = done.stdout.splitlines()[-2:]
    assert warning.startswith("WARNING the wandb mirror could not start (UsageError: No API key configured.")
    assert result == "None"


def test_a_ctrl_c_in_any_command_is_one_line_and_exit_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # benchmark and evaluate printed KeyboardInterrupt's traceback (what they wrote stays whole: the store
    # and the cache are renamed into place, the evaluation's JSON is written at its end).
    import birdjepa.cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(birdjepa.cli, "resolve", lambda _target: interrupted)
    with pytest.raises(SystemExit) as e:
        main(["benchmark"])
    assert e.value.code == 130 and capsys.readouterr().err == "birdjepa benchmark: interrupted; exit 130\n"


def a_command_that(does: str) -> subprocess.CompletedProcess:
    """`birdjepa benchmark` in a process of its own, its work replaced by ``does`` (a statement), with an
    atexit hook that prints TEARDOWN: it stands for the interpreter's teardown."""
    code = (
        "import atexit, os, signal, sys, time, birdjepa.cli as cli\n"
        "atexit.register(lambda: print('TEARDOWN', flush=True))\n"
        f"def work():\n    {does}\n"
        "cli.resolve = lambda _target: work\n"
        "sys.argv = ['birdjepa', 'benchmark']\n"
        "cli.main()\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_ctrl_c_in_a_command_s_own_process_exits_past_the_interpreter_s_teardown() -> None:
    # There, jaxlib's module freed with the interrupted traceback's frames segfaulted: "exit 130", then
    # exit -11 (evaluate, benchmark: 5 of 7 Ctrl-Cs while they embedded); a second Ctrl-C during
    # pretrain's first compile aborted (exit -6) in the compile's thread.
    done = a_command_that("raise KeyboardInterrupt")
    assert done.returncode == 130 and done.stderr == "birdjepa benchmark: interrupted; exit 130\n", done
    assert "TEARDOWN" not in done.stdout
    # A SIGTERM (`scancel`) to a command that does not save: it died without a word, exit -15, and
    # evaluate's lease of the run was left to go stale.
    done = a_command_that("os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)")
    assert done.returncode == 143 and done.stderr == "birdjepa benchmark: terminated (SIGTERM); exit 143\n", (
        done
    )
    # A SIGTERM once the work is done, at the interpreter's exit (JAX's atexit hook): a traceback from the
    # hook ("Exception ignored in atexit callback ... Terminated"). The signal's own action there.
    done = a_command_that("atexit.register(lambda: (os.kill(os.getpid(), signal.SIGTERM), time.sleep(30)))")
    assert done.returncode == -signal.SIGTERM and done.stderr == "", done


def test_a_reader_that_closes_the_pipe_ends_a_command_quietly_with_the_shell_s_code(tmp_path: Path) -> None:
    # `birdjepa benchmark --table R | head -1` printed two BrokenPipeError tracebacks, exit 1.
    from birdjepa.benchmark import store

    # One row: the table is written at the buffer's flush, which came after main (Python's own message).
    store.put(tmp_path, store.Key("raw", "T", "centroid", 1, 0), {"cmap": 0.5, "auroc": 0.5, "top1": 0.5},
              n_train=1, n_test=1, fit_s=0.0, config={})  # fmt: skip
    command = [sys.executable, "-m", "birdjepa.cli", "benchmark", "--table", str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as done:
        done.stdout.close()  # before the child has imported anything: its first write fails
        err = done.stderr.read().decode()
    assert done.returncode == 141 and err == "", err


def test_a_determinism_flag_given_another_value_in_xla_flags_is_warned(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A cluster's XLA_FLAGS turned the threaded reductions back on without a word (the user's value kept).
    from birdjepa.train.determinism import overridden_flags

    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true --xla_dump_to=/tmp/x")
    assert overridden_flags() == ["--xla_cpu_multi_thread_eigen=true"]
    for command, warned in ((["pretrain", "--help"], True), (["compare", "--help"], False)):
        with pytest.raises(SystemExit):
            main(command)
        said = capsys.readouterr().err
        assert ("WARNING XLA_FLAGS sets --xla_cpu_multi_thread_eigen=true: the" in said) == warned, said
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    assert overridden_flags() == []


def test_a_backend_this_machine_lacks_is_one_line(tmp_path: Path) -> None:
    # A job requeued onto a CPU node under JAX_PLATFORMS=cuda: JAX's bare AssertionError, exit 1.
    command = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--log.runs-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "JAX_PLATFORMS": "cuda"})  # fmt: skip
    said = ("birdjepa pretrain: error: $JAX_PLATFORMS='cuda': no such backend on this machine (a job on "
            "another partition's nodes?); unset it or name one it has\n")  # fmt: skip
    assert (done.returncode, done.stderr) == (2, said), done.stderr


def test_a_command_started_in_a_removed_folder_is_one_line(tmp_path: Path) -> None:
    # `cd g; rmdir ../g; birdjepa pretrain ...`: os.path.abspath's FileNotFoundError, a traceback.
    start = f"mkdir g && cd g && rmdir ../g && exec {shlex.quote(sys.executable)} -m birdjepa.cli compare a b"
    done = subprocess.run(["sh", "-c", start], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    said = "birdjepa compare: error: the working folder was removed after this shell entered it: cd to one "
    assert (done.returncode, done.stderr) == (2, said + "that exists\n"), done


def test_a_console_on_a_full_disk_is_one_line_exit_74() -> None:
    # `birdjepa compare A B > out` on a full quota: a traceback, exit 1 (compare's "the runs differ").
    code = ("import sys, birdjepa.cli as cli\n"
            "cli.resolve = lambda _target: (lambda: print('row ' * 20000))\n"
            "sys.argv = ['birdjepa', 'benchmark']\ncli.main()\n")  # fmt: skip
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-c", code], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120)  # fmt: skip
    said = "birdjepa benchmark: error: the standard output cannot be written (No space left on device); "
    assert (done.returncode, done.stderr) == (74, said + "exit 74\n"), done


def test_a_file_another_user_keeps_from_this_one_is_one_line_exit_74() -> None:
    # A run made under another user's umask 077: evaluate, export, compare, analyze each a traceback,
    # exit 1 (compare's "the runs differ" for two runs it could not read).
    done = a_command_that("raise PermissionError(13, 'Permission denied', '/lab/u77/metrics.jsonl')")
    said = "birdjepa benchmark: error: /lab/u77/metrics.jsonl: Permission denied; exit 74\n"
    assert (done.returncode, done.stderr) == (74, said), done


@pytest.mark.parametrize("command", [["export", "x" * 300, "--out", "e"], ["evaluate", "x" * 300]])
def test_a_name_longer_than_the_file_system_takes_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    # OSError: [Errno 36] File name too long, as a traceback, from every command that reads a run.
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(command)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.endswith(": File name too long\n"), err
    assert err.startswith(f"birdjepa {command[0]}: error: "), err


def test_compare_counts_a_nan_against_a_number_as_a_difference_and_two_nans_as_equal() -> None:
    # max(0.0, nan) is 0.0: a NaN against a number (a log written by plain json.dumps) compared equal.
    from birdjepa.resume.compare import compare_logged

    a = {0: {"train/loss": 0.5}, 1: {"train/loss": float("nan")}, 2: {"train/loss": float("nan")}}
    b = {0: {"train/loss": 0.5}, 1: {"train/loss": 0.25}, 2: {"train/loss": float("nan")}}
    (diff,) = compare_logged(a, b)
    assert diff.max_abs == float("inf") and diff.first_step == 1
    (same,) = compare_logged(a, {**a})
    assert same.max_abs == 0.0 and same.first_step is None


def test_a_matrix_script_never_removes_a_folder_it_did_not_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --runs-dir a folder of the user's runs was removed whole, and --only with a typo ran nothing, exit 0.
    from birdjepa.outputs import SCRATCH_MARKER, scratch_folder

    precious = tmp_path / "runs"
    (precious / "r").mkdir(parents=True)
    (precious / "r" / "checkpoint").write_text("weeks of training")
    with pytest.raises(ValueError, match=f"^{precious}: holds files the matrix did not write"):
        scratch_folder(precious, "the matrix")
    assert (precious / "r" / "checkpoint").read_text() == "weeks of training"
    ours = scratch_folder(tmp_path / "new", "the matrix")
    (ours / "left").write_text("")
    assert list(scratch_folder(ours, "the matrix").iterdir()) == [ours / SCRATCH_MARKER]
    script = Path(__file__).resolve().parents[1] / "scripts" / "divergence_matrix.py"
    typo = "--only no-such-pair: no such pair (the pairs: lr_schedule_shifted, "
    for args, said in ((["--only", "no-such-pair"], typo),
                       (["--runs-dir", str(precious)], f"--runs-dir {precious}: holds files")):  # fmt: skip
        monkeypatch.setattr(sys, "argv", [str(script), *args])
        with pytest.raises(SystemExit) as done:  # as python runs the script, in this process: a message
            runpy.run_path(str(script), run_name="__main__")  # exits 1, printed to stderr
        assert isinstance(done.value.code, str) and done.value.code.startswith(said), done.value.code
    assert (precious / "r" / "checkpoint").exists()
