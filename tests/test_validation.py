"""Options are checked before anything runs: every invalid one gives exit 2 and one line naming the
option, its value and what is allowed, never a traceback; sweep files get the same check."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pytest
from conftest import a_demo_shard_beside_its_vocabulary

from birdjepa import validation
from birdjepa.cli import main
from birdjepa.config import DataConfig, LogConfig, PretrainConfig
from birdjepa.data import Features, Loader
from birdjepa.data.shards import read_shard, shard_schema
from birdjepa.validation import OptionError

# (flags, what the line must say); the data flags of `demo_dir` are added to each.
INVALID = [
    (["--steps", "-5"], "--steps -5: must be >= 1"),
    # 0 in float32 (or moving no float32 weight): the run trained nothing, exit 0.
    (["--optim.lr", "1e-50"], "--optim.lr 1e-50: must be at least 1e-12: below it no float32 weight moves"),
    (["--optim.probe-lr-scale", "1e-50"], "--optim.probe-lr-scale 1e-50: times --optim.lr (0.001) must"),
    (["--model.ln-epsilon", "1e-50"], "--model.ln-epsilon 1e-50: must be at least float32's smallest"),
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--data.batch-size", "0"], "--data.batch-size 0: must be >= 1"),
    (["--data.n-workers", "-1"], "--data.n-workers -1: must be >= 0"),
    (["--data.batch-size", "-1"], "--data.batch-size -1: must be >= 1"),  # not its type's ">= 0"
    # A product of options: each named with its value (the batch size alone was blamed).
    (["--data.n-views", "1000000"],
     "--data.batch-size 16: x --data.n-views 1000000 x --data.features.n-frames 512 x --data.features.n-mels "
     "128 = 1,048,576,000,000 values a batch, which must be at most 2^31"),
    (["--data.shuffle-buffer", "8", "--data.shuffle-initial", "9"], "--data.shuffle-initial 9:"),
    (["--data.features.hop-length", "0"], "--data.features.hop-length 0: must be > 0"),
    (["--data.n-views", "1"], "--data.n-views 1: the lejepa objective compares views: need >= 2"),
    (["--optim.lr", "-1"], "--optim.lr -1.0: must be > 0"),
    (["--optim.lr", "0"], "--optim.lr 0.0: must be > 0"),
    (["--optim.grad-accum", "0"], "--optim.grad-accum 0: must be >= 1"),
    # --steps counts micro-steps: a run that ended before its first update trained nothing, exit 0.
    (["--steps", "4", "--optim.grad-accum", "8"], "--optim.grad-accum 8: must be at most --steps (4)"),
    # ... and one whose last micro-steps accumulated an update it never applied.
    (["--steps", "7", "--optim.grad-accum", "2"], "--steps 7: must be a multiple of --optim.grad-accum (2)"),
    (["--optim.b2", "1"], "--optim.b2 1.0: must be in [0, 1)"),
    (["--ckpt-keep", "0"], "--ckpt-keep 0: must be >= 1"),
    (["--ckpt-every", "-1"], "--ckpt-every -1: must be >= 0 (0 = off)"),
    (["--eval-every", "-2"], "--eval-every -2: must be >= 0 (0 = off)"),
    (["--stop-at-step", "-1"], "--stop-at-step -1: must be >= 0"),
    (["--stop-at-step", "600"], "--stop-at-step 600: must be a step in [0, 599]"),  # the run ends first
    (["--max-skips", "-1"], "--max-skips -1: must be >= 0 (0 = off)"),
    (["--debug.roundtrip-steps", "700"], "--debug.roundtrip-steps 700: each must be a step in [0, 599]"),
    (["--augment.mix-prob", "1.5"], "--augment.mix-prob 1.5: must be in [0, 1]"),
    (["--augment.pitch-bins", "-1"], "--augment.pitch-bins -1.0: must be >= 0 (0 = off)"),
    (["--model.preset", "huge"], "--model.preset 'huge': must be one of base, small, tiny"),
    # The verification wing's names, registered by the command (birdjepa.seams), listed when wrong.
    (
        ["--debug.plant", "lr_off"],
        "--debug.plant 'lr_off': must be one of lr_schedule_shifted, first_update_at_peak,",
    ),
    (
        ["--debug.inject-fault", "lr"],
        "--debug.inject-fault 'lr': must be one of drop_loader_state, reset_prng,",
    ),
    (
        ["--debug.plant", "block_residual_scale", "--model.remat"],
        "--debug.plant 'block_residual_scale': plants change calls inside the blocks, which --model.remat",
    ),
    # Plants that change nothing in the run (bisect: "No difference"), or a KeyError's traceback.
    (["--debug.plant", "decoder_input_scaled"], "would change nothing in this run: a call of the decoder's"),
    (["--debug.plant", "pos_embed_bf16", "--model.rope"], "would change nothing in this run: the model"),
    (["--debug.plant", "pos_embed_bf16", "--model.dtype", "bfloat16"], "a bfloat16 model computes with its"),
    (["--model.heads", "3"], "--model.heads 3: must divide --model.dim (64)"),
    (["--model.patch", "7"], "--model.patch 7: must divide --model.n-frames (512)"),
    (["--model.dropout", "1"], "--model.dropout 1.0: must be in [0, 1)"),
    (["--model.n-frames", "1024"], "--model.n-frames 1024: the model is built for 1024 x 128"),
    (["--objective.lejepa.span-weight", "0.5"], "needs a predictor: set --model.predictor-depth >= 1"),
    (  # every span hidden: the predictor had nothing to predict from, and the run trained on (exit 0)
        ["--objective.lejepa.span-weight", "1", "--model.predictor-depth", "1",
         "--objective.lejepa.span-ratio", "0.99"],
        "--objective.lejepa.span-ratio 0.99: must hide some but not all of the 8 spans of 4 time tokens",
    ),  # fmt: skip
    (  # none hidden was one hidden, without a word: 0.01, 0.05 and 0.1 trained one recipe
        ["--objective.lejepa.span-weight", "1", "--model.predictor-depth", "1",
         "--objective.lejepa.span-ratio", "0.05"],
        "--objective.lejepa.span-ratio 0.05: must hide some but not all of the 8 spans of 4 time tokens "
        "(round(ratio * 8) of them: 1 at 0.125)",
    ),  # fmt: skip
    # Mixed with itself: a fixed gain (in a virtual shard of one, the same), without a word.
    (["--data.batch-size", "1", "--augment.mix-prob", "0.5"],
     "--augment.mix-prob 0.5: mixes in another recording of the batch, and a batch of 1 has none"),
    (["--data.batch-size", "4", "--train.virtual-shards", "4", "--augment.mix-prob", "1"],
     "a batch of 1 per virtual shard (--train.virtual-shards 4) has none"),
    # Options the run would ignore, exit 0, config.json recording them as given.
    (["--objective.kind", "mae", "--data.n-views", "1", "--objective.lejepa.lam", "0.9"],
     "--objective.lejepa.lam 0.9: is an option of --objective.kind lejepa; this run trains mae"),
    (["--objective.kind", "supervised", "--model.proj-dim", "7"],
     "--model.proj-dim 7: the supervised objective sets it itself: leave it out"),
    (["--objective.kind", "supervised", "--model.proj-dim", "10"],  # the default class count: passed
     "--model.proj-dim 10: the supervised objective sets it itself: leave it out"),
    (["--model.n-classes", "99"], "--model.n-classes 99: is the data's class count (its vocab.json)"),
    # Tracebacks at the first step: a decoder's heads of 6 wide under rope, a SwiGLU of no hidden unit.
    (["--objective.kind", "mae", "--data.n-views", "1", "--model.rope", "--objective.mae.decoder-dim", "24",
      "--objective.mae.decoder-heads", "4"],
     "--objective.mae.decoder-heads 4: --model.rope needs a decoder head width that 4 divides (it is 6)"),
    (["--model.dim", "1", "--model.heads", "1", "--model.mlp-ratio", "1", "--model.swiglu"],
     "--model.swiglu True: needs 2/3 of --model.mlp-ratio x --model.dim to be >= 1"),
    (["--objective.kind", "mae", "--data.n-views", "1", "--model.swiglu", "--model.mlp-ratio", "1",
      "--objective.mae.decoder-dim", "1", "--objective.mae.decoder-heads", "1"],
     "--objective.mae.decoder-dim 1: --model.swiglu needs 2/3 of --model.mlp-ratio x the decoder's width"),
    # SIGReg read 0 for a collapsed embedding (its knots spread past its weight), and the run exited 0.
    (["--objective.lejepa.t-max", "1e38"], "--objective.lejepa.t-max 1e+38: must be at most 10: SIGReg's"),
    (["--model.depth", "1", "--model.drop-path", "0.5"],
     "--model.drop-path 0.5: is the last block's rate, rising from 0 at the first: one block"),
    # ... or read by nothing with the rest of the options (`validation.unused`).
    (["--optim.decay-fraction", "0.3"],
     "--optim.decay-fraction 0.3: is --optim.schedule wsd's, not cosine's"),
    (["--optim.schedule", "wsd", "--optim.decay-fraction", "0", "--optim.min-lr-ratio", "0.1"],
     "--optim.min-lr-ratio 0.1: is where the decay ends, and --optim.decay-fraction 0 keeps the LR"),
    (["--max-skips", "3"], "--max-skips 3: counts skipped updates: --on-nonfinite is stop, not skip"),
    (["--model.predictor-depth", "2"],
     "--model.predictor-depth 2: the predictor is read only by the span term: without --objective.lejepa"),
    (["--objective.lejepa.span-tokens", "8"], "--objective.lejepa.span-tokens 8: is the span term's"),
    (["--objective.lejepa.local-frames", "64"],
     "--objective.lejepa.local-frames 64: is the local views': --objective.lejepa.local-views is 0"),
    (["--objective.kind", "mae", "--data.n-views", "1", "--objective.mae.block-time", "4"],
     "--objective.mae.block-time 4: is read by --objective.mae.masking time or block, not random"),
    (["--objective.kind", "mae", "--data.n-views", "1", "--model.predictor-depth", "1"],
     "--model.predictor-depth 1: the mae objective has no span term: leave it out"),
    (["--objective.kind", "mae", "--data.n-views", "1", "--model.proj-dim", "64"],
     "--model.proj-dim 64: no loss of the mae objective reads the projector"),
    (["--objective.kind", "supervised", "--data.n-views", "1", "--model.proj-norm", "batch"],
     "--model.proj-norm 'batch': is the projector's hidden layers', and it has none (--model.proj-layers "
     "0, as supervised sets)"),
    (["--model.proj-layers", "0", "--model.proj-hidden", "256"],
     "--model.proj-hidden 256: is the projector's hidden layers', and it has none (--model.proj-layers 0)"),
    (["--data.features.time-mask-width", "8"],
     "--data.features.time-mask-width 8: is each mask's width: --data.features.time-mask-count is 0"),
    (["--data.event-column", "events"], "--data.event-column 'events': is read by --data.crop-events"),
    (["--log.wandb-project", "foo"], "--log.wandb-project 'foo': names a wandb project: --log.wandb is"),
    (["--eval-every", "0", "--no-eval-linear"], "--eval-linear False: is the last evaluation's linear probe"),
    (["--augment.mix-db", "-10", "-3"], "--augment.mix-db (-10.0, -3.0): is the mixed-in level"),
    # Values that ran and did nothing or nonsense, a traceback, or a refusal naming no option.
    (["--data.features.clip-seconds", "10"],
     "--data.features.clip-seconds 10.0: gives 998 log-mel frames, more than --data.features.n-frames (512), "
     "of which the rest would be cut off: a shorter clip, or --data.features.n-frames and --model.n-frames "
     "1008"),  # a multiple of the patch (it said 998, which --model.patch refused)
    (["--data.features.f-max", "10"], "--data.features.f-max 10.0: must be above f_min (20 Hz)"),
    (["--data.features.f-min", "20000"], "--data.features.f-min 20000.0: must be in [0, f_max (16000 Hz))"),
    (["--data.features.n-mels", "64"], "--model.n-mels 128: the model is built for 512 x 128 spectrograms"),
    # Every map, or most of it, one value: the run exited 0.
    (["--data.features.log-floor", "1e10"], "--data.features.log-floor 10000000000.0: must be in [1.17549e-"),
    (["--data.features.log-floor", "1e-46"], "--data.features.log-floor 1e-46: must be in [1.17549e-38, "
     "0.001]: below float32's smallest normal number its log reads wrongly"),  # it said "(got 0)"
    (["--data.features.f-max", "2000"], "--data.features.n-mels 128: has 21 mel bands that no FFT bin falls "
     "in (31.25 Hz a bin at --data.features.n-fft 1024, over 20-2000 Hz): each is the log floor"),
    (["--data.features.clip-seconds", "1"], "--data.features.n-frames 512: is more than the 98 log-mel "
     "frames a clip gives (--data.features.clip-seconds 1, hop 320): 81% of every map would be zeros; "
     "--data.features.n-frames and --model.n-frames 112, or a longer clip"),
    (["--data.features.hop-length", "1000"], "--data.features.hop-length 1000: is above "
     "--data.features.win-length 800: 20% of the audio would be in no frame"),
    (["--data.features.f-min", "nan"], "--data.features.f-min nan: must be a finite number"),
    (["--augment.pitch-bins", "1000"], "--augment.pitch-bins 1000.0: must be at most --model.n-mels (128)"),
    (["--augment.stretch", "inf"], "--augment.stretch inf: must be a finite number"),
    (["--optim.lr", "1e39"], "--optim.lr 1e+39: must be a float32"),
    (["--seed", "-1"], "--seed -1: must be in [0, 2^32)"),  # it said 2^63, and 2^32 is the bound
    (["--seed", str(2**32 + 5)],
     "--seed 4294967301: must be below 2^32: JAX's keys take its low 32 bits, and it would draw seed 5's"),
    (["--data.features.time-mask-count", "2"],
     "--data.features.time-mask-width 0: must be >= 1 where time_mask_count is 2"),
    (["--log.print-every", "0"], "--log.print-every 0: must be >= 1"),
    (["--steps", str(2**62)], f"--steps {2**62}: must be at most 10_000_000"),  # a hang building the LR table
    (["--optim.warmup-steps", "1000000000"], "--optim.warmup-steps 1000000000: must be at most 10_000_000"),
    (["--data.features.n-fft", "100000000"], "--data.features.n-fft 100000000: must be at most 65536"),
    # Each trained on an erased log-mel (all zeros to the encoder) and exited 0; the last a panic.
    (["--data.features.std", "1e-30"], "--data.features.std 1e-30: must be in [1e-6, 1e6]"),
    (["--data.features.mean", "1e30"], "--data.features.mean 1e+30: must be in [-1e6, 1e6]"),
    (["--augment.gain-db", "1e9"], "--augment.gain-db 1000000000.0: must be at most 100 dB"),
    (["--data.n-workers", "1000000"], "--data.n-workers 1000000: must be at most 1024"),
    (["--iid-window", "99999999999999"], "--iid-window 99999999999999: must be at most 10000"),  # hung
    # A trace of minutes before any step; a tensor past what a jitted argument holds (a traceback).
    (["--model.depth", "1000000"], "--model.depth 1000000: must be at most 256 blocks"),
    (["--objective.lejepa.local-views", "1000000"],
     "--objective.lejepa.local-views 1000000: must be at most 64"),
    (["--objective.lejepa.num-directions", "1000000000"],
     "--objective.lejepa.num-directions 1000000000: must be at most 65536"),
    (
        ["--objective.lejepa.local-views", "2", "--objective.lejepa.local-frames", "100"],
        "--objective.lejepa.local-frames 100: must be a multiple of --model.patch (16)",
    ),
    # The run directory is a folder inside the runs folder: not the runs folder itself, not outside it
    # (a short run, should the refusal go).
    *(
        (["--run", run, "--steps", "2", "--data.batch-size", "4", "--eval-every", "0"],
         f"--run {run!r}: must be a folder name inside --log.runs-dir")
        for run in ("", "../x", "a/../../x")
    ),
]  # fmt: skip


def pretrain_exit(capsys: pytest.CaptureFixture, *args: str) -> tuple[int | str | None, str]:
    """`birdjepa pretrain ARGS` through the console script's entry point: (exit code, stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["pretrain", *args])
    return e.value.code, capsys.readouterr().err


def data_flags(demo_dir: Path) -> list[str]:
    return ["--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval")]


@pytest.mark.parametrize("flags,message", INVALID, ids=[" ".join(f) for f, _ in INVALID])
def test_invalid_option_exits_2_with_one_line(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str
) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    code, err = pretrain_exit(capsys, *data_flags(demo_dir), "--log.runs-dir", str(tmp_path), *flags)
    assert signal.getsignal(signal.SIGTERM) is handler  # a refused start leaves the caller's handlers
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("error: ") and message in line, line
    assert not list(tmp_path.iterdir())  # nothing ran: not even a run directory


def test_a_start_that_failed_before_its_first_step_leaves_no_run(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # --data.crop-events on the demo set was refused once the run's folder, its empty log and checkpoints/
    # were made, and the same command without it, with --resume never, was "already holds a run".
    with pytest.raises(OptionError, match=r"^--data.crop-events True: crops views around a shard's events"):
        validation.check(PretrainConfig(data=DataConfig(crop_events=True)))
    run = tmp_path / "runs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").touch()
    flags = ["--run", "r", "--resume", "never", "--steps", "1", "--data.batch-size", "4", "--eval-every", "0"]
    main(["pretrain", *data_flags(demo_dir), "--log.runs-dir", str(tmp_path / "runs"), *flags])  # exit 0
    assert (run / "checkpoints" / "0").is_dir()


def test_a_run_inside_another_or_over_others_is_refused(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """One run's folder holding another's: analyze and compare of the outer one read both, and removing
    it to start over removes the inner one. (A config.json is what marks a run; nothing trains here.)"""
    runs = tmp_path / "runs"
    for run in ("a", "sweep/x"):
        (runs / run).mkdir(parents=True)
        (runs / run / "config.json").write_text("{}")
    flags = [*data_flags(demo_dir), "--log.runs-dir", str(runs), "--steps", "2"]
    code, err = pretrain_exit(capsys, *flags, "--run", "a/b")
    assert code == 2 and f"error: --run 'a/b': lies inside the run {runs / 'a'}" in err
    code, err = pretrain_exit(capsys, *flags, "--run", "sweep")
    assert code == 2 and f"error: --run 'sweep': {runs / 'sweep'} holds the run {runs / 'sweep/x'}" in err
    written = sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*"))
    assert written == ["a", "a/config.json", "sweep", "sweep/x", "sweep/x/config.json"]  # nothing more


def test_data_paths_that_match_no_shard_or_lack_a_vocabulary(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, err = pretrain_exit(capsys, "--data.train", "/nonexistent", "--data.eval", str(demo_dir / "eval"))
    assert (
        code == 2 and err.strip() == "error: --data.train '/nonexistent': no shard files match '/nonexistent'"
    )
    code, err = pretrain_exit(capsys, "--data.train", str(demo_dir / "train"), "--data.eval", str(tmp_path))
    assert code == 2 and f"--data.eval '{tmp_path}': no shard files match" in err
    # A relative path read from another folder (a resume started elsewhere) said no more.
    monkeypatch.chdir(tmp_path)
    code, err = pretrain_exit(capsys, "--data.train", "data/train", "--data.eval", str(demo_dir / "eval"))
    said = "error: --data.train 'data/train': no shard files match 'data/train' (a relative path: read from "
    assert code == 2 and err.strip() == f"{said}{tmp_path})", err
    # What a newcomer points at first: a folder of the hub's Parquet, or of recordings; a Parquet file.
    import pyarrow.parquet as pq

    (hub := tmp_path / "hub").mkdir()
    pq.write_table(pa.table({"a": [1]}), hub / "train-0.parquet")
    (recordings := tmp_path / "recordings" / "robin").mkdir(parents=True)
    (recordings / "r0.flac").write_bytes(b"")
    for given, what, does in ((hub, "Parquet", "converts"), (recordings.parent, "audio", "packs")):
        code, err = pretrain_exit(capsys, "--data.train", str(given), "--data.eval", str(demo_dir / "eval"))
        assert code == 2 and err.strip() == (
            f"error: --data.train '{given}': no shard files match '{given}': it holds {what} files, which "
            f"`birdjepa prepare {given} OUT` {does} into shards"
        ), err
    parquet = hub / "train-0.parquet"
    code, err = pretrain_exit(capsys, "--data.train", str(parquet), "--data.eval", str(demo_dir / "eval"))
    assert code == 2 and err.strip() == (
        f"error: --data.train '{parquet}': {parquet}: not an Arrow IPC shard (a Parquet file: `birdjepa "
        "prepare` converts it)"
    ), err
    # String labels need the vocabulary that maps them to integers; the line names the missing file.
    strings = tmp_path / "strings"
    strings.mkdir()
    schema = shard_schema().set(1, pa.field(shard_schema().field(1).name, pa.string()))
    row = [{"bytes": b"x", "path": "r0.wav"}, "robin", "r0"]
    table = pa.table({n: [v] for n, v in zip(schema.names, row, strict=True)}, schema=schema)
    with pa.ipc.new_file(str(strings / "s-00000.arrow"), schema) as w:
        w.write_table(table)
    code, err = pretrain_exit(capsys, "--data.train", str(strings), "--data.eval", str(demo_dir / "eval"))
    assert code == 2 and f"need a vocabulary: no {strings / 'vocab.json'}" in err, err


def test_a_stop_at_a_step_the_run_has_trained_is_refused_with_nothing_written(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The README's first command run again, after its run saved step 1: without the check, the resumed
    # run never met its stop and trained to the end.
    run = ["--run", "r", "--log.runs-dir", str(tmp_path), *data_flags(demo_dir), "--steps", "4",
           "--eval-every", "0", "--data.batch-size", "4"]  # fmt: skip
    # Trained by a birdjepa that did not refuse an option it never reads: its resumes are not refused
    # for it (the checks below come later), or the run could never go on.
    with monkeypatch.context() as m:
        m.setattr(validation, "_check_unused", lambda cfg, saved: None)
        assert main(["pretrain", *run, "--stop-at-step", "1", "--optim.decay-fraction", "0.3"]) is None
    written = {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file() and p.name != "lease"}
    for step in ("1", "0"):
        code, err = pretrain_exit(capsys, *run, "--stop-at-step", step)
        assert code == 2 and err.splitlines() == [
            f"error: --stop-at-step {step}: run r has trained that step already (it resumes at step 2): give "
            "a later one, or none to train to step 3"
        ], err
    # One given anew on a resume's command line is refused as at a start: it was taken as a harmless
    # change and recorded (--max-skips), or as a breaking one, exit 65 (--optim.decay-fraction 0.4).
    for flag, value in (("--max-skips", "3"), ("--optim.decay-fraction", "0.4")):
        code, err = pretrain_exit(capsys, *run, flag, value)
        assert code == 2 and err.startswith(f"error: {flag} {value}: "), err
    # --steps shrunk to where the run stands, allowed: "already finished", exit 0, nothing recorded, and
    # the next bare start trained on to the checkpoint's --steps.
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["pretrain", *run[:-4], "--steps", "2", "--eval-every", "0", "--allow-config-change"])
    assert e.value.code == 65
    ended = "ERROR: run r has trained through step 1, and --steps 2 would end it there: a run is not ended"
    assert f"{ended} at a step it trained (its checkpoint holds --steps 4," in capsys.readouterr().out
    assert {
        p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file() and p.name != "lease"
    } == written


def test_a_truncated_shard_is_refused_in_one_line_before_the_run_is_made(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # A shard's missing footer showed only when the loader opened it: after the step's trace and the
    # initial weights (34 s at base on a CPU; a held-out shard's, at the trainer's start), leaving an
    # empty checkpoints/ folder. The checks open each split as its loader does.
    shards, runs = tmp_path / "shards", tmp_path / "runs"
    shard = a_demo_shard_beside_its_vocabulary(demo_dir, shards)
    (shards / "a.arrow").write_bytes(shard.read_bytes()[:300_000])
    cut = f"{shards / 'a.arrow'}: truncated shard: Arrow IPC file without its footer (expected 'ARROW1' at "
    cut += "the end)"
    for option, flags in (("train", ["--data.train", str(shards), "--data.eval", str(demo_dir / "eval")]),
                          ("eval", [*data_flags(demo_dir)[:2], "--data.eval", str(shards)])):  # fmt: skip
        code, err = pretrain_exit(capsys, *flags, "--log.runs-dir", str(runs), "--eval-every", "4")
        assert code == 2 and err.splitlines() == [f"error: --data.{option} {str(shards)!r}: {cut}"], err
        assert not runs.exists()


@pytest.mark.parametrize("run", ["", ".", "../x", "a/../../x", "/tmp/x"])
def test_a_run_outside_the_runs_folder_is_refused(run: str) -> None:
    with pytest.raises(OptionError, match="must be a folder name inside --log.runs-dir"):
        validation.check(PretrainConfig(run=run), data=False)


def test_a_run_name_or_data_path_that_is_no_printable_utf8_is_refused(demo_dir: Path, tmp_path: Path) -> None:
    # A line break split every line naming the run; a latin-1 byte (as the shell passes it: a surrogate)
    # was a UnicodeEncodeError's traceback, for a data path after the run directory was made.
    latin1 = os.fsdecode(b"r\xe9n")
    for run in ("line\nbreak", "tab\there"):
        with pytest.raises(OptionError, match="must be printable UTF-8 text"):
            validation.check(PretrainConfig(run=run), data=False)
    with pytest.raises(OptionError, match=r"is not UTF-8 \(a name in latin-1, say\): rename it"):
        validation.check(PretrainConfig(run=latin1), data=False)
    validation.check(PretrainConfig(run="rün é鳥 x\xa0y"), data=False)  # printable UTF-8, spaces: fine
    validation.check(PretrainConfig(log=LogConfig(runs_dir=tmp_path / "a\xa0b")), data=False)  # a no-break
    # The runs folder too: trained to its first save, then 127 tracebacks from Orbax and exit 74.
    with pytest.raises(
        OptionError, match=r"^--log.runs-dir .*'.*lat\\udce9' is not UTF-8 \(a name in latin-1"
    ):
        validation.check(PretrainConfig(log=LogConfig(runs_dir=tmp_path / latin1.replace("r", "lat", 1)[:4])),
                         data=False)  # fmt: skip
    with pytest.raises(OptionError, match=r"^--log.runs-dir .*'.*a\\nb' holds a line break"):
        validation.check(PretrainConfig(log=LogConfig(runs_dir=tmp_path / "a\nb")), data=False)
    # A Python that reads every name as ASCII (LC_ALL=C, PYTHONUTF8=0) blamed good UTF-8 names.
    code = ("from birdjepa import validation; from birdjepa.config import PretrainConfig\n"
            "import sys\ntry:\n    validation.check(PretrainConfig(run=sys.argv[1]), data=False)\n"
            "except validation.OptionError as e:\n    print(e)")  # fmt: skip
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0"}
    said = subprocess.run([sys.executable, "-c", code, "é"], capture_output=True, text=True, env=env).stdout
    assert "is not UTF-8 (this Python reads file names as ascii: set LANG=C.UTF-8 or PYTHONUTF8=1" in said, (
        said
    )
    # A path a checkpoint's files would take past 4096 bytes: every step trained, then the first save
    # failed ("File name too long", exit 74, "free space").
    deep = Path("/" + "/".join(["d" * 200] * 20))
    with pytest.raises(OptionError, match=r"makes a run directory path of \d+ bytes: the checkpoints' files"):
        validation.check(PretrainConfig(log=LogConfig(runs_dir=deep)), data=False)
    shard = next(iter(sorted((demo_dir / "train").glob("*.arrow"))))
    (folder := tmp_path / os.fsdecode(b"lat\xe9")).mkdir()
    shutil.copy(shard, folder / shard.name)
    shutil.copy(demo_dir / "train" / "vocab.json", folder)
    cfg = PretrainConfig(data=DataConfig(train=str(folder), eval=str(demo_dir / "eval")))
    with pytest.raises(OptionError, match="is not UTF-8 \\(a name in latin-1, say\\): rename it"):
        validation.check(cfg)


@pytest.mark.parametrize("run", ["r", "sweep/a", "./r", "tiny-0"])
def test_a_run_inside_the_runs_folder_nested_or_as_a_sweep_names_it_is_allowed(run: str) -> None:
    validation.check(PretrainConfig(run=run), data=False)


def test_a_seed_past_2_to_the_32_is_refused_at_a_start_and_kept_by_the_run_that_trained_with_it() -> None:
    # Seeds 5 and 2^32 + 5 drew one run's initial weights and step keys (JAX keeps 32 bits of a seed).
    from birdjepa.train.step import seed_key

    assert jax.random.key_data(seed_key(2**32 + 5)).tolist() == jax.random.key_data(seed_key(5)).tolist()
    with pytest.raises(OptionError, match="must be below 2"):
        validation.check(PretrainConfig(seed=2**32 + 5), data=False)
    validation.check(PretrainConfig(seed=2**32 + 5), data=False, saved={"seed": 2**32 + 5})


def test_another_gradient_accumulation_at_a_resume_is_refused_naming_it() -> None:
    # Allowed, the lr check refused it with "fix the cause"; warned past, the rest trained at learning rate
    # 0 (the schedule's table sized by the new count, indexed by the updates already made), exit 0.
    from birdjepa.config import OptimConfig, flatten, to_dict

    saved = flatten(to_dict(PretrainConfig(steps=24, optim=OptimConfig(grad_accum=2))))
    again = PretrainConfig(steps=24, optim=OptimConfig(grad_accum=3), allow_config_change=True)
    with pytest.raises(OptionError, match=r"^--optim.grad-accum 3: cannot change within a run \(it trained "
                       "with 2: "):  # fmt: skip
        validation.check(again, data=False, saved=saved)
    validation.check(PretrainConfig(steps=24, optim=OptimConfig(grad_accum=2)), data=False, saved=saved)


def test_a_combination_a_newer_check_refuses_goes_on_in_a_run_that_trained_with_it() -> None:
    # A run that trained with a span ratio rounding to no span (or a mix in a batch of one) before those
    # were refused: its requeue exited 2, and Slurm does not requeue that.
    import dataclasses

    from birdjepa.config import AugmentConfig, DataConfig, ModelConfig, flatten, to_dict
    from birdjepa.objectives.options import LeJepaConfig, ObjectiveConfig

    span = PretrainConfig(
        model=ModelConfig(predictor_depth=1),
        objective=ObjectiveConfig(lejepa=LeJepaConfig(span_weight=1.0, span_ratio=0.05)),
    )
    mix = PretrainConfig(data=DataConfig(batch_size=1), augment=AugmentConfig(mix_prob=0.5))
    short = PretrainConfig(data=DataConfig(features=Features(clip_seconds=1.0)))  # 81% padding
    low = PretrainConfig(data=DataConfig(features=Features(f_max=2000.0)))  # 21 empty mel bands
    floor = PretrainConfig(data=DataConfig(features=Features(log_floor=0.01)))
    hop = PretrainConfig(data=DataConfig(features=Features(hop_length=1000)))  # 20% of the audio unread
    cases = (
        (hop, "hop-length 1000"),
        (span, "span-ratio 0.05"),
        (mix, "mix-prob 0.5"),
        (short, "n-frames 512"),
        (low, "n-mels 128"),
        (floor, "log-floor 0.01"),
    )
    for cfg, option in cases:
        with pytest.raises(OptionError, match=option):
            validation.check(cfg, data=False)
        validation.check(cfg, data=False, saved=flatten(to_dict(cfg)))  # it trained with them: goes on
        # Recorded by an older birdjepa (options added since missing: they read as their defaults), or
        # retuned in another option at the resume: still refused, where only a change of them should be.
        saved, defaults = flatten(to_dict(cfg)), flatten(to_dict(PretrainConfig()))
        validation.check(cfg, data=False, saved={k: v for k, v in saved.items() if v != defaults[k]})
        retuned = dataclasses.replace(cfg, objective=ObjectiveConfig(lejepa=dataclasses.replace(
            cfg.objective.lejepa, lam=0.1)), allow_config_change=True)  # fmt: skip
        validation.check(retuned, data=False, saved=saved)
    # A change that makes the combination anew is refused: a batch of 2 that mixed, resumed with 1.
    with pytest.raises(OptionError, match="mix-prob 0.5"):
        validation.check(mix, data=False, saved=flatten(to_dict(dataclasses.replace(mix, data=DataConfig()))))


def test_a_verification_s_own_files_are_its_output_and_its_lease_s_leftovers(tmp_path: Path) -> None:
    # A user's run named verify-X/straight (no console.log in it) was removed by `verify-resume --run X`.
    from birdjepa.resume.verify import own_output

    for name in ("straight", "resumed"):
        (tmp_path / name).mkdir()
        assert own_output(tmp_path / name)  # made, killed before its trainer wrote
        (tmp_path / name / "metrics.jsonl").touch()
        assert not own_output(tmp_path / name)  # a run the verification did not write
        (tmp_path / name / "console.log").touch()
        assert own_output(tmp_path / name)
    names = ["verify.json", "lease.json", "lease.json.takeover", ".lease.json.0123456789abcdef"]
    assert all(own_output(tmp_path / name) for name in names)
    assert not any(own_output(tmp_path / name) for name in ["checkpoints", "metrics.jsonl", "config.json"])


def test_the_real_process_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--data.batch-size", "0"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --data.batch-size 0: must be >= 1"]
    assert done.stdout == "" and not list(tmp_path.iterdir())


def test_a_sweep_is_checked_the_same_way(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "bad.py"
    path.write_text('def make_cfgs():\n    return [{"steps": 10}, {"optim.lr": -1.0}]\n')
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["sweep", str(path), "--dry-run"])
    assert e.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: {path}: config 1: --optim.lr -1.0: must be > 0"


def test_a_run_on_your_shards_is_never_evaluated_on_another_vocabulary_s_classes(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo's eval clips under other names: the same label 0 means another class.
    other = tmp_path / "other"
    other.mkdir()
    for shard in (demo_dir / "eval").glob("*.arrow"):
        (other / shard.name).symlink_to(shard)
    names = json.loads((demo_dir / "eval" / "vocab.json").read_text())["names"]
    (other / "vocab.json").write_text(json.dumps({"label_column": "ebird_code", "names": names[::-1]}))
    runs = ["--log.runs-dir", str(tmp_path / "runs")]
    # Your train shards without --data.eval: the demo's eval split (other classes) is not the default.
    code, err = pretrain_exit(capsys, "--data.train", str(demo_dir / "train"), *runs)
    assert code == 2 and err.strip() == (
        "error: --data.eval None: the held-out evaluation (--eval-every 100) of a run on your shards needs "
        "held-out shards of their classes (`birdjepa prepare SRC OUT --vocab TRAIN/vocab.json`); or "
        "--eval-every 0 for none"
    ), err
    n = len(names)
    mismatch = (
        f"{demo_dir / 'train' / 'vocab.json'} ({n} names) and {other / 'vocab.json'} ({n} names) name "
        f"different labels (label 0: {names[0]!r} against {names[-1]!r}): a probe fitted on the first would "
        "score the second's clips as other classes"
    )
    train = ["--data.train", str(demo_dir / "train")]
    code, err = pretrain_exit(capsys, *train, "--data.eval", str(other), *runs)
    assert code == 2 and err.strip() == f"error: --data.eval '{other}': {mismatch}", err
    assert not (tmp_path / "runs").exists()
    # The demo's train split (here the suite's) against your --data.eval: found once the demo is opened.
    monkeypatch.setattr("birdjepa.train.segment.ensure_demo_data", lambda: demo_dir)
    code, err = pretrain_exit(capsys, "--data.eval", str(other), *runs)
    assert code == 2 and err.strip() == f"error: {mismatch}", err
    # One split over folders of two vocabularies trains, each label read by its name, and says so.
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "a").symlink_to(demo_dir / "train")
    (mixed / "b").symlink_to(other)
    main(["pretrain", "--run", "mine", "--data.train", str(mixed / "*" / "*.arrow"), "--eval-every", "0",
          "--steps", "4", "--stop-at-step", "0", "--data.batch-size", "4", *runs])  # fmt: skip
    out = capsys.readouterr().out
    assert (
        "the train shards' folders index different vocabularies "
        f"({mixed / 'a' / 'vocab.json'} ({n} names) and {mixed / 'b' / 'vocab.json'} ({n} names) name "
        f"different labels (label 0: {names[0]!r} against {names[-1]!r})): each label is read by its name, "
        f"as one of the split's {n}" in out
    ), out
    # The second folder's label x names names[-1 - x]: the loader gives it as that name's class, n - 1 - x.
    files = [str(sorted((mixed / f).glob("*.arrow"))[0]) for f in ("a", "b")]
    stored = [read_shard(Path(f)).column("ebird_code").to_numpy(zero_copy_only=False) for f in files]
    with Loader(files, train=False, batch_size=8, n_workers=1) as loader:
        offsets = np.cumsum([0, *loader.shard_sizes])
        got = {int(i): int(x) for b in loader for i, x in zip(b["index"], b["label"], strict=True)}
    for s, labels in enumerate(stored):
        want = labels if s == 0 else n - 1 - labels
        assert [got[int(offsets[s]) + r] for r in range(len(labels))] == want.tolist(), s
    assert all(len(set(x)) > 1 for x in stored)  # the check sees more than one class in each folder
    # Scored against another vocabulary, the split is named by every vocabulary its names come from.
    code, err = pretrain_exit(capsys, "--data.train", str(mixed / "*" / "*.arrow"), "--data.eval", str(other),
                              *runs)  # fmt: skip
    assert code == 2 and err.strip() == (
        f"error: --data.eval '{other}': {mixed / 'a' / 'vocab.json'} + {mixed / 'b' / 'vocab.json'} "
        f"({n} names) and {other / 'vocab.json'} ({n} names) name different labels "
        f"(label 0: {names[0]!r} against {names[-1]!r}): a probe fitted on the first would score the "
        "second's clips as other classes"
    ), err
    # Evaluating that run needs held-out shards of its classes.
    with pytest.raises(SystemExit) as e:
        main(["evaluate", str(tmp_path / "runs" / "mine")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "trained on" in err and "without --data.eval: give held-out" in err, err


def test_unlabelled_shards_pretrain_self_supervised_and_the_supervised_objective_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from conftest import tone

    from birdjepa.rundir.metrics_log import metrics_by_step
    from birdjepa.synthetic.codecs import encode_audio

    audio = tmp_path / "audio"  # files at the top of the folder: no label, an empty vocabulary
    audio.mkdir()
    for i in range(2):
        (audio / f"r{i}.wav").write_bytes(encode_audio(tone(500.0 + 300 * i, 16000, 2.0), 16000, "wav_pcm16"))
    main(["prepare", str(audio), str(tmp_path / "train")])
    flags = ["--data.train", str(tmp_path / "train"), "--eval-every", "0", "--log.runs-dir", str(tmp_path)]
    code, err = pretrain_exit(capsys, *flags, "--objective.kind", "supervised")
    train = tmp_path / "train"
    assert code == 2 and err.strip() == (
        f"error: --objective.kind 'supervised': trains on labels, and --data.train '{train}' has none"
    ), err
    # LeJEPA, the default, needs none: the online probe has one class and nothing to train.
    main(["pretrain", "--run", "unlabelled", *flags, "--steps", "2", "--data.batch-size", "2"])
    logged = metrics_by_step(tmp_path / "unlabelled")
    assert sorted(logged) == [0, 1] and all(m["train/probe_ce"] == 0.0 for m in logged.values())


def test_an_evaluation_with_no_labelled_eval_row_or_one_train_class_is_refused_before_training(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Held-out audio prepared without a folder per class: trained, then a ValueError's traceback at the
    # first evaluation, exit 1, its step unsaved (and the same at every resume). A train split of one
    # class: every probe 1.000, its chance too, exit 0 (`birdjepa evaluate` refuses both).
    from conftest import tone

    from birdjepa.synthetic.codecs import encode_audio

    def audio(folder: Path, names: list[str]) -> Path:
        for i, name in enumerate(names):
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(encode_audio(tone(500.0 + 300 * i, 16000, 2.0), 16000, "wav_pcm16"))
        return folder

    main(["prepare", str(audio(tmp_path / "flat", ["r0.wav", "r1.wav"])), str(tmp_path / "unlabelled"),
          "--vocab", str(demo_dir / "train")])  # fmt: skip
    common = ["--eval-every", "2", "--log.runs-dir", str(tmp_path / "runs")]
    code, err = pretrain_exit(capsys, "--data.train", str(demo_dir / "train"), "--data.eval",
                              str(tmp_path / "unlabelled"), *common)  # fmt: skip
    said = f"error: --data.eval '{tmp_path / 'unlabelled'}': has no labelled row"
    assert code == 2 and err.startswith(said), err
    assert err.count("\n") == 1 and err.rstrip().endswith("scores probes on labels; or --eval-every 0"), err
    one = audio(tmp_path / "one", ["a/r0.wav", "a/r1.wav"])
    main(["prepare", str(one), str(tmp_path / "one-train")])
    main(["prepare", str(one), str(tmp_path / "one-eval"), "--vocab", str(tmp_path / "one-train")])
    code, err = pretrain_exit(capsys, "--data.train", str(tmp_path / "one-train"), "--data.eval",
                              str(tmp_path / "one-eval"), *common)  # fmt: skip
    said = f"error: --data.train '{tmp_path / 'one-train'}': has labelled rows of one class alone: a probe"
    assert code == 2 and err.startswith(said), err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("checkpoints/*"))
    # The label column the loader reads, which vocab.json names (`prepare --label-column species` was
    # refused as unlabelled); labels the loader cannot read, in its words (pyarrow's unique() raised).
    from test_loader_bad_input import write_table

    from birdjepa.validation import check_data

    two = audio(tmp_path / "two", ["a/r0.wav", "b/r1.wav"])
    main(["prepare", str(two), str(tmp_path / "sp-train"), "--label-column", "species"])
    main(["prepare", str(two), str(tmp_path / "sp-eval"), "--vocab", str(tmp_path / "sp-train")])
    split = DataConfig(train=str(tmp_path / "sp-train"), eval=str(tmp_path / "sp-eval"))
    check_data(PretrainConfig(data=split, eval_every=2))
    shard = next((tmp_path / "sp-train").glob("*.arrow"))
    table = read_shard(shard)
    listed = pa.array([[v] for v in table.column("species").to_pylist()], pa.list_(pa.int64()))
    write_table(table.set_column(table.column_names.index("species"), "species", listed), tmp_path / "t")
    (tmp_path / "t").replace(shard)  # not written over in place: `table` maps it
    refused = f"--data.train '{tmp_path / 'sp-train'}': {shard}: label column 'species' has type List(Int64)"
    with pytest.raises(OptionError, match=f"^{re.escape(refused)}"):
        check_data(PretrainConfig(data=split, eval_every=2))


def test_jax_enable_x64_is_refused_in_one_line(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A resume under it: "checkpoint 5 holds a state of another shape" (float64 against the float32 saved),
    # naming no setting; a fresh start: a KeyError traceback from the digest at step 0 (a helper's hunt).
    import jax

    from birdjepa.divergence.replay import ReplayError, open_at
    from birdjepa.evaluation.cli import EvaluateError, restore_checkpoint
    from birdjepa.train.determinism import machine_kind

    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    jax.config.update("jax_enable_x64", True)
    run = tmp_path / "elsewhere" / "r"
    (run / "checkpoints").mkdir(parents=True)
    try:
        code, err = pretrain_exit(capsys, *data_flags(demo_dir), "--log.runs-dir", str(tmp_path / "runs"))
        # evaluate, export, embed, benchmark: a leaf "saved as float32, target float64", blaming the run;
        # trace and bisect the same; verify-resume: an empty table and exit 1 ("the runs differ").
        with pytest.raises(EvaluateError, match=r"^\$JAX_ENABLE_X64='1': birdjepa trains and checkpoints"):
            restore_checkpoint(run)
        with pytest.raises(ReplayError, match=r"^\$JAX_ENABLE_X64='1': birdjepa trains and checkpoints"):
            open_at(run, 0)
        verify = [*data_flags(demo_dir), "--log.runs-dir", str(tmp_path / "runs")]
        with pytest.raises(SystemExit) as e:
            main(["verify-resume", *verify])
    finally:
        jax.config.update("jax_enable_x64", False)
    said = "error: $JAX_ENABLE_X64 '1': birdjepa trains and checkpoints in float32: unset it\n"
    assert code == 2 and err == said, err
    assert e.value.code == 2 and capsys.readouterr().err == f"verify-resume: {said}"
    assert not (tmp_path / "runs").exists()
    # The settings that move numbers are in the machine record: a resume under another says which.
    assert "jax_threefry_partitionable=True" in machine_kind()["jax_config"]


def test_a_fresh_start_warns_of_a_warmup_past_the_run_and_of_a_batch_larger_than_the_train_split() -> None:
    # Both allowed (a short try, a small test set); a batch of 100 from 64 clips repeated 36 without a word.
    from birdjepa.config import OptimConfig
    from birdjepa.train.segment import start_warnings

    cfg = PretrainConfig(steps=20, optim=OptimConfig(warmup_steps=10, grad_accum=2, lr=3e-4),
                         data=DataConfig(batch_size=100))  # fmt: skip
    assert start_warnings(cfg, 100) == [
        "--optim.warmup-steps 10 >= the run's 10 optimizer updates: its LR never reaches --optim.lr 0.0003"
    ]
    assert start_warnings(cfg, 64)[1] == (
        "--data.batch-size 100 > the 64 records of the train split: every batch holds some recordings more "
        "than once"
    )
    cfg = PretrainConfig(steps=22, optim=OptimConfig(warmup_steps=10, grad_accum=2))
    assert start_warnings(cfg, cfg.data.batch_size) == []
    # wsd's decay counts the warmup's updates: a warmup running into it won, then a cliff (0.989, 1.0, 0.45).
    wsd = dataclasses.replace(cfg.optim, schedule="wsd", warmup_steps=90, grad_accum=1, decay_fraction=0.2)
    assert start_warnings(dataclasses.replace(cfg, steps=100, optim=wsd), cfg.data.batch_size) == [
        "--optim.warmup-steps 90 runs into the wsd decay, which takes the last 0.2 of the 100 updates (from "
        "update 80): the LR drops from its peak at once after the warmup; a shorter warmup or a smaller "
        "--optim.decay-fraction"
    ]
    smooth = dataclasses.replace(cfg, steps=100, optim=dataclasses.replace(wsd, warmup_steps=80))
    assert start_warnings(smooth, cfg.data.batch_size) == []
