"""The training step that can record itself: `birdjepa trace`'s record is the training executable's own.

The default step is built once as ``(params, opt_state, batch, key, check, record)``: the training step
(`make_train_step` over a recording loss), and beside it a `birdjepa.train.digest.summary` of every
tensor the step computed on the way, in the order it computed them, in ``lax.cond``s on ``record``
(`RecordableStep`). The loop runs it with ``record`` False, and `birdjepa trace` runs the same
executable with ``record`` True: the recorded digests are the training step's own tensors by
construction, at any optimisation level and dtype, and its outputs are the training step's because
they are the same computation.

One cond per stage and transformer block (`group`): XLA compiles a cond's operands as buffers the
cond reads when it runs, so a block's summaries run once its last tensor exists, and its tensors die
when their other consumers are done with them. One cond over every tensor kept them all alive to the
end of the step (XLA's working memory 4.9x at the small preset, `scripts/bench_record.py`); a cond per
tensor kept none, but on a GPU each cond costs the step time while the device waits (an H200, the small
step at batch 128 in bfloat16, jaxlib 0.11.2: 476 conds, 35.2 ms a step with the device busy for 18.2
of them, against 18.5 ms without the record).

What a summary holds: a digest and five statistics, and the whole tensor only where it is small
(`birdjepa.train.digest.SMALL`). Whole tensors (``--keep``) cannot come from the training executable,
whose outputs are fixed: `birdjepa.divergence.recording_apart` records them.
"""

from __future__ import annotations

import fnmatch
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from birdjepa.config import OptimConfig
from birdjepa.train.digest import summary
from birdjepa.train.step import StepConfig, make_loss_fn, make_train_step, ordered_leaves

#: ``(stage, name, shape, dtype)`` of each recorded tensor, in the order the step computed them.
Computed = list[tuple[str, str, tuple[int, ...], str]]


def leaves(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` in `jax.tree` order, named as the checkpoint names them (``['encoder']...``)."""
    return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def matches(key: str, patterns: Sequence[str]) -> bool:
    """Whether ``stage/name`` matches any of ``patterns`` (fnmatch; a bare stage name means all of it)."""
    return any(fnmatch.fnmatchcase(key, p if any(c in p for c in "*?[/") else f"{p}/*") for p in patterns)


def computed(trace: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``(stage, name, tensor)`` of what the recording step computed, in the order it computed them:
    sub-keys, draws and module calls (as the loss function recorded them), loss terms, gradients,
    clipped gradients, updates."""
    out = [(*k.split("|", 1)[1].split("/", 1), v) for k, v in sorted(trace.items()) if "|" in k]
    out += [("loss", name.lstrip("/"), v) for name, v in ordered_leaves(trace.get("loss", {}), "")]
    for stage in ("gradients", "gradients_clipped", "updates"):
        out += [(stage, name, v) for name, v in leaves(trace.get(stage, {}))]
    return out


def when(record: jax.Array, summarize: Callable[[Any], Any], x: Any) -> Any:
    """``summarize(x)`` in a ``lax.cond`` of its own on ``record`` (zeros where not; see the module doc)."""
    shapes = jax.eval_shape(summarize, x)  # `summary` is jitted: traced once per shape and dtype

    def off(v: Any) -> Any:
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

    with jax.named_scope("record"):  # the step's profile attributes these conds (birdjepa.perf.profile)
        return jax.lax.cond(record, summarize, off, x)


#: The part of a recorded tensor's name up to its transformer block: ``global/encoder/block_3`` (a module
#: call) or ``['encoder']['block_3`` (a parameter's gradient, clipped gradient or update).
BLOCK = re.compile(r"^.*?block_\d+")


def group(stage: str, name: str) -> tuple[str, str]:
    """The cond a tensor's summary goes in: one per stage and transformer block, and one for the rest of
    each stage (see `summaries`); the gradients all in one, since they all exist before the update
    (measured at the small preset when each tensor had a cond: 558 MiB of XLA working memory with the
    gradients in one, 587 with a cond each)."""
    if stage == "gradients":
        return stage, ""
    block = BLOCK.match(name)
    return stage, block.group(0) if block else ""


def summaries(
    trace: dict[str, Any], record: jax.Array, names: Computed, keep: Sequence[str] = ()
) -> list[dict[str, jax.Array]]:
    """A summary of each tensor in a recording step's ``trace`` (`computed`), whole where ``keep``
    matches; fills ``names`` (at trace time).

    One cond per stage and transformer block (`group`; see the module doc for why). A block's tensors
    exist together anyway (its activations wait for the backward pass; its clipped gradients and updates
    for the optimizer), so holding them until the block's cond runs costs little memory. A
    module's input is often the output recorded just before it (the same traced value): summarized
    once, in the first one's cond."""
    items = computed(trace)
    names[:] = [(s, n, tuple(v.shape), np.dtype(v.dtype).name) for s, n, v in items]
    keys = [(id(v), matches(f"{s}/{n}", keep)) for s, n, v in items]  # one summary per traced value
    first: dict[tuple[int, bool], tuple[jax.Array, bool]] = {}  # each key's tensor, where it first shows
    groups: dict[tuple[str, str], list[tuple[int, bool]]] = {}
    for (s, n, v), key in zip(items, keys, strict=True):
        if key not in first:
            first[key] = (v, key[1])
            groups.setdefault(group(s, n), []).append(key)
    made: dict[tuple[int, bool], dict[str, jax.Array]] = {}
    for group_keys in groups.values():
        made.update(zip(group_keys, summaries_when(record, [first[k] for k in group_keys]), strict=True))
    return [made[key] for key in keys]


def summaries_when(record: jax.Array, members: list[tuple[jax.Array, bool]]) -> list[dict[str, jax.Array]]:
    """The `summary` of each ``(tensor, whole)`` of ``members``, all in one cond on ``record`` (`when`)."""
    wholes = [whole for _, whole in members]

    def summarized(vs: list[jax.Array]) -> list[dict[str, jax.Array]]:
        return [summary(v, whole=whole) for v, whole in zip(vs, wholes, strict=True)]

    return when(record, summarized, [v for v, _ in members])


def recordable(
    spec: StepConfig, tx: optax.GradientTransformation, optim: OptimConfig, keep: Sequence[str] = ()
) -> tuple[Callable, Computed]:
    """The training step of ``spec`` over a recording loss as ``(params, opt_state, batch, key, check,
    record) -> (params, opt_state, metrics, stats, guard, summaries)`` (whole where ``keep`` matches), and
    the names of its summaries (known once it has been traced)."""
    step = make_train_step(make_loss_fn(spec, record=True), tx, clip_norm=traced_clip(optim))
    names: Computed = []

    def run(*args: Any) -> tuple[Any, ...]:
        *inputs, record = args
        *out, trace = step(*inputs)
        return (*out, summaries(trace, record, names, keep))

    return run, names


def traced_clip(optim: OptimConfig) -> float:
    """The norm the record's clipped gradients are clipped at: the optimizer's, where it clips each
    step's gradients (accumulating, it clips only the summed ones at the update)."""
    return optim.clip_norm if optim.grad_accum == 1 else 0.0


class RecordableStep:
    """The default training step (``jitted``: `recordable`'s function, jitted): called as the loop calls
    a step, ``(params, opt_state, batch, key, check) -> (params, opt_state, metrics, stats, guard)``,
    it records nothing; `recorded` runs the same executable recording. Both donate params and
    optimizer state."""

    def __init__(self, jitted: Callable, names: Computed) -> None:
        self.jitted, self.computed = jitted, names
        self.called = False
        self._ahead: threading.Thread | None = None

    def compile_ahead(self, *example: Any) -> None:
        """Trace and lower the step for ``example``'s shapes here, then compile it (or load it from the
        persistent compilation cache) in a thread, while the caller does its other set-up: the first
        call waits for it and finds the executable built, the one it would have built itself (the same
        program and options; JAX keeps it for the jitted function). Nothing once the step has run in
        this process. Where ``example`` is not what the first call passes, that call compiles its own:
        time lost, nothing else. The trace and lowering are Python: in the thread they took turns on
        the interpreter with the caller's restore, and all of the compile's time waited for them. Not a
        daemon thread: a process that ends without stepping (a refused resume) waits for it, since one
        killed inside XLA's compiler at exit crashed (SIGSEGV)."""
        if self.called or self._ahead is not None:
            return
        try:
            lowered = self.jitted.lower(*example, False)
        except Exception:  # the first call meets the same error and reports it
            return

        def build() -> None:
            try:
                lowered.compile()
            except Exception:  # as above
                pass

        self._ahead = threading.Thread(target=build, name="compile-ahead")
        self._ahead.start()

    def _ready(self) -> None:
        if self._ahead is not None:  # two compiles of one step at once would both run in full
            self._ahead.join()
            self._ahead = None
        self.called = True

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        self._ready()
        return self.jitted(*args, False)[:5]

    def recorded(self, *args: Any) -> tuple[tuple[Any, ...], list[dict[str, jax.Array]]]:
        """The step's outputs, and the summary of each tensor it computed (named by `computed`)."""
        self._ready()
        *out, record = self.jitted(*args, True)
        return tuple(out), record
