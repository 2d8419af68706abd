"""A sweep's config against the run it resumes, before anything is submitted: options its run's
checkpoint holds that no resume may change, the data it trained on, and the options the job will take
from the checkpoint rather than the config (`birdjepa.slurm.sweep.plan`)."""

from __future__ import annotations

from typing import Any

from birdjepa.config import BEFORE_IT_EXISTED, ConfigError, PretrainConfig, flatten, to_dict
from birdjepa.rundir import layout


class SweepError(ConfigError):
    """A sweep file or one of its configs is invalid (the message names file, config and key)."""


def trained_config(cfg: PretrainConfig) -> dict[str, Any] | None:
    """The flattened config of the checkpoint ``cfg``'s run resumes (None: none), as pretrain's start
    reads it for `validation.check`."""
    if not layout.has_checkpoints(cfg.run_dir):
        return None
    from birdjepa.resume.options import saved_config  # JAX: only where a run has checkpoints

    found = saved_config(cfg.run_dir)
    return flatten(found[1]) if found else None


def refused_resume(cfg: PretrainConfig, flags: list[str], where: str) -> tuple[str, ...]:
    """Raises SweepError where the run has checkpoints trained with other options than the config
    gives (an edited sweep run again), or other data: its job would be refused at its start (exit 65)
    after its wait in the queue, and its job script would no longer be the one that trained it. Returns
    the options the job will resume from the checkpoint at other values than the config's (`Job.kept`)."""
    if not layout.has_checkpoints(cfg.run_dir):
        return ()
    from birdjepa.resume.checks import config_diff, fixed_in_a_run  # JAX: only where a run has checkpoints
    from birdjepa.resume.options import resumed_config

    try:
        found = resumed_config(flags, cfg)
    except ConfigError as e:
        raise SweepError(f"{where}: {e}") from None
    if found is None:
        return ()
    step, saved, resumed, _ = found
    _, breaking = config_diff(saved, to_dict(resumed))
    if fixed := [c for c in breaking if fixed_in_a_run(c)]:  # allowed or not: it advised the flag
        raise SweepError(
            f"{where}: run {cfg.run_dir} has checkpoint {step}, trained with other options than these "
            f"({', '.join(breaking)}), and {', '.join(fixed)} cannot change within a run, "
            "allow_config_change=True neither (they lay out the data stream, the step keys or the "
            "schedule's updates): give the config another run, or leave them out; nothing was submitted"
        )
    if breaking and not resumed.allow_config_change:
        raise SweepError(
            f"{where}: run {cfg.run_dir} has checkpoint {step}, trained with other options than these "
            f"({', '.join(breaking)}): give the config another run, or allow_config_change=True to train "
            "on under them; nothing was submitted"
        )
    if step + 1 >= resumed.steps:  # its job trains nothing, checks no data: "nothing to do", or refused
        if step + 1 < saved.get("steps", step + 1):  # the trainer's `check_finished`: exit 65
            raise SweepError(
                f"{where}: run {cfg.run_dir} has trained through step {step}, and steps {resumed.steps} "
                f"would end it there: a run is not ended at a step it trained (its checkpoint holds steps "
                f"{saved['steps']}); give steps above {step + 1}, or another run; nothing was submitted"
            )
        return ()
    if resumed.resume_checks == "error":  # warned past, the job trains on other data, as it was told
        data_moved(resumed, step, where)
    # An override dropped from the file (or a default changed since): its job resumes the checkpoint's
    # value (options not on its command line come from there), where --dry-run printed the file's. Not
    # an option its checkpoint was recorded without (`BEFORE_IT_EXISTED`), which it trains as then: the
    # file cannot set it otherwise (a change refused above), and its job's first line says it.
    kept = config_diff(to_dict(cfg), to_dict(resumed))[1]
    then = BEFORE_IT_EXISTED.keys() - flatten(saved).keys()
    return tuple(c for c in kept if c.split(":", 1)[0] not in then)


def data_moved(resumed: PretrainConfig, step: int, where: str) -> None:
    """Raises SweepError where the train shards a resumed run's job reads are not those its checkpoint
    ``step`` trained on (a sweep edited to point the run at other data, or the data changed since): its
    job was refused at its start, exit 65, after its wait in the queue. The demo set is left alone."""
    if resumed.data.train is None:
        return
    from birdjepa.data import DataError, open_shards
    from birdjepa.rundir.checkpoint import Checkpointer

    with Checkpointer(resumed.run_dir, async_save=False, create=False) as ckpt:
        trained = ckpt.read_meta(step).get("dataset_fingerprint")
    data = resumed.data
    try:
        now = open_shards(data.train, features=data.features, **data.loader_options()).fingerprint
    except DataError as e:
        raise SweepError(f"{where}: data.train {data.train!r}: {e}") from None
    if trained is not None and now != trained:
        raise SweepError(
            f"{where}: run {resumed.run_dir} has checkpoint {step}, trained on data of fingerprint "
            f"{trained}; data.train {data.train!r} reads as {now} (other shards, or the same "
            "changed), which its job's resume would refuse (exit 65): give the config its data again, or "
            "another run; nothing was submitted"
        )
