"""Frozen-encoder evaluation: the probes against answers known in advance, the raw baseline, the
collapse metric, and `birdjepa evaluate` end to end on a tiny run."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import json
import math
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest
from conftest import a_demo_shard_beside_its_vocabulary, rewrite_meta, run_notebook

from birdjepa.config import PretrainConfig
from birdjepa.data import DataError
from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.evaluation import single_label_probes as probes
from birdjepa.evaluation.embed import raw_features
from birdjepa.resume.compare import compare_runs
from birdjepa.rundir import layout
from birdjepa.rundir.layout import LEASE_FILE
from birdjepa.rundir.metrics_log import read_metrics


def separable(seed: int, n_classes: int = 5, per_class: int = 30, dim: int = 8, offset: float = 0.0):
    """Clusters around one-hot class means 10 apart with unit noise: linearly separable by a margin."""
    rng = np.random.Generator(np.random.Philox(seed))
    y = np.repeat(np.arange(n_classes), per_class)
    means = np.zeros((n_classes, dim))
    means[np.arange(n_classes), np.arange(n_classes)] = 10.0
    return means[y] + offset + rng.standard_normal((len(y), dim)) * 0.5, y


def test_accuracies_by_hand():
    # 3 of 4 right; class 0 all right (1.0), class 1 all wrong (0.0): macro 0.5.
    assert probes.accuracies(np.array([0, 0, 0, 0]), np.array([0, 0, 0, 1])) == (0.75, 0.5)
    with pytest.raises(ValueError, match="no labelled"):
        probes.accuracies(np.array([]), np.array([]))


def test_linear_probe_separates_separable_embeddings():
    x, y = separable(0)
    tx, ty = separable(1, per_class=10)
    result = probes.linear_probe(x, y, tx, ty)
    assert (result.acc, result.macro_acc) == (1.0, 1.0)
    assert result.details["converged"] and result.details["train_acc"] == 1.0
    assert result.details["folds"] == [30] * 5  # 5 folds, each 6 clips of every class (30 per class)
    # The same inputs give the same answer (and the same chosen L2 strength).
    again = probes.linear_probe(x, y, tx, ty)
    assert again.details == result.details and np.array_equal(again.predictions, result.predictions)


def test_chance_is_what_guessing_the_train_split_s_most_common_class_scores():
    from birdjepa.evaluation.report import chance

    # 1 / classes (1/3) on an unbalanced set made a probe at 0.5 look above chance: it guesses class 2.
    assert chance(np.array([0, 2, 2, 1]), np.array([2, 2, 0, 1])) == 0.5
    # Tied most common train classes 0 and 1: the mean of their eval shares (1/4 and 2/4).
    assert chance(np.array([0, 1]), np.array([0, 1, 1, 2])) == 0.375
    assert chance(np.array([], np.int64), np.array([1])) == 0.0


def test_linear_probe_at_chance_on_noise():
    rng = np.random.Generator(np.random.Philox(3))
    x, tx = rng.standard_normal((200, 16)), rng.standard_normal((400, 16))
    y, ty = rng.integers(0, 4, 200), rng.integers(0, 4, 400)
    result = probes.linear_probe(x, y, tx, ty)
    assert abs(result.acc - 0.25) < 0.1  # 400 test clips: the sd of chance accuracy is 0.022


def knn_reference(train_x, train_y, test_x, k, temperature):
    """Brute force, written out: standardise with train statistics, cosine to every train clip, the k
    most similar (lower index first on ties) vote exp(sim / T) for their class, the lowest class wins ties."""
    d = len(train_x[0])
    mean = [sum(row[j] for row in train_x) / len(train_x) for j in range(d)]
    std = [math.sqrt(sum((row[j] - mean[j]) ** 2 for row in train_x) / len(train_x)) or 1.0 for j in range(d)]

    def unit(row):
        z = [(row[j] - mean[j]) / std[j] for j in range(d)]
        norm = math.sqrt(sum(v * v for v in z))
        return [v / norm for v in z]

    bank = [unit(r) for r in train_x]
    out = []
    for q in test_x:
        u = unit(q)
        sims = [sum(a * b for a, b in zip(u, b_, strict=True)) for b_ in bank]
        order = sorted(range(len(bank)), key=lambda i: (-sims[i], i))[:k]
        votes: dict[int, float] = {}
        for i in order:
            votes[int(train_y[i])] = votes.get(int(train_y[i]), 0.0) + math.exp(sims[i] / temperature)
        out.append(min(votes, key=lambda c: (-votes[c], c)))
    return np.array(out)


def test_knn_matches_a_brute_force_reference():
    rng = np.random.Generator(np.random.Philox(7))
    centres = rng.standard_normal((6, 12)) * 1.5
    y = rng.integers(0, 6, 120)
    x = centres[y] + rng.standard_normal((120, 12)) + 3.0  # an offset that standardising removes
    ty = rng.integers(0, 6, 50)
    tx = centres[ty] + rng.standard_normal((50, 12)) + 3.0
    for k, temperature in ((20, 0.07), (5, 1.0), (1, 0.07)):
        result = probes.knn(x, y, tx, ty, k=k, temperature=temperature)
        expected = knn_reference(x.tolist(), y, tx.tolist(), k, temperature)
        assert np.array_equal(result.predictions, expected)
        assert result.acc == float(np.mean(expected == ty))
    assert 0.5 < probes.knn(x, y, tx, ty).acc < 1.0  # the task is neither trivial nor hopeless


def test_knn_is_perfect_on_separable_embeddings_and_refuses_nan():
    x, y = separable(0)
    tx, ty = separable(1, per_class=10)
    assert probes.knn(x, y, tx, ty).acc == 1.0
    tx[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        probes.knn(x, y, tx, ty)


def test_raw_features_are_the_mean_and_std_over_time():
    spec = np.zeros((2, 4, 3), np.float32)
    spec[0, :, 1] = [1.0, 3.0, 1.0, 3.0]  # mean 2, std 1
    spec[1] = 5.0
    f = raw_features(spec)
    assert f.shape == (2, 6)
    assert f[0].tolist() == [0.0, 2.0, 0.0, 0.0, 1.0, 0.0]
    assert f[1].tolist() == [5.0, 5.0, 5.0, 0.0, 0.0, 0.0]


def test_effective_rank_of_known_batches():
    rng = np.random.Generator(np.random.Philox(0))
    # Equal singular values in r directions: effective rank exactly r.
    q, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    for r in (1, 4, 16):
        z = np.zeros((64, 32))
        for i in range(r):  # +-q_i: centred, singular value sqrt(2) for each of the r directions
            z[2 * i] = q[i]
            z[2 * i + 1] = -q[i]
        assert abs(float(effective_rank(jnp.asarray(z))) - r) < 1e-4
    assert float(effective_rank(jnp.ones((8, 5)))) == 0.0  # all equal: nothing spread at all
    gauss = float(effective_rank(jnp.asarray(rng.standard_normal((4096, 16)))))
    assert 15.5 < gauss <= 16.0  # isotropic: close to the full dimension


def test_sigreg_is_about_1_06_on_gaussians_and_grows_with_n_when_collapsed():
    from birdjepa.objectives.sigreg import sigreg

    f = jax.jit(sigreg)
    # E[EP] = ∫(1 - e^{-t²}) e^{-t²/2} dt = √(2π) - √(2π/3) = 1.0594 for i.i.d. N(0, I), for any N.
    expected = math.sqrt(2 * math.pi) - math.sqrt(2 * math.pi / 3)
    for n in (32, 256):
        values = [float(f(jax.random.normal(jax.random.key(i), (n, 32)), jax.random.key(100 + i)))
                  for i in range(40)]  # fmt: skip
        # The quadrature (17 knots on [0, 3]) and 40 x 256 directions: within 8 % of the exact mean.
        assert abs(np.mean(values) - expected) < 0.08 * expected, (n, np.mean(values))
    # Collapsed to one point: EP is N times a constant, so it doubles with N.
    c32 = float(f(jnp.full((32, 32), 0.5), jax.random.key(0)))
    c64 = float(f(jnp.full((64, 32), 0.5), jax.random.key(0)))
    assert c32 > 15 * expected and c64 == pytest.approx(2 * c32, rel=1e-5)
    # Collapsed to a line (rank 1) through the origin: far from isotropic as well.
    line = jax.random.normal(jax.random.key(1), (256, 1)) * jnp.ones((1, 32)) / math.sqrt(32)
    assert float(f(line, jax.random.key(2))) > 10 * expected


def tiny_config(demo_dir: Path, runs: Path) -> PretrainConfig:
    from birdjepa.config import DataConfig, LogConfig, PretrainConfig
    from birdjepa.model.config import ModelConfig

    # Every encoder option on (test_encoder_options.py): the export must carry each, and embed with it.
    model = ModelConfig(rope=True, qk_norm=True, swiglu=True, layer_scale=0.1, registers=2)
    return PretrainConfig(
        run="eval", steps=6, eval_every=3, ckpt_every=3, log=LogConfig(runs_dir=runs, print_every=100),
        data=DataConfig(train=str(demo_dir / "train"), eval=str(demo_dir / "eval"), batch_size=8),
        model=model,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory, demo_dir: Path) -> Path:
    from birdjepa.pretrain.loop import pretrain

    runs = tmp_path_factory.mktemp("runs")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert pretrain(tiny_config(demo_dir, runs)) == 0
    (runs / "printed.txt").write_text(printed.getvalue())  # for the test of its closing line
    return runs / "eval"


def test_evaluate_end_to_end_matches_the_trainer(tiny_run: Path, capsys):
    from birdjepa.evaluation.cli import cli
    from birdjepa.train.determinism import machine_kind

    trained = json.loads((tiny_run / "eval" / "5.json").read_text())
    (tiny_run / "eval" / "5.json").unlink()
    cli(tiny_run)
    out = capsys.readouterr().out
    first = json.loads((tiny_run / "eval" / "5.json").read_text())
    assert "random init" in out and "raw log-mel" in out and "wrote" in out
    # The trainer's closing line says how many clips its accuracies are over (a step of 1/24 here).
    closing = (tiny_run.parent / "printed.txt").read_text().splitlines()[-1]
    assert closing.startswith("done: 6 steps in "), closing
    assert "; frozen encoder on the held-out split (24 clips): linear probe " in closing, closing
    assert not (tiny_run / LEASE_FILE).exists()  # it held the run while it wrote into it, and let go
    assert set(first["rows"]) == {"encoder", "random_init", "raw"}
    assert (first["data"]["n_train"], first["data"]["n_eval"], first["data"]["n_classes"]) == (48, 24, 12)
    chance = f"chance {first['data']['chance']:.3f}"  # both say the one level (`chance`'s own test)
    assert f"; {chance}; run directory" in closing and f"({chance})" in out, (closing, out)
    assert first["machine"] == machine_kind()  # where its probes' last bits were computed
    # The command and the trainer's last evaluation score the same checkpoint the same way.
    assert first["rows"] == trained["rows"] and first["metrics"] == trained["metrics"]
    # The trainer logged kNN at every evaluation and the linear probe at the end, beside the baselines.
    lines = [json.loads(x) for x in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    evals = {x["step"]: x for x in lines if "eval/knn_acc" in x}
    assert sorted(evals) == [2, 5]
    assert "eval/linear_acc" not in evals[2] and "eval/knn_acc_random_init" in evals[2]
    assert evals[5]["eval/linear_acc_raw"] == first["metrics"]["eval/linear_acc_raw"]
    # Every step logs the collapse metric.
    assert all(0 < x["train/embedding_rank"] <= 16 for x in lines if "train/embedding_rank" in x)


def test_overlapping_splits_are_named_and_the_table_marked(
    tiny_run: Path, demo_dir: Path, tmp_path: Path, capsys
):
    """Scores on the data the probes were fitted on are not held out: the splits sharing a shard, or
    holding the same data under another name, give one WARNING, a marked table and a note in the JSON."""
    from birdjepa.evaluation.cli import EvalData, cli
    from birdjepa.evaluation.report import overlap
    from birdjepa.pretrain.loop import pretrain

    train = sorted(str(p) for p in (demo_dir / "train").glob("*.arrow"))
    assert overlap((train, train[:1]), ("a", "b")) == (
        f"the train and eval splits share the shard {train[0]}: the eval scores are not held out"
    )
    assert "share the shard" in overlap((train, [train[1], train[0]]), ("a", "b")) and "and 1 more" in (
        overlap((train, [train[1], train[0]]), ("a", "b"))
    )
    assert "hold the same data (fingerprint f)" in overlap((train[:1], ["elsewhere.arrow"]), ("f", "f"))
    assert overlap((train[:1], train[1:2]), ("f", "g")) is None
    copy = tmp_path / "eval-00000.arrow"  # one train shard copied into the eval folder, renamed
    shutil.copy(train[1], copy)
    assert overlap((train, [str(copy)]), ("a", "b")) == (
        f"the eval shard {copy} holds the bytes of the train shard {train[1]}: the eval scores are not "
        "held out"
    )
    # Eight train rows repacked into an eval shard of their own (no shard or byte in common): 1.000, unsaid.
    import pyarrow as pa

    from birdjepa.data.shards import read_shard

    rows = read_shard(Path(train[1])).slice(0, 8)
    repacked = tmp_path / "eval-00001.arrow"
    with pa.OSFile(str(repacked), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as w:
        w.write_table(rows)
    first = sorted(rows.column("recording_id").to_pylist())[0]
    assert overlap((train, [str(repacked)]), ("a", "b")) == (
        f"8 recordings are in the train and the eval split (recording_id and audio, e.g. {first}): the eval "
        "scores are not held out"
    )
    # The same ids with other audio: two splits that each number their files (aaa/0001.wav) share names,
    # not recordings, and were called not held out.
    other = rows.column("audio").take(pa.array([*range(1, 8), 0]))  # each id another row's audio
    renamed = rows.set_column(rows.schema.get_field_index("audio"), "audio", other)
    with pa.OSFile(str(repacked), "wb") as sink, pa.ipc.new_file(sink, rows.schema) as w:
        w.write_table(renamed)
    assert overlap((train, [str(repacked)]), ("a", "b")) is None
    # pretrain (its step compiled for the run above, in this process), with no evaluation at all:
    cfg = tiny_config(demo_dir, tmp_path)
    cfg = dataclasses.replace(
        cfg, eval_every=0, ckpt_every=0, data=dataclasses.replace(cfg.data, eval=train[0])
    )
    capsys.readouterr()
    assert pretrain(cfg) == 0
    said = capsys.readouterr().out.splitlines()
    warnings = [line for line in said if line.startswith("WARNING") and "--optim.warmup-steps" not in line]
    assert len(warnings) == 1 and f"share the shard {train[0]}" in warnings[0]
    # evaluate, on an eval folder that holds a copy of a train shard and a record the loader cannot read:
    # each said once (the record's was printed by the loader, and the JSON said "warnings": []).
    from test_loader_bad_input import read_table, with_corrupt_rows, write_table

    shards = sorted((demo_dir / "eval").glob("*.arrow"))
    (tmp_path / "held-out").mkdir()
    for i, shard in enumerate(shards):
        table = read_table(shard)
        write_table(with_corrupt_rows(table, {0}) if i == 0 else table, tmp_path / "held-out" / shard.name)
    shutil.copy(train[1], tmp_path / "held-out" / "zz-copy.arrow")
    shutil.copy(demo_dir / "eval" / "vocab.json", tmp_path / "held-out")
    out = tmp_path / "overlap.json"
    cli(tiny_run, data=EvalData(eval=str(tmp_path / "held-out")), out=out)
    printed = capsys.readouterr().out.splitlines()
    warnings = sorted(line for line in printed if line.startswith("WARNING"))
    skipped = (
        f"skipped 1 eval record the loader cannot read: {tmp_path / 'held-out' / shards[0].name} row 0: "
    )
    assert len(warnings) == 2, warnings
    assert (
        warnings[0].startswith(f"WARNING {skipped}") and "holds the bytes of the train shard" in warnings[1]
    )
    assert any(line.startswith("NOT HELD OUT: the eval shard") for line in printed), printed
    doc = json.loads(out.read_text())
    assert "holds the bytes of the train shard" in doc["data"]["overlap"]
    assert [w for w in doc["warnings"] if w.startswith(skipped)], doc["warnings"]


def test_a_run_whose_eval_records_all_fail_to_read_stops_saved_at_its_evaluation_in_one_line(
    demo_dir: Path,
    tiny_run: Path,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Labels up front, audio the loader skips: "ValueError: features must be [N, D] with one D, got (4, 64)
    # and (0, 0)", a traceback, exit 1.
    import signal

    from test_loader_bad_input import read_table, with_corrupt_rows, write_table

    from birdjepa.pretrain.loop import pretrain
    from birdjepa.pretrain.trainer import Trainer

    (tmp_path / "eval").mkdir()
    for shard in sorted((demo_dir / "eval").glob("*.arrow")):
        table = read_table(shard)
        write_table(with_corrupt_rows(table, set(range(len(table)))), tmp_path / "eval" / shard.name)
    shutil.copy(demo_dir / "eval" / "vocab.json", tmp_path / "eval")
    good = tiny_config(demo_dir, tmp_path / "runs")  # evaluated after step 2; saved at the last alone
    good = dataclasses.replace(good, ckpt_every=100)
    cfg = dataclasses.replace(good, data=dataclasses.replace(good.data, eval=str(tmp_path / "eval")))
    real = Trainer.evaluate

    def ctrl_c_first(self, params, step):  # noqa: ANN001, ANN202  # as the evaluation runs: said exit 130
        os.kill(os.getpid(), signal.SIGINT)
        return real(self, params, step)

    monkeypatch.setattr(Trainer, "evaluate", ctrl_c_first)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    capfd.readouterr()
    try:
        assert pretrain(cfg) == 2
    finally:
        signal.signal(signal.SIGINT, previous)
        monkeypatch.undo()
    said = capfd.readouterr()
    (error,) = [line for line in said.err.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: the eval split (") and "Ctrl-C: stopping after this step" in said.err
    assert "has no labelled clip (the loader's WARNINGs above name the records it skipped)" in error
    assert error.endswith("(the Ctrl-C's exit is 2 now)"), said.err
    # The 3 steps trained are saved (a stop there lost them, and each resume again), the evaluation not:
    run = good.run_dir
    assert layout.checkpoint_steps(run) == [2], said.out
    assert "stopping after step 2, saved without its evaluation" in said.out and "exit 2" in said.out
    capfd.readouterr()
    assert pretrain(cfg) == 2 and layout.checkpoint_steps(run) == [2]  # its data still unread: no step
    assert "step 2 stays saved without its evaluation: once its data reads" in capfd.readouterr().err
    # Its data mended, the run evaluates step 2 first and trains on, evaluating at step 5 as it would
    # have: every metric as the straight run's.
    capfd.readouterr()
    assert pretrain(good) == 0
    assert "eval step 2: kNN" in capfd.readouterr().out
    diffs = compare_runs(tiny_run, run)
    assert any(d.name == "eval/knn_acc" and d.steps == 2 for d in diffs), diffs
    assert all(d.max_abs == 0.0 for d in diffs), [d for d in diffs if d.max_abs]


def test_an_eval_shard_deleted_under_a_run_stops_it_saved_and_a_ctrl_c_then_says_exit_2(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # The last evaluation's report reads the eval shards by path: deleted under the run (the loaders hold
    # their maps), a FileNotFoundError traceback, every step lost. A Ctrl-C during the save that follows
    # said "exit 130; the same command resumes".
    import signal

    from birdjepa.pretrain import loop as train_loop
    from birdjepa.pretrain.loop import pretrain
    from birdjepa.pretrain.trainer import Trainer

    shutil.copytree(demo_dir / "eval", tmp_path / "eval")
    cfg = tiny_config(demo_dir, tmp_path / "runs")
    cfg = dataclasses.replace(cfg, eval_every=6, ckpt_every=100, eval_linear=False,
                              data=dataclasses.replace(cfg.data, eval=str(tmp_path / "eval")))  # fmt: skip
    real_advance, real_save = train_loop.advance, Trainer.save

    def advance(fns, cfg, state, batch):  # noqa: ANN001, ANN202
        if int(state.step) == 5:
            shutil.rmtree(tmp_path / "eval")
        return real_advance(fns, cfg, state, batch)

    def save(self, state, *args, unevaluated=False, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if unevaluated:
            os.kill(os.getpid(), signal.SIGINT)
        return real_save(self, state, *args, unevaluated=unevaluated, **kwargs)

    monkeypatch.setattr(train_loop, "advance", advance)
    monkeypatch.setattr(Trainer, "save", save)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        assert pretrain(cfg) == 2
    finally:
        signal.signal(signal.SIGINT, previous)
    err = capfd.readouterr().err
    assert "No such file or directory, since the run opened it: the evaluation cannot read its shards" in err
    assert "Ctrl-C: the run is stopping already, exit 2 (the line above says why)" in err, err
    assert layout.checkpoint_steps(cfg.run_dir) == [5]
    monkeypatch.undo()
    # One shard put back: the finished run's next start evaluates step 5 on it, with the closing table,
    # once, and says the eval split is other data than the checkpoint's record (the log had no word).
    (tmp_path / "eval").mkdir()
    for name in ("vocab.json", "eval-00000.arrow"):
        shutil.copy(demo_dir / "eval" / name, tmp_path / "eval" / name)
    assert pretrain(cfg) == 0 and "done: 0 steps" in capfd.readouterr().out
    assert pretrain(cfg) == 0 and "already finished at step 5" in capfd.readouterr().out
    assert [r["step"] for r in read_metrics(cfg.run_dir) if "eval/knn_acc" in r] == [5]
    assert [e["step"] for e in read_metrics(cfg.run_dir) if e.get("event") == "eval_data_changed"] == [6]


def full_disk(write_whole: Callable[..., None]) -> Callable[..., None]:
    """``write_whole`` (`birdjepa.outputs`) whose write meets a full disk after its first bytes."""

    def writes(path: Path, data: object, partial: Path | None = None) -> None:
        def cut_short(at: Path) -> None:
            at.write_bytes(b'{"cut')
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        write_whole(path, cut_short, partial)

    return writes


def test_evaluate_errors_are_clear(tiny_run: Path, demo_dir: Path, tmp_path: Path, capsys, monkeypatch):
    from birdjepa.evaluation.cli import cli

    cases = [
        (tmp_path, {}, f"{tmp_path}: not a run directory (no checkpoints/ folder in it)"),
        # `make demo` names its run demo-<date>-<time>, which the docs call runs/demo: the runs there said.
        (tiny_run.parent / "demo", {}, f"demo: no such folder (runs in {tiny_run.parent}: {tiny_run.name})"),
        (tiny_run, {"step": 1}, "no checkpoint 1; there are [2, 5]"),
        (tiny_run, {"data": "missing"}, "no shard files match '"),
    ]
    for run, kw, message in cases:
        if kw.get("data") == "missing":
            from birdjepa.evaluation.cli import EvalData

            kw = {"data": EvalData(eval=str(tmp_path / "missing")), "out": tmp_path / "m.json"}
        with pytest.raises(SystemExit) as e:
            cli(run, **kw)
        assert e.value.code == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # other data's scores replaced the run's own record
        cli(tiny_run, data=EvalData(eval=str(tiny_run)))
    assert e.value.code == 2 and "--data.train/--data.eval without --out: " in capsys.readouterr().err
    # An audio root that is no folder (the run's, on another node; or one given): one line naming it.
    with pytest.raises(SystemExit) as e:
        cli(tiny_run, data=EvalData(audio_root=str(tmp_path / "gone")))
    assert e.value.code == 2
    said = capsys.readouterr()
    assert f"--data.audio-root {tmp_path / 'gone'}: audio_root must be a folder" in said.err
    assert "CKPT_RESTORE" not in said.out  # refused before the checkpoint was read
    assert not (tiny_run.parent / "demo").exists()  # nothing created by a failed evaluation
    # A newest step folder that is empty (a copy cut short, a stray mkdir): a KeyError's traceback.
    from birdjepa.evaluation.cli import restore_checkpoint

    copy = shutil.copytree(tiny_run, tmp_path / "copy", ignore=shutil.ignore_patterns(LEASE_FILE))
    (copy / "checkpoints" / "9").mkdir()
    with pytest.raises(SystemExit) as e:
        cli(copy, step=9, out=tmp_path / "9.json")
    said = capsys.readouterr().err
    assert e.value.code == 2 and f"{copy / 'checkpoints' / '9'}: its meta and state folders are missing" in (
        said
    )
    assert restore_checkpoint(copy).step == 5
    assert f"WARNING {copy / 'checkpoints' / '9'}: its meta and state" in capsys.readouterr().out
    # Its record on a full disk: a traceback, and the earlier record cut short (4 KiB of broken JSON).
    from birdjepa.evaluation import report

    out = tmp_path / "earlier.json"
    out.write_text('{"earlier": true}\n')
    with monkeypatch.context() as m:
        m.setattr(report, "write_whole", full_disk(report.write_whole))
        with pytest.raises(SystemExit) as e:
            cli(copy, step=5, out=out)
    said = f"birdjepa evaluate: error: cannot write {out}: No space left on device ("
    err = capsys.readouterr().err
    assert e.value.code == 74 and err.startswith(said) and err.endswith("what it held before is kept\n"), err
    assert out.read_text() == '{"earlier": true}\n' and sorted(p.name for p in tmp_path.glob("*.json")) == [
        "earlier.json"
    ]  # no partial file beside it
    # The run's data moved (or its relative path read from another folder): "[Errno 2] No such file or
    # directory: 'data/train'" after the restore, or the labels of a folder not there said to differ.
    shutil.rmtree(copy / "checkpoints" / "9")
    for meta_file in copy.glob("checkpoints/*/meta/metadata"):
        meta = json.loads(meta_file.read_text())
        meta["config"]["data"]["train"] = "moved/train/*.arrow"  # a pattern, as the README writes them
        meta["config"]["data"]["eval"] = "moved/eval"
        rewrite_meta(meta_file, {k: v for k, v in meta.items() if k != "meta_crc"})
    with pytest.raises(SystemExit) as e:
        cli(copy, out=tmp_path / "moved.json")
    said = capsys.readouterr().err
    assert e.value.code == 2, said
    assert said.startswith(
        f"birdjepa evaluate: error: {copy} trained on --data.train 'moved/train/*.arrow' and --data.eval "
        "'moved/eval', not there now (no shard files match 'moved/train/*.arrow' (a relative path: read from "
    ), said
    assert "; no shard files match 'moved/eval' (a relative path: read from " in said, said
    assert said.endswith(
        "): give where they are now, --data.train PATH --data.eval PATH with --out FILE\n"
    ), said
    # A train split of one class: every row at chance, "converged" in 0 iterations, exit 0.
    import pyarrow as pa
    import pyarrow.compute as pc

    from birdjepa.data.shards import read_shard
    from birdjepa.evaluation.cli import EvalData

    table = read_shard(a_demo_shard_beside_its_vocabulary(demo_dir, tmp_path / "one"))
    table = table.filter(pc.equal(table["ebird_code"], table["ebird_code"][0]))
    one = tmp_path / "one" / "one.arrow"
    with pa.OSFile(str(one), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(SystemExit) as e:
        cli(tiny_run, data=EvalData(train=str(one)), out=tmp_path / "one.json")
    said = capsys.readouterr().err
    assert e.value.code == 2 and "holds clips of one class: a probe has nothing to tell apart" in said, said
    with pytest.raises(SystemExit) as e:  # a traceback once the evaluation was done
        cli(tiny_run, out=tmp_path)
    assert e.value.code == 2 and f"{tmp_path}: is a folder, not a file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # the run's batch size, said nowhere
        cli(tiny_run, batch_size=0)
    assert e.value.code == 2 and "--batch-size 0: must be >= 1" in capsys.readouterr().err
    # Above the loader's bounds: its traceback once the checkpoint was restored.
    for kw, said in (
        ({"n_workers": 100_000}, "--n-workers 100000: n_workers must be in 0..=1024"),
        ({"batch_size": 10**6}, "--batch-size 1000000: batch_size x n_views x n_frames"),
    ):
        with pytest.raises(SystemExit) as e:
            cli(tiny_run, **kw)
        assert e.value.code == 2 and said in capsys.readouterr().err
    # Writing into a run another live process holds (a trainer) is refused at once, in one line.
    holder = subprocess.Popen(["sleep", "60"])
    lease = {"host": socket.gethostname(), "pid": holder.pid, "job": None, "started": time.time(),
             "token": "0123456789abcdef", "heartbeat": time.time()}  # fmt: skip
    (tiny_run / LEASE_FILE).write_text(json.dumps(lease))
    try:
        with pytest.raises(SystemExit) as e:
            cli(tiny_run)
        assert e.value.code == 2
        assert f"is held by pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
        (tiny_run / LEASE_FILE).unlink()


def test_a_train_split_too_thin_for_the_protocol_is_said() -> None:
    from birdjepa.evaluation.report import Row, thin_train_split

    held = {"linear": Row("raw", 2, 0.5, 0.5, 0.5, 0.5, {"folds": [2, 2]})}
    assert thin_train_split(np.array([0, 0, 1, 1]), np.array([0, 1]), held) == []
    said = thin_train_split(
        np.array([0, 1]), np.array([0, 1, 2, 2]), {"raw": Row("raw", 2, 0, 0, 0, 0, {"folds": []})}
    )
    assert said == [
        "1 eval classes have no train clip (classes 2): their 2 clips count as wrong in every row",
        "too few train clips per class to hold any out: the linear probe's C was not chosen by "
        "cross-validation, it is 1.0",
    ]
    named = thin_train_split(np.array([0, 1]), np.array([2]), held, ["boumex", "klymex", "skuplo"])
    assert named == ["1 eval classes have no train clip (classes skuplo): their 1 clips count as wrong in "
                     "every row"]  # fmt: skip


def test_what_an_eval_row_holds_past_its_one_label_is_said(birdset_dir: Path, tmp_path: Path) -> None:
    # BirdSet's soundscape windows hold several species, each scored against its ebird_code alone, and a
    # run with another clip length saw part of each window (or zeros past it): all unsaid, exit 0.
    import pyarrow as pa

    from birdjepa.data import Features
    from birdjepa.evaluation.report import what_a_row_holds_past_its_label

    test = sorted(str(f) for f in (birdset_dir / "SYN1" / "test_5s").glob("*.arrow"))
    lists = [
        x for f in test for x in pa.ipc.open_file(f).read_all().column("ebird_code_multilabel").to_pylist()
    ]
    several = sum(len(x or []) > 1 for x in lists)
    assert several > 0
    said = f"{several} of the eval split's {len(lists)} rows hold several species (ebird_code_multilabel): "
    assert what_a_row_holds_past_its_label(test, Features()) == [
        said + "each is scored against its one label; `birdjepa benchmark` scores every species (cmAP)"
    ]
    # Windows of 2, 5 and 8 s (one row without a bound keeps its centre crop), against a 5 s clip.
    shard = tmp_path / "w.arrow"
    table = pa.table({"start_time": [0.0, 1.0, 2.0, None], "end_time": [2.0, 6.0, 10.0, 3.0]})
    with pa.ipc.new_file(shard, table.schema) as f:
        f.write_table(table)
    assert what_a_row_holds_past_its_label([str(shard)], Features()) == [
        "1 eval rows have windows longer than the encoder's 5 s clip (up to 8 s): each is scored on its "
        "window's first 5 s",
        "1 eval rows have windows shorter than the encoder's 5 s clip (down to 2 s): past its window's end "
        "each clip is zeros",
    ]


def test_a_run_s_relative_data_read_from_another_folder_is_refused(
    tiny_run: Path,
    demo_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # config.json keeps --data.train as given: from another folder, data/train was another set, scored
    # with exit 0 as the run's own split. The module's run, its splits recorded as relative paths (as a
    # run started with them records them; its fingerprints are the ones it trained and evaluated on).
    from birdjepa.evaluation.cli import EvalData, cli

    (tmp_path / "elsewhere" / "data").mkdir(parents=True)
    (tmp_path / "elsewhere" / "data" / "train").symlink_to(demo_dir / "eval")
    (tmp_path / "elsewhere" / "data" / "eval").symlink_to(demo_dir / "train")
    run = shutil.copytree(tiny_run, tmp_path / "run", ignore=shutil.ignore_patterns(LEASE_FILE))
    for meta_file in run.glob("checkpoints/*/meta/metadata"):
        meta = json.loads(meta_file.read_text())
        meta["config"]["data"] |= {"train": "data/train", "eval": "data/eval"}
        rewrite_meta(meta_file, {k: v for k, v in meta.items() if k != "meta_crc"})
    monkeypatch.chdir(tmp_path / "elsewhere")
    # The train split given where it is, the eval split read from here: another set, scored, exit 0.
    for given, option in ((EvalData(), "train"), (EvalData(train=str(demo_dir / "train")), "eval")):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            cli(run, data=given, out=tmp_path / "e.json")
        err = capsys.readouterr().err
        said = f"'data/{option}', the {option} split its config names, holds other data here"
        assert e.value.code == 2 and said in err, err
        assert err.rstrip().endswith("or give --data.train PATH --data.eval PATH with --out FILE"), err
        assert not (tmp_path / "e.json").exists()
    # Followed (it left --out out, which a run's other data needs), the run's own numbers.
    both = EvalData(train=str(demo_dir / "train"), eval=str(demo_dir / "eval"))
    cli(run, data=both, out=tmp_path / "e.json")
    scored = json.loads((tmp_path / "e.json").read_text())
    trained = json.loads(layout.eval_report(run, 5).read_text())
    knn = [{name: row["knn_acc"] for name, row in doc["rows"].items()} for doc in (scored, trained)]
    assert knn[0] == knn[1], knn


def test_load_encoder_sets_the_command_s_xla_flags_and_says_where_jax_started_first(
    tiny_run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A script's load_encoder ran with XLA's defaults, not the CLI's flags: 33 of 72 rows of its
    # embeddings differed from `birdjepa embed`'s by 3e-7, where the docs promise them bit for bit.
    import sys

    import birdjepa

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PJRT_NPROC")}
    code = "import os, sys, birdjepa; birdjepa.load_encoder(sys.argv[1]); print(os.environ['XLA_FLAGS'])"
    done = subprocess.run([sys.executable, "-c", code, str(tiny_run)], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--xla_cpu_multi_thread_eigen=false" in done.stdout and "WARNING" not in done.stdout, done.stdout
    # Late: in this process, whose JAX has started, the flags unset (monkeypatch restores them).
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.delenv("PJRT_NPROC")
    jnp.zeros(1).block_until_ready()
    capsys.readouterr()
    birdjepa.load_encoder(tiny_run)
    late = "WARNING birdjepa.load_encoder: JAX started before it could set --xla_cpu_multi_thread_eigen=false"
    assert capsys.readouterr().out.startswith(late)


def test_embed_ends_a_clip_at_its_row_s_window_and_says_where_windows_are_shorter_than_clips(
    tiny_run: Path, demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A row's 2 s window was written as 5 s long (start + clip), its clip's zeros past the window unsaid.
    import pyarrow as pa
    import pyarrow.parquet as pq

    import birdjepa
    from birdjepa.export.cli import embed

    shard = sorted((demo_dir / "eval").glob("*.arrow"))[0]
    table = pa.ipc.open_file(shard).read_all()
    n = len(table)
    windowed = [i % 2 == 0 for i in range(n)]
    table = table.append_column("start_time", pa.array([0.0 if w else None for w in windowed], pa.float64()))
    table = table.append_column("end_time", pa.array([2.0 if w else None for w in windowed], pa.float64()))
    (tmp_path / "w").mkdir()
    with pa.ipc.new_file(tmp_path / "w" / shard.name, table.schema) as f:
        f.write_table(table)
    shutil.copy(demo_dir / "eval" / "vocab.json", tmp_path / "w")
    capsys.readouterr()
    assert embed(str(tmp_path / "w"), birdjepa.load_encoder(tiny_run), tmp_path / "e.parquet") == n
    out = pq.read_table(tmp_path / "e.parquet")
    rows, start, end = (out.column(c).to_numpy() for c in ("row", "start_s", "end_s"))
    w = np.asarray(windowed)[rows]
    assert np.array_equal(start[w], np.zeros(w.sum())) and np.array_equal(end[w], np.full(w.sum(), 2.0))
    assert np.array_equal(end[~w], start[~w] + 5.0)  # a centre crop: the encoder's whole clip
    said = f"WARNING {w.sum()} rows' windows are shorter than the encoder's 5 s clip: past each window's end"
    assert said in capsys.readouterr().out


def test_export_load_and_embed_give_evaluates_embeddings(
    tiny_run: Path, demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    import pyarrow.parquet as pq

    import birdjepa
    from birdjepa.data.shards import read_shard
    from birdjepa.evaluation.cli import embed_splits, restore_run
    from birdjepa.evaluation.report import ENCODER
    from birdjepa.export.cli import embed, export

    run = restore_run(tiny_run)
    _, held_out = embed_splits(
        run.train_files[:1], run.eval_files, {ENCODER: run.params}, run.model_cfg, run.cfg.data.features,
        seed=run.cfg.seed, batch_size=run.cfg.data.batch_size, n_workers=2,
    )  # fmt: skip
    evaluated = held_out.features[ENCODER]
    folder = export(tiny_run, tmp_path / "export")
    card = json.loads((folder / "encoder.json").read_text())
    assert card["identity"].startswith("run:eval@5#") and card["checkpoint"]["step"] == 5
    from safetensors.numpy import load_file

    names = set(load_file(folder / "model.safetensors"))  # as docs/export.md shows them
    assert "encoder/block_0/attn/qkv/kernel" in names and all(n.startswith("encoder/") for n in names)
    assert {"encoder/registers", "encoder/block_0/mlp/gate/kernel", "encoder/block_0/scale1/scale"} <= names
    assert card["model"]["rope"] and card["model"]["qk_norm"] and card["model"]["registers"] == 2
    for source in (folder, tiny_run):  # an export, and the run itself
        encoder = birdjepa.load_encoder(source)
        assert encoder.identity == card["identity"]
        out = tmp_path / f"{source.name}.parquet"
        assert embed(str(demo_dir / "eval"), encoder, out) == len(evaluated)
        table = pq.read_table(out)
        vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        assert np.array_equal(vectors, evaluated)  # bit for bit
        # Each clip named by its shard and its row there.
        shards = sorted(str(p) for p in (demo_dir / "eval").glob("*.arrow"))
        rows = list(zip(table.column("source").to_pylist(), table.column("row").to_pylist(), strict=True))
        assert rows == [(s, r) for s in shards for r in range(len(read_shard(Path(s))))]
        # And by its label, as the shard holds it and vocab.json names it: what a researcher joins on.
        vocab = json.loads((demo_dir / "eval" / "vocab.json").read_text())["names"]
        labels = [x for s in shards for x in read_shard(Path(s)).column("ebird_code").to_pylist()]
        assert table.column("label").to_pylist() == labels
        assert table.column("label_name").to_pylist() == [None if x is None else vocab[x] for x in labels]
        ids = [x for s in shards for x in read_shard(Path(s)).column("recording_id").to_pylist()]
        assert table.column("recording_id").to_pylist() == ids and all(ids)  # prepare's id of each row
        assert table.schema.metadata[b"encoder"].decode() == card["identity"]
    # Its patch tokens, beside the same embedding bits (the registers leave).
    m = encoder.model.resolved()
    x = np.random.default_rng(0).normal(size=(3, m.n_frames, m.n_mels)).astype(np.float32)
    pooled, tokens = encoder.with_tokens(x)
    assert np.array_equal(pooled, encoder(x)) and tokens.shape == (3, m.n_patches, m.dim)
    with pytest.raises(ValueError, match=r"got shape \(512, 128\)$"):  # was the padded chunk's (16, 128)
        encoder(x[0])
    with pytest.raises(ValueError, match=r"got shape \(3, 100, 128\)$"):  # a T the patch does not divide
        encoder(x[:, :100])
    # Audio files and waveforms go through the loader window by window: 12 s -> 0-5, 5-10, 10-12 s.
    import soundfile

    rate = 22050
    t = np.arange(12 * rate) / rate
    chirp = (0.3 * np.sin(2 * np.pi * (1000 + 400 * t) * t)).astype(np.float32)
    (tmp_path / "audio").mkdir()
    soundfile.write(tmp_path / "audio" / "chirp.wav", chirp, rate, subtype="FLOAT")
    windows = encoder.embed_audio([tmp_path / "audio" / "chirp.wav"])
    assert windows["start_s"].tolist() == [0.0, 5.0, 10.0] and windows["end_s"].tolist() == [5.0, 10.0, 12.0]
    assert np.array_equal(encoder.embed_waveform(chirp, rate), windows["embedding"])
    assert not np.array_equal(windows["embedding"][0], windows["embedding"][1])  # the chirp moves
    # An encoder exported before --data.features.gapless reads an MP3 as its run did: with the codec's
    # delay and padding (1105 and less than a frame of 1152), so its last window ends that much later
    # (the windows embed_audio reads, without the embedding).
    from birdjepa.export.encoder import window_shard

    before = tmp_path / "exported-before"
    shutil.copytree(folder, before)
    card_then = {**card, "features": {k: v for k, v in card["features"].items() if k != "gapless"}}
    (before / "encoder.json").write_text(json.dumps(card_then))
    soundfile.write(tmp_path / "chirp.mp3", chirp, rate, format="MP3")
    then = birdjepa.load_encoder(before)
    ends = [
        window_shard([("c", tmp_path / "chirp.mp3")], e.features, tmp_path)[1][-1][2] for e in (encoder, then)
    ]
    assert card["features"]["gapless"] and not then.features.gapless
    assert ends[0] == 12.0 and 1105 < (ends[1] - 12.0) * rate < 1105 + 1152
    # A window the loader cannot read (a NaN sample) is left out, and said; its embedding was zeros,
    # exit 0, and a file of no readable window "embedded" as zeros too.
    damaged = chirp.copy()
    damaged[7 * rate] = np.nan
    soundfile.write(tmp_path / "nan.wav", damaged, rate, subtype="FLOAT")
    capsys.readouterr()
    kept = encoder.embed_audio([tmp_path / "nan.wav"])
    assert kept["start_s"].tolist() == [0.0, 10.0] and np.array_equal(
        kept["embedding"], windows["embedding"][[0, 2]]
    )
    said = capsys.readouterr().out  # the window's file, seconds and why; not the temporary shard's row
    assert f"WARNING left out 1 window(s) the loader cannot read: {tmp_path / 'nan.wav'} 5-10 s (" in said
    assert "windows.arrow" not in said and said.count("WARNING") == 1, said
    with pytest.raises(DataError, match="the waveform has windows the loader cannot read"):
        encoder.embed_waveform(damaged, rate)
    # int16 PCM read as floats of +-32767 without a word; a rate of 0, libsndfile's error.
    with pytest.raises(DataError, match="the waveform is int16: give float samples in"):
        encoder.embed_waveform((chirp * 32767).astype(np.int16), rate)
    with pytest.raises(DataError, match="rate 0: give the waveform's sample rate in Hz"):
        encoder.embed_waveform(chirp, 0)
    for shape in ((1, -1), (2, -1), (1, 1, -1)):  # channels first: libsndfile's "Format not recognised"
        with pytest.raises(
            DataError, match=r"the waveform's shape is \(.*\): give \[samples\] or \[samples,"
        ):
            encoder.embed_waveform(np.resize(chirp, (*shape[:-1], len(chirp))), rate)
    soundfile.write(tmp_path / "allnan.wav", np.full(rate, np.nan, np.float32), rate, subtype="FLOAT")
    with pytest.raises(
        DataError, match=rf"no window of {re.escape(str(tmp_path / 'allnan.wav'))} can be read"
    ):
        encoder.embed_audio([tmp_path / "allnan.wav"])
    # A folder embeds the files `prepare` would pack: macOS's "._" sidecar beside a copy is no recording.
    (tmp_path / "audio" / "._chirp.wav").write_bytes(b"\x00\x05\x16\x07" + bytes(60))
    assert embed(str(tmp_path / "audio"), encoder, tmp_path / "audio.parquet") == 3
    audio_table = pq.read_table(tmp_path / "audio.parquet")
    assert audio_table.column("label").null_count == audio_table.column("label_name").null_count == 3
    assert audio_table.column("recording_id").null_count == 3  # a file's id is its path, in `source`
    # A folder of audio files beside a shard: the audio is embedded (the shard was left out unsaid).
    shutil.copy(next((demo_dir / "eval").glob("*.arrow")), tmp_path / "audio" / "x.arrow")
    assert embed(str(tmp_path / "audio"), encoder, tmp_path / "audio.parquet") == 3
    assert "holds 1 shard(s) too (x.arrow): its 1 audio file(s) are embedded" in capsys.readouterr().out
    # One audio file, named: it was read as a shard ("not an Arrow IPC shard").
    one = next(p for p in sorted((tmp_path / "audio").glob("*.wav")) if not p.name.startswith("."))
    assert embed(str(one), encoder, tmp_path / "one.parquet") >= 1
    assert set(pq.read_table(tmp_path / "one.parquet").column("source").to_pylist()) == {str(one)}


def test_embed_reads_shards_whose_rows_name_their_audio_under_another_root(
    tiny_run: Path, birdset_dir: Path, tmp_path: Path
) -> None:
    # A hub's cache of BirdSet kept apart from its extracted files: embed had no --audio-root ("no row
    # of the 1 shard file(s) could be read"), where benchmark and pretrain have one.
    import pyarrow.parquet as pq
    from path_only import path_only

    import birdjepa
    from birdjepa.data import DataError
    from birdjepa.export.cli import embed

    (shard, *_) = sorted((birdset_dir / "SYN1" / "train").glob("*.arrow"))
    root = tmp_path / "archive"
    moved = path_only(shard, tmp_path / "cache" / shard.name, root / "extracted", relative_to=root)
    encoder = birdjepa.load_encoder(tiny_run)
    embed(str(shard), encoder, tmp_path / "bytes.parquet")
    with pytest.raises(DataError, match="could be read"):
        embed(str(moved), encoder, tmp_path / "nowhere.parquet")
    assert embed(str(moved), encoder, tmp_path / "paths.parquet", audio_root=str(root)) > 0
    vectors = [
        pq.read_table(tmp_path / f"{name}.parquet").column("embedding").to_pylist()
        for name in ("bytes", "paths")
    ]
    assert vectors[0] == vectors[1]


def test_the_windows_of_an_audio_file_name_it_by_path_not_each_a_copy(tmp_path: Path) -> None:
    # Each window's row held the whole file: an hour-long recording's 720 rows made a 166 GB shard
    # (extrapolated; 6.3 GB of memory measured at 8 minutes).
    import soundfile

    from birdjepa.data import Features
    from birdjepa.export.encoder import window_shard

    wav = tmp_path / "minute.wav"
    soundfile.write(wav, np.zeros(60 * 16000, np.float32), 16000, subtype="FLOAT")  # 3.8 MB, 12 windows
    shard, where = window_shard([("minute", wav)], Features(clip_seconds=5.0), tmp_path)
    assert len(where) == 12 and Path(shard).stat().st_size < 20_000
    # A last window shorter than a log-mel frame holds none: 10 s and one sample at 44.1 kHz was three
    # windows, the third one sample long (0.7 at 32 kHz), embedded as a map of padding.
    soundfile.write(wav, np.zeros(441_001, np.float32), 44_100, subtype="FLOAT")
    _, where = window_shard([("ten", wav)], Features(clip_seconds=5.0), tmp_path)
    assert [w[1:] for w in where] == [(0.0, 5.0), (5.0, 10.0)]


def test_backbone_identities_tell_encoders_apart_and_one_encoder_is_named_once(
    tiny_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import birdjepa.evaluation.cli
    from birdjepa.benchmark.backbones import BackboneError, resolve

    # The same checkpoint twice (RUN and RUN@STEP) filled the cache with both, then failed, and every
    # later call on that store read the poisoned cache.
    with pytest.raises(BackboneError, match=rf"{tiny_run} and {tiny_run}@5 are one encoder \(run:eval@5#"):
        resolve([str(tiny_run), f"{tiny_run}@5"])
    # Random init of two runs of one name whose options differ without another weight (an input
    # normalisation): one identity, and the second read the first's scores from the store.
    (plain,) = resolve([f"random:{tiny_run}"])
    restore = birdjepa.evaluation.cli.restore_checkpoint

    def other_input_norm(*args: object) -> object:
        r = restore(*args)
        return dataclasses.replace(r, model_cfg=dataclasses.replace(r.model_cfg, input_norm="clip"))

    monkeypatch.setattr(birdjepa.evaluation.cli, "restore_checkpoint", other_input_norm)
    (other,) = resolve([f"random:{tiny_run}"])
    assert plain.identity.startswith("random:eval#") and other.identity != plain.identity
    # A run named from inside it (`birdjepa export .`): "run:@5" in every embedding file made with it.
    from birdjepa.export.encoder import checkpoint_identity

    monkeypatch.chdir(tiny_run)
    assert checkpoint_identity(Path("."), 5, {"hashes": []}).startswith("run:eval@5#")


def test_a_live_run_s_newest_checkpoint_removed_while_it_is_read_gives_way_to_the_next_newest(
    tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A trainer keeping one checkpoint (--ckpt-keep 1) removes the newest as it saves the next: export,
    # evaluate and embed said "no complete checkpoint" on a run full of them.
    from birdjepa.export.cli import export
    from birdjepa.export.encoder import ExportError
    from birdjepa.rundir.checkpoint import Checkpointer

    run = tmp_path / "live"
    shutil.copytree(tiny_run, run)
    with Checkpointer(run, keep=None, async_save=False) as ckpt:
        steps = ckpt.all_steps()
    read_meta, removed = Checkpointer.read_meta, []

    def rotated_meanwhile(self: Checkpointer, step: int) -> dict:
        if not removed:
            removed.append(step)
            shutil.rmtree(run / "checkpoints" / str(step))
        return read_meta(self, step)

    monkeypatch.setattr(Checkpointer, "read_meta", rotated_meanwhile)
    card = json.loads((export(run, tmp_path / "export") / "encoder.json").read_text())
    assert removed == [steps[-1]] and card["checkpoint"]["step"] == steps[-2]
    # Another encoder's export is not replaced without a word (the same one is written again).
    monkeypatch.undo()
    export(run, tmp_path / "export", steps[-2])
    with pytest.raises(ExportError, match=f"{tmp_path / 'export'} holds the export of run:live@{steps[-2]}#"):
        export(tiny_run, tmp_path / "export")
    monkeypatch.undo()
    # The newer committed first, the one read removed under the read, its folder not yet gone ("arrays
    # unreadable", exit 2: a helper's live run, 1 read in 4); and Orbax's listing meeting a folder as it
    # went (a FileNotFoundError's traceback from the checkpointer's start).
    run = tmp_path / "live2"
    shutil.copytree(tiny_run, run)
    newer = tmp_path / "newer"
    (run / "checkpoints" / str(steps[-1])).rename(newer)  # committed once the read began
    restore, init, calls = Checkpointer.restore, Checkpointer.__init__, []

    def committed_and_rotated(self: Checkpointer, step: int, template: object) -> object:
        if calls == ["init"]:
            calls.append(step)
            newer.rename(run / "checkpoints" / str(steps[-1]))
            for f in (run / "checkpoints" / str(step) / "state").rglob("*"):
                if f.is_file():
                    f.write_bytes(b"")
        return restore(self, step, template)

    def listing_met_a_removal(self: Checkpointer, *args: object, **kw: object) -> None:
        if not calls:
            calls.append("init")
            raise FileNotFoundError(2, "No such file or directory", str(run / "checkpoints" / "1"))
        init(self, *args, **kw)

    monkeypatch.setattr(Checkpointer, "restore", committed_and_rotated)
    monkeypatch.setattr(Checkpointer, "__init__", listing_met_a_removal)
    card = json.loads((export(run, tmp_path / "export2") / "encoder.json").read_text())
    assert calls == ["init", steps[-2]] and card["checkpoint"]["step"] == steps[-1]


def test_export_and_embed_errors_are_one_line(
    tiny_run: Path,
    demo_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A damaged newest checkpoint, a missing source and an output that cannot be written: one line
    naming the path and exit 2; an output or a source that cannot work fails before the restore."""
    import birdjepa.export.cli
    from birdjepa.cli import main

    def one_line(args: list[str], command: str, *names: object) -> str:
        with pytest.raises(SystemExit) as e:
            main(args)
        err = capsys.readouterr().err
        assert e.value.code == 2, err
        assert err.startswith(f"birdjepa {command}: error: ") and err.count("\n") == 1, err
        assert all(str(n) in err for n in names) and "Traceback" not in err, err
        return err

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_run, damaged)
    arrays = damaged / "checkpoints" / "5" / "state" / "ocdbt.process_0" / "d"
    biggest = max(arrays.iterdir(), key=lambda f: f.stat().st_size)
    with biggest.open("r+b") as f:
        f.truncate(1000)
    where = damaged / "checkpoints" / "5"
    args = ["export", str(damaged), "--out", str(tmp_path / "e")]
    one_line([*args, "--step", "5"], "export", where, "arrays unreadable")
    assert not (tmp_path / "e").exists()  # nothing made for a run that cannot be exported
    shards = str(demo_dir / "eval")
    out = tmp_path / "e.parquet"
    one_line(["embed", shards, "--encoder", str(damaged), "--step", "5", "--out", str(out)], "embed", where)
    # The newest asked for: the newest that verifies, as a resume picks it (was exit 2), and said.
    main(args)
    said = capsys.readouterr().out
    assert f"WARNING {where}: arrays unreadable" in said and "reading checkpoint 2, the newest before" in said
    assert json.loads((tmp_path / "e" / "encoder.json").read_text())["checkpoint"]["step"] == 2
    # A pipe as --out: Parquet's "lseek failed" once every embedding was computed.
    os.mkfifo(tmp_path / "fifo")
    one_line(["embed", shards, "--encoder", str(tiny_run), "--out", str(tmp_path / "fifo")], "embed",
             f"{tmp_path / 'fifo'}: is no regular file (a pipe, a device)")  # fmt: skip
    # A folder listing a link to nowhere (a traceback from the read).
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "gone.wav").symlink_to(tmp_path / "nowhere.wav")
    one_line(["embed", str(tmp_path / "linked"), "--encoder", str(tiny_run), "--out", str(out)], "embed",
             "gone.wav: cannot read: No such file or directory")  # fmt: skip
    # Shards none of whose rows can be read (a traceback: nothing to concatenate).
    from test_loader_bad_input import read_table, with_corrupt_rows, write_table

    (tmp_path / "unreadable").mkdir()
    table = read_table(sorted((demo_dir / "eval").glob("*.arrow"))[0])
    write_table(with_corrupt_rows(table, set(range(len(table)))), tmp_path / "unreadable" / "a.arrow")
    shutil.copy(demo_dir / "eval" / "vocab.json", tmp_path / "unreadable")
    one_line(["embed", str(tmp_path / "unreadable"), "--encoder", str(tiny_run), "--out", str(out)], "embed",
             "no row of the 1 shard file(s) could be read: nothing to embed")  # fmt: skip
    from birdjepa.export.cli import export

    folder = export(tiny_run, tmp_path / "export")  # of step 5: its step was embedded, exit 0
    one_line(["embed", shards, "--encoder", str(folder), "--step", "2", "--out", str(out)], "embed", folder,
             "an export of step 5, not of the step 2 asked for")  # fmt: skip
    # Another encoder's embeddings, replaced without a word (export refuses its own case).
    main(["embed", shards, "--encoder", str(tiny_run), "--step", "2", "--out", str(tmp_path / "two.parquet")])
    one_line(["embed", shards, "--encoder", str(folder), "--out", str(tmp_path / "two.parquet")], "embed",
             f"{tmp_path / 'two.parquet'} holds the embeddings of run:eval@2#")  # fmt: skip
    # A file that holds no embeddings (the input shard itself, notes): replaced by Parquet, exit 0.
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    one_line(["embed", shards, "--encoder", str(folder), "--out", str(notes)], "embed",
             f"{notes} exists and holds no embeddings birdjepa wrote")  # fmt: skip
    assert notes.read_text() == "mine"
    # A folder of other files (a run directory: its `embed` then read the stray card's step).
    one_line(["export", str(tiny_run), "--out", str(tiny_run)], "export", "holds files no export wrote")
    assert not (tiny_run / "encoder.json").exists()
    # A card cut short (a write killed): the export that mends it is not refused for it.
    shutil.copytree(folder, tmp_path / "mend")
    os.truncate(tmp_path / "mend" / "encoder.json", 24)
    assert export(tiny_run, tmp_path / "mend") == tmp_path / "mend"
    assert "encoder.json: not an export's card" in capsys.readouterr().out
    assert json.loads((tmp_path / "mend" / "encoder.json").read_text()) == json.loads(
        (folder / "encoder.json").read_text()
    )
    # Readable by others as any file the user writes (safetensors made it 0600, for the colleague it is for).
    umask = os.umask(0)
    os.umask(umask)
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    # A damaged export: tracebacks, one naming no file.
    card = json.loads((folder / "encoder.json").read_text())
    for name, damage, said in (
        ("nowts", lambda f: (f / "model.safetensors").unlink(), "model.safetensors: cannot be read"),
        ("cutwts", lambda f: os.truncate(f / "model.safetensors", 1000), "model.safetensors: cannot be read"),
        ("cutcard", lambda f: os.truncate(f / "encoder.json", 24), "encoder.json: not an export's card"),
        ("otherdim", lambda f: (f / "encoder.json").write_text(json.dumps({**card, "model": {**card["model"],
         "dim": 32}})), "model.safetensors: not the weights of the model"),
        # Hand edits: a KeyError's, a ValueError's or the loader's traceback.
        ("nomodel", lambda f: (f / "encoder.json").write_text(json.dumps({**card, "model": None})),
         "encoder.json: its 'model' must be a JSON object, not null"),
        ("nobatch", lambda f: (f / "encoder.json").write_text(json.dumps({**card, "batch_size": "eight"})),
         "encoder.json: its 'batch_size' must be a JSON integer, not \"eight\""),
        ("mels", lambda f: (f / "encoder.json").write_text(json.dumps({**card, "features": {
         **card["features"], "n_mels": 64}})), "encoder.json: --model.n-mels 128: the model is built"),
    ):  # fmt: skip
        shutil.copytree(folder, tmp_path / name)
        damage(tmp_path / name)
        one_line(["embed", shards, "--encoder", str(tmp_path / name), "--out", str(out)], "embed",
                 tmp_path / name / said.split(":")[0], said)  # fmt: skip
    # Checked before the (slow) restore: neither command gets that far.
    monkeypatch.setattr(birdjepa.export.cli, "load_encoder", lambda *a: pytest.fail("the encoder loaded"))
    monkeypatch.setattr("birdjepa.evaluation.cli.restore_checkpoint", lambda *a: pytest.fail("restored"))
    afile = tmp_path / "afile"
    afile.write_text("")
    one_line(["export", str(tiny_run), "--out", str(afile)], "export", afile, "exists and is not a folder")
    one_line(["export", str(tiny_run), "--out", str(afile / "enc")], "export", afile / "enc",
             "cannot be written")  # fmt: skip
    one_line(["embed", shards, "--encoder", str(tiny_run), "--out", str(afile / "e.parquet")], "embed",
             afile / "e.parquet", "cannot be written")  # fmt: skip
    nowhere = tmp_path / "nosuchpath"
    one_line(["embed", str(nowhere), "--encoder", str(tiny_run), "--out", str(out)], "embed", nowhere,
             "no shard files match")  # fmt: skip
    (tmp_path / "empty").mkdir()  # "no shard files match": as if audio files were not read at all
    one_line(["embed", str(tmp_path / "empty"), "--encoder", str(tiny_run), "--out", str(out)], "embed",
             tmp_path / "empty", "a folder with neither audio files (.aif, .aifc, .aiff, .flac")  # fmt: skip
    one_line(["embed", shards, "--encoder", str(tiny_run), "--out", str(out), "--n-workers", "-1"], "embed",
             "--n-workers -1: must be >= 0")  # fmt: skip
    one_line(["embed", shards, "--encoder", str(tiny_run), "--out", str(out), "--n-workers", "100000"],
             "embed", "--n-workers 100000: n_workers must be in 0..=1024")  # fmt: skip
    assert not out.exists()


def hf_birdset_split(birdset_dir: Path, task: str, split: str, out: Path) -> Path:
    """One split of the stand-in written again by HF `datasets` with BirdSet's features; returns the
    .arrow file (with the task's vocab.json beside it)."""
    import pyarrow as pa
    from datasets import Audio, ClassLabel, Dataset, Sequence, Value
    from datasets import Features as HFFeatures

    from birdjepa.data.shards import read_shard

    folder = birdset_dir / task / split
    table = pa.concat_tables([read_shard(p) for p in sorted(folder.glob("*.arrow"))])
    names = json.loads((folder / "vocab.json").read_text())["names"]
    features = HFFeatures({
        "audio": {"bytes": Value("binary"), "path": Value("string")},
        "filepath": Value("string"),
        "start_time": Value("float64"),
        "end_time": Value("float64"),
        "ebird_code": ClassLabel(names=names),
        "ebird_code_multilabel": Sequence(ClassLabel(names=names)),
    })  # fmt: skip
    rows = {name: table.column(name).to_pylist() for name in features}
    ds = Dataset.from_dict(rows, features=features).cast_column("audio", Audio(decode=False))
    ds.save_to_disk(str(out))
    (arrow,) = out.glob("*.arrow")
    (out / "vocab.json").write_text(json.dumps({"names": names}))
    return arrow


@pytest.mark.slow  # the users' command end to end, a minute; tests/test_benchmark.py proves its parts
def test_benchmark_of_a_run_beside_its_baselines_on_birdset_files(
    tiny_run: Path, birdset_dir: Path, tmp_path: Path, capsys, monkeypatch
):
    import pyarrow.dataset

    from birdjepa.benchmark import store
    from birdjepa.cli import main
    from birdjepa.export.cli import export

    train = hf_birdset_split(birdset_dir, "SYN2", "train", tmp_path / "train")
    test = hf_birdset_split(birdset_dir, "SYN2", "test_5s", tmp_path / "test_5s")
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "my_encoder.py").write_text(
        "import numpy as np\n"
        "def embed(x):\n    return x.max(axis=1)\n"
        "def tokens(x):  # a published model's shape: [B, N, D] patch tokens\n"
        "    return x.reshape(len(x), -1, 16, x.shape[2]).max(axis=2)\n"
        "def wave(x, rate):\n"
        "    assert x.shape[1] == 5 * rate == 160000, (x.shape, rate)  # the clip, at the loader's rate\n"
        "    return np.stack([x.std(axis=1), np.abs(np.diff(x, axis=1)).mean(axis=1)], axis=1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "ext"))
    results = tmp_path / "results"
    args = ["benchmark", "--backbone", str(tiny_run), f"random:{tiny_run}", "raw", "my_encoder:embed",
            "waveform:my_encoder:wave", "--train", str(train), "--test", str(test), "--task", "SYN2",
            "--n-train", "1", "-1", "--step", "5", "--results", str(results)]  # fmt: skip
    main(args)
    out = capsys.readouterr().out
    rows = store.read(results).to_pylist()
    assert len(rows) == 5 * 3 * 2  # backbones x probes x n
    raw = next(r["backbone"] for r in rows if r["backbone"].startswith("raw:"))
    # An external one by its import path and its output's CRC on a probe batch (its code's stand-in).
    others = {r["backbone"].split("#")[0] for r in rows if not r["backbone"].startswith(("run:", "random:"))}
    assert others == {raw, "ext:my_encoder:embed", "ext:waveform:my_encoder:wave"}
    assert raw.startswith("raw:logmel-mean-std+patches")  # its tokens: the run's patch grid
    # The run is named by its checkpoint's step and CRC.
    assert {r["backbone"][: len("run:eval@5#")] for r in rows if r["backbone"].startswith("run:")} == {
        "run:eval@5#"
    }
    for r in rows:
        assert 0 <= r["cmap"] <= 1 and 0 <= r["auroc"] <= 1 and 0 <= r["top1"] <= 1, r
        assert r["n_test"] == 12 and r["n_train"] == (4 if r["n"] == 1 else 8)  # 4 classes x 2 recordings
    # The test-only class of the UHH-like task is said once and scored.
    assert out.count("WARNING SYN2: 1 test classes have no train recording") == 1
    assert "cmap" in out and "30 results" in out
    # Where the time went: the backbones, each embedding pass (and its encoders' share), the probes.
    assert "backbones ready in " in out and "probes: 30 fitted in " in out, out
    assert "train split: one pass in " in out and " s of it in the encoders" in out, out
    # Again: everything is in the store, nothing is embedded or fitted again.
    main(args)
    out = capsys.readouterr().out
    assert "probes: 0 fitted" in out and "30 already in the store" in out and "(cached)" in out
    assert store.read(results).to_pylist() == rows
    assert pyarrow.dataset.dataset(results / "rows").count_rows() == 30  # docs/benchmark.md's way to read it
    # The run's export, and the run named at its step, are the same backbone: already in the store.
    for backbone in (str(export(tiny_run, tmp_path / "export")), f"{tiny_run}@5"):
        main(["benchmark", "--backbone", backbone, *args[args.index("--train") : args.index("--step")],
              "--results", str(results)])  # fmt: skip
        assert "6 already in the store" in capsys.readouterr().out
    # Every probe on tokens too: the run, its random init, raw's patches and an external encoder that
    # returns tokens; the waveform encoder gives embeddings only, so the token probes skip it, and say so.
    backbones = [str(tiny_run), f"random:{tiny_run}", "raw", "my_encoder:tokens", "waveform:my_encoder:wave"]
    token_args = ["benchmark", "--backbone", *backbones, *args[args.index("--train") :]]
    token_args[token_args.index("--n-train") + 1 : token_args.index("--n-train") + 3] = ["-1"]
    token_args += ["--probe-steps", "50", "--prototypes", "4"]  # cheap; the recipe is in each row
    main([*token_args, "--probe", "linear", "mlp", "centroid", "proto", "attentive"])
    out = capsys.readouterr().out
    assert "waveform:my_encoder:wave gives embeddings [B, D], no tokens" in out
    assert "proto, attentive skipped for it" in out
    assert "embedded my_encoder:tokens: tokens [32 x 128] and embeddings [128]" in out, out
    # New: the token external's 3 pooled probes, and 2 token probes x 4 backbones. Of the 12 stored rows,
    # the 8 linear and MLP ones were fitted with 500 steps, not 50: fitted again; the centroids are kept.
    assert "probes: 19 fitted in " in out and "(linear " in out, out
    assert "(8 of them replacing results stored with another recipe), 4 already in the store" in out, out
    token_rows = [r for r in store.read(results).to_pylist() if r["probe"] in ("proto", "attentive")]
    ours = {r["backbone"] for r in rows if r["backbone"].startswith(("run:", "random:", "raw:"))}
    assert {r["backbone"].split("#")[0] for r in token_rows} == {b.split("#")[0] for b in ours} | {
        "ext:my_encoder:tokens"
    }
    assert all(
        0 <= r["cmap"] <= 1 and json.loads(r["config"])["recipe"]["prototypes"] == 4 for r in token_rows
    )
    # Each row says on what kind of machine it was fitted (its last bits depend on it).
    machines = [json.loads(r["config"])["machine"] for r in token_rows]
    assert all(m["jaxlib"] == jaxlib.__version__ and m["lapack"] and m["device"] for m in machines), machines
    main([*token_args, "--probe", "proto", "attentive"])  # tokens cached (float16), every row stored
    out = capsys.readouterr().out
    assert out.count("(cached)") == 10 and "8 already in the store" in out, out
    cached = [np.load(f) for f in (results / "cache").glob("*.npz")]
    assert {str(z["tokens"].dtype) for z in cached if "tokens" in z.files} == {"float16"}
    # The store as a table and as the few-shot figure.
    # Into a folder not made yet (a traceback after the table), named without its extension (the file was
    # curves.png, the line said "wrote .../curves").
    main(["benchmark", "--table", str(results), "--plot", str(tmp_path / "figures" / "curves")])
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == ["backbone", "probe", "n", "SYN2"]
    assert len(table) == 2 + 30 + 11 + 1  # title, head, rows, "wrote"
    assert table[-1] == f"wrote {tmp_path / 'figures' / 'curves.png'}"
    assert (tmp_path / "figures" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    main(["benchmark", "--table", str(results), "--metric", "auroc"])
    assert capsys.readouterr().out.startswith("auroc, mean over seeds")
    # The notebook draws the same store headless.
    figure = run_notebook("benchmark", results_path=str(results))["curves_fig"]
    assert [ax.get_title() for ax in figure.axes] == ["SYN2"]
    # And refuses what the table refuses: a mistyped store was an empty table (two recipes, a mean).
    from birdjepa.benchmark.cli import BenchmarkError

    with pytest.raises(BenchmarkError, match="no results store"):
        run_notebook("benchmark", results_path=str(tmp_path / "resutls"))


def test_benchmark_errors_are_one_line(birdset_dir: Path, tmp_path: Path, capsys, monkeypatch):
    import pyarrow as pa

    from birdjepa.cli import main
    from birdjepa.data.shards import read_shard

    train, test = birdset_dir / "SYN1" / "train", birdset_dir / "SYN1" / "test_5s"
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    table = read_shard(sorted(train.glob("*.arrow"))[0]).drop_columns(["ebird_code"])
    with pa.OSFile(str(unlabelled / "a.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    (unlabelled / "vocab.json").write_text((train / "vocab.json").read_text())
    # A test split whose every window is without calls: stored as NaN rows, every later table's mean NaN.
    silent = tmp_path / "silent"
    silent.mkdir()
    table = read_shard(sorted(test.glob("*.arrow"))[0])
    no_calls = (("ebird_code", pa.int64(), None), ("ebird_code_multilabel", pa.list_(pa.int64()), []))
    for name, kind, value in no_calls:
        at = table.schema.get_field_index(name)
        table = table.set_column(at, table.schema.field(at), pa.array([value] * len(table), kind))
    with pa.OSFile(str(silent / "a.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    (silent / "vocab.json").write_text((test / "vocab.json").read_text())
    one = tmp_path / "one"  # a one-class task: every probe scored cmAP 1.0, exit 0
    one.mkdir()
    shutil.copy(sorted(train.glob("*.arrow"))[0], one / "a.arrow")
    (one / "vocab.json").write_text(json.dumps({"names": ["amecro"]}))
    cases = [
        (
            ["--backbone", "raw", "--train", str(one), "--test", str(one)],
            "has 1 class(es): a probe needs two classes",
        ),
        (
            ["--backbone", "raw", "--train", str(train), "--test", str(test), "--batch-size", "-4"],
            "--batch-size -4: must be >= 1",
        ),  # fmt: skip
        (
            ["--backbone", "raw", "--train", str(train), "--test", str(test), "--n-workers", "100000"],
            "--n-workers 100000: n_workers must be in 0..=1024",
        ),  # fmt: skip
        (
            ["--backbone", "raw", "--train", str(train), "--test", str(silent), "--probe", "centroid"],
            f"SYN1: no test clip has a label ({silent / 'a.arrow'})",
        ),
        (["--backbone", "raw", "--train", str(unlabelled), "--test", str(test)], "ebird_code"),
        (
            ["--backbone", "raw", "--train", str(tmp_path / "nope*.arrow"), "--test", str(test)],
            "no shard files",
        ),
        (
            ["--backbone", "no_such_module:embed", "--train", str(train), "--test", str(test)],
            "cannot be imported",
        ),
        (["--backbone", str(tmp_path), "--train", str(train), "--test", str(test)], "neither an export"),
        (
            ["--backbone", f"{tmp_path}@abc", "--train", str(train), "--test", str(test)],
            f"{tmp_path}@abc: the step after '@' is a number (RUN@STEP), not 'abc'",
        ),
        # "RUN@" was the newest checkpoint; "random:RUN@9" said "not a run directory"; "raw:foo" was
        # tried as an import ("No module named 'raw'").
        (["--backbone", f"{tmp_path}@", "--train", str(train), "--test", str(test)], "not ''"),
        (["--backbone", f"random:{tmp_path}@9", "--train", str(train), "--test", str(test)], "without @STEP"),
        (["--backbone", "raw:foo", "--train", str(train), "--test", str(test)], "baselines are raw and"),
        (["--backbone", "raw", "--train", str(train), "--test", str(test), "--probe", "svm"], "probes are"),
        (["--backbone", "raw", "--train", str(train), "--test", str(test), "--prototypes", "0"], "are >= 1"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as e:
            main(["benchmark", *args, "--task", "SYN1", "--results", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and err.count("\n") == 1, err
    # Scored on its own train split: said, as evaluate says it (nothing did).
    main(["benchmark", "--backbone", "raw", "--train", str(test), "--test", str(test), "--probe", "centroid",
          "--n-train", "1", "--results", str(tmp_path / "same")])  # fmt: skip
    assert "WARNING SYN1: the train and test splits share the shard " in capsys.readouterr().out
    # An embedding or a result on a full disk: a traceback, and its partial file (the pid in its name, so
    # no later call removed it) kept the disk full.
    from birdjepa.benchmark import backbones, store

    for module in (backbones, store):
        results = tmp_path / f"full-{module.__name__.rsplit('.', 1)[1]}"
        with monkeypatch.context() as m:
            m.setattr(module, "write_whole", full_disk(module.write_whole))
            with pytest.raises(SystemExit) as e:
                main(["benchmark", "--backbone", "raw", "--train", str(train), "--test", str(test), "--probe",
                      "centroid", "--n-train", "1", "--results", str(results)])  # fmt: skip
        err = capsys.readouterr().err
        assert e.value.code == 74 and "No space left on device" in err and err.count("\n") == 1, err
        assert not [p for p in results.rglob("*") if "tmp" in p.name], list(results.rglob("*"))
    from birdjepa.benchmark import cli as benchmark_cli  # its figure: cut short, the earlier one lost

    (tmp_path / "f.png").write_bytes(b"earlier")
    with monkeypatch.context() as m:
        m.setattr(benchmark_cli, "write_whole", full_disk(benchmark_cli.write_whole))
        with pytest.raises(SystemExit) as e:
            main(["benchmark", "--table", str(tmp_path / "same"), "--plot", str(tmp_path / "f.png")])
    err = capsys.readouterr().err
    assert e.value.code == 74 and f"cannot write {tmp_path / 'f.png'}: No space left" in err, err
    assert (tmp_path / "f.png").read_bytes() == b"earlier" and not list(tmp_path.glob(".f.png*"))
