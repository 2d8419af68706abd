"""Resume-window analysis of one run (interactive): `marimo edit notebooks/resume_window.py -- --run RUN_DIR
[--other RUN_DIR]`. Every number and picture comes from `birdjepa.analysis`; this file only wires
controls to it."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import os
    from pathlib import Path

    import marimo as mo

    from birdjepa import analysis
    from birdjepa.analysis import figures

    return Path, analysis, figures, mo, os


@app.cell
def _(mo, os):
    # A run directory (or metrics.jsonl / CSV export), from `-- --run ...` or $BIRDJEPA_RUN.
    run_path = mo.cli_args().get("run") or os.environ.get("BIRDJEPA_RUN", "runs/demo")
    other_path = mo.cli_args().get("other") or os.environ.get("BIRDJEPA_OTHER") or None
    return other_path, run_path


@app.cell
def _(Path, analysis, other_path, run_path):
    log = analysis.load_run(Path(run_path))
    other = analysis.load_run(Path(other_path)) if other_path else None
    return log, other


@app.cell
def _(analysis, log, mo):
    present = [m for m in analysis.DEFAULT_METRICS if m in log.metrics] or sorted(log.metrics)
    metric = mo.ui.dropdown(options=sorted(log.metrics), value=present[0], label="metric")
    width = mo.ui.slider(2, 100, value=20, label="window ±W steps")
    mo.vstack([mo.md(f"**{log.name}**: {len(log.steps)} steps, {len(log.resumes)} resume(s)"), metric, width])
    return metric, width


@app.cell
def _(analysis, log, metric, other, width):
    found = analysis.jumps(log, [metric.value], width.value, other)
    return (found,)


@app.cell
def _(figures, found, log, metric, other, width):
    window_fig = figures.resume_windows(log, metric.value, width.value, other=other, found=found)
    window_fig
    return (window_fig,)


@app.cell
def _(analysis, found, log, mo, other, width):
    whole = analysis.max_abs_diff(log, other) if other is not None else None
    mo.md(analysis.summary_markdown(log, found, width.value, other, whole))
    return


@app.cell
def _(figures, log, metric, other):
    overview_fig = figures.overview(log, [metric.value], other=other)
    overview_fig
    return (overview_fig,)


if __name__ == "__main__":
    app.run()
