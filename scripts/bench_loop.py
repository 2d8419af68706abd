"""A run's loop step, part by part: `birdjepa pretrain` with a clock on each call the loop makes for a step.

    python scripts/bench_loop.py [--json FILE] [--skip N] [--norms inline] pretrain --run NAME [its flags]

Runs the command in this process after `birdjepa.perf.loop_parts.clock_the_loop` (no value changes)
and prints the median milliseconds a step of each part: the loader, the step's inputs, the batch put
on the devices, the dispatch, the wait for the step's outputs and their copy to the host, the
callbacks, the metrics log, the rest of the loop, and the loop's period. `scripts/gpu_check.py` runs
its data-wait run through it. ``--norms inline`` takes a logged step's parameter norms in the loop, as
it did before `birdjepa.train.param_norms` put them on a thread (the same values):
``scripts/bench_param_norms.py`` times the two side by side.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from birdjepa.cli import main as birdjepa
from birdjepa.host_memory import keep_for_reuse
from birdjepa.perf.loop_parts import clock_the_loop, per_step_ms
from birdjepa.train import param_norms


def inline_norms(params: Any) -> param_norms.Norms:
    """The norms taken at once in the loop, from the parameters copied to the host, as before."""
    done: Future[dict[str, float]] = Future()
    done.set_result(param_norms.norms_now(params))
    return param_norms.Norms(done)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write {part: ms a step} here")
    ap.add_argument("--skip", type=int, default=2, help="steps left out at the start (default 2)")
    ap.add_argument("--norms", choices=("thread", "inline"), default="thread",
                    help="parameter norms on a thread (the loop's way) or inline")  # fmt: skip
    ap.add_argument("command", nargs=argparse.REMAINDER, help="pretrain and its flags")
    args = ap.parse_args()
    if not args.command or args.command[0] != "pretrain":
        ap.error("give the command to clock: pretrain --run NAME ...")
    if args.norms == "inline":
        param_norms.later = inline_norms
    keep_for_reuse()  # as the command does from its own command line (this passes it on)
    clock = clock_the_loop()
    code = birdjepa(args.command)
    ms = per_step_ms(clock, args.skip)
    print(f"\n## The loop's step, part by part: median ms over {len(clock.starts) - 1 - args.skip} steps\n")
    print("| part | ms a step |\n|---|---|")
    for part, value in ms.items():
        print(f"| {part} | {value:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(ms))
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
