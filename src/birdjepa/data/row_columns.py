"""What a shard's rows say beside their audio and label, read for the reports that score them: BirdSet's
species lists, and each row's own window (``start_time``, ``end_time``).

The loader reads these columns itself; this module reads them with pyarrow, for a count or a bound in a
report, never to decide what a batch holds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from birdjepa.data.loader import DEFAULTS

MULTILABEL_COLUMN = "ebird_code_multilabel"
"""BirdSet's column of every species heard in a row (a soundscape window's), beside ``ebird_code``'s one."""
SAME_LENGTH_S = 0.01
"""Window and clip lengths closer than this (seconds, a hop of the log-mel) are the same length."""


def several_species(table: pa.Table, column: str = MULTILABEL_COLUMN) -> int:
    """Rows of a shard's ``table`` whose ``column`` lists more than one class (0 without it as a list)."""
    if column not in table.schema.names or not pa.types.is_list(table.schema.field(column).type):
        return 0
    return int(pc.sum(pc.greater(pc.list_value_length(table.column(column)), 1)).as_py() or 0)


def row_windows(table: pa.Table) -> np.ndarray | None:
    """``[rows, 2]`` float64: each row of a shard's ``table`` by its window (start and end seconds) as the
    eval-mode loader crops it, NaN where a bound is null (the row keeps its centre crop); None where the
    shard has no window."""
    names = (DEFAULTS["window_start_column"], DEFAULTS["window_end_column"])
    if not all(n in table.schema.names for n in names):
        return None
    try:
        bounds = [table.column(n).cast(pa.float64()).to_numpy(zero_copy_only=False) for n in names]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # not seconds: the loader names the column
        return None
    windows = np.stack(bounds, axis=1).astype(np.float64)
    windows[np.isnan(windows).any(axis=1)] = np.nan
    return windows


def window_lengths(tables: Sequence[pa.Table]) -> np.ndarray:
    """The length in seconds of every row's window in the shards' ``tables`` (rows without one left out)."""
    found = [w for t in tables if (w := row_windows(t)) is not None]
    lengths = np.concatenate([w[:, 1] - w[:, 0] for w in found]) if found else np.zeros(0)
    return lengths[~np.isnan(lengths)]
