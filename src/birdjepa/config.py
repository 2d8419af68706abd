"""The pretrain configuration: frozen dataclasses, one group per concern, composed here (no JAX).

The training recipe's groups (optimizer, view augmentations) are defined here; the data's, the
model's and the objectives' come from `birdjepa.data`, `birdjepa.model.config` and
`birdjepa.objectives.options`. Their ranges are checked
by `birdjepa.validation`.

`birdjepa pretrain --help` is generated from these fields and their docstrings (tyro). The options
people type most (`--steps`, `--stop-at-step`, `--resume`, `--debug.roundtrip-steps`, ...) sit at the
top level; the rest are grouped (`--data.batch-size`, `--optim.lr`, `--model.preset`, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from birdjepa.data import DataConfig
from birdjepa.model.config import ModelConfig
from birdjepa.objectives.options import ObjectiveConfig


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    gain_db: float = 0.0
    """Per-view gain, uniform in ±gain_db dB (0 = off)."""
    tilt_db: float = 0.0
    """Per-view spectral tilt: from -t to +t dB across the mel bands, t uniform in ±tilt_db (0 = off)."""
    mix_prob: float = 0.0
    """Probability that a view gets another recording of the batch mixed in behind it (0 = off)."""
    mix_db: tuple[float, float] = (-20.0, -5.0)
    """Level of the mixed-in recording relative to the view, uniform in this range (dB)."""
    noise_db: float = 0.0
    """Per-view added stationary noise with the view's own noise-floor spectrum, at uniform [0,
    noise_db] dB above that floor (0 = off): the recording's signal-to-noise ratio, which the
    encoder otherwise keeps as a feature both views share, differs between views."""
    pitch_bins: float = 2.0
    """Per-view frequency shift, uniform in ±pitch_bins mel bins (0 = off): one singer sings higher
    than another, so the exact pitch of a recording is not a feature to keep."""
    stretch: float = 0.1
    """Per-view time stretch by a factor uniform in [1 / (1 + s), 1 + s] (0 = off): tempo varies by
    singer too."""

    @property
    def active(self) -> bool:
        on = (self.gain_db, self.tilt_db, self.mix_prob, self.noise_db, self.pitch_bins, self.stretch)
        return any(x > 0 for x in on)


NO_AUGMENT = AugmentConfig(pitch_bins=0.0, stretch=0.0)
"""Every augmentation off (the defaults warp pitch and tempo): ``--debug.disable-stochastic``."""


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: Literal["adamw", "muon"] = "adamw"
    """adamw, or muon (optax.contrib.muon; AdamW for non-matrix parameters)."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.05
    """Decoupled weight decay (AdamW's; muon's, and its AdamW part's)."""
    b1: float = 0.9
    """Adam's first-moment decay (muon: its AdamW part's, for the parameters that are not matrices)."""
    b2: float = 0.999
    """Adam's second-moment decay (muon: its AdamW part's)."""
    schedule: Literal["cosine", "wsd"] = "cosine"
    """cosine: linear warmup then cosine decay; wsd: warmup, stable, then linear decay."""
    warmup_steps: int = 10
    """Optimizer updates (not steps: with --optim.grad-accum N, N steps each) of linear warmup to the peak."""
    decay_fraction: float = 0.2
    """wsd only: the fraction of all updates, warmup included, spent decaying at the end (0: none, the
    LR stays at its peak); a warmup that runs into it is said at the start."""
    min_lr_ratio: float = 0.0
    """Final LR as a fraction of the peak."""
    clip_norm: float = 1.0
    """Global-norm gradient clipping (0 = off); the online probe's gradients are clipped apart."""
    grad_accum: int = 1
    """Micro-batches per optimizer update."""
    probe_lr_scale: float = 100.0
    """LR multiplier of the online probe head: a linear probe on a moving encoder needs a much faster
    LR than the encoder to converge within a short run (demo defaults, 600 steps: held-out accuracy
    0.33 at x100, 0.27 at x30)."""


@dataclasses.dataclass(frozen=True)
class LogConfig:
    runs_dir: Path = Path("runs")
    """Parent folder of run directories."""
    wandb: Literal["disabled", "offline", "online"] = "disabled"
    """Mirror metrics to wandb; the JSON lines in the run directory are the source of truth."""
    wandb_project: str = "birdjepa"
    """The wandb project the run is mirrored to (with --log.wandb offline or online)."""
    print_every: int = 10
    """Console line every N steps when stdout is not a terminal (a progress bar when it is)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    virtual_shards: int = 0
    """Cut each batch into this many shards by position (0 = off, the default step): the step computes
    them one at a time, each at the same shape, and adds what they give in one fixed order, so the run
    is bit-identical on every device count that divides it (and a step can be re-executed on one
    device). Must divide --data.batch-size; a breaking change for a resume."""


@dataclasses.dataclass(frozen=True)
class DebugConfig:
    """What the verification harness does to a run on purpose, to see the harness catch it: one group,
    so the options a user trains with stay apart from them. None is active by default."""

    roundtrip_steps: tuple[int, ...] = ()
    """After each listed step: save, restore into fresh objects, assert every leaf bit-identical."""
    disable_stochastic: bool = False
    """Centre crops, no augmentation, no dropout or drop-path, and the loss's draws (local crops, span
    masks, SIGReg's directions) the same at every step: only the data order remains random."""
    nonfinite_steps: tuple[int, ...] = ()
    """Make the loss of each listed step NaN (a NaN in its batch), to see --on-nonfinite act."""
    inject_fault: str | None = None
    """Break the resume on purpose (applied after the restore, before the checks), to see the checks
    catch it: a fault of birdjepa.verify.catalogue (another name is refused, with the list)."""
    plant: str | None = None
    """Make this run differ from its twin in one planted thing (to see `birdjepa bisect` find it): one
    of birdjepa.verify.catalogue's plants (another name is refused, with the list)."""


RENAMED = {f"debug_{f.name}": f"debug.{f.name}" for f in dataclasses.fields(DebugConfig)}
"""Options under the names configs recorded before they moved into a group (checkpoints' meta,
config.json, export cards): `flatten` reads them under their new names."""


#: Seeds a key tells apart: JAX (64-bit numbers off) keeps a seed's low 32 bits, so seeds 0 and 2^32
#: drew one run's initial weights and one probe's fit.
SEED_LIMIT = 2**32


@dataclasses.dataclass(frozen=True)
class PretrainConfig:
    run: str = "demo"
    """Run id: the run directory is <log.runs-dir>/<run>."""
    steps: int = 600
    """Micro-steps to train (one loader batch each)."""
    seed: int = 0
    """Below 2^32: a key keeps 32 bits of it (a run that trained with a larger one goes on as it was)."""
    resume: Literal["auto", "never"] = "auto"
    """auto: continue from the newest complete checkpoint of the run directory, if any; never: start
    fresh, refusing a run directory that already holds a run (its checkpoints or log)."""
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
    """A checkpoint after every N steps and after the last (0 = after the last only); a SIGTERM, SIGUSR1 or
    Ctrl-C saves at the end of its step whatever N is."""
    ckpt_keep: int = 3
    """The newest N checkpoints are kept, and the newest one that verifies even if older; the rest are
    removed."""
    ckpt_async: bool = True
    """Write checkpoints in the background while training goes on (--no-ckpt-async: the loop waits)."""
    monitor_interval: int = 10
    """Weight-update monitor (``monitor/...``): in-graph per-parameter statistics every N optimizer
    updates (N x --optim.grad-accum micro-steps; 0 = off)."""
    iid_window: int = 100
    """Batches in the IID loader diagnostics' sliding window (``dataloader/window_unique``)."""
    resume_checks: Literal["error", "warn"] = "error"
    """After a restore, before the first update: error stops the run when a resume check fails; warn
    reports it (RESUME_CHECK lines, resume/... metrics) and goes on."""
    allow_config_change: bool = False
    """Resume even though breaking options (the optimizer, the schedule, steps, the objective's weights,
    augmentation, model options the state's shape allows) changed: the config check passes (saying what
    changed), the LR check accepts a new schedule, and the next step's loss and gradients, recorded under
    the old options, are not compared where a change moves them (all but the optimizer's). The run is
    then no longer exact; the checks of the state itself still apply, so options that lay out the data
    stream or the step keys (batch size, seed, --prng, shuffling, views, features) and the gradient
    accumulation still cannot change within a run."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose loss or gradients hold NaN or inf is never applied. stop: end the run
    there, before anything is saved (exit 70; the last checkpoint is finite); skip: leave params,
    optimizer state and accumulation as they were, count it (train/skipped_updates) and go on."""
    max_skips: int = 10
    """skip: stop (exit 70) after this many skipped updates in a row (0 = never)."""
    data: DataConfig = DataConfig()
    augment: AugmentConfig = AugmentConfig()
    """Per-view augmentations applied in the step: pitch/tempo warp (on), gain, spectral tilt and
    background mixing (off)."""
    model: ModelConfig = ModelConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    optim: OptimConfig = OptimConfig()
    train: TrainConfig = TrainConfig()
    log: LogConfig = LogConfig()
    debug: DebugConfig = DebugConfig()
    """The verification harness's actions on the run (`birdjepa.verify`): none unless asked for."""

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


def flatten(tree: Mapping[str, Any], prefix: str = "", *, where: str | None = None) -> dict[str, Any]:
    """Nested dicts to dotted keys (``{"optim": {"lr": 1}}`` -> ``{"optim.lr": 1}``): how config
    differences and sweep overrides name an option; an option recorded under an old name (`RENAMED`)
    comes out under its new one. ``where`` (a sweep config's, written by hand): `ConfigError` for a key
    that is no name, an empty dict (it set nothing: the run took the defaults) or an option set twice
    (``optim.lr`` beside ``optim: {lr}``: one was dropped)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if where is not None and (not isinstance(k, str) or not k):
            raise ConfigError(f"{where}: {prefix}{k!s} is no option name ({k!r})")
        if where is not None and isinstance(v, Mapping) and not v:
            raise ConfigError(f"{where}: {prefix}{k} is an empty dict, which sets nothing")
        if isinstance(v, Mapping):
            inner = flatten(v, f"{prefix}{k}.", where=where)
        else:
            inner = {RENAMED.get(prefix + k, prefix + k): v}
        twice = out.keys() & inner.keys()
        if where is not None and twice:
            raise ConfigError(f"{where}: {min(twice)} is set twice")
        out.update(inner)
    return out


# ------------------------------------------------------------------------------ dicts into configs
T = TypeVar("T")


class ConfigError(ValueError):
    """A dict does not describe a config (the message names where it came from and the key)."""


def type_ok(value: Any, hint: Any) -> bool:
    """Whether ``value`` (from JSON or a sweep file) can be a field annotated ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(type_ok(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if len(args) == 2 and args[1] is Ellipsis or not args:  # tuple[int, ...]: any length
            return all(type_ok(v, args[0] if args else Any) for v in value)
        # tuple[float, float]: three values passed, and the job's command line was tyro's usage box
        return len(value) == len(args) and all(type_ok(v, a) for v, a in zip(value, args, strict=True))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is Path:
        return isinstance(value, (str, Path))
    if isinstance(hint, type):
        return isinstance(value, hint)
    return False


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, resolved once: `typing.get_type_hints` compiles every annotation string
    anew at each call (a resume resolves ~150 recorded options: a third of a second)."""
    return typing.get_type_hints(cls)


def _replace(obj: Any, path: list[str], value: Any, where: str, key: str) -> Any:
    """``obj`` (a frozen dataclass) with the field at ``path`` set to ``value``, type-checked."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    name = path[0]
    if name not in fields:
        options = ", ".join(sorted(fields))
        raise ConfigError(f"{where}: unknown key {key!r} ({name!r} is not one of: {options})")
    hint = _hints(type(obj))[name]
    current = getattr(obj, name)
    if len(path) > 1:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"{where}: unknown key {key!r} ({name!r} has no sub-options)")
        return dataclasses.replace(obj, **{name: _replace(current, path[1:], value, where, key)})
    if dataclasses.is_dataclass(current):
        raise ConfigError(f"{where}: key {key!r} is a group; set its fields ({key}.<field>)")
    if not type_ok(value, hint):
        raise ConfigError(f"{where}: key {key!r} = {value!r} has the wrong type (expected {hint})")
    if isinstance(value, list):
        value = tuple(value)
    if hint is Path:
        value = Path(value)
    return dataclasses.replace(obj, **{name: value})


#: Options added since a config could be recorded whose default is not what a config recorded
#: without them ran with: such a config reads as this value (`recorded`). Every other option added
#: since reads as its default, which kept the behaviour runs had before it.
BEFORE_IT_EXISTED: dict[str, Any] = {
    # MP3 and Vorbis were decoded with the codec's delay and padding (an MP3 1105 samples late).
    "data.features.gapless": False,
}


def before_it_existed(group: str = "") -> dict[str, Any]:
    """`BEFORE_IT_EXISTED`'s options of ``group`` (a dotted prefix, as ``"data.features."``), named
    within it."""
    return {k.removeprefix(group): v for k, v in BEFORE_IT_EXISTED.items() if k.startswith(group)}


def recorded(saved: Mapping[str, Any], group: str = "") -> dict[str, Any]:
    """``saved`` (a config as a checkpoint, a config.json or an encoder card records it; ``group``: the
    dotted name of the group it is, as ``"data.features."``) flattened, each `BEFORE_IT_EXISTED` option
    of the group that it lacks at the value its run had."""
    flat = flatten(saved)
    if not flat:  # nothing recorded (a config that could not be read) says nothing of how it ran
        return flat
    return {**before_it_existed(group), **flat}


def as_recorded(
    saved: Mapping[str, Any], where: str, leave_out: tuple[str, ...] = ()
) -> tuple[PretrainConfig, dict[str, Any]]:
    """The config a checkpoint recorded (``saved``, at ``where``) over this birdjepa's defaults, and the
    recorded options it kept: an option added since reads as its default (what the run trained with),
    or as `BEFORE_IT_EXISTED` says; those this birdjepa no longer has, and ``leave_out``, are left out.
    A value of another type raises `ConfigError`."""
    defaults = flatten(to_dict(PretrainConfig()))
    kept = {k: v for k, v in recorded(saved).items() if k not in leave_out and k in defaults}
    return resolve(PretrainConfig(), kept, where), kept


def resolve(base: T, overrides: Mapping[str, Any], where: str) -> T:
    """``base`` (a frozen dataclass) with ``overrides`` set: nested dicts or dotted keys
    (``{"optim": {"lr": 1e-3}}`` or ``{"optim.lr": 1e-3}``), each type-checked against its field.
    Raises `ConfigError` naming ``where`` and the key. The one way a dict becomes a config: sweep
    files, configs recorded in checkpoints, exported encoder cards."""
    cfg = base
    for key, value in flatten(overrides).items():
        cfg = _replace(cfg, key.split("."), value, where, key)
    return cfg
