"""PNG figures of the SFT and eval commands (matplotlib, Agg; the run report and the TRPO /
theory commands draw their own)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _integer_ticks() -> Any:
    """Ticks on whole numbers only (steps, task counts)."""
    from matplotlib.ticker import MaxNLocator

    return MaxNLocator(integer=True)


def plot_sft_loss(losses: Sequence[float], path: str | os.PathLike[str], title: str) -> Path:
    """The training loss per optimizer step (a skipped step leaves a gap)."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    ax.plot(np.arange(1, len(losses) + 1), np.asarray(losses, dtype=float), color="tab:blue",
            marker="o" if len(losses) <= 30 else None, ms=3)  # fmt: skip
    ax.xaxis.set_major_locator(_integer_ticks())
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("action-token NLL (nats)")
    ax.set_title(f"SFT loss — {title}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_eval(summary: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """An evaluation at a glance: pass@j against j (with the accuracy), and the histogram of
    K = successes per task out of k — the spread that probing and filtering act on."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    k = int(summary["k"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=120)
    js = sorted(int(key.split("@")[1]) for key in summary if key.startswith("pass@"))
    left.plot(js, [summary[f"pass@{j}"] for j in js], "o-", color="tab:blue", label="pass@j")
    left.axhline(summary["accuracy"], color="tab:green", ls="--", label="accuracy")
    left.set_xscale("log", base=2)
    left.set_xticks(js, [str(j) for j in js])
    left.set_ylim(-0.02, 1.02)  # a curve at 0 stays visible
    left.set_xlabel("j (samples)")
    left.set_ylabel("fraction of tasks")
    left.legend(fontsize=8, loc="lower right")
    left.grid(alpha=0.3)
    hist = summary.get("K_histogram", {})
    ks = np.arange(k + 1)
    right.bar(ks, [hist.get(str(j), 0) for j in ks], color="tab:orange")
    right.set_xticks(ks)
    right.set_xlabel(f"K = successes out of k = {k}")
    right.set_ylabel("tasks")
    right.yaxis.set_major_locator(_integer_ticks())
    right.grid(alpha=0.3, axis="y")
    where = summary.get("tasks_file") or summary.get("split")
    fig.suptitle(
        f"eval {summary['policy']} on {where}: n = {summary['n']}, "
        f"accuracy {summary['accuracy']:.3f}, {summary['mean_tool_calls']:.2f} tool calls",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


Series = tuple[str, Sequence[float], Sequence[float]]
"""A labelled line: (label, x, y); a NaN y leaves a gap."""


def plot_panels(
    panels: Sequence[tuple[str, str, Sequence[Series]]],
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    cols: int = 3,
    title: str = "",
) -> Path:
    """A grid of small line plots: each panel is (title, y label, lines). A panel whose
    lines hold no finite value says "not logged" instead of drawing empty axes; the y label
    ``share`` fixes the axis to [0, 1]; with few x values every one is a tick."""
    plt = _pyplot()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), dpi=110, squeeze=False)
    for ax, (name, ylabel, lines) in zip(axes.flat, panels, strict=False):
        ticks: set[float] = set()
        drawn = 0
        for label, xs, ys in lines:
            x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
            if len(y) and np.isfinite(y).any():
                ax.plot(x, y, marker="o", ms=3, label=label)
                ticks |= set(x.tolist())
                drawn += 1
        ax.set_title(name, fontsize=10)
        if not drawn:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        if drawn > 1:
            ax.legend(fontsize=7)
        if ylabel == "share":
            ax.set_ylim(-0.02, 1.02)
        ax.ticklabel_format(axis="y", useOffset=False)  # a flat curve: its value, not "1e-6+10.79"
        ax.set_ylabel(ylabel)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if len(ticks) <= 12:  # few steps: one tick each
            ax.set_xticks(sorted(ticks))
        else:  # steps and versions are whole numbers
            ax.xaxis.set_major_locator(_integer_ticks())
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
