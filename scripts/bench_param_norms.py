"""A logged step's parameter norms on a thread (the loop's way) against in the loop, side by side.

    python scripts/bench_param_norms.py [--preset small] [--batch 4] [--steps 14] [--rounds 3]

Runs `birdjepa pretrain` through ``scripts/bench_loop.py`` (a clock on each of the loop's calls, no
value changes), logging every step, in rounds that alternate the two ways, each run a process of its
own: ``--norms thread`` (`birdjepa.train.param_norms`: the parameters copied on the device, their
norms taken on a thread while the next step runs) and ``--norms inline`` (copied to the host and
summed in the loop, as before), after one run left out. Prints the median loop period of each way
per round, their ratio, the parts the two differ in, and checks that both logged the same norms, bit
for bit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from birdjepa.rundir.metrics_log import metrics_by_step

LOOP = Path(__file__).resolve().parent / "bench_loop.py"
WAYS = ("thread", "inline")
PARTS = ("other copies to host", "parameters copied for norms", "wait for the norms", "rest of the loop")


def run(tmp: Path, way: str, rnd: int, args: argparse.Namespace) -> tuple[dict[str, float], dict]:
    name, out = f"{way}-{rnd}", tmp / f"{way}-{rnd}.json"
    cmd = [sys.executable, str(LOOP), "--json", str(out), "--norms", way, "pretrain", "--run", name,
           "--log.runs-dir", str(tmp), "--steps", str(args.steps), "--model.preset", args.preset,
           "--data.batch-size", str(args.batch), "--eval-every", "0", "--ckpt-every", "1000000",
           "--log.print-every", "1000"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    norms = {
        s: {k: v for k, v in m.items() if "param_norm" in k} for s, m in metrics_by_step(tmp / name).items()
    }
    return json.loads(out.read_text()), norms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    periods: dict[str, list[float]] = {w: [] for w in WAYS}
    parts: dict[str, list[dict[str, float]]] = {w: [] for w in WAYS}
    logged: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp), "inline", -1, args)  # discarded: the first process of a series ran slower (caches)
        for rnd in range(args.rounds):
            for way in WAYS if rnd % 2 == 0 else WAYS[::-1]:  # neither always first
                ms, logged[way] = run(Path(tmp), way, rnd, args)
                periods[way].append(ms["loop period"])
                parts[way].append(ms)
    if logged["thread"] != logged["inline"] or not logged["thread"]:
        raise SystemExit("the two ways logged different parameter norms")
    print(f"\n## Parameter norms on a thread against in the loop: {args.preset} batch {args.batch}, "
          f"{args.steps} steps, logged every step, {args.rounds} rounds (median ms a step)\n")  # fmt: skip
    print("| round | thread: loop period | inline: loop period | thread/inline |\n|---|---|---|---|")
    for i, (a, b) in enumerate(zip(periods["thread"], periods["inline"], strict=True)):
        print(f"| {i} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    a, b = (statistics.median(periods[w]) for w in WAYS)
    print(f"| median | {a:.1f} | {b:.1f} | {a / b:.2f} |\n")
    print("| part (median over rounds) | thread | inline |\n|---|---|---|")
    for part in PARTS:
        print(
            f"| {part} | "
            + " | ".join(f"{statistics.median(p[part] for p in parts[w]):.2f}" for w in WAYS)
            + " |"
        )
    print(f"\nlogged parameter norms: equal in both ways at all {len(logged['thread'])} steps")


if __name__ == "__main__":
    main()
