"""``provrl report RUN``: the run's results as Markdown + PNG (also written at the end of a run).

Sections: the run itself (commit, hardware — from ``RUN/sessions.jsonl`` — and the config's
difference from its preset); held-out test accuracy and tool calls per solved task for every evaluated policy
(binomial standard errors, SE = √(p̂(1−p̂)/(n·k)), and the task-clustered SE; RL vs warm start
paired over tasks); the probe-and-filter verdict; RL curves per step (reward, accuracy, rollout accuracy per
tier, tool calls, response length, entropy, grad norm, clip and mask fractions, zero-signal
share, mixed-version share, step time, RSS: :func:`rl_panels`); the version-lag histogram of trained tokens; importance-weight statistics
(ESS of w(τ), KL(q‖π), clip fraction); engine and trainer throughput and idle fractions;
with ``engine.backend: ray``, versions per replica over time and the fault counters
(:mod:`provrl.distributed.fleet_report`); wall time per stage; one mixed-version trajectory,
token by token.

A statistic that does not exist (tool calls per solved task when nothing was solved) is
``null`` in every JSON file and "–" in the report, never NaN.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from provrl._sys import git_state, machine
from provrl.config import CONFIG_DIR, ConfigError, dump_config, load_config, preset_path
from provrl.distributed.fleet_report import ray_section
from provrl.models.loading import load_tokenizer
from provrl.pipeline.rundir import RunDir
from provrl.pipeline.stages import paired_difference, solved_efficiency
from provrl.pipeline.steplog import read_steps
from provrl.report.plots import Series, plot_panels
from provrl.run_config.run import RunConfig
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
    md = [f"# provrl run report — `{run}`", "", *header_section(run)]

    # 1. held-out results --------------------------------------------------------------
    names = [n for n in ORDER if n in ev and isinstance(ev[n], dict)]
    for n in names:
        if "task_accuracy" not in ev[n] and (run / "eval" / n / "trajectories.jsonl").is_file():
            ev[n] |= solved_efficiency(read_all(run / "eval" / n / "trajectories.jsonl"))
    if names:
        md += [
            f"## {_split_name(ev[names[0]])} (never trained or filtered on)",
            "",
            "| policy | accuracy ± SE (samples) ± SE (tasks) | tool calls / solved task | "
            "oracle min of those tasks | excess calls | tool calls / episode | "
            "calls after the answer / solved task | repeated a call | tokens / episode | "
            "answered | tasks × k |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        oracle = _num(ev[names[0]].get("mean_min_searches")) > 0  # plain QA tasks: no plan
        for n in names:
            e = ev[n]
            md.append(
                f"| {n} | {_f(e['accuracy'])} ± {_f(e.get('accuracy_se'))} ± "
                f"{_f(e.get('accuracy_se_tasks'))} | "
                f"{_f(e.get('mean_tool_calls_solved'), '.2f')} | "
                f"{_f(e.get('oracle_min_tool_calls_solved') if oracle else None, '.2f')} | "
                f"{_f(e.get('excess_tool_calls_solved'), '+.0%')} | "
                f"{_f(e['mean_tool_calls'], '.2f')} | "
                f"{_f(e.get('mean_calls_after_answer_solved'), '.2f')} | "
                f"{_f(e.get('repeat_rate'), '.0%')} | "
                f"{_f(e['mean_tokens'], '.0f')} | "
                f"{_f(e['answered_rate'], '.2f')} | {e['n']} × {e['k']} |"
            )
        first = ev[names[0]]
        md += [
            "",
            (
                f"Oracle minimum tool calls per task: {_f(first['mean_min_searches'], '.2f')}."
                if oracle
                else "Your tasks have no oracle plan: the oracle columns are empty."
            )
            + (
                " –: no such number (tool calls per solved task when nothing was solved)."
                if any(not math.isfinite(_num(ev[n].get("mean_tool_calls_solved"))) for n in names)
                else ""
            ),
        ]
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
                        f"{_f(b['accuracy'])} ({_f(b.get('mean_tool_calls_solved'), '.2f')})"
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
                f"Kept fraction {_f(r['observed_kept_frac'])} ± {_f(r['observed_kept_frac_se'])} "
                f"observed, {_f(r['predicted_kept_frac'])} predicted by the fitted "
                f"Beta({b['a']:.3g}, {b['b']:.3g}) prior; "
                f"{r['kept_per_probe_rollout']:.4f} tasks kept per probe rollout.",
                "",
                "![retention](../filter/retention.png)",
            ]
        md.append("")

    # 2. RL curves, lag, importance weights ---------------------------------------------
    if steps:
        curves = plot_panels(
            rl_panels(steps, rollout_accuracy(run)),
            out / "rl_curves.png",
            xlabel="RL step",
            title="RL, per step (a rollout's policy version v is the weights after step v)",
        )
        md += [
            "## RL",
            "",
            f"![RL curves]({curves.name})",
            "",
            "Per step: the trained batch's reward and accuracy; the accuracy of *every* "
            "rollout by the policy version that started it (v = the weights after step v, 0 = "
            "before RL), overall and per tier — groups skipped for want of signal included; "
            "tool calls; response length (sampled tokens per trajectory); the policy's entropy "
            "on the trained tokens; the gradient norm before clipping; the shares of trained "
            "tokens clipped and masked by the correction; the share of groups finished "
            "without signal and of distinct samples; the share of trained trajectories that "
            "span two versions and of tokens that attended to older KV; the trainer's step "
            "time and the wall time between steps; resident memory.",
            "",
        ]
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
            f"- rollouts: {rl.get('episodes', c.get('episodes', 0))} episodes; "
            f"{c.get('tokens_per_s', 0):.0f} generated tokens/s, mean batch occupancy "
            f"{c.get('mean_batch_occupancy', 0):.1f} (the last session)",
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


def header_section(run: Path) -> list[str]:
    """Who ran it and with what: the commit and hardware of each session
    (``RUN/sessions.jsonl``; for a run that predates it, the report's own, said so), and the
    config's difference from its preset (:func:`config_diff`)."""
    sessions = RunDir(run).sessions()
    md = ["## The run", ""]
    if sessions:
        first = sessions[0]
        md.append(f"- commit {_commit(first)}, started {first.get('date', '?')}")
        md.append(f"- hardware: {hardware(first.get('machine', {}))}")
        for s in sessions[1:]:  # resumes: say what changed
            notes = []
            if s.get("commit") != first.get("commit"):
                notes.append("commit " + _commit(s))
            if hardware(s.get("machine", {})) != hardware(first.get("machine", {})):
                notes.append("hardware " + hardware(s.get("machine", {})))
            md.append(
                f"- resumed {s.get('date', '?')}" + (": " + "; ".join(notes) if notes else "")
            )
    else:
        commit, dirty = git_state()
        md.append(
            "- commit and hardware not recorded (the run predates `sessions.jsonl`); this "
            f"report was written at commit {_commit({'commit': commit, 'dirty': dirty})} on "
            f"{hardware(machine())}"
        )
    return [*md, "", *config_diff(run, sessions)]


def _commit(session: dict[str, Any]) -> str:
    c = str(session.get("commit", "unknown"))
    return f"`{c[:12]}`" + (" with uncommitted changes" if session.get("dirty") else "")


def hardware(m: dict[str, Any]) -> str:
    """One line for a :func:`provrl._sys.machine` record."""
    if not m:
        return "unknown"
    parts = [f"{m.get('cpus', '?')} CPUs ({m.get('cpu_model', '?')})"]
    if m.get("memory_gib"):
        parts.append(f"{m['memory_gib']} GiB RAM")
    parts.append(", ".join(m["gpus"]) if m.get("gpus") else "no GPU")
    if m.get("torch"):
        parts.append(f"torch {m['torch']} ({m.get('torch_threads', '?')} threads)")
    parts.append(f"Python {m.get('python', '?')}, {m.get('platform', '?')}")
    return "; ".join(parts)


def _config_tree(path: Path) -> dict[str, Any]:
    """Every setting of a config file (a preset or a run's ``config.yaml``), defaults filled,
    flattened to dotted keys."""
    tree = yaml.safe_load(dump_config(load_config(RunConfig, path)))

    def flat(node: Any, prefix: str) -> dict[str, Any]:
        if isinstance(node, dict) and node:
            return {
                k: v for key, sub in node.items() for k, v in flat(sub, f"{prefix}{key}.").items()
            }
        return {prefix[:-1]: node}

    return flat(tree, "")


def _preset_named(sessions: list[dict[str, Any]]) -> str | None:
    """The ``--preset`` / ``--config`` the first session's command line gave, if any."""
    cmd = [str(c) for c in (sessions[0].get("command", []) if sessions else [])]
    for flag in ("--preset", "--config"):
        if flag in cmd[:-1]:
            return cmd[cmd.index(flag) + 1]
        for c in cmd:
            if c.startswith(flag + "="):
                return c.split("=", 1)[1]
    return None


def config_diff(run: Path, sessions: list[dict[str, Any]]) -> list[str]:
    """The settings where the run's ``config.yaml`` differs from its preset: the one its
    command line named, else the nearest of ``configs/`` (fewest differing keys; ``default``
    on a tie). ``logging.run_dir`` is left out: it always differs."""
    path = run / "config.yaml"
    if not path.is_file():
        return []
    mine = _config_tree(path)
    named = _preset_named(sessions)
    candidates = [named] if named else sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    best: tuple[int, bool, str, list[str]] | None = None
    for name in candidates:
        try:
            theirs = _config_tree(preset_path(name))
        except (ConfigError, ValueError, OSError):  # moved, or not loadable here
            continue
        keys = [
            k
            for k in sorted(set(mine) | set(theirs))
            if k != "logging.run_dir" and mine.get(k) != theirs.get(k)
        ]
        rows = [f"| `{k}` | {_short(theirs.get(k))} | {_short(mine.get(k))} |" for k in keys]
        key = (len(keys), name != "default", name, rows)
        best = key if best is None or key[:3] < best[:3] else best
    if best is None:
        return [
            f"Config: `{path.name}` (no preset in `{CONFIG_DIR}` could be read to compare).",
            "",
        ]
    n, _, name, rows = best
    how = "named on its command line" if named else f"the nearest of {len(candidates)} presets"
    if not rows:
        return [f"Config: preset `{name}` ({how}) as it is, `logging.run_dir` aside.", ""]
    return [
        f"Config: preset `{name}` ({how}) with {n} setting(s) changed (`config.yaml` holds "
        "every setting):",
        "",
        f"| setting | `{name}` | this run |",
        "| --- | --- | --- |",
        *rows,
        "",
    ]


def _short(v: Any) -> str:
    text = json.dumps(v, default=str)
    text = text if len(text) <= 60 else text[:57] + "…"
    return "`" + text.replace("|", "\\|") + "`"


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
        from matplotlib.ticker import MaxNLocator

        fig, ax = plt.subplots(figsize=(6, 3.2))
        for name in ("kept", "unsolved", "solved"):
            ax.plot(
                [v for v, _ in pools], [p.get(name, 0) for _, p in pools], marker=".", label=name
            )
        ax.set_xlabel("policy version")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
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
        se = math.hypot(_num(w.get("accuracy_se", 0.0)), _num(r.get("accuracy_se", 0.0)))
        how = "binomial"
    cw, cr = _num(w.get("mean_tool_calls_solved")), _num(r.get("mean_tool_calls_solved"))
    change = cr / cw - 1 if cw else nan
    ex = r.get("excess_tool_calls_solved")
    return (
        f"**RL vs warm start:** accuracy {_f(d_acc * 100, '+.1f')} points (SE "
        f"{_f(se * 100, '.1f')}, {how}; {_f(d_acc / se if se else nan, '+.1f')} SE); tool calls "
        f"per solved task {_f(cw, '.2f')} → {_f(cr, '.2f')} ({_f(change, '+.0%')}); RL's solved "
        f"episodes use {_f(ex, '+.0%')} calls over the oracle minimum of their tasks."
    )


def _num(x: Any) -> float:
    """``x`` as a float; a statistic that does not exist (None, NaN, not a number) as NaN."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else nan


def _f(x: Any, spec: str = ".3f") -> str:
    """``x`` formatted with ``spec``; "–" where the statistic does not exist (None, NaN)."""
    v = _num(x)
    return format(v, spec) if math.isfinite(v) else "–"


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


def _split_name(e: dict[str, Any]) -> str:
    """ "Test split", "Dev split", or "Held-out tasks" (a task file's)."""
    return f"{str(e['split']).capitalize()} split" if e.get("split") else "Held-out tasks"


def _plot_eval(ev: dict[str, Any], names: list[str], out: Path) -> Path:
    """Accuracy (± binomial SE) and tool calls per solved task of each evaluated policy,
    against the oracle minimum; a policy that solved nothing says so instead of a bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(8, 3.2))
    x = np.arange(len(names))
    a1.bar(
        x,
        [_num(ev[n]["accuracy"]) for n in names],
        yerr=[np.nan_to_num(_num(ev[n].get("accuracy_se"))) for n in names],
        capsize=4,
        color="tab:blue",
    )
    a1.set_xticks(x, names)
    a1.set_ylim(0, 1)
    a1.set_ylabel(f"{_split_name(ev[names[0]]).lower()}: accuracy (EM)")
    calls = [_num(ev[n].get("mean_tool_calls_solved")) for n in names]
    oracle = _num(ev[names[0]].get("mean_min_searches"))
    a2.bar(x, np.nan_to_num(calls), color="tab:orange")
    top = max([c for c in [*calls, oracle] if math.isfinite(c)] + [1.0]) * 1.15
    for xi, c in zip(x, calls, strict=True):
        if not math.isfinite(c):
            a2.text(xi, top * 0.04, "none\nsolved", ha="center", va="bottom", fontsize=8)
    if oracle > 0:  # tasks with an oracle plan (the world's; plain QA tasks have none)
        a2.axhline(oracle, color="k", ls="--", lw=1, label="oracle min")
        a2.legend(fontsize=8)
    a2.set_xticks(x, names)
    a2.set_xlim(-0.6, len(names) - 0.4)
    a2.set_ylim(0, top)
    a2.set_ylabel("tool calls per solved task")
    fig.tight_layout()
    p = out / "eval.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def rollout_accuracy(run: Path) -> dict[str, dict[int, float]]:
    """Exact-match accuracy of every RL rollout (``RUN/rl/trajectories.jsonl``, trained or
    not) by the policy version of its first sampled token: ``{"all" | "tier N": {v: acc}}``.
    Tiers are named only when the run has more than one."""
    log = run / "rl" / "trajectories.jsonl"
    if not log.is_file():
        return {}
    import warnings

    hits: dict[tuple[str, int], list[float]] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in read_trajectories(log, strict=False):
            v = t.version[t.is_action]
            if not len(v):
                continue
            em = float(t.metrics.get("exact_match", 0.0))
            tier = f"tier {int(t.metrics.get('tier', 0))}"
            for key in ("all", tier):
                hits.setdefault((key, int(v[0])), []).append(em)
    out: dict[str, dict[int, float]] = {}
    for (key, v), ems in sorted(hits.items()):
        out.setdefault(key, {})[v] = float(np.mean(ems))
    if len(out) == 2:  # one tier: it is "all"
        out = {"all": out["all"]}
    return out


def rl_panels(
    steps: list[dict[str, Any]], by_version: dict[str, dict[int, float]]
) -> list[tuple[str, str, list[Series]]]:
    """The RL curves, one panel each (:func:`provrl.report.plots.plot_panels`), x = the step
    record's 1-based ``step`` (step s trains version s−1 into s), or for rollouts the version
    that sampled them. A key a run did not log leaves its panel "not logged"."""
    x = [float(s["step"]) for s in steps]

    def col(key: str) -> list[float]:
        return [_num(s.get(key)) for s in steps]

    def line(label: str, key: str) -> Series:
        return (label, x, col(key))

    def versions(key: str) -> Series:
        acc = by_version[key]
        return (key, list(map(float, acc)), list(acc.values()))

    mixed = [
        _num(s.get("mixed_version_trajectories")) / len(s["trained"]) if s.get("trained") else nan
        for s in steps
    ]
    wall = col("wall_s")
    between = [nan] + [b - a for a, b in itertools.pairwise(wall)]
    tiers = [versions(k) for k in by_version if k != "all"]
    return [
        ("batch reward", "reward", [line("mean", "reward_mean")]),
        (
            "accuracy",
            "exact match",
            [line("trained batch", "accuracy"), *([versions("all")] if by_version else [])],
        ),
        (
            "rollout accuracy per tier",
            "exact match",
            tiers or ([versions("all")] if by_version else []),
        ),
        (
            "tool calls",
            "calls",
            [line("per episode", "tool_calls"), line("per solved", "tool_calls_solved")],
        ),
        ("response length", "sampled tokens / trajectory", [line("mean", "action_tokens")]),
        ("policy entropy", "nats / token", [line("entropy", "entropy")]),
        (
            "grad norm",
            "L2 (before clipping)",
            [line("norm", "grad_norm"), line("max over micro-steps", "grad_norm_max")],
        ),
        (
            "clip and mask",
            "share",
            [line("clipped tokens", "clip_frac"), line("masked tokens", "masked_frac")],
        ),
        (
            "signal",
            "share",
            [
                line("zero-signal groups", "zero_signal_share"),
                line("distinct samples", "distinct_share"),
            ],
        ),
        (
            "provenance",
            "share",
            [
                ("mixed-version trajectories", x, mixed),
                line("tokens on older KV", "kv_stale_share"),
            ],
        ),
        (
            "step time",
            "seconds",
            [line("trainer step", "step_s"), ("wall between steps", x, between)],
        ),
        ("memory", "RSS (MiB)", [line("resident set", "rss_mb")]),
    ]


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
