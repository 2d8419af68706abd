"""The pretrain configuration: frozen dataclasses, one group per concern, composed here.

`birdjepa pretrain --help` is generated from these fields and their docstrings (tyro). The options
people type most (`--steps`, `--stop-at-step`, `--resume`, `--debug-roundtrip-steps`, ...) sit at the
top level; the rest are grouped (`--data.batch-size`, `--optim.lr`, `--model.preset`, ...).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from birdjepa.data import DataConfig
from birdjepa.model.config import ModelConfig
from birdjepa.resume.faults import Fault
from birdjepa.train.config import AugmentConfig, LeJepaConfig, OptimConfig


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    kind: Literal["lejepa", "supervised"] = "lejepa"
    """lejepa: invariance + SIGReg on projections; supervised: cross-entropy on labels."""
    lejepa: LeJepaConfig = LeJepaConfig()
    """Invariance + SIGReg (λ = 0.05, the paper's)."""


@dataclasses.dataclass(frozen=True)
class LogConfig:
    runs_dir: Path = Path("runs")
    """Parent folder of run directories."""
    wandb: Literal["disabled", "offline", "online"] = "disabled"
    """Mirror metrics to wandb; the JSON lines in the run directory are the source of truth."""
    wandb_project: str = "birdjepa"
    print_every: int = 10
    """Console line every N steps when stdout is not a terminal (a progress bar when it is)."""


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    run: str = "demo"
    """Run id: the run directory is <log.runs-dir>/<run>."""
    steps: int = 600
    """Micro-steps to train (one loader batch each)."""
    seed: int = 0
    resume: Literal["auto", "never"] = "auto"
    """auto: continue from the newest complete checkpoint of the run directory, if any."""
    stop_at_step: int | None = None
    """Save at this step and exit 0 (a forced preemption: the next start resumes)."""
    prng: Literal["stateless", "checkpointed", "legacy"] = "stateless"
    """stateless: key = fold_in(seed, step); checkpointed: a split chain whose key is saved; legacy: the
    chain restarts from the seed on resume (reproduces the known bug, for experiments)."""
    log_every: int = 1
    """Log the train metrics after every N-th step and the last (the cadence of evaluations and
    checkpoints too), and whenever a diagnostic has a sparse measurement."""
    eval_every: int = 100
    """Frozen-encoder kNN on the held-out split every N steps, and the linear probe at the end (0 = no
    evaluation at all, for runs that only test the machinery)."""
    eval_linear: bool = True
    """The linear probe at the last evaluation (seconds on the demo set, longer on large ones);
    --no-eval-linear: kNN only, and `birdjepa evaluate` probes the checkpoint later."""
    ckpt_every: int = 100
    ckpt_keep: int = 3
    ckpt_async: bool = True
    monitor_interval: int = 10
    """Weight-update monitor (``monitor/...``): in-graph per-parameter statistics every N optimizer
    updates (N x --optim.grad-accum micro-steps; 0 = off)."""
    iid_window: int = 100
    """Batches in the IID loader diagnostics' sliding window (``dataloader/window_unique``)."""
    resume_checks: Literal["error", "warn"] = "error"
    """After a restore, before the first update: error stops the run when a resume check fails; warn
    reports it (RESUME_CHECK lines, resume/... metrics) and goes on."""
    allow_config_change: bool = False
    """Resume even though breaking options (batch size, seed, data, model, optimizer, schedule, steps)
    changed: the config check passes (saying what changed) and the LR check accepts a new schedule. The
    run is then no longer exact; the checks of the state itself still apply."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose loss or gradients hold NaN or inf is never applied. stop: end the run
    there, before anything is saved (exit 70; the last checkpoint is finite); skip: leave params,
    optimizer state and accumulation as they were, count it (train/skipped_updates) and go on."""
    max_skips: int = 10
    """skip: stop (exit 70) after this many skipped updates in a row (0 = never)."""
    debug_roundtrip_steps: tuple[int, ...] = ()
    """After each listed step: save, restore into fresh objects, assert every leaf bit-identical."""
    debug_disable_stochastic: bool = False
    """Centre crops, no masks, no dropout: only the data order remains random."""
    debug_nonfinite_steps: tuple[int, ...] = ()
    """Make the loss of each listed step NaN (a NaN in its batch), to see --on-nonfinite act."""
    debug_inject_fault: Fault | None = None
    """Break the resume on purpose (applied after the restore, before the checks), to see the checks
    catch it; see birdjepa.resume.faults."""
    data: DataConfig = DataConfig()
    augment: AugmentConfig = AugmentConfig()
    """Per-view augmentations applied in the step: pitch/tempo warp (on), gain, spectral tilt and
    background mixing (off)."""
    model: ModelConfig = ModelConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    optim: OptimConfig = OptimConfig()
    log: LogConfig = LogConfig()

    @property
    def run_dir(self) -> Path:
        return self.log.runs_dir / self.run


def to_dict(cfg: Any) -> dict[str, Any]:
    """JSON-able dict of a (nested) config, for checkpoints and comparisons."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, tuple):
            return [plain(x) for x in v]
        return v

    return plain(cfg)


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts to dotted keys (``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``): how config
    differences and sweep overrides name an option."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out
