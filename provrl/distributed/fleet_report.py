"""The run report's Ray section: versions per replica over time, the fault counters, and
each replica's share of the trained tokens (read back from the trajectory log).

Written by ``provrl report`` when the RL stage ran on ``engine.backend: ray`` (its ``done.json``
holds ``ray``: :func:`provrl.distributed.factory.fleet_summary`).
"""

from __future__ import annotations

import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from provrl.trajlog import read_trajectories


def trained_tokens_per_replica(log: Path, trained: set[str]) -> tuple[Counter[int], Counter[int]]:
    """(action tokens, trajectories) per replica over the trajectories in ``trained``, from
    the per-token ``replica`` stamps of the log (a trajectory counts for every replica that
    sampled one of its tokens)."""
    tokens: Counter[int] = Counter()
    trajs: Counter[int] = Counter()
    if not log.is_file():
        return tokens, trajs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line after a kill
        for t in read_trajectories(log, strict=False):
            if t.traj_id not in trained:
                continue
            r = t.replica[t.is_action]
            tokens.update(r.tolist())
            trajs.update(np.unique(r).tolist())
    return tokens, trajs


def versions_over_time(timeline: list[list[float]], replica: int) -> str:
    """``v0 @ 0 s → v1 @ 12.3 s → …`` for one replica."""
    return " → ".join(f"v{int(v)} @ {t:.1f} s" for t, r, v in timeline if int(r) == replica)


def ray_section(run: Path, rl: dict[str, Any], steps: list[dict[str, Any]], out: Path) -> list[str]:
    """Markdown lines of the section (none when the RL stage did not run on Ray), and the
    plot ``out/ray_versions.png``."""
    fleet = rl.get("ray")
    if not fleet:
        return []
    trained = {i for s in steps for i in s.get("trained", [])}
    tokens, trajs = trained_tokens_per_replica(run / "rl" / "trajectories.jsonl", trained)
    f = fleet["faults"]
    md = [
        "## Ray replicas (RL stage)",
        "",
        f"{fleet['replicas']} replicas × {fleet['threads']} thread(s), hot-load schedule "
        f"**{fleet['schedule']}**; {fleet['published_versions']} versions published once each "
        f"({fleet['published_mb']:.0f} MB through the object store). Faults: {f['deaths']} "
        f"deaths, {f['restarts']} restarts, {f['turns_resubmitted']} turns resubmitted, "
        f"{f['turns_failed']} turns failed, {f['requests_reprefilled']} requests re-prefilled"
        f"; slowest recovery {f['recover_s_max']:.1f} s.",
        "",
        "| replica | versions over time | restarts | tokens generated | busy s | "
        "trained trajectories | trained action tokens |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(fleet["per_replica"]):
        md.append(
            f"| {i} | {versions_over_time(fleet['timeline'], i)} | {r['restarts']:.0f} | "
            f"{r['tokens_generated']:.0f} | {r['busy_s']:.0f} | {trajs.get(i, 0)} | "
            f"{tokens.get(i, 0)} |"
        )
    md += ["", f"![versions per replica]({_plot_timeline(fleet, out).name})", ""]
    return md


def _plot_timeline(fleet: dict[str, Any], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 2.8))
    end = max((t for t, _, _ in fleet["timeline"]), default=0.0)
    for i in range(fleet["replicas"]):
        pts = [(t, v) for t, r, v in fleet["timeline"] if int(r) == i]
        if not pts:
            continue
        xs = [t for t, _ in pts] + [end]
        ys = [v for _, v in pts] + [pts[-1][1]]
        ax.step(xs, [y + 0.04 * i for y in ys], where="post", label=f"replica {i}")
    ax.set_xlabel("seconds since the RL stage's engine started")
    ax.set_ylabel("weight version")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "ray_versions.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
