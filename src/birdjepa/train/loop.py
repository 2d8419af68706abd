"""`birdjepa pretrain`: the training loop, one function read top to bottom.

`pretrain` reads: open (data, model, optimizer) -> restore (a fresh `TrainState` or the newest
checkpoint; the resume checks) -> loop (step, evaluate, save) -> close. What stays fixed during a
segment lives in `Trainer`; what a step changes lives in the `TrainState` it advances. The resume
checks, fault injection, the ``--prng`` modes and the debug roundtrip are functions over the state,
outside the loop body; `due` is the one cadence rule of logging, evaluation and checkpoints.

Step numbering: step ``s`` (0-based) consumes one loader batch and applies update ``s`` (or one
micro-step of it when accumulating). Metrics logged for step ``s`` and the checkpoint labelled ``s``
both describe the state *after* step ``s``; a resume from checkpoint ``s`` continues with step
``s + 1``. The LR applied at update ``u`` is ``schedule(u)`` and the logged LR is read back from the
optimizer state.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import jax
import numpy as np
import optax
import tyro

from birdjepa import validation
from birdjepa.config import PretrainConfig, to_dict
from birdjepa.data import Batch, Loader, open_train_loader, resolve_files
from birdjepa.data.demo import ensure_demo_data
from birdjepa.diagnostics.callbacks import Callback, Callbacks, IidCallback, StepEnd, UpdateMonitorCallback
from birdjepa.diagnostics.monitor import check_due, leaf_names, param_names
from birdjepa.evaluation import report as eval_report
from birdjepa.evaluation.embed import Encode, Split, batched
from birdjepa.evaluation.periodic import PeriodicEval
from birdjepa.evaluation.report import ENCODER, Row
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import init_params
from birdjepa.resume import checks as resume_check
from birdjepa.resume.inject import Restored, inject
from birdjepa.slurm import distributed
from birdjepa.train import checkpoint
from birdjepa.train import state as state_lib
from birdjepa.train.compiled import BATCH_KEYS, Compiled, compiled
from birdjepa.train.determinism import deterministic_xla
from birdjepa.train.metrics_log import MetricsLog, NullLog
from birdjepa.train.norms import tree_norms
from birdjepa.train.objectives import probe_metrics
from birdjepa.train.optim import accumulation_progress, make_schedule, update_count
from birdjepa.train.progress import Progress
from birdjepa.train.state import TrainState
from birdjepa.train.step import StepConfig, fresh_chain, init_key, step_key
from birdjepa.train.wandb_mirror import open_run
from birdjepa.validation import USAGE_EXIT_CODE, OptionError, label_count

#: Exit code after a SIGTERM/SIGUSR1 save: the job should be requeued (EX_TEMPFAIL).
REQUEUE_EXIT_CODE = 75
#: Exit code when a resume check fails or no checkpoint verifies: requeueing would fail the same way
#: (EX_DATAERR).
RESUME_CHECK_EXIT_CODE = 65
#: Exit code when a step was not finite and the run stopped before applying it (EX_SOFTWARE): not
#: requeued, since the same step would diverge again; resume from the last checkpoint with a change.
NONFINITE_EXIT_CODE = 70


def data_files(cfg: PretrainConfig) -> tuple[list[str], list[str]]:
    demo = None if cfg.data.train and cfg.data.eval else ensure_demo_data()
    train = cfg.data.train or str(demo / "train")
    evaluation = cfg.data.eval or str(demo / "eval")
    return resolve_files(train), resolve_files(evaluation)


def model_config(cfg: PretrainConfig, n_classes: int) -> ModelConfig:
    """The model a run builds: the configured one with the data set's class count (for the probe)."""
    model_cfg = dataclasses.replace(cfg.model, n_classes=n_classes).resolved()
    if cfg.objective.kind == "supervised":  # the projector becomes the classifier
        model_cfg = dataclasses.replace(model_cfg, proj_dim=n_classes, proj_layers=0)
    return model_cfg


def git_commit() -> dict[str, Any]:
    root = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        )
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True)
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "dirty": None}


#: SIGTERM and SIGUSR1 (Slurm's warning signal) ask the loop to save at the step boundary and exit.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopRequest:
    """Records a stop signal for the loop (`pretrain` puts the previous handlers back when it returns)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.signal = signum


def online_probe_metrics(probe_params: Any, held_out: Split) -> dict[str, float]:
    """The online probe (a health signal, not evidence of learning) on the held-out embeddings."""
    head = distributed.host(probe_params["head"])
    logits = held_out.features[ENCODER].astype(np.float64) @ head["kernel"] + head["bias"]
    m = probe_metrics(logits, held_out.labels)
    return {"eval/probe_ce": float(m["probe_ce"]), "eval/probe_acc": float(m["probe_acc"])}


def make_callbacks(cfg: PretrainConfig, loader: Loader, params: Any) -> Callbacks:
    items: list[Callback] = [IidCallback(loader.shard_sizes, cfg.iid_window)]
    if cfg.monitor_interval > 0:
        items.append(UpdateMonitorCallback(param_names(params)))
    return Callbacks(items)


def due(step: int, every: int, last: int) -> bool:
    """The one cadence rule of the loop: after every ``every``-th step (``every`` > 0) and after the last."""
    return step == last or (every > 0 and (step + 1) % every == 0)


def start_state(
    cfg: PretrainConfig,
    model_cfg: ModelConfig,
    tx: optax.GradientTransformation,
    ckpt: checkpoint.Checkpointer,
) -> tuple[TrainState, dict[str, Any] | None]:
    """A fresh state, or the newest complete checkpoint (if any and ``--resume auto``) as the
    ``--prng`` mode keeps it, with that checkpoint's meta."""
    params = init_params(model_cfg, init_key(cfg))["params"]
    fresh = TrainState(step=0, restart=0, params=params, opt_state=tx.init(params), chain=fresh_chain(cfg))
    found = state_lib.restore(ckpt, fresh) if cfg.resume == "auto" else None
    if found is None:
        return fresh, None
    restored, meta = found
    return state_lib.for_prng_mode(restored, cfg.prng, fresh.chain), meta


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
        self.schedule = make_schedule(cfg.optim, total_updates(cfg))
        self.main = distributed.is_main()
        # What every checkpoint's meta repeats, computed once for the segment.
        self.config, self.git = to_dict(cfg), git_commit()
        devices = jax.devices()
        if cfg.data.batch_size % len(devices):
            n = len(devices)
            raise OptionError("data.batch_size", cfg.data.batch_size, f"must divide over the {n} devices")
        self.n_devices = len(devices)
        print(f"devices={len(devices)} ({devices[0].platform}) processes={jax.process_count()}", flush=True)
        self.fns = fns
        self.rows = distributed.local_rows(fns.sharded, cfg.data.batch_size)
        self.leaf_names: list[str] = []  # of the parameters, for the non-finite guard's report
        self.evaluator = PeriodicEval(
            self.train_files, self.eval_files, features=cfg.data.features, seed=cfg.seed,
            batch_size=cfg.data.batch_size, n_workers=cfg.data.n_workers, random_init=self.random_init,
        )  # fmt: skip
        self.wandb_run = open_run(cfg.log.wandb if self.main else "disabled", cfg.run_dir, cfg.run,
                                  cfg.log.wandb_project, self.config, restart)  # fmt: skip
        self.log = (
            MetricsLog(cfg.run_dir, restart=restart, wandb_run=self.wandb_run) if self.main else NullLog()
        )

    def place(self, state: TrainState) -> TrainState:
        """``state`` with its arrays replicated over the devices."""
        params, opt_state = jax.device_put((state.params, state.opt_state), self.fns.replicated)
        return dataclasses.replace(state, params=params, opt_state=opt_state)

    def on_device(self, batch: Batch, *, nan: bool = False) -> dict[str, jax.Array]:
        """The global batch as arrays sharded over every process's devices (each gives its rows);
        ``nan``: its spectrograms made NaN (``--debug-nonfinite-steps``)."""
        arrays = distributed.global_batch({k: batch[k] for k in BATCH_KEYS}, self.fns.sharded)
        if nan:
            arrays["spectrogram"] = arrays["spectrogram"] * np.float32(np.nan)
        return arrays

    def encoder(self, params: Any) -> Encode:
        """Embeddings of a host batch of spectrograms under ``params`` (sharded like a train batch)."""

        def apply(x: np.ndarray) -> np.ndarray:
            return distributed.host(
                self.fns.encode(params, distributed.global_batch({"s": x}, self.fns.sharded)["s"])
            )

        return batched(apply, self.cfg.data.batch_size)

    def random_init(self) -> Encode:  # fresh arrays: the first params are donated to the first step
        params = init_params(self.model_cfg, init_key(self.cfg))["params"]
        return self.encoder(jax.device_put(params, self.fns.replicated))

    def next_step(self, state: TrainState, batch: Batch) -> resume_check.NextStep:
        """What step ``state.step`` will do with ``batch`` (recorded at save, re-derived on resume)."""
        key, _ = step_key(self.cfg, state.chain, state.step)
        update = int(distributed.host(update_count(state.opt_state)))
        accumulated = int(distributed.host(accumulation_progress(state.opt_state)))
        loss = float(distributed.host(self.fns.loss_only(state.params, self.on_device(batch), key)))
        return resume_check.NextStep.of(
            state.step, batch, key, update, float(self.schedule(update)), accumulated, loss, self.n_devices
        )

    def check_resume(
        self, state: TrainState, meta: dict[str, Any], batch: Batch, loader: Loader, loader_error: str | None
    ) -> int:
        """The resume checks before the first update: 0, or the exit code when they fail and stop the run."""
        cfg, step = self.cfg, state.step
        results = resume_check.check_resume(
            meta,
            self.next_step(state, batch),
            config=self.config,
            dataset=loader.fingerprint,
            loader_error=loader_error,
            norms=checkpoint.state_norms(checkpoint.to_host(state.arrays())),
            opt_state_spec=resume_check.tree_spec(state.opt_state),
            expected_opt_state_spec=resume_check.tree_spec(jax.eval_shape(self.fns.tx.init, state.params)),
            grad_accum=cfg.optim.grad_accum,
            allow_config_change=cfg.allow_config_change,
            skipped=state.skipped,
        )
        for r in results:
            print(r.line(), flush=True)
        self.log.log(step, resume_check.metrics(results))
        failed = [r.name for r in results if not r.ok]
        if not failed:
            return 0
        self.log.event("resume_check_failed", step, failed=failed, action=cfg.resume_checks)
        if cfg.resume_checks == "warn":
            print(f"WARNING: resume checks failed: {', '.join(failed)}; continuing", flush=True)
            return 0
        print(
            f"ERROR: resume checks failed before step {step}: {', '.join(failed)} (see the RESUME_CHECK "
            f"lines). Nothing was trained. Fix the cause, or pass --resume-checks warn to continue anyway; "
            f"exit {RESUME_CHECK_EXIT_CODE}",
            flush=True,
        )
        return RESUME_CHECK_EXIT_CODE

    def nonfinite(self, state: TrainState, metrics: dict[str, float], bad: np.ndarray) -> tuple[int, str]:
        """After step ``state.step - 1`` was not finite (its update not applied): the exit code (0: go on,
        skipping it) and the line to print. Logs a ``nonfinite`` event naming what was not finite."""
        cfg, step = self.cfg, state.step - 1
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
        latest = self.ckpt.latest_step()
        since = f"the newest checkpoint ({latest}) is finite" if latest is not None else "no checkpoint yet"
        return NONFINITE_EXIT_CODE, (
            f"ERROR: step {step} is not finite: {what}{why}. It was not applied and nothing was saved; "
            f"{since}. Resume from it with a lower --optim.lr and --allow-config-change, or with "
            f"--on-nonfinite skip; exit {NONFINITE_EXIT_CODE}"
        )

    def evaluate(self, params: Any, step: int) -> tuple[dict[str, float], dict[str, Row]]:
        """Frozen-encoder kNN beside its baselines; at the last step also the linear probe (unless
        --no-eval-linear) and the table's JSON."""
        cfg, last = self.cfg, self.cfg.steps - 1
        linear = step == last and cfg.eval_linear
        rows, train_split, held_out = self.evaluator(self.encoder(params), linear=linear)
        evals = {**eval_report.metrics(rows), **online_probe_metrics(params["probe"], held_out)}
        self.log.log(step, evals)
        if step == last and self.main:
            files, splits = (self.train_files, self.eval_files), (train_split, held_out)
            doc = eval_report.info(
                cfg.run_dir, step, cfg.seed, self.model_cfg, files, splits, self.model_cfg.n_classes
            )
            eval_report.write_json(cfg.run_dir / "eval" / f"{step}.json", rows, doc)
        return evals, rows

    def save(
        self, state: TrainState, loader: Loader, callbacks: Callbacks, metrics: dict[str, float]
    ) -> tuple[Batch, dict[str, Any]]:
        """Checkpoint the step just done (``state.step - 1``) with the loader's and the callbacks' state;
        returns the next batch (fetched to record what the next step will do) and the meta written."""
        state = dataclasses.replace(
            state, loader_state=loader.state(), callbacks=callbacks.save(state.step - 1)
        )
        pending = next(loader)
        meta = {
            "config": self.config,
            "git": self.git,
            "dataset_fingerprint": loader.fingerprint,
            "next_step": self.next_step(state, pending).to_json(),
            "last_metrics": {k: v for k, v in metrics.items() if k.startswith("train/")},
        }
        return pending, state_lib.save(self.ckpt, state, meta)

    def close(self, exit_code: int) -> None:
        self.evaluator.close()
        self.ckpt.close()
        self.log.close()
        if self.wandb_run is not None:
            self.wandb_run.finish(exit_code=exit_code)


def debug_roundtrip(t: Trainer, state: TrainState, meta: dict[str, Any]) -> TrainState:
    """``--debug-roundtrip-steps``: save the state just checkpointed, restore it into fresh objects
    (asserting every leaf bit-identical) and go on from the copy with compile caches cleared. The rest of
    the run must not notice (the test compares it with an uninterrupted run)."""
    step = state.step - 1
    restored = checkpoint.roundtrip(t.cfg.run_dir / "debug_roundtrip", step, state.arrays(), meta)
    jax.clear_caches()
    return t.place(dataclasses.replace(state, params=restored["params"], opt_state=restored["opt_state"]))


def total_updates(cfg: PretrainConfig) -> int:
    return max(cfg.steps // cfg.optim.grad_accum, 1)


def pretrain(cfg: PretrainConfig) -> int:
    """Train (or continue) the run in ``cfg.run_dir``; returns the process exit code. The signal
    handlers it installs are removed again when it returns (a process may train several runs)."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        return _pretrain(cfg)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pretrain(requested: PretrainConfig) -> int:
    # Open: the data, the model and the optimizer.
    validation.check(requested)
    requested.run_dir.mkdir(parents=True, exist_ok=True)
    if distributed.is_main():  # this segment's configuration (each checkpoint also holds its own)
        (requested.run_dir / "config.json").write_text(json.dumps(to_dict(requested), indent=1) + "\n")
    found_files, eval_files = data_files(requested)
    model_cfg = model_config(requested, label_count(found_files))
    fns = compiled(StepConfig.of(requested, model_cfg), requested.optim, total_updates(requested))
    ckpt = checkpoint.Checkpointer(
        requested.run_dir, keep=requested.ckpt_keep, async_save=requested.ckpt_async
    )

    # Restore: a fresh state, or the newest checkpoint. --debug-inject-fault breaks a restored one on
    # purpose, and may change what the segment trains with (batch size, shards): hence `cfg` below.
    try:
        restored, meta = start_state(requested, model_cfg, fns.tx, ckpt)
    except checkpoint.CheckpointError as e:  # none verifies, or the run asks for another structure
        print(f"ERROR: cannot resume: {e}; exit {RESUME_CHECK_EXIT_CODE}", flush=True)
        ckpt.close()
        return RESUME_CHECK_EXIT_CODE
    r, no_effect = Restored(requested, found_files, restored), None
    if meta is not None and requested.debug_inject_fault:
        r, no_effect = inject(requested.debug_inject_fault, r, fns.tx, fresh_chain(requested))
    cfg, train_files = r.cfg, r.train_files
    t = Trainer(cfg, model_cfg, fns, (train_files, eval_files), ckpt, r.state.restart)
    state = t.place(r.state)
    for fallback in ckpt.fallbacks:
        t.log.event("ckpt_fallback", state.step, **fallback)
    if meta is not None:
        t.log.event("resume", state.step, checkpoint=state.step - 1, **ckpt.last_restore)
        if cfg.debug_inject_fault:
            t.log.event("fault_injected", state.step, fault=cfg.debug_inject_fault, no_effect=no_effect)
        print(f"resumed from checkpoint {state.step - 1}: continuing at step {state.step} "
              f"(restart {state.restart})", flush=True)  # fmt: skip
    loader, loader_error = open_train_loader(
        train_files, cfg.data, seed=cfg.seed, augment=not cfg.debug_disable_stochastic,
        state=state.loader_state, resumed=meta is not None,
    )  # fmt: skip
    callbacks = make_callbacks(cfg, loader, state.params)
    # The batch of the coming step is fetched ahead whenever a save or a resume needs to fingerprint it.
    pending: Batch | None = None
    exit_code = 0
    if meta is not None and state.step < cfg.steps:
        for note in callbacks.restore(state.step - 1, state.callbacks):
            print(f"WARNING {note}", flush=True)
        pending = next(loader)
        exit_code = t.check_resume(state, meta, pending, loader, loader_error)

    # Loop: step, evaluate, save.
    stop = StopRequest()
    last = cfg.steps - 1
    start, end = state.step, state.step if exit_code else cfg.steps
    progress = Progress(
        total=cfg.steps, start=start, batch_size=cfg.data.batch_size, every=cfg.log.print_every
    )
    if start >= cfg.steps:
        print(
            f"run {cfg.run} already finished at step {start - 1} ({cfg.run_dir}); nothing to do", flush=True
        )
    t_start = time.perf_counter()
    evals: dict[str, float] = {}
    for step in range(start, end):
        t0 = time.perf_counter()
        batch, pending = (pending if pending is not None else next(loader)), None
        t_data = time.perf_counter() - t0
        key, chain = step_key(cfg, state.chain, step)
        check = check_due(step, cfg.monitor_interval, cfg.optim.grad_accum)
        poison = step in cfg.debug_nonfinite_steps
        params, opt_state, metrics, stats, guard = t.fns.train_step(
            state.params, state.opt_state, t.on_device(batch, nan=poison), key, check
        )
        metrics, stats, guard = distributed.host((metrics, stats, guard))
        finite = bool(guard["finite"])  # if not, params and opt_state are the ones given
        state = dataclasses.replace(
            state, step=step + 1, params=params, opt_state=opt_state, chain=chain,
            skipped=state.skipped + (not finite), skip_streak=0 if finite else state.skip_streak + 1,
        )  # fmt: skip
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["train/skipped_updates"] = float(state.skipped)
        metrics["train/step_time"] = time.perf_counter() - t0
        metrics["train/data_wait"] = t_data
        metrics["dataloader/index_crc32"] = distributed.index_crc32(batch["index"][t.rows])
        report = callbacks.step_end(StepEnd(step, batch, stats))
        metrics.update(report.metrics)
        for warning in report.warnings:
            progress.message(f"WARNING {warning}")
            t.log.event("warning", step, message=warning)
        if due(step, cfg.log_every, last) or report.must_log:
            # Post-update norms on host float64, as the checkpoint computes them; only when logged,
            # since it copies every parameter off the device.
            norms = tree_norms(distributed.host(state.params), "param_norm")
            metrics.update({f"train/{k}": v for k, v in norms.items()})
            t.log.log(step, metrics)
        progress.step(step, metrics)
        if not finite:  # before any evaluation or save: a stop leaves the last checkpoint the newest
            exit_code, line = t.nonfinite(state, metrics, guard["bad"])
            progress.message(line)
            if exit_code:
                break

        if cfg.eval_every > 0 and due(step, cfg.eval_every, last):
            evals, eval_rows = t.evaluate(state.params, step)
            progress.message(
                f"eval step {step}: kNN {evals['eval/knn_acc']:.3f} (random init "
                f"{evals['eval/knn_acc_random_init']:.3f}, raw {evals['eval/knn_acc_raw']:.3f}); "
                f"online probe {evals['eval/probe_acc']:.3f}"
            )

        # Every process must stop at the same step: a signal seen by one is acted on by all.
        stopping = step == cfg.stop_at_step or distributed.any_process(stop.signal is not None)
        if due(step, cfg.ckpt_every, last) or stopping or step in cfg.debug_roundtrip_steps:
            pending, saved = t.save(state, loader, callbacks, metrics)
            if step in cfg.debug_roundtrip_steps:
                state = debug_roundtrip(t, state, saved)
        if stopping:
            signalled = step != cfg.stop_at_step
            exit_code = REQUEUE_EXIT_CODE if signalled else 0
            reason = f"signal {stop.signal or 'on another process'}" if signalled else "stop_at_step"
            t.log.event("stop", step, reason=reason, exit_code=exit_code)
            progress.message(f"stopping after step {step} ({reason}); exit {exit_code}")
            break

    # Close: the summary next to its baselines.
    progress.close()
    if exit_code == 0 and start < cfg.steps and state.step == cfg.steps:
        took = f"done: {cfg.steps - start} steps in {time.perf_counter() - t_start:.0f} s"
        if not evals:
            print(f"{took}; no evaluation (--eval-every 0); run directory {cfg.run_dir}", flush=True)
        else:
            print(eval_report.table(eval_rows, encoder_title=f"encoder (step {last})"), flush=True)
            e = evals
            linear = (
                f"linear probe {e['eval/linear_acc']:.3f} (random init "
                f"{e['eval/linear_acc_random_init']:.3f}, raw log-mel {e['eval/linear_acc_raw']:.3f}), "
                if "eval/linear_acc" in e
                else ""
            )
            print(
                f"{took}; frozen encoder on the held-out split: {linear}kNN {e['eval/knn_acc']:.3f} "
                f"(random init {e['eval/knn_acc_random_init']:.3f}, raw {e['eval/knn_acc_raw']:.3f}); "
                f"chance {1 / t.model_cfg.n_classes:.3f}; run directory {cfg.run_dir}",
                flush=True,
            )
    t.close(exit_code)
    return exit_code


def cli(cfg: Annotated[PretrainConfig, tyro.conf.arg(name="")]) -> None:
    """Pretrain an encoder (default: LeJEPA on the embedded demo set); resumes automatically."""
    deterministic_xla()
    distributed.initialize()
    if not distributed.is_main():  # one console: process 0 speaks for the group
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    try:
        code = pretrain(cfg)
    except OptionError as e:  # pretrain checks the options first, before a run directory exists
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    if code:
        raise SystemExit(code)
