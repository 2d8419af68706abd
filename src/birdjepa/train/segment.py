"""What a run segment builds from its config: its data files, its model, its length, and the state it
starts from (a fresh one, or a checkpoint as the ``--prng`` mode keeps it).

`birdjepa pretrain` (`birdjepa.pretrain.loop`) opens a segment with `open_segment` and advances it with
`advance`, and so does every tool that restores or re-executes a run without training it (`birdjepa
evaluate`, `birdjepa trace`, `birdjepa bisect`): they build the same model, restore the same state and
run the same step as the loop, from the same function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import jax
import numpy as np
import optax

from birdjepa import multihost
from birdjepa.config import PretrainConfig
from birdjepa.data import Loader, open_train_loader, resolve_files
from birdjepa.data.shards import VOCAB_FILE, check_same_labels, label_count
from birdjepa.diagnostics.monitor import check_due
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import init_params
from birdjepa.rundir import checkpoint
from birdjepa.seams import planted
from birdjepa.synthetic.demo import ensure_demo_data
from birdjepa.train import state as state_lib
from birdjepa.train.compiled import Compiled, compiled
from birdjepa.train.memory_fit import check_fits
from birdjepa.train.optim import make_optimizer, wsd_decay_start
from birdjepa.train.recording import RecordableStep
from birdjepa.train.state import TrainState
from birdjepa.train.step import StepConfig, fresh_chain, init_key, step_key


def data_files(cfg: PretrainConfig) -> tuple[list[str], list[str]]:
    """The train and eval shards of ``cfg``: the demo set's (built on first use) where no train shards are
    given; no eval shards where train shards are given and eval shards are not (the demo's eval split
    holds other classes). Raises `DataError` where the two splits' labels name different classes."""
    demo = None if cfg.data.train else ensure_demo_data()
    train = resolve_files(cfg.data.train or str(demo / "train"))
    evaluation = cfg.data.eval or (None if cfg.data.train else str(demo / "eval"))
    if evaluation is None:
        return train, []
    held_out = resolve_files(evaluation)
    check_same_labels(train, held_out)
    return train, held_out


def model_config(cfg: PretrainConfig, n_classes: int) -> ModelConfig:
    """The model a run builds: the configured one with the data set's class count (for the probe). Train
    shards without labels (self-supervised on unlabelled audio) get a probe of one class, which no row
    trains (its ``train/probe_ce`` and ``train/probe_acc`` log as 0): a head of none has no output."""
    model = dataclasses.replace(cfg.model, n_classes=max(n_classes, 1))
    return cfg.objective.options.model(model.resolved())


def classes_changed(cfg: PretrainConfig, meta: Mapping[str, Any]) -> str | None:
    """Where the class count of ``cfg``'s train data differs from the one checkpoint ``meta``'s probe was
    built for (a second `prepare` added a class to the folder), what changed, naming the data; else
    None. The probe's shape then differs, and the restore's refusal named a tree leaf, not the data."""
    leaves = meta.get("state_leaves", [])
    saved = [shape for name, shape, _ in leaves if name.endswith("['probe']['head']['bias']")]
    if not saved:
        return None
    train, _ = data_files(cfg)
    now = max(label_count(train), 1)
    if now == saved[0][0]:
        return None
    where = Path(train[0]).parent / VOCAB_FILE
    source = str(where) if where.is_file() else f"the largest label in {Path(train[0]).parent}"
    step = meta.get("step")
    return f"the train data holds {now} classes ({source}), checkpoint {step}'s probe {saved[0][0]}"


def total_updates(cfg: PretrainConfig) -> int:
    """Optimizer updates of the whole run: the LR schedule's length."""
    return max(cfg.steps // cfg.optim.grad_accum, 1)


def start_warnings(cfg: PretrainConfig, n_records: int) -> list[str]:
    """What a fresh start of ``cfg`` on a train split of ``n_records`` says before its first step: options
    allowed (a short try, a small test set) that do not do what they seem to."""
    said = []
    if cfg.optim.warmup_steps >= (updates := total_updates(cfg)):
        said.append(f"--optim.warmup-steps {cfg.optim.warmup_steps} >= the run's {updates} optimizer "
                    f"updates: its LR never reaches --optim.lr {cfg.optim.lr:g}")  # fmt: skip
    elif cfg.optim.schedule == "wsd" and cfg.optim.warmup_steps > (
        start := wsd_decay_start(cfg.optim, updates)
    ):  # the warmup wins over the decay's first updates, then the LR falls off a cliff
        said.append(f"--optim.warmup-steps {cfg.optim.warmup_steps} runs into the wsd decay, which takes "
                    f"the last {cfg.optim.decay_fraction:g} of the {updates} updates (from update {start}): "
                    "the LR drops from its peak at once after the warmup; a shorter warmup or a smaller "
                    "--optim.decay-fraction")  # fmt: skip
    if cfg.data.batch_size > n_records:  # a batch runs on into the next epochs: silent, the same clips twice
        said.append(f"--data.batch-size {cfg.data.batch_size} > the {n_records} records of the train split: "
                    "every batch holds some recordings more than once")  # fmt: skip
    return said


def initial_params(cfg: PretrainConfig, model_cfg: ModelConfig) -> Any:
    """The parameters of step 0 from the seed's init key: the model, with the objective's decoder if it
    has one (the template every restore of the run's checkpoints fills)."""
    return init_params(model_cfg, init_key(cfg), cfg.objective.options.decoder(model_cfg))["params"]


def fresh_state(cfg: PretrainConfig, model_cfg: ModelConfig, tx: optax.GradientTransformation) -> TrainState:
    """The state of step 0: params from the seed's init key, a fresh optimizer state and key chain."""
    params = initial_params(cfg, model_cfg)
    return TrainState(step=0, restart=0, params=params, opt_state=tx.init(params), chain=fresh_chain(cfg))


def state_template(
    cfg: PretrainConfig, model_cfg: ModelConfig, tx: optax.GradientTransformation
) -> dict[str, Any]:
    """The arrays of step 0's state (`TrainState.arrays`) as shapes and dtypes on this process's first
    device, as `fresh_state` places them: what a restore fills. Nothing is computed: a resume has no use
    for the random init, and computing it (the optimizer state op by op) held the interpreter for seconds
    while the step compiled ahead."""
    params, opt_state = jax.eval_shape(lambda: (p := initial_params(cfg, model_cfg), tx.init(p)))
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                        {"params": params, "opt_state": opt_state})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run segment as `open_segment` opens it: what it trains on, with what, and from which state."""

    cfg: PretrainConfig
    model_cfg: ModelConfig
    files: tuple[list[str], list[str]] | None
    """The train and eval shards (None where the class count was given and the data need not be here)."""
    fns: Compiled | None
    """The compiled step (None where not asked for)."""
    state: TrainState
    """The state the segment starts from: step 0's (`fresh_state`), or a checkpoint's as the ``--prng``
    mode keeps it."""
    meta: dict[str, Any] | None
    """That checkpoint's meta (None for a fresh start)."""


def open_segment(
    cfg: PretrainConfig,
    ckpt: checkpoint.Checkpointer | None,
    *,
    at: int | Literal["newest"] | None = "newest",
    n_classes: int | None = None,
    step_fns: bool = True,
    compile_ahead: bool = False,
) -> Segment:
    """The one way a segment is opened, by the loop, by replay (`trace`, `bisect`) and by `evaluate`: the
    data files and their class count (or ``n_classes``, the architecture then coming from the config
    alone), the model, the compiled step (unless not ``step_fns``), and the start state: fresh (``at``
    None), checkpoint ``at``, or the newest that verifies ("newest", fresh where there is none), as the
    ``--prng`` mode keeps it. The same inputs give the same state and step; the loader is
    `open_loader`'s, at the state's loader position. ``compile_ahead``: where steps are left, the step
    compiles in a thread from here on, while the state is built and restored and the caller opens its
    loader and checks the resume (the loop's; `RecordableStep.compile_ahead`). Raises
    `checkpoint.CheckpointError` (a restore), `memory_fit.DoesNotFit` and the data's errors."""
    files = data_files(cfg) if n_classes is None else None
    model_cfg = model_config(cfg, n_classes if files is None else label_count(files[0]))
    fns = compiled(StepConfig.of(cfg, model_cfg), cfg.optim, total_updates(cfg)) if step_fns else None
    tx = fns.tx if fns is not None else make_optimizer(cfg.optim, total_updates(cfg))
    template = state_template(cfg, model_cfg, tx)
    check_fits(template)  # before the step compiles or any array of the state is allocated
    if compile_ahead and fns is not None and isinstance(fns.train_step, RecordableStep):
        newest = ckpt.latest_step() if at == "newest" and ckpt is not None else at
        if (0 if newest is None else newest + 1) < cfg.steps:  # a finished run steps no more
            fns.train_step.compile_ahead(*step_example(cfg, fns, template))
    found = None
    if at is not None and ckpt is None:
        raise ValueError(f"open_segment(at={at!r}) needs the run's checkpoints")
    if at == "newest":
        found = state_lib.restore(ckpt, template)
    elif at is not None:
        found = state_lib.restore_at(ckpt, template, at)
    if found is None:
        return Segment(cfg, model_cfg, files, fns, fresh_state(cfg, model_cfg, tx), None)
    restored, meta = found
    state = state_lib.for_prng_mode(restored, cfg.prng, fresh_chain(cfg))
    return Segment(cfg, model_cfg, files, fns, state, meta)


def step_example(cfg: PretrainConfig, fns: Compiled, template: dict[str, Any]) -> tuple[Any, ...]:
    """The loop's first call of the step, as shapes, dtypes and shardings (a trace of other ones is
    another program), from the config alone: params and optimizer state as ``template``'s
    (`state_template`), replicated; the global batch as the loader gives it (`birdjepa.data.Loader`),
    split over the devices; a step key made on the host's default device, as the loop's; ``check``."""
    state = (template["params"], template["opt_state"])
    views = (cfg.data.n_views,) if cfg.data.n_views > 1 else ()
    frames = (cfg.data.batch_size, *views, cfg.model.n_frames, cfg.model.n_mels)
    label = jax.dtypes.canonicalize_dtype(np.int64)
    batch = {"spectrogram": jax.ShapeDtypeStruct(frames, np.float32, sharding=fns.sharded),
             "label": jax.ShapeDtypeStruct((cfg.data.batch_size,), label, sharding=fns.sharded)}  # fmt: skip
    key = jax.eval_shape(lambda: step_key(cfg, fresh_chain(cfg), 0)[0])
    placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=fns.replicated), state)
    return (*placed, batch, key, False)


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """What step ``state.step`` is called with, besides the state: exactly what the loop passes."""

    batch: dict[str, jax.Array]
    """The batch's arrays on the devices."""
    key: jax.Array
    chain: jax.Array
    """The key chain after this step."""
    check: bool
    """Whether the weight-update monitor measures this step."""


def step_inputs(
    fns: Compiled, cfg: PretrainConfig, state: TrainState, batch: Mapping[str, np.ndarray]
) -> StepInputs:
    step = state.step
    key, chain = step_key(cfg, state.chain, step)
    poison = step in cfg.debug.nonfinite_steps  # --debug.nonfinite-steps: a NaN in its batch
    arrays = fns.on_device(batch, nan=poison)
    # A skipped micro-step leaves the accumulation where it was: updates fall on the micro-steps counted
    # without the skipped (by step number, every check after a skip read every parameter as frozen).
    counted = step - state.skipped
    return StepInputs(arrays, key, chain, check_due(counted, cfg.monitor_interval, cfg.optim.grad_accum))


def advance(
    fns: Compiled, cfg: PretrainConfig, state: TrainState, batch: Mapping[str, np.ndarray]
) -> tuple[TrainState, dict[str, Any], Any, dict[str, Any]]:
    """Step ``state.step`` on ``batch``: the state after it, and its metrics, monitor statistics and
    non-finite guard on the host. A step that is not finite leaves params and optimizer state as they
    were (the guard says so) and counts as skipped."""
    x = step_inputs(fns, cfg, state, batch)
    outputs = fns.train_step(state.params, state.opt_state, x.batch, x.key, x.check)
    return stepped(state, x, outputs)


def stepped(
    state: TrainState, x: StepInputs, outputs: tuple[Any, ...]
) -> tuple[TrainState, dict[str, Any], Any, dict[str, Any]]:
    """`advance`'s result from the step's ``outputs`` on ``x`` (`birdjepa trace` runs the step itself)."""
    params, opt_state, metrics, stats, guard = outputs
    metrics, stats, guard = multihost.host((metrics, stats, guard))
    finite = bool(guard["finite"])  # if not, params and opt_state are the ones given
    state = dataclasses.replace(
        state, step=state.step + 1, params=params, opt_state=opt_state, chain=x.chain,
        skipped=state.skipped + (not finite), skip_streak=0 if finite else state.skip_streak + 1,
    )  # fmt: skip
    return state, metrics, stats, guard


def open_loader(
    cfg: PretrainConfig, train_files: list[str], state: dict[str, Any] | None, *, resumed: bool
) -> tuple[Loader, str | None]:
    """The segment's train loader at ``state`` (see `birdjepa.data.open_train_loader`), through the
    verification wing's seam (`birdjepa.seams.Seams.open_loader`: the loader as is in a real run)."""
    augment = not cfg.debug.disable_stochastic

    def open_at(seed: int, *, fresh: bool = False, **options: Any) -> tuple[Loader, str | None]:
        at, again = (None, False) if fresh else (state, resumed)
        return open_train_loader(
            train_files, cfg.data, seed=seed, augment=augment, state=at, resumed=again, **options
        )

    return planted(cfg.debug.plant).open_loader(open_at, cfg.seed)
