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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


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
