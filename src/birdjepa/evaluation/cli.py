"""`birdjepa evaluate RUN`: frozen-encoder evaluation of a run's checkpoint, next to its baselines.

The checkpoint's own configuration says which model, seed and data the run used; ``--data.train`` and
``--data.eval`` point the evaluation at other shards (any set `birdjepa prepare` wrote: shards with a
``vocab.json`` beside them). The restore is the trainer's, verified against the saved norms.

Writing into the run (``RUN/eval/<step>.json``, the default) holds the run's lease, as a trainer does
(`birdjepa.rundir.lease`): a live trainer's run is evaluated with ``--out`` elsewhere, which reads only.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import jax
import tyro

from birdjepa.config import PretrainConfig
from birdjepa.data import DEFAULTS, DataError, Features, Loader, open_shards, resolve_files
from birdjepa.data.loader import loader_refusal, skipped_line
from birdjepa.data.shards import split_labels
from birdjepa.evaluation.embed import Split, batched, embed_split
from birdjepa.evaluation.report import (
    ENCODER,
    RANDOM_INIT,
    Row,
    info,
    score,
    table,
    thin_train_split,
    unusable,
    what_a_row_holds_past_its_label,
    write_json,
)
from birdjepa.exit_codes import IOERR, USAGE
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import encoder_apply
from birdjepa.outputs import WriteError, unwritable
from birdjepa.rundir import checkpoint, layout
from birdjepa.rundir.lease import LeaseHeld, LeaseUnwritable, acquire
from birdjepa.train.determinism import x64_refusal


class EvaluateError(RuntimeError):
    """The evaluation cannot run: no such run or checkpoint, or no data."""


@dataclasses.dataclass(frozen=True)
class EvalData:
    train: str | None = None
    """Labelled shards the probes are fitted on (default: the run's train split)."""
    eval: str | None = None
    """Held-out shards the probes are scored on (default: the run's eval split)."""
    audio_root: str | None = None
    """Where rows that name their audio by a relative path find it (default: the run's --data.audio-root,
    which on another node may not be there)."""


def run_config(meta: dict[str, Any], where: str) -> PretrainConfig:
    """The `PretrainConfig` a checkpoint was written with."""
    from birdjepa.config import ConfigError, recorded, resolve

    try:
        return resolve(PretrainConfig(), recorded(meta["config"]), where)
    except (ConfigError, KeyError) as e:
        raise EvaluateError(f"{where}: its configuration cannot be read by this version: {e}") from e


def embed_splits(
    train_files: list[str],
    eval_files: list[str],
    params: dict[str, Any],
    model_cfg: ModelConfig,
    features: Features,
    *,
    seed: int,
    batch_size: int,
    n_workers: int,
    audio_root: str | None = None,
) -> tuple[Split, Split]:
    """Both splits through every parameter set in ``params`` (name -> params tree) and the raw baseline;
    ``audio_root``: the run's ``--data.audio-root``."""
    apply = jax.jit(encoder_apply(model_cfg))
    encoders = {name: batched(lambda x, p=p: apply(p, x), batch_size) for name, p in params.items()}
    splits = []
    for files in (train_files, eval_files):
        with Loader(files, seed=seed, batch_size=batch_size, n_workers=n_workers, train=False,
                    features=features, audio_root=audio_root) as loader:  # fmt: skip
            loader.say_skips = False  # the evaluation's warnings say them, in its record too
            splits.append(embed_split(loader, encoders))
    return splits[0], splits[1]


def unreadable(*splits: tuple[str, Split]) -> list[str]:
    """A warning for each split with records the loader could not read (a NaN sample, a file a path
    names that is gone): printed, where the evaluation's record listed none."""
    return [skipped_line(*split.unreadable, name) for name, split in splits if split.unreadable[0]]


PROBE_HEAD = "['params']['probe']['head']['kernel']"
"""The online probe's weights in a checkpoint: their shape gives the class count the run was built with."""


@dataclasses.dataclass(frozen=True)
class RestoredCheckpoint:
    """A run's checkpoint restored (norms verified), with the same architecture at random init."""

    step: int
    cfg: PretrainConfig
    model_cfg: ModelConfig
    params: dict[str, Any]
    random_init: dict[str, Any]
    meta: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RestoredRun(RestoredCheckpoint):
    """A restored checkpoint with the data files it is evaluated on."""

    train_files: list[str]
    eval_files: list[str]
    n_classes: int


#: Reads of the newest checkpoint of a live run, each after the trainer's rotation removed the last one.
NEWEST_TRIES = 5


def restore_checkpoint(run_dir: Path, step: int | None = None) -> RestoredCheckpoint:
    """Checkpoint ``step`` (default: the newest) of ``run_dir``, restored as the trainer restores it. The
    architecture comes from the checkpoint alone (its config, and its probe head's class count), so the
    run's data need not be on this machine. The newest of a live run, removed by the trainer's rotation
    while it is read, gives way to the new newest."""
    if not layout.has_checkpoints(run_dir):
        raise EvaluateError(layout.no_run_at(run_dir, "checkpoints/ folder in it"))
    if (why := x64_refusal()) is not None:  # else a leaf "saved as float32, target float64": the checkpoint
        raise EvaluateError(why)
    for _ in range(NEWEST_TRIES - 1):
        try:
            return _restore(run_dir, step)
        except _Rotated:
            continue
    return _restore(run_dir, step)


class _Rotated(checkpoint.CheckpointError):
    """The newest checkpoint, gone while it was read."""


def _restore(run_dir: Path, step: int | None) -> RestoredCheckpoint:
    from birdjepa.train.segment import initial_params, open_segment

    try:
        opened = checkpoint.Checkpointer(run_dir, keep=None, async_save=False)
    except FileNotFoundError as e:  # Orbax reads each step's time as it opens: one removed meanwhile
        if step is None:
            raise _Rotated(str(e)) from e
        raise
    with opened as ckpt:
        steps = ckpt.all_steps()
        if not steps:
            raise EvaluateError(f"{run_dir / 'checkpoints'}: no complete checkpoint")
        at = steps[-1] if step is None else step
        if at not in steps:
            raise EvaluateError(f"{run_dir / 'checkpoints'}: no checkpoint {at}; there are {steps}")
        while True:
            where = layout.checkpoint(run_dir, at)
            try:
                meta = ckpt.checked_meta(at)
                cfg = run_config(meta, str(where))
                shapes = {name: shape for name, shape, _ in meta["state_leaves"]}
                if PROBE_HEAD not in shapes:
                    raise EvaluateError(f"{where}: no probe head {PROBE_HEAD} among the saved leaves")
                seg = open_segment(cfg, ckpt, at=at, n_classes=shapes[PROBE_HEAD][-1], step_fns=False)
                break
            except (checkpoint.CheckpointError, OSError) as e:
                if step is None and (not where.exists() or _superseded(ckpt, at)):
                    raise _Rotated(str(e)) from e
                # The newest that verifies, as a resume picks it: an empty or half-copied folder, arrays
                # cut short. A step asked for is that step or an error.
                if step is not None or at == steps[0] or not isinstance(e, checkpoint.IntegrityError):
                    raise
                older = steps[steps.index(at) - 1]
                print(f"WARNING {e}: reading checkpoint {older}, the newest before it", flush=True)
                at = older
    fresh = initial_params(cfg, seg.model_cfg)
    return RestoredCheckpoint(at, cfg, seg.model_cfg, seg.state.params, fresh, meta)


def _superseded(ckpt: checkpoint.Checkpointer, step: int) -> bool:
    """Whether a newer checkpoint than ``step`` was committed: a trainer's retention removes ``step`` once
    it is, and a read of its files mid-removal failed ("arrays unreadable"), its folder still there."""
    try:
        return ckpt.all_steps()[-1:] != [step]
    except OSError:  # the listing met a folder as it went
        return True


def restore_run(run_dir: Path, step: int | None = None, data: EvalData = EvalData()) -> RestoredRun:
    """`restore_checkpoint`, with the data files it evaluates on (``data`` overrides the run's splits)."""
    from birdjepa.data.loader import no_shards_match
    from birdjepa.data.shards import label_count
    from birdjepa.train.segment import data_files

    restored = restore_checkpoint(run_dir, step)
    cfg = restored.cfg
    # Moved since, or a relative path read from another folder: "[Errno 2] ... 'data/train'", or the
    # labels of a folder that is not there said to differ from the other split's. Both splits at once, a
    # pattern too (the README's 'data/train/*.arrow'): one round trip each.
    gone = [(option, path) for option, given, path in (("train", data.train, cfg.data.train),
                                                       ("eval", data.eval, cfg.data.eval))
            if given is None and path and not (glob.glob(path) if glob.has_magic(path)
                                               else os.path.lexists(path))]  # fmt: skip
    if gone:
        said = " and ".join(f"--data.{option} {path!r}" for option, path in gone)
        why = "; ".join(no_shards_match(path) for _, path in gone)
        give = " ".join(f"--data.{option} PATH" for option, _ in gone)
        it = "it is" if len(gone) == 1 else "they are"
        raise EvaluateError(f"{run_dir} trained on {said}, not there now ({why}): give where {it} now, "
                            f"{give} with --out FILE")  # fmt: skip
    cfg = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, train=data.train or cfg.data.train,
                                      eval=data.eval or cfg.data.eval)
    )  # fmt: skip
    try:
        train_files, eval_files = data_files(cfg)
        n_classes = label_count(train_files)
    except (DataError, FileNotFoundError) as e:
        raise EvaluateError(str(e)) from e
    if not eval_files:
        raise EvaluateError(f"{run_dir} trained on {cfg.data.train} without --data.eval: give held-out "
                            "shards of its classes (--data.eval; `birdjepa prepare SRC OUT --vocab "
                            "TRAIN/vocab.json`)")  # fmt: skip
    fields = {f.name: getattr(restored, f.name) for f in dataclasses.fields(RestoredCheckpoint)}
    return RestoredRun(**{**fields, "cfg": cfg}, train_files=train_files, eval_files=eval_files,
                       n_classes=n_classes)  # fmt: skip


def audio_root(run: RestoredRun, given: EvalData) -> tuple[str | None, str]:
    """The audio root the evaluation reads under, and how to name it: the one given, else the run's."""
    if given.audio_root is not None:
        return given.audio_root, "--data.audio-root"
    return run.cfg.data.audio_root, "the run's --data.audio-root"


def check_trained_on(run: RestoredRun, given: EvalData) -> None:
    """`EvaluateError` where a split the command line did not give, as the run's config names it, holds
    other data here than the run trained (train) or last evaluated (eval) on: a relative path read from
    another folder scored another data set, exit 0 (the eval split's too, where --data.train alone was
    given)."""
    data, (root, named) = run.cfg.data, audio_root(run, given)
    for option, path, files, key in (("train", given.train, run.train_files, "dataset_fingerprint"),
                                     ("eval", given.eval, run.eval_files, "eval_fingerprint")):  # fmt: skip
        recorded = run.meta.get(key)  # absent from checkpoints older than it, and runs never evaluated
        if path is not None or not recorded:
            continue
        opened = open_shards(files, train=False, features=data.features, audio_root=root)
        here, by_path = opened.fingerprint, opened.reads_audio_by_path
        did = "trained" if option == "train" else "evaluated"
        if here != recorded and by_path:  # the audio files' sizes and times count: a copy that lost them
            under = f"under {named} {root}" if root else "under each shard folder"
            raise EvaluateError(
                f"{getattr(data, option)!r}, the {option} split its config names, names its audio by path, "
                f"and the files {under} differ from those the run {did} on in size or modification time "
                f"(fingerprint {here}, not {recorded}): a copy must keep the times (cp -a, rsync -a); or "
                "give --data.train PATH --data.eval PATH with --out FILE"
            )
        if here != recorded:
            raise EvaluateError(
                f"{getattr(data, option)!r}, the {option} split its config names, holds other data here than "
                f"the run {did} on (fingerprint {here}, not {recorded}): a relative path is read from the "
                "current folder, so evaluate from the folder the run was started in, or give --data.train "
                "PATH --data.eval PATH with --out FILE"
            )


def evaluate_checkpoint(
    run_dir: Path,
    step: int | None = None,
    data: EvalData = EvalData(),
    *,
    batch_size: int | None = None,
    n_workers: int = DEFAULTS["n_workers"],
    out: Path | None = None,
) -> tuple[dict[str, Row], dict[str, Any]]:
    """Score checkpoint ``step`` (default: the newest) of ``run_dir`` and its baselines (batches of the
    run's batch size unless ``batch_size``); writes
    ``out`` (default ``run_dir/eval/<step>.json``) and returns the rows and the document's other fields."""
    t0 = time.perf_counter()
    run = restore_run(run_dir, step, data)
    cfg, model_cfg, train_files, eval_files = run.cfg, run.model_cfg, run.train_files, run.eval_files
    root, named = audio_root(run, data)  # the run's, on another node, may be no folder: said, not a traceback
    if (why := loader_refusal(batch_size, n_workers, cfg.data.features, root, named)) is not None:
        raise EvaluateError(
            why if data.audio_root is not None else f"{why}: give another with --data.audio-root"
        )
    check_trained_on(run, data)
    train, held_out = embed_splits(
        train_files, eval_files, {ENCODER: run.params, RANDOM_INIT: run.random_init}, model_cfg,
        cfg.data.features, seed=cfg.seed, batch_size=batch_size or cfg.data.batch_size, n_workers=n_workers,
        audio_root=root,
    )  # fmt: skip
    if (why := unusable(train, held_out, (train_files, eval_files))) is not None:
        raise EvaluateError(why)
    t_embed = time.perf_counter() - t0
    rows = score(train, held_out, linear=True, seed=cfg.seed)
    files, splits = (train_files, eval_files), (train, held_out)
    doc = info(run_dir, run.step, cfg.seed, model_cfg, files, splits, run.n_classes)
    doc["data"]["audio_root"] = root  # where rows naming their audio by path were read (None: by each shard)
    names, _ = split_labels(train_files)
    doc["warnings"] = [*unreadable(("train", train), ("eval", held_out)),
                       *thin_train_split(train.labels, held_out.labels, rows, names),
                       *what_a_row_holds_past_its_label(eval_files, cfg.data.features)]  # fmt: skip
    doc["timing_s"] = {"embed": t_embed, "probes": time.perf_counter() - t0 - t_embed}
    doc["written_to"] = str(write_json(out or layout.eval_report(run_dir, run.step), rows, doc))
    return rows, doc


def summary_line(doc: dict[str, Any]) -> str:
    d = doc["data"]
    unlabelled = (
        f" ({d['unlabelled_skipped']} clips without a label left out)" if d["unlabelled_skipped"] else ""
    )
    return (
        f"frozen-encoder evaluation of {doc['checkpoint']}: {d['n_train']} train / {d['n_eval']} eval "
        f"clips{unlabelled}, {d['n_classes']} classes (chance {d['chance']:.3f}); one crop per "
        "recording (its window's start where the row has one, else its centre)"
    )


def cli(
    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")],
    step: int | None = None,
    data: EvalData = EvalData(),
    batch_size: int | None = None,
    n_workers: int = DEFAULTS["n_workers"],
    out: Path | None = None,
) -> None:
    """Frozen-encoder evaluation of a checkpoint: linear probe and kNN on its embeddings, beside the same
    architecture at random init and a raw log-mel baseline; writes RUN/eval/<step>.json.

    Args:
        run: Run directory (e.g. runs/demo).
        step: Checkpoint step (default: the newest).
        data: Shards to fit and score the probes on (default: the run's own train and eval splits).
        batch_size: Clips per forward pass (default: the run's batch size, as the trainer evaluates;
            another size can change embeddings in the last bits).
        n_workers: Loader decode threads; 0: one per CPU this process may run on (the result does not
            depend on it).
        out: Where to write the JSON (default: RUN/eval/<step>.json; needed with --data.train or --data.eval,
            whose scores are not the run's own).
    """
    for flag, value, least in (("--batch-size", batch_size, 1), ("--n-workers", n_workers, 0)):
        if value is not None and value < least:  # --batch-size 0 was the run's batch size, said nowhere
            print(f"birdjepa evaluate: error: {flag} {value}: must be >= {least}", file=sys.stderr)
            raise SystemExit(USAGE)
    # The batch's bound: with the run's features, after the restore; a root given: before it.
    if why := loader_refusal(None, n_workers, audio_root=data.audio_root, root_flag="--data.audio-root"):
        print(f"birdjepa evaluate: error: {why}", file=sys.stderr)
        raise SystemExit(USAGE)
    if out is None and (data.train is not None or data.eval is not None):  # it replaced the run's own record
        print(f"birdjepa evaluate: error: --data.train/--data.eval without --out: {run}/eval/<step>.json "
              "holds the evaluation on the run's own splits; give --out FILE for this one",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(USAGE)
    why = unwritable(out) if out is not None else None
    if why is not None:  # before the work: a traceback once the evaluation was done
        print(f"birdjepa evaluate: error: {why}", file=sys.stderr)
        raise SystemExit(USAGE)
    lease = None
    try:
        if out is None and layout.has_checkpoints(Path(run)):  # it writes into the run: one writer per run
            lease = acquire(Path(run))
    except LeaseHeld as e:
        print(f"birdjepa evaluate: error: {e}; evaluate it with --out FILE to leave the run untouched",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(USAGE) from None
    except LeaseUnwritable as e:  # a read-only run: --out elsewhere only reads it
        print(f"birdjepa evaluate: error: {e}; nothing was touched. Evaluate it with --out FILE in a folder "
              "you can write: that only reads the run", file=sys.stderr)  # fmt: skip
        raise SystemExit(IOERR) from None
    try:
        for files in (data.train, data.eval):  # before the restore: a typo fails at once
            if files is not None:
                missing = [f for f in resolve_files(files) if not Path(f).is_file()]
                if missing:
                    raise EvaluateError(f"{missing[0]}: no such shard file")
        rows, doc = evaluate_checkpoint(run, step, data, batch_size=batch_size, n_workers=n_workers, out=out)
    except (EvaluateError, DataError, checkpoint.CheckpointError) as e:  # as export's and embed's: exit 2
        print(f"birdjepa evaluate: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None
    except WriteError as e:  # a full disk: a traceback, and the earlier record cut short
        print(f"birdjepa evaluate: error: {e}", file=sys.stderr)
        raise SystemExit(IOERR) from None
    finally:
        if lease is not None:
            lease.release()
    for warning in ([doc["data"]["overlap"]] if doc["data"]["overlap"] else []) + doc["warnings"]:
        print(f"WARNING {warning}", flush=True)
    print(summary_line(doc))
    print(table(rows, encoder_title=f"encoder (step {doc['step']})", overlap=doc["data"]["overlap"]))
    print(f"wrote {doc['written_to']}")
