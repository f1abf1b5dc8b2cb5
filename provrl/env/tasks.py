"""Tasks in four tiers, their JSONL schema, and splits disjoint by answer entity.

Tiers (``min_searches`` = searches of the oracle's plan, one per evidence passage):

1. **lookup** — one fact from the opening of one entity's page (1 search: the name).
2. **two-hop** — a fact about an entity named on another entity's page (2 searches).
3. **multi-constraint** (BrowseComp style) — identify the person who satisfies 3–5 clues
   spread over different pages. The entry clue (an award ceremony, a birth city or an
   employer) yields a list of ≥ 2 candidates; only the intersection of all clues is unique.
   The oracle knows which candidate to check (3–4 searches); an agent has to try them.
4. **comparison / aggregation** — compare 2–3 entities and answer with a fact about the
   winner, or combine two numbers (2–3 searches plus arithmetic).

One task per line in ``tasks/{split}.jsonl``::

    {"task_id": "t00042", "split": "dev", "tier": 2, "kind": "employer_hq",
     "question": "...", "answer": "Dunmere", "aliases": ["Dunmere"],
     "answer_entity": "place:17", "evidence": ["d0000123", "d0000456"],
     "min_searches": 2,
     "oracle": [{"query": "Orlan Vesk", "passage": "d0000123#0", "reveals": "Halvex Institute"},
                {"query": "Halvex Institute", "passage": "d0000456#0", "reveals": "Dunmere"}]}

Plain question/answer records ``{"question": ..., "answer": "..." | [...], "id": ...}`` (a
user's own data) are read by :func:`read_task_file` as tier-0 tasks of kind ``plain``
without an oracle plan (docs/data.md). Written back (a probe's ``tasks.jsonl``, a filter
pool), they keep ``"tier": 0`` and read back through :func:`load_tasks` unchanged.

The split of a task is a hash of ``answer_entity`` (the entity the answer names, or for a
number, the entity it is about), so train / dev / test never share an answer entity.
Answers never occur in their question (checked at generation, tested). The generators
are in :mod:`provrl.env.taskgen`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from provrl.env.jsonl import iter_records

SPLITS = ("train", "dev", "test")
TIER_NAMES = {1: "lookup", 2: "two-hop", 3: "multi-constraint", 4: "comparison"}
USER_TIER = 0
"""``Task.tier`` of a user's own task (a plain QA record): no tier of the world, no oracle."""


class TaskFileError(ValueError):
    """A task file is malformed; the message names the file, the line and the field."""


@dataclass(frozen=True)
class OracleStep:
    """One search of the oracle's plan."""

    query: str
    """The query (built only from the question and text seen in earlier results)."""
    passage: str
    """Gold passage id ``doc_id#paragraph`` that this search must return."""
    reveals: str
    """What the passage shows that the next step needs (a name, a year, the answer)."""


@dataclass
class Task:
    task_id: str
    split: str
    tier: int
    kind: str
    question: str
    answer: str
    aliases: list[str]
    answer_entity: str
    evidence: list[str]
    min_searches: int
    oracle: list[OracleStep] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    """A plain record's fields as read (a dataset row: question, answer and any other
    column), which reward functions receive as keyword arguments; empty for a world task."""

    @property
    def answers(self) -> list[str]:
        return [self.answer, *self.aliases]

    def to_json(self) -> dict[str, Any]:
        """The task as a record (``columns`` only when there are any)."""
        d = asdict(self)
        if not d["columns"]:
            del d["columns"]
        return d


# ----------------------------------------------------------------------------- schema
_SCHEMA: dict[str, type | tuple[type, ...]] = {
    "task_id": str,
    "split": str,
    "tier": int,
    "kind": str,
    "question": str,
    "answer": str,
    "aliases": list,
    "answer_entity": str,
    "evidence": list,
    "min_searches": int,
    "oracle": list,
}


MAX_TASK_LINE_BYTES = 1 << 20
"""Longest line of a task file (a task is ~1 KB)."""
MAX_TASKS = 1_000_000
"""Most tasks in one file."""
MAX_TEXT_CHARS = 8192
"""Longest question, answer, alias or other text field of a task."""
MAX_LIST_ITEMS = 64
"""Most aliases, evidence ids or oracle steps of one task."""


def _check_sizes(d: dict[str, Any], where: str) -> None:
    """Every text field ≤ MAX_TEXT_CHARS characters, every list ≤ MAX_LIST_ITEMS items."""
    for key, v in d.items():
        items = v if isinstance(v, list) else [v]
        if isinstance(v, list) and len(v) > MAX_LIST_ITEMS:
            raise TaskFileError(
                f"{where}: field {key!r} has {len(v)} items; at most {MAX_LIST_ITEMS}"
            )
        for x in items:
            texts = x.values() if isinstance(x, dict) else [x]
            if any(isinstance(t, str) and len(t) > MAX_TEXT_CHARS for t in texts):
                raise TaskFileError(
                    f"{where}: field {key!r} is longer than {MAX_TEXT_CHARS} characters"
                )


def task_from_json(d: Any, where: str) -> Task:
    """Validate one decoded line; errors name ``where`` (``file:line``) and the field."""
    if not isinstance(d, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(d).__name__}")
    for key, typ in _SCHEMA.items():
        if key not in d:
            raise TaskFileError(f"{where}: field {key!r} is missing")
        v = d[key]
        if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
            raise TaskFileError(
                f"{where}: field {key!r} must be {getattr(typ, '__name__', typ)}, "
                f"got {type(v).__name__} {v!r}"
            )
    columns = d.get("columns", {})
    if not isinstance(columns, dict):
        raise TaskFileError(f"{where}: field 'columns' must be an object, got {columns!r}"[:200])
    unknown = set(d) - set(_SCHEMA) - {"columns"}
    if unknown:
        raise TaskFileError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    _check_sizes({k: v for k, v in d.items() if k != "columns"}, where)
    if d["split"] not in SPLITS:
        raise TaskFileError(f"{where}: field 'split' must be one of {SPLITS}, got {d['split']!r}")
    if d["tier"] not in TIER_NAMES and d["tier"] != USER_TIER:
        raise TaskFileError(
            f"{where}: field 'tier' must be 1-4 (a world task) or 0 (a user task), "
            f"got {d['tier']!r}"
        )
    if not d["question"].strip() or not d["answer"].strip():
        raise TaskFileError(
            f"{where}: field {'question' if not d['question'].strip() else 'answer'!r} is empty"
        )
    for key in ("aliases", "evidence"):
        if not all(isinstance(x, str) for x in d[key]):
            raise TaskFileError(f"{where}: field {key!r} must be a list of strings")
    steps = []
    for j, s in enumerate(d["oracle"]):
        if not isinstance(s, dict) or set(s) != {"query", "passage", "reveals"}:
            raise TaskFileError(
                f"{where}: field 'oracle[{j}]' must be an object with query, passage, reveals"
            )
        if not all(isinstance(s[k], str) for k in s):
            raise TaskFileError(f"{where}: field 'oracle[{j}]' values must be strings")
        steps.append(OracleStep(**s))
    if d["min_searches"] != len(steps):
        raise TaskFileError(
            f"{where}: field 'min_searches' is {d['min_searches']} but the oracle plan has "
            f"{len(steps)} searches"
        )
    return Task(**{**d, "oracle": steps})


def load_tasks(path: str | os.PathLike[str], *, split: str | None = None) -> list[Task]:
    """Read a task JSONL file. Malformed input raises :class:`TaskFileError` with line and
    field; blank lines are skipped. With ``split``, every task must belong to it (a train
    task in ``test.jsonl`` is an error, not a leak). Bounded: :data:`MAX_TASK_LINE_BYTES`
    per line, :data:`MAX_TASKS` per file, :data:`MAX_TEXT_CHARS` per text field,
    :data:`MAX_LIST_ITEMS` per list field."""
    p = Path(path)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, d in _task_records(p):
        where = f"{p}:{lineno}"
        t = task_from_json(d, where)
        if split is not None and t.split != split:
            raise TaskFileError(
                f"{where}: field 'split' is {t.split!r} but {p.name} holds the {split!r} split"
            )
        if t.task_id in seen:
            raise TaskFileError(
                f"{where}: field 'task_id' {t.task_id!r} repeats line {seen[t.task_id]}"
            )
        seen[t.task_id] = lineno
        tasks.append(t)
    return tasks


def _task_records(p: Path) -> Iterator[tuple[int, Any]]:
    """The decoded lines of a task file, within the task-file bounds."""
    return iter_records(
        p, TaskFileError, "task file", max_line_bytes=MAX_TASK_LINE_BYTES, max_records=MAX_TASKS
    )


# ----------------------------------------------------------------------------- plain QA
PLAIN_KIND = "plain"
"""``Task.kind`` of a task read from a plain question/answer record (tier 0, no oracle)."""
PLAIN_ANSWER_KEYS = ("answer", "answers", "golden_answers")
"""Where a plain record may keep its answer(s): provrl's ``answer``, or the ``answers`` /
``golden_answers`` lists of QA datasets as Search-R1 and FlashRAG ship them."""


def plain_task_from_json(d: Any, where: str, lineno: int, split: str) -> Task:
    """A task from a plain record ``{"question": str, "answer": str | [str, ...], "id"?}``:
    the first answer is the reference, the rest are aliases (exact match accepts any).
    The whole record is kept as ``columns`` (reward functions receive it); errors name
    ``where`` and the field."""
    if not isinstance(d, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(d).__name__}")
    q = d.get("question")
    if not isinstance(q, str) or not q.strip():
        got = "missing" if q is None else f"{type(q).__name__} {q!r}"[:80]
        raise TaskFileError(f"{where}: field 'question' must be a non-empty string, got {got}")
    key = next((k for k in PLAIN_ANSWER_KEYS if k in d), None)
    if key is None:
        raise TaskFileError(
            f"{where}: field 'answer' is missing (a string or a list of strings; "
            f"'answers' and 'golden_answers' are read too)"
        )
    raw = d[key]
    _check_sizes({"question": q, key: raw}, where)  # the line's size caps the other fields
    answers = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(answers, list)
        or not answers
        or not all(isinstance(a, str) and a.strip() for a in answers)
    ):
        raise TaskFileError(
            f"{where}: field {key!r} must be a non-empty string or a non-empty list of "
            f"non-empty strings, got {str(raw)[:80]!r}"
        )
    tid = d.get("id", d.get("task_id", f"q{lineno:06d}"))
    if not isinstance(tid, str | int) or isinstance(tid, bool):
        raise TaskFileError(f"{where}: field 'id' must be a string or an integer, got {tid!r}")
    return Task(
        task_id=str(tid),
        split=split,
        tier=USER_TIER,
        kind=PLAIN_KIND,
        question=q.strip(),
        answer=answers[0],
        aliases=list(answers[1:]),
        answer_entity="",
        evidence=[],
        min_searches=0,
        columns=dict(d),
    )


def read_task_file(path: str | os.PathLike[str], split: str = "test") -> list[Task]:
    """Tasks from a JSONL file in either format, decided per file by its first record:
    provrl's own task records (``task_id``, ``tier``, ``oracle``, …: :func:`load_tasks`) or
    plain QA records (:func:`plain_task_from_json`, given ``split``). Blank lines are
    skipped; a malformed line raises :class:`TaskFileError` naming file, line and field;
    repeated ids are refused."""
    p = Path(path)
    records = list(_task_records(p))
    if not records:
        raise TaskFileError(f"{p}: no tasks (the file is empty)")
    first = records[0][1]
    if isinstance(first, dict) and "oracle" in first and "task_id" in first:
        return load_tasks(p)
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for lineno, d in records:
        t = plain_task_from_json(d, f"{p}:{lineno}", lineno, split)
        if t.task_id in seen:
            raise TaskFileError(
                f"{p}:{lineno}: field 'id' {t.task_id!r} repeats line {seen[t.task_id]}"
            )
        seen[t.task_id] = lineno
        tasks.append(t)
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | os.PathLike[str]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "wb") as f:
        for t in tasks:
            f.write(orjson.dumps(t.to_json()) + b"\n")
    tmp.replace(p)
