"""`birdjepa benchmark`: frozen backbones scored on a multi-label task as BirdSet scores them.

For one task (a train split to fit probes on, a test split to score them on), every backbone embeds
both splits once (cached under ``RESULTS/cache``), then every probe is fitted for every ``n`` (recordings
per class, -1 = all) and seed, and scored with cmAP, AUROC and top-1 (`metrics`). Each result is a row
of the Parquet store under ``RESULTS`` (`store`); a key already there is skipped, unless it was fitted
with another recipe (then it is fitted again and replaced). ``--table RESULTS`` prints the store.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from birdjepa.benchmark import fewshot, store
from birdjepa.benchmark.backbones import (
    Backbone,
    BackboneError,
    Embedded,
    audio_stamp,
    embed,
    files_stamp,
    identified,
    resolve,
)
from birdjepa.benchmark.metrics import all_metrics
from birdjepa.benchmark.multi_label_probes import (
    MULTI_LABEL,
    PROBES,
    TOKEN_PROBES,
    Loss,
    Recipe,
    first_class,
    fit_and_score,
)
from birdjepa.benchmark.recipe import UNTRAINED
from birdjepa.benchmark.tables import BenchmarkError, format_store, format_table, stored_results
from birdjepa.config import SEED_LIMIT
from birdjepa.data import DEFAULTS, DataError, Features, resolve_files
from birdjepa.data.loader import loader_refusal
from birdjepa.data.row_columns import MULTILABEL_COLUMN
from birdjepa.data.shards import DEFAULT_LABEL_COLUMN, VOCAB_FILE, class_names, read_shard, split_labels
from birdjepa.evaluation.report import overlap
from birdjepa.exit_codes import IOERR, USAGE
from birdjepa.outputs import WriteError, unwritable, write_whole
from birdjepa.train.determinism import machine_kind
from birdjepa.train.memory_fit import out_of_memory


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    train: list[str]
    test: list[str]
    n_classes: int
    class_names: list[str]


def load_task(name: str, train: str, test: str, n_classes: int | None) -> Task:
    n_given = n_classes is not None
    try:
        train_files, test_files = resolve_files(train), resolve_files(test)
    except DataError as e:
        raise BenchmarkError(str(e)) from e
    for f in [*train_files, *test_files]:
        if not Path(f).is_file():
            raise BenchmarkError(f"{f}: no such shard file")
    names = _vocab(train_files) or _vocab(test_files)
    if n_classes is not None and names is not None and n_classes != len(names):  # an IndexError, later
        raise BenchmarkError(f"--n-classes {n_classes}: the task's classes are the {len(names)} of "
                             f"{Path(train_files[0]).parent / VOCAB_FILE}; leave it out")  # fmt: skip
    if n_classes is None:
        if names is None:
            raise BenchmarkError(
                f"no {VOCAB_FILE} beside {train_files[0]} and no ClassLabel names in it: give --n-classes"
            )
        n_classes = len(names)
    if n_classes < 2:  # every probe scored cmAP 1.0 and exit 0, where evaluate refuses it
        # "has -3 class" for --n-classes -3
        given = f"--n-classes {n_classes}" if n_given else f"task {name!r} has {n_classes} class(es)"
        raise BenchmarkError(f"{given}: a probe needs two classes or more to tell apart")
    for files in (train_files, test_files):
        other = _vocab(files)
        if other is not None and names is not None and other != names:
            first = Path(train_files[0]).parent / VOCAB_FILE
            raise BenchmarkError(
                f"{Path(files[0]).parent / VOCAB_FILE} lists other classes than {first}: "
                "a task has one class list"
            )
    return Task(name, train_files, test_files, n_classes, names or [str(c) for c in range(n_classes)])


def _vocab(files: list[str]) -> list[str] | None:
    """The class names of vocab.json beside the shards (`split_labels`: the loader's labels index them),
    else those a `datasets` file keeps in its schema."""
    try:
        names, _ = split_labels(files)
    except DataError as e:
        raise BenchmarkError(str(e)) from e
    return (
        names if names is not None else class_names(read_shard(Path(files[0])).schema, DEFAULT_LABEL_COLUMN)
    )


def has_column(shard: str, column: str) -> bool:
    return column in read_shard(Path(shard)).schema.names


def took(e: Embedded) -> str:
    return "(cached)" if e.cached else f"in {e.seconds:.1f} s"


def train_labels(e: Embedded) -> np.ndarray:
    """Each train recording's class for the few-shot draw: its single label, else its first multi-label."""
    return np.where(e.label >= 0, e.label, first_class(e.targets))


def run_task(
    task: Task,
    backbones: list[Backbone],
    *,
    probes: list[str],
    n_train: list[int],
    seeds: list[int],
    recipe: Recipe,
    results: Path,
    batch_size: int,
    n_workers: int,
    multilabel_column: str,
    audio_root: str | None = None,
    log=print,
) -> list[dict]:
    """Every (backbone, probe, n, seed) result of ``task``, from the store where it is there."""
    options: dict = {"audio_root": audio_root}
    files = [*task.train, *task.test] if multilabel_column else []
    has = {f: has_column(f, multilabel_column) for f in files}
    if has and all(has.values()):
        options |= {"multilabel_column": multilabel_column, "n_classes": task.n_classes}
    elif any(has.values()) or (multilabel_column and multilabel_column != MULTILABEL_COLUMN):
        # A typo, or a split without it: its scores would be stored as the task's, under the same key.
        lacking = next(f for f, there in has.items() if not there)
        raise BenchmarkError(f"--multilabel-column {multilabel_column!r}: {lacking} has no such column")
    else:
        log(
            f"{task.name}: no {multilabel_column!r} column in its shards; each clip's target is its one label"
        )
    targets = f"multilabel:{multilabel_column}" if "multilabel_column" in options else "label"
    data = {"train": files_stamp(task.train), "test": files_stamp(task.test), "targets": targets}
    for split, files in (("train", task.train), ("test", task.test)):  # rows that name their audio by path
        if (audio := audio_stamp(files, options)) is not None:
            data[f"{split}_audio"] = audio
    other = store.scored_on_other_files(results, task.name, {"train": task.train, "test": task.test}, data)
    if other is not None:  # before anything is embedded
        raise BenchmarkError(other)
    shared = overlap((task.train, task.test), ("", ""))  # a shard in both splits, or copied: as evaluate says
    if shared is not None:
        log(f"WARNING {task.name}: {shared.replace('eval', 'test')}")
    default = next((b.features for b in backbones if b.features is not None), Features())
    for features in {b.features or default for b in backbones}:  # a batch's bound is in values
        if (why := loader_refusal(batch_size, n_workers, features)) is not None:
            raise BenchmarkError(why)
    backbones = identified(backbones, default)
    embedded: dict[str, dict[str, Embedded]] = {"train": {}, "test": {}}
    tokens = any(p in TOKEN_PROBES for p in probes)
    for features in {b.features or default for b in backbones}:
        group = [b for b in backbones if (b.features or default) == features]
        for split, files in (("train", task.train), ("test", task.test)):
            embedded[split].update(
                embed(
                    group,
                    files,
                    features,
                    cache=results / "cache",
                    n_classes=task.n_classes,
                    batch_size=batch_size,
                    n_workers=n_workers,
                    loader_options=options,
                    tokens=tokens,
                )
            )
    for split in ("train", "test"):
        fresh = {e.pass_seconds for e in embedded[split].values() if not e.cached}
        if fresh:  # one pass per feature group
            spent = sum(e.seconds for e in embedded[split].values() if not e.cached)
            log(f"{split} split: one pass in {sum(fresh):.1f} s, {spent:.1f} s of it in the encoders "
                "(the loader decodes and computes log-mel on its own threads meanwhile)")  # fmt: skip
    for b in backbones:
        tr, te = embedded["train"][b.identity], embedded["test"][b.identity]
        shape = f"embeddings [{tr.features.shape[1]}]"
        if tr.tokens is not None:
            shape = f"tokens [{tr.tokens.shape[1]} x {tr.tokens.shape[2]}] and " + shape
        log(f"embedded {b.spec}: {shape}; train {len(tr.features)} clips {took(tr)}, test "
            f"{len(te.features)} clips {took(te)}")  # fmt: skip
        if tokens and tr.tokens is None:
            log(f"{b.spec} gives embeddings [B, D], no tokens: it takes the pooled probes "
                f"({', '.join(p for p in PROBES if p not in TOKEN_PROBES)}); "
                f"{', '.join(p for p in probes if p in TOKEN_PROBES)} skipped for it")  # fmt: skip
    # Token probes alone, for backbones of embeddings alone: "0 fitted", exit 0 (a sweep's job that stored
    # nothing looked done).
    if not any(p not in TOKEN_PROBES or embedded["train"][b.identity].tokens is not None
               for b in backbones for p in probes):  # fmt: skip
        pooled = ", ".join(p for p in PROBES if p not in TOKEN_PROBES)
        raise BenchmarkError(f"no backbone given has tokens for {', '.join(probes)}: nothing to fit; add a "
                             f"pooled probe ({pooled})")  # fmt: skip
    first = embedded["train"][backbones[0].identity]
    test_targets = embedded["test"][backbones[0].identity].targets
    for split, targets, files in (("train", first.targets, task.train), ("test", test_targets, task.test)):
        if not targets.any():  # scored anyway: NaN rows stored, and every later table's mean NaN
            more = " and more" if len(files) > 1 else ""
            raise BenchmarkError(f"{task.name}: no {split} clip has a label ({files[0]}{more}): nothing "
                                 "to fit or score")  # fmt: skip
    held = test_targets.any(axis=0)
    if test_targets[:, held].all():  # a class positive in every window has an AP of 1 whatever it scores
        classes = ", ".join(task.class_names[c] for c in np.flatnonzero(held))
        raise BenchmarkError(f"{task.name}: every test window holds the same classes ({classes}), so cmAP "
                             f"is 1.0 whatever a probe scores ({task.test[0]}): test windows that "
                             "differ")  # fmt: skip
    uncovered = np.flatnonzero(held & ~first.targets.any(axis=0))
    if len(uncovered):
        log(
            f"WARNING {task.name}: {len(uncovered)} test classes have no train recording "
            f"({', '.join(task.class_names[c] for c in uncovered)}); they are scored all the same, "
            "as BirdSet scores them (their AP counts in cmAP)"
        )
    labels = train_labels(first)
    largest = int(np.bincount(labels[labels >= 0]).max(initial=0))
    for n in sorted({n for n in n_train if n != fewshot.ALL and n >= largest}):  # else capped unsaid
        log(f"n = {n}: no class of {task.name} has more than {largest} train recordings, so it keeps them "
            "all and scores as n = all")  # fmt: skip
    done = skipped = refitted = 0
    t_fit: dict[str, float] = defaultdict(float)
    machine = machine_kind()
    for b in backbones:
        tr, te = embedded["train"][b.identity], embedded["test"][b.identity]
        classes = train_labels(tr)
        for probe in probes:
            on_tokens = probe in TOKEN_PROBES
            if on_tokens and tr.tokens is None:
                continue
            train_x, test_x = (tr.tokens, te.tokens) if on_tokens else (tr.features, te.features)
            for n in n_train:
                for seed in seeds:
                    key = store.Key(b.identity, task.name, probe, n, seed)
                    if store.has(results, key, recipe.read_by(probe)):
                        skipped += 1
                        continue
                    if store.has(results, key):
                        refitted += 1
                    keep = fewshot.draw(classes, n, seed)
                    t0 = time.perf_counter()
                    try:
                        scores = fit_and_score(probe, train_x[keep], tr.targets[keep], test_x, seed=seed,
                                               recipe=recipe, train_label=classes[keep])  # fmt: skip
                        metrics = all_metrics(scores, te.targets)
                    except ValueError as e:  # "scores hold NaN or inf", naming no probe, backbone or cause
                        where = f"{b.identity}, {probe}, n = {'all' if n == fewshot.ALL else n}, seed {seed}"
                        trained = "scores" in str(e) and probe not in UNTRAINED
                        hint = "; a smaller --probe-lr" if trained else ""
                        raise BenchmarkError(f"({where}): {e}{hint}") from None
                    fit_s = time.perf_counter() - t0
                    t_fit[probe] += fit_s
                    config = {
                        "recipe": dataclasses.asdict(recipe),
                        "train": task.train,
                        "test": task.test,
                        "data": data,
                        "n_classes": task.n_classes,
                        "backbone_spec": b.spec,
                        "machine": machine,  # the probes' last bits follow it (as a step's do)
                    }
                    store.put(
                        results,
                        key,
                        metrics,
                        n_train=len(keep),
                        n_test=len(te.features),
                        fit_s=fit_s,
                        config=config,
                    )
                    done += 1
    per_probe = ", ".join(f"{p} {t_fit[p]:.1f} s" for p in probes if p in t_fit)
    replaced = f" ({refitted} of them replacing results stored with another recipe)" if refitted else ""
    log(f"probes: {done} fitted in {sum(t_fit.values()):.1f} s{f' ({per_probe})' if done else ''}{replaced}, "
        f"{skipped} already in the store")  # fmt: skip
    table = store.read(results).to_pylist()
    ids = {b.identity for b in backbones}
    return [
        r
        for r in table
        if r["task"] == task.name
        and r["backbone"] in ids
        and r["probe"] in probes
        and r["n"] in n_train
        and r["seed"] in seeds
    ]


MAX_PROBE_STEPS = 1_000_000
"""The most steps a probe fits for: 2,000x the recipe's, minutes a fit on the encoders' tokens."""


def checked_plot(plot: Path) -> Path:
    """The file ``--plot`` writes: matplotlib's format of its extension, or a PNG with ``.png`` added
    (matplotlib adds it, and the name said was the one given); `BenchmarkError` where it cannot be
    written or its extension is no format matplotlib writes (a traceback after the table)."""
    from birdjepa.benchmark.figures import figure_formats

    plot = plot if plot.suffix else plot.with_name(plot.name + ".png")
    formats = figure_formats()
    if plot.suffix.lower().lstrip(".") not in formats:
        raise BenchmarkError(
            f"--plot {plot}: {plot.suffix} is no figure format; one of .{', .'.join(formats)}"
        )
    why = unwritable(plot)
    if why is not None:
        raise BenchmarkError(why)
    return plot


def check_options(
    *,
    backbone: list[str],
    train: str | None,
    test: str | None,
    task: str | None,
    probe: list[str],
    n_train: list[int],
    seed: list[int],
    prototypes: int,
    probe_steps: int,
    probe_lr: float,
    token_batch: int,
    n_classes: int | None,
    batch_size: int = 1,
    n_workers: int = 0,
    audio_root: str | None = None,
) -> Task:
    """The task, once the options that need no backbone loaded check out (`BenchmarkError` for the first
    that does not): what `benchmark` checks before it starts, and a benchmark sweep before it submits."""
    if not backbone or train is None or test is None:
        raise BenchmarkError("give --backbone (one or more), --train and --test (or --table RESULTS)")
    # Checked after the backbones loaded, it named no option ("batch_size must be >= 0 (got -4)"); with
    # every embedding cached, --batch-size 0 passed; in a sweep, it failed only once the job ran.
    for flag, value, least in (("--batch-size", batch_size, 1), ("--n-workers", n_workers, 0)):
        if value < least:
            raise BenchmarkError(f"{flag} {value}: must be >= {least}")
    if (why := loader_refusal(None, n_workers, audio_root=audio_root)) is not None:  # before anything loads
        raise BenchmarkError(why)
    # A value given twice: its second result was counted "already in the store".
    lists = {"--backbone": backbone, "--probe": probe, "--n-train": n_train, "--seed": seed}
    for flag, values in lists.items():
        if not values:  # --seed with no value: 0 probes fitted, exit 0
            raise BenchmarkError(f"{flag}: give at least one value, or leave it out for the default")
        twice = [str(v) for i, v in enumerate(values) if v in values[:i]]
        if twice:
            raise BenchmarkError(f"{flag} {' '.join(map(str, values))}: {', '.join(twice)} given twice")
    # Past 2^63 an OverflowError once every clip was embedded; past 2^32 the probe of seed mod 2^32.
    if big := [s for s in seed if not 0 <= s < SEED_LIMIT]:
        raise BenchmarkError(f"--seed {big[0]}: must be in [0, 2**32) (a probe's key takes 32 bits)")
    if probe_steps > MAX_PROBE_STEPS:  # 10^9 fitted for ever (the recipe's is 500)
        raise BenchmarkError(f"--probe-steps {probe_steps}: must be at most {MAX_PROBE_STEPS:,}")
    bad = [p for p in probe if p not in PROBES]
    if min(prototypes, probe_steps, token_batch) < 1 or not 0 < probe_lr < math.inf:  # inf: NaN scores
        raise BenchmarkError(
            f"--prototypes, --probe-steps and --token-batch are >= 1 and --probe-lr > 0, got "
            f"{prototypes}, {probe_steps}, {token_batch}, {probe_lr}"
        )
    if bad or not n_train or not probe or any(n != fewshot.ALL and n < 1 for n in n_train):
        raise BenchmarkError(
            f"probes are {', '.join(PROBES)} and n is -1 (all) or >= 1; got {probe}, {n_train}"
        )
    if task is not None and not task.strip():  # '' took the test folder's name, unsaid
        raise BenchmarkError(f"--task {task!r}: give a name, or leave it out for the test split's folder's")
    try:
        # Absolute: run from inside the task's folder ('test_5s/*.arrow'), the name was '' (a blank column)
        name = task or Path(resolve_files(test)[0]).absolute().parent.parent.name
    except DataError as e:
        raise BenchmarkError(str(e)) from e
    if not name:  # shards in the file system's root folder
        raise BenchmarkError(f"--test {test!r}: its folder names no task: give --task")
    return load_task(name, train, test, n_classes)


def cli(
    backbone: list[str] = [],  # noqa: B006 (tyro reads the default)
    train: str | None = None,
    test: str | None = None,
    task: str | None = None,
    probe: list[str] = list(MULTI_LABEL),  # noqa: B006
    n_train: list[int] = [fewshot.ALL],  # noqa: B006
    seed: list[int] = [0],  # noqa: B006
    loss: Loss = "bce",
    prototypes: int = Recipe.prototypes,
    probe_steps: int = Recipe.steps,
    probe_lr: float = Recipe.lr,
    token_batch: int = Recipe.token_batch,
    results: Path = Path("results"),
    step: int | None = None,
    table: Annotated[Path | None, tyro.conf.arg(metavar="RESULTS")] = None,
    metric: str = "cmap",
    plot: Path | None = None,
    multilabel_column: str = MULTILABEL_COLUMN,
    n_classes: int | None = None,
    audio_root: str | None = None,
    batch_size: int = 16,
    n_workers: int = DEFAULTS["n_workers"],
) -> None:
    """Score frozen backbones on one task the way BirdSet does: linear, MLP and centroid probes on the
    embeddings (and prototypical and attentive probes on the patch tokens, with --probe proto attentive)
    on all or n recordings per class, cmAP, AUROC and top-1 on the test split; every result one row of
    the Parquet store in --results, skipped when already there with the same recipe.

    Args:
        backbone: What to score, side by side: RUN or RUN@STEP (a run's checkpoint) or an export folder,
            random:RUN (its architecture at random init), raw (log-mel mean and std; as tokens, its
            patches), raw:input (the same of the log-mel as the first run's encoder receives it: its
            input normalisation, nothing learned), module:function (an external encoder: spectrogram
            [B, T, M] in, [B, D] embeddings or [B, N, D] tokens out), waveform:module:function (the
            same, called with (waveform [B, samples], sample rate)).
        train: Shards the probes are fitted on (a glob, a folder or a file), e.g. 'hsn/train/*.arrow'.
        test: Shards the probes are scored on, e.g. 'hsn/test_5s/*.arrow'.
        task: The task's name in the store (default: the test split's parent folder's name).
        probe: Probes: linear, mlp, centroid (multi-label, on embeddings); proto (Bird-MAE's prototypical
            probe) and attentive (cross-attention pooling), on patch tokens; softmax, knn (evaluate's
            single-label probes).
        n_train: Recordings per class the probes are fitted on (-1: all); several give a few-shot curve.
        seed: Seeds of the few-shot draws and the probes' init; several give a spread.
        loss: The trained probes' loss: bce (binary cross-entropy) or asl (asymmetric loss).
        prototypes: J, the proto probe's prototypes per class.
        probe_steps: AdamW steps of the trained probes (linear, mlp, proto, attentive).
        probe_lr: Their learning rate.
        token_batch: Clips per step of the token probes (proto, attentive).
        results: The results store (and the embedding cache, RESULTS/cache).
        step: The checkpoint of every RUN named without @STEP (default: its newest).
        table: Print the store in RESULTS as a table (tasks as columns) and exit.
        metric: With --table: the metric shown (cmap, auroc or top1).
        plot: With --table: also draw the metric against n per task, backbone and probe into this figure
            (a PNG; its extension picks another format).
        multilabel_column: The list-of-labels column (BirdSet's); where the shards have none, each clip's
            target is the one-hot of its label (a column named other than the default must be there).
        n_classes: Classes (default: the vocab.json beside the shards, else the ClassLabel names a
            file written by HF datasets keeps).
        audio_root: Where rows that name their audio by a relative path find it (default: each shard's
            folder), for both splits.
        batch_size: Clips per forward pass.
        n_workers: Loader decode threads; 0: one per CPU this process may run on (the result does not
            depend on it).
    """
    try:
        if table is None and (plot is not None or metric != "cmap"):  # else silently not drawn
            raise BenchmarkError("--plot and --metric go with --table RESULTS")
        if table is not None:
            if plot is not None:
                plot = checked_plot(plot)
            rows = stored_results(table)
            print(format_store(rows, metric))
            if plot is not None:
                from birdjepa.benchmark.figures import fewshot_curves

                figure = fewshot_curves(rows, metric)  # it drew cmAP whatever --metric said
                # Whole or not at all, its folder made (as `unwritable` promised): a full disk cut the earlier
                # figure short (its format by --plot's suffix: the partial file's is ".partial").
                write_whole(plot, lambda p: figure.savefig(p, dpi=120, format=plot.suffix[1:].lower()))
                print(f"wrote {plot}")
            return
        # Before the work: the probes were fitted, then a traceback from the store's first write.
        why = unwritable(results / store.ROWS, folder=True) or unwritable(results / "cache", folder=True)
        if why is not None:
            raise BenchmarkError(why)
        t = check_options(backbone=backbone, train=train, test=test, task=task, probe=probe, n_train=n_train,
                          seed=seed, prototypes=prototypes, probe_steps=probe_steps, probe_lr=probe_lr,
                          token_batch=token_batch, n_classes=n_classes, batch_size=batch_size,
                          n_workers=n_workers, audio_root=audio_root)  # fmt: skip
        t0 = time.perf_counter()
        backbones = resolve(backbone, step)
        print(
            f"backbones ready in {time.perf_counter() - t0:.1f} s: {', '.join(b.identity for b in backbones)}"
        )
        rows = run_task(
            t,
            backbones,
            probes=probe,
            n_train=n_train,
            seeds=seed,
            recipe=Recipe(loss, probe_steps, probe_lr, prototypes=prototypes, token_batch=token_batch),
            results=results,
            batch_size=batch_size,
            n_workers=n_workers,
            multilabel_column=multilabel_column,
            audio_root=audio_root,
        )
    except (BenchmarkError, BackboneError, DataError, RuntimeError, ValueError) as e:
        said = out_of_memory(e)
        if said is None and not isinstance(e, (BenchmarkError, BackboneError, DataError, ValueError)):
            raise  # another RuntimeError: a bug's traceback
        if said is not None:  # a traceback (--token-batch 100000: 56 GB)
            e = BenchmarkError(
                f"the device ran out of memory ({said}): a smaller --token-batch or --batch-size"
            )
        print(f"birdjepa benchmark: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None
    except WriteError as e:  # a result, embedding or figure on a full disk: a traceback, its partial kept
        print(f"birdjepa benchmark: error: {e}", file=sys.stderr)
        raise SystemExit(IOERR) from None
    print(format_table(rows))
    try:
        held = len(store.read(results))  # this call's rows are its task's and backbones' only
    except ValueError as e:  # a file another tool put there since: a traceback once the work was stored
        print(f"birdjepa benchmark: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None
    print(f"{len(rows)} results of this task and these backbones; {held} in {results / store.ROWS}")
