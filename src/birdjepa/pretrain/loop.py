"""`birdjepa pretrain`: the training loop, one function read top to bottom, on top of everything else.

`pretrain` reads: open (data, model, optimizer) -> restore (a fresh `TrainState` or the newest
checkpoint; the resume checks) -> loop (step, evaluate, save) -> close. What stays fixed during a
segment lives in `Trainer`; what a step changes lives in the `TrainState` it advances. The resume
checks, the verification wing's seam (an injected fault), the ``--prng`` modes and the debug roundtrip
are functions over the state, outside the loop body; `due` is the one cadence rule of logging,
evaluation and checkpoints. The segment's set-up and the step's pieces come from below
(`birdjepa.train.segment`, `.compiled`, `.state`); what the loop asks of a segment besides the step
is `birdjepa.pretrain.trainer.Trainer`.

Step numbering: step ``s`` (0-based) consumes one loader batch and applies update ``s`` (or one
micro-step of it when accumulating). Metrics logged for step ``s`` and the checkpoint labelled ``s``
both describe the state *after* step ``s``; a resume from checkpoint ``s`` continues with step
``s + 1``. The LR applied at update ``u`` is ``schedule(u)`` and the logged LR is read back from the
optimizer state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import jax
import tyro

from birdjepa import exit_codes, multihost, validation
from birdjepa.config import ConfigError, PretrainConfig, flatten, to_dict
from birdjepa.cores import threads_said
from birdjepa.data import Batch, DataError
from birdjepa.diagnostics.callbacks import StepEnd
from birdjepa.evaluation import report as eval_report
from birdjepa.outputs import free_bytes, mib
from birdjepa.pretrain.console import KeptGoing
from birdjepa.pretrain.progress import Progress
from birdjepa.pretrain.stop import STOP_SIGNALS, USER_SIGNALS, StopRequest, group_stop
from birdjepa.pretrain.trainer import Trainer, check_device_options, make_callbacks
from birdjepa.resume.checks import config_diff
from birdjepa.resume.options import hand_edits, resumed_config, saved_config, unlike_its_config
from birdjepa.resume.restored import Restored
from birdjepa.rundir import checkpoint, kept, layout
from birdjepa.rundir.checkpoint.space import (
    MOVED,
    WRITE_ERRNOS,
    limit_fix,
    remove_temporaries,
)
from birdjepa.rundir.lease import LEASE_WAIT_ENV, Lease, LeaseHeld, LeaseLost, LeaseUnwritable, acquire
from birdjepa.rundir.log_at_resume import read_at_resume
from birdjepa.seams import injected
from birdjepa.slurm import distributed
from birdjepa.train import param_norms
from birdjepa.train.memory_fit import DoesNotFit, out_of_memory, smaller_step
from birdjepa.train.segment import advance, classes_changed, open_loader, open_segment, start_warnings
from birdjepa.train.state import TrainState
from birdjepa.train.step import fresh_chain
from birdjepa.validation import OptionError


def due(step: int, every: int, last: int) -> bool:
    """The one cadence rule of the loop: after every ``every``-th step (``every`` > 0) and after the last."""
    return step == last or (every > 0 and (step + 1) % every == 0)


def debug_roundtrip(t: Trainer, state: TrainState, meta: dict[str, Any]) -> TrainState:
    """``--debug.roundtrip-steps``: save the state just checkpointed, restore it into fresh objects
    (asserting every leaf bit-identical) and go on from the copy with compile caches cleared. The rest of
    the run must not notice (the test compares it with an uninterrupted run)."""
    step = state.step - 1
    restored = checkpoint.roundtrip(t.cfg.run_dir / "debug_roundtrip", step, state.arrays(), meta)
    jax.clear_caches()
    return t.fns.place(dataclasses.replace(state, params=restored["params"], opt_state=restored["opt_state"]))


def group_values(cfg: PretrainConfig) -> dict[str, str]:
    """What every process of a group must agree on: each option (but the loader's worker count, which
    moves no batch) and the train data's fingerprint (its files as this process reads them)."""
    from birdjepa.data import open_shards
    from birdjepa.train.segment import data_files

    values = {
        f"--{k.replace('_', '-')}": repr(v) for k, v in flatten(to_dict(cfg)).items() if k != "data.n_workers"
    }
    try:
        opened = open_shards(data_files(cfg)[0], train=False, features=cfg.data.features,
                             audio_root=cfg.data.audio_root)  # fmt: skip
        values["train data (its fingerprint)"] = opened.fingerprint
    except Exception as e:  # noqa: BLE001 (said by the checks after, in every process alike)
        values["train data (its fingerprint)"] = f"unreadable: {e}"
    return values


def pretrain(cfg: PretrainConfig) -> int:
    """Train (or continue) the run in ``cfg.run_dir``; returns the process exit code. The signal
    handlers it installs are removed again when it returns (a process may train several runs), and
    so is the run's lease (process 0 holds it: one writer per run, `birdjepa.rundir.lease`)."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    # A preemption while the run opens (a restore, a compile: minutes on a GPU) killed it without a word
    # (exit -15, its lease left): recorded from here, it stops the run after its first step, saved. A
    # Ctrl-C stays immediate until the loop: nothing is trained yet.
    # A hang-up too (an ssh session dropped: the process died, exit -1, its lease left). In a group, a
    # Ctrl-C too: one process out at once left the others in a collective, which aborted them 300 s
    # later with a C++ stack.
    group = jax.process_count() > 1
    stop = StopRequest(
        (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGXCPU, *((signal.SIGINT,) if group else ())),
        speaks=multihost.is_main(),
    )
    try:
        return _held(cfg, stop)
    finally:  # however it ends (a refused option, a held lease): the caller's handlers back
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if stop.cpu_limit:  # past the soft limit the kernel sends it again each CPU second: its default
            signal.signal(signal.SIGXCPU, signal.SIG_IGN)  # killed the saved run's exit 75 (or 0)


def _held(cfg: PretrainConfig, stop: StopRequest) -> int:
    """`pretrain` under its signal handlers: the checks, the run's lease, the segment."""
    if jax.process_count() > 1 and (differs := multihost.first_disagreement(group_values(cfg))) is not None:
        print(f"error: the processes of the group were started with another {differs}: give each the same "
              "options and data", file=sys.stderr, flush=True)  # fmt: skip
        return exit_codes.USAGE
    # An empty checkpoints/ folder or log is no run: a start that failed before its first step leaves
    # them, and the same command with --resume never was refused.
    ckpts, log = layout.checkpoints(cfg.run_dir), layout.metrics_file(cfg.run_dir)
    saved = ckpts.is_dir() and any(ckpts.iterdir())
    found = saved_config(cfg.run_dir) if saved and cfg.resume == "auto" else None
    validation.check(cfg, saved=flatten(found[1]) if found else None)  # before anything touches the run
    if (nested := layout.nesting(cfg.log.runs_dir, cfg.run_dir)) is not None:
        raise OptionError("run", cfg.run, nested)
    if cfg.resume == "never" and (saved or (log.is_file() and log.stat().st_size > 0)):
        # A fresh start there would write a second run's checkpoints and log beside the first's, and the
        # next resume would continue whichever checkpoint is newest.
        raise OptionError("resume", "never", f"{cfg.run_dir} already holds a run: give another --run, or "
                          "remove that folder to start this one over")  # fmt: skip
    check_device_options(cfg)
    lease: Lease | None = None
    if multihost.is_main():
        slurm = bool(os.environ.get("SLURM_JOB_ID"))  # a requeue may race its predecessor's last save
        try:
            lease = acquire(cfg.run_dir, wait_s=float(os.environ.get(LEASE_WAIT_ENV, 120)) if slurm else 0.0)
        except LeaseHeld as e:
            # Requeued only behind this job's own earlier start, still saving: behind another job (the
            # same sweep submitted twice) or a trainer started by hand, it requeued itself every 2 min,
            # holding its allocation, until that one ended.
            ours = slurm and e.holder.get("job") == os.environ["SLURM_JOB_ID"]
            code = exit_codes.REQUEUE if ours else exit_codes.USAGE
            other = (f"; this job ({os.environ['SLURM_JOB_ID']}) is not requeued: one trainer of the run "
                     "at a time" if slurm and not ours else "")  # fmt: skip
            print(f"ERROR: {e}{other}; exit {code}", flush=True)
            return code
        except LeaseUnwritable as e:  # a read-only folder: as a log or checkpoint that cannot be written
            # Another runs folder starts another run: no advice to a run that has trained.
            try:
                trained = layout.has_checkpoints(cfg.run_dir)
            except OSError:  # not even readable
                trained = False
            fix = ("Make it writable, then run the same command" if trained else
                   "Make it writable or give another --log.runs-dir, then run the same command")  # fmt: skip
            print(f"ERROR: {e}; nothing was touched. {fix}; exit {exit_codes.IOERR}", flush=True)
            return exit_codes.IOERR
    try:
        return _pretrain(cfg, lease, stop)
    except LeaseLost as e:  # another trainer holds the run now: it writes, this one must not
        print(f"ERROR: {e}; exit {exit_codes.USAGE}", flush=True)
        return exit_codes.USAGE
    # A shard found unusable once opened (a truncated one), or mid-run; splits the evaluation cannot score.
    except (DataError, DoesNotFit, eval_report.UnusableSplits) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return exit_codes.USAGE
    except (RuntimeError, ValueError) as e:
        if (gone := multihost.peer_lost(e)) is not None:
            print(
                f"ERROR: another process of the group stopped while this one waited for it ({gone}): its "
                f"own output says why; {kept.intact(cfg.run_dir)}; exit {exit_codes.GROUP_BROKEN}",
                flush=True,
            )
            return exit_codes.GROUP_BROKEN
        if "can't start new thread" in str(e):  # ulimit -u, a cgroup's pids.max: a traceback, exit 1
            print(f"ERROR: a thread could not be started ({e}): a limit on this process's threads (ulimit "
                  "-u, a cgroup's pids.max) was met; fewer --data.n-workers or a higher limit; "
                  f"{kept.intact(cfg.run_dir)}; exit {exit_codes.USAGE}", flush=True)  # fmt: skip
            return exit_codes.USAGE
        if (said := out_of_memory(e)) is None:
            raise
        print(f"ERROR: the device ran out of memory ({said}): {smaller_step(bool(kept.saved(cfg.run_dir)))}; "
              f"{kept.intact(cfg.run_dir)}; exit {exit_codes.USAGE}", flush=True)  # fmt: skip
        return exit_codes.USAGE
    except OSError as e:  # the log or config.json on a full disk (a checkpoint says more: `save_failed`)
        # A log the run may not write (read-only, immutable) was a traceback, exit 1: a file of the run's.
        denied = e.errno in (errno.EACCES, errno.EPERM) and bool(e.filename)
        ours = denied and Path(e.filename).resolve().is_relative_to(cfg.run_dir.resolve())
        if e.errno not in WRITE_ERRNOS and not ours:
            raise
        what = e.filename or f"to {cfg.run_dir}"
        where = Path(e.filename).parent if e.filename else cfg.run_dir
        # A file-size limit (ulimit -f) said "Free space" with GBs free.
        fix = limit_fix(str(e.strerror)) or f"Free space or make it writable {MOVED}"
        print(f"ERROR: could not write {what}: {e.strerror} ({mib(free_bytes(where))} free there); "
              f"{kept.intact(cfg.run_dir)}. {fix}, then run the same command; exit {exit_codes.IOERR}",
              flush=True)  # fmt: skip
        return exit_codes.IOERR
    finally:
        if lease is not None:
            lease.release()


def _pretrain(requested: PretrainConfig, lease: Lease | None, stop: StopRequest) -> int:
    # Open: the data, the model, the compiled step, and the state: a fresh one, or the newest checkpoint.
    requested.run_dir.mkdir(parents=True, exist_ok=True)
    if multihost.is_main():  # a save killed mid-write (kill -9, a node lost) left a checkpoint's size there
        remove_temporaries(layout.checkpoints(requested.run_dir))  # for ever; the lease is held: no writer
    ckpt = checkpoint.Checkpointer(
        requested.run_dir,
        keep=requested.ckpt_keep,
        async_save=requested.ckpt_async,
        before_commit=lease.still_held if lease is not None else None,
    )
    try:
        at = "newest" if requested.resume == "auto" else None
        seg = open_segment(requested, ckpt, at=at, compile_ahead=jax.process_count() == 1)
    except checkpoint.StructureError as e:  # a list of tree paths, naming no option: name the options
        meta = ckpt.read_meta(e.step)
        _, changed = config_diff(meta.get("config", {}), to_dict(requested))
        why = classes_changed(requested, meta) or (
            f"the options {', '.join(changed)} changed since checkpoint {e.step}, and the state it holds "
            "has another shape than they build: no resume changes that (--allow-config-change neither); "
            "train them in a new run"
            if changed
            else f"checkpoint {e.step} holds a state of another shape than these options build"
        )
        print(f"ERROR: cannot resume: {why} ({e}); exit {exit_codes.RESUME_CHECK}", flush=True)
        ckpt.close()
        return exit_codes.RESUME_CHECK
    except checkpoint.CheckpointError as e:  # none verifies
        print(f"ERROR: cannot resume: {e}; exit {exit_codes.RESUME_CHECK}", flush=True)
        ckpt.close()
        return exit_codes.RESUME_CHECK
    except DataError as e:  # what only the opened data can tell (the demo's labels against --data.eval's)
        print(f"error: {e}", file=sys.stderr, flush=True)
        ckpt.close()
        return exit_codes.USAGE
    (found_files, eval_files), model_cfg, fns, meta = seg.files, seg.model_cfg, seg.fns, seg.meta

    # The verification wing's seam: --debug.inject-fault breaks a restored state on purpose, and may
    # change what the segment trains with (batch size, shards): hence `cfg` below.
    r, no_effect = Restored(requested, found_files, seg.state), None
    if meta is not None:
        r, no_effect = injected(requested.debug.inject_fault).restored(r, fns.tx, fresh_chain(requested))
    cfg, train_files = r.cfg, r.train_files
    # Before the writes into the run (here, after each step, before a save): this process may have been
    # stopped (a suspended job) long enough for another trainer to take the run over (`Lease.check`).
    hold = distributed.group_hold(lease, cfg.run_dir)
    hold()
    if cfg.stop_at_step is not None and cfg.stop_at_step < r.state.step:  # else it trained to the end
        ckpt.close()
        at = r.state.step
        later = (f"(it resumes at step {at}): give a later one, or none to train to step {cfg.steps - 1}"
                 if at < cfg.steps else "and finished: no step is left to stop at")  # fmt: skip
        why = f"run {cfg.run} has trained that step already {later}"
        raise OptionError("stop_at_step", cfg.stop_at_step, why)
    if meta is None and multihost.is_main():  # a fresh start: an earlier start's log is not this run's
        earlier = layout.set_aside_log(cfg.run_dir)
        if earlier is not None:
            print(f"WARNING {cfg.run_dir} holds no checkpoint to resume, so this start begins at step 0"
                  f"{unlike_its_config(cfg)}; the log of an earlier start there is kept as {earlier}",
                  flush=True)  # fmt: skip
    # The log read once, before its writer opens it, for every check of the resume below.
    logged = read_at_resume(layout.metrics_file(cfg.run_dir), r.state.step - 1) if meta is not None else None
    if logged is not None:  # a segment that saved nothing was a resume too: counted from the log
        r = r.with_state(restart=max(r.state.restart, logged.restart + 1))
    t = Trainer(cfg, model_cfg, fns, (train_files, eval_files), ckpt, r.state.restart)
    state = t.fns.place(r.state)
    for fallback in ckpt.fallbacks:
        t.log.event("ckpt_fallback", state.step, **fallback)
    if t.log.repaired:  # a torn last line of the log, cut off when it was opened
        t.log.event("torn_log", state.step, **t.log.repaired)
    if lease is not None and lease.took_over is not None:
        t.log.event("lease_taken_over", state.step, **lease.took_over)
    if logged is not None and t.main:  # what a later `compare` found first, said at the resume
        # Rows as far apart as the segment that wrote the checkpoint logged them (a --log-every 50 then
        # lowered at this resume said "the log lost rows").
        every = max(cfg.log_every, meta.get("config", {}).get("log_every", cfg.log_every))
        for event, why in (("log_damaged", logged.damage(slack=2 * every)),
                           ("checkpoint_missing", logged.lost(cfg.run_dir)),
                           ("other_history", logged.other(meta.get("last_metrics", {})))):  # fmt: skip
            if why is not None:
                print(f"WARNING {why}", flush=True)
                t.log.event(event, state.step, why=why)
    if meta is not None and state.step < cfg.steps:  # a finished run's start resumes nothing: no event
        # n_devices: what trained the steps from here (trace and bisect re-execute them on as many).
        resumed = {"checkpoint": state.step - 1, "n_devices": t.n_devices, **ckpt.last_restore}
        t.log.event("resume", state.step, **resumed)
        if cfg.debug.inject_fault:
            t.log.event("fault_injected", state.step, fault=cfg.debug.inject_fault, no_effect=no_effect)
        print(f"resumed from checkpoint {state.step - 1}: continuing at step {state.step} "
              f"(restart {state.restart})", flush=True)  # fmt: skip
    loader, loader_error = open_loader(cfg, train_files, state.loader_state, resumed=meta is not None)
    threads = loader.n_workers  # --data.n-workers 0 (the default) runs one per CPU this process may use
    print(f"loader: {threads_said(threads)}", flush=True)
    for warning in start_warnings(cfg, len(loader)) if meta is None else ():
        print(f"WARNING {warning}", flush=True)
    callbacks = make_callbacks(cfg, loader, state.params)
    # The batch of the coming step is fetched ahead whenever a save or a resume needs to fingerprint it.
    pending: Batch | None = None
    exit_code = 0
    if meta is not None and state.step < cfg.steps:
        for note in callbacks.restore(state.step - 1, state.callbacks):
            print(f"WARNING {note}", flush=True)
        pending = next(loader)
        exit_code = t.check_resume(state, meta, pending, loader, loader_error)
    elif meta is not None:
        exit_code = t.check_finished(state, meta)
    evals: dict[str, float] = {}
    # The evaluation a stop was saved without (it failed: its data) comes first, at the step it was due.
    caught_up = bool(meta and meta.get("unevaluated")) and not (logged and logged.evaluated)
    caught_up = caught_up and exit_code == 0 and cfg.eval_every > 0
    if caught_up:
        if state.step >= cfg.steps:  # a finished run: no resume check said its eval split changed
            t.check_eval_data(meta, state.step)
        try:
            evals, eval_rows = t.evaluate(state.params, state.step - 1)
            print(f"{_eval_line(state.step - 1, evals)} (the stop's evaluation)", flush=True)
        except (DataError, eval_report.UnusableSplits) as e:  # its data, still: nothing trains
            exit_code, caught_up = exit_codes.USAGE, False
            print(f"error: {e}\nstep {state.step - 1} stays saved without its evaluation: once its data "
                  f"reads, the same command evaluates it first (--eval-every 0 leaves it); exit {exit_code}",
                  file=sys.stderr, flush=True)  # fmt: skip
    # The options of the segment that trains: a refused one leaves them, and so does a start of a finished
    # run (nothing to do, nothing checked).
    if exit_code == 0 and state.step < cfg.steps and multihost.is_main():
        layout.write_config(cfg.run_dir, to_dict(requested))

    # Loop: step, evaluate, save.
    stop.watch(list(USER_SIGNALS))
    last = cfg.steps - 1
    end_here = last if cfg.stop_at_step is None else min(last, cfg.stop_at_step)  # where the segment ends
    start, end = state.step, state.step if exit_code else cfg.steps
    progress = Progress(
        total=cfg.steps, start=start, batch_size=cfg.data.batch_size, every=cfg.log.print_every
    )
    if start >= cfg.steps and not exit_code and not caught_up:
        print(
            f"run {cfg.run} already finished at step {start - 1} ({cfg.run_dir}); nothing to do", flush=True
        )
    t_start = time.perf_counter()
    unevaluated: Exception | None = None
    try:
        for step in range(start, end):
            t0 = time.perf_counter()
            stop.ending_with = 0 if step == end_here else None  # a stop now comes at this step's end anyway
            batch, pending = (pending if pending is not None else next(loader)), None
            t_data = time.perf_counter() - t0
            state, metrics, stats, guard = advance(t.fns, cfg, state, batch)
            hold()
            t.log.flush()  # the last logged step's row: its norms were taken while this step ran
            finite = bool(guard["finite"])
            metrics = {k: float(v) for k, v in metrics.items()}
            metrics["train/skipped_updates"] = float(state.skipped)
            metrics["train/step_time"] = time.perf_counter() - t0
            metrics["train/data_wait"] = t_data
            metrics["dataloader/index_crc32"] = multihost.index_crc32(batch["index"][t.rows])
            report = callbacks.step_end(StepEnd(step, batch, stats))
            metrics.update(report.metrics)
            for warning in report.warnings:
                progress.message(f"WARNING {warning}")
                t.log.event("warning", step, message=warning)
            if due(step, cfg.log_every, last) or report.must_log:
                # Post-update norms on host float64, as the checkpoint computes them, taken on a thread
                # while the next step runs; only when logged, since they copy every parameter.
                t.log.log(step, metrics, later=param_norms.later(state.params))
            progress.step(step, metrics, epoch=int(batch["epoch"].max()))
            if not finite:  # before any evaluation or save: a stop leaves the last checkpoint the newest
                exit_code, line = t.nonfinite(state, metrics, guard["bad"])
                progress.message(line)
                if exit_code:
                    break

            if cfg.eval_every > 0 and due(step, cfg.eval_every, last):
                try:
                    evals, eval_rows = t.evaluate(state.params, step)
                except (DataError, eval_report.UnusableSplits) as e:  # its data: the step is saved below
                    unevaluated = e  # (a stop lost every step since the last checkpoint, each resume too)
                    stop.ending_with = exit_codes.USAGE  # whatever a Ctrl-C asks now (one before: said)
                    again = f" (the Ctrl-C's exit is {exit_codes.USAGE} now)" if stop.ctrl_c else ""
                    print(f"error: {e}{again}", file=sys.stderr, flush=True)
                else:
                    progress.message(_eval_line(step, evals))
                if multihost.any_process(unevaluated is not None) and unevaluated is None:  # all stop
                    unevaluated = DataError("another process's evaluation failed on its data")

            # Every process stops at the same step, with one code: a signal seen by one is acted on by all.
            signalled_with = group_stop(multihost.every_process(stop.signal or 0))
            # One asked for during this step's save comes at the next step's end, or after this one's
            # save where the segment ends here: exit 0 either way.
            stop.ending_with = (
                exit_codes.USAGE if unevaluated is not None else 0 if step + 1 >= end_here else None
            )
            stopping = step == cfg.stop_at_step or signalled_with is not None or unevaluated is not None
            if due(step, cfg.ckpt_every, last) or stopping or step in cfg.debug.roundtrip_steps:
                try:
                    hold()
                    pending, saved = t.save(
                        state, loader, callbacks, metrics, unevaluated=unevaluated is not None
                    )
                    if stopping:  # on disk before the run says it stopped
                        t.wait_saved(step)
                except checkpoint.CheckpointWriteError as e:  # this save, or the previous one (background)
                    exit_code, line = t.save_failed(e, step)
                    progress.message(line)
                    break
                except checkpoint.NotFiniteError as e:  # an update that overflowed, its gradients finite
                    exit_code, line = t.state_not_finite(e)
                    progress.message(line)
                    break
                if step in cfg.debug.roundtrip_steps:
                    state = debug_roundtrip(t, state, saved)
            if unevaluated is not None:  # the data's fault, not a preemption's: not requeued
                exit_code = exit_codes.USAGE
                t.log.event(
                    "stop", step, reason="evaluation failed", exit_code=exit_code, error=str(unevaluated)
                )
                progress.message(
                    f"stopping after step {step}, saved without its evaluation (the error above): once its "
                    f"data reads, the same command resumes there and evaluates it first; exit {exit_code}"
                )
                break
            if stopping:
                signalled = step != cfg.stop_at_step
                # By the user: not a preemption to requeue.
                on_signal = USER_SIGNALS.get(signalled_with or 0, exit_codes.REQUEUE)
                # At the last step the run is done: exit 75 requeued it to say "nothing to do", and its
                # closing summary, with the baselines, was in no log.
                exit_code = on_signal if signalled and step != last else 0
                reason = f"signal {signalled_with}" if signalled else "stop_at_step"
                if signalled and step == last:
                    t.log.event("stop", step, reason=f"{reason} at the last step", exit_code=0)
                    break
                t.log.event("stop", step, reason=reason, exit_code=exit_code)
                progress.message(f"stopping after step {step} ({reason}); exit {exit_code}")
                break
    except BaseException as e:
        # An error stops the run: what it finished is written before the error goes up, unless that
        # fails too (then the error above is the one to see). The last logged step's row, held for its
        # norms (`param_norms`), and, unless a second Ctrl-C asks to be out at once, the checkpoint
        # still being written in the background: without the wait, the process left it unwritten.
        # Nothing, once the run is another trainer's.
        if not isinstance(e, LeaseLost):
            with contextlib.suppress(Exception):
                t.log.flush()
        if not isinstance(e, (KeyboardInterrupt, LeaseLost)):
            with contextlib.suppress(Exception):
                t.wait_saved(state.step - 1)  # its retention's WARNINGs logged too
        raise

    # Close: every checkpoint on disk (a failed background write shows here at the latest), then the
    # summary next to its baselines. A Ctrl-C meanwhile changes no exit code.
    stop.ending_with = exit_code
    if exit_code in (0, exit_codes.REQUEUE, *USER_SIGNALS.values()):
        try:
            t.wait_saved(state.step - 1)
        except checkpoint.CheckpointWriteError as e:
            exit_code, line = t.save_failed(e, state.step - 1)
            progress.message(line)
    progress.close()
    if exit_code == 0 and (start < cfg.steps or caught_up) and state.step == cfg.steps:
        took = f"done: {cfg.steps - start} steps in {time.perf_counter() - t_start:.0f} s"
        if not evals:
            print(f"{took}; no evaluation (--eval-every 0); run directory {cfg.run_dir}", flush=True)
        else:
            title, overlap = f"encoder (step {last})", t.evaluator.overlap
            split = "eval split, NOT HELD OUT" if overlap else "held-out split"
            print(eval_report.table(eval_rows, encoder_title=title, overlap=overlap), flush=True)
            e = evals
            linear = (
                f"linear probe {e['eval/linear_acc']:.3f} (random init "
                f"{e['eval/linear_acc_random_init']:.3f}, raw log-mel {e['eval/linear_acc_raw']:.3f}), "
                if "eval/linear_acc" in e
                else ""
            )
            print(
                f"{took}; frozen encoder on the {split} ({t.held_out_clips} clips): {linear}"
                f"kNN {e['eval/knn_acc']:.3f} "
                f"(random init {e['eval/knn_acc_random_init']:.3f}, raw {e['eval/knn_acc_raw']:.3f}); "
                f"chance {t.held_out_chance:.3f}; run directory {cfg.run_dir}",
                flush=True,
            )
    t.close(exit_code)
    return exit_code


def _eval_line(step: int, evals: dict[str, float]) -> str:
    return (f"eval step {step}: kNN {evals['eval/knn_acc']:.3f} (random init "
            f"{evals['eval/knn_acc_random_init']:.3f}, raw {evals['eval/knn_acc_raw']:.3f}); "
            f"online probe {evals['eval/probe_acc']:.3f}")  # fmt: skip


def parse(args: Sequence[str]) -> PretrainConfig:
    """The config of ``birdjepa pretrain ARGS``. A run with a checkpoint is resumed with its options
    taken from the checkpoint's config unless ``args`` set them (`birdjepa.resume.options`), so a requeue
    needs no options retyped and a newer default does not change it. Joins the process group first
    (`birdjepa.slurm.distributed`): reading the checkpoint starts JAX's backend, and a process group can
    only be joined before that."""
    distributed.initialize()
    group = distributed.launched_tasks() > 1
    try:
        cfg = tyro.cli(PretrainConfig, args=args, prog="birdjepa pretrain", description=cli.__doc__)
    except SystemExit:  # a mistyped option, --help: the others learn it (they waited 2 min for this one)
        if group:
            multihost.every_process(1)
        raise
    if group:
        if any(multihost.every_process(0)):
            print(f"error: another process of the group refused its options (its error says which); exit "
                  f"{exit_codes.USAGE}", file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(exit_codes.USAGE)
        distributed.same_checkpoints(cfg.run_dir)
    try:
        found = resumed_config(args, cfg, prog="birdjepa pretrain")
    except ConfigError as e:  # an option whose type changed: this birdjepa cannot take the run's value
        print(f"error: {e}; set it on the command line", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.USAGE) from None
    if found is None:
        return cfg
    step, saved, cfg, kept = found
    differ = f"; where this birdjepa's defaults differ: {', '.join(kept)}" if kept else ""
    if distributed.launched_rank() == 0:  # one console: the group is not joined yet
        print(f"run {cfg.run}: options from checkpoint {step}'s config unless set on the command line"
              f"{differ}", flush=True)  # fmt: skip
        if edits := hand_edits(cfg.run_dir, saved):
            print(f"WARNING {layout.config_file(cfg.run_dir)} differs from checkpoint {step}'s config "
                  f"({'; '.join(edits[:3])}{' ...' if len(edits) > 3 else ''}): a resume reads its options "
                  "from the checkpoint and the command line, not that file (a segment that trains rewrites "
                  "it); give a change on the command line", flush=True)  # fmt: skip
    return cfg


def cli(cfg: Annotated[PretrainConfig, tyro.conf.arg(name="")]) -> None:
    """Pretrain an encoder (default: LeJEPA on the embedded demo set); resumes automatically."""
    if not multihost.is_main():  # one console: process 0 speaks for the group
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
    console, sys.stdout = sys.stdout, KeptGoing(sys.stdout, "the console (standard output)")
    try:
        _cli(cfg)
    finally:
        sys.stdout.flush()
        sys.stdout = console


def _cli(cfg: PretrainConfig) -> None:
    before = set(threading.enumerate())  # a caller's own threads (a test runner's) are not this run's
    try:
        code = pretrain(cfg)
    except OptionError as e:  # pretrain checks the options first, before a run directory exists
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.USAGE) from None
    except KeyboardInterrupt:  # a second Ctrl-C (or one before training started): out at once
        said = kept.interrupted(cfg.run_dir)
        print(f"interrupted: {said}; exit {exit_codes.INTERRUPTED}", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.INTERRUPTED) from None
    if code == exit_codes.GROUP_BROKEN:  # out now: the exit's shutdown barrier waits for the lost process
        exit_codes.exit_now(code)  # 100 s, then aborts with a C++ stack
    if code:
        exit_codes.exit_past_stuck_threads(code, set(threading.enumerate()) - before)


cli.parse = parse  # type: ignore[attr-defined]  # `birdjepa.cli.main` parses pretrain's flags with it
