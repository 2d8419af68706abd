"""The seams: the few named places where the verification wing (`birdjepa.verify`) may change a run on
purpose, to see the harness catch it (a planted divergence for `birdjepa bisect`, a broken resume for the
resume checks). The core calls them and knows no plant or fault by name.

A `Seams` is one set of hooks. The base class changes nothing, and every run whose ``--debug.plant`` and
``--debug.inject-fault`` are unset gets `NONE`: its step is the one built without seams, bit for bit
(tests/test_objectives.py's step digests). The wing registers its plants and faults here by name
(`register`) when it is imported; the `birdjepa` command imports it. Plain Python at the bottom of the
package (no JAX): `birdjepa.validation` checks the names before a run directory opens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

Kind = Literal["plant", "fault"]

OpenLoader = Callable[..., Any]
"""``open_at(seed, *, fresh=False, **options) -> (loader, error)``: the segment's train loader with this
seed (at the segment's state, or at the start of the data when ``fresh``) and these Rust loader options."""


class Seams:
    """A run's hooks, each called at one place of the core; this base changes nothing."""

    in_step = False
    """Whether the hooks change the compiled step (else a planted run shares its twin's compilation)."""

    def refuses(self, cfg: Any) -> str | None:
        """Why these hooks would change nothing in a run of ``cfg`` (a `PretrainConfig`), which `bisect`
        then called two runs without a difference; None: they change it."""
        return None

    def lr_table(self, table: np.ndarray, peak: float) -> np.ndarray:
        """The LR of every update (`birdjepa.train.optim.lr_table`, float64) as the optimizer applies it."""
        return table

    def decay_mask(self) -> Callable[[Any], Any] | None:
        """Which parameters AdamW decays (optax's ``mask``; None: all)."""
        return None

    def forward_params(self, params: Any) -> Any:
        """The parameters the forward computes with."""
        return params

    def dropout(self, key: Any) -> Any:
        """The key of the forward's dropout and drop-path draws."""
        return key

    def around_model_call(self) -> contextlib.AbstractContextManager[Any]:
        """Entered around each of the model's calls in the step (e.g. a flax method interceptor)."""
        return contextlib.nullcontext()

    def open_loader(self, open_at: OpenLoader, seed: int) -> tuple[Any, str | None]:
        """The segment's train loader (`birdjepa.train.segment.open_loader`)."""
        return open_at(seed)

    def restored(self, restored: Any, tx: Any, fresh_chain: Any) -> tuple[Any, str | None]:
        """What the loop restored (`birdjepa.resume.restored.Restored`), before the resume checks see it,
        and why the change has no effect at this point of the run (None: it has one)."""
        return restored, None


NONE = Seams()
"""The seams of every run that plants and injects nothing."""

_REGISTERED: dict[Kind, dict[str, Seams]] = {"plant": {}, "fault": {}}


def register(kind: Kind, name: str, seams: Seams) -> None:
    """Make ``--debug.plant name`` (kind ``plant``) or ``--debug.inject-fault name`` (``fault``) use
    ``seams``."""
    _REGISTERED[kind][name] = seams


def names(kind: Kind) -> tuple[str, ...]:
    """The registered plants or faults, in the order they were registered."""
    return tuple(_REGISTERED[kind])


def planted(name: str | None) -> Seams:
    """The seams of ``--debug.plant name``."""
    return of("plant", name)


def injected(name: str | None) -> Seams:
    """The seams of ``--debug.inject-fault name``."""
    return of("fault", name)


def of(kind: Kind, name: str | None) -> Seams:
    """The seams of ``name`` (`NONE` for None); a `KeyError` naming the registered ones otherwise."""
    if name is None:
        return NONE
    known = _REGISTERED[kind]
    if name not in known:
        listed = ", ".join(known) or "none (the verification wing registers them: import birdjepa.verify)"
        raise KeyError(f"unknown {kind} {name!r}; registered: {listed}")
    return known[name]
