"""The resume faults of ``--debug.inject-fault`` (`birdjepa.verify.catalogue`): each breaks what the
loop restored, before the resume checks run (the seam `birdjepa.seams.Seams.restored`), registered under
its name when this module is imported. JAX and optax are imported where a fault is applied."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from birdjepa import seams
from birdjepa.seams import Seams
from birdjepa.verify.catalogue import FAULTS, PERTURBATION

if TYPE_CHECKING:
    from birdjepa.resume.restored import Restored


class Fault(Seams):
    """One fault of the catalogue, applied by `inject`."""

    def __init__(self, name: str) -> None:
        self.name = name

    def restored(self, restored: Any, tx: Any, fresh_chain: Any) -> tuple[Any, str | None]:
        return inject(self.name, restored, tx, fresh_chain)


def _with_count(opt_state: Any, delta: int) -> Any:
    """``opt_state`` with the schedule's step count (`optim.update_count`) moved by ``delta``."""
    import optax

    if isinstance(opt_state, optax.MultiStepsState):
        return opt_state._replace(inner_opt_state=_with_count(opt_state.inner_opt_state, delta))
    return opt_state._replace(count=opt_state.count + delta)


def inject(fault: str, r: Restored, tx: Any, fresh_chain: Any) -> tuple[Restored, str | None]:
    """``r`` with ``fault`` applied (``tx``: the run's optimizer), and why it changes nothing at this
    point of this run (None when it does change something); prints what it did."""
    import jax
    import jax.numpy as jnp
    import optax

    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    no_effect, s = None, r.state
    if fault == "drop_loader_state":
        r = r.with_state(loader_state=None)
    elif fault == "reset_prng":
        if r.cfg.prng == "stateless":
            no_effect = "stateless keys are derived from (seed, step) and hold no state to lose"
        r = r.with_state(chain=fresh_chain)
    elif fault == "lr_off_by_one":
        r = r.with_state(opt_state=_with_count(s.opt_state, 1))
    elif fault == "stale_opt_state":
        r = r.with_state(opt_state=_fresh_moments(s.opt_state, tx.init(s.params)))
    elif fault == "batch_size_change":
        data = dataclasses.replace(r.cfg.data, batch_size=2 * r.cfg.data.batch_size)
        r = dataclasses.replace(r, cfg=dataclasses.replace(r.cfg, data=data))
    elif fault == "drop_accumulation":
        acc = s.opt_state
        if not isinstance(acc, optax.MultiStepsState):
            no_effect = "this run does not accumulate gradients"
        elif int(acc.mini_step) == 0:
            no_effect = "resumed on an update boundary, where the accumulator is empty"
        else:
            lost = acc._replace(
                mini_step=jnp.zeros_like(acc.mini_step), acc_grads=jax.tree.map(jnp.zeros_like, acc.acc_grads)
            )
            r = r.with_state(opt_state=lost)
    elif fault == "perturb_params":
        r = r.with_state(params=jax.tree.map(lambda p: p * (1 + PERTURBATION), s.params))
    elif fault == "dataset_changed":
        if len(r.train_files) < 2:
            raise ValueError("dataset_changed drops a train shard; this run has only one")
        r = dataclasses.replace(r, train_files=r.train_files[:-1])
    elif fault == "shard_relabelled":
        folder, sources = r.cfg.run_dir / "fault-data", [Path(f).resolve() for f in r.train_files]
        relabelled = None
        # The last shard with a batch clear of its ends (two batches or more), which only the shards'
        # digests see; else the last shard's last batch, which the fingerprint sees too.
        for src, edge in [*((src, 64 * 1024) for src in reversed(sources)), (sources[-1], 0)]:
            try:
                relabelled = relabelled_copy(src, folder, edge)
                break
            except ValueError:
                continue
        if relabelled is None:
            raise ValueError("shard_relabelled: no shard holds its labels as one run of int64 bytes")
        for src in sources:  # the others linked beside it: the data set's order is its paths'
            if src.name != relabelled.name:
                (folder / src.name).symlink_to(src)
        r = dataclasses.replace(r, train_files=[str(folder / src.name) for src in sources])
    note = f" (no effect here: {no_effect})" if no_effect else ""
    print(f"DEBUG_INJECT_FAULT {fault}{note}", flush=True)
    return r, no_effect


def relabelled_copy(shard: Path, folder: Path, edge: int = 64 * 1024) -> Path:
    """A copy of ``shard`` (and its vocab.json) in ``folder`` where one labelled row is of another class:
    its label's bytes changed in place, in a record batch clear of the file's first and last ``edge``
    bytes, so the file keeps its name, size and the bytes at both ends, all the data set's fingerprint
    reads (a second `prepare` with one label corrected). ValueError where no batch is clear of them."""
    import numpy as np
    import pyarrow as pa

    from birdjepa.data.shards import DEFAULT_LABEL_COLUMN, VOCAB_FILE

    data = bytearray(shard.read_bytes())
    with pa.memory_map(str(shard)) as source:
        reader = pa.ipc.open_file(source)
        batches = [reader.get_batch(i).column(DEFAULT_LABEL_COLUMN) for i in range(reader.num_record_batches)]
    for labels in batches:
        values = np.asarray(labels.fill_null(-1), np.int64)
        where = data.find(values.tobytes())
        if edge <= where and where + values.nbytes <= len(data) - edge and data.count(values.tobytes()) == 1:
            break
    else:
        raise ValueError(f"{shard}: no batch's labels lie clear of its first and last {edge} bytes")
    row = int(np.flatnonzero(values >= 0)[0])
    changed = values.copy()
    changed[row] = (values[row] + 1) % (values.max() + 1)
    data[where : where + changed.nbytes] = changed.tobytes()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / shard.name).write_bytes(bytes(data))
    if (shard.parent / VOCAB_FILE).exists():
        (folder / VOCAB_FILE).write_bytes((shard.parent / VOCAB_FILE).read_bytes())
    return folder / shard.name


def _fresh_moments(opt_state: Any, fresh: Any) -> Any:
    """``opt_state`` with the inner optimizer's state (Adam moments, ...) taken from ``fresh``; counts,
    applied hyperparameters and accumulation kept."""
    import optax

    if isinstance(opt_state, optax.MultiStepsState):
        return opt_state._replace(
            inner_opt_state=_fresh_moments(opt_state.inner_opt_state, fresh.inner_opt_state)
        )
    return opt_state._replace(inner_state=fresh.inner_state)


for _name in FAULTS:
    seams.register("fault", _name, Fault(_name))
