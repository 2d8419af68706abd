"""Resume-window analysis of logged runs: load (``load``), measure (``windows``), draw (``figures``),
report (``report``, the ``birdjepa analyze`` command). Notebooks in ``notebooks/`` call these."""

from birdjepa.analysis.load import DEFAULT_GAP_S, Resume, RunLog, from_rows, load_run
from birdjepa.analysis.report import DEFAULT_METRICS, Analysis, analyze, summary_markdown
from birdjepa.analysis.windows import (
    Jump,
    ema,
    iid_reference,
    jumps,
    max_abs_diff,
    normal_drift,
    rolling_quantiles,
)

__all__ = [
    "DEFAULT_GAP_S", "DEFAULT_METRICS", "Analysis", "Jump", "Resume", "RunLog", "analyze", "ema", "from_rows",
    "iid_reference", "jumps", "load_run", "max_abs_diff", "normal_drift", "rolling_quantiles",
    "summary_markdown",
]  # fmt: skip
