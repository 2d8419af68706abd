"""The data side: Arrow shards of encoded audio -> batches of log-mel spectrograms.

`loader` (the Rust loader's Python face, its options and defaults), `shards` (writing shards),
`prepare` (`birdjepa prepare`: a folder of audio or an HF dataset -> shards), `synth` (the synthetic
bird-song generator), `demo` (the demo set built on it), `scale_set` (the same song at 10^5
recordings), `demo_data` (`birdjepa demo-data`, either set), `loader_demo` (`birdjepa loader-demo`).
The loader's API is re-exported here.
"""

from birdjepa.data.loader import (
    DEFAULTS,
    TRAIN_VIEWS,
    Batch,
    DataConfig,
    DataError,
    Features,
    Loader,
    StateError,
    WorkerError,
    open_train_loader,
    plan_indices,
    resolve_files,
    take,
)  # fmt: skip

__all__ = [
    "DEFAULTS", "TRAIN_VIEWS", "Batch", "DataConfig", "DataError", "Features", "Loader", "StateError",
    "WorkerError", "open_train_loader", "plan_indices", "resolve_files", "take",
]  # fmt: skip
