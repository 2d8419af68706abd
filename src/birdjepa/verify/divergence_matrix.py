"""The divergence matrix: pairs of short runs that differ in exactly one thing, and where `birdjepa
bisect` must place their first difference.

Each pair trains a run A (shared between pairs with the same base options) and its twin B with one
option or one ``--debug.plant`` (`birdjepa.verify.catalogue`) more, then bisects them in this process. The
topology pair trains B in a process of its own on 4 simulated devices. `scripts/divergence_matrix.py`
prints the matrix; the tests assert it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import tyro

from birdjepa.config import PretrainConfig
from birdjepa.divergence.bisect import bisect
from birdjepa.pretrain.loop import pretrain
from birdjepa.rundir import layout
from birdjepa.train.determinism import DEVICE_COUNT_FLAG
from birdjepa.verify.catalogue import EXPECTED_DIFFERENCE, EXPECTED_REGION, LATE_STEP

STEPS = 4


@dataclasses.dataclass(frozen=True)
class Pair:
    name: str
    what: str
    variant: tuple[str, ...]
    """B's options beyond A's."""
    expected: tuple[str, str] | None
    """(stage, tensor or its start) of the first difference; None: none (the clean pair)."""
    base: tuple[str, ...] = ()
    """Options of both runs beyond the matrix's own."""
    devices: int = 1
    """B's device count (A trains on this process's)."""
    step: int = 0
    """The step of the first difference."""
    start: int | None = None
    """The common checkpoint bisect must start from (None: the runs' start)."""
    region: str = ""
    """A piece of the verdict that says where in the code the difference arose."""


def _plant(name: str, what: str, base: tuple[str, ...] = ()) -> Pair:
    return Pair(name, what, ("--debug.plant", name), EXPECTED_DIFFERENCE[name], base,
                region=EXPECTED_REGION.get(name, ""))  # fmt: skip


PAIRS = (
    _plant("lr_schedule_shifted", "the LR schedule shifted by one update"),
    _plant("first_update_at_peak", "the first update at the peak LR instead of schedule(0)"),
    _plant("pos_embed_bf16", "one parameter (the position embedding) computed in bfloat16"),
    Pair(
        "ln_epsilon",
        "another LayerNorm epsilon (1e-5)",
        ("--model.ln-epsilon", "1e-5"),
        ("forward", "global/encoder/block_0/norm1"),
        region="the module itself differs",
    ),  # fmt: skip
    _plant("loader_seed", "other samples in the batch (another loader seed)"),
    _plant("batch_reordered", "the same samples in another order"),
    _plant("crop_shifted", "another crop offset for one sample"),
    Pair(
        "crop_shifted_late",
        f"another crop offset for one sample first drawn at step {LATE_STEP} (agree until then)",
        ("--debug.plant", "crop_shifted_late"),
        EXPECTED_DIFFERENCE["crop_shifted_late"],
        base=("--steps", str(LATE_STEP + 2), "--ckpt-every", "2"),
        step=LATE_STEP,
        start=LATE_STEP - 1,  # checkpoints after steps 1 and 3 agree; the one after step 5 does not
    ),
    _plant("dropout_key_folded", "another dropout key (dropout 0.1 in both)", ("--model.dropout", "0.1")),
    Pair(
        "clip_norm",
        "gradient clipping at another threshold (0.3)",
        ("--optim.clip-norm", "0.3"),
        ("gradients_clipped", ""),
    ),  # fmt: skip
    _plant("decay_skips_biases_and_norms", "weight decay on biases and norms in one run only"),
    _plant("mlp_between_fc1_and_fc2", "a code change in Mlp between fc1 and fc2 (its activation)"),
    _plant("block_residual_scale", "a residual scale on a block's MLP branch (its drop-path's 2nd call)"),
    _plant(
        "decoder_input_scaled",
        "MAE: a code change in the decoder before its first layer",
        ("--objective.kind", "mae"),
    ),  # fmt: skip
    # Each device's forward pass is its rows' alone: the first stage that adds across the devices is
    # the loss (at XLA's default level; at -O0 the forward's kernels already differ by batch shape).
    Pair("devices", "1 device against 4 simulated devices", (), ("loss", ""), devices=4),
    Pair(  # its twin: the device count changes nothing with virtual shards (birdjepa.train.virtual_shards)
        "devices_virtual_shards",
        "1 device against 4, both with --train.virtual-shards 4",
        (),
        None,
        base=("--train.virtual-shards", "4"),
        devices=4,
    ),
    Pair("clean", "the same run twice", (), None),
)


@dataclasses.dataclass(frozen=True)
class Row:
    pair: Pair
    exit_code: int
    step: int | None
    found: tuple[str, str] | None
    verdict: str
    start: int | None = None
    """The common checkpoint bisect started from (None: step 0)."""
    report: str = ""
    """Bisect's whole report."""

    @property
    def ok(self) -> bool:
        if self.pair.expected is None:
            return self.exit_code == 0 and self.found is None
        if self.found is None or self.found[0] != self.pair.expected[0]:
            return False
        where = (self.step, self.start) == (self.pair.step, self.pair.start)
        if not where or self.pair.region not in self.verdict:
            return False
        if self.pair.devices != 1:  # a topology difference must be called one, not a bug
            return "topology" in self.verdict and "not a bug" in self.verdict
        return self.found[1].startswith(self.pair.expected[1])


def flags(runs: Path, run: str, data: tuple[str, ...], *extra: str) -> list[str]:
    return [
        "--run", run, "--log.runs-dir", str(runs), "--steps", str(STEPS), "--ckpt-every", "0",
        "--eval-every", "0", "--data.batch-size", "4", "--monitor-interval", "0", *data, *extra,
    ]  # fmt: skip


def train(runs: Path, run: str, data: tuple[str, ...], options: tuple[str, ...], devices: int = 1) -> Path:
    """A run of the matrix, trained afresh (in a process of its own when on other devices)."""
    args = flags(runs, run, data, *options)
    shutil.rmtree(runs / run, ignore_errors=True)
    if devices == 1:
        code = pretrain(tyro.cli(PretrainConfig, args=args))
    else:
        # This process's XLA flags too: its optimisation level and the twin's must be the same.
        xla = f"{os.environ.get('XLA_FLAGS', '')} {DEVICE_COUNT_FLAG}={devices}"
        env = {**os.environ, "XLA_FLAGS": xla.strip()}
        done = subprocess.run([sys.executable, "-m", "birdjepa.cli", "pretrain", *args], env=env,
                              capture_output=True, text=True)  # fmt: skip
        code = done.returncode
    if code != 0:
        raise RuntimeError(f"training {run} ({' '.join(options)}) exited {code}")
    return runs / run


def run_pair(pair: Pair, runs: Path, data: tuple[str, ...] = (), whole_first: bool | None = None) -> Row:
    """Train the pair (run A once for all pairs that share it) and bisect it (``whole_first``: see
    `birdjepa.divergence.bisect.bisect`)."""
    a = runs / (f"A-{pair.name}" if pair.base else "A")
    if not layout.config_file(a).exists():
        train(runs, a.name, data, pair.base)
    b = train(runs, f"B-{pair.name}", data, (*pair.base, *pair.variant), pair.devices)
    code, report, d = bisect(a, b, whole_first=whole_first)
    first = d.first if d is not None else None
    found = (first.stage, first.name) if first is not None else None
    step = None if d is None else d.steps[0]
    verdict = report.rsplit("VERDICT: ", 1)[-1] if "VERDICT: " in report else report.splitlines()[-1]
    origin = re.search(r"side by side from checkpoint (\d+)", report)
    return Row(pair, code, step, found, verdict, int(origin.group(1)) if origin else None, report)


def run_matrix(runs: Path, pairs: tuple[Pair, ...] = PAIRS, data: tuple[str, ...] = ()) -> list[Row]:
    return [run_pair(p, runs, data) for p in pairs]


def format_matrix(rows: list[Row]) -> str:
    """The matrix as a markdown table: the pair, where the first difference must be, where bisect put it."""
    lines = [
        "| pair | expected (step, stage: tensor) | found (step, stage: tensor) | ok |",
        "|---|---|---|---|",
    ]
    for r in rows:
        exp = (f"step {r.pair.step}, {r.pair.expected[0]}: {r.pair.expected[1] or '(any)'}"
               if r.pair.expected else "no difference")  # fmt: skip
        found = f"step {r.step}, {r.found[0]}: {r.found[1]}" if r.found else "no difference"
        if r.pair.start is not None:  # a late pair: where bisect must start, and where it did
            exp += f", from checkpoint {r.pair.start}"
            found += f", from checkpoint {r.start}"
        lines.append(f"| {r.pair.what} | {exp} | {found} | {'yes' if r.ok else 'MISS'} |")
    return "\n".join(lines)
