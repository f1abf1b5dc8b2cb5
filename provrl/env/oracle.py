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
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from provrl.env.prompts import Message, format_hits
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
