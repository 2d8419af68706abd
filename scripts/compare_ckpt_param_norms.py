"""Recompute the parameter norms of every checkpoint of a run and compare them with the logged ones.

    python scripts/compare_ckpt_param_norms.py RUN_DIR [--out RUN_DIR/ckpt_param_norms.csv]

For each checkpoint step on disk: the float64 norm of all parameters and of each component (encoder,
projector, probe), recomputed from the saved arrays alone (no model, no target tree), next to the
``train/param_norm[/component]`` logged for the same step in ``metrics.jsonl``. The trainer logs the
post-update norms of exactly the state a checkpoint of that step holds, so every delta must be 0.0;
the exit status is 1 otherwise (or when a step was not logged).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path
from typing import Any

from birdjepa.rundir import layout
from birdjepa.rundir.checkpoint import Checkpointer
from birdjepa.rundir.checkpoint.norms import tree_norms
from birdjepa.rundir.metrics_log import metrics_by_step

_KEY = re.compile(r"\['([^']*)'\]")


def params_tree(arrays: dict[str, Any]) -> dict[str, Any]:
    """The nested ``params`` dict rebuilt from the recorded leaf paths."""
    tree: dict[str, Any] = {}
    for path, array in arrays.items():
        keys = _KEY.findall(path)
        if not keys or keys[0] != "params":
            continue
        node = tree
        for k in keys[1:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = array
    return tree


def compare(run_dir: Path) -> list[dict[str, Any]]:
    logged = metrics_by_step(run_dir)
    rows = []
    with Checkpointer(run_dir, keep=None, async_save=False) as ck:
        for step in ck.all_steps():
            norms = tree_norms(params_tree(ck.read_arrays(step)), "param_norm")
            for name, value in norms.items():
                seen = logged.get(step, {}).get(f"train/{name}")
                delta = float("nan") if seen is None else value - seen
                rows.append({"step": step, "norm": name, "checkpoint": value, "logged": seen, "delta": delta})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--out", type=Path, default=None, help="CSV path (default RUN_DIR/ckpt_param_norms.csv)"
    )
    args = parser.parse_args()
    if not layout.is_run(args.run_dir):  # a 22-line FileNotFoundError
        parser.error(f"{args.run_dir}: not a run directory (no {layout.RUN_MARKERS})")
    rows = compare(args.run_dir)
    out = args.out or args.run_dir / "ckpt_param_norms.csv"
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["step", "norm", "checkpoint", "logged", "delta"])
        writer.writeheader()
        writer.writerows({k: repr(v) if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    bad = [r for r in rows if r["delta"] != 0.0]
    steps = sorted({r["step"] for r in rows})
    print(f"{len(rows)} norms over checkpoints {steps}; {len(bad)} differ from the log; CSV: {out}")
    for r in bad:
        print(f"  step {r['step']} {r['norm']}: checkpoint {r['checkpoint']!r} logged {r['logged']!r}")
    return 1 if bad or not rows else 0


if __name__ == "__main__":
    sys.exit(main())
