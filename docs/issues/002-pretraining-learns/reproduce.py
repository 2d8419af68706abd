"""Regenerate docs/issues/002-pretraining-learns: data, runs, frozen-encoder evaluations, tables, figures.

    .venv/bin/python docs/issues/002-pretraining-learns/reproduce.py     # everything (~80 min, 2 cores)
    .venv/bin/python docs/issues/002-pretraining-learns/reproduce.py --only v2-default-600 v2-no-warp

Data sets (all generated from scratch, deterministic):

* ``v2``: the demo set (``birdjepa demo-data`` defaults, generator version 2: band partners that
  differ only in temporal pattern, per-recording noise, microphone, level and background birds);
* ``v1``: the demo set before this issue (generator version 1, read from git at commit 5d95d5c);
* ``v2-eval16`` / ``v1-eval16``: the same generators with 16 held-out recordings per species (256
  clips; its first 4 per species are the demo's eval split), the "big" eval split of the tables.

Every run pretrains on the data set's train split (384 clips), then ``birdjepa evaluate`` scores the
frozen encoder on the big eval split (``RUN/eval/big.json``); the trainer's own evaluation on the
demo's eval split (64 clips) is ``RUN/eval/<step>.json``. ``old`` runs use the recipe of main before
this issue (16 x 16 patches, no input normalisation, λ = 0.5, no warp); the ablations change one
option of the new defaults each (600 steps, the demo's budget), beside ``v2-default-600``.
A run whose ``eval/big.json`` exists is kept (runs are deterministic; ``--force`` redoes them;
``--reevaluate`` keeps its training and redoes both evaluations, after a change to the protocol).

Writes ``results.md`` (tables, then ``what_it_encodes.py`` and ``band_or_rhythm.py`` on a few runs)
and ``figures/*.png`` next to this file, console logs to ``logs/``.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
V1_COMMIT = "5d95d5c"  # the last commit with demo-data generator version 1

# The recipe of main before this issue, spelled in today's options.
OLD = ["--model.patch-freq", "16", "--model.input-norm", "none", "--objective.lejepa.lam", "0.5",
       "--augment.pitch-bins", "0", "--augment.stretch", "0"]  # fmt: skip
SUPERVISED = ["--objective.kind", "supervised"]
SCREEN = ["--steps", "600"]


@dataclass(frozen=True)
class Run:
    data: str  # "v1" or "v2"
    flags: tuple[str, ...]
    why: str


RUNS: dict[str, Run] = {
    # Before: the old recipe on both sets, and its supervised ceiling.
    "v1-old": Run("v1", (*OLD, *SCREEN), "the demo before this issue"),
    "v1-old-supervised": Run("v1", (*OLD, *SCREEN, *SUPERVISED), "its supervised ceiling"),
    "v2-old": Run("v2", (*OLD, *SCREEN), "the old recipe on the new set"),
    "v2-old-supervised": Run("v2", (*OLD, *SCREEN, *SUPERVISED), "its supervised ceiling"),
    # After: the defaults on both sets, and the supervised ceiling of the new architecture.
    "v1-default": Run("v1", (), "the new defaults on the old set"),
    "v2-default-supervised": Run("v2", SUPERVISED, "their supervised ceiling"),
    # One change from the defaults each, at 600 steps.
    "v2-default-600": Run("v2", SCREEN, "the defaults (600 steps; the reference of the ablations)"),
    "v2-square-patches": Run("v2", (*SCREEN, "--model.patch-freq", "16"), "16 x 16 patches"),
    "v2-no-input-norm": Run("v2", (*SCREEN, "--model.input-norm", "none"), "no input normalisation"),
    "v2-no-warp": Run("v2", (*SCREEN, "--augment.pitch-bins", "0", "--augment.stretch", "0"), "no warp"),
    "v2-lam0.5": Run("v2", (*SCREEN, "--objective.lejepa.lam", "0.5"), "λ = 0.5 (the old default)"),
    "v2-masks": Run(
        "v2",
        (
            *SCREEN,
            "--data.features.time-mask-count",
            "2",
            "--data.features.time-mask-width",
            "60",
            "--data.features.freq-mask-count",
            "2",
            "--data.features.freq-mask-width",
            "16",
        ),  # fmt: skip
        "+ time and frequency masks",
    ),
    "v2-4views": Run("v2", (*SCREEN, "--data.batch-size", "8", "--data.n-views", "4"), "4 views x 8 clips"),
    "v2-multicrop": Run(
        "v2", (*SCREEN, "--objective.lejepa.local-views", "4"), "+ 4 local views of 128 frames"
    ),
    "v2-sigreg-per-view": Run("v2", (*SCREEN, "--objective.lejepa.sigreg-per-view"), "SIGReg per view"),
    "v2-wide": Run(
        "v2", (*SCREEN, "--model.dim", "128", "--model.depth", "4", "--model.heads", "4"), "dim 128, depth 4"
    ),
    "v2-jepa": Run(
        "v2",
        (*SCREEN, "--model.predictor-depth", "2", "--objective.lejepa.span-weight", "1.0"),
        "+ a predictor of masked time spans' tokens (H7)",
    ),
}
# Runs whose frozen embeddings are decomposed into loudness and species variance (what_it_encodes.py).
ENCODES = ["v1-old", "v1-old-supervised", "v1-default", "v2-default-600", "v2-default-supervised"]
# Runs whose probe accuracy is split into band group and rhythm (band_or_rhythm.py, v2 set only).
BAND_OR_RHYTHM = ["v2-default-600", "v2-jepa", "v2-default-supervised"]


def v1_generator(runs: Path):  # noqa: ANN201 (a module read from git)
    """demo_data.py as of V1_COMMIT, imported from a copy (git show) under ``runs``."""
    src = subprocess.run(["git", "show", f"{V1_COMMIT}:src/birdjepa/demo_data.py"], cwd=HERE, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    path = runs / "demo_data_v1.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("demo_data_v1", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["demo_data_v1"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    assert module.GENERATOR_VERSION == 1
    return module


def make_data(runs: Path, logs: Path) -> dict[str, Path]:
    """Data-set name -> folder holding train/ and eval/."""
    from birdjepa.synthetic import demo as demo_data

    out = {"v2": demo_data.ensure_demo_data(), "v2-eval16": runs / "data-v2-eval16"}
    if not (out["v2-eval16"] / "manifest.json").is_file():
        shutil.rmtree(out["v2-eval16"], ignore_errors=True)
        call([*BIRDJEPA, "demo-data", str(out["v2-eval16"]), "--per-species-train", "1",
              "--per-species-eval", "16"], logs / "data-v2-eval16.log")  # fmt: skip
    v1 = v1_generator(runs)
    big = v1.DemoConfig(per_species_train=1, per_species_eval=16)
    for name, config in (("v1", v1.DEFAULT), ("v1-eval16", big)):
        out[name] = runs / f"data-{name}"
        if not (out[name] / "manifest.json").is_file():
            shutil.rmtree(out[name], ignore_errors=True)
            v1.generate_demo_data(out[name], config, verbose=False)
    return out


def trainer(runs: Path, name: str, run: Run, data: dict[str, Path], log: Path, redo: str | None):
    """A job: pretrain ``name`` (its own evaluation on the demo eval split), then evaluate on the big one.
    ``redo``: None keeps a finished run, "train" redoes it, "evaluate" redoes only its evaluations."""
    rdir = runs / name
    big = rdir / "eval" / "big.json"

    def job() -> None:
        if big.is_file() and redo is None:
            return
        if not big.is_file() or redo == "train":
            shutil.rmtree(rdir, ignore_errors=True)
            log.unlink(missing_ok=True)
            d = data[run.data]
            call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(runs), "--log.print-every",
                  "100", "--data.train", str(d / "train"), "--data.eval", str(d / "eval"), *run.flags],
                 log)  # fmt: skip
        else:  # the trainer's own evaluation, again (same data, same batches)
            call([*BIRDJEPA, "evaluate", str(rdir)], log)
        call([*BIRDJEPA, "evaluate", str(rdir), "--data.eval", str(data[f"{run.data}-eval16"] / "eval"),
              "--out", str(big)], log)  # fmt: skip

    return job


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs-dir", type=Path, default=Path("runs/issue-002"))
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--only", nargs="+", choices=list(RUNS), default=list(RUNS))
    p.add_argument("--jobs", type=int, default=2, help="runs at a time")
    redo = p.add_mutually_exclusive_group()
    redo.add_argument("--force", action="store_const", const="train", dest="redo",
                      help="redo runs that already have eval/big.json")  # fmt: skip
    redo.add_argument("--reevaluate", action="store_const", const="evaluate", dest="redo",
                      help="redo only the evaluations of runs that have eval/big.json")  # fmt: skip
    args = p.parse_args()
    runs, logs = args.runs_dir, args.out / "logs"
    runs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    data = make_data(runs, logs)
    jobs = [trainer(runs, n, RUNS[n], data, logs / f"{n}.log", args.redo) for n in args.only]
    with ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    subprocess.run([sys.executable, str(HERE / "tables.py"), str(runs), str(args.out), *RUNS], check=True)
    encodes = [str(runs / n) for n in ENCODES if (runs / n / "eval" / "big.json").is_file()]
    with (args.out / "results.md").open("a") as f:
        subprocess.run([sys.executable, str(HERE / "what_it_encodes.py"), *encodes], check=True, stdout=f)
        done = [str(runs / n) for n in BAND_OR_RHYTHM if (runs / n / "eval" / "big.json").is_file()]
        subprocess.run([sys.executable, str(HERE / "band_or_rhythm.py"), str(data["v2-eval16"]), *done],
                       check=True, stdout=f)  # fmt: skip
    print((args.out / "results.md").read_text())


if __name__ == "__main__":
    main()
