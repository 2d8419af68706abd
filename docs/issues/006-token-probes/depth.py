"""006, where the lead goes: the 2 x 512 encoder's random init beats raw log-mel with the prototypical
probe, and LeJEPA's training (at either learning rate) takes that lead away. When, and in which layer?
Writes ``depth.md``.

    .venv/bin/python docs/issues/006-token-probes/depth.py   # ~40 min on 2 cores; after wider.py

1. **When**: ``wider.py``'s best trained run (``lejepa-wide2-512-lr2e-4``: 2 blocks of 512, lr 2e-4
   warmed up over 60 steps, 600 steps) trained again with a checkpoint every 25 steps
   (``--ckpt-every 25 --ckpt-keep 100``; the checkpoint cadence leaves a run's bits alone, so its step
   599 is wider's: the script checks the two checkpoints' identities are equal), benchmarked at steps
   24, 49, 99, 199, 399 and 599.
2. **Which term**: the same run with a token-level term beside LeJEPA's pooled one, the masked-span
   JEPA term (``--model.predictor-depth 2 --objective.lejepa.span-weight 1``: 002's H7, which the
   pooled probes found no better, never read by a token probe), and with SIGReg weighted 4x
   (``--objective.lejepa.lam 0.2``: the projections held nearer an isotropic Gaussian), each at step
   599.
3. **Where**: the tokens after k of its 2 blocks (k = 0: the patch embedding and position embedding
   alone; each then through the encoder's final norm, as the full encoder's are), of the trained
   encoder at step 599 and of the same architecture at random init. Each is an external backbone of
   this folder's ``depth_tokens`` module (``depth_tokens:trained_k0`` ...), which reads the run from
   ``BIRDJEPA_DEPTH_RUN``.

4. **What raw's tokens lack**: the benchmark's ``raw`` tokens are the log-mel's patches as they are;
   every encoder, random or trained, first subtracts each bin's noise floor and standardises the clip
   (``--model.input-norm floor``, the default), and its tokens leave through a LayerNorm. Nothing
   learned, three more token forms (the ``depth_tokens`` module): ``patches_norm`` (each raw patch
   standardised over its own values), ``floored`` (the patches as the encoder receives them) and
   ``floored_norm`` (those standardised per token); and raw's pooled form (each bin's mean and std)
   of the floored log-mel (``floored_meanstd``, read by the linear probe only).

5. **The demo's single-label split** (train -> eval), where raw's patches read by prototypes scored
   0.27 with every recording: the demo's run, its random init, the 2 x 512 run, ``raw`` and
   ``raw:input`` (the benchmark's form of ``floored``, since this study).

1-4 on SYN1-3 (train -> test_5s) with the linear probe on the mean and the prototypical probe on the
tokens, n = 1, 4, 16 and all, seeds 0-2, 006's recipe, into ``wider.py``'s results folder (its random
init and raw rows are reused, not fitted again).
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

sys.path.insert(0, str(HERE))
from wider import BIRDJEPA, PROBES, RUNS, TASKS, arguments, named_rows  # noqa: E402  (006's)

BASE = "lejepa-wide2-512-lr2e-4"
RUN = f"{BASE}-every25"
ARCHITECTURE = "lejepa-wide2-512"  # wider.py's random init of this architecture (the same seed and init)
STEPS = (24, 49, 99, 199, 399, 599)
DEPTHS = (0, 1, 2)
DEMO_ROWS = ("lejepa", "random:lejepa", BASE, "raw", "raw:input")
UNLEARNED = ("patches_norm", "floored", "floored_norm", "floored_meanstd")  # raw's forms (`depth_tokens`)
LEVERS: dict[str, tuple[str, ...]] = {
    f"{BASE}-span": ("--model.predictor-depth", "2", "--objective.lejepa.span-weight", "1"),
    f"{BASE}-lam0.2": ("--objective.lejepa.lam", "0.2"),
}


def main() -> None:
    args = arguments(__doc__)
    logs = HERE / "logs"
    from birdjepa.synthetic.demo import ensure_birdset_data, ensure_demo_data

    tasks, demo = ensure_birdset_data(), ensure_demo_data()
    if not (args.runs / RUN / "checkpoints").is_dir():
        call([*BIRDJEPA, "pretrain", "--run", RUN, "--log.runs-dir", str(args.runs), *RUNS[BASE],
              "--ckpt-every", "25", "--ckpt-keep", "100"], logs / "depth-pretrain.log")  # fmt: skip
    for name, extra in LEVERS.items():
        if not (args.runs / name / "checkpoints").is_dir():
            call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(args.runs), *RUNS[BASE],
                  *extra], logs / "depth-pretrain.log")  # fmt: skip
    run = args.runs / RUN
    externals = [f"depth_tokens:{kind}_k{k}" for kind in ("trained", "random") for k in DEPTHS]
    externals += [f"depth_tokens:{form}" for form in UNLEARNED]
    backbones = [f"{run}@{s}" for s in STEPS] + [str(args.runs / n) for n in LEVERS]
    backbones += [f"random:{args.runs / ARCHITECTURE}", "raw", *externals]
    env = {**os.environ, "BIRDJEPA_DEPTH_RUN": str(run),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    for task in TASKS:
        call([*BIRDJEPA, "benchmark", "--backbone", *backbones, "--train", str(tasks / task / "train"),
              "--test", str(tasks / task / "test_5s"), "--task", task, "--probe", *PROBES,
              "--n-train", "1", "4", "16", "-1", "--seed", "0", "1", "2", "--results", str(args.results)],
             logs / "depth-benchmark.log", env=env)  # fmt: skip
    # 5. The demo's single-label split (train -> eval), where raw's patches read by prototypes were poor.
    on_demo = [str(args.runs / "lejepa"), f"random:{args.runs / 'lejepa'}", str(args.runs / BASE), "raw",
               "raw:input"]  # fmt: skip
    call([*BIRDJEPA, "benchmark", "--backbone", *on_demo, "--train", str(demo / "train"), "--test",
          str(demo / "eval"), "--task", "demo", "--probe", *PROBES, "--n-train", "1", "4", "16", "-1",
          "--seed", "0", "1", "2", "--results", str(args.results)], logs / "depth-benchmark.log")  # fmt: skip
    write(args.results, args.runs)


def write(results: Path, runs: Path) -> None:
    rows, name = named_rows(results, runs)
    identity = {name[r["backbone"]]: r["backbone"] for r in rows}
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        cells[(name[r["backbone"]] if r["task"] in TASKS else f"demo: {name[r['backbone']]}", r["probe"],
               r["n"])].append(r["cmap"])  # fmt: skip
    mean = {k: sum(v) / len(v) for k, v in cells.items()}
    ns = (1, 4, 16, -1)
    head = ["| backbone | probe | " + " | ".join("all" if n < 0 else str(n) for n in ns) + " |",
            "|---|---|" + "---:|" * len(ns)]  # fmt: skip

    def table(order: list[str]) -> list[str]:
        out = list(head)
        for b in order:
            for p in PROBES:
                values = [mean.get((b, p, n)) for n in ns]
                out.append(f"| {b} | {p} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in values)
                           + " |")  # fmt: skip
        return out

    same = identity.get(f"{RUN}@599", "?").split("#")[-1] == identity.get(BASE, "!").split("#")[-1]
    depths = [f"depth_tokens:{kind}_k{k}" for kind in ("random", "trained") for k in DEPTHS]
    unlearned = [f"depth_tokens:{form}" for form in UNLEARNED]
    lines = ["# 006, where the lead goes: measured (written by depth.py)", "",
             "SYN1-3 cmAP, mean over tasks and seeds 0-2.", "",
             f"## When: `{BASE}` at each step", "",
             f"Retrained with a checkpoint every 25 steps; its step 599 checkpoint's identity "
             f"{'equals' if same else 'DIFFERS FROM'} wider.py's run's "
             f"(`{identity.get(f'{RUN}@599')}` and `{identity.get(BASE)}`).", "",
             *table([f"random:{ARCHITECTURE}", *(f"{RUN}@{s}" for s in STEPS), "raw"]), "",
             "## Which term (step 599)", "",
             *table([BASE, *LEVERS, "raw"]), "",
             "## Where: tokens after k of the 2 blocks (then the final norm)", "",
             *table([*depths, "raw"]), "",
             "## What raw's tokens lack (nothing learned)", "",
             *table(["raw", *unlearned, "depth_tokens:random_k0"]), "",
             "## The demo's single-label split (train -> eval; mean over seeds 0-2)", "",
             *table([f"demo: {b}" for b in DEMO_ROWS])]  # fmt: skip
    (HERE / "depth.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
