"""Checkpoints that hold everything the next step depends on, verified on restore (invariant 3 of
docs/design.md).

One job a module: `format` (what a checkpoint holds, host copies, the errors), `integrity` (a CRC-32
per leaf and the norms, compared with ``==``), `store` (`Checkpointer`, the Orbax adapter), `retention`
(keep the newest that verifies; fall back past damaged ones), `space` (disk space; a failed write's one
line and clean-up), `oneoff` (a synchronous save and load, the debug roundtrip).
This face re-exports what the rest of birdjepa uses.
"""

from birdjepa.rundir.checkpoint.format import (
    FORMAT_VERSION,
    CheckpointError,
    IntegrityError,
    NormMismatchError,
    NotFiniteError,
    NoValidCheckpointError,
    StructureError,
    to_host,
)
from birdjepa.rundir.checkpoint.integrity import assert_trees_identical, leaf_hash, state_norms
from birdjepa.rundir.checkpoint.oneoff import load, roundtrip, save_sync
from birdjepa.rundir.checkpoint.space import CheckpointWriteError
from birdjepa.rundir.checkpoint.store import Checkpointer
from birdjepa.rundir.layout import DAMAGED_DIR

__all__ = [
    "DAMAGED_DIR",
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointWriteError",
    "Checkpointer",
    "IntegrityError",
    "NoValidCheckpointError",
    "NormMismatchError",
    "NotFiniteError",
    "StructureError",
    "assert_trees_identical",
    "leaf_hash",
    "load",
    "roundtrip",
    "save_sync",
    "state_norms",
    "to_host",
]
