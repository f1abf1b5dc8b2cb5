"""The online, version-aware curriculum: which task the RL loop starts next, and which pool
every task is in at every version.

"Eight failures do not establish unlearnability", made operational. Every finished group —
the probe's, the RL stage's, a re-probe's — is evidence ``(task, version v, K of k)``. A
task's pass rate p under the policy at version u has the posterior

.. math::

    p \\mid \\text{evidence} \\sim \\mathrm{Beta}\\Big(a_0 + \\sum_e \\gamma^{u - v_e} K_e,\\;
    b_0 + \\sum_e \\gamma^{u - v_e} (k_e - K_e)\\Big)

(γ = ``forget``: evidence from older policies counts less). The task is **solved** when
P(p ≥ p_hi) ≥ ``confidence``, **unsolved** when P(p ≤ p_lo) ≥ ``confidence``, else **kept**
(the informative band); a task leaves solved or unsolved only when that probability falls
below ``exit_confidence`` (hysteresis). With the defaults (uniform prior, p_lo = 0.075, p_hi = 0.925,
confidence 0.5) one group of k = 8 reproduces the probe's filter exactly: K = 0 → unsolved,
K = 8 → solved, 0 < K < 8 → kept.

The loop starts kept tasks least-visited first (seeded ties; with ``balance_tiers`` within
the tier started least, :func:`least_started_tier`, counted as ``balance_count`` says: the
probe's round included, so the tier with fewer kept tasks goes first, or the loop's groups
only, so the tiers alternate from the first group), and every ``reprobe_every``-th
group the task of the unsolved or solved pool started longest ago — a re-probe with the
current policy. Its group is an ordinary group, stamped per token: it is trained on if it
has signal, and its evidence can move the task back into the band. A group with no signal
(all rewards equal — e.g. K = 0 or K = k with the same number of tool calls: every GRPO
advantage is 0) updates the posterior and is never trained on — in the token normaliser it
would only dilute the step (DAPO's dynamic sampling).

A resumed run rebuilds the state by replaying the probe and the trajectory log
(:meth:`Curriculum.replay`: :meth:`Curriculum.record` in log order, then
:meth:`Curriculum.advance` to the resumed version): the same evidence, so the same posteriors — each group counted once, even the
complete untrained ones the collector hands back after the replay (:attr:`Evidence.group`) —,
and from each sample's :meth:`Curriculum.stamp` the same order of starts, so the resumed run
starts the tasks the uninterrupted one starts; a pool decided at an edge may come out
the other way than it did live, because the live run interleaved ``advance`` with the
groups.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy.stats import beta as beta_dist

from provrl.env.tasks import Task
from provrl.provenance import Trajectory
from provrl.rollout.collector import Group, group_key
from provrl.run_config.pipeline import CurriculumConfig

STARTED, REPROBE = "started", "reprobe"
"""The keys of :meth:`Curriculum.stamp` in an RL sample's metadata."""

Pool = Literal["kept", "unsolved", "solved"]
POOLS: tuple[Pool, ...] = ("kept", "unsolved", "solved")


@dataclass(frozen=True)
class Evidence:
    """One finished group: K successes of k samples of ``task_id`` at policy ``version``."""

    task_id: str
    version: int
    successes: int
    k: int
    source: Literal["probe", "rl", "reprobe"] = "rl"
    group: str = ""
    """The group's key (``task#round``): a group's evidence counts once, however often it
    is reported (a resume replays the log, then the collector hands back the complete
    untrained groups it held); "" for evidence without one."""


@dataclass(frozen=True)
class Transition:
    """A task moved pool when evidence at ``version`` came in."""

    task_id: str
    version: int
    before: Pool
    after: Pool


def posterior(
    evidence: Sequence[Evidence], version: int, cfg: CurriculumConfig
) -> tuple[float, float]:
    """(α, β) of the task's pass-rate posterior at ``version`` (module docstring)."""
    a, b = cfg.prior_a, cfg.prior_b
    for e in evidence:
        w = cfg.forget ** max(0, version - e.version)
        a += w * e.successes
        b += w * (e.k - e.successes)
    return a, b


def pool_of(a: float, b: float, cfg: CurriculumConfig, current: Pool = "kept") -> Pool:
    """The pool a Beta(a, b) posterior puts a task in that is now in ``current``: enter
    solved / unsolved at ``confidence``, leave them only below ``exit_confidence``."""
    solved = float(beta_dist.sf(cfg.p_high, a, b))
    unsolved = float(beta_dist.cdf(cfg.p_low, a, b))
    if current == "solved" and solved >= cfg.exit_confidence:
        return "solved"
    if current == "unsolved" and unsolved >= cfg.exit_confidence:
        return "unsolved"
    if solved >= cfg.confidence:
        return "solved"
    if unsolved >= cfg.confidence:
        return "unsolved"
    return "kept"


def has_signal(rewards: Sequence[float]) -> bool:
    """A GRPO group some advantage of which is non-zero: its rewards are not all equal.
    With a tool-call cost a K = k group can have signal (fewer calls scored higher); with a
    format penalty so can a K = 0 one."""
    return len(rewards) > 1 and max(rewards) - min(rewards) > 1e-9


def least_started_tier(
    kept: Sequence[str], starts: dict[int, int], tier: dict[str, int]
) -> list[str]:
    """The kept tasks of the tier with the fewest groups started (ties: the lower tier), in
    ``kept``'s order: ``argmin_τ starts[τ]`` over the tiers with a kept task."""
    chosen = min({tier[t] for t in kept}, key=lambda x: (starts.get(x, 0), x))
    return [t for t in kept if tier[t] == chosen]


@dataclass
class Curriculum:
    """Pools, posteriors and the next task (module docstring)."""

    tasks: list[Task]
    cfg: CurriculumConfig
    seed: int = 0
    evidence: dict[str, list[Evidence]] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    visits: dict[str, int] = field(default_factory=dict)
    """Groups started per task (the ``round`` of its next group)."""
    probe_rounds: int = 0
    """Rounds of every task's ``visits`` that were the probe's, not the loop's (1 after
    :meth:`replay`)."""
    transitions: list[Transition] = field(default_factory=list)
    started: int = 0
    """Groups started (re-probes every ``reprobe_every``-th): the highest start number given."""
    lost: list[int] = field(default_factory=list)
    """Start numbers a killed run gave to groups none of whose samples was logged (the gaps
    below the newest stamp, :meth:`replay`): :meth:`next_task` gives them out again first, so
    a group started anew after a resume is counted once, under its old number."""
    last_start: dict[str, int] = field(default_factory=dict)
    """``started`` at each task's last start."""
    counted: set[str] = field(default_factory=set)
    """Group keys whose evidence is in (each counts once: :attr:`Evidence.group`)."""
    reprobes: set[str] = field(default_factory=set)
    """Group keys :meth:`next_task` started as re-probes (their evidence is ``reprobe``)."""
    version: int = 0
    """The policy version of the last :meth:`advance` (the posteriors' ``u``)."""

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("the curriculum has no task")
        rng = np.random.default_rng([self.seed, 7919])
        self._rank = {t.task_id: int(r) for t, r in zip(self.tasks, rng.permutation(len(self.tasks)), strict=True)}  # fmt: skip
        self._by_id = {t.task_id: t for t in self.tasks}
        for t in self.tasks:
            self.evidence.setdefault(t.task_id, [])
            self.pools.setdefault(t.task_id, "kept")
            self.visits.setdefault(t.task_id, 0)

    # ------------------------------------------------------------------ evidence in
    def record(self, e: Evidence, version: int | None = None) -> Transition | None:
        """Add one group's evidence; re-pool its task at ``version`` (default the group's).
        Returns the transition, if the task moved. A group already counted is ignored."""
        if e.task_id not in self._by_id:
            raise KeyError(f"curriculum: unknown task {e.task_id!r}")
        if e.group:
            if e.group in self.counted:
                return None
            self.counted.add(e.group)
        self.evidence[e.task_id].append(e)
        at = e.version if version is None else version
        a, b = posterior(self.evidence[e.task_id], at, self.cfg)
        before = self.pools[e.task_id]
        after = pool_of(a, b, self.cfg, before)
        self.pools[e.task_id] = after
        if before == after:
            return None
        move = Transition(e.task_id, at, before, after)
        self.transitions.append(move)
        return move

    def observe(self, g: Group, source: Literal["probe", "rl"] = "rl") -> None:
        """A finished group's evidence (K of k at the oldest version that sampled it), when
        the curriculum follows evidence (``enabled``); an RL group this curriculum started
        as a re-probe counts as one."""
        if self.cfg.enabled:
            kind = "reprobe" if source == "rl" and g.key in self.reprobes else source
            self.record(Evidence(g.task.task_id, g.min_version(), g.successes, len(g.trajectories), kind, g.key))  # fmt: skip

    def stamp(self, task_id: str, round_: int) -> dict[str, object]:
        """What the samples of the group :meth:`next_task` just started carry in their
        metadata for :meth:`replay`: its start count and whether it is a re-probe."""
        return {STARTED: self.last_start[task_id], REPROBE: group_key(task_id, round_) in self.reprobes}  # fmt: skip

    @classmethod
    def restored(cls, tasks: Sequence[Task], cfg: CurriculumConfig, seed: int, probe: Iterable[Group], logged: Iterable[Trajectory], k: int, version: int) -> Curriculum:  # fmt: skip
        """The curriculum of a stage that starts or resumes at ``version``: built on
        ``tasks`` with the order ``seed``, then :meth:`replay` of the probe's groups and the
        stage's ``logged`` trajectories."""
        curriculum = cls(list(tasks), cfg, seed=seed)
        curriculum.replay(probe, logged, k, version)
        return curriculum

    def replay(
        self, probe: Iterable[Group], logged: Iterable[Trajectory], k: int, version: int
    ) -> None:
        """A resumed stage's state, rebuilt: the probe's groups (round 0), then the RL
        groups of the trajectory log (``task#rN``) — each task's visits past its highest
        round, its last start and the re-probes from their :meth:`stamp`, the groups
        started up to the newest stamp (unstamped: one per group), the complete ones'
        evidence in log order — and :meth:`advance` to the resumed ``version``
        (``enabled``). So the next task a resumed run starts is the one the run never
        killed started next. A group started but killed before any sample was logged has
        no stamp and is started again: its number, a gap below the newest stamp (a later
        group logged first), is in :attr:`lost` and given out again, so the count does not
        take it twice."""
        for g in probe:
            self.observe(g, "probe")
        for tid in self._by_id:
            self.visits[tid] = 1  # round 0 is the probe's
        self.probe_rounds = 1
        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for t in logged:
            key = str(t.meta.get("group", ""))
            if "#r" not in key or t.task_id not in self._by_id:
                continue
            groups[key].append(t)
            r = int(t.meta.get("round", 0))
            self.visits[t.task_id] = max(self.visits[t.task_id], r + 1)
            n = int(t.meta.get(STARTED, 0))  # the live run's start count (0: not stamped)
            if n:
                self.last_start[t.task_id] = max(self.last_start.get(t.task_id, 0), n)
            if t.meta.get(REPROBE):
                self.reprobes.add(key)
        stamps = {int(t.meta.get(STARTED, 0)) for ts in groups.values() for t in ts}
        self.started = max([len(groups), *stamps])
        if 0 not in stamps:  # every group stamped: the numbers below the newest not logged
            self.lost = sorted(set(range(1, self.started + 1)) - stamps)
        for key, ts in groups.items():
            if len(ts) == k:
                self.observe(Group(self._by_id[ts[0].task_id], int(key.rsplit("#r", 1)[1]), ts))
        if self.cfg.enabled:
            self.advance(version)

    def trainable(self, groups: Iterable[Group], done: Container[str]) -> list[Group]:
        """The groups of kept tasks with signal none of whose samples is in ``done``
        (``train_on_probe``: the probe's groups that become the first ready ones)."""
        return [
            g
            for g in groups
            if self.pools[g.task.task_id] == "kept"
            and has_signal(g.rewards)
            and not any(t.traj_id in done for t in g.trajectories)
        ]

    def advance(self, version: int) -> list[Transition]:
        """Re-pool every task at a new policy ``version``: as evidence ages (γ), a verdict of
        an older policy loosens, and the task can drift back into the band to be tried
        again. Returns the moves."""
        moves = []
        for tid, ev in self.evidence.items():
            after = pool_of(*posterior(ev, version, self.cfg), self.cfg, self.pools[tid])
            if after != self.pools[tid]:
                moves.append(Transition(tid, version, self.pools[tid], after))
                self.pools[tid] = after
        self.transitions.extend(moves)
        return moves

    # ------------------------------------------------------------------ the next task
    def next_task(self) -> tuple[Task, int, bool]:
        """``(task, round, reprobe)`` of the next group to start, and count it as started
        (its number: the first :attr:`lost` one, else the next)."""
        if self.lost:
            n = self.lost.pop(0)
        else:
            self.started += 1
            n = self.started
        out = self._pool_members("unsolved") + self._pool_members("solved")
        kept = self._pool_members("kept")
        every = self.cfg.reprobe_every
        reprobe = bool(out) and (not kept or (every > 0 and n % every == 0))
        if reprobe:  # the one started longest ago first: its verdict is the oldest
            tid = min(out, key=lambda t: (self.last_start.get(t, -1), self._rank[t]))
        elif kept:  # least visited first (within the least started tier, when balanced)
            if self.cfg.balance_tiers:
                kept = least_started_tier(kept, self.tier_starts(kept), {t: self._by_id[t].tier for t in kept})  # fmt: skip
            tid = min(kept, key=lambda t: (self.visits[t], self._rank[t]))
        else:
            raise ValueError("the curriculum has no task in any pool")
        r = self.visits[tid]
        self.visits[tid] += 1
        self.last_start[tid] = n
        if reprobe:
            self.reprobes.add(group_key(tid, r))
        return self._by_id[tid], r, reprobe

    def tier_starts(self, kept: Sequence[str]) -> dict[int, int]:
        """Groups started per tier, as ``balance_count`` counts them: ``with_probe``, every
        round of the tier's kept tasks, the probe's included (``Σ_{t ∈ kept} visits(t)``, so
        the tier with fewer kept tasks starts alone until its total catches up); ``loop``,
        only the loop's groups of every task of the tier, re-probes included (tiers
        alternate from the first group)."""
        out: dict[int, int] = defaultdict(int)
        if self.cfg.balance_count == "with_probe":
            for t in kept:
                out[self._by_id[t].tier] += self.visits[t]
        else:
            for t, n in self.visits.items():
                out[self._by_id[t].tier] += n - self.probe_rounds
        return dict(out)

    def _pool_members(self, pool: Pool) -> list[str]:
        return [t for t, p in self.pools.items() if p == pool]

    # ------------------------------------------------------------------ reading it
    def counts(self) -> dict[str, int]:
        """Tasks per pool now."""
        return {p: len(self._pool_members(p)) for p in POOLS}

    def summary(self) -> dict[str, object]:
        """Pool sizes, transitions (``before→after`` counts and the list), groups started,
        and every task's state at :attr:`version`: pool, posterior (α, β), groups started
        (``visits``) and groups counted."""
        moves: dict[str, int] = {}
        for m in self.transitions:
            key = f"{m.before}->{m.after}"
            moves[key] = moves.get(key, 0) + 1
        return {
            "pools": self.counts(),
            "transitions": moves,
            "transition_log": [m.__dict__ for m in self.transitions],
            "groups_started": self.started,
            "version": self.version,
            "tasks": {
                tid: {
                    "pool": self.pools[tid],
                    "posterior": list(posterior(ev, self.version, self.cfg)),
                    "visits": self.visits[tid],
                    "groups": len(ev),
                }
                for tid, ev in self.evidence.items()
            },
        }
