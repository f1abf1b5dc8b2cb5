"""Admission control and the staleness rule of the asynchronous RL loop.

Versions: the trainer holds weights θ_u (version u) and turns a batch into θ_{u+1}. A token
sampled under version v_t and trained by the update of θ_u has **lag** u − v_t ≥ 0. With a
bound L = ``max_lag``:

* **rule (hard)** — a group is trained by the update of θ_u only if
  u − min_t v_t ≤ L over all its action tokens; otherwise it is dropped and counted
  (:func:`group_lag`, :func:`split_stale`);
* **admission (soft)** — a new group may be *started* only while fewer than (1 + L) · G
  groups are outstanding (started, not yet trained or dropped), G groups per step
  (:func:`may_start`): G of them feed the step in progress, L · G the L steps after it, so a
  group started under version s is trained by step s + L at the latest — lag ≤ L — unless a
  slow episode lets later groups overtake it; the hard rule catches those. (AReaL bounds
  staleness the same way, counting samples instead of groups.)
* **pacing (optional)** — within that budget, start a group only when the next step will
  need it (:func:`paced_start`, measured by :class:`Pacer`): just in time rather than as
  early as allowed, so a learner-bound run trains fresher groups whose episodes span the
  hot-load.

:class:`Admission` is the loop's account of all three: the outstanding count, the ready
queue (completed, not yet trained) and the pacer.

Sync mode is the special case L = 0 with nothing in flight across a load: every action
token has the version being updated (:func:`check_on_policy`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from provrl.rollout.collector import Group as RolloutGroup
from provrl.train.packing import build_trie


class HasMinVersion(Protocol):
    def min_version(self) -> int: ...


G = TypeVar("G", bound=HasMinVersion)


def may_start(outstanding: int, groups_per_step: int, max_lag: int) -> bool:
    """Whether one more group may start: outstanding < (1 + L) · G."""
    return outstanding < (1 + max_lag) * groups_per_step


def group_lag(group: HasMinVersion, trainer_version: int) -> int:
    """u − min_t v_t: the lag of the group's oldest action token if trained now."""
    return trainer_version - group.min_version()


def split_stale(groups: Sequence[G], trainer_version: int, max_lag: int) -> tuple[list[G], list[G]]:
    """(fresh, stale): groups within the lag bound, and those beyond it."""
    fresh = [g for g in groups if group_lag(g, trainer_version) <= max_lag]
    stale = [g for g in groups if group_lag(g, trainer_version) > max_lag]
    return fresh, stale


def paced_start(
    *,
    pending: int,
    need: int,
    elapsed_s: float | None,
    step_s: float | None,
    group_s: float | None,
    straddle: float = 0.0,
) -> bool:
    """Paced admission (``pipeline.loop.admission: paced``): whether a group may start *now*,
    on top of :func:`may_start`.

    When the learner is the slower side, eager admission starts the next step's groups as
    soon as a step frees its slots; the engine finishes them long before the step ends and
    they wait, aging, in the ready queue — every trained token has lag L and no episode is in
    flight at a hot-load. Paced admission starts them *just in time* instead: with the step in
    progress for ``elapsed_s`` of an expected ``step_s`` and a group taking ``group_s`` from
    start to finish, a group starts when

        pending < need   and   (learner idle  or  elapsed_s ≥ step_s − (1 − s) · group_s),

    ``pending`` counting the groups started or ready and not in training, ``need`` the
    groups the next step takes (G, raised for the share that finishes without signal), and
    s = ``straddle`` ∈ [0, 1). With s = 0 the next batch is timed to finish at the hot-load —
    lag ≤ 1, and whether its episodes span the swap is left to the noise of the estimates.
    With s > 0 a group starts s · group_s later, so at the hot-load about that share of its
    time is still ahead: its episodes are in flight across the swap and sample under two
    versions, and the learner waits about s · group_s for the batch. When generation is the
    slower side (group_s ≥ step_s) it starts at once, as eager admission does; before both
    times are measured it is eager too."""
    if pending >= need:
        return False
    if elapsed_s is None or step_s is None or group_s is None:
        return True
    return elapsed_s >= step_s - (1.0 - straddle) * group_s


def groups_needed(groups_per_step: int, zero_signal_share: float, cap: int) -> int:
    """Groups to have in flight or ready for one step of G: ⌈G / (1 − z)⌉ with z the recent
    share of groups finishing without signal (skipped, never trained), at most ``cap``."""
    z = min(max(zero_signal_share, 0.0), 0.9)
    return min(cap, max(groups_per_step, math.ceil(groups_per_step / (1.0 - z))))


class Ema:
    """An exponential moving average x̄ ← (1 − α) x̄ + α x (the first value taken as is)."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def update(self, x: float) -> float:
        self.value = x if self.value is None else (1 - self.alpha) * self.value + self.alpha * x
        return self.value


class RecentMedian:
    """The median of the last ``n`` values: the step and group times paced admission plans
    with. An EMA lags a change of regime — a run's first steps train the long probe-era
    episodes (80 s) and later ones 25 s, and an EMA still said 64 s five steps on, so the
    start threshold fell after the step had ended and every batch started only after the
    hot-load — while the median of three follows it within two steps and ignores one outlier."""

    def __init__(self, n: int = 3) -> None:
        self.n = n
        self.recent: list[float] = []

    @property
    def value(self) -> float | None:
        if not self.recent:
            return None
        xs = sorted(self.recent)
        m = len(xs) // 2
        return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])

    def update(self, x: float) -> float:
        self.recent = [*self.recent, x][-self.n :]
        v = self.value
        assert v is not None
        return v


def check_on_policy(groups: Sequence[RolloutGroup], version: int) -> None:
    """Strict on-policy (sync, L = 0): every action token of ``groups`` was sampled by the
    weights being updated, version ``version``; else AssertionError naming the trajectory."""
    for g in groups:
        for t in g.trajectories:
            vs = t.version[t.is_action]
            if len(vs) and (vs != version).any():
                raise AssertionError(
                    f"sync: {t.traj_id} has versions {sorted(set(vs.tolist()))}, "
                    f"trainer is at {version}"
                )


def forward_tokens(batch: Sequence[RolloutGroup]) -> int:
    """The tokens the learner's forward computes for ``batch``: each group's radix tree
    (:func:`provrl.train.packing.build_trie`), a prefix its samples share counted once. Its
    training time follows these, not the samples' summed lengths: the share of a batch
    that is shared prompt varies from step to step (dev run K, steps 1-5: forward tokens
    were 62-72 % of the summed lengths)."""
    return sum(
        sum(length for _, _, length, _ in build_trie([t.token_id for t in g.trajectories]))
        for g in batch
    )


class Pacer:
    """Paced admission's clock (``pipeline.loop.admission: paced``, :func:`paced_start`):
    when each group started and when the step in progress was handed to the learner, and
    the estimates the next starts are paced by — a step's wall time (train, save, load), a
    group's (start to finish) and the share of groups finishing without signal. With
    ``paced`` false (eager admission) it still measures, and never holds a start back.

    The step in progress is expected to take T̂ = c + n · r: the recent median of the
    fixed part c (save and hot-load: the step's wall time less its training time) plus its
    batch's n tokens times the recent median training seconds per token r. A step's
    training time follows its tokens (dev run H: 105-139 tokens/s over steps of 2-16 k
    forward tokens, while the step time fell from 130 to 24 s), so this predicts the step at
    hand where the median of recent step times trailed a shortening run by several steps —
    starting groups after the hot-load and leaving the learner idle. The fixed part is
    separate because a straddled start is only as good as the estimate: seconds per token
    of the whole step, save and load included, overestimated the short late steps of dev
    run J by about the half group time the straddle adds, so their groups started at the
    hot-load instead of across it. Once a quarter of the step is trained, the learner's own
    progress takes over: a share f trained in t seconds predicts t / f + c (dev run K's
    per-token estimates still missed by up to a third from one step to the next). The fixed
    part holds the loop: with a straddle, groups due inside it start when the step is
    trained (:meth:`train_done`), before its save and hot-load."""

    def __init__(
        self, groups_per_step: int, max_lag: int, *, paced: bool, straddle: float = 0.0
    ) -> None:
        self.groups_per_step, self.max_lag, self.paced = groups_per_step, max_lag, paced
        self.straddle = straddle
        self.s_per_token, self.group_time, self.zero_rate = RecentMedian(), RecentMedian(), Ema()
        self.fixed_s = RecentMedian()
        """The part of a step's wall time that is not training (save, hot-load)."""
        self.tokens = 0
        """Forward tokens of the batch the learner holds (0: none)."""
        self.progress: Callable[[], float | None] | None = None
        """The share of it trained so far (None: not observable)."""
        self.predicted: float | None = None
        """T̂ of the step in progress as predicted when it was handed over."""
        self.started_at: dict[str, float] = {}
        """perf_counter() at which each group of this session started, by group key."""
        self.t_train: float | None = None
        """When the step in progress was handed to the learner (None: learner idle)."""
        self.starts: list[float] = []
        """Seconds after the hand-over at which the groups started during the step in
        progress started (its record: whether the straddle timed them as planned)."""
        self.finishes: list[float] = []
        """The same for the groups that finished during it (before its hot-load)."""
        self.loading = False
        """The step in progress is trained and its save and hot-load come next."""

    def may_start(self, pending: int) -> bool:
        """Whether the next step needs a group started now, ``pending`` groups started or
        ready and not in training (eager: always)."""
        if not self.paced:
            return True
        G, lag = self.groups_per_step, self.max_lag
        elapsed = None if self.t_train is None else time.perf_counter() - self.t_train
        if self.loading and self.straddle > 0 and elapsed is not None:
            # the save and hot-load block the loop for the fixed part c: a start due inside
            # them (c > (1 − s) · group_s: short groups) is made now, still before the swap
            elapsed = math.inf
        return paced_start(
            pending=pending,
            need=groups_needed(G, self.zero_rate.value or 0.0, cap=(1 + lag) * G),
            elapsed_s=elapsed,
            step_s=self.expected_step_s(),
            group_s=self.group_time.value,
            straddle=self.straddle,
        )

    def expected_step_s(self) -> float | None:
        """T̂ for the step in progress (None: not measured yet): c + n · r until a quarter
        of it is trained; then from the step's own pace, t / f + c after a share f of its
        tokens in t seconds (the learner's ``progress``)."""
        f = self.progress() if self.progress is not None else None
        if f is not None and f >= 0.25 and self.t_train is not None:
            return (time.perf_counter() - self.t_train) / min(f, 1.0) + (self.fixed_s.value or 0.0)
        return self.prior_step_s()

    def prior_step_s(self) -> float | None:
        """T̂ = c + n · r for the batch the learner holds (None: not measured yet)."""
        rate = self.s_per_token.value
        if rate is None or not self.tokens:
            return None
        return (self.fixed_s.value or 0.0) + self.tokens * rate

    def started(self, key: str) -> None:
        """Group ``key`` started now."""
        self.started_at[key] = now = time.perf_counter()
        if self.t_train is not None:
            self.starts.append(now - self.t_train)

    def finished(self, key: str, signal: bool) -> None:
        """Group ``key`` finished now, with or without signal."""
        t0, now = self.started_at.pop(key, None), time.perf_counter()
        if t0 is not None:
            self.group_time.update(now - t0)
        if self.t_train is not None:
            self.finishes.append(now - self.t_train)
        self.zero_rate.update(0.0 if signal else 1.0)

    def training(
        self, batch: Sequence[RolloutGroup], progress: Callable[[], float | None] | None = None
    ) -> None:
        """``batch`` was handed to the learner now; ``progress()``: the share of it trained
        so far (the learner's :meth:`~provrl.train.learner.Learner.progress`)."""
        self.t_train, self.tokens, self.progress = (
            time.perf_counter(),
            forward_tokens(batch),
            progress,
        )
        self.starts, self.finishes = [], []
        self.predicted = self.prior_step_s()

    def train_done(self) -> None:
        """The step in progress is trained; its save and hot-load, which hold the loop, come
        next: with a straddle, the groups due by the hot-load start now."""
        self.loading = True

    def trained(self, train_s: float | None = None) -> None:
        """The step in progress is trained (in ``train_s`` of its wall time; None: all of
        it), saved and loaded: its training seconds per token and its fixed part are
        measured."""
        if self.t_train is not None and self.tokens:
            wall = time.perf_counter() - self.t_train
            train = wall if train_s is None else min(max(train_s, 0.0), wall)
            self.s_per_token.update(train / self.tokens)
            self.fixed_s.update(wall - train)
        self.t_train, self.tokens, self.progress, self.loading = None, 0, None, False

    def estimates(self) -> dict[str, Any]:
        """What the starts of the step just trained were paced by, for its record (paced
        admission only): T̂ as predicted before it ran, seconds per token, group time, and
        when (seconds after the hand-over) the groups started and finished while it trained
        — a group started and not finished by the hot-load spans two versions."""
        if not self.paced:
            return {}
        return {
            "paced_step_s": self.predicted,  # T̂ of the step just trained, before it ran
            "paced_s_per_token": self.s_per_token.value,
            "paced_fixed_s": self.fixed_s.value,
            "paced_group_s": self.group_time.value,
            "paced_starts_s": [round(t, 1) for t in self.starts],  # after the hand-over
            "paced_finishes_s": [round(t, 1) for t in self.finishes],  # before the hot-load
        }


class Admission:
    """The RL loop's groups between start and training: the outstanding count n that
    admission bounds (n < (1 + L) · G, :func:`may_start`), the ready queue, the pacer."""

    def __init__(
        self, groups_per_step: int, max_lag: int, *, paced: bool, straddle: float = 0.0
    ) -> None:
        self.groups_per_step, self.max_lag = groups_per_step, max_lag
        self.pacer = Pacer(groups_per_step, max_lag, paced=paced, straddle=straddle)
        self.ready: list[RolloutGroup] = []
        """Completed groups not yet trained, oldest first."""
        self.outstanding = 0
        """Groups started (or resubmitted, or queued on resume) and not yet trained or
        dropped."""

    def may_start(self, in_training: int) -> bool:
        """Whether one more group may start: within the lag budget and, paced, needed by
        the next step (``in_training``: the groups of the step the learner holds)."""
        n, G, lag = self.outstanding, self.groups_per_step, self.max_lag
        return may_start(n, G, lag) and self.pacer.may_start(n - in_training)

    def started(self, key: str | None) -> None:
        """A group started now (``key``; None: a resumed group finishing its samples, not
        timed by the pacer)."""
        self.outstanding += 1
        if key is not None:
            self.pacer.started(key)

    def queue(self, groups: Sequence[RolloutGroup]) -> None:
        """Completed groups a resume hands back, ahead of any that finishes later."""
        self.ready += groups
        self.outstanding += len(groups)

    def finished(self, group: RolloutGroup, signal: bool, *, keep: bool) -> None:
        """``group`` finished, with or without signal: to the ready queue if ``keep``, else
        settled (skipped, never trained)."""
        self.pacer.finished(group.key, signal)
        if keep:
            self.ready.append(group)
        else:
            self.outstanding -= 1

    def batch(self) -> list[RolloutGroup] | None:
        """The next step's G groups, oldest first, off the ready queue (None: fewer
        ready)."""
        if len(self.ready) < self.groups_per_step:
            return None
        batch, self.ready = self.ready[: self.groups_per_step], self.ready[self.groups_per_step :]
        return batch

    def drop_stale(self, trainer_version: int) -> list[RolloutGroup]:
        """Drop (and return) the ready groups a step on ``trainer_version`` could not train
        within ``max_lag``."""
        self.ready, stale = split_stale(self.ready, trainer_version, self.max_lag)
        self.outstanding -= len(stale)
        return stale

    def settled(self, groups: int) -> None:
        """A step's ``groups`` are trained (or refused as not finite)."""
        self.outstanding -= groups
