"""The options of a resumed segment: the run's own come from its newest checkpoint's config.

A resume takes every option (the data and its stream, the model, the objective, the optimizer, the
schedule, the seed, the PRNG mode, the cadences, the logging) from the config its newest checkpoint
recorded, unless the command line sets it. A default that changed in a newer birdjepa therefore never
changes a running run, and a requeued job needs no options retyped. Options set on the command line
still meet the resume checks' breaking-change rule. Only the options that steer one segment
(`SEGMENT_ONLY`) come from the command line and this birdjepa's defaults, as for a fresh run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tyro

from birdjepa.config import PretrainConfig, as_recorded, flatten, recorded, to_dict
from birdjepa.rundir import layout
from birdjepa.rundir.checkpoint import Checkpointer, CheckpointError

#: What steers one segment, not the run: where it is, whether and how to resume, where to stop, the
#: debug actions at listed steps, this machine's worker count.
SEGMENT_ONLY = (
    "run",
    "resume",
    "stop_at_step",
    "resume_checks",
    "allow_config_change",
    "debug.roundtrip_steps",
    "debug.nonfinite_steps",
    "debug.inject_fault",
    "data.n_workers",
    "log.runs_dir",
)


def saved_config(run_dir: Path) -> tuple[int, dict[str, Any]] | None:
    """``(step, config)`` of the checkpoint in ``run_dir`` the restore will resume, or None (a fresh run).
    The restore passes a damaged newest one over and resumes an older one, whose options these must be:
    read from the damaged one, a declared change it held was refused against the older one's ("leave
    them out" of a bare command), or a changed byte in its config trained on. A meta is verified by its
    CRC-32 here; the arrays (seconds a GB, which the restore reads again) only where the checkpoints'
    options differ, so that which of them the restore picks decides the options."""
    if not layout.has_checkpoints(run_dir):
        return None
    ckpt = Checkpointer(run_dir, async_save=False)
    try:
        found = []  # newest first: the checkpoints whose meta verifies
        for step in reversed(ckpt.all_steps()):
            try:
                found.append((step, ckpt.checked_meta(step)["config"]))
            except (CheckpointError, KeyError, OSError, ValueError):
                continue
        if len({_options(config) for _, config in found}) <= 1:
            return found[0] if found else None
        return next(((s, c) for s, c in found if ckpt.verify(s)), None)
    finally:
        ckpt.close()


def _options(config: Mapping[str, Any]) -> str:
    """A config's options a resume takes from it (`SEGMENT_ONLY` left out), as one comparable string."""
    return json.dumps({k: v for k, v in recorded(config).items() if k not in SEGMENT_ONLY}, sort_keys=True)


def hand_edits(run_dir: Path, saved: Mapping[str, Any]) -> list[str]:
    """The options where the run's config.json differs from ``saved`` (the config of the checkpoint it
    resumes), as ``key: checkpoint -> file``: a hand edit, which the resume does not read and the new
    segment's config.json overwrote without a word. Empty where they agree or the file is unreadable."""
    try:
        edited = recorded(layout.read_config(run_dir))
    except (OSError, ValueError, AttributeError):
        return []
    kept = recorded(saved)
    keys = sorted(k for k in set(edited) | set(kept) if k not in SEGMENT_ONLY)
    differ = [k for k in keys if edited.get(k) != kept.get(k)]
    return [f"{k}: {kept.get(k)!r} -> {edited.get(k)!r}" for k in differ]


def unlike_its_config(cfg: PretrainConfig) -> str:
    """For a start that resumes no checkpoint in a run folder an earlier start left: where its options
    differ from that start's config.json (the first three, ``key: this start's -> the file's``), as a
    clause of its WARNING, or "". A bare command line there (its checkpoints removed, or none verifying)
    trained this birdjepa's defaults, and its config.json overwrote the run's, without a word."""
    unlike = hand_edits(cfg.run_dir, to_dict(cfg))
    more = f" and {len(unlike) - 3} more" if len(unlike) > 3 else ""
    return f", with other options than its config.json ({'; '.join(unlike[:3])}{more})" if unlike else ""


def resume_defaults(saved: Mapping[str, Any], where: str) -> tuple[PretrainConfig, list[str]]:
    """The defaults a resumed segment parses its command line against: this birdjepa's, with every
    option but `SEGMENT_ONLY` as ``saved`` (the config recorded at ``where``) holds it; and, as
    ``key=saved (default now X)``, the options where the two differ. Options this birdjepa no longer
    has are left out; a value of another type raises `birdjepa.config.ConfigError`."""
    defaults = flatten(to_dict(PretrainConfig()))
    cfg, recorded = as_recorded(saved, where, SEGMENT_ONLY)
    kept = [f"{k}={recorded[k]} (default now {defaults[k]})" for k in sorted(recorded) if
            recorded[k] != defaults[k]]  # fmt: skip
    return cfg, kept


def resumed_config(
    args: Sequence[str], fresh: PretrainConfig, **cli: Any
) -> tuple[int, dict[str, Any], PretrainConfig, list[str]] | None:
    """What ``birdjepa pretrain ARGS`` (``fresh``: ARGS parsed for a new run) resumes: the checkpoint's
    step, its config, the config the segment trains with (ARGS over `resume_defaults`; ``cli``: more of
    `tyro.cli`'s arguments) and `resume_defaults`' list; None where it starts afresh. Raises
    `birdjepa.config.ConfigError` where a saved option's type changed."""
    found = saved_config(fresh.run_dir) if fresh.resume == "auto" else None
    if found is None:
        return None
    step, saved = found
    defaults, kept = resume_defaults(saved, f"{fresh.run_dir / 'checkpoints' / str(step)}")
    cfg = tyro.cli(PretrainConfig, args=list(args), default=defaults, **cli)
    # Those the command line set are not kept, at any value: "optim.grad_accum=2 (default now 1)" was
    # said of a resume given --optim.grad-accum 3, and "steps=8 (default now 600)" of a requeue given
    # its whole command line again. Set, an option is ARGS' value under both defaults.
    now, given = flatten(to_dict(cfg)), flatten(to_dict(fresh))
    return step, saved, cfg, [k for k in kept if now[k.split("=")[0]] != given[k.split("=")[0]]]
