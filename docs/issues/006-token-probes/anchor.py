"""006, the untried lever: a term that anchors each token to its own patch. ``depth.py`` found that
LeJEPA's training loses what each token holds of its patch inside the blocks, in the first 200 steps,
and that neither the masked-span term nor a heavier SIGReg changes that. Here a per-token linear
read-out of the encoder's final tokens reconstructs each token's own input patch (standardised over its
values, as MAE's targets), added to LeJEPA's loss (``--objective.lejepa.patch-weight w``). Writes
``anchor.md``.

    .venv/bin/python docs/issues/006-token-probes/anchor.py   # ~285 min on 2 cores; after depth.py

1. **Runs**: ``depth.py``'s base (``lejepa-wide2-512-lr2e-4``: 2 blocks of 512, lr 2e-4 warmed up over
   60 steps, 600 steps) with the patch term at w = 0.1, 1, 4, 16 and 64 (its error starts near 2,
   LeJEPA's loss near 0.8). Trained where ``--runs`` lacks them.
2. **Benchmark**: SYN1-3 (train -> test_5s) with the linear probe on the mean and the prototypical
   probe on the tokens, n = 1, 4, 16 and all, seeds 0-2, 006's recipe, beside the base run, the
   architecture's random init, ``raw`` and ``raw:input`` (the encoders' own input: the bar); and the
   demo's single-label split (train -> eval) for the runs and ``raw:input``. Into ``wider.py``'s
   results folder: rows it holds are not fitted again.
3. **What a read-out can give back**: on the demo set's clips (centre crops; fitted on train, scored on
   eval), the error of a least-squares linear read-out from each token to its own standardised input
   patch (the patch term's target), for the runs, the base run and the architecture's random init;
   and the least error any linear code of 512 values per patch can reach: the eval patches' variance
   outside the train patches' top 512 principal components.
4. **The demo's tiny encoder** (2 blocks of 64: 32 tokens of 64 values for patches of 2,048): the demo's
   run (``wider.py``'s ``lejepa``) with the patch term at w = 16 and 64, benchmarked as in 2 beside
   that run and its random init.
5. **No position added to the tokens**: the base run at w = 16 with ``--model.rope`` (rotary position
   in attention, in place of the learned position embedding added to every token), beside its own
   random init, benchmarked as in 2 and read out as in 3.
6. **Four times the steps**: the base run at w = 16 trained for 2,400 steps (the same learning rate and
   warm-up; ~25 min), benchmarked as in 2 and read out as in 3: is what still separates its tokens from
   ``raw:input`` a matter of training length? And the base run itself at 2,400 steps, without the
   term: how much of the gain is the term's?
7. **SIGReg's weight with the term**: the w = 16 run (600 steps) with ``--objective.lejepa.lam`` 0.01
   and 0.2 (default 0.05), benchmarked as in 2 and read out as in 3: the term pulls each token toward
   its patch and SIGReg pulls the pooled projections toward an isotropic Gaussian; does the balance
   between them trade the tokens' score against the mean's? And its ends, which take one of
   LeJEPA's two losses away (``loss = (1 - lam) * invariance + lam * sigreg``, then the term): 0, the
   views' invariance and the term without SIGReg; 1, SIGReg and the term without the invariance. How
   much of the tokens' score is LeJEPA's, and how much the term's alone? Last, λ = 0.01 trained for
   2,400 steps as in 6: the two levers together.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

sys.path.insert(0, str(HERE))
from wider import BIRDJEPA, PROBES, RUNS, TASKS, arguments, named_rows  # noqa: E402  (006's)

BASE = "lejepa-wide2-512-lr2e-4"
ARCHITECTURE = "lejepa-wide2-512"  # wider.py's random init of this architecture (the same seed and init)
WEIGHTS = ("0.1", "1", "4", "16", "64")
ANCHORED = {f"{BASE}-patch{w}": ("--objective.lejepa.patch-weight", w) for w in WEIGHTS}
BASELINES = (f"random:{ARCHITECTURE}", "raw", "raw:input")
PATCH16 = ("--objective.lejepa.patch-weight", "16")  # the weight parts 5-7 build on
ROPE = {f"{BASE}-patch16-rope": (*PATCH16, "--model.rope")}
DEMO = "lejepa"  # wider.py's: the demo's run (the tiny preset, 600 steps)
TINY = {f"{DEMO}-patch{w}": ("--objective.lejepa.patch-weight", w) for w in ("16", "64")}
SIGREG = {
    f"{BASE}-patch16-lam{lam}": (*PATCH16, "--objective.lejepa.lam", lam) for lam in ("0.01", "0.2", "0", "1")
}
LONGER = {  # part 6, and part 7's lightest SIGReg at its length
    f"{BASE}-patch16-2400": PATCH16,
    f"{BASE}-2400": (),
    f"{BASE}-patch16-lam0.01-2400": SIGREG[f"{BASE}-patch16-lam0.01"],
}
NS = ("1", "4", "16", "-1")
BASE_2400 = ["2400" if a == "600" else a for a in RUNS[BASE]]  # the base recipe at LONGER's length
assert BASE_2400.count("2400") == 1, BASE_2400  # its --steps 600, and nothing else


def main() -> None:
    args = arguments(__doc__)
    logs = HERE / "logs"
    from birdjepa.synthetic.demo import ensure_birdset_data, ensure_demo_data

    tasks, demo = ensure_birdset_data(), ensure_demo_data()
    for name, extra in [*((n, [*RUNS[BASE], *e]) for n, e in {**ANCHORED, **ROPE, **SIGREG}.items()),
                        *((n, [*RUNS[DEMO], *e]) for n, e in TINY.items()),
                        *((n, [*BASE_2400, *e]) for n, e in LONGER.items())]:  # fmt: skip
        if not (args.runs / name / "checkpoints").is_dir():
            call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(args.runs), *extra],
                 logs / "anchor-pretrain.log")  # fmt: skip
    tiny = [str(args.runs / n) for n in (*TINY, DEMO)] + [f"random:{args.runs / DEMO}"]
    runs = [str(args.runs / n) for n in (*ANCHORED, BASE, *ROPE, *LONGER, *SIGREG)]
    runs += [f"random:{args.runs / n}" for n in ROPE]
    backbones = [*runs, *(b.replace(ARCHITECTURE, str(args.runs / ARCHITECTURE)) for b in BASELINES), *tiny]
    for task in TASKS:
        call([*BIRDJEPA, "benchmark", "--backbone", *backbones, "--train", str(tasks / task / "train"),
              "--test", str(tasks / task / "test_5s"), "--task", task, "--probe", *PROBES,
              "--n-train", *NS, "--seed", "0", "1", "2", "--results", str(args.results)],
             logs / "anchor-benchmark.log")  # fmt: skip
    call([*BIRDJEPA, "benchmark", "--backbone", *runs, *tiny, "raw:input", "--train", str(demo / "train"),
          "--test", str(demo / "eval"), "--task", "demo", "--probe", *PROBES, "--n-train", *NS,
          "--seed", "0", "1", "2", "--results", str(args.results)],
         logs / "anchor-benchmark.log")  # fmt: skip
    write(args.results, args.runs, readout(args.runs))


def readout(runs: Path) -> dict[str, float]:
    """Part 3: each backbone's held-out read-out error, and the floor of any 512-value linear code."""
    import jax
    import numpy as np

    from birdjepa.data import Loader
    from birdjepa.evaluation.cli import restore_run
    from birdjepa.model.vit import encoder_apply, input_patches

    run = restore_run(runs / BASE)
    cfg, m = run.cfg, run.model_cfg
    backbones = {name: (restore_run(runs / name).params, m) for name in (*ANCHORED, *LONGER, *SIGREG, BASE)}
    backbones[f"random:{ARCHITECTURE}"] = (run.random_init, m)
    for name in ROPE:  # another architecture: its own model, and its own random init
        rope = restore_run(runs / name)
        backbones[name] = (rope.params, rope.model_cfg)
        backbones[f"random:{name}"] = (rope.random_init, rope.model_cfg)
    applies = {name: jax.jit(encoder_apply(model, tokens=True)) for name, (_, model) in backbones.items()}
    patches_of = jax.jit(lambda x: input_patches(m, x))
    tokens: dict[str, list[list[np.ndarray]]] = {name: [[], []] for name in backbones}
    patches: list[list[np.ndarray]] = [[], []]
    for i, files in enumerate((run.train_files, run.eval_files)):
        with Loader(files, seed=cfg.seed, batch_size=32, n_workers=2, train=False,
                    features=cfg.data.features) as loader:  # fmt: skip
            for batch in loader:
                x = batch["spectrogram"]
                p = np.asarray(patches_of(x), np.float64)
                p = (p - p.mean(-1, keepdims=True)) / np.sqrt(p.var(-1, keepdims=True) + 1e-6)
                patches[i].append(p.reshape(-1, p.shape[-1]))
                for name, (params, _) in backbones.items():
                    t = np.asarray(applies[name](params, x), np.float64)
                    tokens[name][i].append(t.reshape(-1, t.shape[-1]))
    train_p, eval_p = (np.concatenate(ps) for ps in patches)
    errors = {}
    for name, (train_t, eval_t) in tokens.items():
        a, b = (np.concatenate(ts) for ts in (train_t, eval_t))
        a, b = (np.concatenate([t, np.ones((len(t), 1))], axis=1) for t in (a, b))  # with a bias
        w = np.linalg.lstsq(a, train_p, rcond=None)[0]
        errors[name] = float(np.mean(np.square(b @ w - eval_p)))
    mean = train_p.mean(0)
    top = np.linalg.svd(train_p - mean, full_matrices=False)[2][: m.dim]  # [512, P]
    centred = eval_p - mean
    errors[f"any {m.dim}-value linear code"] = float(np.mean(np.square(centred - centred @ top.T @ top)))
    return errors


def write(results: Path, runs: Path, errors: dict[str, float]) -> None:
    rows, name = named_rows(results, runs)
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        where = r["task"] if r["task"] == "demo" else "SYN"
        cells[(where, r["task"], name[r["backbone"]], r["probe"], r["n"])].append(r["cmap"])
        if where == "SYN":
            cells[(where, "mean", name[r["backbone"]], r["probe"], r["n"])].append(r["cmap"])
    mean = {k: sum(v) / len(v) for k, v in cells.items()}
    ns = (1, 4, 16, -1)

    def table(where: str, task: str, order: list[str]) -> list[str]:
        out = ["| backbone | probe | " + " | ".join("all" if n < 0 else str(n) for n in ns) + " |",
               "|---|---|" + "---:|" * len(ns)]  # fmt: skip
        for b in order:
            for p in PROBES:
                values = [mean.get((where, task, b, p, n)) for n in ns]
                if any(v is not None for v in values):
                    cells_ = " | ".join("-" if v is None else f"{v:.3f}" for v in values)
                    out.append(f"| {b} | {p} | {cells_} |")
        return out

    rope = [*ROPE, *(f"random:{n}" for n in ROPE)]
    order = [*ANCHORED, *LONGER, *SIGREG, BASE, *BASELINES, *rope, *TINY, DEMO, f"random:{DEMO}"]
    lines = ["# 006, a term that anchors tokens to their patches: measured (written by anchor.py)", "",
             "cmAP, mean over seeds 0-2.", "", "## SYN1-3, mean over tasks", "",
             *table("SYN", "mean", order)]  # fmt: skip
    for task in TASKS:
        lines += ["", f"## {task}", "", *table("SYN", task, order)]
    on_demo = [*ANCHORED, *LONGER, *SIGREG, BASE, *rope, *TINY, DEMO, f"random:{DEMO}", "raw:input"]
    lines += ["", "## The demo's single-label split (train -> eval)", "", *table("demo", "demo", on_demo)]
    lines += ["", "## What a linear read-out of the tokens gives back (demo clips, held out)", "",
              "| tokens of | error against the standardised patch (1: nothing) |", "|---|---:|",
              *(f"| {name} | {e:.3f} |" for name, e in errors.items())]  # fmt: skip
    (HERE / "anchor.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
