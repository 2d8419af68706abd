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
import json, os, sys
for name in ("XLA_FLAGS", "PJRT_NPROC"):
    os.environ.pop(name, None)  # none of the test suite's settings
import jax._src.xla_bridge as xla_bridge
import birdjepa.pretrain.loop as loop
seen = {}

def parse(args):  # where a resume reads its checkpoint, which starts JAX's backend
    seen.update(flags=os.environ.get("XLA_FLAGS", ""), pool=os.environ.get("PJRT_NPROC"),
                started=xla_bridge.backends_are_initialized())
    raise SystemExit(0)

loop.cli.parse = parse
from birdjepa.cli import main
try:
    main(["pretrain", "--run", "x", "--log.runs-dir", sys.argv[1]])
except SystemExit:
    pass
print(json.dumps(seen))
"""


def test_the_birdjepa_command_sets_its_determinism_flags_and_cpu_pool_before_anything_starts_jax(
    tmp_path,
) -> None:
    """The command a user runs sets XLA's determinism flags and fixes its CPU thread pool itself, with
    none of them in its environment (the suite's conftest sets its own; this must not rely on them),
    before a command parses its options: `birdjepa pretrain`'s parse reads the run's checkpoint, which
    starts JAX's backend, and XLA reads its flags and sizes its pool only then."""
    import json
    import os
    import subprocess
    import sys

    from birdjepa.train.determinism import FLAGS, MIN_CPU_THREADS

    done = subprocess.run([sys.executable, "-c", FLAGS_SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(seen["flags"].split()) == set(FLAGS) and seen["started"] is False, seen
    assert seen["pool"] == str(max(len(os.sched_getaffinity(0)), MIN_CPU_THREADS)), seen
    # A pool the user sets is kept.
    script = FLAGS_SCRIPT.replace('for name in ("XLA_FLAGS", "PJRT_NPROC")', 'for name in ("XLA_FLAGS",)')
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PJRT_NPROC": "3"})  # fmt: skip
    assert json.loads(done.stdout.strip().splitlines()[-1])["pool"] == "3", done.stdout + done.stderr
