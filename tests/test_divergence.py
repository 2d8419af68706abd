"""`birdjepa trace`, `diff-trace` and `bisect`: a traced step is the step that trained, the same step
traced twice gives the same file, a trace replays from an older checkpoint, and bad input is one line
and exit 2. Pairs of runs that differ in one thing: the cheap rows of the divergence matrix here, every
row (with the topology pair) in the slow test."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tyro
from conftest import rewrite_meta

from birdjepa import exit_codes
from birdjepa.cli import main
from birdjepa.config import PretrainConfig
from birdjepa.divergence import trace_file
from birdjepa.divergence.bisect import bisect
from birdjepa.divergence.diff import diff_traces
from birdjepa.divergence.replay import ReplayError
from birdjepa.divergence.trace import trace_step
from birdjepa.pretrain.loop import pretrain
from birdjepa.rundir.checkpoint import Checkpointer
from birdjepa.rundir.metrics_log import metrics_by_step
from birdjepa.train.calls import CALL_SITES
from birdjepa.train.digest import SMALL
from birdjepa.verify.divergence_matrix import PAIRS, flags, format_matrix, run_pair


def data(demo_dir: Path) -> tuple[str, ...]:
    return ("--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval"))


@pytest.fixture(scope="module")
def runs(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run "A" of the divergence matrix (4 steps), with checkpoints after steps 1 and 3."""
    runs = tmp_path_factory.mktemp("runs")
    args = [*flags(runs, "A", data(demo_dir)), "--ckpt-every", "2"]
    assert pretrain(tyro.cli(PretrainConfig, args=args)) == 0
    return runs


def test_a_damaged_checkpoint_is_replayed_past_and_the_device_count_is_the_segment_s(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Trace ended at a damaged checkpoint ("its state folder is missing", the path said twice) where the
    # docs promise "the newest earlier one, replaying"; bisect too.
    copy = shutil.copytree(runs / "A", tmp_path / "A")
    shutil.rmtree(copy / "checkpoints" / "1" / "state")
    t = trace_step(copy, 3)
    assert (t.manifest["restored_from"], t.manifest["matches_run"]["logged_metrics_equal"]) == (None, True)
    said = f"WARNING {copy / 'checkpoints' / '1'}: its state folder is missing: replaying"
    assert said in capsys.readouterr().out
    # Which device count trained a step: its segment's (its resume event's, else the first checkpoint it
    # wrote), not the restored checkpoint's, which the segment before wrote (4 devices, then 1: refused).
    from birdjepa.divergence.replay import devices_at

    four = {"next_step": {"n_devices": 4}}
    lines = [{"step": 0}, {"event": "resume", "step": 3, "n_devices": 1}, {"step": 3}]
    assert [devices_at(lines, {2: four}, s) for s in (1, 3, 5)] == [4, 1, 1]
    older = [{"step": 0}, {"event": "resume", "step": 3}]  # a log written before the event said it
    assert [devices_at(older, {2: four, 5: {"next_step": {"n_devices": 2}}}, s) for s in (1, 4)] == [4, 2]
    assert devices_at([], {}, 0) is None


def test_a_verdict_says_a_step_that_does_not_re_execute_as_it_trained(runs: Path) -> None:
    # Two runs' logs differed at step 3 (one segment resumed under another optimisation level) and their
    # re-executions here did not: "No tensor differs at step 3. The configs agree." under that header.
    from birdjepa.divergence.bisect import search, verdict
    from birdjepa.divergence.trace_file import Trace

    t = trace_step(runs / "A", 1)
    moved = Trace({**t.manifest, "matches_run": {"logged_metrics_equal": False}}, t.entries)
    said = verdict(1, diff_traces(t, t), search(runs / "A", runs / "A"), 1, t, moved)
    assert said.startswith("No tensor differs at step 1 as the runs re-execute here, but B's step 1 does not "
                           "re-execute as it trained (its logged metrics differ)"), said  # fmt: skip
    assert verdict(1, diff_traces(t, t), search(runs / "A", runs / "A"), 1, t, t).startswith(
        "No tensor differs at step 1. The configs agree."
    )
    # Another input of the step is no consequence of the first difference (another seed's keys and
    # initial parameters were "consequences" of its batch).
    from birdjepa.divergence.diff import StageDiff, TensorDiff, TraceDiff

    def differs(stage: str) -> StageDiff:
        real = TensorDiff(stage, "x", ((2,), (2,)), 0.5, 1.0, (0,), (1.0, 2.0), 0.0, exact=True)
        return StageDiff(stage, 1, [real], [], [])

    d = TraceDiff(([], []), (1, 1), [differs("optimizer"), differs("opt_state_in"), differs("updates")])
    said = verdict(1, d, search(runs / "A", runs / "A"), 1, t, t)
    assert said.endswith(
        " Also differing going into the step: opt_state_in. Later stages that differ (consequences): updates."
    ), said


def test_bisect_names_a_resume_that_went_wrong_in_memory(runs: Path, demo_dir: Path) -> None:
    # A segment that trained from a perturbed state (its checkpoint intact): "step 2 does not re-execute
    # as it ran: it was trained by other code or on another machine", exit 2, where it is the resume.
    from birdjepa.divergence.bisect import bisect

    args = [*flags(runs, "F", data(demo_dir)), "--ckpt-every", "2"]
    assert pretrain(tyro.cli(PretrainConfig, args=[*args, "--stop-at-step", "1"])) == 0
    faulty = [*args, "--debug.inject-fault", "perturb_params", "--resume-checks", "warn"]
    assert pretrain(tyro.cli(PretrainConfig, args=faulty)) == 0
    code, report, _ = bisect(runs / "A", runs / "F")
    verdict = report.split("VERDICT: ")[1]
    assert code == 1 and verdict.startswith(f"{runs / 'F'}'s step 2 is the first of a segment resumed from "
                                            "checkpoint 1, and it does not re-execute"), report  # fmt: skip
    assert verdict.endswith("(its resume checks failed: param_norms, next_loss, next_gradient)."), verdict


def test_trace_of_a_step_that_does_not_re_execute_as_logged_exits_1(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It exited 0 with "outputs DIFFER" in its line: a script checking the exit code took it as equal.
    from birdjepa.rundir.layout import METRICS_FILE

    copy = shutil.copytree(runs / "A", tmp_path / "A")
    rows = [json.loads(line) for line in (copy / METRICS_FILE).read_text().splitlines()]
    for r in rows:
        if r.get("step") == 0 and "train/loss" in r and "event" not in r:
            r["train/loss"] += 1e-3  # as a run trained by other code would have logged
    (copy / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "t.npz"
    with pytest.raises(SystemExit) as e:
        main(["trace", str(copy), "--step", "0", "--out", str(out)])
    assert e.value.code == exit_codes.FAILED and out.exists()
    assert "outputs DIFFER from its logged metrics" in capsys.readouterr().out
    main(["trace", str(runs / "A"), "--step", "0", "--out", str(out)])  # equal: returns, exit 0


def test_trace_of_a_run_whose_data_moved_says_how_to_replay_it(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A resume takes the data's new path; a replay reads the one the run recorded, and said only
    # "cannot be read" (trace and bisect have no option for it).
    copy = shutil.copytree(runs / "A", tmp_path / "A")
    for meta_file in copy.glob("checkpoints/*/meta/metadata"):
        meta = json.loads(meta_file.read_text())
        meta["config"]["data"]["train"] = str(tmp_path / "moved")
        rewrite_meta(meta_file, {k: v for k, v in meta.items() if k != "meta_crc"})
    with pytest.raises(SystemExit) as e:
        main(["trace", str(copy), "--step", "3", "--out", str(tmp_path / "t.npz")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"{copy}: its train data cannot be read: " in err, err
    assert err.endswith("(replays read the path the run recorded, from the folder it was started in: where "
                        "the data moved, link it back there)\n"), err  # fmt: skip
    # Its audio root the same (a relative one read from here), where the loader's ValueError was a traceback.
    trained = json.loads((runs / "A" / "checkpoints" / "1" / "meta" / "metadata").read_text())["config"]
    for meta_file in copy.glob("checkpoints/*/meta/metadata"):
        meta = json.loads(meta_file.read_text())
        meta["config"]["data"] |= {"train": trained["data"]["train"], "audio_root": "gone"}
        rewrite_meta(meta_file, {k: v for k, v in meta.items() if k != "meta_crc"})
    with pytest.raises(SystemExit) as e:
        main(["trace", str(copy), "--step", "3", "--out", str(tmp_path / "t.npz")])
    err = capsys.readouterr().err
    said = (
        "the run's --data.audio-root gone: audio_root must be a folder, where rows whose audio is a "
        f"relative path find it (a relative path: read from {os.getcwd()}) (replays read the audio where"
    )
    assert e.value.code == 2 and said in err, err  # fmt: skip


def test_a_traced_step_is_the_step_that_trained_replayed_from_an_older_checkpoint(runs: Path) -> None:
    t = trace_step(runs / "A", 3, repeat=2, keep=("params_out",))
    m = t.manifest
    assert (m["restored_from"], m["replayed"]) == (1, [2, 2])  # checkpoint 1, then step 2 replayed
    assert m["noise"] == {}  # two executions on CPU: nothing differs
    assert m["inexact"] is None  # the recording step's outputs are the training step's, bit for bit
    assert m["matches_run"] == {"logged_metrics_equal": True, "checkpoint_equal": True}
    with Checkpointer(runs / "A", keep=None, async_save=False) as ckpt:
        saved = ckpt.read_arrays(3)  # what training wrote for step 3, read by path
    out = {e.name: e.array for e in t.entries if e.stage == "params_out"}
    assert out and all(np.array_equal(a, saved[f"['params']{name}"]) for name, a in out.items())
    # Kept whole: what --keep asked for, the batch's indices and labels, and tensors of <= 64 numbers.
    # Of the rest, the digest and statistics only (the activations never left the device).
    large = [e for e in t.entries if e.stage == "forward" and int(np.prod(e.shape)) > SMALL]
    assert large and all(e.array is None for e in large)
    assert t.by_key()["batch/index"].array is not None and t.by_key()["batch/spectrogram"].array is None
    logged = metrics_by_step(runs / "A")[3]
    traced = {e.name: e.array for e in t.entries if e.stage == "metrics"}
    assert float(traced["train/loss"]) == logged["train/loss"]
    stages = t.stages()
    assert stages == [s for s in m["stages"] if s in stages]  # in computation order
    assert {"batch", "keys", "optimizer", "params_in", "forward", "loss", "gradients", "updates"} <= set(
        stages
    )


@pytest.mark.slow  # two more processes; the traced step's equality with the run is proved above
def test_the_same_step_traced_in_two_processes_gives_the_same_file(
    runs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process has traced other models before (a CI run with tests spread per test, not per file,
    # failed here): their call sites must not reach this step's manifest.
    site = {"function": "Predictor.__call__", "file": "birdjepa/model/vit.py", "line": 1}
    monkeypatch.setitem(CALL_SITES, "predictor.__call__", site)
    here = tmp_path / "here.npz"
    trace_file.write(trace_step(runs / "A", 1), here)
    there = tmp_path / "there.npz"
    cmd = [sys.executable, "-m", "birdjepa.cli", "trace", str(runs / "A"), "--step", "1", "--out", str(there)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    a, b = trace_file.read(here), trace_file.read(there)
    differing = {k: (v, b.manifest.get(k)) for k, v in a.manifest.items() if v != b.manifest.get(k)}
    assert not differing, differing
    assert diff_traces(a, b).first is None, diff_traces(a, b).first
    assert here.read_bytes() == there.read_bytes()


def test_diff_trace_exits_0_on_identical_traces_and_1_naming_the_first_difference(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    t0, t1 = tmp_path / "new" / "0.npz", tmp_path / "1.npz"
    # The command makes a missing folder for its output, as `embed --out` does.
    main(["trace", str(runs / "A"), "--step", "0", "--only", "batch", "optimizer", "--out", str(t0)])
    assert t0.is_file()
    with pytest.raises(SystemExit) as own:  # the run's log became a zip, its run unusable
        main(["trace", str(runs / "A"), "--step", "0", "--out", str(runs / "A" / "metrics.jsonl")])
    said = capsys.readouterr().err
    assert own.value.code == 2 and "metrics.jsonl: exists and is no trace (a run's own file?)" in said
    # At the default name (trace-<run folder's name>-<step>.npz): traced again, the same run's is
    # replaced; another run's of the same name is not (two sweeps' run A replaced each other).
    here, other = tmp_path / "cwd", tmp_path / "sweep2" / "A"
    here.mkdir(), other.mkdir(parents=True)
    monkeypatch.chdir(here)
    for _ in range(2):
        main(["trace", str(runs / "A"), "--step", "0", "--only", "batch"])
    with pytest.raises(SystemExit) as same_name:
        main(["trace", str(other), "--step", "0"])
    said = f"trace-A-0.npz holds a trace of another run named A ({runs / 'A'}): give --out"
    assert same_name.value.code == 2 and said in capsys.readouterr().err
    with pytest.raises(SystemExit) as typo:  # a trace of 0 tensors, exit 0
        main(["trace", str(runs / "A"), "--step", "0", "--only", "batch", "batch/idx", "--out", str(t1)])
    said = capsys.readouterr().err
    assert typo.value.code == 2 and "--only batch/idx: matches no tensor of the step" in said
    # A stage misspelt is said before the step runs; --keep's too (it was accepted, nothing kept whole).
    for option, pattern in (("--only", "optimiser"), ("--keep", "forwrd/*")):
        with pytest.raises(SystemExit) as typo:
            main(["trace", str(runs / "A"), "--step", "0", option, pattern, "--out", str(t1)])
        out, err = capsys.readouterr()
        said = f"{option} {pattern}: {pattern.split('/')[0]!r} is no stage of the step"
        assert typo.value.code == 2 and said in err and "traced step" not in out, (out, err)
    assert not t1.exists()
    trace_file.write(trace_step(runs / "A", 1, only=("batch", "optimizer"), keep=("batch/idx",)), t1)
    assert "WARNING --keep batch/idx: matches no tensor of the step" in capsys.readouterr().out
    with pytest.raises(SystemExit) as same:
        main(["diff-trace", str(t0), str(t0)])
    assert same.value.code == 0
    with pytest.raises(SystemExit) as other:
        main(["diff-trace", str(t0), str(t1)])
    out = capsys.readouterr().out
    assert other.value.code == 1
    assert "first difference: stage batch, batch/index" in out  # steps 0 and 1 read other samples
    assert "optimizer          differs" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trace", "{runs}/A", "--step", "99"], "step 99 was never run (it ran steps 0-3)"),
        (["trace", "{runs}", "--step", "0"], "not a run directory"),
        (["trace", "{runs}/bare", "--step", "3"], "no checkpoint before step 3 and no config.json"),
        (["trace", "{runs}/badconfig", "--step", "0"], "badconfig/config.json: not a readable config"),
        (["diff-trace", "{runs}/A/config.json", "{runs}/A/config.json"], "not a birdjepa trace"),
        # A run not there (`make demo` names its run demo-<date>-<time>): the runs beside it named.
        (["bisect", "{runs}/A", "{runs}/nothing"], "nothing: no such folder (runs in "),
        (["diff-trace", "{runs}/A", "{runs}/A"], "A: a folder, not a trace file"),
        (["trace", "{runs}/badline", "--step", "1", "--out", "{runs}/t"], "badline/metrics.jsonl:2: not a"),
        (["bisect", "{runs}/badline", "{runs}/A"], "badline/metrics.jsonl:2: not a JSON line"),
        (["bisect", "{runs}/empty", "{runs}/A"], "empty: it ran no step"),
        # The output is checked first: step 99 (never run) is not reached, nor the search.
        (["trace", "{runs}/A", "--step", "99", "--out", "{runs}/A/config.json/t"], "t: cannot be written"),
        (["bisect", "{runs}/A", "{runs}/A", "--save", "{runs}/A/config.json"], "exists and is not a folder"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    runs: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = runs / "bare"  # logged steps, no checkpoint and no config: nothing to start from
    if not bare.exists():
        bare.mkdir()
        shutil.copy(runs / "A" / "metrics.jsonl", bare / "metrics.jsonl")
    badline = runs / "badline"  # a damaged line in the middle of its log (not a torn last one)
    if not badline.exists():
        shutil.copytree(runs / "A", badline)
        lines = (badline / "metrics.jsonl").read_text().splitlines()
        (badline / "metrics.jsonl").write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    badconfig = runs / "badconfig"  # a config.json cut short: a JSONDecodeError's traceback
    if not badconfig.exists():
        badconfig.mkdir()
        shutil.copy(runs / "A" / "metrics.jsonl", badconfig / "metrics.jsonl")
        (badconfig / "config.json").write_text('{"steps": ')
    empty = runs / "empty"  # a run that logged nothing before it stopped
    if not empty.exists():
        empty.mkdir()
        (empty / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit) as e:
        main([a.format(runs=runs) for a in args])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert not (empty / "checkpoints").exists() and not (bare / "checkpoints").exists()  # read, never written


@pytest.mark.slow  # two segments and three traces, compiling at the default level (CI's last stage)
@pytest.mark.default_level  # a replay's bits, at the level users run
def test_steps_before_an_allowed_option_change_replay_with_the_options_that_trained_them(
    demo_dir: Path, tmp_path: Path
) -> None:
    """Trained to step 1, then on with another --optim.lr (--allow-config-change), checkpoints 1-3 kept.
    Step 1 replays from step 0 with the options before the change, which config.json no longer holds
    (trace said the run was trained by other code); step 2 from checkpoint 1 with the new ones, which
    that checkpoint does not hold. Without checkpoints 1 and 2, step 3 cannot replay under one set of
    options, and the error says why."""
    args = [*flags(tmp_path, "C", data(demo_dir)), "--ckpt-every", "1", "--ckpt-keep", "3"]
    assert pretrain(tyro.cli(PretrainConfig, args=[*args, "--stop-at-step", "1"])) == 0
    changed = [*args, "--optim.lr", "0.002", "--allow-config-change"]
    assert pretrain(tyro.cli(PretrainConfig, args=changed)) == 0
    for step, restored_from in ((1, None), (2, 1)):
        m = trace_step(tmp_path / "C", step).manifest
        assert (m["restored_from"], m["matches_run"]["logged_metrics_equal"]) == (restored_from, True)
    # Side by side with its twin of one segment from step 0, step 2 ran with the first segment's options:
    # "step 2 is not the same in two executions", and a needless --repeat 2.
    twin = [*flags(tmp_path, "T", data(demo_dir)), "--ckpt-every", "0"]
    assert pretrain(tyro.cli(PretrainConfig, args=twin)) == 0
    code, report, _ = bisect(tmp_path / "T", tmp_path / "C")
    assert code == 1 and "side by side from step 0: first differ at step 2" in report, report
    assert "not the same in two executions" not in report and "stage optimizer" in report, report
    for old in (1, 2):
        shutil.rmtree(tmp_path / "C" / "checkpoints" / str(old))
    with pytest.raises(ReplayError, match=r"options changed at step 2 \(--allow-config-change: optim.lr:"):
        trace_step(tmp_path / "C", 3)


def test_a_replayed_step_that_does_not_match_its_log_stops_the_trace(
    runs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step 3 replays step 2 from checkpoint 1; a log that says step 2 had another loss stops it."""
    edited = runs / "edited"
    if not edited.exists():
        shutil.copytree(runs / "A", edited)
        lines = (edited / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        for row in rows:
            if row.get("step") == 2 and "train/loss" in row:
                row["train/loss"] += 1e-7
        (edited / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SystemExit) as e:
        main(["trace", str(edited), "--step", "3"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2
    assert "step 2 does not replay as it ran: train/loss logged" in err and "from checkpoint 1" in err, err
    assert "another kind of machine" not in err
    # Trained on another kind of machine (as its checkpoint records): the error says so, as XLA's last
    # bits differ between kinds.
    meta_file = edited / "checkpoints" / "1" / "meta" / "metadata"
    meta = json.loads(meta_file.read_text())
    here = meta["machine"]["device"]
    rewrite_meta(meta_file, {**meta, "machine": {**meta["machine"], "device": "Other CPU (avx2)"}})
    with pytest.raises(SystemExit) as e:
        main(["trace", str(edited), "--step", "3"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert f"It trained on another kind of machine (device: Other CPU (avx2) -> {here})" in err, err
    # bisect said "trained by other code or on another machine" where the checkpoint records which.
    with pytest.raises(SystemExit) as e:
        main(["bisect", str(runs / "A"), str(edited)])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "step 2 does not re-execute as it ran (train/loss logged" in err, err
    assert f"It trained on another kind of machine (device: Other CPU (avx2) -> {here})" in err, err


@pytest.mark.slow
def test_traces_of_another_architecture_compare_what_they_share(runs: Path, demo_dir: Path) -> None:
    args = [*flags(runs, "deeper", data(demo_dir)), "--model.depth", "3"]
    assert pretrain(tyro.cli(PretrainConfig, args=args)) == 0
    d = diff_traces(trace_step(runs / "A", 0), trace_step(runs / "deeper", 0))
    forward = next(s for s in d.stages if s.stage == "forward")
    assert any(n.startswith("global/encoder/block_2.") for n in forward.only_b)
    assert not d.identical and "model.depth:2->3" in d.config[1]  # the preset's 2 against 3
    assert next(s for s in d.stages if s.stage == "batch").identical


#: The rows that reuse run A's compiled step (only the data differs), and the clean pair. The loader-seed
#: row also reuses it, but its verdict is the batch stage's, as batch_reordered's is: it runs with the
#: slow rows, keeping the suite within its time.
CHEAP = ("batch_reordered", "crop_shifted", "crop_shifted_late", "clean")


@pytest.mark.parametrize(
    "name",
    # One plant in the suite; the crop shifts (the digests-first pass, a late difference) run in CI.
    [pytest.param(n, marks=[pytest.mark.slow] if n.startswith("crop_shifted") else []) for n in CHEAP],
)
def test_bisect_places_a_planted_difference_where_it_first_shows(
    name: str, runs: Path, demo_dir: Path
) -> None:
    """A tiny model's traces keep every tensor whole at once; the shifted crop is bisected as a large
    model's is: digests first, then the step again with the differing tensors kept whole."""
    digests_first = name == "crop_shifted"
    pair = next(p for p in PAIRS if p.name == name)
    row = run_pair(pair, runs, data(demo_dir), whole_first=False if digests_first else None)
    assert row.ok, format_matrix([row]) + "\n" + row.verdict
    if not digests_first:  # the tiny encoder's traces are whole at once: one pass
        assert "digests differ" not in row.report, row.report
    if digests_first:  # the spectrograms, views and activations that differ, measured in a second pass
        assert "digests differ at step 0: re-executing it with " in row.report, row.report
        inexact = [line for line in row.report.splitlines() if "digest differs" in line]
        assert not inexact and "forward            differs: 77 of 80 tensors" in row.report, inexact


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(p.name, marks=[pytest.mark.default_level] if p.name == "devices" else [])
        for p in PAIRS
        # devices_virtual_shards: tests/test_virtual_shards.py proves 1, 2 and 4 devices compute its bits
        # (and a run resumed 4 -> 1 -> 2 at the default level); bisect across device counts is the
        # devices row's, its "identical" verdict the clean row's (36 s saved in CI).
        if p.name not in CHEAP and p.name != "devices_virtual_shards"
    ],
)
def test_the_other_rows_of_the_divergence_matrix(name: str, tmp_path: Path, demo_dir: Path) -> None:
    """The rows that compile a step of their own (another optimizer, model or plant in the step), and
    the topology pair (its twin trains and is traced in processes with 4 devices); one test each, so
    CI's workers share them. The topology row at XLA's default level, where its first difference is
    the first sum over the devices (the loss; at -O0 the forward's kernels differ already)."""
    row = run_pair(next(p for p in PAIRS if p.name == name), tmp_path, data(demo_dir))
    assert row.ok, format_matrix([row]) + "\n" + row.verdict


@pytest.mark.slow
def test_bisect_names_the_last_bits_that_another_adam_beta2_changes_in_the_first_update(
    runs: Path, demo_dir: Path
) -> None:
    """Adam's bias-corrected first update hardly depends on beta2: loss, gradients and everything before
    agree, and the updates of step 0 differ in their last bits. Bisect names them, beside the config
    change, and the checkpoint CRC-32s differ from the first common checkpoint on."""
    args = [*flags(runs, "b2", data(demo_dir)), "--ckpt-every", "2", "--optim.b2", "0.99"]
    assert pretrain(tyro.cli(PretrainConfig, args=args)) == 0
    code, report, d = bisect(runs / "A", runs / "b2")
    assert code == 1 and d is not None and d.first is not None
    assert (d.steps, d.first.stage) == ((0, 0), "updates"), report
    assert d.first.max_rel < 1e-4  # the last bits
    assert "optim.b2:0.999->0.99" in d.config[1]
    assert "checkpoint CRC-32s: first differ at checkpoint 1" in report
    identical = {st.stage for st in d.stages if st.identical}
    assert {"batch", "keys", "params_in", "opt_state_in", "forward", "loss", "gradients"} <= identical


# The calls of one block as `birdjepa.train.calls` records them, in the order they ran.
BLOCK = [
    f"global/encoder/block_0{path}.__call__#{k}/{io}"
    for path, k, io in [
        ("", 0, "in/0"), ("/norm1", 0, "in/0"), ("/norm1", 0, "out"), ("/attn", 0, "in/0"),
        ("/attn/qkv", 0, "in/0"), ("/attn/qkv", 0, "out"), ("/attn", 0, "out"), ("/DropPath_0", 0, "in/0"),
        ("/DropPath_0", 0, "out"), ("/mlp", 0, "in/0"), ("/mlp/fc1", 0, "in/0"), ("/mlp/fc1", 0, "out"),
        ("/mlp/fc2", 0, "in/0"), ("/mlp/fc2", 0, "out"), ("/mlp", 0, "out"), ("/DropPath_0", 1, "in/0"),
        ("/DropPath_0", 1, "out"), ("", 0, "out"),
    ]
]  # fmt: skip
SITES = {
    "encoder/block_0/mlp.__call__": {"function": "Mlp.__call__", "file": "vit.py", "line": 133},
    "encoder/block_0.__call__": {"function": "Block.__call__", "file": "vit.py", "line": 148},
}


@pytest.mark.parametrize(
    ("first", "params", "expected"),
    [
        ("mlp/fc2.__call__#0/in/0", [],
         "the inputs of `encoder/block_0/mlp/fc2` differ while the output of `encoder/block_0/mlp/fc1` is "
         "equal: the difference arises in `Mlp.__call__` (vit.py:133) between those calls"),
        ("DropPath_0.__call__#1/in/0", [],  # the second call of a module called twice
         "the inputs of `encoder/block_0/DropPath_0` differ while the output of `encoder/block_0/mlp` is "
         "equal: the difference arises in `Block.__call__` (vit.py:148) between those calls"),
        ("mlp.__call__#0/in/0", [],  # right after the first DropPath call
         "the inputs of `encoder/block_0/mlp` differ while the output of `encoder/block_0/DropPath_0` is "
         "equal"),
        ("norm1.__call__#0/out", [],
         "`encoder/block_0/norm1` gets equal inputs and gives different outputs, its parameters are equal: "
         "the module itself differs, in `encoder/block_0/norm1.__call__`"),
        ("norm1.__call__#0/out", ["encoder/block_0/norm1"],
         "its parameters differ (encoder/block_0/norm1)"),
        ("mlp.__call__#0/out", [],  # after its last call, inside its own method
         "`encoder/block_0/mlp` gets equal inputs and gives different outputs, its parameters are equal: the "
         "difference arises in `Mlp.__call__` (vit.py:133) after its call of `encoder/block_0/mlp/fc2`"),
        ("norm1.__call__#0/in/0", [],
         "the inputs of `encoder/block_0/norm1` differ while those of `encoder/block_0` are equal: the "
         "difference arises in `Block.__call__` (vit.py:148) before it calls `encoder/block_0/norm1`"),
    ],
)  # fmt: skip
def test_the_region_names_the_code_between_the_last_equal_call_and_the_first_differing_one(
    first: str, params: list[str], expected: str
) -> None:
    from birdjepa.divergence.region import describe

    assert expected in describe(BLOCK, f"global/encoder/block_0/{first}", SITES, params)


def test_bisect_says_where_one_run_s_log_lacks_steps_both_ran(runs: Path, tmp_path: Path) -> None:
    # An emptied log read "logged metrics: equal up to step 3 ... No difference" (compare: they differ).
    from birdjepa.divergence.bisect import bisect
    from birdjepa.rundir.layout import METRICS_FILE

    copy = shutil.copytree(runs / "A", tmp_path / "A")
    (copy / METRICS_FILE).write_text("")
    code, report, _ = bisect(runs / "A", copy)
    assert "logged metrics: step 0 is in A's log only" in report.splitlines(), report
    assert code == 0 and report.endswith(
        "No difference between the runs up to step 3 (their logs differ, as said above)."
    )
    # Options that differ and changed nothing (a plant a bfloat16 run rounded away): said all the same;
    # and where the newest checkpoints agree at the last step, no step was run side by side.
    again = shutil.copytree(runs / "A", tmp_path / "again")
    config = json.loads((again / "config.json").read_text())
    (again / "config.json").write_text(json.dumps({**config, "seed": config["seed"] + 9}))
    code, report, _ = bisect(runs / "A", again)
    seeds = f"{config['seed']}->{config['seed'] + 9}"
    assert code == 0 and report.endswith(f"Config: seed:{seeds}, which changed nothing up to it."), report
    assert "side by side from checkpoint 3: no step left to run" in report, report
    # Stopped after step 1, then a resume refused: its checks, logged alone at step 2, read as step 2 run
    # ("step 2 was never run (it ran steps 0-1)", exit 2) in either order.
    refused = shutil.copytree(runs / "A", tmp_path / "refused")
    shutil.rmtree(refused / "checkpoints" / "3")
    rows = [json.loads(x) for x in (refused / METRICS_FILE).read_text().splitlines()]
    kept = [r for r in rows if r["step"] <= 1] + [{"step": 2, "resume/config": 0.0, "resume/failed": 1.0}]
    (refused / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in kept))
    for pair in ((runs / "A", refused), (refused, runs / "A")):
        code, report, _ = bisect(*pair)
        assert code == 0 and report.endswith("No difference between the runs up to step 1."), report


def test_bisect_says_where_the_runs_evaluate_otherwise(runs: Path, tmp_path: Path) -> None:
    # A run with eval metrics against one without read "logged metrics: equal ... No difference"
    # (compare: they differ): bisect replays training, and compared only the training's metrics.
    from birdjepa.divergence.bisect import bisect
    from birdjepa.rundir.layout import METRICS_FILE

    copy = shutil.copytree(runs / "A", tmp_path / "A")
    with (copy / METRICS_FILE).open("a") as f:
        f.write(json.dumps({"step": 2, "eval/knn_acc": 0.5}) + "\n")
    code, report, _ = bisect(runs / "A", copy)
    said = ("logged metrics: the training's equal up to step 3; eval/knn_acc, which the evaluation writes, "
            "first differs at step 2 (None vs 0.5): the runs evaluate otherwise")  # fmt: skip
    assert said in report.splitlines(), report
    assert code == 0 and report.endswith("(their logs differ, as said above).")
    # A monitor's diagnostic (a run resumed across its redefinition) was said to be the evaluation's.
    monitor = shutil.copytree(runs / "A", tmp_path / "M")
    with (monitor / METRICS_FILE).open("a") as f:
        f.write(json.dumps({"step": 2, "monitor/update_ratio/min": 0.5}) + "\n")
    said = (
        "logged metrics: the training's equal up to step 3; monitor/update_ratio/min, a diagnostic the "
        "training logs beside its metrics, first differs at step 2 (None vs 0.5): it is computed"
    )
    assert any(line.startswith(said) for line in bisect(runs / "A", monitor)[1].splitlines())
    # Options that change no training bit and set a diagnostic (--iid-window): not named, "another version".
    config = json.loads((monitor / "config.json").read_text())
    (monitor / "config.json").write_text(json.dumps({**config, "iid_window": 2}))
    window = f"iid_window:{config['iid_window']}->2"
    said += f" otherwise (by the options that differ and change no training bit ({window}), or"
    assert any(line.startswith(said) for line in bisect(runs / "A", monitor)[1].splitlines()), said


def test_a_non_finite_value_the_log_spells_as_a_string_is_the_replay_s_number() -> None:
    # The log writes NaN as "nan": every skipped step (--on-nonfinite skip) "does not re-execute as it
    # ran", and bisect and trace blamed other code or another machine.
    from birdjepa.divergence.replay import first_mismatch

    nan, inf = float("nan"), float("inf")
    assert (
        first_mismatch(
            {"train/loss": "nan", "train/grad_norm": "inf"}, {"train/loss": nan, "train/grad_norm": inf}
        )
        is None
    )
    name, logged, now = first_mismatch({"train/loss": "nan"}, {"train/loss": 1.0})
    assert name == "train/loss" and math.isnan(logged) and now == 1.0
    (name, logged, now) = first_mismatch({"train/loss": "-inf"}, {"train/loss": inf})
    assert (name, logged, now) == ("train/loss", -inf, inf)


def test_a_step_of_resume_checks_alone_was_never_run_and_an_unlogged_replay_is_said() -> None:
    # A refused resume logs its checks at a step it never trains: trace re-executed that step and said
    # it matched the run. Steps replayed without logged metrics (--log-every N) were "equal".
    from birdjepa.divergence.cli import summary
    from birdjepa.divergence.replay import last_step
    from birdjepa.divergence.trace import Trace

    logged = {0: {"train/loss": 1.0}, 1: {"train/loss": 0.9}, 4: {"resume/failed": 1.0}}
    assert last_step(logged, [1, 3]) == 3
    m = {"step": 5, "restored_from": 1, "replayed": [2, 4], "replayed_unlogged": 2, "noise": [], "repeat": 1,
         "inexact": None,
         "matches_run": {}}  # fmt: skip
    line = summary(Trace(m, []), Path("t.npz"))
    assert "steps 2-4 replayed with their logged metrics equal (2 of them logged none to compare)" in line


def test_a_plant_that_scales_a_call_changes_a_bfloat16_input_too() -> None:
    # 1 + 2^-10 is 1.0 in bfloat16: a bf16 run's plant changed nothing, and bisect said "No difference".
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from birdjepa import seams

    class Mlp(nn.Module):
        @nn.compact
        def __call__(self, x: object) -> object:
            return nn.Dense(4, name="fc2", dtype=x.dtype, param_dtype=x.dtype)(x)

    for dtype in (jnp.float32, jnp.bfloat16):
        x = jnp.linspace(0.5, 1.5, 8, dtype=dtype).reshape(2, 4)
        params = Mlp().init(jax.random.key(0), x)
        plain = Mlp().apply(params, x)
        with seams.planted("mlp_between_fc1_and_fc2").around_model_call():
            planted = Mlp().apply(params, x)
        assert not jnp.array_equal(plain, planted), dtype


def test_a_stage_s_worst_tensor_is_the_largest_difference_and_a_digest_s_is_a_lower_bound() -> None:
    # Digests ranked first: "the worst ...proj/kernel, max abs 4.08e-08", a lower bound, where a tensor
    # kept whole differed by 0.000169.
    from birdjepa.divergence.diff import StageDiff, TensorDiff, tensor_diff
    from birdjepa.divergence.trace_file import Entry

    def tensor(name: str, max_abs: float, exact: bool) -> TensorDiff:
        index = (0,) if exact else None
        return TensorDiff("updates", name, ((2,), (2,)), max_abs, 1.0, index, (1.0, 2.0), 0.0, exact=exact)

    digest, whole = tensor("proj", 4.08e-8, exact=False), tensor("patch_embed", 1.69e-4, exact=True)
    line = StageDiff("updates", 2, [digest, whole], [], []).line()
    assert line.endswith("the worst patch_embed, max abs 0.000169"), line
    line = StageDiff("updates", 1, [digest], [], []).line()
    assert line.endswith("the worst proj, max abs at least 4.08e-08"), line
    # Signed zeros alone were "differs at the noise floor" with no floor measured; tensors in one trace
    # only sat beside "identical".
    plus, minus = np.zeros(2, np.float32), -np.zeros(2, np.float32)
    zeros = tensor_diff(Entry("updates", "b", (2,), "float32", "x", (0.0, 0.0, 0.0), plus),
                        Entry("updates", "b", (2,), "float32", "y", (0.0, 0.0, 0.0), minus), 0.0)  # fmt: skip
    assert zeros is not None and zeros.bits_only and not zeros.real
    line = StageDiff("updates", 1, [zeros], [], []).line()
    assert "differs in bits only (a zero's sign, a NaN's payload): 1 of 1" in line, line
    assert "noise floor" not in StageDiff("updates", 2, [zeros, whole], [], []).line()  # one is real
    # An infinity both hold is no difference: "inf vs inf, max abs inf" hid the 0.5 beside it.
    inf_a, inf_b = np.array([np.inf, 1, 2], np.float32), np.array([np.inf, 1, 2.5], np.float32)
    both = tensor_diff(Entry("loss", "t", (3,), "float32", "x", (0.0,) * 5, inf_a),
                       Entry("loss", "t", (3,), "float32", "y", (0.0,) * 5, inf_b), 0.0)  # fmt: skip
    assert both is not None and (both.max_abs, both.index) == (0.5, (2,)), both
    from birdjepa.divergence.bisect import verdict
    from birdjepa.divergence.diff import TraceDiff
    from birdjepa.divergence.trace_file import Trace

    said = verdict(4, TraceDiff(([], []), (4, 4), [StageDiff("updates", 1, [zeros], [], [])]), None, 1,
                   Trace({}), Trace({}))  # fmt: skip
    assert "Every value is equal as a number: only bits differ" in said and "noise floor" not in said, said
    line = StageDiff("updates", 3, [], ["mask"], []).line()
    assert line.endswith("the 3 compared tensors identical, 1 in A only") and " identical (" not in line, line


def test_a_call_site_is_named_from_a_working_folder_removed_under_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Path.cwd()'s FileNotFoundError at the run's first step (a job's folder removed while it ran).
    from flax import linen as nn

    from birdjepa.train.calls import _site

    class Block(nn.Module):
        def __call__(self, x: object) -> object:
            return x

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    site = _site(Block(), "__call__")
    assert site["function"].endswith("Block.__call__") and site["file"] == __file__, site


def test_a_trace_cut_short_as_it_is_written_leaves_no_half_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A SIGTERM mid-write left `tr.npz.tmp` beside the trace.
    import numpy as np

    from birdjepa.divergence.trace_file import Entry, Trace

    def cut(*_args: object, **_kwargs: object) -> None:
        raise KeyboardInterrupt

    entry = Entry("batch", "x", (2,), "float32", "0" * 16, (0.0,) * 6, np.zeros(2, np.float32))
    monkeypatch.setattr(np.lib.format, "write_array", cut)
    with pytest.raises(KeyboardInterrupt):
        trace_file.write(Trace({"step": 1}, [entry]), tmp_path / "tr.npz")
    assert list(tmp_path.iterdir()) == []
