"""``provrl probe`` and ``provrl filter``: k samples per task with the current policy *and*
tools, then three pools (:mod:`provrl.filtering` has the rules and the analytics).

A probe directory::

    manifest.json        policy (name, weights hash, version, dtype), tools (backend, index +
                         settings hash, top-k, latency model), sampling, prompt, reward, k,
                         seed, the task file's hash — written first; a restart must match it
    tasks.jsonl          the probed tasks
    trajectories.jsonl   every probe episode (provenance log), appended as each finishes
    probe.json           per-task K, successes, tool calls, tokens; throughput — written last

A filter directory::

    kept.jsonl unsolved.jsonl solved.jsonl   task files (every probed task in exactly one)
    filter.json          band, pool sizes, K histogram, pool of each task, the probe manifest
    retention.json/.png  (``--report``) observed vs Beta-predicted kept fraction, curves

Resume: a probe killed at any point and run again with the same arguments reuses every
episode already in its log (same ids, same seeds) and runs only the rest, so its K are those
of an uninterrupted run.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from provrl._sys import file_sha256, write_json
from provrl.engine.api import EngineFactory
from provrl.engine.config import EngineConfig
from provrl.env.config import EnvConfig
from provrl.env.tasks import Task, load_tasks, save_tasks
from provrl.filtering import (
    POOLS,
    FilterError,
    assign_pools,
    band,
    k_histogram,
    manifest_problems,
    plot_retention,
    retention,
    transitions,
)
from provrl.provenance import Trajectory
from provrl.rollout.collector import Collector, Group, group_key
from provrl.rollout.setup import agent_tools, open_policy_env
from provrl.trajlog import TrajectoryWriter, read_trajectories


def manifest(
    policy: str,
    fingerprint: str,
    env_cfg: Any,
    tools: Any,
    *,
    k: int,
    seed: int,
    dtype: str,
    version: int = 0,
) -> dict[str, Any]:
    """What a filter verdict depends on: the policy and the tool configuration (content
    hashes) and every setting of sampling, prompt and reward."""
    a = env_cfg.agent
    return {
        "policy": {"name": policy, "fingerprint": fingerprint, "version": version, "dtype": dtype},
        "tools": {"name": tools.name, "fingerprint": tools.fingerprint, "config": tools.config},
        "sampling": {
            "temperature": a.temperature,
            "top_p": a.top_p,
            "top_k": a.top_k,
            "max_new_tokens": a.max_new_tokens,
            "max_turns": a.max_turns,
            "max_tool_calls": a.max_tool_calls,
            "max_total_tokens": a.max_total_tokens,
            "max_malformed": a.max_malformed,
        },
        "prompt": {
            "protocol": a.protocol,
            "shots": a.shots,
            "observation_role": a.observation_role,
            **({"repeat_calls": a.repeat_calls} if a.repeat_calls != "run" else {}),
        },
        "reward": {
            "kind": a.reward,
            "format_penalty": a.format_penalty,
            "tool_call_cost": a.tool_call_cost,
            **({"tool_call_cost_on": a.tool_call_cost_on} if a.tool_call_cost_on != "all" else {}),
            **(
                {"tool_call_cost_warmup": a.tool_call_cost_warmup}
                if a.tool_call_cost_warmup
                else {}
            ),
        },
        "k": k,
        "seed": seed,
    }


def current_manifest(
    policy: str, world_dir: Path, env_cfg: EnvConfig, *, k: int, seed: int, dtype: str
) -> dict[str, Any]:
    """The manifest a probe of ``policy`` with today's tools would write (no model load)."""
    from provrl.models.loading import policy_fingerprint

    tools = agent_tools(world_dir, env_cfg, shots=False).identity
    return manifest(policy, policy_fingerprint(policy), env_cfg, tools, k=k, seed=seed, dtype=dtype)


def run_probe(
    policy: str,
    tasks: Sequence[Task],
    world_dir: Path,
    env_cfg: EnvConfig,
    out: Path,
    *,
    k: int,
    seed: int,
    dtype: str = "float32",
    engine_cfg: EngineConfig | None = None,
    concurrency: int = 32,
    progress: bool = True,
    make_engine: EngineFactory | None = None,
) -> dict[str, Any]:
    """Probe ``tasks`` k times each with ``policy`` (see the module docstring); returns (and
    writes) ``probe.json``. ``make_engine``: as :func:`~provrl.rollout.setup.open_policy_env`
    (the pipeline passes the run config's backend)."""
    if not tasks:
        raise FilterError(f"{out}: no tasks to probe")
    out.mkdir(parents=True, exist_ok=True)
    task_file = out / "tasks.jsonl"
    if task_file.is_file():
        old = [t.task_id for t in load_tasks(task_file)]
        if old != [t.task_id for t in tasks]:
            raise FilterError(
                f"{task_file}: this probe directory holds another task list; use a new --out"
            )
    else:
        save_tasks(tasks, task_file)
    log = out / "trajectories.jsonl"
    done = list(read_trajectories(log)) if log.is_file() else []
    env_cfg = env_cfg.model_copy(deep=True)
    env_cfg.eval.concurrency = concurrency
    K: dict[str, int] = {}
    groups = {}
    with (
        open_policy_env(
            policy, world_dir, env_cfg, dtype=dtype, engine_cfg=engine_cfg, make_engine=make_engine
        ) as (env, lm),
        TrajectoryWriter(log) as writer,
        Collector(
            env,
            concurrency=concurrency,
            seed=seed,
            writer=writer,
            progress="probe" if progress else None,
        ) as col,
    ):
        man = manifest(policy, lm.fingerprint, env_cfg, env.tools, k=k, seed=seed, dtype=dtype) | {
            "tasks": {
                "file": str(task_file),
                "sha256": "sha256:" + file_sha256(task_file),
                "n": len(tasks),
            }
        }
        _check_or_write_manifest(out / "manifest.json", man)
        for g in col.run(tasks, k, done=done):
            K[g.task.task_id] = g.successes
            groups[g.task.task_id] = g
        throughput = col.summary()
    records = [_task_record(t, groups[t.task_id].trajectories) for t in tasks]
    summary = {
        "policy": policy,
        "k": k,
        "tasks": len(tasks),
        "K": {r["task_id"]: r["K"] for r in records},
        "K_histogram": k_histogram(K.values(), k),
        "K_histogram_per_tier": {
            str(tier): k_histogram([r["K"] for r in records if r["tier"] == tier], k)
            for tier in sorted({r["tier"] for r in records})
        },
        "records": records,
        "throughput": throughput,
        "manifest": man,
    }
    write_json(out / "probe.json", summary)
    return summary


def _check_or_write_manifest(path: Path, man: dict[str, Any]) -> None:
    if path.is_file():
        old = _read_json(path)
        problems = manifest_problems(old, man)
        if old.get("tasks", {}).get("sha256") != man["tasks"]["sha256"]:
            problems.append("task file changed")
        if problems:
            raise FilterError(
                f"{path}: this probe was started under another configuration ("
                + "; ".join(problems)
                + "); use a new --out"
            )
        return
    write_json(path, man)


def _task_record(task: Task, trajs: Sequence[Any]) -> dict[str, Any]:
    em = np.array([t.metrics.get("exact_match", 0.0) for t in trajs])
    calls = np.array([t.metrics.get("num_tool_calls", 0.0) for t in trajs])
    return {
        "task_id": task.task_id,
        "tier": task.tier,
        "K": int(em.sum()),
        "successes": [t.traj_id for t, e in zip(trajs, em, strict=True) if e > 0],
        "mean_tool_calls": float(calls.mean()),
        "min_tool_calls_solved": float(calls[em > 0].min()) if (em > 0).any() else None,
        "oracle_min_tool_calls": task.min_searches,
        "mean_tokens": float(np.mean([t.metrics.get("num_tokens", 0.0) for t in trajs])),
        "mean_action_tokens": float(np.mean([t.num_actions for t in trajs])),
    }


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FilterError(f"{path}: missing")
    try:
        out: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise FilterError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from e
    return out


def load_probe(probe_dir: Path) -> dict[str, Any]:
    """A finished probe's ``probe.json`` (checked against its task file)."""
    p = probe_dir / "probe.json"
    if not p.is_file():
        hint = (
            "the probe did not finish — run the same provrl probe again to complete it"
            if (probe_dir / "manifest.json").is_file()
            else "not a probe directory"
        )
        raise FilterError(f"{p}: missing ({hint})")
    probe = _read_json(p)
    for key in ("k", "K", "manifest"):
        if key not in probe:
            raise FilterError(f"{p}: field {key!r} missing")
    tasks = load_tasks(probe_dir / "tasks.jsonl")
    missing = [t.task_id for t in tasks if t.task_id not in probe["K"]]
    if missing:
        raise FilterError(f"{p}: no K for task {missing[0]} of {probe_dir / 'tasks.jsonl'}")
    for task_id, n in probe["K"].items():
        if not isinstance(n, int) or not 0 <= n <= probe["k"]:
            raise FilterError(f"{p}: K[{task_id!r}] = {n!r} is not an integer in 0 … {probe['k']}")
    return probe


def run_filter(
    probe_dir: Path,
    out: Path,
    *,
    lo: int = 1,
    hi: int | None = None,
    previous: Path | None = None,
    report: bool = False,
) -> dict[str, Any]:
    """Split a finished probe into the three pools (and optionally the retention report and
    the transition table against a ``previous`` filter directory)."""
    probe = load_probe(probe_dir)
    k = int(probe["k"])
    lo, hi = band(k, lo, hi)
    tasks = load_tasks(probe_dir / "tasks.jsonl")
    pool_of = assign_pools({t.task_id: probe["K"][t.task_id] for t in tasks}, k, lo, hi)
    members: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        members[pool_of[t.task_id]].append(t)
    out.mkdir(parents=True, exist_ok=True)
    for name in POOLS:
        save_tasks(members[name], out / f"{name}.jsonl")
    summary: dict[str, Any] = {
        "probe_dir": str(probe_dir),
        "k": k,
        "band": [lo, hi],
        "sizes": {name: len(members[name]) for name in POOLS},
        "K_histogram": k_histogram(probe["K"].values(), k),
        "pool_of": pool_of,
        "manifest": probe["manifest"],
    }
    if report:
        ret = retention([probe["K"][t.task_id] for t in tasks], k, lo, hi)
        tiers = sorted({t.tier for t in tasks})
        if len(tiers) > 1:
            ret["per_tier"] = {
                str(tier): {
                    "tasks": sum(t.tier == tier for t in tasks),
                    "K_histogram": k_histogram(
                        [probe["K"][t.task_id] for t in tasks if t.tier == tier], k
                    ),
                    "kept": sum(t.tier == tier and pool_of[t.task_id] == "kept" for t in tasks),
                }
                for tier in tiers
            }
        ret["throughput"] = probe.get("throughput", {})
        write_json(out / "retention.json", ret)
        plot_retention(ret, out / "retention.png")
        summary["retention"] = {
            key: ret[key]
            for key in (
                "observed_kept_frac",
                "observed_kept_frac_se",
                "predicted_kept_frac",
                "beta_prior",
                "kept_per_probe_rollout",
                "by_k",
            )
        }
    if previous is not None:
        old = _read_json(previous / "filter.json")
        summary["transitions"] = transitions(old["pool_of"], pool_of)
        summary["previous"] = {"dir": str(previous), "manifest": old.get("manifest")}
    write_json(out / "filter.json", summary)
    return summary


def check_fresh(
    filter_summary: dict[str, Any], current: dict[str, Any], *, allow: bool
) -> list[str]:
    """Refuse pools whose probe manifest does not match ``current`` (unless ``allow``);
    returns the problems (empty when fresh)."""
    problems = manifest_problems(filter_summary["manifest"], current)
    if problems and not allow:
        raise FilterError(
            "stale filter pools: "
            + "; ".join(problems)
            + " — re-probe, or set pipeline.allow_stale_pools=true"
        )
    return problems


def format_transitions(table: dict[str, dict[str, int]]) -> str:
    """The transition table as aligned text (rows: old pool, columns: new pool)."""
    w = max(len(p) for p in POOLS) + 2
    lines = ["old \\ new".ljust(w + 2) + "".join(p.rjust(w) for p in POOLS)]
    for a in POOLS:
        if sum(table[a].values()):
            lines.append(a.ljust(w + 2) + "".join(str(table[a][b]).rjust(w) for b in POOLS))
    return "\n".join(lines)


def probe_groups(probe_dir: Path, tasks: Mapping[str, Task], k: int) -> dict[str, Group]:
    """The probe's complete groups (round 0, ``k`` samples) of ``tasks``, by group key, from
    ``probe_dir/trajectories.jsonl`` (none without it): the RL curriculum's first evidence,
    and (``train_on_probe``) its first ready groups."""
    path = probe_dir / "trajectories.jsonl"
    if not path.is_file():
        return {}
    by_key: dict[str, list[Trajectory]] = defaultdict(list)
    for t in read_trajectories(path):
        if t.task_id in tasks:
            by_key[str(t.meta.get("group", group_key(t.task_id, 0)))].append(t)
    return {
        key: Group(tasks[ts[0].task_id], 0, sorted(ts, key=lambda t: t.traj_id))
        for key, ts in by_key.items()
        if len(ts) == k
    }
