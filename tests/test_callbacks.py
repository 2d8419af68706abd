"""The callback interface: hooks merge, state round-trips through a checkpoint's JSON, a callback that
cannot take its saved state starts fresh with a note instead of stopping the run."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from birdjepa.diagnostics.callbacks import (
    Callback,
    Callbacks,
    IidCallback,
    Report,
    StepEnd,
    UpdateMonitorCallback,
)
from birdjepa.diagnostics.monitor import check_due, empty_stats, param_names, update_stats

SHARDS = [40, 24]


def batches(n: int, size: int = 8) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    out = []
    for _ in range(n):
        index = rng.integers(0, sum(SHARDS), size)
        out.append({"index": index, "shard_id": (index >= SHARDS[0]).astype(np.int64)})
    return out


def test_iid_callback_state_survives_a_json_checkpoint() -> None:
    stream = batches(12)
    straight = Callbacks([IidCallback(SHARDS, window=5)])
    expected = [straight.step_end(StepEnd(s, b, {})).metrics for s, b in enumerate(stream)]

    first = Callbacks([IidCallback(SHARDS, window=5)])
    for s, b in enumerate(stream[:7]):
        first.step_end(StepEnd(s, b, {}))
    saved = json.loads(json.dumps(first.save(6)))  # what the checkpoint meta holds
    resumed = Callbacks([IidCallback(SHARDS, window=5)])
    assert resumed.restore(6, saved) == []
    got = [resumed.step_end(StepEnd(s, b, {})).metrics for s, b in enumerate(stream[7:], start=7)]
    assert got == expected[7:]  # lag-1 and window metrics included, bit for bit
    assert got[0]["dataloader/bucket_lag1/mod"] != 0.0


def test_missing_or_unfitting_state_starts_fresh_with_a_note() -> None:
    cbs = Callbacks([IidCallback(SHARDS, window=5)])
    assert cbs.restore(3, {}) == ["iid: checkpoint 3 has no state for it; starting fresh"]
    other = Callbacks([IidCallback([30, 34], window=5)])
    other.step_end(StepEnd(0, batches(1)[0], {}))
    (note,) = cbs.restore(3, other.save(0))
    assert note.startswith("iid: state of checkpoint 3 does not fit") and note.endswith("starting fresh")
    # Fresh means fresh: no previous batch, so lag-1 is 0.
    assert cbs.step_end(StepEnd(4, batches(1)[0], {})).metrics["dataloader/window_batches"] == 1.0


def test_reports_merge_in_order_and_names_are_unique() -> None:
    class Fixed(Callback):
        def __init__(self, name: str, report: Report) -> None:
            self.name, self.report = name, report

        def on_step_end(self, end: StepEnd) -> Report:
            return self.report

    cbs = Callbacks([Fixed("a", Report({"x": 1.0}, ["w1"])), Fixed("b", Report({"y": 2.0}, ["w2"], True))])
    r = cbs.step_end(StepEnd(0, {}, {}))
    assert r.metrics == {"x": 1.0, "y": 2.0} and r.warnings == ["w1", "w2"] and r.must_log
    with pytest.raises(ValueError, match="unique"):
        Callbacks([Fixed("a", Report()), Fixed("a", Report())])


def test_update_monitor_callback_reads_only_real_checks() -> None:
    params = {"w": jnp.ones((3, 3)), "b": jnp.zeros(3)}
    cb = UpdateMonitorCallback(param_names(params))
    assert cb.on_step_end(StepEnd(0, {}, empty_stats(params))) == Report()
    grads = {"w": jnp.full((3, 3), 0.1), "b": jnp.full(3, 0.1)}
    after = {"w": params["w"] - 0.01, "b": params["b"] - 0.01}
    r = cb.on_step_end(StepEnd(1, {}, update_stats(grads, params, after)))
    assert r.must_log and r.warnings == [] and r.metrics["monitor/frozen"] == 0.0


@pytest.mark.parametrize(
    "interval,accum,due",
    [(0, 1, []), (1, 1, [0, 1, 2, 3, 4, 5, 6, 7]), (4, 1, [3, 7]), (2, 2, [3, 7]), (1, 3, [2, 5]),
     (3, 2, [5])],
)  # fmt: skip
def test_checks_count_updates_and_land_on_last_micro_step(interval: int, accum: int, due: list[int]) -> None:
    # Any interval works with any accumulation (interval 3 with 2 micro-steps per update included).
    assert [s for s in range(8) if check_due(s, interval, accum)] == due
