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


FLAGS_SCRIPT = """
import os, sys
os.environ.pop("XLA_FLAGS", None)  # none of the test suite's flags
import birdjepa.pretrain.loop as loop
seen = {}
loop.pretrain = lambda cfg: seen.setdefault("flags", os.environ.get("XLA_FLAGS", "")) and 0
from birdjepa.cli import main
main(["pretrain", "--run", "x", "--log.runs-dir", sys.argv[1]])
print(seen["flags"])
"""


def test_the_pretrain_command_sets_its_own_determinism_flags(tmp_path) -> None:
    """The command a user runs turns on XLA's determinism flags itself, before training starts, with no
    XLA_FLAGS in its environment (the suite's conftest sets its own; this must not rely on them)."""
    import os
    import subprocess
    import sys

    from birdjepa.train.determinism import FLAGS

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", FLAGS_SCRIPT, str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(done.stdout.split()[-len(FLAGS) :]) == set(FLAGS), done.stdout
