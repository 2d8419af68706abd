"""Our LeJEPA step beside the reference implementation's (samuelstevens/birdjepa), one run, one machine.

    python scripts/bench_reference.py --reference PATH [--presets small base] [--batch N]

PATH is a checkout of https://github.com/samuelstevens/birdjepa (measured at ea03107). Its step runs
in a scratch environment of its own, ``--venv`` (made on first use with pip: the JAX and optax
versions this process runs, Equinox and the reference's other imports), through
``scripts/reference_step.py``: both projects are called ``birdjepa``, so the two never share a
process. Each side runs in a process of its own, one after the other, with the same XLA flags
(birdjepa's deterministic ones) and the same devices, and the same host memory: by default the C
library's; with ``--host-memory reuse`` both keep freed memory for reuse, as the `birdjepa` command
keeps its own (`birdjepa.host_memory`; glibc's tunables in each side's environment,
`host_memory.TUNABLES`). On a CPU that decides the comparison at batch 16: XLA takes a step's working
memory from ``malloc`` anew in every execution, and each fresh page faults (docs/benchmarks.md). An
accelerator's working memory is the device's, which neither touches.

The same architecture, batch, views and dtype: a ViT of the preset's width, depth and heads on 512 x
128 log-mel views cut into 16 x 16 patches (256 tokens; ``--model.patch-freq 16`` on our side), 2 views
a clip, the LeJEPA projector of 2 hidden 2048-wide layers to 16 dimensions, SIGReg on 256 directions
and 17 knots, an online linear probe, AdamW after global-norm clipping, float32 (the reference has no
bfloat16). What differs, by design of each:

* the reference adds a CLS token (257 tokens) and pools it; ours mean-pools the patch tokens;
* the reference recomputes each block's activations in the backward pass (``grad_ckpt``, its
  default) and scans over blocks; ours keeps them and unrolls by default. The row "ours, blocks
  recomputed" is ours with ``--model.remat``: the blocks in a scan, each recomputed, as the reference's;
* ours augments the views inside the step (pitch shift and time stretch, its defaults) and takes each
  mel bin's noise floor (``input_norm floor``: a quantile, a sort); the reference augments on the host,
  in its data pipeline. The row "ours, same work" turns both off (``--augment.pitch-bins 0
  --augment.stretch 0 --model.input-norm none``): the step doing what the reference's step does;
* ours also runs the non-finite guard, the weight-update monitor's cond and the record conds
  `birdjepa trace` uses (off), and logs more metrics.

Printed: step time (median of ``--repeats`` after 2 warm-up steps in each process, then the median over
``--rounds`` rounds of the processes, each round starting at the next side), FLOPs (XLA's cost
analysis of each lowered step; ours with the blocks unrolled, `step_cost.training_flops`: it counts
a loop's body once, so the reference's figure, whose blocks are a scan, holds one block's), XLA's
memory plan of each compiled step (arguments, outputs and temporaries, less the outputs that reuse a
donated argument's buffer: what the step needs while it runs, on any device), peak memory (a GPU's
peak bytes in use; on a CPU the process's peak resident memory, which includes each framework's
own), compile time, and ours over the reference's: the median of the rounds' ratios, each taken
within its round, and their range.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from birdjepa.host_memory import TUNABLES
from birdjepa.train.determinism import deterministic_xla

deterministic_xla()  # in the environment both sides inherit

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"tiny": (64, 2, 2), "small": (384, 12, 6), "base": (768, 12, 12)}
CPU_BATCH = {"tiny": 8, "small": 2, "base": 1}
REFERENCE_NEEDS = ("equinox", "jaxtyping", "beartype", "chex", "orbax-checkpoint", "grain", "tyro", "wandb")
SAME_WORK = {"augment.pitch_bins": 0.0, "augment.stretch": 0.0, "model.input_norm": "none"}


def ours(preset: str, batch: int, side: str, repeats: int, compile_only: bool = False) -> dict:
    """This process's side (`SIDES`, one of ours): our step at the reference's architecture
    (``compile_only``: compiled, into birdjepa's compilation cache, and not run)."""
    import jax

    from birdjepa.perf.step_cost import bench_config, compile_step, measure

    options = {
        "model.patch_freq": 16,
        "model.proj_dim": 16,
        "model.proj_hidden": 2048,
        "model.proj_layers": 2,
    }
    options |= SAME_WORK if side == "ours, same work" else {}
    options |= {"model.remat": True} if side == "ours, blocks recomputed" else {}
    cfg = bench_config(preset, "float32", batch, **options)
    if compile_only:
        return compile_step(cfg)
    c = measure(cfg, repeats=repeats, warmup=2)
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"step_s": c.step_s, "flops": c.flops, "peak_bytes": int(peak), "plan_bytes": c.memory_bytes,
            "compile_s": c.compile_s, "loaded": c.loaded}  # fmt: skip


def reference_env(venv: Path) -> Path:
    """The reference's scratch venv (made with pip on first use); its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        import jax
        import optax

        print(f"making the reference's environment in {venv} (pip)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pins = [f"jax=={jax.__version__}", f"optax=={optax.__version__}", "numpy<2.5", *REFERENCE_NEEDS]
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins], check=True)
    return python


def side(cmd: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def default_batch(preset: str) -> int:
    """16 clips a step on an accelerator; on a CPU, what keeps a step to seconds (`CPU_BATCH`)."""
    import jax

    return CPU_BATCH[preset] if jax.devices()[0].platform == "cpu" else 16


SIDES = ("ours", "ours, same work", "ours, blocks recomputed", "reference")


def processes(
    preset: str,
    batch: int,
    reference: Path,
    python: Path,
    repeats: int,
    *,
    cache: Path | None = None,
    compile_only: bool = False,
    reuse: bool = False,
) -> dict[str, tuple[list[str], dict[str, str]]]:
    """The command and environment of each side's process at ``preset`` (`SIDES`). ``cache``: a JAX
    compilation cache for the reference's side (ours keeps its own, `birdjepa.train.compile_cache`);
    ``compile_only``: each compiles its step, into its cache, and exits (`scripts/gpu_check.py
    --prebuild`); ``reuse``: both keep freed host memory for reuse (`birdjepa.host_memory.TUNABLES`)."""
    dim, depth, heads = SIZES[preset]
    env = {**os.environ, "GLIBC_TUNABLES": TUNABLES} if reuse else dict(os.environ)
    ref_env = {**env, "PYTHONPATH": str(reference.resolve() / "src")}
    if cache is not None:  # JAX's own settings, which the reference's JAX reads at import
        ref_env |= {"JAX_COMPILATION_CACHE_DIR": str(cache),
                    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # fmt: skip
    only = ["--compile-only"] if compile_only else []
    theirs = [str(python), str(ROOT / "scripts" / "reference_step.py"), "--dim", str(dim), "--depth",
              str(depth), "--heads", str(heads), "--batch", str(batch), "--repeats", str(repeats),
              *only]  # fmt: skip
    mine = [sys.executable, __file__, "--repeats", str(repeats), *only, "--ours", preset, str(batch)]
    jobs = {name: ([*mine, str(i)], env) for i, name in enumerate(SIDES[:-1])}
    return jobs | {"reference": (theirs, ref_env)}


def measure_preset(
    preset: str,
    batch: int,
    reference: Path,
    python: Path,
    repeats: int,
    cache: Path | None = None,
    rounds: int = 1,
    reuse: bool = False,
) -> dict[str, dict]:
    """Each side's step at ``preset``, each in a process of its own, one after the other, over ``rounds``
    rounds, each round starting at the next side. A CPU's speed can drift between processes minutes
    apart by more than the sides differ (docs/benchmarks.md), so a side is set against the reference of
    its own round (``ratios``, one a round) and its ``step_s`` is the median over rounds. Without
    ``cache`` and over several rounds, the reference's step is compiled once, into a JAX compilation
    cache of this call (ours keeps its own, `birdjepa.train.compile_cache`); ``compile_s`` and
    ``loaded`` are each side's first round's."""
    with tempfile.TemporaryDirectory() as own:
        if cache is None and rounds > 1:
            cache = Path(own)
        jobs = processes(preset, batch, reference, python, repeats, cache=cache, reuse=reuse)
        names = list(jobs)
        runs: list[dict[str, dict]] = []
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            runs.append({name: side(*jobs[name]) for name in order})
    out = {}
    for name in names:
        mine = [run[name] for run in runs]
        out[name] = {
            **mine[0],
            "step_s": statistics.median(m["step_s"] for m in mine),
            "peak_bytes": max(m["peak_bytes"] for m in mine),
            "ratios": [m["step_s"] / run["reference"]["step_s"] for m, run in zip(mine, runs, strict=True)],
        }
    return out


def table(rows: list[tuple[str, int, dict[str, dict]]]) -> str:
    """``(preset, batch, measure_preset's sides)`` as a Markdown table, each side against the reference:
    the time ratio is the median of the rounds' ratios, their range beside it."""
    lines = ["| preset | batch | side | ms/step | vs reference | rounds' range | GFLOP/step | XLA plan MiB | "
             "vs reference | peak MiB | vs reference | compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for preset, batch, sides in rows:
        theirs = sides["reference"]
        for name in SIDES:
            r = sides[name]
            ratios, memory_ratio = r["ratios"], r["peak_bytes"] / theirs["peak_bytes"]
            plan_ratio = r["plan_bytes"] / theirs["plan_bytes"]
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 and name != "reference" else ""
            cells = [preset, batch, name, f"{1e3 * r['step_s']:.1f}", f"{statistics.median(ratios):.2f}",
                     spread, f"{r['flops'] / 1e9:.1f}", f"{r['plan_bytes'] / 2**20:.0f}",
                     f"{plan_ratio:.2f}", f"{r['peak_bytes'] / 2**20:.0f}", f"{memory_ratio:.2f}",
                     f"{r['compile_s']:.0f}"]  # fmt: skip
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, help="a checkout of samuelstevens/birdjepa")
    ap.add_argument("--venv", type=Path, default=ROOT / ".cache" / "reference-venv")
    ap.add_argument("--presets", nargs="+", default=["small", "base"], choices=list(SIZES))
    ap.add_argument("--batch", type=int, help="clips a step (default: 16 on a GPU; 2 small, 1 base on a CPU)")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps of each side's process")
    ap.add_argument("--rounds", type=int, default=3,
                    help="processes of each side, alternating (measure_preset)")  # fmt: skip
    ap.add_argument("--host-memory", choices=("system", "reuse"), default="system",
                    help="both sides' host memory: the C library's, or kept for reuse (the doc)")  # fmt: skip
    ap.add_argument("--ours", nargs=3, metavar=("PRESET", "BATCH", "SIDE"), help=argparse.SUPPRESS)
    ap.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.ours:  # one side, in a process of its own (peak memory is per process)
        preset, batch, side = args.ours
        print(json.dumps(ours(preset, int(batch), SIDES[int(side)], args.repeats, args.compile_only)))
        return
    if args.reference is None:
        ap.error("--reference PATH: a checkout of https://github.com/samuelstevens/birdjepa")
    import jax

    python = reference_env(args.venv)
    rows = []
    for preset in args.presets:
        batch = args.batch or default_batch(preset)
        sides = measure_preset(
            preset, batch, args.reference, python, args.repeats, rounds=args.rounds,
            reuse=args.host_memory == "reuse",
        )  # fmt: skip
        rows.append((preset, batch, sides))
        print(f"measured {preset}", file=sys.stderr, flush=True)
    equinox = rows[0][2]["reference"]["equinox"]
    device = f"{jax.devices()[0].device_kind}, jax {jax.__version__}, equinox {equinox}"
    print(
        f"\n## Our LeJEPA step beside the reference's ({device}, float32, 2 views, 256 patches, "
        f"{args.rounds} rounds, host memory {args.host_memory})\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
