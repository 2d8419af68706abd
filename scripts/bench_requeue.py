"""A requeued segment's start, with the persistent compilation cache and without it, side by side.

    python scripts/bench_requeue.py [--presets small base] [--repeats 1]

Per preset, through the real ``birdjepa pretrain`` command on the demo set: a first segment trains
and stops (``--stop-at-step``), filling a fresh compilation cache; then the same checkpoint is resumed
from a fresh copy of the run each time, in new processes: with the cache (``BIRDJEPA_COMPILE_CACHE``
set to it: the requeue as users get it) and with it off (every segment compiling its step, as
before), ``--repeats`` times each, alternating, then the medians: on a virtual machine one start's
page faults can cost seconds more than the next one's. The time to first step is from the process's
start to the first resumed step's logged time: imports, restore, the resume checks, compiling or
loading the step, one step. The target (issue 48): with the cache, at most 0.5x without. Beside it,
the programs a warm resume compiled instead of loading them (JAX's log): none where the cache keeps
every program.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from birdjepa.perf.step_cost import CPU_BATCH as BATCH  # the step's own time stays small beside the start
from birdjepa.rundir.metrics_log import read_metrics
from birdjepa.train import compile_cache

STOP = 1


class Start(NamedTuple):
    seconds: float
    """From the process's start to the first step it trained."""
    compiled: int
    """Programs the process compiled rather than loaded from the cache (JAX's log of each)."""


def segment(
    runs: Path, run: str, preset: str, batch: int, cache: str, *extra: str, steps: int = STOP + 2
) -> Start:
    """Runs one `birdjepa pretrain` process of ``run`` (a run of ``steps``, ``batch`` clips a step, the
    compilation cache ``cache``: a folder or "off"), with the command's own JAX settings."""
    env = compile_cache.without_jax_settings(os.environ)
    env.update(BIRDJEPA_COMPILE_CACHE=cache, JAX_LOG_COMPILES="1")
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", run, "--log.runs-dir", str(runs),
           "--steps", str(steps), "--model.preset", preset, "--data.batch-size", str(batch),
           "--eval-every", "0", "--ckpt-every", "1000000", *extra]  # fmt: skip
    before = (
        {x["step"] for x in read_metrics(runs / run) if "event" not in x} if (runs / run).exists() else set()
    )
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    rows = [x for x in read_metrics(runs / run) if "event" not in x and "train/loss" in x]
    first = min((x for x in rows if x["step"] not in before), key=lambda x: x["step"])
    return Start(first["time"] - started, compile_cache.compiled_not_loaded(done.stderr))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["small", "base"], choices=list(BATCH))
    ap.add_argument("--repeats", type=int, default=1, help="resumes of each kind, alternating; then medians")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            runs, cache = Path(tmp) / preset, str(Path(tmp) / f"cache-{preset}")
            batch = BATCH[preset]
            first = segment(runs, "first", preset, batch, cache, "--stop-at-step", str(STOP))
            times: dict[str, list[Start]] = {"off": [], "warm": []}
            for i in range(args.repeats):  # alternating: the machine's drift falls on both alike
                for kind, folder in (("off", "off"), ("warm", cache)):
                    shutil.copytree(runs / "first", runs / f"{kind}-{i}")
                    times[kind].append(segment(runs, f"{kind}-{i}", preset, batch, folder))
                    shutil.rmtree(runs / f"{kind}-{i}")  # a checkpoint of base is 1 GB
            rows.append((preset, batch, first, times))
            print(f"measured {preset}", file=sys.stderr, flush=True)
    print("\n## A requeued segment's time to first step (birdjepa pretrain, demo set)\n")
    print("| preset | batch | first segment (cache cold) s | resumed, cache off s | resumed, cache warm s | "
          "warm / off | programs the warm one compiled |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for preset, batch, first, times in rows:
        for off, warm in zip(times["off"], times["warm"], strict=True):
            print(f"| {preset} | {batch} | {first.seconds:.1f} | {off.seconds:.1f} | {warm.seconds:.1f} | "
                  f"{warm.seconds / off.seconds:.2f} | {warm.compiled} |")  # fmt: skip
        if args.repeats > 1:
            off_s, warm_s = (statistics.median(s.seconds for s in times[k]) for k in ("off", "warm"))
            median = f"{preset}, median of {args.repeats}"
            print(f"| {median} | {batch} | | {off_s:.1f} | {warm_s:.1f} | {warm_s / off_s:.2f} | |")


if __name__ == "__main__":
    main()
