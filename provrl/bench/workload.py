"""A recorded agent workload: the episodes that ``provrl bench engine --workload`` replays.

An episode is what the engine was asked to do, turn by turn, with the sampled ids left out::

    turn 0     context = the prompt ids              then the policy sampled n_0 tokens
    turn t>0   context = the tool result's ids       then n_t tokens
               (closing the assistant turn, the
               observation, reopening the turn)

It is read from any trajectory log (``RUN/rl/trajectories.jsonl``, ``RUN/probe/…``,
``RUN/warmstart/teacher.jsonl``): a trajectory's non-action runs are the contexts, its
action runs the turns' lengths, its tool calls the seconds each tool took. Or from a
*workload file* (``provrl-workload/1`` JSON, :func:`write_workload`): the same episodes,
each distinct context stored once, with a note of where they came from and how they differ
from the real workload.

Token counts of a workload are pure functions of it (:func:`token_counts`): a replay that
processes every context and samples exactly ``n_t`` tokens per turn processes
``context + action`` tokens, whichever engine runs it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from provrl.provenance import Trajectory

FORMAT = "provrl-workload/1"
DATA = Path(__file__).parent / "data"
FIXTURE = DATA / "workload.json"
"""The shipped workload: 4 GRPO groups × 8 episodes of SmolLM2's warm-started policy,
cut from ``data/trainer_batch.jsonl`` by :func:`fixture_from_log` (its header says how it
differs from the RL stage's workload)."""
FIXTURE_NOTE = (
    "SmolLM2-135M-Instruct warm-started on oracle traces (a default-preset run), probed on "
    "the default world's train tasks, tiers 1-2: the trainer benchmark's batch"
)
FIXTURE_DIFFERS = (
    "Probe stage, not RL: the policy is the warm start (what RL step 1 samples from); later "
    "RL policies answer a little more often and search about as much (results/demo.json: "
    "1.19 -> 1.21 tool calls per solved episode).",
    "32 episodes, one RL step's worth (4 groups x 8, groups with signal 0 < K < 8 first, as "
    "RL trains on); the RL stage streams its episodes at concurrency 32 (1,104 in issue 33's "
    "make demo). A replay of more episodes than 32 cycles through them again as new groups, "
    "whose prompts repeat earlier ones (a real run's questions do not: the prefix cache can "
    "serve a repeated question).",
    "The replay samples new ids of the recorded lengths with no stop ids (temperature 1): "
    "contexts and lengths are the recording's, the sampled tokens are not.",
    "Tool latencies are the local BM25 index's (milliseconds); a web search takes seconds "
    "(replay with tool_latency web-fast / web-ai / web-serp).",
)


@dataclass(frozen=True)
class Turn:
    """One engine call of an episode."""

    context: tuple[int, ...]
    """Ids appended before the turn samples: the prompt (turn 0) or the tool result."""
    action_len: int
    """Tokens the policy sampled in this turn (the replay samples exactly this many)."""
    tool_s: float = 0.0
    """Seconds the tool call(s) whose result is ``context`` took (0 for turn 0)."""


@dataclass(frozen=True)
class Episode:
    episode_id: str
    group: str
    """Episodes of one group share their prompt (a GRPO group: k samples of one task)."""
    turns: tuple[Turn, ...]

    def __len__(self) -> int:
        """Every position of the episode: contexts and sampled tokens."""
        return sum(len(t.context) + t.action_len for t in self.turns)


class WorkloadError(ValueError):
    """A workload file or trajectory that cannot be replayed (the message names it)."""


def episode_from_trajectory(traj: Trajectory) -> Episode:
    """The episode a trajectory records: its non-action runs are the turns' contexts, the
    action run after each its length; the tool calls of turn t timed the context of t+1.
    A trailing context with no action after it was never sent to the engine: dropped."""
    is_action = np.asarray(traj.is_action, bool)
    ids = np.asarray(traj.token_id)
    if len(ids) == 0 or is_action[0]:
        raise WorkloadError(f"trajectory {traj.traj_id!r}: does not start with a prompt")
    edges = np.flatnonzero(np.diff(is_action.astype(np.int8))) + 1
    runs = np.split(np.arange(len(ids)), edges)  # alternating: context, action, context, …
    tool_s: dict[int, float] = {}
    for call in traj.tool_calls:
        tool_s[call.turn] = tool_s.get(call.turn, 0.0) + float(call.latency_s)
    turns = []
    for j in range(len(runs) // 2):
        ctx, act = runs[2 * j], runs[2 * j + 1]
        turns.append(
            Turn(tuple(int(i) for i in ids[ctx]), len(act), tool_s.get(j - 1, 0.0) if j else 0.0)
        )
    if not turns:
        raise WorkloadError(f"trajectory {traj.traj_id!r}: has no action tokens")
    group = str(traj.meta.get("group", traj.task_id))
    return Episode(traj.traj_id, group, tuple(turns))


def episodes_in_start_order(trajs: Iterable[Trajectory]) -> list[Episode]:
    """The episodes of a log in the order they were started, as near as a log tells: a log
    holds them as they *finished*, so groups come in the order of their first finished
    member and, within a group, by sample number (``meta['sample']``)."""
    trajs = list(trajs)
    first: dict[str, int] = {}
    for i, t in enumerate(trajs):
        first.setdefault(str(t.meta.get("group", t.task_id)), i)

    def key(it: tuple[int, Trajectory]) -> tuple[int, int, int]:
        i, t = it
        return first[str(t.meta.get("group", t.task_id))], int(t.meta.get("sample", 0)), i

    return [episode_from_trajectory(t) for _, t in sorted(enumerate(trajs), key=key)]


def token_counts(episodes: Sequence[Episode]) -> dict[str, int]:
    """What a replay of ``episodes`` processes: ``context`` tokens (prompts and tool results,
    prefilled), ``action`` tokens (sampled), ``processed`` = both, ``turns``; and
    ``shareable`` — prompt tokens a prefix cache can serve at best: each prompt's longest
    common prefix with an earlier episode's prompt, less the one token that must be fed
    (every prompt shares the chat template and instructions; a group's members share the
    whole prompt)."""
    trie: dict[int, Any] = {}
    shareable = 0
    for ep in episodes:
        prompt, node, depth = ep.turns[0].context, trie, 0
        while depth < len(prompt) and prompt[depth] in node:
            node, depth = node[prompt[depth]], depth + 1
        shareable += min(depth, len(prompt) - 1)
        for tok in prompt[depth:]:
            node = node.setdefault(tok, {})
    context = sum(len(t.context) for ep in episodes for t in ep.turns)
    action = sum(t.action_len for ep in episodes for t in ep.turns)
    return {
        "episodes": len(episodes),
        "turns": sum(len(ep.turns) for ep in episodes),
        "context": context,
        "action": action,
        "processed": context + action,
        "shareable": shareable,
    }


def shape_stats(episodes: Sequence[Episode]) -> dict[str, float]:
    """The workload's shape: mean prompt, tool-result and action lengths, turns per episode,
    mean recorded tool seconds (how a fixture is compared with the real workload)."""
    prompts = [len(ep.turns[0].context) for ep in episodes]
    obs = [len(t.context) for ep in episodes for t in ep.turns[1:]]
    acts = [t.action_len for ep in episodes for t in ep.turns]
    tools = [t.tool_s for ep in episodes for t in ep.turns[1:]]

    def mean(xs: Sequence[float]) -> float:
        return float(np.mean(xs)) if xs else 0.0

    return {
        "prompt_tokens_mean": mean(prompts),
        "tool_result_tokens_mean": mean(obs),
        "action_tokens_mean": mean(acts),
        "turns_per_episode_mean": mean([len(ep.turns) for ep in episodes]),
        "tool_s_mean": mean(tools),
        "episode_tokens_max": float(max((len(ep) for ep in episodes), default=0)),
    }


def take(episodes: Sequence[Episode], n: int) -> list[Episode]:
    """The first ``n`` episodes (0 = all); more than there are cycles through them again,
    pass p's episodes and groups renamed ``…#p{p}`` (new groups with the same prompts)."""
    if n <= 0 or not episodes:
        return list(episodes)
    out = list(episodes[:n])
    p = 1
    while len(out) < n:
        out.extend(Episode(f"{e.episode_id}#p{p}", f"{e.group}#p{p}", e.turns)
                   for e in episodes[: n - len(out)])  # fmt: skip
        p += 1
    return out


# ----------------------------------------------------------------------------- files
def write_workload(
    path: str | os.PathLike[str],
    episodes: Sequence[Episode],
    *,
    concurrency: int,
    source: dict[str, Any],
    differs_from_real: Sequence[str],
) -> None:
    """Write a workload file: ``episodes`` (each distinct context stored once), the
    ``concurrency`` they ran at, where they came from and how they differ from the real
    workload (both required: a fixture that hides its provenance is no benchmark)."""
    if not differs_from_real:
        raise WorkloadError("write_workload: say how the episodes differ from the real workload")
    index: dict[tuple[int, ...], int] = {}
    eps = []
    for ep in episodes:
        turns = [[index.setdefault(t.context, len(index)), t.action_len, round(t.tool_s, 6)]
                 for t in ep.turns]  # fmt: skip
        eps.append({"id": ep.episode_id, "group": ep.group, "turns": turns})
    doc = {
        "format": FORMAT,
        "source": source,
        "differs_from_real": list(differs_from_real),
        "concurrency": concurrency,
        "tokens": token_counts(episodes),
        "shape": shape_stats(episodes),
        "episodes": eps,
        "contexts": [list(c) for c in index],
    }
    Path(path).write_text(json.dumps(doc, separators=(",", ":")) + "\n")


def fixture_from_log(
    log: str | os.PathLike[str] = DATA / "trainer_batch.jsonl",
    out: str | os.PathLike[str] = FIXTURE,
    *,
    concurrency: int = 32,
    note: str = FIXTURE_NOTE,
    differs_from_real: Sequence[str] = FIXTURE_DIFFERS,
) -> dict[str, Any]:
    """Write the workload file of a trajectory log's episodes (in start order); returns its
    token counts. The shipped :data:`FIXTURE` is this function's output on the trainer
    benchmark's batch, at the default preset's ``pipeline.loop.concurrency``."""
    from provrl.trajlog import read_all

    trajs = read_all(log)
    eps = episodes_in_start_order(trajs)
    t0 = trajs[0]
    source = {
        "log": Path(log).name,
        "policy": t0.policy.name,
        "tools": t0.tools.config,
        "sampling": t0.sampling.to_dict(),
        "note": note,
        "groups": len({e.group for e in eps}),
    }
    write_workload(out, eps, concurrency=concurrency, source=source,
                   differs_from_real=differs_from_real)  # fmt: skip
    return token_counts(eps)


def run_concurrency(log: Path) -> int:
    """The agent loops an RL log's run kept in flight: ``pipeline.loop.concurrency`` of
    ``RUN/config.yaml`` for ``RUN/rl/trajectories.jsonl``; 0 (unknown) for any other log."""
    cfg = log.parent.parent / "config.yaml"
    if log.parent.name != "rl" or not cfg.is_file():
        return 0
    from provrl.config import load_yaml

    try:
        return int(load_yaml(cfg)["pipeline"]["loop"]["concurrency"])
    except (KeyError, TypeError, ValueError):
        return 0


def read_workload(path: str | os.PathLike[str]) -> tuple[list[Episode], dict[str, Any]]:
    """The episodes of a workload file, or of a trajectory log (``*.jsonl``), and the file's
    header (``format``, ``source``, ``differs_from_real``, ``concurrency``; for a log, its
    path and its run's concurrency, :func:`run_concurrency`, 0 = unknown)."""
    p = Path(path)
    if not p.is_file():
        raise WorkloadError(f"{p}: no such workload file or trajectory log")
    if p.suffix == ".jsonl":
        from provrl.trajlog import read_all

        eps = episodes_in_start_order(read_all(p))
        conc = run_concurrency(p)
        return eps, {"format": "trajectories", "source": {"path": str(p)}, "concurrency": conc}
    try:
        doc = json.loads(p.read_text())
        if doc.get("format") != FORMAT:
            raise WorkloadError(f"{p}: format {doc.get('format')!r}, expected {FORMAT!r}")
        ctx = [tuple(int(i) for i in c) for c in doc["contexts"]]
        eps = [
            Episode(
                str(e["id"]),
                str(e["group"]),
                tuple(Turn(ctx[c], int(n), float(s)) for c, n, s in e["turns"]),
            )
            for e in doc["episodes"]
        ]
    except WorkloadError:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise WorkloadError(f"{p}: not a {FORMAT} file: {e!r}") from e
    header = {k: v for k, v in doc.items() if k not in ("episodes", "contexts")}
    return eps, header
