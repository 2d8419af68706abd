"""birdjepa on a GPU in one command: exact resume, the noise floor, the step's MFU, the loader against it.

    python scripts/gpu_check.py               # on a machine with one GPU: under 8 minutes
    python scripts/gpu_check.py --quick       # the same checks at the tiny preset (a CPU: ~4 minutes)

Runs with the JAX, jaxlib and CUDA plugin the machine has, from a checkout (``PYTHONPATH=src`` with the
Rust extension built, or the venv of ``make build``); it was written against JAX 0.10 and 0.11.

First, on a GPU (``--prebuild`` elsewhere, ``--no-prebuild`` to skip it): **prebuild** compiles every
program the step, reference and conds sections time, in processes side by side (half the cores at a
time), into the compilation caches those sections then load from, so each timed process runs alone
and the compiles (58 s for the small step on an H200) overlap instead of adding up. Their rows say
whether each step was loaded. Then, in order:

1. **resume**: ``birdjepa verify-resume`` trains the run straight and resumed twice (three processes;
   once with ``--quick``), at the tiny preset, with the persistent compilation cache off, so every
   segment compiles and autotunes its step afresh, and compares every logged metric (``birdjepa
   compare``'s code: its ``max_abs_diff`` must be 0.0).
2. **noise floor**: ``birdjepa trace --repeat 3`` executes a step of the straight run three times, as
   ``birdjepa bisect --repeat`` does: the tensors that differ between executions must be none, and the
   traced step's outputs must equal what the run logged and saved.
3. **step**: the small and base steps in bfloat16 at batch 128: time, FLOPs (XLA's cost analysis),
   FLOP/s and MFU against the best of bfloat16 square matrix products measured here
   (`birdjepa.perf.step_cost.PEAK_SIZES`),
   and the five largest parts of the step's wall time, from a profile (`birdjepa.perf.profile`);
   after a prebuild, **in place**: the first step's XLA memory plan and the copies XLA adds of its
   donated state, as the harness compiles it and with XLA's other copy insertion (on a GPU the
   region-based one, which the harness sets on a CPU only: `birdjepa.train.determinism.IN_PLACE`).
4. **reference** (only when asked, with ``--reference DIR``, a checkout of samuelstevens/birdjepa, and
   ``--reference-venv``, its environment): our LeJEPA step beside the reference implementation's at the
   step section's presets in float32, as ``scripts/bench_reference.py`` measures them.
5. **conds** (only when asked): the small step at batch 128 as the loop runs it, and built without its
   record (`birdjepa.perf.step_cost.unrecorded`), each in a process of its own: both times, and whether
   the parameters after the same steps are equal. On a GPU each of the record's conds costs the step
   time while the device waits (an H200, 2026-11-30: 476 conds, one per tensor, made the small step
   34.4 ms against 20.0 without them); the record now holds one per stage and transformer block
   (`birdjepa.train.recording.group`), and this measures what they still cost. Then **in place
   steps**: the loop's step compiled with XLA's other copy insertion (the step section's "in place"
   program), timed the same way, its parameters compared with the harness's: equal, the harness can
   switch to it on a GPU without moving a bit.
6. **loader**: clips/s with every core decoding (``--data.n-workers 0``, the default: one thread per CPU
   the process may run on), against the clips/s the
   small step consumes, and the data wait of a real ``birdjepa pretrain`` run at that setting; that
   run's loop step part by part (``scripts/bench_loop.py``: the loader, the step's inputs, the batch
   put on the device, the dispatch, the wait for the step's outputs and their copy, the callbacks);
   then the same run logging every 10th step (``--log-every 10``): what a logged step's norms still
   cost the loop now that a thread takes them while the next step runs (`birdjepa.train.param_norms`).
7. **requeue** (only when asked: ``--sections ... requeue``): a resumed segment's time to its first
   step with the persistent compilation cache warm and off, at the small preset and batch 128
   (``scripts/bench_requeue.py``'s measurement).
8. **resume-cached**: section 1 again with the compilation cache on (the default).

``--sections`` runs some of them (in this order); ``noise`` needs ``resume``.

Prints each section's rows as it ends (and rewrites ``--json``: a command killed by a time limit keeps
what finished), then one table. Exit 0: every check held; 1: a check failed (resume not exact, a noise
floor above 0); 2: a section could not run (its error is printed). A section that would start past
``--budget-s`` is skipped and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Before JAX starts: every process of the check shares one GPU, so none may take most of its memory.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from birdjepa.children import Children  # noqa: E402
from birdjepa.cores import schedulable_cpus  # noqa: E402
from birdjepa.host_memory import keep_for_reuse  # noqa: E402
from birdjepa.synthetic.demo import ensure_demo_data  # noqa: E402
from birdjepa.train.determinism import IN_PLACE, deterministic_xla  # noqa: E402

HOST_MEMORY_KEPT = keep_for_reuse()  # as the `birdjepa` command does (birdjepa.host_memory: CPU steps only)
deterministic_xla()

import jax  # noqa: E402
import jaxlib  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import loader_rate  # noqa: E402  (the loader benchmark's own measurement)
from bench_reference import default_batch, measure_preset, processes, reference_env  # noqa: E402

ROWS: list[tuple[str, str, str, str]] = []
"""(section, setting, result, verdict: ok / FAIL / ERROR / skipped / measured)."""

PREBUILT: dict[str, dict[str, float]] = {}
"""What each program's compile in the prebuild section gave, by its name there: the seconds it took,
its XLA memory plan and the copies XLA adds of its state (`step_cost.compile_step`)."""

OTHER_COPIES = "the other copy insertion"
"""The prebuild's name for the step section's first step compiled with XLA's other copy insertion (see
`other_copy_insertion`)."""


CHILDREN = Children()
"""The check's processes: a SIGTERM to the check (a `timeout`, a job's end) is theirs too, and the check
stops once they saved; it died, and its verify-resume and trainers ran on, orphans."""


def child(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)``, the process one
    of `CHILDREN`; SystemExit once it ended where the check was told to stop."""
    proc = CHILDREN.start(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        CHILDREN.done(proc)
    if CHILDREN.stopped:
        raise SystemExit(128 + CHILDREN.stopped)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def birdjepa(
    *args: str, cache: str | None = None, timeout: float = 600, via: tuple[str, ...] = ("-m", "birdjepa.cli")
) -> subprocess.CompletedProcess:
    """``birdjepa *args`` in a process of its own (``via``: another program that takes them)."""
    env = dict(os.environ)
    if cache is not None:
        env["BIRDJEPA_COMPILE_CACHE"] = cache
    cmd = [sys.executable, *via, *args]
    done = child(cmd, env, timeout)
    print(f"$ birdjepa {' '.join(args)}  -> exit {done.returncode}", flush=True)
    if done.returncode not in (0, 1):
        print(done.stdout[-2000:], done.stderr[-4000:], sep="\n", flush=True)
    return done


def resume(runs: Path, plan: Plan, cache: str) -> None:
    cached = "off" if cache == "off" else "on"
    name = f"resume-{'cold' if cache == 'off' else 'cached'}"
    steps, at = plan.resume_steps, plan.resume_at
    # verify-resume compares every logged metric with `birdjepa compare`'s code: its max_abs_diff line.
    done = birdjepa(
        "verify-resume", "--run", name, "--log.runs-dir", str(runs), "--steps", str(steps), "--resume-at",
        *map(str, at), "--ckpt-every", str(at[0]), "--eval-every", "0", "--model.preset", plan.resume_preset,
        "--model.dtype", "bfloat16", "--data.batch-size", str(plan.resume_batch), cache=cache,
    )  # fmt: skip
    last = [x for x in done.stdout.splitlines() if x.startswith("max_abs_diff=")]
    setting = (f"{plan.resume_preset} bf16 batch {plan.resume_batch}, {steps} steps resumed after "
               f"{' and '.join(map(str, at))}, compile cache {cached}")  # fmt: skip
    result = f"{last[-1] if last else 'no max_abs_diff line'}; verify-resume exit {done.returncode}"
    ROWS.append(("resume", setting, result, "ok" if done.returncode == 0 else "FAIL"))


def noise_floor(runs: Path, plan: Plan) -> None:
    from birdjepa.divergence import trace_file

    run = runs / "verify-resume-cold" / "straight"
    step = plan.resume_steps - 2
    out = runs / "noise.npz"
    done = birdjepa("trace", str(run), "--step", str(step), "--repeat", "3", "--out", str(out))
    if not trace_file.traced(done.returncode, out):  # exit 1 with the file: a DIFFER row below
        raise RuntimeError(f"birdjepa trace exited {done.returncode}: {done.stderr[-1500:]}")
    m = trace_file.read(out).manifest
    equal = [k for k, v in m["matches_run"].items() if v]
    differ = [k for k, v in m["matches_run"].items() if v is False]
    result = f"{len(m['noise'])} tensors differ between 3 executions; equal: {', '.join(equal) or 'nothing'}"
    if differ:
        result += f"; DIFFER: {', '.join(differ)}"
    ok = not m["noise"] and not differ
    ROWS.append(("noise floor", f"trace --repeat 3, step {step} of the straight run", result,
                 "ok" if ok else "FAIL"))  # fmt: skip


def flop_rate(x: float) -> str:
    return f"{x / 1e12:.1f} TFLOP/s" if x >= 1e12 else f"{x / 1e9:.1f} GFLOP/s"


def steps(plan: Plan, consumed: dict[str, float]) -> None:
    from birdjepa.perf.step_cost import bench_config, matmul_peak, measure, peak_label

    peak = matmul_peak("bfloat16")
    ROWS.append(("matmul peak", f"bf16, {peak_label()}", flop_rate(peak), "measured"))
    for preset in plan.step_presets:
        for batch in plan.step_batches:
            cfg = bench_config(preset, "bfloat16", batch, steps=plan.wait_steps)
            # On a GPU the profile runs the loaded step: compiling it again would cost the section's
            # budget. Where the machine's cache holds an older code's entry, its parts carry that code's
            # names (compile_cache.compiled_afresh); BIRDJEPA_COMPILE_CACHE=<new folder> avoids it.
            c = measure(cfg, repeats=plan.repeats, profile=True, names_fresh=plan.on_gpu)
            consumed[f"{preset}/{batch}"] = batch / c.step_s
            built = f"{'loaded' if c.loaded else 'compiled'} in {c.compile_s:.0f} s"
            if (prebuilt := PREBUILT.get(f"{preset} batch {batch}")) is not None:  # prebuild_jobs' name
                built += f" (compiled by the prebuild in {prebuilt['compile_s']:.0f} s)"
            ROWS.append((
                "step", f"{preset} bf16 batch {batch} (2 views)",
                f"{1e3 * c.step_s:.1f} ms, {c.flops / 1e9:.1f} GFLOP, {flop_rate(c.flops_per_s)}, "
                f"MFU {100 * c.mfu(peak):.1f} %, {c.memory_bytes / 2**30:.2f} GiB, {built}",
                "measured",
            ))  # fmt: skip
            assert c.profiled is not None
            top = sorted(c.profiled.parts.items(), key=lambda kv: -kv[1])[:5]
            shares = ", ".join(f"{name} {100 * s / c.profiled.wall_s:.0f} %" for name, s in top)
            ROWS.append(("step parts", f"{preset} bf16 batch {batch}, % of wall time", shares, "measured"))
            if (other := PREBUILT.get(f"{preset} batch {batch}, {OTHER_COPIES}")) is not None:
                here = PREBUILT[f"{preset} batch {batch}"]
                ROWS.append((
                    "in place", f"{preset} bf16 batch {batch}: XLA's copy insertion as the harness sets it "
                    f"({'default' if plan.on_gpu else 'region-based'}), against the other",
                    f"copies of the given state {here['state_copies']} against {other['state_copies']}; XLA "
                    f"plan {here['plan_bytes'] / 2**20:.0f} against {other['plan_bytes'] / 2**20:.0f} MiB",
                    "measured",
                ))  # fmt: skip


def loader(runs: Path, plan: Plan, consumed: dict[str, float]) -> None:
    from birdjepa.data import Loader, resolve_files
    from birdjepa.rundir.metrics_log import read_metrics
    from birdjepa.synthetic.demo import ensure_demo_data

    preset, batch = plan.step_presets[0], plan.step_batches[-1]
    files = resolve_files(str(ensure_demo_data() / "train"))
    probe = Loader(files, seed=0, batch_size=batch)  # what the default resolves to here, as in a run
    cores = probe.n_workers
    probe.close()
    rate = loader_rate(files, cores, plan.loader_batches, batch, n_views=2)  # the count the row names
    need = consumed.get(f"{preset}/{batch}")
    versus = f", {rate / need:.1f}x what the {preset} step consumes ({need:.0f} clips/s)" if need else ""
    ROWS.append(("loader", f"{cores} workers, batch {batch}, 2 views", f"{rate:.0f} clips/s{versus}",
                 "measured"))  # fmt: skip
    split = loop_run(runs, plan, "data-wait")
    rows = [x for x in read_metrics(runs / "data-wait") if "event" not in x and "train/step_time" in x][2:]
    wait = sum(x["train/data_wait"] for x in rows) / sum(x["train/step_time"] for x in rows)
    ms = 1e3 * statistics.median(x["train/step_time"] for x in rows)
    setting = f"birdjepa pretrain, {preset} bf16 batch {batch}, {cores} workers, {len(rows)} steady steps"
    ROWS.append(("data wait", setting, f"{100 * wait:.1f} % of step time; {ms:.1f} ms/step", "measured"))
    loop_parts_row(split, "the same run")
    # Logging every 10th step: 9 of 10 steps then copy no parameters for their norms, and the thread
    # that takes them is idle (what logging every step still costs the loop).
    loop_parts_row(loop_run(runs, plan, "log-every-10", "--log-every", "10"), "the same, --log-every 10")


def loop_run(runs: Path, plan: Plan, name: str, *extra: str) -> dict[str, float]:
    """A `birdjepa pretrain` run of the step section's first preset and largest batch, every core
    decoding (the loader's default), with a clock on each of its loop's calls (scripts/bench_loop.py: no
    value changes): the median ms a step of each part."""
    preset, batch = plan.step_presets[0], plan.step_batches[-1]
    parts = runs / f"{name}.json"
    done = birdjepa(
        "--json", str(parts), "pretrain", "--run", name, "--log.runs-dir", str(runs), "--steps",
        str(plan.wait_steps), "--model.preset", preset, "--model.dtype", "bfloat16", "--data.batch-size",
        str(batch), "--eval-every", "0", "--ckpt-every", "1000000",
        "--log.print-every", "1000", *extra, via=(str(Path(__file__).resolve().parent / "bench_loop.py"),),
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"birdjepa pretrain {' '.join(extra)} exited {done.returncode}")
    return json.loads(parts.read_text())


def loop_parts_row(split: dict[str, float], setting: str) -> None:
    shares = ", ".join(f"{part} {v:.1f}" for part, v in split.items() if part != "loop period")
    ROWS.append(("loop parts", f"{setting}, median ms a step; loop period {split['loop period']:.1f} ms",
                 shares, "measured"))  # fmt: skip


def requeue(runs: Path, plan: Plan) -> None:
    """A resumed segment's time to its first step with the compilation cache warm and off
    (`bench_requeue.segment`), at the step section's first preset and largest batch, in bfloat16."""
    from bench_requeue import STOP, segment

    from birdjepa.train import compile_cache

    preset, batch = plan.step_presets[0], plan.step_batches[-1]
    there = runs / "requeue"
    # The folder the step section's compiles went to (a JAX_COMPILATION_CACHE_DIR of the user's, if
    # set), or with the cache off in this process one of the section's own.
    used = compile_cache.cache_dir() or os.environ.get("JAX_COMPILATION_CACHE_DIR") or there / "cache"
    cache = str(used)
    extra, steps = ("--model.dtype", "bfloat16"), plan.wait_steps  # the step section's program
    segment(there, "warm", preset, batch, cache, "--stop-at-step", str(STOP), *extra, steps=steps)
    shutil.copytree(there / "warm", there / "off")
    off = segment(there, "off", preset, batch, "off", *extra, steps=steps)
    warm = segment(there, "warm", preset, batch, cache, *extra, steps=steps)
    ratio = warm.seconds / off.seconds
    ROWS.append(("requeue", f"{preset} bf16 batch {batch}, resumed at step {STOP + 1}, time to first step",
                 f"cache warm {warm.seconds:.1f} s, off {off.seconds:.1f} s: {ratio:.2f}x; programs compiled "
                 f"when warm: {warm.compiled}", "measured"))  # fmt: skip


def step_child(preset: str, batch: int, steps: int, record: bool, compile_only: bool = False) -> None:
    """In a process of its own: the loop's step at ``preset`` in bfloat16 on one batch (or, not
    ``record``, that step without its record), ``steps`` times; prints its median time after two and a
    digest of the parameters after the last, as one JSON line.
    ``compile_only``: compiles the step into the compilation cache and prints the seconds it took, its
    XLA memory plan and the copies XLA adds of its state (`step_cost.compile_step`)."""
    import hashlib

    import numpy as np

    from birdjepa import multihost
    from birdjepa.perf.step_cost import bench_config, compile_step, first_step, unrecorded
    from birdjepa.train.compile_cache import cache_loads

    # The step section's program, as the loop first calls it.
    cfg = bench_config(preset, "bfloat16", batch, steps=steps)
    if compile_only:
        print("STEP_CHILD " + json.dumps(compile_step(cfg, record)), flush=True)
        return
    fns, state, x = first_step(cfg)
    step = fns.train_step if record else unrecorded(fns)
    carried, times, loads = [state.params, state.opt_state], [], cache_loads()
    for _ in range(steps):
        t0 = time.perf_counter()
        carried[0], carried[1], *_ = step(*carried, x.batch, x.key, False)
        jax.block_until_ready(carried[0])
        times.append(time.perf_counter() - t0)
    loaded = cache_loads() > loads  # the step came from the compilation cache (the prebuild's)
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(multihost.host(carried[0])):
        digest.update(np.ascontiguousarray(leaf).tobytes())
    ms = 1e3 * statistics.median(times[2:])
    measured = {"ms": ms, "params": digest.hexdigest()[:16], "loaded": loaded}
    print("STEP_CHILD " + json.dumps(measured), flush=True)


def conds(plan: Plan) -> None:
    """The small step at the largest batch as the loop runs it, and without its record, each in a process
    of its own: the time of each and whether the parameters after the same steps are equal. Then the
    loop's step compiled with XLA's other copy insertion (`other_copy_insertion`), the same way: whether
    the harness could switch to it without moving a bit, and what it saves of the step's time."""
    preset, batch = plan.step_presets[0], plan.step_batches[-1]
    sides = {"record": dict(os.environ), "unrecorded": dict(os.environ),
             OTHER_COPIES: other_copy_insertion(dict(os.environ), plan.on_gpu)}  # fmt: skip
    results = []
    for side, env in sides.items():
        record = "unrecorded" if side == "unrecorded" else "record"
        cmd = [sys.executable, __file__, "--step-child", preset, str(batch), str(plan.wait_steps), record]
        done = child(cmd, env, 900)
        lines = [x for x in done.stdout.splitlines() if x.startswith("STEP_CHILD ")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the {side} step: exit {done.returncode}\n{done.stderr[-2000:]}")
        results.append(json.loads(lines[-1].removeprefix("STEP_CHILD ")))
    default, plain, other = results

    def beside(r: dict) -> str:
        same = "equal" if r["params"] == default["params"] else "DIFFER"
        return f"{r['ms']:.1f} ms ({r['ms'] / default['ms']:.2f}x, parameters after {same})"

    setting = f"{preset} bf16 batch {batch}, {plan.wait_steps} steps: the loop's step; without the record"
    loaded = prebuilt_or_not([r["loaded"] for r in results])
    result = f"{default['ms']:.1f} ms a step; {beside(plain)}{loaded}"
    ROWS.append(("conds", setting, result, "measured"))
    setting = (f"{preset} bf16 batch {batch}, {plan.wait_steps} steps: the loop's step as the harness "
               f"compiles it; with the other copy insertion")  # fmt: skip
    ROWS.append(("in place steps", setting, f"{default['ms']:.1f} ms a step; {beside(other)}", "measured"))


def prebuilt_or_not(loaded: list[bool]) -> str:
    """After a prebuild, whether each of a section's processes loaded its step (else it compiled one the
    prebuild did not: time the device spent twice); nothing without a prebuild."""
    if not PREBUILT:
        return ""
    return "; every step loaded from the prebuild" if all(loaded) else f"; NOT ALL LOADED: {loaded}"


def prebuild_jobs(
    plan: Plan, chosen: list[str], args: argparse.Namespace
) -> dict[str, tuple[list[str], dict]]:
    """Every program the chosen sections time, as a process that compiles it into the compilation cache
    and exits: ``{name: (command, environment)}``."""
    preset, batch = plan.step_presets[0], plan.step_batches[-1]
    child = [sys.executable, __file__, "--compile-only", "--step-child"]

    def ours(preset: str, batch: int, record: str = "record") -> tuple[list[str], dict]:
        return [*child, preset, str(batch), str(plan.wait_steps), record], dict(os.environ)

    jobs = {}
    if "step" in chosen:
        jobs |= {f"{p} batch {b}": ours(p, b) for p in plan.step_presets for b in plan.step_batches}
    if "conds" in chosen:
        jobs[f"{preset} batch {batch}"] = ours(preset, batch)
        jobs[f"{preset} batch {batch}, without the record"] = ours(preset, batch, "unrecorded")
    if "step" in chosen or "conds" in chosen:  # the step section's plans and the conds section's run
        cmd, env = ours(preset, batch)
        jobs[f"{preset} batch {batch}, {OTHER_COPIES}"] = cmd, other_copy_insertion(env, plan.on_gpu)
    if "reference" in chosen and args.reference is not None:
        python = reference_env(args.reference_venv)
        for p in plan.step_presets:
            sides = processes(p, default_batch(p), args.reference, python, plan.repeats,
                              cache=plan.reference_cache, compile_only=True)  # fmt: skip
            jobs |= {f"{name} at {p} (float32)": job for name, job in sides.items()}
    return jobs


def other_copy_insertion(env: dict[str, str], on_gpu: bool) -> dict[str, str]:
    """``env`` with XLA's other copy insertion: on a CPU the default one, where the harness sets the
    region-based one (`birdjepa.train.determinism.IN_PLACE`, with which XLA copies none of the donated
    state); on a GPU the region-based one, which no GPU has compiled the step with yet. Compiled only,
    in the prebuild: the step section's "in place" row compares its plan and copies."""
    flags = env.get("XLA_FLAGS", "")
    if on_gpu:
        flags += " --xla_gpu_copy_insertion_use_region_analysis=true"
    else:
        flags = flags.replace(IN_PLACE, IN_PLACE.replace("=true", "=false"))
    return {**env, "XLA_FLAGS": flags.strip()}


def prebuild(jobs: dict[str, tuple[list[str], dict]], at_once: int) -> None:
    """Compile ``jobs``' programs side by side, ``at_once`` processes at a time, into the compilation
    caches the sections then load them from: each section's timed process then runs alone, its compile
    (tens of seconds each on a GPU, where XLA also autotunes) done. A kernel that XLA autotuned while
    other processes compiled may have been timed against their work: the steps' times are then an
    upper bound."""

    def run(item: tuple[str, tuple[list[str], dict]]) -> tuple[str, dict[str, float]]:
        name, (cmd, env) = item
        done = child(cmd, env, 900)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: exit {done.returncode}\n{done.stderr[-1500:]}")
        return name, json.loads(done.stdout.strip().splitlines()[-1].removeprefix("STEP_CHILD "))

    if not jobs:  # the chosen sections time nothing
        return
    t0 = time.monotonic()
    with ThreadPoolExecutor(at_once) as pool:
        PREBUILT.update(pool.map(run, jobs.items()))
    each = ", ".join(f"{name} {PREBUILT[name]['compile_s']:.0f} s" for name in jobs)
    ROWS.append(("prebuild", f"{len(jobs)} programs, {at_once} processes at a time",
                 f"{time.monotonic() - t0:.0f} s; compiling each: {each}", "measured"))  # fmt: skip


def reference(plan: Plan, args: argparse.Namespace) -> None:
    """Our LeJEPA step beside the reference implementation's at the step section's presets, in float32
    (the reference has no bfloat16), as `scripts/bench_reference.py` measures them: the same
    architecture, batch and views, each side in a process of its own (its doc says what differs)."""
    if args.reference is None:
        raise RuntimeError("--sections reference needs --reference DIR, a checkout of samuelstevens/birdjepa")
    python = reference_env(args.reference_venv)
    for preset in plan.step_presets:
        batch = default_batch(preset)
        sides = measure_preset(
            preset, batch, args.reference, python, plan.repeats, cache=plan.reference_cache
        )
        theirs = sides["reference"]
        result = "; ".join(
            f"{name} {1e3 * r['step_s']:.1f} ms ({r['step_s'] / theirs['step_s']:.2f}x), XLA plan "
            f"{r['plan_bytes'] / 2**30:.2f} GiB ({r['plan_bytes'] / theirs['plan_bytes']:.2f}x), peak "
            f"{r['peak_bytes'] / 2**30:.2f} GiB ({r['peak_bytes'] / theirs['peak_bytes']:.2f}x)"
            for name, r in sides.items()
        )
        result += prebuilt_or_not([r["loaded"] for r in sides.values()])
        ROWS.append(
            ("reference", f"{preset} float32 batch {batch}, 2 views, 256 patches", result, "measured")
        )


class Plan:
    """What each section runs. On an H200 (2026-11-27) a cold compile of the small step at batch 128
    took 58 s and a load from the compilation cache 7 s; verify-resume at small (four processes, each
    compiling cold) took 318 s. Hence the resume checks at tiny (--resume-preset small for more) and
    one batch size for the step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.on_gpu = jax.devices()[0].platform == "gpu"
        quick = args.quick
        self.resume_preset = args.resume_preset or "tiny"
        self.resume_batch = 4 if quick else 16
        # --quick (the suite's run on a CPU, lest it rot) resumes once: the same code, a process less.
        self.resume_steps, self.resume_at = (4, (2,)) if quick else (9, (3, 6))
        self.step_presets = ["tiny"] if quick else ["small", "base"]
        self.step_batches = [4] if quick else [128]
        self.repeats = 3 if quick else 10
        self.loader_batches = 4 if quick else 20
        self.wait_steps = 6 if quick else 30
        """Also the LR schedule's length of the timed steps: the data-wait run then loads the step
        that the step section compiled from the cache instead of compiling its own."""
        self.reference_cache: Path | None = None
        """The reference's JAX compilation cache (ours keeps its own: `birdjepa.train.compile_cache`)."""


#: Every section, in the order they run. ``requeue`` and ``conds`` are left out by default: on a GPU
#: each compiles the small step cold once more (58 s on an H200), past the 8 minutes the others take;
#: ``reference`` needs the reference's checkout (``--reference``).
SECTIONS = ("resume", "noise", "step", "reference", "conds", "loader", "requeue", "resume-cached")
DEFAULT_SECTIONS = ("resume", "noise", "step", "loader", "resume-cached")


def section(
    name: str, run: Callable[[], None], started: float, budget: float, save: Callable[[], None]
) -> bool:
    """Runs one section unless past the budget; False if it raised (its traceback is printed). Its rows
    are printed and ``save``d as soon as it ends: a command killed later (a device's time limit) has
    still printed and written every section that finished."""
    if time.monotonic() - started > budget:
        ROWS.append((name, "", f"not started: past --budget-s {budget:.0f}", "skipped"))
        return True
    t0, before = time.monotonic(), len(ROWS)
    print(f"\n== {name}", flush=True)
    try:
        run()
    except Exception as e:  # report it and go on: one broken section must not hide the others
        traceback.print_exc()
        ROWS.append((name, "", f"{type(e).__name__}: {str(e)[:200]}", "ERROR"))
        return False
    finally:
        for r in ROWS[before:]:
            print("| " + " | ".join(r) + " |", flush=True)
        print(f"== {name}: {time.monotonic() - t0:.0f} s", flush=True)
        save()
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the tiny preset, a few steps (a CPU smoke run)")
    ap.add_argument("--budget-s", type=float, default=420, help="start no section after this many seconds")
    ap.add_argument("--resume-preset", help="the resume checks' model (default: tiny)")
    ap.add_argument(
        "--runs",
        type=Path,
        help="keep the runs in this new or empty folder (default: a temporary one)",
    )
    ap.add_argument("--json", type=Path, help="also write the table here")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=DEFAULT_SECTIONS,
                    help=f"which to run, in this order (default: {' '.join(DEFAULT_SECTIONS)})")  # fmt: skip
    ap.add_argument("--prebuild", action=argparse.BooleanOptionalAction,
                    help="first compile every program the step, reference and conds sections time, side by "
                         "side (default: on a GPU)")  # fmt: skip
    ap.add_argument(
        "--reference", type=Path, help="the reference section's checkout of samuelstevens/birdjepa"
    )
    ap.add_argument("--reference-venv", type=Path, default=Path(".reference-venv"),
                    help="its environment (scripts/bench_reference.py --venv)")  # fmt: skip
    ap.add_argument("--step-child", nargs=4, metavar=("PRESET", "BATCH", "STEPS", "RECORD"),
                    help=argparse.SUPPRESS)  # fmt: skip
    ap.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.step_child:  # the conds and prebuild sections' processes
        preset, batch, n, record = args.step_child  # (not `steps`: the step section's function)
        step_child(preset, int(batch), int(n), record == "record", args.compile_only)
        return 0
    if "noise" in args.sections and "resume" not in args.sections:
        ap.error("--sections noise traces a step of the run that the resume section trains")
    if args.runs is not None and args.runs.exists() and (args.runs.is_file() or any(args.runs.iterdir())):
        # Its runs would resume the last check's (a finished one exits 1: "nothing to do"), and its
        # tables would mix two checks' rows: on a device's time limit, a wasted call.
        ap.error(f"--runs {args.runs} is not an empty folder: give a new one (or none: a temporary one)")
    started = time.monotonic()
    device = jax.devices()[0]
    plan = Plan(args)
    print(f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, {device.platform}: {device.device_kind} "
          f"x{jax.device_count()}, {schedulable_cpus()} of the machine's {os.cpu_count()} cores, "
          f"python {sys.version.split()[0]}\n"
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}, host memory kept for reuse: {HOST_MEMORY_KEPT}",
          flush=True)  # fmt: skip
    consumed: dict[str, float] = {}

    def save(complete: bool = False) -> None:  # after every section: a killed check keeps what it measured
        if args.json:
            table = {"device": device.device_kind, "jax": jax.__version__, "complete": complete, "rows": ROWS}
            part = args.json.with_name(args.json.name + ".part")
            part.write_text(json.dumps(table))
            part.replace(args.json)  # whole or not at all, even if the command is killed as it writes

    with CHILDREN.handling(), tempfile.TemporaryDirectory() as tmp:  # a SIGTERM: children stopped, tmp gone
        runs = args.runs or Path(tmp)
        plan.reference_cache = runs / "reference-xla"
        run: dict[str, Callable[[], None]] = {
            "resume": lambda: resume(runs, plan, "off"),
            "noise": lambda: noise_floor(runs, plan),
            "step": lambda: steps(plan, consumed),
            "reference": lambda: reference(plan, args),
            "loader": lambda: loader(runs, plan, consumed),
            "requeue": lambda: requeue(runs, plan),
            "conds": lambda: conds(plan),
            "resume-cached": lambda: resume(runs, plan, str(runs / "compile-cache")),
        }
        chosen = [name for name in SECTIONS if name in args.sections]  # the order above
        ran = []
        if plan.on_gpu if args.prebuild is None else args.prebuild:
            ensure_demo_data()  # here, before processes that would each build it on a fresh machine
            at_once = max(2, schedulable_cpus() // 2)
            ran.append(section("prebuild", lambda: prebuild(prebuild_jobs(plan, chosen, args), at_once),
                               started, args.budget_s, save))  # fmt: skip
        ran += [section(name, run[name], started, args.budget_s, save) for name in chosen]
    widths = [max(len(r[i]) for r in [("check", "setting", "result", "verdict"), *ROWS]) for i in range(4)]
    print(f"\n## gpu_check: {device.device_kind}, jax {jax.__version__}, {time.monotonic() - started:.0f} s")
    for row in [("check", "setting", "result", "verdict"), tuple("-" * w for w in widths), *ROWS]:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")
    save(complete=True)
    if any(r[3] == "FAIL" for r in ROWS):
        return 1
    return 0 if all(ran) else 2


if __name__ == "__main__":
    sys.exit(main())
