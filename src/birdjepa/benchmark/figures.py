"""The few-shot figure: cmAP against recordings per class, one panel per task, a line per backbone
(colour) and probe (line style), the spread over seeds as a band (min to max)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from birdjepa.benchmark.fewshot import ALL

if TYPE_CHECKING:  # matplotlib is imported when a figure is drawn, not with the benchmark
    from matplotlib.artist import Artist
    from matplotlib.figure import Figure


def figure_formats() -> list[str]:
    """The file extensions matplotlib writes a figure as (png, pdf, svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def fewshot_curves(rows: list[dict], metric: str = "cmap") -> Figure:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    if not tasks:
        raise ValueError("the store holds no result to draw")
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    finite = sorted({r["n"] for r in rows if r["n"] != ALL})
    at_all = 2 * max(finite) if finite else 1  # "all" drawn one octave right of the largest n
    # Each backbone a colour and each probe a line and marker of its own: with the docs' five probes,
    # proto drew as attentive (four line styles), and past ten backbones the colours came round again.
    backbones = sorted({r["backbone"] for r in rows})
    spread = plt.get_cmap("turbo")(np.linspace(0.05, 0.95, len(backbones)))
    colours = {b: f"C{i}" if len(backbones) <= 10 else spread[i] for i, b in enumerate(backbones)}
    styles = {
        p: (("-", "--", ":", "-.")[i % 4], "os^Dvx"[i % 6])
        for i, p in enumerate(sorted({r["probe"] for r in rows}))
    }
    for ax, task in zip(axes[0], tasks, strict=True):
        curves: dict[tuple[str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            if r["task"] == task:
                curves[(r["backbone"], r["probe"])][r["n"]].append(r[metric])
        for (backbone, probe), by_n in sorted(curves.items()):
            ns = sorted(by_n, key=lambda n: at_all if n == ALL else n)
            x = [at_all if n == ALL else n for n in ns]
            values = [np.asarray(by_n[n]) for n in ns]
            colour = colours[backbone]
            line, marker = styles[probe]
            ax.plot(x, [v.mean() for v in values], line, color=colour, marker=marker, ms=3,
                    label=f"{backbone} / {probe}")  # fmt: skip
            ax.fill_between(x, [v.min() for v in values], [v.max() for v in values], color=colour, alpha=0.12)
        ax.set_xscale("log", base=2)
        ticks = [*finite, at_all] if finite else [at_all]
        ax.set_xticks(ticks, [*map(str, finite), "all"] if finite else ["all"])
        ax.set_xlabel("train recordings per class")
        ax.set_ylabel(metric)
        ax.set_title(task)
        ax.grid(alpha=0.3)
    lines: dict[str, Artist] = {}  # every panel's: a backbone or probe scored on one task only is named too
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            lines.setdefault(label, handle)
    labels = sorted(lines)
    legend_below(fig, [lines[label] for label in labels], labels)
    return fig


def legend_below(fig: Figure, handles: list[Artist], labels: list[str], most_columns: int = 3) -> None:
    """The legend under the panels in as many columns (up to ``most_columns``) as fit the figure's width,
    measured once drawn: a backbone's name is as long as its user made it (``raw:logmel-mean-std+
    patches16x128``), and a fixed count of columns cut the outer ones off at the figure's edges."""
    renderer = fig.canvas.get_renderer()
    for columns in range(min(most_columns, len(labels)), 0, -1):
        legend = fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
        box = legend.get_window_extent(renderer)
        if columns == 1 or box.width <= fig.bbox.width:
            break
        legend.remove()
    grown = 1 + box.height / fig.bbox.height  # the panels keep their height: the figure grows below them
    fig.set_size_inches(fig.get_figwidth(), fig.get_figheight() * grown)
    fig.tight_layout(rect=(0, box.height / fig.bbox.height + 0.01, 1, 1))
