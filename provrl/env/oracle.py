"""The oracle: a scripted policy that runs each task's minimal search plan on a real backend.

For every step of ``task.oracle`` it issues the query, checks that the gold passage is among
the top-k hits and shows what the next step needs (``reveals``), then answers. So it

* proves the task is solvable with the shipped backend at the agent's ``k``;
* gives the lower bound on tool calls used in evaluation (``task.min_searches``): one search
  per evidence passage, with every branch choice right (a real agent on a tier-3 task has to
  try several candidates; a lucky query can occasionally surface two evidence passages);
* checks the plan is *honest*: every query word (bar a few generic words) appears in the
  question or in results already seen;
* writes teacher traces: the dialogue it had, in the agent's protocol.

:func:`run_explorer` is the *exploratory* teacher: the same plan, searched the way large
agents search — a vaguer query before the exact one, a document opened that the answer
does not use, a confirming search before answering — each a seeded coin per step, so its
traces stay correct but take about twice the minimal calls, with a spread. A warm start on
them starts out over-searching, which leaves RL's tool-call cost something to cut.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from provrl.env.config import ExplorerConfig
from provrl.env.prompts import Message, format_document, format_hits
from provrl.env.protocol import Call, render_call
from provrl.env.rewards import contains_answer
from provrl.env.search import SearchBackend, query_terms
from provrl.env.tasks import Task

COMPUTED_KINDS = frozenset({"birth_gap", "population_sum"})
"""Task kinds whose answer is computed from shown numbers rather than shown itself."""
GENERIC_QUERY_WORDS = frozenset(
    {"notable", "people", "born", "employees", "of", "in", "the", "include"}
)


@dataclass
class OracleResult:
    task_id: str
    answer: str
    searches: int
    solved: bool
    problems: list[str] = field(default_factory=list)
    turns: list[tuple[str, str | None]] = field(default_factory=list)
    """(assistant text, observation text) per turn; the last turn (the answer) has None."""
    latencies: list[float] = field(default_factory=list)
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(tool, argument) of every search / open call, in order (the answer excluded)."""
    teacher: str = "oracle"
    """Which teacher ran: ``oracle`` (the minimal plan) or ``explorer``."""

    def messages(self, question_text: str) -> list[Message]:
        """The dialogue as chat messages, starting with the user's question."""
        msgs: list[Message] = [{"role": "user", "content": question_text}]
        for action, obs in self.turns:
            msgs.append({"role": "assistant", "content": action})
            if obs is not None:
                msgs.append({"role": "user", "content": obs})
        return msgs


def run_oracle(task: Task, backend: SearchBackend, k: int, protocol: str = "tag") -> OracleResult:
    """Execute ``task``'s plan against ``backend`` with ``k`` results per search."""
    res = OracleResult(task.task_id, task.answer, 0, True)
    seen = set(query_terms(task.question))
    for j, step in enumerate(task.oracle):
        unseen = [
            t for t in query_terms(step.query) if t not in seen and t not in GENERIC_QUERY_WORDS
        ]
        if unseen:
            res.problems.append(f"step {j}: query words {unseen} not seen before")
        t0 = time.perf_counter()
        hits = backend.search(step.query, k)
        res.latencies.append(time.perf_counter() - t0)
        res.searches += 1
        obs = format_hits(hits)
        res.turns.append((render_call(Call("search", step.query), protocol), obs))
        res.calls.append(("search", step.query))
        seen.update(query_terms(obs))
        hit = next((h for h in hits if h.passage_id == step.passage), None)
        if hit is None:
            got = [h.passage_id for h in hits]
            res.problems.append(f"step {j}: gold passage {step.passage} not in top-{k} {got}")
        elif not contains_answer(hit.snippet, [step.reveals]):
            res.problems.append(f"step {j}: passage {step.passage} does not show {step.reveals!r}")
    if task.kind not in COMPUTED_KINDS:
        shown = " ".join(obs for _, obs in res.turns if obs)
        if not contains_answer(shown, task.answers):
            res.problems.append(f"the answer {task.answer!r} was never shown")
    res.solved = not res.problems
    # an oracle that could not verify its plan does not get to answer
    res.answer = task.answer if res.solved else "unknown"
    res.turns.append((render_call(Call("answer", res.answer), protocol), None))
    return res


def _vaguer(query: str, rng: np.random.Generator) -> str | None:
    """A first, vaguer query for ``query``: a random non-empty proper subset of its words
    (in order), or None for a one-word query."""
    words = query.split()
    if len(words) < 2:
        return None
    keep = rng.random(len(words)) < 0.5
    if keep.all() or not keep.any():
        keep = np.zeros(len(words), bool)
        keep[int(rng.integers(len(words)))] = True
    return " ".join(w for w, k in zip(words, keep, strict=True) if k)


def run_explorer(
    task: Task,
    backend: SearchBackend,
    k: int,
    protocol: str = "tag",
    *,
    cfg: ExplorerConfig,
    sample: int = 0,
    max_calls: int = 6,
) -> OracleResult:
    """``task``'s plan searched exploratorily (module docstring), with coins seeded by
    (``cfg.seed``, task, ``sample``): for each plan step, with probability
    ``cfg.reformulate`` a vaguer query first (words of the exact one, so still honest), then
    the exact query, then with probability ``cfg.open_unused`` an ``open`` of a result the
    plan does not use; before the answer, with probability ``cfg.confirm`` a search for the
    answer (an entity the results named). Extras are dropped where they would pass
    ``max_calls``; the plan's own searches always run, so the trace is as correct as the
    oracle's (``solved`` only if the oracle's checks pass)."""
    digest = [int.from_bytes(task.task_id.encode()[-8:].rjust(8, b"\0"), "big"), sample]
    rng = np.random.default_rng([cfg.seed, *digest])
    exact = run_oracle(task, backend, k, protocol)
    res = OracleResult(task.task_id, exact.answer, 0, exact.solved, list(exact.problems))
    res.teacher = "explorer"
    plan = len(task.oracle)
    budget = max(0, max_calls - plan)  # extras allowed on top of the plan's searches

    def call(name: str, arg: str) -> str:
        t0 = time.perf_counter()
        if name == "search":
            obs = format_hits(backend.search(arg, k))
            res.searches += 1
        else:
            obs = format_document(arg, backend.open(arg))
        res.latencies.append(time.perf_counter() - t0)
        res.turns.append((render_call(Call(name, arg), protocol), obs))  # type: ignore[arg-type]
        res.calls.append((name, arg))
        return obs

    for step in task.oracle:
        vague = _vaguer(step.query, rng) if rng.random() < cfg.reformulate else None
        if vague is not None and budget > 0:
            call("search", vague)
            budget -= 1
        call("search", step.query)
        if rng.random() < cfg.open_unused and budget > 0:
            hits = backend.search(step.query, k)
            unused = [h.doc_id for h in hits if h.passage_id != step.passage]
            if unused:
                call("open", unused[int(rng.integers(len(unused)))])
                budget -= 1
    named = any(c.isalpha() for c in task.answer)  # a name worth searching, not a number
    if rng.random() < cfg.confirm and budget > 0 and res.solved and named:
        call("search", task.answer)
        budget -= 1
    res.answer = task.answer if res.solved else "unknown"
    res.turns.append((render_call(Call("answer", res.answer), protocol), None))
    return res
