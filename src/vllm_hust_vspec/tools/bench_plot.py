"""The A/B benchmark's picture: output tok/s per configuration per cell, median with the
min..max spread over rounds as error bars.  One panel per workload, concurrencies on the x
axis, one bar per configuration."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

from .bench_results import CellSummary, Run, config_order, summarize


def plot_runs(runs: Sequence[Run], path: pathlib.Path, title: str = "",
              workload_order: Sequence[str] = ()) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = summarize(runs, workload_order)
    configs = config_order(runs)
    workloads = list(dict.fromkeys(c.workload for c in cells))
    fig, axes = plt.subplots(1, len(workloads), figsize=(max(4.0, 3.6 * len(workloads)), 4.2),
                             squeeze=False)
    width = 0.8 / max(1, len(configs))
    colors = plt.get_cmap("tab10")
    for ax, w in zip(axes[0], workloads):
        mine: list[CellSummary] = [c for c in cells if c.workload == w]
        xs = range(len(mine))
        for j, cfg in enumerate(configs):
            med, lo, hi, pos = [], [], [], []
            for i, c in zip(xs, mine):
                s = c.configs.get(cfg)
                if s is None:
                    continue
                pos.append(i + (j - (len(configs) - 1) / 2) * width)
                med.append(s.median)
                lo.append(s.median - s.lo)
                hi.append(s.hi - s.median)
            if pos:
                ax.bar(pos, med, width, yerr=[lo, hi], capsize=2, label=cfg, color=colors(j % 10))
        ax.set_xticks(list(xs), [str(c.concurrency) for c in mine])
        ax.set_title(w)
        ax.set_xlabel("concurrency")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("output tok/s (median, min-max)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(configs), 8), fontsize="small")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95 if title else 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
