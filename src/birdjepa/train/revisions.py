"""The step's revisions: each a declared change of bits the step computes from the same inputs, with the
same flags, on the same kind of machine.

A change to the default step either keeps every bit it computes (tests/test_objectives.py holds two
steps of three objectives to the digests the code before objectives became units computed, LeJEPA's
at XLA's default level too), or it is
declared here as the next revision. Every checkpoint records the revision of the code that wrote it
(``REVISION``; a checkpoint without the record was written at revision 1). A resume by code of another
revision says which changes lie between the two, and where one of them moves the training's bits (the
parameters, the optimizer state, the loss) and not only a diagnostic's, the resume checks compare the
next step's loss to a tolerance, as on another kind of machine. A revision that moves the bits of
some runs only (``applies``) leaves the others' resume exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from birdjepa import _rs

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Revision:
    what: str
    #: Whether it moves the training's bits, or only what the step reports about them.
    training: bool
    #: Logged metrics it gave another meaning (a name ending in "/": every metric under it): a run that
    #: crosses it is not compared with the old code's run, nor with this code's, on them.
    redefines: tuple[str, ...] = ()
    #: The runs (`birdjepa.config.PretrainConfig`) whose bits it moves, or whose metrics it redefines;
    #: None: every run.
    applies: Callable[[Any], bool] | None = None


def has_idle_params(cfg: Any) -> bool:
    """Whether the run's objective builds parameters no loss reads (MAE's projector)."""
    return bool(cfg.objective.options.IDLE_PARAMS)


def recomputes_heads(cfg: Any) -> bool:
    """Whether the run recomputes blocks besides the encoder's: ``--model.remat`` with a predictor or a
    decoder with blocks (MAE's)."""
    model, decoder = cfg.model.resolved(), cfg.objective.options.decoder(cfg.model)
    return bool(model.remat and (model.predictor_depth or (decoder is not None and decoder.depth)))


#: Revision ``i + 1`` is ``REVISIONS[i]``; the first is the step before revisions were recorded.
REVISIONS = (
    Revision("the step as it was before revisions were recorded", training=False),
    Revision(
        "the update monitor reduces each parameter once for its five statistics (2026-11-28): its float "
        "statistics (grad_norm, grad_mean_abs, param_norm, update_norm, update_ratio) move in their last "
        "bits; the training's do not",
        training=False,
    ),
    Revision(
        "the online probe's gradients are clipped apart from the objective's (2026-11-29): in one global "
        "norm with them, the probe's scaled the encoder's gradients by its own size; every update moves",
        training=True,
    ),
    Revision(
        "train/grad_norm is the norm of the gradients --optim.clip-norm bounds, every parameter's but the "
        "online probe's, and train/probe_grad_norm the probe's (2026-11-29): until now one norm of both",
        training=False,
        redefines=("train/grad_norm",),
    ),
    Revision(
        "with --model.remat, the predictor's and the MAE decoder's blocks are recomputed in a scan as the "
        "encoder's are (2026-12-01): a run with remat and either of them moves in its last bits; other "
        "runs keep every bit",
        training=True,
        applies=recomputes_heads,
    ),
    Revision(
        "the update monitor's summaries, smallest ratios and counts of vanishing and frozen parameters "
        "leave out the parameters no loss reads (2026-12-06): an MAE run's monitor/update_ratio/*, "
        "monitor/grad_norm/*, smallest ratios, monitor/vanishing and monitor/frozen are taken over other "
        "parameters; the training's bits do not move",
        training=False,
        redefines=(
            "monitor/update_ratio/",
            "monitor/grad_norm/",
            "monitor/smallest_ratio/",
            "monitor/vanishing",
            "monitor/frozen",
        ),
        applies=has_idle_params,
    ),
)
REVISION = len(REVISIONS)
"""The revision of this code's step."""


def between(saved: int, now: int = REVISION) -> list[Revision]:
    """The revisions a resume from a checkpoint of revision ``saved`` by code of revision ``now`` crosses,
    in either direction (empty when they are the same). One newer than this code is unknown to it: it
    may have moved anything."""
    return _crossed(REVISIONS, saved, now, Revision("a revision newer than this code", training=True))


DECODE_REVISION = len(_rs.DECODE_REVISIONS)
"""The revision of this birdjepa's decoder (the Rust core's declared changes of the samples it gives)."""


def decode_changes(saved: int | None, gapless: bool) -> list[str]:
    """The decoder's declared changes between revision ``saved`` (a checkpoint's; None: written before the
    record, revision 1 or 2, read as 1) and this one's, in either direction, that move a run decoding
    ``gapless`` or not (empty: none). One newer than this decoder is unknown to it: it may move any."""
    unknown = ("a revision newer than this decoder", False)
    crossed = _crossed(_rs.DECODE_REVISIONS, saved or 1, DECODE_REVISION, unknown)
    return [what for what, gapless_only in crossed if gapless or not gapless_only]


def _crossed(table: Sequence[T], saved: int, now: int, unknown: T) -> list[T]:
    """The entries of ``table`` (revision ``i + 1`` is entry ``i``) between revisions ``saved`` and ``now``,
    in either direction; one past the table is ``unknown``."""
    lo, hi = sorted((saved, now))
    return [table[i] if i < len(table) else unknown for i in range(lo, hi)]


def _applies(r: Revision, cfg: Any) -> bool:
    return r.applies is None or cfg is None or r.applies(cfg)


def moves_training(crossed: Sequence[Revision], cfg: Any) -> bool:
    """Whether any of the ``crossed`` revisions moves the training bits of the run ``cfg``."""
    return any(r.training and _applies(r, cfg) for r in crossed)


def redefined(crossed: Sequence[Revision], cfg: Any = None) -> list[str]:
    """The metrics (names, or prefixes ending in "/") the ``crossed`` revisions redefine in run ``cfg``
    (None: a run not known, every one they redefine in any run)."""
    return sorted({m for r in crossed if _applies(r, cfg) for m in r.redefines})


def redefined_at(event: Mapping[str, Any]) -> list[str]:
    """What a ``step_revised`` event says its resume's crossed revisions redefine in its run: the event's own
    list, or, in one written before events kept it, every metric they redefine in any run."""
    names = event.get("redefined")
    return list(names) if names is not None else redefined(between(*event["revision"]))


def is_redefined(metric: str, names: Sequence[str]) -> bool:
    """Whether ``metric`` is one of ``names`` (`redefined`'s), or under one of its prefixes."""
    return any(metric == n or (n.endswith("/") and metric.startswith(n)) for n in names)
