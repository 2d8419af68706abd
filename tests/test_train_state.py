"""The loop's pieces that need no training: its one cadence rule, and what a resume keeps per --prng mode."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from birdjepa.pretrain.loop import due
from birdjepa.train.state import TrainState, for_prng_mode


@pytest.mark.parametrize(
    "every,steps",
    [(1, [0, 1, 2, 3, 4, 5, 6]), (3, [2, 5, 6]), (7, [6]), (10, [6]), (0, [6])],
)
def test_due_after_every_nth_step_and_the_last(every: int, steps: list[int]) -> None:
    assert [s for s in range(7) if due(s, every, last=6)] == steps


def test_each_prng_mode_keeps_what_it_says() -> None:
    saved, fresh = jax.random.key(5), jax.random.key(9)
    restored = TrainState(step=4, restart=1, params={}, opt_state={}, chain=saved, loader_state={"pos": 4})

    def kept(mode: str) -> tuple[bool, dict | None]:
        s = for_prng_mode(restored, mode, fresh)
        chain = np.asarray(jax.random.key_data(s.chain))
        return bool(np.array_equal(chain, np.asarray(jax.random.key_data(saved)))), s.loader_state

    assert kept("checkpointed") == (True, {"pos": 4})
    assert kept("stateless") == (False, {"pos": 4})  # the chain is never advanced: the fresh one
    assert kept("legacy") == (False, None)  # the bug users hit: restarted chain, cold loader
