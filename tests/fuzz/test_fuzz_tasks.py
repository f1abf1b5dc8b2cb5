"""Fuzz: task files, provrl's own records and plain QA records."""

from __future__ import annotations

import json

from fuzz_json import JSON
from hypothesis import given, settings
from hypothesis import strategies as st

from provrl.env.tasks import TaskFileError, load_tasks, read_task_file

GOOD = {
    "task_id": "t1", "split": "dev", "tier": 2, "kind": "k", "question": "Who?", "answer": "A",
    "aliases": ["A"], "answer_entity": "person:1", "evidence": ["d1", "d2"], "min_searches": 2,
    "oracle": [{"query": "q", "passage": "d1#0", "reveals": "x"},
               {"query": "r", "passage": "d2#0", "reveals": "A"}],
}  # fmt: skip


@st.composite
def task_lines(draw):
    """A good record with some fields replaced by arbitrary JSON, or arbitrary bytes."""
    kind = draw(st.sampled_from(["mutated", "plain", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200)).replace(b"\n", b" ")
    base = dict(GOOD) if kind == "mutated" else {"question": "q?", "answer": "a"}
    for key in draw(st.lists(st.sampled_from([*GOOD, "answers", "id", "extra"]), max_size=3)):
        if draw(st.booleans()):
            base[key] = draw(JSON)
        else:
            base.pop(key, None)
    return json.dumps(base).encode()


@settings(max_examples=300, deadline=None)
@given(st.lists(task_lines(), min_size=1, max_size=4), st.sampled_from([None, "dev", "test"]))
def test_task_loaders_return_tasks_or_raise_task_file_error(tmp_path_factory, lines, split):
    p = tmp_path_factory.mktemp("tasks") / "t.jsonl"
    p.write_bytes(b"\n".join(lines) + b"\n")
    for load in (lambda: load_tasks(p, split=split), lambda: read_task_file(p, split or "dev")):
        try:
            tasks = load()
        except TaskFileError as e:
            assert str(e).startswith(str(p)) and "\n" not in str(e)
        else:
            assert all(t.question.strip() and t.answer for t in tasks)
