"""The resume faults of ``--debug.inject-fault`` (`birdjepa.verify.catalogue`): each breaks what the
loop restored, before the resume checks run (the seam `birdjepa.seams.Seams.restored`), registered under
its name when this module is imported. JAX and optax are imported where a fault is applied."""

from __future__ import annotations

import dataclasses
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
    note = f" (no effect here: {no_effect})" if no_effect else ""
    print(f"DEBUG_INJECT_FAULT {fault}{note}", flush=True)
    return r, no_effect


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
