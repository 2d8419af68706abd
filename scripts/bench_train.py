"""Trainer benchmark on this machine: every figure measured side by side in this one run.

    python scripts/bench_train.py [--presets tiny small] [--loader-batches 20]

Per model preset, through the real ``birdjepa pretrain`` command on the demo set:

* step time (median over the steady steps, compile steps left out) and the data-wait fraction (time
  the loop waited for the loader / step time, summed over the same steps);
* time from process start to the first step, fresh and resumed (a run stopped with ``--stop-at-step``
  and started again: imports, restore, the resume checks, compiling, one step);

and in this process, on the preset's real parameters and optimizer state (``birdjepa.rundir.checkpoint``):

* checkpoint save time, synchronous and asynchronous (until ``save`` returns, and until it is on disk),
  and restore time (read, verified against the recorded norms), median of ``--repeats``.

Alongside, the loader benchmark's clips/s (``scripts/bench_loader.py``'s ``loader_rate``, 1 and 2
workers) against the clips/s each preset's step consumes: a ratio above 1 means the loader keeps up.

Then the small and base presets computing in bfloat16 against float32 (``--model.dtype``): step time
and the process's peak resident memory, on this machine's devices (a GPU when there is one).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from birdjepa.config import PretrainConfig
from birdjepa.data import resolve_files
from birdjepa.model.config import preset
from birdjepa.model.vit import init_params
from birdjepa.rundir.checkpoint import Checkpointer
from birdjepa.rundir.metrics_log import read_metrics
from birdjepa.synthetic.demo import ensure_demo_data
from birdjepa.train.determinism import deterministic_xla
from birdjepa.train.optim import make_optimizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import loader_rate  # noqa: E402  (the loader benchmark's own measurement)

#: (steps, batch size) per preset: enough steady steps to take a median in a few minutes on 2 cores.
PLANS = {"tiny": (30, 16), "small": (8, 4)}
#: Steps of each process left out of the step-time median: they compile (train step, then the first
#: logged-norm and monitor paths).
WARMUP = 2


@dataclasses.dataclass
class TrainFigures:
    preset: str
    batch_size: int
    steps: int
    step_ms: float
    data_wait: float
    fresh_start_s: float
    resume_start_s: float
    restore_s: float


def pretrain(runs: Path, preset_name: str, steps: int, batch: int, *extra: str) -> float:
    """Runs one `birdjepa pretrain` process; returns the wall-clock time it was started at."""
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", preset_name, "--log.runs-dir",
           str(runs), "--steps", str(steps), "--model.preset", preset_name, "--data.batch-size",
           str(batch), "--eval-every", "0", "--ckpt-every", "1000000", "--log.print-every", "1000",
           *extra]  # fmt: skip
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"
        )
    return started


#: (steps, batch size) per preset for the bfloat16 against float32 comparison.
DTYPE_PLANS = {"small": (6, 4), "base": (5, 2)}
PEAK = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)"
)


def dtype_figures(runs: Path, name: str, dtype: str) -> tuple[float, float]:
    """(median steady ms/step, peak resident MiB of the process) of `birdjepa pretrain` computing in
    `dtype` (parameters and optimizer state float32 either way)."""
    steps, batch = DTYPE_PLANS[name]
    run = f"{name}-{dtype}"
    cmd = [sys.executable, "-c", PEAK, sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", run,
           "--log.runs-dir", str(runs), "--steps", str(steps), "--model.preset", name, "--model.dtype", dtype,
           "--data.batch-size", str(batch), "--eval-every", "0", "--ckpt-every", "1000000",
           "--log.print-every", "1000"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    peak_mib = int(done.stdout.strip().splitlines()[-1]) / 1024
    rows = [x for x in read_metrics(runs / run) if "event" not in x and "train/step_time" in x]
    return 1e3 * statistics.median(x["train/step_time"] for x in rows[WARMUP:]), peak_mib


def train_figures(runs: Path, name: str, steps: int, batch: int) -> TrainFigures:
    stop = steps // 2 - 1
    fresh_started = pretrain(runs, name, steps, batch, "--stop-at-step", str(stop))
    resume_started = pretrain(runs, name, steps, batch)
    lines = list(read_metrics(runs / name))
    rows = {x["step"]: x for x in lines if "event" not in x and "train/step_time" in x}
    (resume,) = [x for x in lines if x.get("event") == "resume"]
    # Steady steps: past the first WARMUP steps of each of the two processes.
    steady = [rows[s] for s in rows if WARMUP <= s <= stop or s >= stop + 1 + WARMUP]
    step_time = [x["train/step_time"] for x in steady]
    wait = sum(x["train/data_wait"] for x in steady) / sum(step_time)
    return TrainFigures(
        name, batch, steps, 1e3 * statistics.median(step_time), wait,
        rows[0]["time"] - fresh_started, rows[stop + 1]["time"] - resume_started,
        resume["time"] - resume_started,
    )  # fmt: skip


@dataclasses.dataclass
class CheckpointFigures:
    preset: str
    megabytes: float
    sync_s: float
    async_return_s: float
    async_total_s: float
    restore_s: float


def checkpoint_figures(name: str, repeats: int) -> CheckpointFigures:
    """Save and restore the preset's real train state (params + AdamW state) with the trainer's
    Checkpointer, as the loop does (device arrays in, verified state out)."""
    cfg = PretrainConfig()
    model_cfg = dataclasses.replace(preset(name), n_classes=16)
    params = init_params(model_cfg, jax.random.key(0))["params"]
    state = {"params": params, "opt_state": make_optimizer(cfg.optim, 1000).init(params)}
    nbytes = sum(np.asarray(x).nbytes for x in jax.tree.leaves(state))
    sync, ret, total, restore = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            with Checkpointer(Path(tmp) / f"sync{i}", keep=None, async_save=False) as ckpt:
                t0 = time.perf_counter()
                ckpt.save(0, state, {})
                ckpt.wait()
                sync.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ckpt.restore(0, state)
                restore.append(time.perf_counter() - t0)
            with Checkpointer(Path(tmp) / f"async{i}", keep=None, async_save=True) as ckpt:
                t0 = time.perf_counter()
                ckpt.save(0, state, {})
                ret.append(time.perf_counter() - t0)
                ckpt.wait()
                total.append(time.perf_counter() - t0)
    med = statistics.median
    return CheckpointFigures(name, nbytes / 2**20, med(sync), med(ret), med(total), med(restore))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=list(PLANS), choices=list(PLANS))
    ap.add_argument("--repeats", type=int, default=3, help="checkpoint save/restore repetitions")
    ap.add_argument("--loader-batches", type=int, default=20)
    ap.add_argument("--dtypes", action=argparse.BooleanOptionalAction, default=True,
                    help="also time small and base in bfloat16 against float32 (a few minutes)")  # fmt: skip
    args = ap.parse_args()
    deterministic_xla()
    demo = ensure_demo_data()
    print(f"jax {jax.__version__}, devices: {jax.devices()}")

    train = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.presets:
            steps, batch = PLANS[name]
            train.append(train_figures(Path(tmp), name, steps, batch))
    ckpts = [checkpoint_figures(name, args.repeats) for name in args.presets]
    files = resolve_files(str(demo / "train"))
    supply = {w: loader_rate(files, w, args.loader_batches, 16, n_views=2) for w in (1, 2)}

    base = train[0]
    print("\n## Train step (birdjepa pretrain, demo set, 2 views per clip)")
    head = ("preset", "batch", "ms/step", f"vs {base.preset}", "clips/s", "data wait", "loader 1w/need",
            "loader 2w/need")  # fmt: skip
    rows = []
    for t in train:
        need = t.batch_size / (t.step_ms / 1e3)
        rows.append((t.preset, t.batch_size, f"{t.step_ms:.1f}", f"{t.step_ms / base.step_ms:.2f}",
                     f"{need:.1f}", f"{100 * t.data_wait:.2f} %", f"{supply[1] / need:.1f}",
                     f"{supply[2] / need:.1f}"))  # fmt: skip
    table(head, rows)
    print(f"loader alone (bench_loader.loader_rate, batch 16, 2 views): {supply[1]:.1f} clips/s with "
          f"1 worker, {supply[2]:.1f} with 2")  # fmt: skip

    print("\n## Process start to first step (imports, data, restore + resume checks, compile, one step)")
    table(
        ("preset", "fresh s", "resumed s", "resumed/fresh", "restored at s"),
        [(t.preset, f"{t.fresh_start_s:.1f}", f"{t.resume_start_s:.1f}",
          f"{t.resume_start_s / t.fresh_start_s:.2f}", f"{t.restore_s:.1f}") for t in train],
    )  # fmt: skip

    print(f"\n## Checkpoint of params + AdamW state (birdjepa.rundir.checkpoint, median of {args.repeats})")
    table(
        ("preset", "MiB", "sync s", "async return s", "async total s", "return/sync", "restore s",
         "restore/sync"),
        [(c.preset, f"{c.megabytes:.1f}", f"{c.sync_s:.3f}", f"{c.async_return_s:.3f}",
          f"{c.async_total_s:.3f}", f"{c.async_return_s / c.sync_s:.2f}", f"{c.restore_s:.3f}",
          f"{c.restore_s / c.sync_s:.2f}") for c in ckpts],
    )  # fmt: skip
    dtypes = {}
    if args.dtypes:
        with tempfile.TemporaryDirectory() as tmp:
            for name in DTYPE_PLANS:  # interleaved, so drift on a shared machine hits both alike
                for dtype in ("float32", "bfloat16"):
                    dtypes[name, dtype] = dtype_figures(Path(tmp), name, dtype)
        print("\n## bfloat16 compute against float32 (master weights and AdamW state float32 in both)")
        rows = []
        for name, (_, batch) in DTYPE_PLANS.items():
            (f_ms, f_mib), (b_ms, b_mib) = dtypes[name, "float32"], dtypes[name, "bfloat16"]
            rows.append((name, batch, f"{f_ms:.0f}", f"{b_ms:.0f}", f"{b_ms / f_ms:.2f}", f"{f_mib:.0f}",
                         f"{b_mib:.0f}", f"{b_mib / f_mib:.2f}"))  # fmt: skip
        table(("preset", "batch", "f32 ms/step", "bf16 ms/step", "bf16/f32", "f32 peak MiB", "bf16 peak MiB",
               "bf16/f32 peak"), rows)  # fmt: skip
    figures = {
        "dtypes": {f"{k[0]}/{k[1]}": v for k, v in dtypes.items()},
        "train": [dataclasses.asdict(t) for t in train],
        "checkpoint": [dataclasses.asdict(c) for c in ckpts],
        "loader_clips_per_s": supply,
    }
    print("\n" + json.dumps(figures))


def table(head: tuple[str, ...], rows: list[tuple]) -> None:
    """A markdown table (pastes into docs/benchmarks.md as it is)."""
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")


if __name__ == "__main__":
    main()
