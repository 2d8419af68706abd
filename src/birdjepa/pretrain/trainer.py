"""`Trainer`: what stays fixed while a run segment of `birdjepa pretrain` trains, and what the loop asks
of it besides the step: the resume checks, the non-finite report, the evaluation, the save.

The loop itself (`birdjepa.pretrain.loop`) reads top to bottom and calls these; the step's pieces live
below, in `birdjepa.train` (state, step, compiled functions, checkpoints, the segment's set-up).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Any

import jax
import numpy as np

from birdjepa import exit_codes, multihost
from birdjepa.config import PretrainConfig, to_dict
from birdjepa.data import Batch, DataError, Loader
from birdjepa.data.shards import split_labels
from birdjepa.diagnostics.callbacks import (
    Callback,
    Callbacks,
    IidCallback,
    SkippedRecordsCallback,
    UpdateMonitorCallback,
)
from birdjepa.diagnostics.monitor import leaf_names, param_names
from birdjepa.evaluation import report as eval_report
from birdjepa.evaluation.embed import Encode, Split, batched
from birdjepa.evaluation.periodic import PeriodicEval
from birdjepa.evaluation.report import ENCODER, Row, thin_train_split, what_a_row_holds_past_its_label
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import init_params
from birdjepa.objectives.supervised import probe_metrics
from birdjepa.outputs import mib
from birdjepa.pretrain.wandb_mirror import open_run
from birdjepa.resume import checks as resume_check
from birdjepa.rundir import checkpoint, kept, layout
from birdjepa.rundir.checkpoint.norms import tree_norms
from birdjepa.rundir.metrics_log import MetricsLog, NullLog
from birdjepa.seams import planted
from birdjepa.train import revisions
from birdjepa.train import state as state_lib
from birdjepa.train.compiled import Compiled
from birdjepa.train.determinism import X64_WHY, machine_kind, x64_refusal
from birdjepa.train.digest import hex_digest
from birdjepa.train.optim import accumulation_progress, make_schedule, update_count
from birdjepa.train.segment import initial_params, total_updates
from birdjepa.train.state import TrainState
from birdjepa.train.step import init_key, step_key
from birdjepa.validation import OptionError


def git_commit() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[3]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


def online_probe_metrics(probe_params: Any, held_out: Split) -> dict[str, float]:
    """The online probe (a health signal, not evidence of learning) on the held-out embeddings."""
    head = multihost.host(probe_params["head"])
    logits = held_out.features[ENCODER].astype(np.float64) @ head["kernel"] + head["bias"]
    m = probe_metrics(logits, held_out.labels)
    return {"eval/probe_ce": float(m["probe_ce"]), "eval/probe_acc": float(m["probe_acc"])}


def make_callbacks(cfg: PretrainConfig, loader: Loader, params: Any) -> Callbacks:
    items: list[Callback] = [IidCallback(loader.shard_sizes, cfg.iid_window), SkippedRecordsCallback(loader)]
    if cfg.monitor_interval > 0:
        items.append(UpdateMonitorCallback(param_names(params), idle=cfg.objective.options.IDLE_PARAMS))
    return Callbacks(items)


def check_device_options(cfg: PretrainConfig) -> None:
    """The options the devices decide, checked with the others before a run directory, a lease or a
    checkpointer exists (`validation.check` holds the rest; it imports no JAX): the batch divides over
    the devices, and ``--train.virtual-shards`` runs in one process (its step moves each shard's results
    between devices of one process), whose devices divide it."""
    if x64_refusal() is not None:  # a KeyError from the digest at a fresh start's first step too
        raise OptionError("$JAX_ENABLE_X64", os.environ.get("JAX_ENABLE_X64", True), X64_WHY)
    shards, devices = cfg.train.virtual_shards, jax.device_count()
    if shards and jax.process_count() > 1:
        raise OptionError("train.virtual_shards", shards, f"runs in one process, not {jax.process_count()}")
    if shards and shards % devices:
        raise OptionError("train.virtual_shards", shards, f"the {devices} devices must divide it")
    if cfg.data.batch_size % devices:
        raise OptionError("data.batch_size", cfg.data.batch_size, f"must divide over the {devices} devices")


#: How many times the parameters' norm at step 0 a checkpoint's may be before a non-finite stop says
#: they blew up (a run's norm moves by percents; lr 1e3 took it from 41 to 1.6e10).
GREW = 100.0


def what_to_resume(norms: dict[int, float], start: float) -> tuple[str, bool]:
    """After a non-finite stop, what its checkpoints (step -> parameters' norm) are worth, said, and
    whether one is worth resuming. Finite is not sound: skipped steps between saves (a huge --optim.lr)
    saved parameters of norm 1e33 against 41 at the start (``start``), and a resume from them could only
    blow up again; growth that began before the oldest kept checkpoint was not seen against that one."""
    if not norms:
        return kept.NONE_YET, False
    steps = sorted(norms)
    said = f"the newest checkpoint ({steps[-1]}) is finite"
    sound = [s for s in steps if not start > 0 or norms[s] <= GREW * start]
    if sound and sound[-1] == steps[-1]:  # an older one's growth is not the newest's
        return said, True
    grew = f", but its parameters' norm is {norms[steps[-1]]:.3g}, {norms[steps[-1]] / start:.3g}x step 0's"
    if sound:
        return f"{said}{grew}: move the checkpoints after {sound[-1]} aside", True
    return (
        f"{said}{grew}, and every checkpoint's grew so: none is worth resuming; train it in a new run",
        False,
    )


class Trainer:
    """What stays fixed while a run segment trains: the data, the model, the optimizer, the devices, the
    compiled functions, the checkpointer and the log. It advances a `TrainState`."""

    def __init__(
        self,
        cfg: PretrainConfig,
        model_cfg: ModelConfig,
        fns: Compiled,
        files: tuple[list[str], list[str]],
        ckpt: checkpoint.Checkpointer,
        restart: int,
    ) -> None:
        self.cfg, self.model_cfg, self.ckpt = cfg, model_cfg, ckpt
        self.train_files, self.eval_files = files
        self.schedule = make_schedule(cfg.optim, total_updates(cfg), planted(cfg.debug.plant))
        self.main = multihost.is_main()
        # What every checkpoint's meta repeats, computed once for the segment.
        self.config, self.git, self.machine = to_dict(cfg), git_commit(), machine_kind()
        devices = jax.devices()
        self.n_devices = len(devices)
        print(f"devices={len(devices)} ({devices[0].platform}) processes={jax.process_count()}", flush=True)
        self.fns = fns
        self.rows = multihost.local_rows(fns.sharded, cfg.data.batch_size)
        self.leaf_names: list[str] = []  # of the parameters, for the non-finite guard's report
        self.disk_warned = False
        self._shard_digests: dict[str, str] | None = None
        # None without eval shards: a run on the user's shards with --eval-every 0 (`segment.data_files`).
        self.evaluator = PeriodicEval(
            self.train_files, self.eval_files, features=cfg.data.features, seed=cfg.seed,
            batch_size=cfg.data.batch_size, n_workers=cfg.data.n_workers, random_init=self.random_init,
            audio_root=cfg.data.audio_root,
        ) if self.eval_files else None  # fmt: skip
        self.held_out_clips: int | None = None  # scored by the last evaluation: what its accuracies are over
        self.held_out_chance = 0.0  # and what a probe that learned nothing scores there
        if self.evaluator is not None and self.evaluator.overlap and self.main:
            print(f"WARNING {self.evaluator.overlap}", flush=True)
        for split, files in (("train", self.train_files), ("eval", self.eval_files)):
            names, mixed = split_labels(files) if files and self.main else (None, None)
            if mixed:
                print(f"the {split} shards' folders index different vocabularies ({mixed}): each label is "
                      f"read by its name, as one of the split's {len(names or ())}", flush=True)  # fmt: skip
        self.wandb_run = open_run(cfg.log.wandb if self.main else "disabled", cfg.run_dir, cfg.run,
                                  cfg.log.wandb_project, self.config, restart)  # fmt: skip
        self.log = (
            MetricsLog(cfg.run_dir, restart=restart, wandb_run=self.wandb_run) if self.main else NullLog()
        )

    def encoder(self, params: Any) -> Encode:
        """Embeddings of a host batch of spectrograms under ``params`` (sharded like a train batch)."""

        def apply(x: np.ndarray) -> np.ndarray:
            return multihost.host(
                self.fns.encode(params, multihost.global_batch({"s": x}, self.fns.sharded)["s"])
            )

        return batched(apply, self.cfg.data.batch_size)

    def random_init(self) -> Encode:  # fresh arrays: the first params are donated to the first step
        params = init_params(self.model_cfg, init_key(self.cfg))["params"]
        return self.encoder(jax.device_put(params, self.fns.replicated))

    def shard_digests(self, loader: Loader) -> dict[str, str]:
        """The train shards' content digests (`Loader.shard_digests`), read once a segment: every save
        records them, and the resume's dataset check compares them."""
        if self._shard_digests is None:
            self._shard_digests = loader.shard_digests()
        return self._shard_digests

    def next_step(self, state: TrainState, batch: Batch, *, legacy: bool = False) -> resume_check.NextStep:
        """What step ``state.step`` will do with ``batch`` (recorded at save, re-derived on resume);
        ``legacy``: as a checkpoint written before the terms and gradients were recorded holds it."""
        key, _ = step_key(self.cfg, state.chain, state.step)
        update = int(multihost.host(update_count(state.opt_state)))
        accumulated = int(multihost.host(accumulation_progress(state.opt_state)))
        lr = float(self.schedule(update))
        params, on_device = state.params, self.fns.on_device(batch)
        if legacy:
            loss = float(multihost.host(self.fns.loss_only(params, on_device, key)))
            return resume_check.NextStep.of(
                state.step, batch, key, update, lr, accumulated, loss, self.n_devices
            )
        loss, terms, grads = multihost.host(self.fns.next_step(params, on_device, key))
        terms = {k: float(v) for k, v in terms.items()}
        grads = {k: hex_digest(v) for k, v in grads.items()}
        return resume_check.NextStep.of(
            state.step, batch, key, update, lr, accumulated, float(loss), self.n_devices, terms, grads
        )

    def check_finished(self, state: TrainState, meta: dict[str, Any]) -> int:
        """A start of a finished run: 0 (nothing to do), or `RESUME_CHECK` where options that change the run
        were given (an edited sweep config said "nothing to do", exit 0, as if it had run)."""
        _, breaking = resume_check.config_diff(meta["config"], self.config)
        # Its checkpoint may be a stop before its own end (--steps given below it): not "finished".
        last, finished = state.step - 1, state.step >= meta["config"].get("steps", state.step)
        if not breaking or (self.cfg.allow_config_change and finished):
            return 0
        if self.cfg.allow_config_change:  # "already finished", exit 0: nothing recorded it, and the next
            saved = meta["config"].get("steps")  # bare start trained on to the checkpoint's --steps
            print(f"ERROR: run {self.cfg.run} has trained through step {last}, and --steps {self.cfg.steps} "
                  f"would end it there: a run is not ended at a step it trained (its checkpoint holds "
                  f"--steps {saved}, which the next start trains on). Give --steps above {last + 1}, or "
                  f"another --run; exit {exit_codes.RESUME_CHECK}", flush=True)  # fmt: skip
            return exit_codes.RESUME_CHECK
        done = (
            f"finished at step {last}"
            if finished
            else f"has trained through step {last}, --steps {self.cfg.steps} ends it there,"
        )
        print(f"ERROR: run {self.cfg.run} {done} with other options than these ({','.join(breaking)}): "
              "nothing was trained with them. Give another --run, or leave them out; exit "
              f"{exit_codes.RESUME_CHECK}", flush=True)  # fmt: skip
        return exit_codes.RESUME_CHECK

    def check_eval_data(self, meta: dict[str, Any], step: int) -> None:
        """A WARNING and an ``eval_data_changed`` event where the eval split is other data than the
        checkpoint of ``step - 1`` was evaluated on. It moves no training bit, but every eval metric
        after it: a changed one was found only by `compare` (eval/knn_acc differs from the step after the
        resume, every check "ok")."""
        saved_eval = meta.get("eval_fingerprint")
        eval_now = self.evaluator.eval_loader.fingerprint if self.evaluator else None
        if saved_eval and eval_now and saved_eval != eval_now:
            print(f"WARNING the eval split is other data than checkpoint {step - 1}'s (fingerprint "
                  f"{saved_eval} -> {eval_now}): the eval metrics from here on are not comparable with those "
                  "before", flush=True)  # fmt: skip
            self.log.event("eval_data_changed", step, fingerprint=[saved_eval, eval_now])

    def check_resume(
        self, state: TrainState, meta: dict[str, Any], batch: Batch, loader: Loader, loader_error: str | None
    ) -> int:
        """The resume checks before the first update: 0, or the exit code when they fail and stop the run."""
        cfg, step = self.cfg, state.step
        moved = resume_check.machine_changes(meta.get("machine"), self.machine)
        if moved:  # bit-for-bit equality with the uninterrupted run holds on one kind of machine only
            print(f"WARNING resumed on another kind of machine than checkpoint {step - 1} was written on "
                  f"({resume_check.describe_changes(moved)}): XLA compiles for the device and its version, "
                  f"so from here the run can differ from an uninterrupted one in the last bits",
                  flush=True)  # fmt: skip
            self.log.event("machine_changed", step, **{k: list(v) for k, v in moved.items()})
        saved_devices = meta["next_step"].get("n_devices", self.n_devices)
        if saved_devices != self.n_devices and not cfg.train.virtual_shards:  # said in next_loss's line only
            now = f"{self.n_devices} device{'s' * (self.n_devices != 1)}"
            print(f"WARNING resumed on {now}, checkpoint {step - 1} was written on "
                  f"{saved_devices}: the batch's gradients add in another order, so from here the run can "
                  "differ from an uninterrupted one in the last bits (--train.virtual-shards keeps it exact "
                  "on any device count)", flush=True)  # fmt: skip
            self.log.event("devices_changed", step, devices=[saved_devices, self.n_devices])
        self.check_eval_data(meta, step)
        saved_revision = meta.get("step_revision", 1)
        crossed = revisions.between(saved_revision)
        if crossed:  # a declared change of the step's bits lies between the save and this code
            print(f"WARNING resumed by code of another revision of the step than checkpoint {step - 1} was "
                  f"written by ({saved_revision} -> {revisions.REVISION}: "
                  f"{'; '.join(r.what for r in crossed)})", flush=True)  # fmt: skip
            # What `compare` leaves out of this run: its metrics from before and after mean other things.
            self.log.event("step_revised", step, revision=[saved_revision, revisions.REVISION],
                           redefined=revisions.redefined(crossed, cfg))  # fmt: skip
            if revisions.moves_training(crossed, cfg):
                moved = {**moved, "step_revision": (str(saved_revision), str(revisions.REVISION))}
        # A decoder's change: the checks below see the next batch's files alone. None: written before the
        # record (revision 1 or 2).
        saved_decoder = meta.get("decode_revision")
        if changes := revisions.decode_changes(saved_decoder, cfg.data.features.gapless):
            now = revisions.DECODE_REVISION
            print(f"WARNING resumed by a decoder of another revision than checkpoint {step - 1} was written "
                  f"by ({saved_decoder or 'unrecorded'} -> {now}: {'; '.join(changes)}): where the run's "
                  "data holds such recordings, they decode to other samples from here, and the run can "
                  "differ from an uninterrupted one", flush=True)  # fmt: skip
            self.log.event("decode_revised", step, revision=[saved_decoder, now])
        results = resume_check.check_resume(
            meta,
            self.next_step(state, batch, legacy=meta["next_step"].get("gradients") is None),
            config=self.config,
            dataset=loader.fingerprint,
            shards=self.shard_digests(loader),
            loader_error=loader_error,
            norms=checkpoint.state_norms(checkpoint.to_host(state.arrays(), copy=False)),
            opt_state_spec=resume_check.tree_spec(state.opt_state),
            expected_opt_state_spec=resume_check.tree_spec(jax.eval_shape(self.fns.tx.init, state.params)),
            grad_accum=cfg.optim.grad_accum,
            allow_config_change=cfg.allow_config_change,
            skipped=state.skipped,
            # A checkpoint from before the record may come from any kind: its loss is not exact either.
            machine_changed=list(moved) if "machine" in meta else ["unrecorded", *moved],
        )
        for r in results:
            print(r.line(), flush=True)
        self.log.log(step, resume_check.metrics(results))
        failed = [r.name for r in results if not r.ok]
        if failed:
            got = {r.name: r.got for r in results if not r.ok}  # what each found: the log says what changed
            self.log.event("resume_check_failed", step, failed=failed, got=got, action=cfg.resume_checks)
        if not failed or cfg.resume_checks == "warn":
            if failed:  # a loader that refused its state starts the data over: said, not found by compare
                over = "; the data starts over at its first batch" if "loader_state" in failed else ""
                print(f"WARNING: resume checks failed: {', '.join(failed)}; continuing{over}", flush=True)
            # Allowed, or taken past a failed check (--resume-checks warn: no event, and `trace` of the
            # steps after said the run itself was wrong).
            allowed = next((r.got for r in results if r.expected == resume_check.BREAKING_ALLOWED
                            or (r.name == "config" and not r.ok)), None)  # fmt: skip
            if allowed:  # config.json will hold the new options: the steps before were trained with these
                self.log.event("config_changed", step, changes=allowed.split(","), before=meta["config"])
            return 0
        changed = next((r.got for r in results if r.name == "config" and not r.ok), None)
        allowed = next((r.got for r in results if r.expected == resume_check.BREAKING_ALLOWED), None)
        stream = set(failed) & {"loader_state", "next_batch", "prng"} if "dataset" not in failed else set()
        # A run extended or retuned on purpose (--steps 800 after 600) is the common case; one whose data
        # stream the change lays out otherwise was told to pass the flag, which was then refused.
        if (changed or allowed) is not None and stream:
            # Warned past, a loader that refused its state starts over; the step keys alone (--prng) do not.
            over = (
                " (warned past, the data starts over at its first batch)" if "loader_state" in stream else ""
            )
            how = (f"The options changed ({changed or allowed}) lay out the data stream or the step keys "
                   f"({', '.join(sorted(stream))} differ), which cannot change within a run, "
                   f"--allow-config-change neither{over}: train the change in a new run, or leave them "
                   "out")  # fmt: skip
        elif changed is not None:
            how = (f"Options that change the run were given ({changed}): pass --allow-config-change to train "
                   "on under them (the run is then no longer exact), or leave them out")  # fmt: skip
        elif "dataset" in failed:
            # Audio copied with `cp -r` (new times, same bytes) read as "the data changed", and nothing
            # named the times: a copy to node-local disk is the common case.
            times = (" (audio read by path counts its files' sizes and modification times: a copy that did "
                     "not keep the times, cp -r where cp -a or rsync -a keeps them, reads as changed)"
                     if loader.reads_audio_by_path else "")  # fmt: skip
            how = (f"The data changed since checkpoint {step - 1}{times} (the dataset line names the shards "
                   "where it knows them): resume on the data it trained on, or train this data in a new "
                   "run")  # fmt: skip
        else:
            how = "Fix the cause"
        print(
            f"ERROR: resume checks failed before step {step}: {', '.join(failed)} (see the RESUME_CHECK "
            f"lines). Nothing was trained. {how}, or pass --resume-checks warn to continue anyway; "
            f"exit {exit_codes.RESUME_CHECK}",
            flush=True,
        )
        return exit_codes.RESUME_CHECK

    def nonfinite(self, state: TrainState, metrics: dict[str, float], bad: np.ndarray) -> tuple[int, str]:
        """After step ``state.step - 1`` was not finite (its update not applied): the exit code (0: go on,
        skipping it) and the line to print. Logs a ``nonfinite`` event naming what was not finite."""
        cfg, step = self.cfg, state.step - 1
        self.log.flush()  # the step's row complete (its norms): ``metrics`` is named from all of it
        if not self.leaf_names:
            self.leaf_names = leaf_names(state.params)
        names = sorted(
            (k for k, v in metrics.items() if not np.isfinite(v)), key=lambda k: (k != "train/loss", k)
        )
        params = [n for n, b in zip(self.leaf_names, bad, strict=True) if b]
        stop = cfg.on_nonfinite == "stop" or (cfg.max_skips > 0 and state.skip_streak >= cfg.max_skips)
        action = "stop" if stop else "skip"
        self.log.event("nonfinite", step, metrics=names, params=params, action=action,
                       skipped=state.skipped, streak=state.skip_streak)  # fmt: skip
        what = f"{', '.join(names[:3]) or 'the updated state'}" + (
            f" (gradient of {', '.join(params[:3])}{' ...' if len(params) > 3 else ''})"
            if params else ""
        )  # fmt: skip
        if not stop:
            return 0, (f"WARNING step {step} is not finite: {what}; update skipped ({state.skip_streak} in a "
                       f"row, {state.skipped} in all)")  # fmt: skip
        why = "" if cfg.on_nonfinite == "stop" else f" after {state.skip_streak} skipped updates in a row"
        # Skipping already: a larger --max-skips, not the mode it was in (it advised --on-nonfinite skip).
        other = ("with --on-nonfinite skip" if cfg.on_nonfinite == "stop" else
                 f"with a --max-skips above {cfg.max_skips} (0: never stop)")  # fmt: skip
        said, resumable = self._newest_finite()
        fix = (f"Resume from it with a lower --optim.lr and --allow-config-change, or {other}" if resumable
               else f"Give a lower --optim.lr, or run {other}")  # fmt: skip
        return exit_codes.NONFINITE, (
            f"ERROR: step {step} is not finite: {what}{why}. It was not applied and nothing was saved; "
            f"{said}. {fix}; exit {exit_codes.NONFINITE}"
        )

    def state_not_finite(self, e: checkpoint.NotFiniteError) -> tuple[int, str]:
        """The state after step ``e.step`` is not finite though its loss and gradients were (the update
        overflowed: an LR or a probe LR scale too large), found as it was to be saved: the exit code and
        the line. Logs a ``nonfinite`` event."""
        self.log.event("nonfinite", e.step, metrics=[e.norm], params=[], action="stop")
        said, resumable = self._newest_finite()
        fix = "Resume from it with a lower LR and --allow-config-change" if resumable else "Give a lower LR"
        return exit_codes.NONFINITE, (
            f"ERROR: the state after step {e.step} is not finite ({e.norm}={e.value!r}) though its loss and "
            f"gradients were: an update overflowed (an --optim.lr or --optim.probe-lr-scale too large). "
            f"Nothing was saved; {said}. {fix}; exit {exit_codes.NONFINITE}"
        )

    def _newest_finite(self) -> tuple[str, bool]:
        """`what_to_resume` of the run's checkpoints, against the parameters' norm at step 0."""
        steps = self.ckpt.all_steps()  # every checkpoint is finite: a state that is not is never saved
        try:
            norms = {s: float(self.ckpt.read_meta(s)["norms"]["param_norm"]) for s in steps}
        except (KeyError, OSError, ValueError, checkpoint.CheckpointError):
            norms = dict.fromkeys(steps, 0.0)  # unknown: no growth said
        start = tree_norms(initial_params(self.cfg, self.model_cfg))["param_norm"]
        return what_to_resume(norms, start)

    def evaluate(self, params: Any, step: int) -> tuple[dict[str, float], dict[str, Row]]:
        """Frozen-encoder kNN beside its baselines; at the last step also the linear probe (unless
        --no-eval-linear) and the table's JSON."""
        cfg, last = self.cfg, self.cfg.steps - 1
        linear = step == last and cfg.eval_linear
        assert self.evaluator is not None, "validation requires eval shards wherever --eval-every > 0"
        rows, train_split, held_out = self.evaluator(self.encoder(params), linear=linear)
        self.held_out_clips = len(held_out.labels)
        self.held_out_chance = eval_report.chance(train_split.labels, held_out.labels)
        evals = {**eval_report.metrics(rows), **online_probe_metrics(params["probe"], held_out)}
        doc = None
        if step == last and self.main:
            files, splits = (self.train_files, self.eval_files), (train_split, held_out)
            try:  # before the row is logged: a resume evaluates again a step whose log lacks it
                doc = eval_report.info(
                    cfg.run_dir, step, cfg.seed, self.model_cfg, files, splits, self.model_cfg.n_classes
                )
                # What `birdjepa evaluate` says of the same splits (the loader said its skips as they
                # came): eval classes the train split lacks, rows of several species, windows of another
                # length.
                names, _ = split_labels(self.train_files)
                thin = thin_train_split(train_split.labels, held_out.labels, rows, names)
                doc["warnings"] = [
                    *thin,
                    *what_a_row_holds_past_its_label(self.eval_files, cfg.data.features),
                ]
            except OSError as e:  # read by path: a shard deleted since the loaders mapped it, a traceback
                raise DataError(f"{e.filename}: {e.strerror}, since the run opened it: the evaluation cannot "
                                "read its shards") from e  # fmt: skip
        self.log.log(step, evals)
        if doc is not None:
            for warning in doc["warnings"]:
                print(f"WARNING {warning}", flush=True)
            eval_report.write_json(layout.eval_report(cfg.run_dir, step), rows, doc)
        return evals, rows

    def save(
        self,
        state: TrainState,
        loader: Loader,
        callbacks: Callbacks,
        metrics: dict[str, float],
        *,
        unevaluated: bool = False,
    ) -> tuple[Batch, dict[str, Any]]:
        """Checkpoint the step just done (``state.step - 1``) with the loader's and the callbacks' state;
        returns the next batch (fetched to record what the next step will do) and the meta written.
        ``unevaluated``: the step's evaluation was due and failed; the resume runs it first."""
        self.log.flush()  # the step's row complete: ``metrics`` then holds its norms for the meta
        free, size = self.ckpt.room() if not self.disk_warned else (0, None)  # once a segment
        if size is not None and free < 2 * size:  # early, not at the failure
            self.disk_warned = True
            print(f"WARNING {mib(free)} free for checkpoints in {self.ckpt.directory} and a checkpoint "
                  f"takes {mib(size)}: fewer than two more fit", flush=True)  # fmt: skip
            self.log.event("disk_low", state.step - 1, free_bytes=free, checkpoint_bytes=size)
        state = dataclasses.replace(
            state, loader_state=loader.state(), callbacks=callbacks.save(state.step - 1)
        )
        pending = next(loader)
        meta = {
            "config": self.config,
            "git": self.git,
            "machine": self.machine,
            "step_revision": revisions.REVISION,
            "decode_revision": revisions.DECODE_REVISION,
            "dataset_fingerprint": loader.fingerprint,
            "dataset_shards": self.shard_digests(loader),
            "eval_fingerprint": self.evaluator.eval_loader.fingerprint if self.evaluator else None,
            "next_step": self.next_step(state, pending).to_json(),
            "last_metrics": {k: v for k, v in metrics.items() if k.startswith("train/")},
            **({"unevaluated": True} if unevaluated else {}),
        }
        saved = state_lib.save(self.ckpt, state, meta)
        self._log_retention(state.step - 1)  # what it said as the save began
        return pending, saved

    def wait_saved(self, step: int) -> None:
        """Every checkpoint on disk (``step`` the last saved): `Checkpointer.wait`, its retention's
        WARNINGs logged too (those of a segment's last wait were said on the console alone)."""
        self.ckpt.wait()
        self._log_retention(step)

    def _log_retention(self, step: int) -> None:
        for warning in self.ckpt.take_warnings():
            self.log.event("warning", step, message=warning)

    def save_failed(self, e: checkpoint.CheckpointWriteError, step: int) -> tuple[int, str]:
        """A checkpoint could not be written: the exit code, which the job script does not requeue (the
        disk would be as full), and one line (what, where, the free space, the newest intact checkpoint,
        what to do). Logs a ``save_failed`` event when the log can still be written."""
        code = exit_codes.IOERR
        try:
            self.log.event("save_failed", step, error=str(e), exit_code=code)
        except OSError:
            pass  # the log is on the same full disk; the line says it
        # With no checkpoint written, "it resumes exactly" and the same command started the run over.
        then = "it resumes exactly" if self.ckpt.all_steps() else "it starts the run over, none being saved"
        return code, (
            f"ERROR: {e}. Training stopped after step {step}; nothing was deleted. {e.fix()}, then run the "
            f"same command: {then}; exit {code}"
        )

    def close(self, exit_code: int) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
        self.ckpt.close()
        self.log.close()
        if self.wandb_run is not None and self.log.wandb_run is not None:  # else it stopped, and said so
            try:
                self.wandb_run.finish(exit_code=exit_code)
            except Exception as e:  # noqa: BLE001 (as a failed row: the run's log holds every row)
                self.log.mirror_stopped(e)
