"""``provrl report RUN``: the run's results as Markdown + PNG (also written at the end of a run).

Sections: held-out test accuracy and tool calls per solved task for every evaluated policy
(binomial standard errors, SE = √(p̂(1−p̂)/(n·k)), and the task-clustered SE; RL vs warm start
paired over tasks); the probe-and-filter verdict; RL curves (reward, batch accuracy, tool
calls per step); the version-lag histogram of trained tokens; importance-weight statistics
(ESS of w(τ), KL(q‖π), clip fraction); engine and trainer throughput and idle fractions;
with ``engine.backend: ray``, versions per replica over time and the fault counters
(:mod:`provrl.distributed.fleet_report`); wall time per stage; one mixed-version trajectory,
token by token.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from provrl.distributed.fleet_report import ray_section
from provrl.models.loading import load_tokenizer
from provrl.pipeline.stages import paired_difference, solved_efficiency
from provrl.pipeline.steplog import read_steps
from provrl.trajlog import read_all, read_trajectories

nan = float("nan")

ORDER = ("base", "warmstart", "selfsft", "rl")
IS_KEYS = (
    "ess_frac",
    "log_w_mean",
    "kl_q_pi_k3",
    "clip_frac",
    "masked_frac",
    "ratio_q99",
    "lag_mean",
)


def _load(run: Path, stage: str) -> dict[str, Any]:
    p = run / stage / "done.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def write_report(run_dir: str | Path) -> Path:
    """Write ``RUN/report/report.md`` and its PNGs; return the Markdown path."""
    run = Path(run_dir)
    out = run / "report"
    out.mkdir(parents=True, exist_ok=True)
    ev, rl, steps = _load(run, "eval"), _load(run, "rl"), read_steps(run)
    md = [f"# provrl run report — `{run}`", ""]

    # 1. held-out results --------------------------------------------------------------
    names = [n for n in ORDER if n in ev and isinstance(ev[n], dict)]
    for n in names:
        if "task_accuracy" not in ev[n] and (run / "eval" / n / "trajectories.jsonl").is_file():
            ev[n] |= solved_efficiency(read_all(run / "eval" / n / "trajectories.jsonl"))
    if names:
        md += [
            "## Test split (never trained or filtered on)",
            "",
            "| policy | accuracy ± SE (samples) ± SE (tasks) | tool calls / solved task | "
            "oracle min of those tasks | excess calls | tool calls / episode | "
            "tokens / episode | answered | tasks × k |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for n in names:
            e = ev[n]
            md.append(
                f"| {n} | {e['accuracy']:.3f} ± {e.get('accuracy_se', nan):.3f} ± "
                f"{e.get('accuracy_se_tasks', nan):.3f} | "
                f"{e.get('mean_tool_calls_solved', nan):.2f} | "
                f"{e.get('oracle_min_tool_calls_solved', nan):.2f} | "
                f"{e.get('excess_tool_calls_solved', nan):+.0%} | "
                f"{e['mean_tool_calls']:.2f} | {e['mean_tokens']:.0f} | "
                f"{e['answered_rate']:.2f} | {e['n']} × {e['k']} |"
            )
        first = ev[names[0]]
        md += ["", f"Oracle minimum tool calls per task: {first['mean_min_searches']:.2f}."]
        tiers = [t for t, b in first.get("per_tier", {}).items() if b.get("tasks")]
        if len(tiers) > 1:
            md += [
                "",
                "| policy | "
                + " | ".join(f"tier {t} accuracy (calls/solved)" for t in tiers)
                + " |",
            ]
            md.append("| --- |" + " --- |" * len(tiers))
            for n in names:
                cells = []
                for t in tiers:
                    b = ev[n]["per_tier"][t]
                    cells.append(
                        f"{b['accuracy']:.3f} ({b.get('mean_tool_calls_solved', nan):.2f})"
                    )
                md.append(f"| {n} | " + " | ".join(cells) + " |")
        if "warmstart" in ev and "rl" in ev:
            md += ["", rl_vs_warmstart(ev["warmstart"], ev["rl"])]
        md += ["", f"![test results]({_plot_eval(ev, names, out).name})", ""]

    # filter -----------------------------------------------------------------------------
    filt = _load(run, "filter")
    if filt:
        lo, hi = filt.get("band", [1, filt["k"] - 1])
        md += [
            "## Probe and filter",
            "",
            f"k = {filt['k']} probes per task; kept band {lo} ≤ K ≤ {hi}; K histogram "
            f"{filt['K_histogram']}; pools: "
            + ", ".join(f"{p} {n}" for p, n in filt["sizes"].items())
            + ".",
        ]
        r = filt.get("retention")
        if r:
            b = r["beta_prior"]
            md += [
                "",
                f"Kept fraction {r['observed_kept_frac']:.3f} ± {r['observed_kept_frac_se']:.3f} "
                f"observed, {r['predicted_kept_frac']:.3f} predicted by the fitted "
                f"Beta({b['a']:.3g}, {b['b']:.3g}) prior; "
                f"{r['kept_per_probe_rollout']:.4f} tasks kept per probe rollout.",
                "",
                "![retention](../filter/retention.png)",
            ]
        md.append("")

    # 2. RL curves, lag, importance weights ---------------------------------------------
    if steps:
        md += ["## RL", "", f"![RL curves]({_plot_curves(steps, out).name})", ""]
        lags: Counter[int] = Counter()
        for s in steps:
            lags.update({int(k): v for k, v in s.get("lag_histogram", {}).items()})
        md += [f"![version lag]({_plot_lags(lags, out).name})", ""]
        md += ["| step | " + " | ".join(IS_KEYS) + " |", "|" + " --- |" * (len(IS_KEYS) + 1)]
        for s in steps:
            cells = [f"{s[k]:.3g}" if isinstance(s.get(k), int | float) else "-" for k in IS_KEYS]
            md.append(f"| {s['step']} | " + " | ".join(cells) + " |")
        md.append("")
    if rl:
        c = rl.get("collector", {})
        md += [
            "## Throughput and idle time (RL stage)",
            "",
            f"- mode **{rl['mode']}**, {rl['steps']} steps, {rl['trajectories_trained']} "
            f"trajectories trained, {rl.get('groups_dropped_stale', 0)} stale groups dropped",
            f"- wall {rl['wall_s']:.0f} s; trainer busy {rl['trainer_busy_s']:.0f} s "
            f"(idle {rl['trainer_idle_frac']:.0%}); engine busy {rl['engine_busy_frac']:.0%}",
            f"- rollouts: {c.get('episodes', 0)} episodes, {c.get('tokens_per_s', 0):.0f} "
            f"generated tokens/s, mean batch occupancy {c.get('mean_batch_occupancy', 0):.1f}",
            f"- tool errors: {c.get('tool_errors', 0)} of {c.get('tool_calls_run', 0)} search/open "
            f"calls ({c.get('tool_error_rate', 0.0):.1%}) ended in an error observation",
            "",
        ]

        md += ray_section(run, rl, steps, out)
        md += curriculum_section(rl, steps, out)
        md += mixing_section(steps)

    warm = _load(run, "warmstart")
    if warm.get("teacher_calls"):
        md += teacher_section(warm)

    # 3. wall time per stage -------------------------------------------------------------------
    md += ["## Wall time per stage", "", "| stage | seconds |", "| --- | --- |"]
    for p in sorted(run.glob("*/done.json"), key=lambda p: p.stat().st_mtime):
        d = json.loads(p.read_text())
        wall = d.get("stage_wall_s", d.get("wall_s"))
        if isinstance(wall, int | float):
            md.append(f"| {p.parent.name} | {wall:.0f} |")
    md.append("")

    # 4. one mixed-version trajectory ------------------------------------------------------
    mixed = _mixed_trajectory(run)
    if mixed:
        md += ["## One mixed-version trajectory", "", mixed, ""]
    elif (run / "rl" / "trajectories.jsonl").is_file():
        md += [
            "## Mixed-version trajectories",
            "",
            "None in this run: every RL episode was sampled between two hot-loads (each "
            "finished before the next swap; see the lag histogram). Mixing needs episodes "
            "still generating when a step ends — longer episodes, slower tools, or a faster "
            "trainer.",
            "",
        ]
    path = out / "report.md"
    path.write_text("\n".join(md))
    return path


def teacher_section(warm: dict[str, Any]) -> list[str]:
    """Whose traces the warm start imitated, and how many tool calls they make."""
    tc = warm["teacher_calls"]
    md = [
        f"## Warm-start teacher: {warm.get('source', '?')}",
        "",
        f"{tc['traces']} traces, {tc['calls_mean']:.2f} tool calls each against the minimal "
        f"plan's {tc['calls_min_plan_mean']:.2f} ({tc['calls_over_min_plan']:.2f}x); "
        f"histogram {tc['calls_histogram']}.",
        "",
        "| tier | traces | calls | minimal plan | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for tier, b in tc.get("per_tier", {}).items():
        md.append(
            f"| {tier} | {b['traces']} | {b['calls_mean']:.2f} | "
            f"{b['calls_min_plan_mean']:.2f} | {b['calls_over_min_plan']:.2f} |"
        )
    return [*md, ""]


def curriculum_section(rl: dict[str, Any], steps: list[dict[str, Any]], out: Path) -> list[str]:
    """Pools over versions, their transitions, and the compute spent on groups without
    signal."""
    cur, zs = rl.get("curriculum"), rl.get("zero_signal")
    if not cur or not zs:
        return []
    md = [
        "## Curriculum and signal",
        "",
        f"- pools at the end: {cur['pools']}; transitions {cur['transitions'] or 'none'} over "
        f"{cur['groups_started']} groups started",
        f"- groups without signal (all rewards equal): {zs['zero_signal_groups']} of "
        f"{zs['groups']} ({zs['groups_frac']:.0%}), {zs['tokens_frac']:.0%} of the rollout "
        f"tokens; {zs['trajectories_skipped']} trajectories skipped (never trained)",
        "",
    ]
    pools = [(s["version"], s["pools"]) for s in steps if isinstance(s.get("pools"), dict)]
    if pools:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.2))
        for name in ("kept", "unsolved", "solved"):
            ax.plot([v for v, _ in pools], [p.get(name, 0) for _, p in pools], marker=".", label=name)  # fmt: skip
        ax.set_xlabel("policy version")
        ax.set_ylabel("tasks")
        ax.set_title("curriculum pools")
        ax.legend()
        fig.tight_layout()
        png = out / "pools.png"
        fig.savefig(png, dpi=120)
        plt.close(fig)
        md += [f"![pools]({png.name})", ""]
    return md


def mixing_section(steps: list[dict[str, Any]]) -> list[str]:
    """How many trained trajectories span two or more policy versions, step by step."""
    trained = [len(s.get("trained", [])) for s in steps]
    mixed = [int(s.get("mixed_version_trajectories", 0)) for s in steps]
    if not sum(trained):
        return []
    rows = " ".join(f"{m}/{t}" for m, t in zip(mixed, trained, strict=True))
    md = [
        f"Trained trajectories that span ≥ 2 policy versions: {sum(mixed)} of {sum(trained)} "
        f"({sum(mixed) / sum(trained):.0%}); per step {rows}.",
        "",
    ]
    kv = [s["kv_stale_share"] for s in steps if "kv_stale_share" in s]
    if kv:
        md += [
            "KV staleness (keep-mode hot-load): share of trained action tokens that attended to "
            f"KV computed under older weights, per step {' '.join(f'{k:.0%}' for k in kv)} "
            f"(mean {np.mean(kv):.0%}).",
            "",
        ]
    zs = [s["zero_signal_share"] for s in steps if "zero_signal_share" in s]
    ds = [s["distinct_share"] for s in steps if "distinct_share" in s]
    if zs and ds:
        md += [
            f"Signal per step: groups finished without signal {' '.join(f'{z:.0%}' for z in zs)} "
            f"(mean {np.mean(zs):.0%}); distinct samples in the trained groups "
            f"{' '.join(f'{d:.0%}' for d in ds)} (mean {np.mean(ds):.0%}).",
            "",
        ]
    return md


def rl_vs_warmstart(w: dict[str, Any], r: dict[str, Any]) -> str:
    """The headline: accuracy difference (paired over tasks when both have per-task
    accuracies) and the cut in tool calls per solved task."""
    if "task_accuracy" in w and "task_accuracy" in r:
        pd = paired_difference(w["task_accuracy"], r["task_accuracy"])
        d_acc, se, how = pd["diff"], pd["se"], f"paired over {pd['tasks']:.0f} tasks"
    else:
        d_acc = r["accuracy"] - w["accuracy"]
        se, how = math.hypot(w.get("accuracy_se", 0.0), r.get("accuracy_se", 0.0)), "binomial"
    cw, cr = w.get("mean_tool_calls_solved", nan), r.get("mean_tool_calls_solved", nan)
    change = cr / cw - 1 if cw and cw == cw and cr == cr else nan
    ex = r.get("excess_tool_calls_solved", nan)
    return (
        f"**RL vs warm start:** accuracy {d_acc * 100:+.1f} points (SE {se * 100:.1f}, {how}; "
        f"{d_acc / se if se else nan:+.1f} SE); tool calls per solved task {cw:.2f} → "
        f"{cr:.2f} ({change:+.0%}); RL's solved episodes use {ex:+.0%} calls over the oracle "
        "minimum of their tasks."
    )


def _mixed_trajectory(run: Path) -> str | None:
    """A representative RL trajectory whose actions came from more than one version: among
    the mixed-version ones that answered correctly (all of them if none did), the one of
    median length — not the longest, which is usually a degenerate loop to the token limit.
    Rendered with each action span tagged ⟦v⟧ and tool/prompt text quoted."""
    log = run / "rl" / "trajectories.jsonl"
    if not log.is_file():
        return None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mixed = [
            t
            for t in read_trajectories(log, strict=False)
            if len(np.unique(t.version[t.is_action])) > 1
        ]
    if not mixed:
        return None
    answered = [t for t in mixed if t.metrics.get("exact_match", 0.0) > 0] or mixed
    answered.sort(key=lambda t: (t.num_actions, t.traj_id))
    best = answered[len(answered) // 2]
    cfg = (run / "config.yaml").read_text() if (run / "config.yaml").is_file() else ""
    name = "smollm2-135m"
    for line in cfg.splitlines():
        if line.strip().startswith("name:"):
            name = line.split(":", 1)[1].strip()
            break

    tok = load_tokenizer(name)
    parts, start = [], int(np.argmax(best.is_action))  # skip the prompt
    ids, act, ver = best.token_id, best.is_action, best.version
    i = start
    while i < len(ids):
        j = i
        while j < len(ids) and act[j] == act[i] and (not act[i] or ver[j] == ver[i]):
            j += 1
        text = tok.decode(ids[i:j].tolist(), skip_special_tokens=False).replace("\n", "⏎")
        parts.append(f"**⟦v{int(ver[i])}⟧** {text}" if act[i] else f"> {text}")
        i = j
    head = (
        f"`{best.traj_id}` (task {best.task_id}, reward {best.reward}): actions by version "
        f"{dict(Counter(best.version[best.is_action].tolist()))}; KV older than the sampling "
        f"version on {float((best.kv_min[best.is_action] < best.version[best.is_action]).mean()):.0%}"
        " of action tokens."
    )
    return head + "\n\n" + "\n\n".join(parts)


def _plot_eval(ev: dict[str, Any], names: list[str], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    x = np.arange(len(names))
    a1.bar(
        x,
        [ev[n]["accuracy"] for n in names],
        yerr=[ev[n].get("accuracy_se", 0) for n in names],
        capsize=4,
        color="tab:blue",
    )
    a1.set_xticks(x, names)
    a1.set_ylabel("test accuracy (EM)")
    a2.bar(x, [ev[n].get("mean_tool_calls_solved", np.nan) for n in names], color="tab:orange")
    a2.axhline(ev[names[0]]["mean_min_searches"], color="k", ls="--", lw=1, label="oracle min")
    a2.set_xticks(x, names)
    a2.set_ylabel("tool calls per solved task")
    a2.legend(fontsize=8)
    fig.tight_layout()
    p = out / "eval.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _plot_curves(steps: list[dict[str, Any]], out: Path) -> Path:
    """Per RL step (the record's 1-based ``step``): reward, accuracy, tool calls, and the
    signal of the batch — the share of groups finished since the previous step that had no
    signal, the share of distinct samples in the trained groups, and the share of trained
    trajectories that span ≥ 2 policy versions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def col(key: str) -> list[float]:
        return [float(s[key]) if isinstance(s.get(key), int | float) else np.nan for s in steps]

    x = [s["step"] for s in steps]
    mixed = [
        int(s.get("mixed_version_trajectories", 0)) / max(1, len(s.get("trained", [])))
        for s in steps
    ]
    panels: list[tuple[str, list[tuple[str, list[float]]]]] = [
        ("batch reward", [("reward", col("reward_mean"))]),
        ("batch accuracy", [("accuracy", col("accuracy"))]),
        (
            "tool calls",
            [("per episode", col("tool_calls")), ("per solved", col("tool_calls_solved"))],
        ),
        (
            "signal",
            [
                ("zero-signal groups", col("zero_signal_share")),
                ("distinct samples", col("distinct_share")),
            ],
        ),
        ("provenance", [("mixed-version trajectories", mixed)]),
        ("policy entropy", [("entropy", col("entropy"))]),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, (title, lines) in zip(axes.flat, panels, strict=True):
        for label, ys in lines:
            ax.plot(x, ys, marker="o", ms=3, label=label)
        if len(lines) > 1 or title in ("signal", "provenance"):
            ax.legend(fontsize=7)
        if title in ("signal", "provenance"):
            ax.set_ylim(-0.02, 1.02)
            ax.set_ylabel("share")
        ax.set_xlabel("RL step")
        ax.set_title(title)
    fig.tight_layout()
    p = out / "rl_curves.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def _plot_lags(lags: Counter[int], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ks = sorted(lags) or [0]
    ax.bar(ks, [lags.get(k, 0) for k in ks])
    ax.set_xlabel("version lag u − v_t of trained action tokens")
    ax.set_ylabel("tokens")
    ax.set_xticks(ks)
    fig.tight_layout()
    p = out / "version_lag.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
