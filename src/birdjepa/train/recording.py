"""The training step that can record itself: `birdjepa trace`'s record is the training executable's own.

The default step is built once as ``(params, opt_state, batch, key, check, record)``: the training step
(`make_train_step` over a recording loss), and beside it a `birdjepa.train.digest.summary` of every
tensor the step computed on the way, in the order it computed them, each in a ``lax.cond`` on
``record`` of its own (`RecordableStep`). The loop runs it with ``record`` False, and `birdjepa trace`
runs the same executable with ``record`` True: the recorded digests are the training step's own
tensors by construction, at any optimisation level and dtype, and its outputs are the training step's
because they are the same computation.

A cond per tensor, not one cond over all of them: XLA compiles a cond's operand as a buffer the cond
reads when it runs, so each summary runs as soon as its tensor exists and the tensor dies when its
other consumers are done with it. One cond over every tensor kept them all alive to the end of the step
(XLA's working memory 4.9x at the small preset; a cond per tensor 1.00x, `scripts/bench_record.py`).

What a summary holds: a digest and five statistics, and the whole tensor only where it is small
(`birdjepa.train.digest.SMALL`). Whole tensors (``--keep``) cannot come from the training executable,
whose outputs are fixed: `birdjepa.divergence.recording_apart` records them.
"""

from __future__ import annotations

import fnmatch
import functools
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


def summaries(
    trace: dict[str, Any], record: jax.Array, names: Computed, keep: Sequence[str] = ()
) -> list[dict[str, jax.Array]]:
    """A summary of each tensor in a recording step's ``trace`` (`computed`), whole where ``keep``
    matches; fills ``names`` (at trace time)."""
    items = computed(trace)
    names[:] = [(s, n, tuple(v.shape), np.dtype(v.dtype).name) for s, n, v in items]
    # A module's input is often the output recorded just before (the same traced value): one cond for
    # both, which cuts what XLA compiles. The gradients all exist together before the update: one cond
    # for all of them (measured at the small preset: 558 MiB of XLA working memory against 587 with a
    # cond each; the updates and clipped gradients in one cond each: 1358).
    made: dict[tuple[int, bool], dict[str, jax.Array]] = {}
    together = [(v, matches(f"{s}/{n}", keep)) for s, n, v in items if s == "gradients"]
    if together:

        def summarized(vs: list[jax.Array]) -> list[dict[str, jax.Array]]:
            return [summary(v, whole=whole) for v, (_, whole) in zip(vs, together, strict=True)]

        for (v, whole), r in zip(together, when(record, summarized, [v for v, _ in together]), strict=True):
            made[id(v), whole] = r
    out = []
    for s, n, v in items:
        whole = matches(f"{s}/{n}", keep)
        if (id(v), whole) not in made:
            made[id(v), whole] = summary_when(record, v, whole=whole)
        out.append(made[id(v), whole])
    return out


@functools.partial(jax.jit, static_argnames="whole", inline=True)
def summary_when(record: jax.Array, x: jax.Array, *, whole: bool) -> dict[str, jax.Array]:
    """`summary` of ``x`` in a cond of its own on ``record`` (`when`). Jitted and inlined, as `summary`
    is: the cond is traced once per shape and dtype, not once per tensor (a step's tensors come in a
    few dozen shapes), which is what most of a step's trace spent on its records."""
    return when(record, functools.partial(summary, whole=whole), x)


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
