"""Upgrades between two segments of a run: a resume takes the run's options from its checkpoint's config
unless the command line sets them, so a default that changed never changes a running run; options set on
the command line still meet the breaking-change check; and a checkpoint of format 1, written by the old
code (tests/fixtures/format1, on the default demo set as that code's `birdjepa pretrain` trained it), is
read, verified by its norms, resumed, and continues as the old code's own straight run did (recorded on
another CPU: the batches and the schedule with ==, the model's numbers to 1e-5 relative)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from conftest import TEST_XLA_FLAG, rewrite_meta

from birdjepa import exit_codes
from birdjepa._rs import DECODE_REVISIONS
from birdjepa.cli import main
from birdjepa.config import PretrainConfig
from birdjepa.resume.options import SEGMENT_ONLY, resume_defaults
from birdjepa.rundir.checkpoint import FORMAT_VERSION
from birdjepa.rundir.metrics_log import metrics_by_step, read_metrics
from birdjepa.train import revisions
from birdjepa.verify.fs_fault_matrix import continues_old_run

FORMAT1 = Path(__file__).parent / "fixtures" / "format1"
FORWARD_LOSS = Path(__file__).parent / "fixtures" / "forward-loss"


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

    # config.json edited by hand: not read by the resume, and rewritten, without a word.
    edited = json.loads((tmp_path / "r" / "config.json").read_text())
    edited["optim"]["lr"] = 0.5
    (tmp_path / "r" / "config.json").write_text(json.dumps(edited))
    code, out = command(capsys, "pretrain", "--run", "r", "--log.runs-dir", tmp_path)  # a bare requeue
    assert code == 0, out
    assert "options from checkpoint 1's config unless set on the command line" in out
    said = f"WARNING {tmp_path / 'r' / 'config.json'} differs from checkpoint 1's config (optim.lr: 0.001 -> "
    assert said + "0.5)" in out
    assert "data.shuffle_buffer=1024 (default now 4096)" in out
    assert "RESUME_CHECK name=config ok=True" in out and "ok=False" not in out
    segment = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (segment["data"]["interleave"], segment["data"]["shuffle_buffer"]) == (4, 1024)
    assert (segment["steps"], segment["stop_at_step"]) == (4, None)  # the run's length; not the stop
    assert segment["optim"]["lr"] == 0.001

    again = ["--run", "r", "--log.runs-dir", tmp_path, "--steps", "6", "--data.shuffle-buffer", "4096"]
    code, out = command(capsys, "pretrain", *again)
    assert code == exit_codes.RESUME_CHECK
    assert "got=data.shuffle_buffer:1024->4096,steps:4->6" in out
    assert json.loads((tmp_path / "r" / "config.json").read_text()) == segment  # the refused one left it


def stopped_run(
    capsys: pytest.CaptureFixture, demo_dir: Path, run_dir: Path, *, steps: int, stop: int
) -> tuple[Path, dict]:
    """A short run at ``run_dir`` stopped after step ``stop`` of ``steps``: its last checkpoint's metadata
    file and contents, for a test to rewrite as an older code or another machine would have written it.
    (``steps`` 4, as the file's first test: a run of another length builds its step again, ~2 s.)"""
    data = ["--data.batch-size", "4", "--data.train", demo_dir / "train", "--data.eval", demo_dir / "eval"]
    run = ["--run", run_dir.name, "--log.runs-dir", run_dir.parent, "--steps", str(steps), *data]
    assert command(capsys, "pretrain", *run, "--eval-every", "0", "--stop-at-step", str(stop))[0] == 0
    meta_file = run_dir / "checkpoints" / str(stop) / "meta" / "metadata"
    return meta_file, json.loads(meta_file.read_text())


def test_a_segment_on_another_kind_of_machine_or_step_revision_is_said_and_its_checks_allow_for_it(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    meta_file, meta = stopped_run(capsys, demo_dir, tmp_path / "m", steps=4, stop=1)
    here = meta["machine"]
    recorded = {"jax", "jaxlib", "device", "lock", "cpu_threads", "lapack", "xla_flags", "jax_config"}
    assert set(here) == recorded
    assert here["xla_flags"] == " ".join(sorted(os.environ["XLA_FLAGS"].split()))  # the suite's, and ours
    assert here["jax"] == jax.__version__
    assert here["cpu_threads"] == os.environ["PJRT_NPROC"]  # the pool deterministic_xla fixed
    lock = hashlib.sha256((Path(__file__).parents[1] / "uv.lock").read_bytes()).hexdigest()[:12]
    assert here["lock"] == lock  # the dependency lock this checkout installs from
    assert meta["step_revision"] == revisions.REVISION and meta["decode_revision"] == len(DECODE_REVISIONS)
    # As if checkpoint 1 had been written by a job on another partition, under an older jaxlib and lock,
    # by a birdjepa that did not record the CPU thread pool, the step's revision or the decoder's yet.
    # (And another optimisation level: it moved every later step's last bits, every check passing.)
    other = {**here, "device": "Other CPU (avx2)", "jaxlib": "0.1", "lock": "0123456789ab", "xla_flags": "-O"}
    del other["cpu_threads"], meta["step_revision"], meta["decode_revision"]
    rewrite_meta(meta_file, {**meta, "machine": other})

    code, out = command(capsys, "pretrain", "--run", "m", "--log.runs-dir", tmp_path)
    assert code == 0 and "ok=False" not in out, out
    warning = [line for line in out.splitlines() if line.startswith("WARNING resumed on another kind")]
    assert warning == [
        f"WARNING resumed on another kind of machine than checkpoint 1 was written on (device: Other CPU "
        f"(avx2) -> {here['device']}; jaxlib: 0.1 -> {here['jaxlib']}; lock: 0123456789ab -> {lock}; "
        f"xla_flags: -O -> {here['xla_flags']}; "
        f"cpu_threads: unrecorded -> {here['cpu_threads']}): XLA compiles for the device and its version, "
        f"so from here the run can differ from an uninterrupted one in the last bits"
    ]
    assert "RESUME_CHECK name=next_loss ok=True expected=" in out
    # Revision 3 moves the training's bits (the probe clipped apart): the tolerance names it too.
    assert "(rtol=1e-05,machine:device+jaxlib+lock+xla_flags+cpu_threads+step_revision)" in out, out
    (event,) = [r for r in read_metrics(tmp_path / "m") if r.get("event") == "machine_changed"]
    assert event["step"] == 2 and event["device"] == ["Other CPU (avx2)", here["device"]]
    # Each revision crossed is said, in order.
    (revised,) = [line for line in out.splitlines() if line.startswith("WARNING resumed by code of")]
    assert revised.startswith(
        f"WARNING resumed by code of another revision of the step than checkpoint 1 was written by "
        f"(1 -> {revisions.REVISION}: the update monitor reduces each parameter once for its five "
    ), revised
    assert "; the online probe's gradients are clipped apart from the objective's" in revised, revised
    (event,) = [r for r in read_metrics(tmp_path / "m") if r.get("event") == "step_revised"]
    assert event["step"] == 2 and event["revision"] == [1, revisions.REVISION]
    # What `compare` leaves out of the run: revision 4's, not MAE's monitor summaries (revision 6).
    assert event["redefined"] == ["train/grad_norm"]
    # The decoder's revisions crossed, each said: a file of a changed kind may come at any later step, and
    # the resume checks see the next batch's alone.
    (decoded,) = [line for line in out.splitlines() if line.startswith("WARNING resumed by a decoder")]
    assert decoded == (
        f"WARNING resumed by a decoder of another revision than checkpoint 1 was written by (unrecorded -> "
        f"{len(DECODE_REVISIONS)}: {'; '.join(what for what, _ in DECODE_REVISIONS[1:])}): where the run's "
        "data holds such recordings, they decode to other samples from here, and the run can differ from an "
        "uninterrupted one"
    ), decoded
    assert "MP3s joined end to end" in decoded and "a FLAC with a tag after its last frame" in decoded
    (event,) = [r for r in read_metrics(tmp_path / "m") if r.get("event") == "decode_revised"]
    assert event["step"] == 2 and event["revision"] == [None, len(DECODE_REVISIONS)]


def test_the_decoder_s_revisions_crossed_are_those_of_the_run_s_decoding() -> None:
    # Every change so far is of gapless decodes: a run recorded without the option reads as it did.
    now = len(DECODE_REVISIONS)
    assert (
        revisions.decode_changes(None, gapless=False) == []
        and revisions.decode_changes(now, gapless=True) == []
    )
    assert (
        revisions.decode_changes(None, gapless=True)
        == revisions.decode_changes(1, gapless=True)
        == [what for what, _ in DECODE_REVISIONS[1:]]
    )
    assert revisions.decode_changes(now - 1, gapless=True) == [DECODE_REVISIONS[-1][0]]
    # A checkpoint of a newer decoder: unknown here, it may move any run.
    assert revisions.decode_changes(now + 1, gapless=False) == ["a revision newer than this decoder"]


def test_a_run_a_revision_does_not_apply_to_resumes_across_it_exactly(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # As if checkpoint 0 had been written before the last revision that moves some runs' bits (remat
    # runs with a predictor or decoder only): this run's resume is said to cross it (and those after),
    # and its loss is checked exactly.
    meta_file, meta = stopped_run(capsys, demo_dir, tmp_path / "v", steps=4, stop=0)
    before = max(i for i, r in enumerate(revisions.REVISIONS) if r.training and r.applies is not None)
    crossed = revisions.between(before)
    rewrite_meta(meta_file, {**meta, "step_revision": before})

    code, out = command(capsys, "pretrain", "--run", "v", "--log.runs-dir", tmp_path)
    assert code == 0 and "ok=False" not in out, out
    assert f"({before} -> {revisions.REVISION}: {'; '.join(r.what for r in crossed)})" in out, out
    (loss,) = [line for line in out.splitlines() if line.startswith("RESUME_CHECK name=next_loss")]
    assert re.fullmatch(r"RESUME_CHECK name=next_loss ok=True expected=(\S+) got=\1", loss), loss


def test_what_steers_one_segment_is_never_taken_from_the_checkpoint() -> None:
    saved = {"stop_at_step": 3, "run": "x", "data": {"n_workers": 7}, "seed": 5, "gone_option": 1}
    defaults, kept = resume_defaults(saved, "checkpoint 3")
    fresh = PretrainConfig()
    assert (defaults.stop_at_step, defaults.run, defaults.seed) == (None, "demo", 5)
    assert defaults.data.n_workers == fresh.data.n_workers != 7
    # A config recorded before --data.features.gapless decoded without it, and keeps doing so.
    assert not defaults.data.features.gapless and fresh.data.features.gapless
    assert kept == ["data.features.gapless=False (default now True)", "seed=5 (default now 0)"]
    assert {"run", "stop_at_step", "resume", "data.n_workers", "log.runs_dir"} <= set(SEGMENT_ONLY)


def test_an_option_given_again_at_a_resume_is_not_said_to_be_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # "where this birdjepa's defaults differ: optim.grad_accum=2 (default now 1)" was said of a resume
    # given --optim.grad-accum 3, and "data.batch_size=4 (default now 16)" of a requeue given its whole
    # command line again.
    import tyro

    from birdjepa.config import to_dict
    from birdjepa.resume import options

    saved = {
        **to_dict(PretrainConfig()),
        "seed": 5,
        "optim": {**to_dict(PretrainConfig())["optim"], "grad_accum": 2},
        "data": {**to_dict(PretrainConfig())["data"], "batch_size": 4},
    }
    monkeypatch.setattr(options, "saved_config", lambda run_dir: (3, saved))
    args = ["--log.runs-dir", str(tmp_path), "--optim.grad-accum", "3", "--data.batch-size", "4"]
    fresh = tyro.cli(PretrainConfig, args=args)  # as `birdjepa pretrain` parses them for a new run
    _, _, cfg, kept = options.resumed_config(args, fresh)
    assert cfg.optim.grad_accum == 3 and cfg.seed == 5 and cfg.data.batch_size == 4
    assert kept == ["seed=5 (default now 0)"]


def test_a_config_recorded_before_the_debug_options_became_a_group_reads_under_their_new_names() -> None:
    # Checkpoints and config.json written before the debug_* options moved into --debug.*: a planted run
    # resumes planted, a fault injected at the last segment is not carried, and the resume's config check
    # sees no change where the values are the same.
    from birdjepa.config import to_dict
    from birdjepa.resume.checks import config_diff

    old = to_dict(PretrainConfig())
    old.update({f"debug_{k}": v for k, v in old.pop("debug").items()})  # as an old checkpoint holds it
    old.update(debug_plant="loader_seed", debug_inject_fault="reset_prng")
    defaults, _ = resume_defaults(old, "checkpoint 3")
    assert (defaults.debug.plant, defaults.debug.inject_fault) == ("loader_seed", None)
    now = to_dict(defaults)
    assert config_diff({**old, "debug_inject_fault": None}, now) == ([], [])


def test_a_config_recorded_before_gapless_decoding_existed_reads_without_it_everywhere() -> None:
    # Its MP3s were read with the codec's delay (1105 samples late): a resume, evaluate, bisect's replay
    # and the checks between two configs read it so, and a change to it is one (the batches move).
    from birdjepa.config import recorded, to_dict
    from birdjepa.divergence.replay import read_config
    from birdjepa.evaluation.cli import run_config
    from birdjepa.resume.checks import config_diff

    old = to_dict(PretrainConfig())
    del old["data"]["features"]["gapless"]
    assert recorded(old)["data.features.gapless"] is False
    assert recorded(old["data"]["features"], "data.features.")["gapless"] is False  # an encoder's card
    assert not run_config({"config": old}, "c").data.features.gapless
    assert not read_config(old, "c").data.features.gapless
    off = dataclasses.replace(PretrainConfig().data.features, gapless=False)
    then = to_dict(
        dataclasses.replace(PretrainConfig(), data=dataclasses.replace(PretrainConfig().data, features=off))
    )
    assert config_diff(old, then) == ([], [])
    assert config_diff(old, to_dict(PretrainConfig())) == ([], ["data.features.gapless:False->True"])
    # A config that could not be read records nothing (bisect named a gapless change of an unread one).
    unread = config_diff({}, to_dict(PretrainConfig()))[1]
    assert recorded({}) == {} and not [c for c in unread if c.startswith("data.features.gapless")]
    # The checkpoints of a run recorded before it and those saved since (False) hold one set of options:
    # each resume verified the newest one's arrays again (seconds a GB), until the old ones rotated out.
    from birdjepa.resume.options import _options

    assert _options(old) == _options(then)


@pytest.mark.slow  # the old code's two runs in subprocesses: a minute; CI runs it
def test_a_format_1_checkpoint_of_the_old_code_resumes_and_continues_the_old_code_s_straight_run(
    tmp_path: Path,
) -> None:
    shutil.copytree(FORMAT1 / "run", tmp_path / "old")
    # A bare requeue, compiled as the old code compiled it: without the suite's -O0, which moves last bits.
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", "old", "--log.runs-dir", str(tmp_path)]
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "").replace(TEST_XLA_FLAG, "")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    line = "CKPT_FORMAT checkpoint 2 is of format 1, without CRC-32s: verified by its 9 norms only"
    assert line in out and "ok=False" not in out
    # Where it was written is not known, and the training revisions it crossed are named too.
    assert "(rtol=1e-05,machine:unrecorded+step_revision)" in out, out
    meta = json.loads((tmp_path / "old" / "checkpoints" / "5" / "meta" / "metadata").read_text())
    assert meta["checkpoint_format"] == FORMAT_VERSION == 3 and len(meta["hashes"]) == len(
        meta["state_leaves"]
    )

    # It continues the old code's own straight run: the same batches (index CRC-32s) and schedule with ==
    # to the end, the model's numbers within ACROSS_CPUS_RTOL (the fixture was recorded on another CPU)
    # up to the first resumed step's forward pass and gradients; its updates are this code's, as the
    # step's revision 3 (the online probe clipped apart), said at the resume, moves every update.
    assert f"than checkpoint 2 was written by (1 -> {revisions.REVISION}: " in out
    ours, theirs = metrics_by_step(tmp_path / "old"), metrics_by_step(FORMAT1 / "straight")
    assert sorted(ours) == sorted(theirs) == list(range(6))
    crc = "dataloader/index_crc32"
    assert [ours[s][crc] for s in range(6)] == [theirs[s][crc] for s in range(6)]
    departed = continues_old_run(tmp_path / "old", FORMAT1 / "straight")
    assert not departed, departed


def test_a_checkpoint_whose_next_loss_the_old_code_took_by_a_forward_alone_resumes_exactly(
    tmp_path: Path,
) -> None:
    # Until the next step's gradients were recorded, a checkpoint held its loss from a forward pass alone;
    # in bfloat16 the step's own forward and backward program computes another (MAE: 2.4e-5 relative),
    # and the new code's exact check refused the old code's checkpoints after an upgrade, exit 65. The
    # fixture made on this kind of machine where there is one (make.sh): elsewhere a resume checks its
    # loss to a tolerance, which that regression would pass.
    from birdjepa.train.determinism import cpu_model

    def made_on(fixture: Path) -> str:  # its CPU (the thread pool's size is the trainer's to compare)
        meta = fixture / "run" / "checkpoints" / "2" / "meta" / "metadata"
        return json.loads(meta.read_text())["machine"]["device"]

    fixtures = sorted(p for p in FORWARD_LOSS.iterdir() if p.is_dir())
    fixture = next((f for f in fixtures if made_on(f) == cpu_model()), fixtures[0])
    run = shutil.copytree(fixture / "run", tmp_path / "run")
    meta = json.loads((run / "checkpoints" / "2" / "meta" / "metadata").read_text())
    assert "gradients" not in meta["next_step"] and meta["config"]["model"]["dtype"] == "bfloat16"
    # A bare requeue, compiled as the old code compiled it: without the suite's -O0, which moves last bits.
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", "run", "--log.runs-dir", str(tmp_path)]
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "").replace(TEST_XLA_FLAG, "")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    out = done.stdout
    assert done.returncode == 0 and "ok=False" not in out, out[-3000:] + done.stderr[-3000:]
    assert "RESUME_CHECK name=next_gradient ok=True expected=unrecorded" in out, out
    (loss,) = [line for line in out.splitlines() if line.startswith("RESUME_CHECK name=next_loss")]
    if "WARNING resumed on another kind of machine" not in out:  # where it was written: to the bit
        assert made_on(fixture) == cpu_model()
        assert re.fullmatch(r"RESUME_CHECK name=next_loss ok=True expected=(\S+) got=\1", loss), loss


def test_a_trace_of_steps_an_older_revision_trained_names_the_revisions_between(tmp_path: Path) -> None:
    # It said only "step 0 does not replay as it ran" (train/grad_norm, which revision 4 redefined), as
    # if the run were non-deterministic or damaged, where the checkpoint records the revision it ran.
    from birdjepa.divergence.replay import ReplayError, written_at
    from birdjepa.divergence.trace import trace_step

    shutil.copytree(FORMAT1 / "run", tmp_path / "old")
    # Decoded gapless, by a decoder before the record: the decoder's changes since are said too (the
    # batch's samples, not only the step, may differ; a run decoding without gapless crossed none).
    meta_file, config_file = (
        tmp_path / "old" / "checkpoints" / "2" / "meta" / "metadata",
        tmp_path / "old" / "config.json",
    )
    meta, config = json.loads(meta_file.read_text()), json.loads(config_file.read_text())
    meta["config"]["data"]["features"]["gapless"] = config["data"]["features"]["gapless"] = True
    rewrite_meta(meta_file, meta)
    config_file.write_text(json.dumps(config))
    changes = revisions.decode_changes(None, gapless=True)
    assert changes and revisions.decode_changes(None, gapless=False) == []
    said = (r"step 0 does not replay as it ran: .* It was trained by revision 1 of the step and this "
            rf"birdjepa computes revision {revisions.REVISION} \(the update monitor .*\): trace it with the "
            "birdjepa that trained it. Its batch was decoded by revision unrecorded of the decoder and this "
            rf"birdjepa decodes revision {revisions.DECODE_REVISION} \({re.escape('; '.join(changes))}\): "
            ".* trace it with the birdjepa that trained it$")  # fmt: skip
    with pytest.raises(ReplayError, match=said):
        trace_step(tmp_path / "old", 2)
    # What trained a step: the first checkpoint its segment wrote says.
    lines = [{"step": 0}, {"event": "resume", "step": 3}]
    metas = {2: {"a": 2}, 5: {"a": 5}}
    assert [written_at(lines, metas, s) for s in (0, 2, 3, 5, 6)] == [metas[2]] * 2 + [metas[5]] * 3
    assert written_at(lines, {2: {}}, 4) is None
