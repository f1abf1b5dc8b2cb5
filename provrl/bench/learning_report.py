"""What ``provrl bench learning``'s record shows: issue 32's targets checked against it, and
its plot (per seed: warm start vs RL accuracy and tool calls per solved task, per tier).

Targets (the seed's shape: accuracy up **and** tool calls down, on mixed-version batches)::

    mean gain            mean_s g_s ≥ 10 points          g_s: paired gain of seed s (points)
    every seed above 0   g_s − 1.96·SE_s > 0              its paired 95 % interval
    calls cut            1 − c_RL,s / c_warm ≥ 0.25       c: tool calls per solved test task
    no tier falls        acc_RL,s,tier ≥ acc_warm,tier    every seed, every tier
    mixed versions       m_s ≥ 0.20                       trained trajectories spanning ≥ 2
    second world         mean_s g2_s ≥ 8 points           the same checkpoints, another world

Both functions read only the record, so a finished ``results/learning.json`` can be checked
and drawn again without rerunning anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

Z95 = 1.959963984540054
"""Two-sided 95 % normal quantile, for a seed's paired interval g ± z·SE."""

TARGETS = {
    "mean_gain_points": 10.0,
    "calls_cut_frac": 0.25,
    "mixed_version_frac": 0.20,
    "second_world_mean_gain_points": 8.0,
}
"""Issue 32's done-when thresholds."""


def _f(x: Any) -> float:
    """A record's number; null (what strict JSON writes for NaN: a seed that solved nothing
    has no calls per solved task) is NaN again, and fails every threshold."""
    return math.nan if x is None else float(x)


def targets(result: Mapping[str, Any]) -> dict[str, Any]:
    """Each target of the module docstring: the measured value(s) and whether it holds."""
    rows = list(result["seeds"])
    gains = [_f(r["accuracy_gain_points"]) for r in rows]
    lows = [_f(r["accuracy_gain_points"]) - Z95 * _f(r["accuracy_gain_se"]) for r in rows]
    cuts = [_f(r["tool_calls_solved_cut_frac"]) for r in rows]
    mixed = [_f(r["mixed_version_frac"]) for r in rows]
    w2 = [_f(r["second_world_gain_points"]) for r in rows]
    tier_gain = {
        f"seed {r['seed']} tier {k}": _f(v["gain_points"]) for r in rows
        for k, v in r["per_tier"].items()
    }  # fmt: skip
    checks = {
        "mean_gain": {"value": float(np.mean(gains)), "holds": np.mean(gains) >= TARGETS["mean_gain_points"]},
        "every_seed_interval_above_0": {"value": lows, "holds": all(x > 0 for x in lows)},
        "calls_cut_every_seed": {"value": cuts, "holds": all(c >= TARGETS["calls_cut_frac"] for c in cuts)},
        "no_tier_falls": {"value": tier_gain, "holds": all(g >= 0 for g in tier_gain.values())},
        "mixed_every_seed": {"value": mixed, "holds": all(m >= TARGETS["mixed_version_frac"] for m in mixed)},
        "second_world_mean_gain": {"value": float(np.mean(w2)), "holds": np.mean(w2) >= TARGETS["second_world_mean_gain_points"]},
    }  # fmt: skip
    for c in checks.values():
        c["holds"] = bool(c["holds"])
    return {"checks": checks, "all_hold": all(c["holds"] for c in checks.values())}


def plot_learning(result: Mapping[str, Any], png: str | Path) -> Path:
    """Two panels per world (test split, second world): accuracy and tool calls per solved
    task per tier, the warm start as a bar and each RL seed as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(result["seeds"])
    worlds = [("per_tier", "test split"), ("second_world_per_tier", "second world")]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), constrained_layout=True)
    metrics = [
        ("accuracy", "accuracy (exact match)"),
        ("tool_calls_solved", "tool calls per solved task"),
    ]
    for i, (key, world) in enumerate(worlds):
        tiers = sorted(rows[0][key], key=int)
        for j, (m, label) in enumerate(metrics):
            ax = axes[i][j]
            x = np.arange(len(tiers))
            warm = [_f(rows[0][key][t][f"warmstart_{m}"]) for t in tiers]
            ax.bar(x, warm, width=0.5, color="0.8", label="warm start")
            for s, r in enumerate(rows):
                ys = [_f(r[key][t][f"rl_{m}"]) for t in tiers]
                ax.scatter(x + (s - (len(rows) - 1) / 2) * 0.12, ys, zorder=3,
                           label=f"RL seed {r['seed']}")  # fmt: skip
            ax.set_xticks(x, [f"tier {t}" for t in tiers])
            ax.set_ylabel(label)
            ax.set_title(f"{world}: {label}")
            if m == "accuracy":
                ax.set_ylim(-0.03, 1.03)
            ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()  # below the panels, off the data
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=9)
    gain = _f(result.get("mean", {}).get("accuracy_gain_points"))
    cuts = " / ".join(f"{100 * _f(r.get('tool_calls_solved_cut_frac')):.0f}" for r in rows)
    fig.suptitle(
        f"bench learning, preset {result.get('preset', '?')}: {len(rows)} RL seeds from one warm "
        f"start, k={result.get('eval_k', '?')}\nmean gain {gain:+.1f} points on test; tool calls "
        f"per solved task cut {cuts} % (seed by seed)",
        fontsize=11,
    )
    out = Path(png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def learning_markdown(result: Mapping[str, Any], link: str = "../results/learning.json") -> str:
    """The docs' tables of a record: per seed (paired gain and SE, each tier's warm start →
    RL accuracy, the cut in tool calls per solved task, the mixed-version share, the
    second-world gain) and issue 32's targets — every figure a link ``[v](link#key.path)``
    into the record, the form ``tests/test_results.py`` checks against it."""

    def fig(value: Any, path: str, fmt: str, scale: float = 1.0) -> str:
        x = _f(value)
        if not math.isfinite(x):
            return "–"
        anchor = f"{path}*{scale:g}" if scale != 1.0 else path
        return f"[{format(x * scale, fmt)}]({link}#{anchor})"

    def pct(value: Any, path: str) -> str:
        shown = fig(value, path, ".0f", 100)
        return shown + " %" if shown != "–" else shown

    rows = list(result["seeds"])
    tiers = sorted(rows[0]["per_tier"], key=int) if rows else []
    head = ["seed", "gain (points, SE)", *[f"tier {t}" for t in tiers], "calls / solved cut",
            "mixed-version", "second world"]  # fmt: skip
    out = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, r in enumerate(rows):
        p = f"seeds.{i}"
        cells = [str(r["seed"]),
                 f"{fig(r['accuracy_gain_points'], f'{p}.accuracy_gain_points', '+.1f')} "
                 f"({fig(r['accuracy_gain_se'], f'{p}.accuracy_gain_se', '.1f')})"]  # fmt: skip
        for t in tiers:
            q = f"{p}.per_tier.{t}"
            cells.append(f"{fig(r['per_tier'][t]['warmstart_accuracy'], f'{q}.warmstart_accuracy', '.2f')}"
                         f" → {fig(r['per_tier'][t]['rl_accuracy'], f'{q}.rl_accuracy', '.2f')}")  # fmt: skip
        cells.append(pct(r["tool_calls_solved_cut_frac"], f"{p}.tool_calls_solved_cut_frac"))
        cells.append(pct(r["mixed_version_frac"], f"{p}.mixed_version_frac"))
        cells.append(fig(r["second_world_gain_points"], f"{p}.second_world_gain_points", "+.1f"))
        out.append("| " + " | ".join(cells) + " |")
    checks = targets(result)["checks"]
    yes = {c: "yes" if checks[c]["holds"] else "no" for c in checks}
    n = len(rows)
    fell = [k for k, g in checks["no_tier_falls"]["value"].items() if not g >= 0]
    out += ["", "| target | measured | holds |", "| --- | --- | --- |"]
    out.append(f"| mean gain ≥ {TARGETS['mean_gain_points']:g} points | "
               f"{fig(checks['mean_gain']['value'], 'targets.checks.mean_gain.value', '+.1f')} | {yes['mean_gain']} |")  # fmt: skip
    lows = ", ".join(fig(v, f"targets.checks.every_seed_interval_above_0.value.{i}", ".1f")
                     for i, v in enumerate(checks["every_seed_interval_above_0"]["value"]))  # fmt: skip
    out.append(f"| each seed's paired 95 % interval above 0 | lower ends {lows} | {yes['every_seed_interval_above_0']} |")  # fmt: skip
    cuts = ", ".join(pct(r["tool_calls_solved_cut_frac"], f"seeds.{i}.tool_calls_solved_cut_frac") for i, r in enumerate(rows))  # fmt: skip
    out.append(f"| calls per solved task ≥ {100 * TARGETS['calls_cut_frac']:g} % below the warm start, every seed | {cuts} | {yes['calls_cut_every_seed']} |")  # fmt: skip
    out.append(f"| no tier's accuracy falls | {'falls: ' + '; '.join(fell) if fell else f'none of {n} seeds × {len(tiers)} tiers'} | {yes['no_tier_falls']} |")  # fmt: skip
    mixed = ", ".join(pct(r["mixed_version_frac"], f"seeds.{i}.mixed_version_frac") for i, r in enumerate(rows))  # fmt: skip
    out.append(f"| ≥ {100 * TARGETS['mixed_version_frac']:g} % of trained trajectories span ≥ 2 versions, every seed | {mixed} | {yes['mixed_every_seed']} |")  # fmt: skip
    out.append(f"| second world: mean gain ≥ {TARGETS['second_world_mean_gain_points']:g} points | "
               f"{fig(checks['second_world_mean_gain']['value'], 'targets.checks.second_world_mean_gain.value', '+.1f')} | {yes['second_world_mean_gain']} |")  # fmt: skip
    return "\n".join(out) + "\n"
