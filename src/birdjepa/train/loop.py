"""`birdjepa pretrain`: the training loop, one function read top to bottom.

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
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tyro
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from birdjepa.config import PretrainConfig, to_dict
from birdjepa.data import Batch, Loader, open_train_loader, resolve_files
from birdjepa.data.demo import ensure_demo_data
from birdjepa.diagnostics.callbacks import Callback, Callbacks, IidCallback, StepEnd, UpdateMonitorCallback
from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.diagnostics.monitor import check_due, maybe_update_stats, param_names
from birdjepa.evaluation import report as eval_report
from birdjepa.evaluation.embed import Encode, Split, batched, encoder_apply
from birdjepa.evaluation.periodic import PeriodicEval
from birdjepa.evaluation.report import ENCODER
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import BirdJepa, init_params
from birdjepa.resume import checks as resume_check
from birdjepa.resume.inject import Restored, inject
from birdjepa.slurm import distributed
from birdjepa.train import checkpoint
from birdjepa.train.augment import augment_views, local_crops
from birdjepa.train.config import AugmentConfig
from birdjepa.train.determinism import deterministic_xla
from birdjepa.train.metrics_log import MetricsLog, NullLog
from birdjepa.train.norms import tree_norms
from birdjepa.train.objectives import lejepa_loss, probe_metrics, span_loss, span_mask, supervised_loss
from birdjepa.train.optim import (
    accumulation_progress,
    applied_lr,
    make_optimizer,
    make_schedule,
    update_count,
)
from birdjepa.train.progress import Progress
from birdjepa.train.wandb_mirror import open_run

#: Exit code after a SIGTERM/SIGUSR1 save: the job should be requeued (EX_TEMPFAIL).
REQUEUE_EXIT_CODE = 75
#: Exit code when a resume check fails: requeueing would fail the same way (EX_DATAERR).
RESUME_CHECK_EXIT_CODE = 65
# Fixed sub-keys of the run seed, so adding a consumer never shifts another's randomness.
_INIT_KEY, _STEP_KEY = 0, 1
_AUGMENT_KEY, _LOCAL_KEY, _SPAN_KEY = 2, 3, 4  # folded into a step's key


def data_files(cfg: PretrainConfig) -> tuple[list[str], list[str]]:
    demo = None if cfg.data.train and cfg.data.eval else ensure_demo_data()
    train = cfg.data.train or str(demo / "train")
    evaluation = cfg.data.eval or str(demo / "eval")
    return resolve_files(train), resolve_files(evaluation)


def label_count(files: list[str]) -> int:
    """Classes for the probe: the vocabulary beside the shards, else the largest label + 1."""
    vocab = Path(files[0]).with_name("vocab.json")
    if vocab.exists():
        data = json.loads(vocab.read_text())
        return len(data["names"] if isinstance(data, dict) else data)
    raise FileNotFoundError(f"{vocab}: the probe needs the label vocabulary beside the train shards")


def model_config(cfg: PretrainConfig, n_classes: int) -> ModelConfig:
    """The model a run builds: the configured one with the data set's class count (for the probe)."""
    model_cfg = dataclasses.replace(cfg.model, n_classes=n_classes).resolved()
    if cfg.objective.kind == "supervised":  # the projector becomes the classifier
        model_cfg = dataclasses.replace(model_cfg, proj_dim=n_classes, proj_layers=0)
    return model_cfg


def init_key(cfg: PretrainConfig) -> jax.Array:
    """The key of the initial parameters (also the evaluation's random-init baseline)."""
    return jax.random.fold_in(jax.random.key(cfg.seed), _INIT_KEY)


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


def make_loss_fn(model: BirdJepa, cfg: PretrainConfig) -> Callable:
    """``(params, batch, key) -> (loss, aux)``: the objective plus the online probe's cross-entropy."""
    deterministic = cfg.debug_disable_stochastic or (cfg.model.dropout == 0 and cfg.model.drop_path == 0)
    lej = cfg.objective.lejepa
    model_cfg = model.cfg.resolved()

    augment = AugmentConfig() if cfg.debug_disable_stochastic else cfg.augment
    norm = {"mean": cfg.data.features.mean, "std": cfg.data.features.std}

    def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        dropout_key, sigreg_key = jax.random.split(key)
        views = batch["spectrogram"]
        if augment.active:  # its own sub-key, so turning it on leaves the other draws as they were
            views = augment_views(views, jax.random.fold_in(key, _AUGMENT_KEY), augment, **norm)
        out = model.apply(
            {"params": params},
            views,
            deterministic=deterministic,
            rngs={"dropout": dropout_key},
        )
        if cfg.objective.kind == "lejepa":
            z = out["projection"]
            if lej.local_views:  # multi-crop: short views cut from the global ones, encoded apart
                local_key = jax.random.fold_in(key, _LOCAL_KEY)
                local = local_crops(views, local_key, lej.local_views, lej.local_frames)
                local_out = model.apply({"params": params}, local, deterministic=deterministic,
                                        rngs={"dropout": jax.random.fold_in(local_key, 1)})  # fmt: skip
                z = jnp.concatenate([z, local_out["projection"]], axis=1)
            obj = lejepa_loss(
                z,
                sigreg_key,
                lam=lej.lam,
                num_directions=lej.num_directions,
                num_knots=lej.num_knots,
                t_max=lej.t_max,
                sigreg_per_view=lej.sigreg_per_view,
                n_global=views.shape[1],
            )
            if lej.span_weight:  # JEPA: a masked copy of the views predicts their tokens at the hidden spans
                span_key = jax.random.fold_in(key, _SPAN_KEY)
                mask = span_mask(span_key, views.shape[:2], model_cfg.grid, lej.span_tokens, lej.span_ratio)
                masked = model.apply({"params": params}, views, deterministic=deterministic, mask=mask,
                                     rngs={"dropout": jax.random.fold_in(span_key, 1)})  # fmt: skip
                span = span_loss(masked["prediction"], jax.lax.stop_gradient(out["tokens"]), mask)
                obj = {**obj, "loss": obj["loss"] + lej.span_weight * span, "span": span}
        else:
            obj = supervised_loss(out["projection"], batch["label"])
        probe = probe_metrics(out["probe_logits"], batch["label"])
        collapse = {
            "embedding_rank": effective_rank(out["embedding"]),
            "projection_rank": effective_rank(out["projection"]),
        }
        # The probe sees stop_gradient(embedding): adding its loss trains the probe head only.
        return obj["loss"] + probe["probe_ce"], {**obj, **probe, **collapse}

    return loss_fn


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation) -> Callable:
    """The pure step ``(params, opt_state, batch, key, check) -> (params, opt_state, metrics, stats)``;
    ``stats`` are the weight-update monitor's per-parameter statistics when ``check`` (raw gradients,
    before clipping, and the change actually applied), else its placeholder."""

    def step(
        params: Any, opt_state: Any, batch: dict[str, jax.Array], key: jax.Array, check: jax.Array
    ) -> tuple[Any, Any, dict, dict]:
        (_, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        metrics = {f"train/{k}": v for k, v in aux.items() if not k.endswith("n_labelled")}
        metrics["train/lr"] = applied_lr(new_opt_state)
        metrics["train/grad_norm"] = optax.tree.norm(grads)
        metrics["train/update_norm"] = optax.tree.norm(jax.tree.map(jnp.subtract, new_params, params))
        metrics["train/update_count"] = update_count(new_opt_state)
        metrics["train/accum_progress"] = accumulation_progress(new_opt_state)
        stats = maybe_update_stats(check, grads, params, new_params)
        return new_params, new_opt_state, metrics, stats

    return step


def online_probe_metrics(probe_params: Any, held_out: Split) -> dict[str, float]:
    """The online probe (a health signal, not evidence of learning) on the held-out embeddings."""
    head = distributed.host(probe_params["head"])
    logits = held_out.features[ENCODER].astype(np.float64) @ head["kernel"] + head["bias"]
    m = probe_metrics(logits, held_out.labels)
    return {"eval/probe_ce": float(m["probe_ce"]), "eval/probe_acc": float(m["probe_acc"])}


def step_key(cfg: PretrainConfig, chain: jax.Array, step: int) -> tuple[jax.Array, jax.Array]:
    """(key for this step, chain key after it)."""
    if cfg.prng == "stateless":
        return jax.random.fold_in(jax.random.fold_in(jax.random.key(cfg.seed), _STEP_KEY), step), chain
    chain, key = jax.random.split(chain)
    return key, chain


def make_callbacks(cfg: PretrainConfig, loader: Loader, params: Any) -> Callbacks:
    items: list[Callback] = [IidCallback(loader.shard_sizes, cfg.iid_window)]
    if cfg.monitor_interval > 0:
        items.append(UpdateMonitorCallback(param_names(params)))
    return Callbacks(items)


def pretrain(cfg: PretrainConfig) -> int:
    """Train (or continue) the run in ``cfg.run_dir``; returns the process exit code. The signal
    handlers it installs are removed again when it returns (a process may train several runs)."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        return _pretrain(cfg)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _pretrain(cfg: PretrainConfig) -> int:
    if cfg.objective.kind == "lejepa" and cfg.data.n_views < 2:
        raise ValueError("the lejepa objective needs --data.n-views >= 2")
    if cfg.objective.lejepa.span_weight and not cfg.model.predictor_depth:
        raise ValueError("--objective.lejepa.span-weight needs a predictor: set --model.predictor-depth >= 1")
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    main = distributed.is_main()
    if main:  # this segment's configuration (each checkpoint also holds the one it was written with)
        (run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1) + "\n")
    train_files, eval_files = data_files(cfg)
    n_classes = label_count(train_files)
    model_cfg = model_config(cfg, n_classes)
    model = BirdJepa(model_cfg)
    total_updates = max(cfg.steps // cfg.optim.grad_accum, 1)
    tx = make_optimizer(cfg.optim, total_updates)
    schedule = make_schedule(cfg.optim, total_updates)

    devices = np.array(jax.devices())
    if cfg.data.batch_size % len(devices):
        raise ValueError(f"batch size {cfg.data.batch_size} is not divisible by {len(devices)} devices")
    mesh = Mesh(devices, ("data",))
    print(f"devices={len(devices)} ({devices[0].platform}) processes={jax.process_count()}", flush=True)
    replicated = NamedSharding(mesh, PartitionSpec())
    sharded = NamedSharding(mesh, PartitionSpec("data"))

    # Fresh state, then the newest complete checkpoint on top of it (if any and allowed).
    # The trainer carries the module tree {encoder, projector, probe} (not flax's {"params": ...}
    # wrapper), so checkpoint norms come per component.
    params = init_params(model_cfg, init_key(cfg))["params"]
    opt_state = tx.init(params)
    fresh_chain = chain = jax.random.fold_in(jax.random.key(cfg.seed), _STEP_KEY)
    ckpt = checkpoint.Checkpointer(run_dir, keep=cfg.ckpt_keep, async_save=cfg.ckpt_async)
    start, restart, loader_state, resumed_from, meta = 0, 0, None, None, None
    if cfg.resume == "auto" and (found := ckpt.restore_latest({"params": params, "opt_state": opt_state})):
        resumed_from, state, meta = found
        params, opt_state = state["params"], state["opt_state"]
        start, restart = resumed_from + 1, meta["restart"] + 1
        if cfg.prng == "checkpointed":
            chain = jax.random.wrap_key_data(np.asarray(meta["prng_chain"], np.uint32))
        # legacy reproduces a loader without state and a restarted key chain (the bug users hit).
        loader_state = None if cfg.prng == "legacy" else meta["loader_state"]
        if cfg.debug_inject_fault:
            r, no_effect = inject(
                cfg.debug_inject_fault,
                Restored(cfg, params, opt_state, chain, loader_state, train_files),
                tx,
                fresh_chain,
            )
            cfg, params, opt_state, chain = r.cfg, r.params, r.opt_state, r.chain
            loader_state, train_files = r.loader_state, r.train_files
    params, opt_state = jax.device_put((params, opt_state), replicated)

    wandb_run = open_run(cfg.log.wandb if main else "disabled", run_dir, cfg.run, cfg.log.wandb_project,
                         to_dict(cfg), restart)  # fmt: skip
    log = MetricsLog(run_dir, restart=restart, wandb_run=wandb_run) if main else NullLog()
    if resumed_from is not None:
        log.event("resume", start, checkpoint=resumed_from, **ckpt.last_restore)
        if cfg.debug_inject_fault:
            log.event("fault_injected", start, fault=cfg.debug_inject_fault, no_effect=no_effect)
        print(
            f"resumed from checkpoint {resumed_from}: continuing at step {start} (restart {restart})",
            flush=True,
        )

    loader, loader_error = open_train_loader(
        train_files,
        cfg.data,
        seed=cfg.seed,
        augment=not cfg.debug_disable_stochastic,
        state=loader_state,
        resumed=meta is not None,
    )
    encode_jit = jax.jit(
        encoder_apply(model_cfg), in_shardings=(replicated, sharded), out_shardings=replicated
    )

    def encoder(p: Any) -> Encode:
        """Embeddings of a host batch of spectrograms under params ``p`` (sharded like a train batch)."""

        def apply(x: np.ndarray) -> np.ndarray:
            return distributed.host(encode_jit(p, distributed.global_batch({"s": x}, sharded)["s"]))

        return batched(apply, cfg.data.batch_size)

    def random_init() -> Encode:  # fresh arrays: the first params are donated to the first step
        return encoder(jax.device_put(init_params(model_cfg, init_key(cfg))["params"], replicated))

    evaluator = PeriodicEval(
        train_files, eval_files, features=cfg.data.features, seed=cfg.seed, batch_size=cfg.data.batch_size,
        n_workers=cfg.data.n_workers, random_init=random_init,
    )  # fmt: skip
    callbacks = make_callbacks(cfg, loader, params)
    batch_shardings = {k: sharded for k in ("spectrogram", "label")}
    loss_fn = make_loss_fn(model, cfg)
    train_step = jax.jit(
        make_train_step(loss_fn, tx),
        in_shardings=(replicated, replicated, batch_shardings, replicated, None),
        out_shardings=(replicated, replicated, replicated, replicated),
        donate_argnums=(0, 1),
    )
    loss_only = jax.jit(lambda p, b, k: loss_fn(p, b, k)[0], in_shardings=(replicated, batch_shardings, None))

    def on_device(batch: Batch) -> dict[str, jax.Array]:
        """The global batch as arrays sharded over every process's devices (each gives its rows)."""
        return distributed.global_batch({k: batch[k] for k in batch_shardings}, sharded)

    rows = distributed.local_rows(sharded, cfg.data.batch_size)

    def next_step(step: int, batch: Batch) -> resume_check.NextStep:
        """What step `step` will do from the current state (recorded at save, re-derived on resume)."""
        key, _ = step_key(cfg, chain, step)
        update = int(distributed.host(update_count(opt_state)))
        accumulated = int(distributed.host(accumulation_progress(opt_state)))
        return resume_check.NextStep.of(
            step, batch, key, update, float(schedule(update)), accumulated,
            float(distributed.host(loss_only(params, on_device(batch), key))), len(devices),
        )  # fmt: skip

    exit_code = 0
    # The batch of the coming step is fetched ahead whenever a save or a resume needs to fingerprint it.
    pending: Batch | None = None
    if meta is not None and start < cfg.steps:
        for note in callbacks.restore(resumed_from, meta.get("callbacks", {})):
            print(f"WARNING {note}", flush=True)
        pending = next(loader)
        results = resume_check.check_resume(
            meta,
            next_step(start, pending),
            config=to_dict(cfg),
            dataset=loader.fingerprint,
            loader_error=loader_error,
            norms=checkpoint.state_norms(checkpoint.to_host({"params": params, "opt_state": opt_state})),
            opt_state_spec=resume_check.tree_spec(opt_state),
            expected_opt_state_spec=resume_check.tree_spec(jax.eval_shape(tx.init, params)),
            grad_accum=cfg.optim.grad_accum,
            allow_config_change=cfg.allow_config_change,
        )
        for r in results:
            print(r.line(), flush=True)
        log.log(start, resume_check.metrics(results))
        if failed := [r.name for r in results if not r.ok]:
            log.event("resume_check_failed", start, failed=failed, action=cfg.resume_checks)
            if cfg.resume_checks == "error":
                exit_code = RESUME_CHECK_EXIT_CODE
                print(
                    f"ERROR: resume checks failed before step {start}: {', '.join(failed)} (see the "
                    "RESUME_CHECK lines). Nothing was trained. Fix the cause, or pass --resume-checks "
                    f"warn to continue anyway; exit {exit_code}",
                    flush=True,
                )
            else:
                print(f"WARNING: resume checks failed: {', '.join(failed)}; continuing", flush=True)

    stop = StopRequest()
    meta_base = {"config": to_dict(cfg), "git": git_commit(), "dataset_fingerprint": loader.fingerprint}
    last = cfg.steps - 1
    end = start if exit_code else cfg.steps
    progress = Progress(
        total=cfg.steps, start=start, batch_size=cfg.data.batch_size, every=cfg.log.print_every
    )
    if start >= cfg.steps:
        print(f"run {cfg.run} already finished at step {start - 1} ({run_dir}); nothing to do", flush=True)
    t_start = time.perf_counter()
    evals: dict[str, float] = {}
    for step in range(start, end):
        t0 = time.perf_counter()
        batch, pending = (pending if pending is not None else next(loader)), None
        t_data = time.perf_counter() - t0
        key, chain = step_key(cfg, chain, step)
        check = check_due(step, cfg.monitor_interval, cfg.optim.grad_accum)
        params, opt_state, metrics, stats = train_step(params, opt_state, on_device(batch), key, check)
        metrics, stats = distributed.host((metrics, stats))
        metrics = {k: float(v) for k, v in metrics.items()}
        metrics["train/step_time"] = time.perf_counter() - t0
        metrics["train/data_wait"] = t_data
        metrics["dataloader/index_crc32"] = distributed.index_crc32(batch["index"][rows])
        report = callbacks.step_end(StepEnd(step, batch, stats))
        metrics.update(report.metrics)
        for warning in report.warnings:
            progress.message(f"WARNING {warning}")
            log.event("warning", step, message=warning)

        if step % cfg.log_every == 0 or step == last or report.must_log:
            # Post-update norms on host float64, as the checkpoint computes them; only when logged,
            # since it copies every parameter off the device.
            norms = tree_norms(distributed.host(params), "param_norm")
            metrics.update({f"train/{k}": v for k, v in norms.items()})
            log.log(step, metrics)
        progress.step(step, metrics)

        if cfg.eval_every > 0 and ((step + 1) % cfg.eval_every == 0 or step == last):
            # Frozen-encoder kNN beside its baselines every time; the linear probe at the end.
            eval_rows, train_split, held_out = evaluator(encoder(params), linear=step == last)
            evals = {**eval_report.metrics(eval_rows), **online_probe_metrics(params["probe"], held_out)}
            log.log(step, evals)
            progress.message(
                f"eval step {step}: kNN {evals['eval/knn_acc']:.3f} (random init "
                f"{evals['eval/knn_acc_random_init']:.3f}, raw {evals['eval/knn_acc_raw']:.3f}); "
                f"online probe {evals['eval/probe_acc']:.3f}"
            )
            if step == last and main:
                files, splits = (train_files, eval_files), (train_split, held_out)
                doc = eval_report.info(run_dir, step, cfg.seed, model_cfg, files, splits, n_classes)
                eval_report.write_json(run_dir / "eval" / f"{step}.json", eval_rows, doc)

        # Every process must stop at the same step: a signal seen by one is acted on by all.
        stopping = step == cfg.stop_at_step or distributed.any_process(stop.signal is not None)
        if (step + 1) % cfg.ckpt_every == 0 or step == last or stopping or step in cfg.debug_roundtrip_steps:
            loader_state = loader.state()
            pending = next(loader)
            meta = {
                **meta_base,
                "restart": restart,
                "loader_state": loader_state,
                "prng_chain": np.asarray(jax.random.key_data(chain)).tolist(),
                "callbacks": callbacks.save(step),
                "next_step": next_step(step + 1, pending).to_json(),
                "last_metrics": {k: v for k, v in metrics.items() if k.startswith("train/")},
            }
            state = {"params": params, "opt_state": opt_state}
            ckpt.save(step, state, meta)
            if step in cfg.debug_roundtrip_steps:
                # Go on from the restored copy with compile caches cleared: the rest of the run must
                # not notice (the test compares it with an uninterrupted run).
                restored = checkpoint.roundtrip(run_dir / "debug_roundtrip", step, state, meta)
                jax.clear_caches()
                params, opt_state = jax.device_put((restored["params"], restored["opt_state"]), replicated)
        if stopping:
            signalled = step != cfg.stop_at_step
            exit_code = REQUEUE_EXIT_CODE if signalled else 0
            reason = f"signal {stop.signal or 'on another process'}" if signalled else "stop_at_step"
            log.event("stop", step, reason=reason, exit_code=exit_code)
            progress.message(f"stopping after step {step} ({reason}); exit {exit_code}")
            break

    progress.close()
    evaluator.close()
    if exit_code == 0 and not evals and start < cfg.steps and step == last:
        print(f"done: {cfg.steps - start} steps in {time.perf_counter() - t_start:.0f} s; no evaluation "
              f"(--eval-every 0); run directory {run_dir}", flush=True)  # fmt: skip
    if exit_code == 0 and evals and start < cfg.steps and step == last:
        print(eval_report.table(eval_rows, encoder_title=f"encoder (step {step})"), flush=True)
        print(
            f"done: {cfg.steps - start} steps in {time.perf_counter() - t_start:.0f} s; frozen encoder on "
            f"the held-out split: linear probe {evals['eval/linear_acc']:.3f} (random init "
            f"{evals['eval/linear_acc_random_init']:.3f}, raw log-mel {evals['eval/linear_acc_raw']:.3f}), "
            f"kNN {evals['eval/knn_acc']:.3f} (random init {evals['eval/knn_acc_random_init']:.3f}, raw "
            f"{evals['eval/knn_acc_raw']:.3f}); chance {1 / n_classes:.3f}; run directory {run_dir}",
            flush=True,
        )
    ckpt.close()
    log.close()
    if wandb_run is not None:
        wandb_run.finish(exit_code=exit_code)
    return exit_code


def cli(cfg: Annotated[PretrainConfig, tyro.conf.arg(name="")]) -> None:
    """Pretrain an encoder (default: LeJEPA on the embedded demo set); resumes automatically."""
    deterministic_xla()
    distributed.initialize()
    if not distributed.is_main():  # one console: process 0 speaks for the group
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    code = pretrain(cfg)
    if code:
        raise SystemExit(code)
