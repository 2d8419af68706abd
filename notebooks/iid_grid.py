"""The loader's IID diagnostics of one run as a grid (interactive): `marimo edit notebooks/iid_grid.py --
--run RUN_DIR`. The panels and their IID references come from `birdjepa.analysis.figures.iid_grid`."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full")


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
    run_path = mo.cli_args().get("run") or os.environ.get("BIRDJEPA_RUN", "runs/demo")
    return (run_path,)


@app.cell
def _(Path, analysis, run_path):
    log = analysis.load_run(Path(run_path))
    return (log,)


@app.cell
def _(figures, log, mo):
    available = [m for m in sorted(log.metrics) if m.startswith("dataloader/")]
    panels = mo.ui.multiselect(
        options=available, value=[m for m in figures.IID_GRID if m in available], label="panels"
    )
    panels
    return (panels,)


@app.cell
def _(figures, log, panels):
    grid_fig = figures.iid_grid(log, tuple(panels.value))
    grid_fig
    return (grid_fig,)


if __name__ == "__main__":
    app.run()
