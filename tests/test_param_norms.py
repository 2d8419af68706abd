"""A logged step's parameter norms are taken on a thread while the next step runs
(`birdjepa.train.param_norms`): they are the norms of the parameters as they were when asked for, even
once the next step has donated (overwritten) them, and the log writes the held row in its place."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from birdjepa import multihost
from birdjepa.rundir.checkpoint.norms import tree_norms
from birdjepa.rundir.layout import METRICS_FILE
from birdjepa.rundir.metrics_log import MetricsLog
from birdjepa.train import param_norms


@pytest.mark.parametrize(
    "level", ["suite", pytest.param("default", marks=[pytest.mark.slow, pytest.mark.default_level])]
)
def test_the_norms_are_of_the_parameters_asked_for_though_the_next_step_donates_them(
    level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the suite's -O0 and at XLA's default level (the device copy and the donating step compiled
    at each)."""
    rng = np.random.default_rng(0)
    params = {"encoder": {"w": jnp.asarray(rng.normal(size=(64, 48)), jnp.float32)},
              "probe": {"b": jnp.asarray(rng.normal(size=(7,)), jnp.float32)}}  # fmt: skip
    expected = {f"train/{k}": v for k, v in tree_norms(multihost.host(params)).items()}
    # The thread copies to the host only once the next step has run on the donated parameters.
    stepped, host = threading.Event(), multihost.host

    def after_the_step(tree: object) -> object:
        assert stepped.wait(60)
        return host(tree)

    monkeypatch.setattr(multihost, "host", after_the_step)
    norms = param_norms.later(params)
    step = jax.jit(lambda p: jax.tree.map(lambda x: x * 3.0 + 1.0, p), donate_argnums=0)
    after = step(params)
    jax.block_until_ready(after)
    assert all(x.is_deleted() for x in jax.tree.leaves(params))  # donated: XLA may reuse their memory
    stepped.set()
    assert norms.result() == expected
    assert expected["train/param_norm"] != tree_norms(host(after))["param_norm"]


class Later:
    def __init__(self, values: dict[str, float] | Exception) -> None:
        self.values = values

    def result(self) -> dict[str, float]:
        if isinstance(self.values, Exception):
            raise self.values
        return self.values


def test_a_held_row_is_written_complete_before_anything_after_it_and_at_close(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, restart=0)
    first = {"train/loss": 1.0}
    log.log(0, first, later=Later({"train/param_norm": 2.0}))
    assert (tmp_path / METRICS_FILE).read_text() == ""  # held
    log.log(0, {"eval/knn_acc": 0.5})  # another row of the same step: after the held one
    assert first == {"train/loss": 1.0, "train/param_norm": 2.0}  # completed in place (a save reads it)
    log.log(1, {"train/loss": 0.5}, later=Later({"train/param_norm": 3.0}))
    log.event("stop", 1)
    log.log(2, {"train/loss": 0.25}, later=Later({"train/param_norm": 4.0}))
    log.close()
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [(r["step"], r.get("event"), r.get("train/param_norm"), r.get("eval/knn_acc")) for r in rows] == [
        (0, None, 2.0, None), (0, None, None, 0.5), (1, None, 3.0, None), (1, "stop", None, None),
        (2, None, 4.0, None),
    ]  # fmt: skip
    # A failure on the thread is raised where the row is written, and the row is not.
    log = MetricsLog(tmp_path / "failed", restart=0)
    log.log(0, {"train/loss": 1.0}, later=Later(RuntimeError("out of host memory")))
    with pytest.raises(RuntimeError, match="out of host memory"):
        log.flush()
    log.close()
    assert (tmp_path / "failed" / METRICS_FILE).read_text() == ""
