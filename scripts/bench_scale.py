"""The loader at the scale users train on, every figure measured side by side in this one run.

    birdjepa demo-data /data/scale --recordings 100000 --shards 500      # once: ~14 GB
    python scripts/bench_scale.py --data /data/scale [--coverage]

Compares the scale set (DIR/train) with the 448-recording demo set, each loader in a fresh process
(so memory is the loader's own):

1. open: constructing a loader, cold (no shard index cached: every shard's footer is read) and warm;
2. memory and state at shuffle buffers of 1k, 10k and 100k samples (batch 256, 2 workers, after 8
   batches): resident memory (anonymous: the loader's own; file-backed: mapped shard pages the kernel
   may drop), the `state()` size in bytes, the time to take it and to open a loader from it, and the
   time from that restore to its first batch against a cold start's;
3. steady throughput with 1 and 2 workers;
4. `--coverage`: one full epoch of the scale set through the real loader (2 workers), every index
   exactly once (minutes);
5. the IID gap: shard lag-1 autocorrelation, shard chi-squared and window_unique of the loader's
   index stream (its own planner, `birdjepa.data.plan_indices`, over the scale set's shard sizes)
   against simulated IID batches, at batch 256 and 1024, for today's defaults, the previous ones and
   a grid of interleave x shuffle_buffer. A setting passes when its mean shard lag-1 is within 0.05 of
   IID's and its mean shard chi-squared within 2x the 95th percentile of IID's.

Run as root, it drops the page cache of the whole machine (``/proc/sys/vm/drop_caches``, after a
``sync``) before each cold open, so every other process on it rereads its files from the disk.
"""

# ruff: noqa: E402  (the BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa.data import DEFAULTS, Loader, plan_indices, resolve_files, take
from birdjepa.diagnostics.iid import IidMonitor, iid_null, shard_of
from birdjepa.synthetic.demo import ensure_demo_data

BATCH = 256
BUFFERS = (1_000, 10_000, 100_000)
WINDOW, STEPS = 100, 200
REFERENCE = "reference loader (seed 001, Idea 6)"
PREVIOUS = {"interleave": 4, "shuffle_buffer": 1024}
"""The defaults before this benchmark (issue 16)."""


# ---------------------------------------------------------------- one loader in its own process


def memory() -> dict[str, float]:
    """Resident MiB of this process: total, anonymous, file-backed, and the peak."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out


def probe(files: list[str], options: dict[str, Any], batches: int) -> dict[str, Any]:
    """Open, first batch, `batches` more; memory, state size and timings; then restore from that state."""
    t0 = time.perf_counter()
    loader = Loader(files, **options)
    t1 = time.perf_counter()
    take(loader, 1)
    t2 = time.perf_counter()
    take(loader, batches)
    t3 = time.perf_counter()
    mem = memory()
    state = loader.state()
    t4 = time.perf_counter()
    state_bytes = len(json.dumps(state))
    loader.close()
    t5 = time.perf_counter()
    restored = Loader(files, **options, state=state)
    t6 = time.perf_counter()
    take(restored, 1)
    t7 = time.perf_counter()
    return {
        "open_s": t1 - t0, "first_s": t2 - t0, "rate": batches * options["batch_size"] / (t3 - t2),
        "mem": mem, "state_bytes": state_bytes, "state_ms": (t4 - t3) * 1e3,
        "restore_open_s": t6 - t5, "restore_first_s": t7 - t5,
    }  # fmt: skip


def in_process(files: list[str], options: dict[str, Any], batches: int, env: dict | None = None) -> dict:
    """`probe` in a fresh Python process (its memory is the loader's alone)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_scale as b; "
        "a = json.loads(sys.argv[2]); print(json.dumps(b.probe(a['files'], a['options'], a['batches'])))"
    )
    arg = json.dumps({"files": files, "options": options, "batches": batches})
    here = str(Path(__file__).resolve().parent)
    done = subprocess.run([sys.executable, "-c", code, here, arg], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def drop_indexes(files: list[str]) -> None:
    """Forget every cached shard index beside the shards (the user cache is a fresh folder per call)."""
    for f in files:
        p = Path(f)
        p.with_name(f".{p.name}.bjindex.json").unlink(missing_ok=True)


def drop_page_cache() -> bool:
    """Empty the kernel's page cache (root on Linux), so a cold open reads from the disk."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def open_seconds(files: list[str], cold: bool) -> float:
    code = (
        "import sys, time; from birdjepa.data import Loader; t = time.perf_counter(); "
        "Loader(sys.argv[1:], seed=0, batch_size=4, n_workers=1); print(time.perf_counter() - t)"
    )
    with tempfile.TemporaryDirectory() as cache:
        if cold:
            drop_indexes(files)
            drop_page_cache()
        env = {**os.environ, "BIRDJEPA_CACHE": cache}
        done = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return float(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- the IID gap


def stream_stats(batches: list[np.ndarray], sizes: list[int]) -> dict[str, float]:
    """Means over the measured steps (after a full window) of the three statistics."""
    mon = IidMonitor(sum(sizes), sizes, WINDOW, normalise=False)
    rows = [mon.update(b, shard_of(b, sizes)) for b in batches][WINDOW:]
    keys = ("shard_lag1", "shard_chi2", "window_unique", "window_unique_iid_expected")
    return {k: float(np.mean([r["dataloader/" + k] for r in rows])) for k in keys}


def iid_gap(sizes: list[int], batch: int, settings: dict[str, dict[str, Any]]) -> list[tuple]:
    n = sum(sizes)
    rng = np.random.default_rng(0)
    iid = stream_stats([rng.integers(0, n, batch) for _ in range(WINDOW + STEPS)], sizes)
    chi2_p95 = iid_null(n, batch, sizes, WINDOW)["dataloader/shard_chi2"]
    rows = [("IID (simulated)", iid["shard_lag1"], iid["shard_chi2"], iid["window_unique"], "-", "")]
    for name, opts in settings.items():
        t = time.perf_counter()
        index, _ = plan_indices(sizes, (WINDOW + STEPS) * batch, seed=0, batch_size=batch, **opts)
        st = stream_stats(list(index.reshape(WINDOW + STEPS, batch)), sizes)
        ok = abs(st["shard_lag1"] - iid["shard_lag1"]) <= 0.05 and st["shard_chi2"] <= 2 * chi2_p95
        rows.append((name, st["shard_lag1"], st["shard_chi2"], st["window_unique"],
                     f"{time.perf_counter() - t:.2f}", "pass" if ok else "miss"))  # fmt: skip
    return rows + [(f"IID chi2 p95: {chi2_p95:.0f}", None, None, None, "", "")]


# ---------------------------------------------------------------- main


def fmt_mib(x: float) -> str:
    return f"{x:8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True, help="a scale set (its train/ split is read)")
    ap.add_argument("--demo", type=Path, default=None, help="the small demo set (default: the cached one)")
    ap.add_argument(
        "--batches",
        type=int,
        default=8,
        help="batches taken before memory and state are read (default: %(default)s)",
    )
    ap.add_argument("--coverage", action="store_true", help="also stream one full epoch (minutes)")
    args = ap.parse_args()

    sets = {
        "demo": resolve_files((args.demo or ensure_demo_data()) / "train"),
        "scale": resolve_files(args.data / "train"),
    }
    sizes = {
        name: Loader(files, seed=0, batch_size=1, n_workers=1).shard_sizes for name, files in sets.items()
    }
    for name, files in sets.items():
        n_bytes = sum(Path(f).stat().st_size for f in files)
        print(f"{name}: {sum(sizes[name])} recordings in {len(files)} shards, {n_bytes / 2**30:.2f} GiB")
    print(f"defaults: interleave {DEFAULTS['interleave']}, shuffle_buffer {DEFAULTS['shuffle_buffer']}")

    dropped = drop_page_cache()
    print(f"\n## Open (constructing a loader; cold: no cached shard index, page cache "
          f"{'dropped' if dropped else 'NOT dropped (not root)'})\n")  # fmt: skip
    print("| set | shards | cold s | warm s | cold/warm |\n|---|---:|---:|---:|---:|")
    for name, files in sets.items():
        cold = open_seconds(files, cold=True)
        warm = min(open_seconds(files, cold=False) for _ in range(3))
        print(f"| {name} | {len(files)} | {cold:.3f} | {warm:.3f} | {cold / warm:.1f} |")

    print(f"\n## Memory, state and restore (batch {BATCH}, 2 workers, after {args.batches} batches)\n")
    print("| set | buffer | RSS MiB | anon MiB | file MiB | peak MiB | state bytes | state ms "
          "| restore open s | restore->batch s | cold->batch s | restore/cold |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, files in sets.items():
        for buffer in BUFFERS:
            opts = {"seed": 0, "batch_size": BATCH, "n_workers": 2, "shuffle_buffer": buffer}
            r = in_process(files, opts, args.batches)
            m = r["mem"]
            print(f"| {name} | {buffer} | {fmt_mib(m['VmRSS'])} | {fmt_mib(m['RssAnon'])} | "
                  f"{fmt_mib(m['RssFile'])} | {fmt_mib(m['VmHWM'])} | {r['state_bytes']} | "
                  f"{r['state_ms']:.1f} | {r['restore_open_s']:.3f} | {r['restore_first_s']:.2f} | "
                  f"{r['first_s']:.2f} | "
                  f"{r['restore_first_s'] / r['first_s']:.2f} |")  # fmt: skip

    print("\n## Throughput (batch 64, defaults otherwise; clips/s over 30 batches after the first)\n")
    print("| set | setting | 1 worker | 2 workers | 2w/1w |\n|---|---|---:|---:|---:|")
    variants = {"defaults": {}, "previous defaults": PREVIOUS}
    for name, files in sets.items():
        for label, extra in variants.items():
            one, two = (in_process(files, {"seed": 0, "batch_size": 64, "n_workers": w, **extra}, 30)["rate"]
                        for w in (1, 2))  # fmt: skip
            print(f"| {name} | {label} | {one:.1f} | {two:.1f} | {two / one:.2f} |")

    current = {"interleave": DEFAULTS["interleave"], "shuffle_buffer": DEFAULTS["shuffle_buffer"]}
    settings = {f"defaults {current}": current, f"previous defaults {PREVIOUS}": PREVIOUS}
    for inter in (1, 4, 16, 64, 256, None):
        for buffer in (1024, 4096, 10_000, 100_000):
            settings[f"interleave {inter or 'all'}, buffer {buffer}"] = {
                "interleave": inter,
                "shuffle_buffer": buffer,
            }
    for batch in (256, 1024):
        print(f"\n## IID gap, batch {batch}, scale set shard sizes ({len(sizes['scale'])} shards), "
              f"means over {STEPS} steps after a {WINDOW}-step window\n")  # fmt: skip
        print("| setting | shard lag-1 | shard chi2 | window_unique | s | vs IID |")
        print("|---|---:|---:|---:|---:|---|")
        for name, lag, chi2, wu, secs, verdict in iid_gap(sizes["scale"], batch, settings):
            if lag is None:
                print(f"| {name} | | | | | |")
            else:
                print(f"| {name} | {lag:.3f} | {chi2:.0f} | {wu:.0f} | {secs} | {verdict} |")
        if batch == 256:
            print(f"| {REFERENCE} | 0.80 | ~67k (IID ~884) | | | miss |")

    if args.coverage:
        files = sets["scale"]
        n = sum(sizes["scale"])
        print(f"\n## Coverage: one epoch of {n} recordings through the loader (batch {BATCH}, 2 workers)\n")
        loader = Loader(files, seed=0, batch_size=BATCH, n_workers=2)
        seen = np.zeros(n, np.int64)
        t0 = time.perf_counter()
        drawn = 0
        while seen.sum() < n:  # epoch-0 samples keep coming until the buffer has given them all
            b = next(loader)
            seen += np.bincount(b["index"][b["epoch"] == 0], minlength=n)
            drawn += len(b["index"])
        dt = time.perf_counter() - t0
        print(f"epoch 0 complete after {drawn} samples in {dt:.0f} s ({drawn / dt:.0f} clips/s): "
              f"every index {'exactly once' if (seen == 1).all() else 'NOT exactly once'} "
              f"(min {seen.min()}, max {seen.max()})")  # fmt: skip


if __name__ == "__main__":
    main()
