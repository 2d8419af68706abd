"""The options of a resumed segment: the run's own come from its newest checkpoint's config.

A resume takes every option (the data and its stream, the model, the objective, the optimizer, the
schedule, the seed, the PRNG mode, the cadences, the logging) from the config its newest checkpoint
recorded, unless the command line sets it. A default that changed in a newer birdjepa therefore never
changes a running run, and a requeued job needs no options retyped. Options set on the command line
still meet the resume checks' breaking-change rule. Only the options that steer one segment
(`SEGMENT_ONLY`) come from the command line and this birdjepa's defaults, as for a fresh run.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from birdjepa.config import PretrainConfig, flatten, to_dict
from birdjepa.train.checkpoint import Checkpointer, CheckpointError

#: What steers one segment, not the run: where it is, whether and how to resume, where to stop, the
#: debug actions at listed steps, this machine's worker count.
SEGMENT_ONLY = (
    "run",
    "resume",
    "stop_at_step",
    "resume_checks",
    "allow_config_change",
    "debug_roundtrip_steps",
    "debug_nonfinite_steps",
    "debug_inject_fault",
    "data.n_workers",
    "log.runs_dir",
)


def saved_config(run_dir: Path) -> tuple[int, dict[str, Any]] | None:
    """``(step, config)`` of the newest checkpoint in ``run_dir`` whose meta reads, or None (a fresh run).
    Its arrays are verified later, by the restore; a damaged newest one is passed over there too."""
    if not (run_dir / "checkpoints").is_dir():
        return None
    ckpt = Checkpointer(run_dir, async_save=False)
    try:
        for step in reversed(ckpt.all_steps()):
            try:
                return step, ckpt.read_meta(step)["config"]
            except (CheckpointError, KeyError, OSError, ValueError):
                continue
        return None
    finally:
        ckpt.close()


def _value(hint: Any, value: Any) -> Any:
    """A JSON value as the field of type ``hint`` holds it (lists are tuples, paths are `Path`)."""
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value)
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
        return _value(hint, value)
    if (origin is tuple or hint is tuple) and isinstance(value, list):
        return tuple(value)
    if hint is Path and isinstance(value, str):
        return Path(value)
    return value


def from_dict(cls: type, tree: Mapping[str, Any]) -> Any:
    """The config ``cls`` that `birdjepa.config.to_dict` wrote as ``tree`` (keys it lacks take their
    defaults; keys this birdjepa does not know are left out)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _value(hints[k], v) for k, v in tree.items() if k in fields})


def resume_defaults(saved: Mapping[str, Any]) -> tuple[PretrainConfig, list[str]]:
    """The defaults a resumed segment parses its command line against: this birdjepa's, with every
    option but `SEGMENT_ONLY` as ``saved`` recorded it; and, as ``key=saved (default now X)``, the
    options where the two differ."""
    defaults = flatten(to_dict(PretrainConfig()))
    recorded = {k: v for k, v in flatten(saved).items() if k not in SEGMENT_ONLY and k in defaults}
    kept = [f"{k}={recorded[k]} (default now {defaults[k]})" for k in sorted(recorded) if
            recorded[k] != defaults[k]]  # fmt: skip
    merged = _nest({**defaults, **recorded})
    return from_dict(PretrainConfig, merged), kept


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *groups, name = key.split(".")
        node = out
        for g in groups:
            node = node.setdefault(g, {})
        node[name] = value
    return out
