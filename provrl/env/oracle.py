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

import re
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


def act(call: Call, protocol: str, thought: str | None = None) -> str:
    """A teacher's turn: the call in ``protocol``, after ``<think>thought</think>`` when the
    agent is asked to reason (``env.agent.reasoning``; None: the call alone)."""
    text = render_call(call, protocol)
    return text if thought is None else f"<think>{thought}</think>\n{text}"


def found(step_reveals: str, last: bool, computed: bool = False) -> str:
    """What a teacher says it found in the result it just read: the entity the plan step
    revealed, and whether that answers the question or another search is needed — the
    per-question decision (one hop or two) made explicit in the trace."""
    if not last:
        return f"The results show {step_reveals}, which does not answer the question yet."
    if computed:
        return f"The results show {step_reveals}. I can compute the answer from what I found."
    return f"The results show {step_reveals}, which answers the question."


_COUNT = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}


def plan_thought(task: Task) -> str:
    """What a teacher says before its first call: how many searches the question needs, read
    from the question's form. A one-hop question names what it asks about; a multi-hop one
    asks about what the name in it leads to. Said once, first, where the question is still
    the last thing read, so a student writes its one-hop-or-two plan before any result can
    sway it (the later :func:`found` thoughts then carry the plan out)."""
    n = len(task.oracle)
    if n <= 1:
        return "The question names what it asks about, so one search should show the answer."
    count = _COUNT.get(n, str(n))
    return (
        "The question asks about what the name in it leads to, so I need "
        f"{count} searches: the name first, then what it shows."
    )


_ONE_SEARCH = "names what it asks about"
_N_SEARCHES = re.compile(r"so I need (\w+) searches")
_COUNT_OF = {w: n for n, w in _COUNT.items()}  # "two" -> 2: plan_thought's words read back


def stated_plan(text: str) -> int | None:
    """How many searches a policy's first ``<think>`` commits to, read back from
    :func:`plan_thought`'s sentences: 1, n ≥ 2, or None when neither sentence is there (no plan
    stated, or a plan in other words). What the warm start learned to say per tier, and what
    RL moved it to: a match on the teacher's own sentences, no model judging."""
    if _ONE_SEARCH in text:
        return 1
    m = _N_SEARCHES.search(text)
    if m is None:
        return None
    word = m.group(1)
    return _COUNT_OF.get(word, int(word) if word.isdigit() else None)


def run_oracle(
    task: Task, backend: SearchBackend, k: int, protocol: str = "tag", *, reasoning: bool = False
) -> OracleResult:
    """Execute ``task``'s plan against ``backend`` with ``k`` results per search; with
    ``reasoning``, each turn starts with a ``<think>`` block (:func:`found`)."""
    res = OracleResult(task.task_id, task.answer, 0, True)
    seen = set(query_terms(task.question))
    plan = task.oracle
    computed = task.kind in COMPUTED_KINDS
    for j, step in enumerate(plan):
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
        thought = None
        if reasoning:
            thought = f"{plan_thought(task)} I search for the name in the question." if j == 0 else found(plan[j - 1].reveals, False)  # fmt: skip
        res.turns.append((act(Call("search", step.query), protocol, thought), obs))
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
    final = found(plan[-1].reveals, True, computed) if reasoning and plan else None
    res.turns.append((act(Call("answer", res.answer), protocol, final), None))
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
    reasoning: bool = False,
) -> OracleResult:
    """``task``'s plan searched exploratorily (module docstring), with coins seeded by
    (``cfg.seed``, task, ``sample``): for each plan step, with probability
    ``cfg.reformulate`` a vaguer query first (words of the exact one, so still honest), then
    the exact query, then with probability ``cfg.open_unused`` an ``open`` of a result the
    plan does not use; before the answer, with probability ``cfg.confirm`` a search for the
    answer (an entity the results named). Extras are dropped where they would pass
    ``max_calls``; the plan's own searches always run, so the trace is as correct as the
    oracle's (``solved`` only if the oracle's checks pass). With ``reasoning`` each turn
    starts with a ``<think>`` block: what the last result showed (:func:`found`) and why the
    next call is made — the extras say what they are (a broader search, a check)."""
    digest = [int.from_bytes(task.task_id.encode()[-8:].rjust(8, b"\0"), "big"), sample]
    rng = np.random.default_rng([cfg.seed, *digest])
    exact = run_oracle(task, backend, k, protocol)
    computed = task.kind in COMPUTED_KINDS
    res = OracleResult(task.task_id, exact.answer, 0, exact.solved, list(exact.problems))
    res.teacher = "explorer"
    plan = len(task.oracle)
    budget = max(0, max_calls - plan)  # extras allowed on top of the plan's searches

    # said once, before the next call: first the plan, then what each exact search revealed
    said: list[str] = [plan_thought(task)]

    def call(name: str, arg: str, thought: str) -> str:
        t0 = time.perf_counter()
        if name == "search":
            obs = format_hits(backend.search(arg, k))
            res.searches += 1
        else:
            obs = format_document(arg, backend.open(arg))
        res.latencies.append(time.perf_counter() - t0)
        text = act(Call(name, arg), protocol, thought if reasoning else None)  # type: ignore[arg-type]
        res.turns.append((text, obs))
        res.calls.append((name, arg))
        return obs

    def lead(then: str) -> str:
        """The thought before a call: what the last exact search showed (once), then why."""
        return (said.pop() + " " if said else "") + then

    for j, step in enumerate(task.oracle):
        last = j == plan - 1
        vague = _vaguer(step.query, rng) if rng.random() < cfg.reformulate else None
        if vague is not None and budget > 0:
            call("search", vague, lead("I start with a broader search."))
            budget -= 1
        call("search", step.query, lead("I search for the exact name."))
        said.append(found(step.reveals, last, computed))
        if rng.random() < cfg.open_unused and budget > 0:
            hits = backend.search(step.query, k)
            unused = [h.doc_id for h in hits if h.passage_id != step.passage]
            if unused:
                call("open", unused[int(rng.integers(len(unused)))], lead("I open another result to check it."))  # fmt: skip
                budget -= 1
    named = any(c.isalpha() for c in task.answer)  # a name worth searching, not a number
    if rng.random() < cfg.confirm and budget > 0 and res.solved and named:
        call("search", task.answer, lead("I search for the answer to confirm it."))
        budget -= 1
    res.answer = task.answer if res.solved else "unknown"
    final = lead("So I answer.") if reasoning else None
    res.turns.append((act(Call("answer", res.answer), protocol, final), None))
    return res
