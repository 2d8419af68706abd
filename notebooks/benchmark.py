"""Few-shot curves of a benchmark store (interactive): `marimo edit notebooks/benchmark.py -- --results
DIR`. The table and the figure come from `birdjepa.benchmark` (the same as `birdjepa benchmark --table
DIR --plot FILE.png`); this file only wires controls to them."""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="full")


@app.cell
def _():
    import os
    from pathlib import Path

    import marimo as mo

    from birdjepa.benchmark.figures import fewshot_curves
    from birdjepa.benchmark.tables import format_store, stored_results

    return Path, fewshot_curves, format_store, mo, os, stored_results


@app.cell
def _(mo, os):
    results_path = mo.cli_args().get("results") or os.environ.get("BIRDJEPA_RESULTS", "results")
    return (results_path,)


@app.cell
def _(Path, results_path, stored_results):
    rows = stored_results(Path(results_path))  # no store, no results, mixed recipes: the CLI's one line
    return (rows,)


@app.cell
def _(mo, rows):
    metric = mo.ui.dropdown(options=["cmap", "auroc", "top1"], value="cmap", label="metric")
    probes = sorted({r["probe"] for r in rows})
    chosen = mo.ui.multiselect(options=probes, value=probes, label="probes")
    mo.hstack([metric, chosen])
    return chosen, metric


@app.cell
def _(chosen, fewshot_curves, metric, rows):
    shown = [r for r in rows if r["probe"] in chosen.value]
    curves_fig = fewshot_curves(shown, metric.value) if shown else None
    curves_fig
    return (curves_fig,)


@app.cell
def _(format_store, metric, mo, rows):
    mo.md(f"```\n{format_store(rows, metric.value)}\n```")
    return


if __name__ == "__main__":
    app.run()
