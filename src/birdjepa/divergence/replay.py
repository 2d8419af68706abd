"""Re-execute a run's steps exactly as they ran, from its run directory.

`open_at(run_dir, step)` restores the newest checkpoint before ``step`` (or the state of step 0, which
the config alone determines) and replays the steps in between with the loop's own step
(`birdjepa.train.segment.advance`), comparing each replayed step's logged metrics with ``==``. It stops
at the first mismatch: the run directory then does not describe what replays from it, and nothing
traced after that point could be trusted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax

from birdjepa import multihost
from birdjepa.config import ConfigError, PretrainConfig, recorded, resolve
from birdjepa.data import Batch, DataError, Loader
from birdjepa.data.loader import loader_refusal
from birdjepa.model.config import ModelConfig
from birdjepa.resume.checks import describe_changes, machine_changes
from birdjepa.rundir import checkpoint, layout
from birdjepa.rundir.checkpoint.norms import tree_norms
from birdjepa.rundir.metrics_log import NON_FINITE, by_step, read_metrics
from birdjepa.train import revisions
from birdjepa.train.compiled import Compiled
from birdjepa.train.determinism import DEVICE_COUNT_FLAG, machine_kind, x64_refusal
from birdjepa.train.segment import advance, open_loader, open_segment
from birdjepa.train.state import TrainState

#: Logged metrics that a replay recomputes and compares with ``==``: what the step returns, the loader's
#: index checksum and the parameter norms. Timings, diagnostics and evaluations are not re-run.
REPLAYED_PREFIXES = ("train/",)
NOT_REPLAYED = frozenset({"train/step_time", "train/data_wait"})


class ReplayError(RuntimeError):
    """A run cannot be re-executed at the step asked for (one line: what and where)."""


@dataclasses.dataclass
class OpenRun:
    """A run restored to just before ``state.step``, with the loader at that step's batch."""

    run_dir: Path
    cfg: PretrainConfig
    model_cfg: ModelConfig
    fns: Compiled
    state: TrainState
    loader: Loader
    restored_from: int | None
    """The checkpoint it started from (None: the state of step 0, built from the config)."""
    replayed: list[int]
    """Steps replayed from there, each with its logged metrics equal."""
    logged: dict[int, dict[str, float]]
    trained_on: dict[str, str] | None = None
    """`machine_kind` recorded by the checkpoint it started from (None: not recorded)."""
    written_at: Callable[[int], dict[str, Any] | None] = lambda step: None
    """The meta of the first checkpoint the segment that trained a step wrote (`written_at`; None: none),
    which records the revisions of the step and of the decoder it ran with; asked only where a step does
    not replay or is traced."""
    unlogged: list[int] = dataclasses.field(default_factory=list)
    """Replayed steps the log holds no metrics of (nothing to compare: said, not called equal)."""

    def revision_at(self, step: int) -> int | None:
        """The revision of the step (`birdjepa.train.revisions`) that trained ``step`` (None: unknown; a
        checkpoint written before revisions were recorded was written at revision 1)."""
        meta = self.written_at(step)
        return meta.get("step_revision", 1) if meta is not None else None

    def decoded_at(self, step: int) -> tuple[int | None, list[str]]:
        """The revision of the decoder that decoded ``step``'s batch (None: unrecorded) and its declared
        changes to this birdjepa's decoder that move this run's samples (none: the same, or unknown)."""
        meta = self.written_at(step)
        if meta is None:
            return None, []
        saved = meta.get("decode_revision")
        return saved, revisions.decode_changes(saved, self.cfg.data.features.gapless)

    def batch(self) -> Batch:
        """The batch of step ``state.step`` (each call takes the next one)."""
        return next(self.loader)

    def step(self, batch: Batch) -> dict[str, float]:
        """Run step ``state.step`` as the loop does; returns its replayable metrics."""
        self.state, metrics, _, _ = advance(self.fns, self.cfg, self.state, batch)
        return replayable(self.state, metrics, batch)

    def close(self) -> None:
        self.loader.close()


def replayable(state: TrainState, metrics: dict[str, Any], batch: Batch) -> dict[str, float]:
    """The metrics a replay compares, computed as the loop logs them."""
    out = {k: float(v) for k, v in metrics.items()}
    out["train/skipped_updates"] = float(state.skipped)
    out["dataloader/index_crc32"] = multihost.index_crc32(batch["index"])
    norms = tree_norms(multihost.host(state.params), "param_norm")
    out.update({f"train/{k}": v for k, v in norms.items()})
    return out


def compared_keys(logged: dict[str, Any]) -> list[str]:
    return sorted(
        k
        for k in logged
        if (k.startswith(REPLAYED_PREFIXES) and k not in NOT_REPLAYED) or k == "dataloader/index_crc32"
    )


def first_mismatch(logged: dict[str, Any], replayed: dict[str, float]) -> tuple[str, Any, Any] | None:
    """The first logged metric that the replay does not reproduce with ``==`` (NaN equals NaN; the log
    spells a non-finite value as a string, ``"nan"``: every skipped step of ``--on-nonfinite skip`` was
    "trained by other code")."""
    for k in compared_keys(logged):
        a, b = logged[k], replayed.get(k)
        a = float(a) if a in NON_FINITE else a
        same = a == b or (isinstance(a, float) and b is not None and math.isnan(a) and math.isnan(b))
        if not same:
            return k, a, b
    return None


def _saved_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.json; `ReplayError` where it is no JSON (a traceback, exit 1)."""
    try:
        return layout.read_config(run_dir)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ReplayError(f"{layout.config_file(run_dir)}: not a readable config ({e})") from None


def _options_at(
    run_dir: Path, ckpt: checkpoint.Checkpointer, lines: list[dict[str, Any]], base: int | None, step: int
) -> tuple[PretrainConfig, str]:
    """The options to replay ``base + 1``..``step`` with (``base`` None: from the start), and where they
    come from."""
    where = str(layout.checkpoint(run_dir, base) if base is not None else layout.config_file(run_dir))
    changed = options_changed(run_dir, lines, 0 if base is None else base + 1, step)
    if changed is not None:  # the options of the steps replayed: config.json holds the newest only
        return read_config(*changed), where
    if base is not None:
        try:
            return read_config(ckpt.read_meta(base)["config"], where), where
        except (checkpoint.CheckpointError, KeyError, OSError, ValueError):  # open_segment says it as damage
            pass
    if layout.config_file(run_dir).exists():
        return read_config(_saved_config(run_dir), where), where
    raise ReplayError(
        f"{run_dir}: no checkpoint before step {step} and no {layout.CONFIG_FILE} to start from"
    )


def read_config(config: dict[str, Any], where: str) -> PretrainConfig:
    try:
        return resolve(PretrainConfig(), recorded(config), where)
    except (ConfigError, KeyError) as e:
        raise ReplayError(f"{where}: its configuration cannot be read by this version: {e}") from e


def options_changed(
    run_dir: Path, lines: list[dict[str, Any]], first: int, step: int
) -> tuple[dict[str, Any], str] | None:
    """The options that trained steps ``first``..``step`` (``first``: the first to replay), and where
    they were read, where the run's options changed (--allow-config-change: ``config_changed`` events,
    each holding the options ``before`` it): the ``before`` of the first change after ``first``, or
    config.json's for a change at ``first`` itself. None where no change concerns them (the checkpoint's
    before ``first`` or config.json's, as in a run never changed). ``lines``: the run's log. Raises
    `ReplayError` where those steps were trained under two sets of options: no checkpoint between them to
    start from."""
    changes = [e for e in lines if e.get("event") == "config_changed"]
    later = [e for e in changes if e["step"] > first]
    if later and later[0]["step"] <= step:
        at, what = later[0]["step"], ", ".join(later[0]["changes"])
        raise ReplayError(
            f"{run_dir}: its options changed at step {at} (--allow-config-change: {what}), and no checkpoint "
            f"from step {at - 1} on before step {step} is kept to replay it from: steps {first}-{step} were "
            f"trained under two sets of options. Trace a step before {at}, or one after a kept checkpoint "
            "of the new options (a run keeps more with pretrain's --ckpt-keep)"
        )
    if later:
        where = f"{layout.metrics_file(run_dir)}: the config_changed event of step {later[0]['step']}"
        return later[0]["before"], where
    if any(e["step"] == first for e in changes):
        return _saved_config(run_dir), str(layout.config_file(run_dir))
    return None


def last_step(logged: dict[int, dict[str, float]], steps: list[int]) -> int | None:
    """The last step the run ran: the newest logged (``logged``: its log by step) or checkpointed one. A
    line of a step's resume checks alone is no step run: a refused resume logs one, and its step was
    traced and said to match (``compared_keys``: what a step that ran logs)."""
    known = [*(s for s, m in logged.items() if compared_keys(m)), *steps]
    return max(known) if known else None


def open_at(
    run_dir: Path, step: int, *, on_step: Callable[[int, dict[str, float]], None] | None = None
) -> OpenRun:
    """``run_dir`` restored to just before ``step`` (checkpoint ``step - 1``, or the newest before it and
    the steps in between replayed; ``on_step(s, metrics)`` after each). Raises `ReplayError`."""
    run_dir = Path(run_dir)
    if not layout.is_run(run_dir):
        raise ReplayError(layout.no_run_at(run_dir))
    if (why := x64_refusal()) is not None:
        raise ReplayError(why)
    lines = list(read_metrics(run_dir)) if layout.metrics_file(run_dir).exists() else []  # read once
    logged = by_step(lines, everything=True)
    with checkpoint.Checkpointer(run_dir, keep=None, async_save=False, create=False) as ckpt:
        steps = ckpt.all_steps()
        last = last_step(logged, steps)
        if step < 0 or last is None or step > last:
            ran = f"it ran steps 0-{last}" if last is not None else "it ran no step"
            raise ReplayError(f"{run_dir}: step {step} was never run ({ran})")
        # The newest checkpoint before the step that verifies, the steps after it replayed (a damaged one
        # ended trace and bisect, which the docs promise go back to "the newest earlier one").
        for base in [*sorted((s for s in steps if s < step), reverse=True), None]:
            cfg, where = _options_at(run_dir, ckpt, lines, base, step)
            try:
                seg = open_segment(cfg, ckpt, at=base)
                break
            except checkpoint.IntegrityError as e:
                print(f"WARNING {e}: replaying from the checkpoint before it", flush=True)
            except checkpoint.CheckpointError as e:
                raise ReplayError(str(e)) from e
            except (DataError, FileNotFoundError) as e:  # moved since: said how to replay all the same
                raise ReplayError(f"{run_dir}: its train data cannot be read: {e} (replays read the path "
                                  "the run recorded, from the folder it was started in: where the data "
                                  "moved, link it back there)") from e  # fmt: skip
            except ValueError as e:  # --train.virtual-shards that this process's devices do not divide
                raise ReplayError(f"{where}: {e}") from e
        metas = {}
        for s in steps:  # what each segment trained on: the device check's
            with contextlib.suppress(Exception):
                metas[s] = ckpt.read_meta(s)
    (train_files, _), model_cfg, fns, state, meta = seg.files, seg.model_cfg, seg.fns, seg.state, seg.meta
    check_devices(run_dir, devices_at(lines, metas, step), cfg.train.virtual_shards)
    # The run's audio root, gone from this machine: the loader's ValueError was a traceback.
    root = cfg.data.audio_root
    if why := loader_refusal(
        None, cfg.data.n_workers, audio_root=root, root_flag="the run's --data.audio-root"
    ):
        raise ReplayError(f"{where}: {why} (replays read the audio where the run did: where it moved, link "
                          "it back there)")  # fmt: skip
    loader, error = open_loader(cfg, train_files, state.loader_state, resumed=base is not None)
    if error is not None:
        loader.close()
        raise ReplayError(f"{where}: the loader cannot restore its state ({error})")
    if meta is not None and meta.get("dataset_fingerprint") not in (None, loader.fingerprint):
        loader.close()
        raise ReplayError(f"{where}: the train data changed since this checkpoint (another fingerprint)")
    trained_on = (meta or {}).get("machine")
    by = functools.partial(written_at, lines, metas)  # each call reads the whole log: asked rarely
    run = OpenRun(run_dir, cfg, model_cfg, fns, fns.place(state), loader, base, [], logged, trained_on, by)
    try:
        replay_to(run, step, on_step)
    except BaseException:
        run.close()
        raise
    return run


def replay_to(
    run: OpenRun, step: int, on_step: Callable[[int, dict[str, float]], None] | None = None
) -> None:
    """Run the steps from ``run.state.step`` to ``step - 1``, each compared with its logged metrics."""
    while run.state.step < step:
        s = run.state.step
        metrics = run.step(run.batch())
        mismatch = first_mismatch(run.logged.get(s, {}), metrics)
        if mismatch is not None:
            name, a, b = mismatch
            origin = f"checkpoint {run.restored_from}" if run.restored_from is not None else "step 0"
            raise ReplayError(
                f"{run.run_dir}: step {s} does not replay as it ran: {name} logged {a!r}, replayed {b!r} "
                f"(replayed from {origin}){not_here(run, s)}"
            )
        run.replayed.append(s)
        if not compared_keys(run.logged.get(s, {})):  # --log-every N, a log cut short: nothing compared
            run.unlogged.append(s)
        if on_step is not None:
            on_step(s, metrics)


def devices_at(lines: list[dict[str, Any]], metas: dict[int, dict[str, Any]], step: int) -> int | None:
    """The device count of the segment that trained ``step`` (None: unknown): its resume event's (the
    last one logged at or before ``step``), else that of the first checkpoint it wrote (a checkpoint's
    ``next_step`` holds its writer's). The restored checkpoint's was the segment's before: a run resumed
    on 1 device after 4 was refused for 4, and its steps could be traced on no count."""
    starts = _starts(lines, step)
    if starts and starts[-1].get("n_devices") is not None:
        return starts[-1]["n_devices"]
    meta = _first_written(starts, metas)
    return meta.get("next_step", {}).get("n_devices") if meta is not None else None


def written_at(
    lines: list[dict[str, Any]], metas: dict[int, dict[str, Any]], step: int
) -> dict[str, Any] | None:
    """The meta of the first checkpoint the segment that trained ``step`` wrote (None: none), which
    records what trained it."""
    return _first_written(_starts(lines, step), metas)


def not_here(run: OpenRun, step: int) -> str:
    """Why ``step`` of ``run`` may not re-execute here as it trained, as a sentence to append ("" where
    nothing recorded says): another kind of machine (a CPU thread pool of another size, say), or another
    revision of the step."""
    moved = describe_changes(machine_changes(run.trained_on, machine_kind()))
    why = f". It trained on another kind of machine ({moved}): trace it on that kind" if moved else ""
    return why + revised(run.revision_at(step)) + decoded_apart(*run.decoded_at(step))


def revised(trained_by: int | None) -> str:
    """Why a step trained by revision ``trained_by`` of the step does not re-execute as it ran ("" where
    this code's is the same, or unknown)."""
    crossed = revisions.between(trained_by) if trained_by is not None else []
    if not crossed:
        return ""
    return (f". It was trained by revision {trained_by} of the step and this birdjepa computes revision "
            f"{revisions.REVISION} ({'; '.join(r.what for r in crossed)}): trace it with the birdjepa "
            "that trained it")  # fmt: skip


def decoded_apart(trained_by: int | None, changes: list[str]) -> str:
    """Why a step's batch, decoded by revision ``trained_by`` of the decoder, may decode to other samples
    here ("" where none of the declared ``changes`` between the two moves the run)."""
    if not changes:
        return ""
    return (f". Its batch was decoded by revision {trained_by or 'unrecorded'} of the decoder and this "
            f"birdjepa decodes revision {revisions.DECODE_REVISION} ({'; '.join(changes)}): where the run's "
            "data holds such recordings, they decode to other samples here; trace it with the birdjepa "
            "that trained it")  # fmt: skip


def _starts(lines: list[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """The resume events logged at or before ``step``."""
    return [e for e in lines if e.get("event") == "resume" and e.get("step", math.inf) <= step]


def _first_written(starts: list[dict[str, Any]], metas: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """The meta of the first checkpoint the segment that began at the last of ``starts`` wrote."""
    begun = starts[-1]["step"] if starts else 0
    written = sorted(s for s in metas if s >= begun)
    return metas[written[0]] if written else None


def check_devices(run_dir: Path, want: int | None, virtual: int | None) -> None:
    """A step re-executes exactly only on as many devices as it ran on (``want``); with
    ``--train.virtual-shards`` on any device count that divides it (checked where the step is built)."""
    have = jax.device_count()
    if want is not None and want != have and not virtual:
        raise ReplayError(
            f"{run_dir}: it trained on {want} devices and this process has {have}; re-run with "
            f"XLA_FLAGS={DEVICE_COUNT_FLAG}={want} (CPU) or on {want} devices"
        )
