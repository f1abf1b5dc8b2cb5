"""What the RL stage reports about itself, as pure functions of what it is handed:

* each training batch's statistics — outcomes and provenance (:func:`batch_stats`), the
  step's line of ``RUN/rl/steps.jsonl`` and its ``rl_batch/…`` row in the metrics sink
  (:func:`batch_row`);
* the signal of the groups finished between two steps (:class:`SignalCount`): a group whose
  rewards are all equal has every GRPO advantage 0 and is never trained;
* the stage's summary, ``RUN/rl/done.json`` (:func:`stage_summary`).

Nothing here reads a clock, a file or an engine: the loop passes the numbers in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from provrl.config import ConfigError
from provrl.pipeline.curriculum import has_signal
from provrl.rollout.collector import Group

BATCH_SCALARS = (
    "accuracy",
    "tool_calls",
    "tool_calls_solved",
    "malformed",
    "action_tokens",
    "mixed_version_trajectories",
    "max_lag",
    "distinct_share",
    "zero_signal_share",
    "kv_stale_share",
)
"""The scalars of :func:`batch_stats` that go to the metrics sink (``rl_batch/…``)."""


def batch_row(record: dict[str, Any]) -> dict[str, Any]:
    """The metrics sink's ``rl_batch`` row of a step record (the same whether the record was
    just made or read back to rebuild a row a kill lost)."""
    return {k: record[k] for k in BATCH_SCALARS if isinstance(record.get(k), int | float)}


def distinct_share(groups: Sequence[Group]) -> float:
    """Share of a batch's samples that differ from every earlier sample of their group:
    Σ_g |{distinct action-token sequences of g}| / Σ_g |g|. A group of k identical samples
    counts 1/k: it spends k samples' compute on one sample's information."""
    distinct = sum(len({t.token_id[t.is_action].tobytes() for t in g.trajectories}) for g in groups)
    return distinct / max(1, sum(len(g.trajectories) for g in groups))


def step_record(
    step: int,
    version: int,
    stats: dict[str, Any],
    update: dict[str, Any],
    *,
    wall_s: float,
    rss_mb: float,
) -> dict[str, Any]:
    """Step ``step``'s line of ``steps.jsonl`` (version u+1 = ``version``): the batch's
    statistics, then the update's metrics, the stage's wall time and the process's memory."""
    return {"step": step, "version": version, **stats, **update, "wall_s": wall_s, "rss_mb": rss_mb}


def batch_stats(groups: Sequence[Group], trainer_version: int) -> dict[str, Any]:
    """Outcome and provenance statistics of one training batch trained by the update of
    θ_u (u = ``trainer_version``): a token sampled under v has lag u − v; a trajectory is
    mixed-version when its action tokens have more than one v; an action token is KV-stale
    when it attended to keys and values of weights older than its own version."""
    trajs = [t for g in groups for t in g.trajectories]
    em = np.array([t.metrics.get("exact_match", 0.0) for t in trajs])
    calls = np.array([t.metrics.get("num_tool_calls", 0.0) for t in trajs])
    lags: Counter[int] = Counter()
    mixed = kv_stale = actions = 0
    for t in trajs:
        v = t.version[t.is_action]
        lags.update((trainer_version - v).tolist())
        mixed += len(np.unique(v)) > 1
        km = t.kv_min[t.is_action]  # attended to KV of older weights (unknown, -2: not counted)
        kv_stale += int(((km >= 0) & (km < v)).sum())
        actions += len(v)
    return {
        "accuracy": float(em.mean()),
        "tool_calls": float(calls.mean()),
        "tool_calls_solved": float(calls[em > 0].mean()) if (em > 0).any() else float("nan"),
        "malformed": float(np.mean([t.metrics.get("malformed_calls", 0.0) for t in trajs])),
        "action_tokens": float(np.mean([t.num_actions for t in trajs])),
        "mixed_version_trajectories": mixed,
        "kv_stale_share": kv_stale / max(1, actions),
        "lag_histogram": {str(k): int(v) for k, v in sorted(lags.items())},
        "max_lag": max(lags) if lags else 0,
        "distinct_share": distinct_share(groups),
        "groups_K": [g.successes for g in groups],
        "trained": [t.traj_id for t in trajs],
    }


COUNTS = ("groups", "zero_signal_groups", "tokens", "zero_signal_tokens", "streak")
"""The integer fields of :class:`SignalCount` a checkpoint keeps."""


@dataclass
class SignalCount:
    """The groups the run finished (and their tokens), and how many of them had no signal —
    all rewards equal: skipped, never trained. Across resumes: a checkpoint keeps the count
    as its step left it (:meth:`durable`), a resumed run starts from it (:meth:`restored`),
    and a group finished before the kill that the collector hands back is counted again
    only if that step had not counted it (:attr:`counted`) — so the step records and the
    summary are those of the run never killed."""

    groups: int = 0
    zero_signal_groups: int = 0
    tokens: int = 0
    zero_signal_tokens: int = 0
    streak: int = 0
    """Finished groups in a row without signal."""
    mark: tuple[int, int] = (0, 0)
    """(groups, zero-signal groups) when the last step was recorded."""
    counted: set[str] = field(default_factory=set)
    """The keys of the groups counted (``task#rN``): each counts once."""

    def durable(self) -> dict[str, Any]:
        """The count as a checkpoint's ``state.json`` keeps it (after the step's record)."""
        return {**{k: getattr(self, k) for k in COUNTS}, "counted": sorted(self.counted)}

    @classmethod
    def restored(cls, saved: dict[str, Any]) -> SignalCount:
        """The count a checkpoint kept (:meth:`durable`; {}: none), the last step's mark at
        it."""
        n = {k: int(saved.get(k, 0)) for k in COUNTS}
        g, z = n["groups"], n["zero_signal_groups"]
        return cls(**n, mark=(g, z), counted=set(saved.get("counted", ())))

    def add_group(self, group: Group) -> bool:
        """One finished ``group`` (counted once, by its key); whether it has signal."""
        signal = has_signal(group.rewards)
        self.add(sum(len(t) for t in group.trajectories), signal, group.key)
        return signal

    def add(self, tokens: int, signal: bool, key: str = "") -> None:
        """One finished group (``key``; a key already counted is ignored) of ``tokens``
        tokens, with or without signal."""
        if key:
            if key in self.counted:
                return
            self.counted.add(key)
        self.groups += 1
        self.tokens += tokens
        self.streak = 0 if signal else self.streak + 1
        if not signal:
            self.zero_signal_groups += 1
            self.zero_signal_tokens += tokens

    def check(self, limit: int) -> None:
        """Stop the run (:class:`~provrl.config.ConfigError`, one line) once ``limit``
        finished groups in a row had no signal: nothing would ever be trained."""
        if self.streak >= limit:
            raise ConfigError(
                f"rl: {self.streak} finished groups in a row had no signal (all rewards "
                "equal): nothing to train on — check the reward, or set "
                "pipeline.curriculum.skip_zero_signal: false"
            )

    def since_last_step(self) -> dict[str, Any]:
        """Groups finished since the previous step and the share of them without signal;
        the next call counts from here."""
        (g0, z0), g, z = self.mark, self.groups, self.zero_signal_groups
        self.mark = (g, z)
        return {
            "finished_groups": g - g0,
            "zero_signal_groups": z - z0,
            "zero_signal_share": (z - z0) / max(1, g - g0),
        }

    def summary(self, skipped: int) -> dict[str, Any]:
        """The summary's ``zero_signal``: the counts, their shares, and ``skipped`` (the
        trajectories never trained for want of signal, all sessions)."""
        return {
            "groups": self.groups,
            "zero_signal_groups": self.zero_signal_groups,
            "tokens": self.tokens,
            "zero_signal_tokens": self.zero_signal_tokens,
            "groups_frac": self.zero_signal_groups / max(1, self.groups),
            "tokens_frac": self.zero_signal_tokens / max(1, self.tokens),
            "trajectories_skipped": skipped,
        }


def stage_summary(
    progress: dict[str, Any],
    *,
    wall_s: float,
    session_s: float,
    trainer_busy_s: float,
    engine: dict[str, float],
    fleet: dict[str, Any] | None,
    threads: dict[str, int],
    trainer: dict[str, Any],
    collector: dict[str, Any],
    curriculum: dict[str, Any],
    signal: SignalCount,
    skipped: int,
    nonfinite_steps: int,
) -> dict[str, Any]:
    """The RL stage's summary (``RUN/rl/done.json``): ``progress`` (mode, steps, version,
    checkpoint, what was trained, dropped and resumed) and how the time went. ``wall_s`` and
    ``trainer_busy_s`` run across resumes; ``session_s`` and ``engine`` (the engine's
    counters) and ``collector`` cover this process only — a resumed run starts a new engine;
    ``episodes`` (the trajectory log's at the resume plus this session's) and ``signal``
    cover the whole run; ``fleet``: the Ray replicas' versions, if any."""
    summary = {
        **progress,
        "wall_s": wall_s,
        "stage_wall_s": wall_s,
        "session_wall_s": session_s,
        "trainer_busy_s": trainer_busy_s,
        "trainer_idle_frac": max(0.0, 1 - trainer_busy_s / wall_s) if wall_s else 0.0,
        "engine_busy_frac": min(
            1.0, engine.get("busy_s", 0.0) / engine.get("replicas", 1.0) / session_s
        )
        if session_s
        else 0.0,
        "threads": threads,
        "trainer": trainer,
        "engine": {
            k: engine[k]
            for k in ("tokens_generated", "hotloads", "evictions", "busy_s")
            if k in engine
        },
        "collector": collector,
        "episodes": int(progress.get("resumed", {}).get("trajectories_in_log", 0))
        + int(collector.get("episodes", 0)),
        "curriculum": curriculum,
        "zero_signal": signal.summary(skipped),
        "nonfinite_steps": nonfinite_steps,
    }
    if fleet is not None:
        summary["ray"] = fleet
    return summary
