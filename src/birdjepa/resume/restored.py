"""What the loop restored from a checkpoint and is about to train on: what a resume check reads, and
what the verification wing's faults change (`birdjepa.seams.Seams.restored`)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from birdjepa.train.state import TrainState

if TYPE_CHECKING:
    from birdjepa.config import PretrainConfig


@dataclasses.dataclass(frozen=True)
class Restored:
    """The run's config (as the resume asks for it), its train shards and the restored state."""

    cfg: PretrainConfig
    train_files: list[str]
    state: TrainState

    def with_state(self, **changes: Any) -> Restored:
        return dataclasses.replace(self, state=dataclasses.replace(self.state, **changes))
