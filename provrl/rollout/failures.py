"""Where an agent's episodes fail, read against the oracle's plan of each task.

A world task carries its oracle plan: hops h = 1 … H, each a search whose gold passage
*reveals* what the next hop needs (a name, a year; the last hop reveals the answer). With
``results`` what the episode's search/open calls showed the model, in order,

    hops_found   = the largest h such that the reveals of hops 1 … h all appear in the results
                   (:func:`~provrl.env.rewards.contains_answer`: normalised, whole words; the
                   last hop's reveal is any gold answer)
    calls_after  = the calls made after the first result in which hop ``hops_found``'s reveal
                   appeared (0 when no hop was found)

and a failed episode falls in exactly one mode (:func:`failure_mode`), checked in this order:

    unanswered              no answer given (turn, token or malformed-call budget spent)
    no_search               answered without a tool result
    answer_shown            a result showed a gold answer, and the answer given is not one:
                            the evidence was found, the copy or the choice went wrong
    first_hop_missed        no result showed hop 1's reveal: the first query went wrong
    stopped_after_partial   hops 1 … h (0 < h < H) found, then answered without another call
    later_hop_missed        hops 1 … h found, then calls that never showed hop h + 1

so that a tier's failures say whether RL should search more, search better or read better.
A task without an oracle plan (a user's QA file) has no hops: its episodes get no mode.

Episodes record ``hops`` (H), ``hops_found`` and ``calls_after_hop`` in their metrics as they
run (:mod:`provrl.rollout.agent`); :func:`backfill_hop_metrics` adds them to episodes logged
before they existed, from their observation segments (``provrl failures``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from provrl.env.rewards import contains_answer
from provrl.env.tasks import Task
from provrl.provenance import Trajectory

MODES = (
    "unanswered",
    "no_search",
    "answer_shown",
    "first_hop_missed",
    "stopped_after_partial",
    "later_hop_missed",
)
"""The failure modes, in the order :func:`failure_mode` checks them."""


def hops_found(
    results: Sequence[str | None], reveals: Sequence[str], answers: Iterable[str]
) -> tuple[int, int]:
    """``(hops_found, calls_after)`` of the module docstring; ``reveals``: the oracle plan's,
    hop by hop (the last one is replaced by ``answers``); ``results[i]``: what the i-th call
    showed (None: nothing)."""
    answers = list(answers)
    targets = [[r] for r in reveals[:-1]] + [answers] if reveals else []
    first_seen: list[int] = []
    for target in targets:
        seen = next((i for i, text in enumerate(results) if text and contains_answer(text, target)), None)  # fmt: skip
        if seen is None:
            break
        first_seen.append(seen)
    if not first_seen:
        return 0, 0
    return len(first_seen), len(results) - first_seen[-1] - 1


def failure_mode(metrics: Mapping[str, float]) -> str | None:
    """The failure mode of an episode from its metrics (module docstring); None when it
    solved its task or its task has no oracle plan."""
    if metrics.get("exact_match", 0.0) > 0 or not metrics.get("hops"):
        return None
    hops, found = int(metrics["hops"]), int(metrics["hops_found"])
    if not metrics.get("answered"):
        return "unanswered"
    if metrics.get("num_tool_calls", 0.0) == 0:
        return "no_search"
    if found >= hops:
        return "answer_shown"
    if found == 0:
        return "first_hop_missed"
    return "stopped_after_partial" if metrics["calls_after_hop"] == 0 else "later_hop_missed"


def failure_table(samples: Iterable[Mapping[str, float]]) -> dict[str, Any]:
    """Each mode's share of the samples (all of them, solved ones included, so the shares
    and the accuracy add up to 1) over the samples whose task has an oracle plan; ``{}``
    when none has."""
    counts = dict.fromkeys(MODES, 0)
    n = 0
    for m in samples:
        if not m.get("hops"):
            continue
        n += 1
        mode = failure_mode(m)
        if mode is not None:
            counts[mode] += 1
    if not n:
        return {}
    return {"samples": n, **{k: v / n for k, v in counts.items()}}


def hop_metrics(
    results: Sequence[str | None], reveals: Sequence[str], answers: Iterable[str]
) -> dict[str, float]:
    """The metrics an episode records (module docstring); ``{}`` without an oracle plan."""
    if not reveals:
        return {}
    found, after = hops_found(results, reveals, answers)
    return {
        "hops": float(len(reveals)),
        "hops_found": float(found),
        "calls_after_hop": float(after),
    }


def backfill_hop_metrics(
    trajectories: Iterable[Trajectory], tasks: Mapping[str, Task], decode: Callable[[Any], str]
) -> int:
    """Add the hop metrics to logged trajectories that lack them (logged before they
    existed): their results are their observation segments' tokens, ``decode``-d (every
    observation counts, a malformed call's error message too). Returns how many got them."""
    done = 0
    for traj in trajectories:
        task = tasks.get(traj.task_id)
        if "hops" in traj.metrics or task is None or not task.oracle:
            continue
        results = [decode(ids) for seg, ids in traj.text_segments() if seg.kind == "observation"]
        traj.metrics.update(hop_metrics(results, [h.reveals for h in task.oracle], task.answers))
        done += 1
    return done
