"""The data side: Arrow shards of encoded audio -> batches of log-mel spectrograms.

`loader` (the Rust loader's Python face, its options and defaults), `shards` (writing and reading
shards), `prepare` (`birdjepa prepare`: a folder of audio or the hub's Parquet -> shards), `parquet`
(the hub's Parquet, converted for `prepare`), `row_columns` (what a row says beside its audio and
label, for reports). The synthetic sets are in `birdjepa.synthetic`. The loader's API is re-exported
here.
"""

from birdjepa.data.loader import (
    DEFAULTS,
    TRAIN_VIEWS,
    Batch,
    DataConfig,
    DataError,
    Features,
    Loader,
    Shards,
    StateError,
    WorkerError,
    open_shards,
    open_train_loader,
    plan_indices,
    resolve_files,
    take,
)  # fmt: skip

__all__ = [
    "DEFAULTS", "TRAIN_VIEWS", "Batch", "DataConfig", "DataError", "Features", "Loader", "Shards",
    "StateError", "WorkerError", "open_shards", "open_train_loader", "plan_indices", "resolve_files", "take",
]  # fmt: skip
