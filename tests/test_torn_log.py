"""A node that dies mid-append leaves a torn last line in metrics.jsonl: readers skip it with a warning,
the next writer cuts it off into metrics.jsonl.torn (with a WARNING and an event) and appends on a new
line, and the resumed run then equals the straight one. Any other bad line names the file and line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tyro

from birdjepa.cli import main
from birdjepa.config import PretrainConfig
from birdjepa.pretrain.loop import pretrain
from birdjepa.resume.compare import compare_runs
from birdjepa.rundir.layout import METRICS_FILE
from birdjepa.rundir.metrics_log import MetricsFileError, read_metrics

TORN = b'{"step": 2, "restart": 0, "time": 1.5, "train/lo'


def train(demo_dir: Path, runs: Path, run: str, *extra: str) -> int:
    args = ["--run", run, "--log.runs-dir", str(runs), "--steps", "4", "--eval-every", "0",
            "--ckpt-every", "2", "--data.batch-size", "4", "--data.train", str(demo_dir / "train"),
            "--data.eval", str(demo_dir / "eval"), *extra]  # fmt: skip
    return pretrain(tyro.cli(PretrainConfig, args=args))


def test_readers_skip_a_torn_last_line_and_name_any_other_bad_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [{"step": 0, "restart": 0, "train/loss": 1.0}, {"step": 1, "restart": 0, "train/loss": 0.5}]
    (tmp_path / METRICS_FILE).write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in good) + TORN)
    assert list(read_metrics(tmp_path)) == good
    assert f"{tmp_path / METRICS_FILE}:3: a torn last line is ignored" in capsys.readouterr().out
    (tmp_path / METRICS_FILE).write_bytes(json.dumps(good[0]).encode() + b"\n" + TORN + b"\n" +
                                          json.dumps(good[1]).encode() + b"\n")  # fmt: skip
    with pytest.raises(MetricsFileError, match=f"{tmp_path / METRICS_FILE}:2: not a JSON line"):
        list(read_metrics(tmp_path))
    with pytest.raises(SystemExit) as e:  # the command line: one line, exit 2
        main(["compare", str(tmp_path), str(tmp_path)])
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1
    # JSON, but no row: a KeyError's or TypeError's traceback from compare, trace and bisect.
    for odd in ('{"train/loss": 1.0}', "[1, 2]", '{"step": "7", "train/loss": 1.0}', '{"step": true}'):
        (tmp_path / METRICS_FILE).write_text(
            json.dumps(good[0]) + "\n" + odd + "\n" + json.dumps(good[1]) + "\n"
        )
        with pytest.raises(MetricsFileError, match=f"{tmp_path / METRICS_FILE}:2: not a row of this log"):
            list(read_metrics(tmp_path))


def test_a_live_log_is_read_as_it_was_at_the_open_not_into_a_line_appended_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader at the end of a live run's log met a line half written, then, at its next read, the other
    # half as a line of its own: "not a JSON line" (exit 2) where a torn last line is passed over.
    good = [{"step": 0, "restart": 0, "train/loss": 1.0}, {"step": 1, "restart": 0, "train/loss": 0.5}]
    log = tmp_path / METRICS_FILE
    line = json.dumps(good[1]).encode() + b"\n"
    log.write_bytes(json.dumps(good[0]).encode() + b"\n" + line[:10])
    real_open = Path.open

    class Live:  # the writer finishes its line between the reader's two reads, as a kernel may order them
        def __init__(self, f: object) -> None:
            self.f = f

        def __enter__(self) -> Live:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()  # type: ignore[attr-defined]

        def fileno(self) -> int:
            return self.f.fileno()  # type: ignore[attr-defined]

        def __iter__(self):  # noqa: ANN204
            for read in self.f:  # type: ignore[attr-defined]
                if not read.endswith(b"\n"):
                    with real_open(log, "ab") as w:
                        w.write(line[10:])
                yield read

    monkeypatch.setattr(Path, "open", lambda self, *a, **k: Live(real_open(self, *a, **k)))
    assert list(read_metrics(tmp_path)) == good[:1]


def test_a_resume_cuts_the_torn_tail_off_and_ends_equal_to_the_straight_run(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train(demo_dir, tmp_path, "straight") == 0
    assert train(demo_dir, tmp_path, "torn", "--stop-at-step", "1") == 0
    log = tmp_path / "torn" / METRICS_FILE
    with log.open("ab") as f:  # killed while appending step 2's line
        f.write(TORN)
    assert train(demo_dir, tmp_path, "torn") == 0
    assert (tmp_path / "torn" / (METRICS_FILE + ".torn")).read_bytes() == TORN + b"\n"
    out = capsys.readouterr().out
    assert f"a torn last line ({len(TORN)} bytes, a writer killed mid-append) was moved" in out
    # Its own checkpoints and log: no word of another run's (test_a_resume_says_when_its_checkpoints_...).
    assert "is not what checkpoint" not in out
    assert not [e for e in read_metrics(tmp_path / "torn") if e.get("event") == "other_history"]
    events = [r for r in read_metrics(tmp_path / "torn") if r.get("event") == "torn_log"]
    assert len(events) == 1 and events[0]["bytes"] == len(TORN)
    assert all(line.strip() for line in log.read_text().splitlines())  # every record on its own line
    diffs = compare_runs(tmp_path / "straight", tmp_path / "torn")
    assert diffs and all(d.max_abs == 0.0 for d in diffs), [d for d in diffs if d.max_abs]


def test_a_segment_killed_before_its_first_save_is_counted_and_its_cut_save_removed_by_the_next_resume(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both segments resumed from checkpoint 1 logged restart 1 (it came from the checkpoint alone): no field
    # told the killed segment's rows from the next one's, and analyze listed one resume twice. Its save,
    # killed mid-write, left a checkpoint's size of temporary folder there for ever.
    import shutil

    assert train(demo_dir, tmp_path, "k", "--stop-at-step", "1") == 0
    killed = [{"event": "resume", "step": 2, "restart": 1, "time": 1.0, "checkpoint": 1},
              {"step": 2, "restart": 1, "time": 1.5, "train/loss": 0.5}]  # fmt: skip
    with (tmp_path / "k" / METRICS_FILE).open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in killed)
    checkpoints = tmp_path / "k" / "checkpoints"
    shutil.copytree(checkpoints / "1", checkpoints / "2.orbax-checkpoint-tmp")
    assert train(demo_dir, tmp_path, "k") == 0
    assert not list(checkpoints.glob("*.orbax-checkpoint-tmp*"))
    assert "resumed from checkpoint 1: continuing at step 2 (restart 2)" in capsys.readouterr().out
    rows = list(read_metrics(tmp_path / "k"))
    assert [r["restart"] for r in rows if r.get("event") == "resume"] == [1, 2]
    assert {r["restart"] for r in rows if r["step"] == 3} == {2}


def test_a_resume_says_when_its_checkpoints_are_another_run_s(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Another run's checkpoints copied in (seed 1 into a run of seed 0): every resume check passed, exit 0,
    # and the log then held the steps of two runs as one (compare: max_abs_diff 3e9).
    import shutil

    assert train(demo_dir, tmp_path, "other", "--stop-at-step", "1", "--seed", "1") == 0
    # "mine": a run whose log is its own (step 1's row differs from what the checkpoint recorded), with
    # the other run's checkpoints copied in.
    shutil.copytree(tmp_path / "other", tmp_path / "mine")
    log = tmp_path / "mine" / METRICS_FILE
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    for r in rows:
        if r.get("step") == 1 and "train/loss" in r:
            r["train/loss"] = r["train/loss"] * 1.5
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert train(demo_dir, tmp_path, "mine", "--stop-at-step", "2", "--seed", "1") == 0
    out = capsys.readouterr().out
    said = f"WARNING {tmp_path / 'mine' / METRICS_FILE}'s row of step 1 is not what checkpoint 1 recorded"
    assert said in out and "the checkpoints or the log are another run's (copied in?)" in out, out
    assert [e["step"] for e in read_metrics(tmp_path / "mine") if e.get("event") == "other_history"] == [2]
    # Its own checkpoint, nothing said: the torn-tail test's resume.


def test_another_history_is_told_by_the_training_row_of_the_step_and_not_by_its_clocks(
    tmp_path: Path,
) -> None:
    # The evaluation's row of a step, written after its training row, held no train/ value: the check
    # never fired where a save met an evaluation (every default cadence). Two segments of one run that
    # trained the step (a kill -9, then another --log-every) differ in their clocks only: a false alarm.
    from birdjepa.rundir.log_at_resume import read_at_resume

    rows = [{"step": 1, "restart": 0, "time": 1.0, "train/loss": 0.5, "train/step_time": 0.1},
            {"step": 1, "restart": 0, "time": 2.0, "eval/knn_acc": 0.25}]  # fmt: skip
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    logged = read_at_resume(tmp_path / METRICS_FILE, 1)
    said = logged.other({"train/loss": 0.75, "train/step_time": 0.2})
    assert said is not None and "(train/loss: logged 0.5, checkpointed 0.75)" in said, said
    assert logged.other({"train/loss": 0.5, "train/step_time": 0.9}) is None


def test_the_resume_reads_its_log_once_and_passes_over_a_torn_last_line_as_its_writer_will(
    tmp_path: Path,
) -> None:
    # A torn last line is cut off when the writer opens the log: not damage. A bad line before it is, and
    # so is a row compare refuses (no integer step), said as compare says it.
    from birdjepa.rundir.log_at_resume import read_at_resume

    log = tmp_path / METRICS_FILE
    rows = [{"step": 0, "restart": 0, "train/loss": 1.0}, {"event": "stop", "step": 0, "restart": 0},
            {"event": "resume", "step": 1, "restart": 2},
            {"step": 1, "restart": 2, "train/loss": 0.5}]  # fmt: skip
    whole = "".join(json.dumps(r) + "\n" for r in rows)
    log.write_text(whole + '{"step": 2, "resta')
    logged = read_at_resume(log, 1)
    assert (logged.restart, logged.saved, logged.last_step, logged.bad) == (2, 0, 1, None)
    assert logged.row == rows[3] and logged.damage(slack=2) is None
    log.write_text('{"step": 0, "rest\n' + whole)
    assert read_at_resume(log, 1).damage(slack=2) == (
        f"{log}:1: not a JSON line: compare and analyze refuse the log until it is repaired"
    )
    log.write_text(whole + '{"step": "2"}\n')
    assert f"{log}:5: not a row of this log" in str(read_at_resume(log, 1).damage(slack=2))
    assert read_at_resume(tmp_path / "absent", 4).damage(slack=2) is not None


def cut_first_line(log: Path) -> None:
    first, rest = log.read_bytes().split(b"\n", 1)
    log.write_bytes(first[:40] + b"\n" + rest)


def test_a_resume_says_when_its_log_lost_rows_or_holds_a_bad_line(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Both resumed with exit 0 and no word; only a later compare found them (max_abs_diff=inf, or the
    # log refused).
    import shutil

    assert train(demo_dir, tmp_path, "stopped", "--stop-at-step", "1") == 0
    for run, damage, said in (
        ("emptied", lambda log: log.write_bytes(b""), "holds rows of no step, and checkpoint 1 was written"),
        ("cut", cut_first_line, f"{METRICS_FILE}:1: not a JSON line"),
    ):
        shutil.copytree(tmp_path / "stopped", tmp_path / run)
        damage(tmp_path / run / METRICS_FILE)
        capsys.readouterr()
        assert train(demo_dir, tmp_path, run) == 0
        out = capsys.readouterr().out
        assert f"WARNING {tmp_path / run / METRICS_FILE}" in out and said in out, out
        lines = (tmp_path / run / METRICS_FILE).read_text().splitlines()
        (event,) = [json.loads(x) for x in lines if '"log_damaged"' in x]
        assert said in event["why"] and event["step"] == 2
    # Rows as sparse as the segment that wrote the checkpoint logged them: a --log-every lowered at the
    # resume said "the log lost rows" of a log that lost none.
    assert train(demo_dir, tmp_path, "sparse", "--log-every", "50", "--monitor-interval", "0",
                 "--stop-at-step", "1") == 0  # fmt: skip
    capsys.readouterr()
    assert train(demo_dir, tmp_path, "sparse", "--log-every", "1") == 0
    assert "lost rows" not in capsys.readouterr().out
    assert not [e for e in read_metrics(tmp_path / "sparse") if e.get("event") == "log_damaged"]


def test_a_non_finite_value_is_a_string_in_the_log_and_a_number_in_wandb(tmp_path: Path) -> None:
    # The mirror got the log's "nan": a series of mixed types in wandb.
    import math

    from birdjepa.rundir.metrics_log import MetricsLog

    class Mirror:
        def __init__(self) -> None:
            self.logged: list[dict] = []

        def log(self, values: dict, step: int) -> None:
            self.logged.append({**values, "_step": step})

    mirror = Mirror()
    log = MetricsLog(tmp_path, restart=0, wandb_run=mirror)
    log.log(3, {"train/loss": float("nan"), "train/grad_norm": float("inf"), "train/lr": 0.5})
    log.close()
    (line,) = read_metrics(tmp_path)
    assert (line["train/loss"], line["train/grad_norm"], line["train/lr"]) == ("nan", "inf", 0.5)
    (sent,) = mirror.logged
    assert math.isnan(sent["train/loss"]) and sent["train/grad_norm"] == math.inf and sent["train/lr"] == 0.5
    assert sent["_step"] == 3


def test_a_wandb_mirror_whose_service_dies_stops_mirroring_and_the_log_goes_on(tmp_path: Path) -> None:
    # wandb's service process killed (the OOM killer): the run died with a traceback, exit 1, its steps
    # since the last checkpoint lost, and wandb's exit hook printed another at exit. A real offline run.
    import subprocess
    import sys

    script = f"""
import os, signal, wandb
from pathlib import Path
from birdjepa.pretrain.wandb_mirror import open_run
from birdjepa.rundir.metrics_log import MetricsLog
run = open_run("offline", Path({str(tmp_path)!r}), "r", "p", {{}}, 0)
log = MetricsLog(Path({str(tmp_path)!r}), restart=0, wandb_run=run)
log.log(0, {{"train/loss": 1.0}})
for pid in os.listdir("/proc"):
    try:
        stat = Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{{pid}}/cmdline").read_bytes()
    except (OSError, IndexError):
        continue
    if int(stat[1]) == os.getpid() and b"wandb-core" in cmd:
        os.kill(int(pid), signal.SIGKILL)
        os.waitpid(int(pid), 0)
for step in range(1, 40):  # until the mirror finds its service gone
    log.log(step, {{"train/loss": 1.0}})
log.close()
"""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    cmd = [sys.executable, "-c", script]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING the wandb mirror stopped (" in done.stdout and "Traceback" not in done.stderr, done
    assert [m["step"] for m in read_metrics(tmp_path)] == list(range(40))


def test_a_start_that_sets_an_earlier_start_s_log_aside_sets_its_wandb_id_aside(tmp_path: Path) -> None:
    # Both starts were mirrored under one wandb id: offline one run of two trainings, online the new
    # start's first steps dropped (below the steps wandb holds).
    from birdjepa.pretrain.wandb_mirror import run_id
    from birdjepa.rundir.layout import set_aside_log

    first = run_id(tmp_path, "r")
    (tmp_path / METRICS_FILE).write_text('{"step": 0, "restart": 0, "time": 1.0}\n')
    assert set_aside_log(tmp_path) == tmp_path / "metrics.earlier-1.jsonl"
    assert (tmp_path / "wandb_id.earlier-1").read_text().split()[0] == first
    assert run_id(tmp_path, "r") != first


def test_a_copied_run_folder_mirrors_to_its_own_wandb_id_and_a_moved_one_keeps_its(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `cp -r run run-lowlr`, both resumed: both histories went to one wandb run.
    import shutil

    from birdjepa.pretrain.wandb_mirror import run_id

    (tmp_path / "a").mkdir()
    first = run_id(tmp_path / "a", "a")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    copied = run_id(tmp_path / "copy", "a")
    assert copied != first and run_id(tmp_path / "copy", "a") == copied
    assert (
        f"WARNING {tmp_path / 'copy'} is a copy of the run folder {tmp_path / 'a'}, which mirrors to "
        f"wandb run {first}: this copy mirrors to a new one, {copied}" in capsys.readouterr().out
    )
    assert run_id(tmp_path / "a", "a") == first  # the original keeps its own
    (tmp_path / "a").rename(tmp_path / "moved")  # moved: the same run, the same id
    assert run_id(tmp_path / "moved", "a") == first
    (tmp_path / "link").symlink_to(tmp_path / "moved")  # another path to the same folder
    assert run_id(tmp_path / "link", "a") == first and "WARNING" not in capsys.readouterr().out
    # A run named with a letter beyond ASCII keeps the id made of it (it got a new one at every start).
    (tmp_path / "café").mkdir()
    accented = run_id(tmp_path / "café", "café")
    assert accented.startswith("café-") and run_id(tmp_path / "café", "café") == accented
    # Emptied (a write cut short, a full disk): the mirror did not start at any start, the file unnamed.
    for held in (b"", b"\n", b"\xff\xfe"):
        (tmp_path / "moved" / "wandb_id").write_bytes(held)
        again = run_id(tmp_path / "moved", "a")
        assert again.startswith("a-") and run_id(tmp_path / "moved", "a") == again
        assert f"WARNING {tmp_path / 'moved' / 'wandb_id'} holds no wandb id" in capsys.readouterr().out


@pytest.mark.parametrize(
    "data",
    [
        b"\n",
        b"\n\n\n",
        b"a",
        b"a\n",
        b"a\nb",
        b"a\nb\n\n\n",
        b"x" * 70000 + b"\n" + b"y" * 70000,
        b"x" * 70000 + b"\n" + b"y" * 70000 + b"\n\n",
        b"a\n" + b"\n" * 70000,
        b"q\n" + b"z" * (1 << 16) + b"\n",
        b'{"step": 0}\n' + b"\0" * (1 << 20),
    ],  # fmt: skip
)
def test_the_last_line_is_found_from_the_end_across_blocks(tmp_path: Path, data: bytes) -> None:
    # Read back from the end, not whole (a log of hundreds of MB at every start); a first version read
    # the tail again for every block it went back (a tail of NULs a crash left: minutes).
    from birdjepa.rundir.metrics_log import _last_line

    (tmp_path / "log").write_bytes(data)
    cut = data.rstrip(b"\n").rfind(b"\n") + 1
    assert _last_line(tmp_path / "log") == (cut, data[cut:])
