"""The benchmark's parts without a model: metrics against scikit-learn, few-shot draws, probes, the store."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, roc_auc_score

from birdjepa.benchmark import fewshot, store
from birdjepa.benchmark.metrics import all_metrics, auroc, cmap, top1
from birdjepa.benchmark.multi_label_probes import Recipe, fit_and_score


def multilabel_case(seed: int, n: int = 60, c: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    targets = (rng.random((n, c)) < 0.25).astype(np.uint8)
    targets[:, -1] = 0  # a class never present: no AP, no AUROC
    targets[:5] = 0  # "no call" segments
    scores = np.round(targets * 0.6 + rng.random((n, c)), 1)  # rounded: many ties
    return scores, targets


@pytest.mark.parametrize("seed", range(5))
def test_cmap_and_auroc_equal_scikit_learn(seed: int) -> None:
    scores, targets = multilabel_case(seed)
    present = targets.any(axis=0)
    ap = [average_precision_score(targets[:, c], scores[:, c]) for c in np.flatnonzero(present)]
    roc = [roc_auc_score(targets[:, c], scores[:, c]) for c in np.flatnonzero(present & ~targets.all(axis=0))]
    # Both sum the same terms in another order: equal to float rounding.
    assert cmap(scores, targets) == pytest.approx(np.mean(ap), abs=1e-12)
    assert auroc(scores, targets) == pytest.approx(np.mean(roc), abs=1e-12)


def test_top1_on_single_label_rows_equals_scikit_learn() -> None:
    from sklearn.metrics import top_k_accuracy_score

    rng = np.random.default_rng(7)
    labels = rng.integers(0, 6, 80)
    scores = rng.random((80, 6)) + 0.8 * np.eye(6)[labels]
    targets = np.eye(6, dtype=np.uint8)[labels]
    assert top1(scores, targets) == top_k_accuracy_score(labels, scores, k=1, labels=range(6))


def test_top1_by_hand() -> None:
    targets = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 1], [0, 0, 0]])
    scores = np.array([[0.9, 0.1, 0.0], [0.5, 0.2, 0.4], [0.3, 0.3, 0.3], [1.0, 0.0, 0.0]])
    # Row 0 right, row 1 wrong (class 0 is not a label), row 2 a tie that goes to class 0: wrong;
    # row 3 has no call and is left out.
    assert top1(scores, targets) == 1 / 3
    assert np.isnan(all_metrics(scores, np.zeros((4, 3)))["cmap"])


def test_few_shot_draws_are_per_class_seeded_and_nested() -> None:
    labels = np.repeat(np.arange(5), [1, 3, 8, 8, 20])
    labels = np.r_[labels, -1, -1]
    for n in (1, 4, 16):
        kept = fewshot.draw(labels, n, seed=3)
        counts = np.bincount(labels[kept], minlength=5)
        assert counts.tolist() == [min(n, k) for k in (1, 3, 8, 8, 20)]
        assert np.array_equal(kept, fewshot.draw(labels, n, seed=3))
    assert (
        set(fewshot.draw(labels, 1, 3)) <= set(fewshot.draw(labels, 4, 3)) <= set(fewshot.draw(labels, 16, 3))
    )
    assert not np.array_equal(fewshot.draw(labels, 4, 0), fewshot.draw(labels, 4, 1))
    assert np.array_equal(fewshot.draw(labels, fewshot.ALL, 0), np.flatnonzero(labels >= 0))
    # A class's draw does not depend on the other classes.
    only_four = np.where(labels == 4, 4, -1)
    fours = np.intersect1d(fewshot.draw(labels, 4, 3), np.flatnonzero(labels == 4))
    assert np.array_equal(fewshot.draw(only_four, 4, 3), fours)


def test_probes_learn_separable_classes_deterministically() -> None:
    rng = np.random.default_rng(0)
    means = rng.normal(size=(6, 24)) * 3
    y_train = np.repeat(np.arange(5), 8)  # class 5 has no train clip
    x_train = means[y_train] + rng.normal(size=(40, 24))
    test_targets = (rng.random((50, 6)) < 0.3).astype(np.uint8)
    x_test = test_targets @ means + rng.normal(size=(50, 24))
    train_targets = np.eye(6, dtype=np.uint8)[y_train]
    for probe in ("linear", "mlp", "centroid"):
        for loss in ("bce", "asl"):
            scores = fit_and_score(probe, x_train, train_targets, x_test, seed=1, recipe=Recipe(loss=loss))
            m = all_metrics(scores[:, :5], test_targets[:, :5])
            # Chance is a cmAP of about 0.3 (the share of positives) and an AUROC of 0.5.
            assert m["cmap"] > 0.75 and m["auroc"] > 0.8, (probe, loss, m)
            again = fit_and_score(probe, x_train, train_targets, x_test, seed=1, recipe=Recipe(loss=loss))
            assert np.array_equal(scores, again)
    # A class no train clip has: a trained probe's scores there were a near-constant logit whose order
    # was rounding's (cmAP moved by ~0.01 with XLA's flags). One constant below every other, for each.
    for probe in ("linear", "mlp", "centroid", "softmax", "knn"):
        scores = fit_and_score(probe, x_train, train_targets, x_test, recipe=Recipe(steps=50))
        assert (scores[:, 5] == scores[0, 5]).all() and scores[0, 5] < scores[:, :5].min(), probe
    with pytest.raises(ValueError, match="NaN"):
        fit_and_score("linear", np.full_like(x_train, np.nan), train_targets, x_test)


WRITER = """
import sys
from pathlib import Path
from birdjepa.benchmark import store
results, who = Path(sys.argv[1]), int(sys.argv[2])
for i in range(40):
    # Both writers put the shared keys (i % 2 == 0) and one key of their own.
    key = store.Key("b", "t", "linear", i if i % 2 == 0 else 1000 * who + i, 0)
    store.put(results, key, {"cmap": i / 40, "auroc": 0.5, "top1": 0.25}, n_train=i, n_test=3, fit_s=0.0,
              config={"who": who})
"""


def test_backbones_sort_with_their_step_numbers_as_numbers() -> None:
    # As strings, a checkpoint sweep's table listed step 1000 before step 500.
    from birdjepa.benchmark.tables import natural

    names = ["run:r@1000#9f", "raw:logmel", "run:r@500#0a", "run:r@34#ff", "random:run:r@500#0a"]
    assert sorted(names, key=natural) == ["random:run:r@500#0a", "raw:logmel", "run:r@34#ff", "run:r@500#0a",
                                          "run:r@1000#9f"]  # fmt: skip


def test_two_writers_lose_nothing(tmp_path: Path) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(w)]) for w in (1, 2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    rows = store.read(tmp_path).to_pylist()
    assert len(rows) == 20 + 2 * 20  # the shared keys once, each writer's own keys all
    assert sorted(r["n"] for r in rows if r["n"] < 1000) == list(range(0, 40, 2))
    assert not list((tmp_path / store.ROWS).glob(".tmp-*"))
    assert store.has(tmp_path, store.Key("b", "t", "linear", 2, 0))
    assert not store.has(tmp_path, store.Key("b", "t", "linear", 2, 1))
    # A writer killed mid-write leaves its hidden file: readers took it for a result, and the store was
    # "not a result of this store" for every later command (and a reader beside a writer failed so).
    (tmp_path / store.ROWS / ".tmp-999-cut.parquet").write_bytes(b"PAR1 cut short")
    assert len(store.read(tmp_path)) == 60


def test_single_label_probes_score_as_evaluate_predicts() -> None:
    from birdjepa.evaluation import single_label_probes as single

    rng = np.random.default_rng(1)
    means = rng.normal(size=(4, 16)) * 2
    y_train, y_test = np.repeat(np.arange(4), 10), np.repeat(np.arange(4), 5)
    x_train = means[y_train] + rng.normal(size=(40, 16))
    x_test = means[y_test] + rng.normal(size=(20, 16))
    train_targets = np.eye(5, dtype=np.uint8)[y_train]  # a fifth class without a train recording
    for probe, reference in (("knn", single.knn), ("softmax", single.linear_probe)):
        scores = fit_and_score(probe, x_train, train_targets, x_test)
        assert scores.shape == (20, 5)
        assert np.array_equal(scores.argmax(axis=1), reference(x_train, y_train, x_test, y_test).predictions)
        # A BirdSet train row lists secondary species beside its focal one: class 3's recordings here
        # list class 0 too, and were fitted as class 0's (the first listed), class 3 left without any.
        listed = train_targets.copy()
        listed[y_train == 3, 0] = 1
        scores = fit_and_score(probe, x_train, listed, x_test, train_label=y_train)
        assert np.array_equal(scores.argmax(axis=1), reference(x_train, y_train, x_test, y_test).predictions)


def test_the_table_gives_each_metric_s_mean_over_seeds_and_half_their_spread() -> None:
    from birdjepa.benchmark.tables import format_table

    base = {"task": "T", "backbone": "raw", "probe": "linear", "n": 1, "auroc": 0.5, "top1": 0.25}
    text = format_table([{**base, "seed": 0, "cmap": 0.5}, {**base, "seed": 1, "cmap": 0.75}])
    head, row = (line.split() for line in text.splitlines())
    assert head == ["task", "backbone", "probe", "n", "cmap", "auroc", "top1", "seeds"]
    assert row == ["T", "raw", "linear", "1", "0.625", "±0.125", "0.500", "±0.000", "0.250", "±0.000", "2"]


def test_a_split_without_a_list_column_is_scored_on_the_one_hot_of_its_label() -> None:
    from birdjepa.benchmark.backbones import _one_hot

    expected = np.array([[0, 0, 1], [0, 0, 0], [1, 0, 0]], np.uint8)  # a missing label (-1): no class
    assert np.array_equal(_one_hot(np.array([2, -1, 0]), 3), expected)


def test_a_result_fitted_with_another_recipe_is_not_taken_as_done(tmp_path: Path) -> None:
    stored = Recipe()
    config = {"recipe": dataclasses.asdict(stored)}
    for probe in ("linear", "proto", "centroid"):
        store.put(tmp_path, store.Key("b", "t", probe, 1, 0), {"cmap": 0.5, "auroc": 0.5, "top1": 0.5},
                  n_train=1, n_test=1, fit_s=0.0, config=config)  # fmt: skip
    cheaper = Recipe(token_batch=8)
    # The token batch is read by the token probes only; the learning rate by every trained probe.
    assert store.has(tmp_path, store.Key("b", "t", "linear", 1, 0), cheaper.read_by("linear"))
    assert not store.has(tmp_path, store.Key("b", "t", "proto", 1, 0), cheaper.read_by("proto"))
    assert store.has(tmp_path, store.Key("b", "t", "proto", 1, 0), stored.read_by("proto"))
    assert not store.has(tmp_path, store.Key("b", "t", "linear", 1, 0), Recipe(lr=1e-2).read_by("linear"))
    assert store.has(tmp_path, store.Key("b", "t", "centroid", 1, 0), Recipe(lr=1e-2).read_by("centroid"))
    # Stored before scores were made as they are now (`Recipe.scoring`): every probe's is stale.
    older = {"recipe": {k: v for k, v in dataclasses.asdict(stored).items() if k != "scoring"}}
    for probe in ("linear", "centroid", "knn"):
        store.put(tmp_path, store.Key("old", "t", probe, 1, 0), {"cmap": 0.5, "auroc": 0.5, "top1": 0.5},
                  n_train=1, n_test=1, fit_s=0.0, config=older)  # fmt: skip
        assert not store.has(tmp_path, store.Key("old", "t", probe, 1, 0), stored.read_by(probe)), probe


@pytest.mark.parametrize(
    ("tasks", "backbone", "columns"),
    [(["SYN1"], "raw:logmel-mean-std+patches16x128", 1), (["SYN1", "SYN2", "SYN3"], "raw", 3)],
)
def test_the_few_shot_figure_s_legend_lies_whole_inside_it_below_the_panels(
    tasks: list[str], backbone: str, columns: int
) -> None:
    from birdjepa.benchmark.figures import fewshot_curves

    rows = [{"task": t, "backbone": f"{b}{backbone}", "probe": p, "n": n, "cmap": 0.5}
            for t in tasks for b in ("", "random:") for p in ("linear", "proto")
            for n in (1, 4, fewshot.ALL)]  # fmt: skip
    fig = fewshot_curves(rows)
    fig.canvas.draw()
    (legend,) = fig.legends
    box, page = legend.get_window_extent(), fig.bbox
    assert 0 <= box.x0 and box.x1 <= page.x1 and 0 <= box.y0, (box, page)  # no label cut at an edge
    assert all(ax.get_tightbbox().y0 >= box.y1 for ax in fig.axes), "a panel overlaps the legend"
    # As many columns as fit: a legend of short names stays three wide.
    assert len({round(t.get_window_extent().x0) for t in legend.get_texts()}) == columns


def test_tokens_float16_would_change_are_cached_in_float32() -> None:
    # An external encoder's tokens past float16's range became inf ("tokens hold NaN or inf (a diverged
    # encoder?)"); on an offset of 3000, their signal was rounded away (a prototypical cmAP 0.24, not 0.37).
    from birdjepa.benchmark.backbones import cached_tokens

    tokens = np.random.default_rng(0).normal(size=(4, 16, 32)).astype(np.float32)
    tokens[0, 0, 0] = 40.0  # an outlier, as normalised tokens have
    assert np.array_equal(cached_tokens(tokens), tokens.astype(np.float16))
    for far in (tokens + 3000, tokens * 1e5):
        kept = cached_tokens(far)
        assert kept.dtype == np.float32 and np.array_equal(kept, far)


def test_every_line_of_the_few_shot_figure_is_drawn_apart() -> None:
    # The docs' five probes: proto drew as attentive (four line styles, one marker); past ten backbones
    # their colours came round again.
    from matplotlib.colors import to_hex

    from birdjepa.benchmark.figures import fewshot_curves

    probes = ("linear", "mlp", "centroid", "proto", "attentive")
    rows = [
        {"task": "T", "backbone": f"b{i:02d}", "probe": p, "n": 1, "cmap": 0.5}
        for i in range(12)
        for p in probes
    ]
    (ax,) = fewshot_curves(rows).axes
    drawn = {(to_hex(line.get_color()), line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
    assert len(drawn) == len(ax.get_lines()) == 12 * 5


def test_the_few_shot_legend_names_the_lines_of_every_panel() -> None:
    # It was read from the first panel only: a backbone scored on the second task alone went unnamed.
    from birdjepa.benchmark.figures import fewshot_curves

    rows = [{"task": t, "backbone": b, "probe": "linear", "n": 1, "cmap": 0.5}
            for t, b in (("SYN1", "raw"), ("SYN2", "raw"), ("SYN2", "runs/a"))]  # fmt: skip
    (legend,) = fewshot_curves(rows).legends
    assert [t.get_text() for t in legend.get_texts()] == ["raw / linear", "runs/a / linear"]


def test_backbones_without_log_mel_of_their_own_carry_the_features_they_embed_in_their_identity() -> None:
    # raw's rows under f_min 2000 were the store's default-feature rows, "already in the store".
    from birdjepa.benchmark.backbones import Backbone, identified
    from birdjepa.data import Features

    raw = Backbone("raw", "raw:logmel-mean-std+patches16x128", lambda: None, None)
    run = Backbone("runs/a", "run:a@3#1", lambda: None, Features(f_min=2000.0))
    # The default features before --data.features.gapless (off): the identities stored then.
    same = identified([run, raw], Features(gapless=False))
    assert [b.identity for b in same] == ["run:a@3#1", "raw:logmel-mean-std+patches16x128"]
    other = identified([run, raw], Features(f_min=2000.0, gapless=False))
    assert other[0].identity == "run:a@3#1"
    assert other[1].identity == "raw:logmel-mean-std+patches16x128+features#f02ca8ad"  # as 18ce7c9 named it
    # Today's defaults decode gapless: rows stored of the old decode are not theirs (cmAP 0.666 was
    # shown for 0.672).
    today = [b.identity for f in (Features(), Features(f_min=2000.0)) for b in identified([raw], f)]
    assert today == [same[1].identity + "+gapless=true", other[1].identity + "+gapless=true"]


def test_a_cached_embedding_of_more_clips_than_labels_is_embedded_again(tmp_path: Path) -> None:
    # A call that named one checkpoint twice cached both passes under one key (576 rows, 288 labels):
    # every later call on that store failed on it.
    from birdjepa.benchmark.backbones import Backbone, _cached

    path = tmp_path / "poisoned.npz"
    np.savez(path, features=np.zeros((4, 2), np.float32), label=np.zeros(2, np.int64),
             targets=np.zeros((2, 3), np.uint8), seconds=0.0, pass_seconds=0.0)  # fmt: skip
    assert _cached(path, Backbone("raw", "raw", lambda: None, None), tokens=False) is None
    # One cut short (a full disk): a zipfile traceback at every later call on the store.
    path.write_bytes(path.read_bytes()[:500])
    assert _cached(path, Backbone("raw", "raw", lambda: None, None), tokens=False) is None


def test_an_external_backbone_edited_under_the_same_import_path_is_another_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its identity was its import path alone: the edited function was given the old one's stored scores.
    import importlib

    from birdjepa.benchmark.backbones import identified, resolve
    from birdjepa.data import Features

    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "edited_encoder.py"
    ids = []
    for body in ("x.mean(axis=1)", "x.mean(axis=1)", "x.max(axis=1)"):
        module.write_text(f"def embed(x):\n    return {body}\n")
        sys.modules.pop("edited_encoder", None)
        importlib.invalidate_caches()
        (b,) = identified(resolve(["edited_encoder:embed"]), Features())
        ids.append(b.identity)
    assert ids[0] == ids[1] != ids[2], ids
    assert re.fullmatch(r"ext:edited_encoder:embed#[0-9a-f]{8}\+gapless=true", ids[0]), ids


def test_an_external_backbone_of_a_bad_output_is_a_backbone_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A NaN reached a probe's error, and a width that changed between batches numpy's concatenate error:
    # neither named the backbone.
    from birdjepa.benchmark.backbones import BackboneError, identified, resolve
    from birdjepa.data import Features

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "bad_encoder.py").write_text(
        "import numpy as np\n"
        "def nan(x):\n    y = x.mean(axis=1)\n    y[1, 3] = np.nan\n    return y\n"
        "def widening(x):\n    return np.zeros((len(x), 4 + len(x)), np.float32)\n"
    )
    with pytest.raises(
        BackboneError, match=r"'bad_encoder:nan' returned a value that is not finite \(clip 1 "
    ):
        identified(resolve(["bad_encoder:nan"]), Features())
    (widening,) = identified(resolve(["bad_encoder:widening"]), Features())  # 2 clips: width 6
    with pytest.raises(BackboneError, match=r"'bad_encoder:widening' returned shape \(3, 7\) after \(3, 6\)"):
        widening.encode(np.zeros((3, 8, 8), np.float32), tokens=False)


def test_token_probes_alone_for_backbones_without_tokens_are_refused(
    birdset_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # "proto, attentive skipped for it", "0 fitted", exit 0: a sweep's job that stored nothing looked done.
    from birdjepa.cli import main

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "pooled_encoder.py").write_text("def embed(x):\n    return x.mean(axis=1)\n")
    task = birdset_dir / "SYN1"
    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--backbone", "pooled_encoder:embed", "--probe", "proto", "attentive", "--n-train",
              "1", "--train", str(task / "train" / "*.arrow"), "--test", str(task / "test_5s" / "*.arrow"),
              "--results", str(tmp_path / "results")])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == ("birdjepa benchmark: error: no backbone given has tokens for proto, "
                                         "attentive: nothing to fit; add a pooled probe (linear, mlp, "
                                         "centroid, softmax, knn)\n"), err  # fmt: skip


def test_an_external_backbone_that_raises_is_a_backbone_error_naming_it() -> None:
    from birdjepa.benchmark.backbones import BackboneError, resolve

    (external,) = resolve(["math:sqrt"])  # a traceback, exit 1, before
    with pytest.raises(BackboneError, match="external backbone 'math:sqrt' raised TypeError: "):
        external.encode(np.zeros((2, 8, 8), np.float32), tokens=False)


def test_a_task_name_scored_on_other_files_in_the_store_is_refused_before_anything_is_embedded(
    birdset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A result is found by (backbone, task, probe, n, seed): SYN2's files under the name SYN1 were given
    # SYN1's stored scores, "already in the store", exit 0.
    from birdjepa.cli import main

    files = {
        s: sorted(str(f) for f in (birdset_dir / "SYN1" / s).glob("*.arrow")) for s in ("train", "test_5s")
    }
    key = store.Key("raw", "SYN1", "centroid", 1, 0)
    store.put(tmp_path, key, {"cmap": 0.5, "auroc": 0.5, "top1": 0.5}, n_train=1, n_test=1, fit_s=0.0,
              config={"train": files["train"], "test": files["test_5s"]})  # fmt: skip
    other = birdset_dir / "SYN2"
    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--backbone", "raw", "--task", "SYN1", "--train", str(other / "train" / "*.arrow"),
              "--test", str(other / "test_5s" / "*.arrow"), "--probe", "centroid", "--n-train", "1",
              "--results", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"birdjepa benchmark: error: {tmp_path}: its results of task 'SYN1' were scored on "
                          f"other train files ({files['train'][0]}"), err  # fmt: skip
    assert not (tmp_path / "cache").exists()  # refused before the embedding pass
    # The same files rewritten in place (relabelled at the same size: the old scores, exit 0), or read
    # with other targets (a mistyped --multilabel-column fell back to the one label, stored as the task's).
    import shutil

    from birdjepa.benchmark.backbones import files_stamp

    copy = shutil.copytree(birdset_dir / "SYN1", tmp_path / "SYN1", ignore=shutil.ignore_patterns("cache*"))
    files = {s: sorted(str(f) for f in (copy / s).glob("*.arrow")) for s in ("train", "test_5s")}
    data = {"train": files_stamp(files["train"]), "test": files_stamp(files["test_5s"]), "targets": "label"}
    config = {"train": files["train"], "test": files["test_5s"], "data": data}
    store.put(tmp_path / "2", key, {"cmap": 0.5, "auroc": 0.5, "top1": 0.5}, n_train=1, n_test=1,
              fit_s=0.0, config=config)  # fmt: skip
    own = ["benchmark", "--backbone", "raw", "--task", "SYN1", "--probe", "centroid", "--n-train", "1",
           "--train", str(copy / "train" / "*.arrow"), "--test", str(copy / "test_5s" / "*.arrow"),
           "--results", str(tmp_path / "2")]  # fmt: skip
    for args, said in (
        (["--multilabel-column", "ebird_code_multilable"], "--multilabel-column 'ebird_code_multilable': "),
        ([], "were scored with other targets"),  # this set has the default column: its targets are those
        (["--multilabel-column", ""], "were scored on these files as they were before"),  # one label
    ):
        if not args:
            os.utime(files["train"][0], ns=(0, 0))
        with pytest.raises(SystemExit) as e:
            main([*own, *args])
        err = capsys.readouterr().err
        assert e.value.code == 2 and said in err and err.count("\n") == 1, err
    assert not (tmp_path / "2" / "cache").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--table", "{tmp}/nosuch"], "nosuch: no results store (no rows/ folder in it)"),  # an empty table
        (["--table", "{tmp}/store", "--plot", "{tmp}/afile/f.png"], "f.png: cannot be written"),  # traceback
        (["--table", "{tmp}/store", "--plot", "{tmp}/f.foo"], "f.foo: .foo is no figure format; one of "),
        # Seeds fitted with other recipes, averaged into one cell as if they were seeds of one.
        (
            ["--table", "{tmp}/mixed"],
            "(raw, T, linear, n = 1): seed 1 fitted with steps 500, seed 0 "
            "with steps 5: their mean would mix two recipes",
        ),
        (["--table", "{tmp}/foreign"], "other.parquet: not a result of this store"),  # TypeError traceback
        # A store whose first run failed before a result: a table of headers, then --plot's traceback.
        (["--table", "{tmp}/empty", "--plot", "{tmp}/f.png"], "empty: the store holds no results yet"),
        (["--plot", "{tmp}/f.png", "--backbone", "raw"], "--plot and --metric go with --table"),  # ignored
        # A value given twice: its second score was counted "already in the store".
        (
            ["--backbone", "raw", "--train", "a", "--test", "b", "--n-train", "1", "4", "1"],
            "--n-train 1 4 1: 1 given twice",
        ),
        (["--backbone", "raw", "raw", "--train", "a", "--test", "b"], "--backbone raw raw: raw given twice"),
        # Every probe's scores NaN ("scores hold NaN or inf", naming nothing); the test folder's name, unsaid.
        (["--backbone", "raw", "--train", "a", "--test", "b", "--probe-lr", "inf"], "--probe-lr > 0, got"),
        (
            ["--backbone", "raw", "--train", "a", "--test", "b", "--probe-steps", "1000000000"],
            "--probe-steps 1000000000: must be at most 1,000,000",
        ),  # it fitted for ever
        (["--backbone", "raw", "--train", "a", "--test", "b", "--task", ""], "--task '': give a name"),
        (["--backbone", "raw", "--train", "a", "--test", "b", "--seed", str(2**32)], "must be in [0, 2**32)"),
        # The probes were fitted, then a traceback from the store's first write.
        (["--backbone", "raw", "--train", "a", "--test", "b", "--results", "{tmp}/afile"], "rows: cannot be"),
    ],
)
def test_table_and_option_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from birdjepa.cli import main

    metrics = {"cmap": 0.5, "auroc": 0.5, "top1": 0.5}
    store.put(tmp_path / "store", store.Key("raw", "T", "centroid", 1, 0), metrics, n_train=1, n_test=1,
              fit_s=0.0, config={})  # fmt: skip
    for seed, steps in ((0, 5), (1, 500)):
        key = store.Key("raw", "T", "linear", 1, seed)
        store.put(tmp_path / "mixed", key, metrics, n_train=1, n_test=1, fit_s=0.0,
                  config={"recipe": {"steps": steps, "loss": "bce"}})  # fmt: skip
    (tmp_path / "afile").write_text("")
    (tmp_path / "foreign" / "rows").mkdir(parents=True)
    (tmp_path / "empty" / "rows").mkdir(parents=True)
    pq.write_table(pa.table({"x": [1]}), tmp_path / "foreign" / "rows" / "other.parquet")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["benchmark", *[a.format(tmp=tmp_path) for a in args]])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err, err


def test_seeds_fitted_with_other_values_of_a_field_their_probe_never_reads_are_one_recipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The table refused them as two recipes, and the fit it advised found every seed in the store.
    from birdjepa.cli import main

    metrics = {"cmap": 0.5, "auroc": 0.5, "top1": 0.5}
    for probe, field, values in (("centroid", "steps", (50, 500)), ("linear", "prototypes", (5, 20))):
        for seed, value in enumerate(values):
            config = {"recipe": {**dataclasses.asdict(Recipe()), field: value}}
            store.put(tmp_path, store.Key("raw", "T", probe, 1, seed), metrics, n_train=1, n_test=1,
                      fit_s=0.0, config=config)  # fmt: skip
    main(["benchmark", "--table", str(tmp_path)])
    rows = capsys.readouterr().out.splitlines()[2:]
    assert sorted(row.split() for row in rows) == [
        ["raw", "centroid", "1", "0.500"],
        ["raw", "linear", "1", "0.500"],
    ]


def test_audio_its_rows_name_by_path_changed_or_read_elsewhere_is_not_scored_as_before(
    birdset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # BirdSet as a loading script caches it: the stored scores (and the cached embeddings) of the audio
    # under one --audio-root were served for another's, and for files replaced behind the shards.
    import shutil

    from path_only import path_only

    from birdjepa.benchmark.backbones import split_key
    from birdjepa.benchmark.cli import check_options
    from birdjepa.cli import main
    from birdjepa.data import Features

    task = birdset_dir / "SYN1"
    for split in ("train", "test_5s"):
        for shard in sorted((task / split).glob("*.arrow")):
            path_only(
                shard,
                tmp_path / "SYN1" / split / shard.name,
                tmp_path / "a" / split,
                relative_to=tmp_path / "a",
            )
        shutil.copy(task / split / "vocab.json", tmp_path / "SYN1" / split)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    files = sorted((tmp_path / "b" / "test_5s").iterdir())  # b: the test's recordings rotated
    audio = [f.read_bytes() for f in files]
    for f, data in zip(files, audio[1:] + audio[:1], strict=True):
        f.write_bytes(data)
    # From inside the task's folder, by relative paths: the task's name was '' (an empty column).
    monkeypatch.chdir(tmp_path / "SYN1")
    common = ["benchmark", "--backbone", "raw", "--train", "train", "--test", "test_5s", "--probe",
              "centroid", "--n-train", "-1", "--results", str(tmp_path / "results")]  # fmt: skip
    main([*common, "--audio-root", str(tmp_path / "a")])
    assert {r["task"] for r in store.read(tmp_path / "results").to_pylist()} == {"SYN1"}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([*common, "--audio-root", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "were scored on other audio files than its rows name now" in err, err
    # The embeddings' key: a file replaced behind the shards (another size and time) is another split.
    t = check_options(backbone=["raw"], train="train", test="test_5s", task=None, probe=["centroid"],
                      n_train=[-1], seed=[0], prototypes=20, probe_steps=5, probe_lr=1e-3, token_batch=8,
                      n_classes=None)  # fmt: skip
    options = {"audio_root": str(tmp_path / "a")}
    before = split_key(t.test, Features(), options)
    victim = sorted((tmp_path / "a" / "test_5s").iterdir())[0]
    victim.write_bytes(victim.read_bytes() + b"\0" * 64)
    assert split_key(t.test, Features(), options) != before


def test_a_probe_that_diverges_is_named_with_its_cell_and_the_option_to_change(
    birdset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "error: scores hold NaN or inf", naming no probe, backbone or cause.
    from birdjepa.cli import main

    task = birdset_dir / "SYN1"
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--backbone", "raw", "--train", str(task / "train"),
              "--test", str(task / "test_5s"), "--probe", "linear", "--n-train", "-1", "--probe-lr", "1e6",
              "--probe-steps", "50", "--results", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    cell = "(raw:logmel-mean-std+patches16x128+gapless=true, linear, n = all, seed 0)"
    said = f"{cell}: scores hold NaN or inf; a smaller --probe-lr\n"
    assert e.value.code == 2 and err.endswith(said), err


def test_a_class_count_other_than_the_task_vocabulary_s_is_refused_before_anything_is_embedded(
    birdset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An IndexError once every clip was embedded.
    from birdjepa.cli import main

    task = birdset_dir / "SYN1"
    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--backbone", "raw", "--task", "SYN1", "--train", str(task / "train" / "*.arrow"),
              "--test", str(task / "test_5s" / "*.arrow"), "--n-classes", "2",
              "--results", str(tmp_path)])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--n-classes 2: the task's classes are the " in err, err
    assert not (tmp_path / "cache").exists()
    from birdjepa.benchmark.backbones import _one_hot  # a task without vocab.json: labels past the count
    from birdjepa.data import DataError

    with pytest.raises(DataError, match=r"a clip's label is 3, outside the task's 2 classes \(--n-classes"):
        _one_hot(np.array([0, 3, -1]), 2)


def test_a_test_split_whose_windows_all_hold_the_same_classes_or_none_reads_is_refused(
    birdset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One window (or windows of one class): every probe stored cmAP 1.000, AUROC nan, without a word.
    import shutil

    from test_loader_bad_input import read_table, with_corrupt_rows, write_table

    from birdjepa.cli import main

    task = birdset_dir / "SYN1"
    (tmp_path / "test").mkdir()
    shard = sorted((task / "test_5s").glob("*.arrow"))[0]
    write_table(read_table(shard).slice(0, 1), tmp_path / "test" / shard.name)
    shutil.copy(task / "test_5s" / "vocab.json", tmp_path / "test")
    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--backbone", "raw", "--task", "SYN1", "--train", str(task / "train" / "*.arrow"),
              "--test", str(tmp_path / "test" / "*.arrow"), "--probe", "centroid", "--results",
              str(tmp_path / "results"), "--n-workers", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert e.value.code == 2 and "SYN1: every test window holds the same classes (" in err, err
    assert "so cmAP is 1.0 whatever a probe scores" in err and not (tmp_path / "results" / "rows").exists()
    # Every window unreadable: numpy's "need at least one array to concatenate".
    table = read_table(shard)
    write_table(with_corrupt_rows(table, set(range(len(table)))), tmp_path / "test" / shard.name)
    with pytest.raises(SystemExit) as e:
        main(["benchmark", "--backbone", "raw", "--task", "SYN1", "--train", str(task / "train" / "*.arrow"),
              "--test", str(tmp_path / "test" / "*.arrow"), "--probe", "centroid", "--results",
              str(tmp_path / "results"), "--n-workers", "1"])  # fmt: skip
    err = capsys.readouterr().err
    said = f"{tmp_path / 'test' / shard.name}: the loader read no record of them (each skipped"
    assert e.value.code == 2 and said in err and err.count("\n") == 1, err


def test_an_n_no_class_reaches_is_said_to_score_as_all(
    birdset_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A class keeps every recording when it has fewer than n: an n above every class repeated n = all's
    # scores under its own number, without a word.
    from birdjepa.cli import main

    task = birdset_dir / "SYN1"
    main(["benchmark", "--backbone", "raw", "--task", "SYN1", "--train", str(task / "train" / "*.arrow"),
          "--test", str(task / "test_5s" / "*.arrow"), "--probe", "centroid", "--n-train", "1", "1000", "-1",
          "--results", str(tmp_path), "--n-workers", "1"])  # fmt: skip
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("n = ")]
    assert len(said) == 1 and said[0].startswith("n = 1000: no class of SYN1 has more than "), said
    rows = {r["n"]: r["cmap"] for r in store.read(tmp_path).to_pylist()}
    assert rows[1000] == rows[-1] and rows[1] != rows[-1]  # what the line says
