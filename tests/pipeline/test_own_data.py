"""`provrl run` on a user's own data: a plain {question, answer} task file (read as tier-0
user tasks that survive every stage file), a user's own index and warm-start file, and the
one-line refusal of a warm start that could only produce an empty teacher file."""

from __future__ import annotations

import json
from pathlib import Path

from provrl.cli.entry import main
from provrl.env.collection import index_collection
from provrl.env.tasks import USER_TIER, load_tasks
from provrl.trajlog import read_trajectories

DOCS = [
    {"id": "d1", "title": "Halvex Institute", "text": "The Halvex Institute is in Dunmere."},
    {"id": "d2", "title": "Orlan Vesk", "text": "Orlan Vesk was a chemist born in Tarsby."},
    {"id": "d3", "title": "Tarsby", "text": "Tarsby is a port town. Its mayor is Ida Brenn."},
]
TASKS = [
    {"question": "Where is the Halvex Institute?", "answer": "Dunmere"},
    {"question": "Where was Orlan Vesk born?", "answer": ["Tarsby"], "tier": 3},
    {"id": "m", "question": "Who is the mayor of Tarsby?", "answer": "Ida Brenn"},
]
HELD_OUT = [{"question": "Who founded the Halvex Institute?", "answer": "Orlan Vesk", "level": 1}]
CHAT = [
    {"messages": [{"role": "user", "content": "Where is the Halvex Institute?"},
                  {"role": "assistant", "content": "<search>Halvex Institute</search>"}]},
    {"messages": [{"role": "user", "content": "Who is the mayor of Tarsby?"},
                  {"role": "assistant", "content": "<answer>Ida Brenn</answer>"}]},
]  # fmt: skip
FAST = [
    "pipeline.loop.steps=2",
    "pipeline.eval.policies=[rl]",
    "pipeline.tasks.eval=2",
    "pipeline.eval.k=1",
]


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(run_dir: Path, *sets: str) -> int:
    args = ["run", "--preset", "quick", "--no-progress", "--set", f"logging.run_dir={run_dir}"]
    return main([*args, *(x for kv in [*FAST, *sets] for x in ("--set", kv))])


def test_run_on_a_plain_qa_file_a_user_index_and_a_user_warm_start_file(tmp_path):
    tasks = _jsonl(tmp_path / "my.jsonl", TASKS)
    index = tmp_path / "docs.sqlite"
    index_collection(_jsonl(tmp_path / "docs.jsonl", DOCS), index)
    chat = _jsonl(tmp_path / "chat.jsonl", CHAT)
    held_out = _jsonl(tmp_path / "held_out.jsonl", HELD_OUT)
    run = tmp_path / "run"
    rc = _run(
        run,
        f"pipeline.tasks.file={tasks}",
        f"env.search.index={index}",
        f"pipeline.warmstart_data=[{chat}]",
        f"pipeline.eval.file={held_out}",
    )
    assert rc == 0
    ev = json.loads((run / "eval" / "done.json").read_text())["rl"]
    assert ev["n"] == 1  # the user's held-out file, not the world's test split
    trajs = read_trajectories(run / "eval" / "rl" / "trajectories.jsonl")
    assert {t.meta["question"] for t in trajs} == {HELD_OUT[0]["question"]}
    probed = load_tasks(run / "probe" / "tasks.jsonl")  # strict re-read of the stage file
    assert [t.tier for t in probed] == [USER_TIER] * 3
    pools = [t for p in ("kept", "unsolved", "solved") for t in load_tasks(run / "filter" / f"{p}.jsonl")]  # fmt: skip
    assert sorted(t.question for t in pools) == sorted(r["question"] for r in TASKS)
    warm = json.loads((run / "warmstart" / "done.json").read_text())
    assert warm["source"].startswith("user data") and warm["traces_selected"] == 2
    assert not (run / "warmstart" / "teacher.jsonl").exists()
    assert json.loads((run / "rl" / "done.json").read_text())["steps"] == 2
    # the agent's instructions on the user's data never speak of the built-in world
    from provrl.models import load_tokenizer
    from provrl.trajlog import read_all

    tok = load_tokenizer()
    for t in read_all(run / "rl" / "trajectories.jsonl")[:4]:
        prompt = tok.decode(t.token_id[: t.segments[0].end])
        assert "fictional" not in prompt and "Look the answer up in the documents" in prompt


def test_a_user_index_without_warm_start_data_is_refused_before_any_work(tmp_path, capsys):
    index = tmp_path / "docs.sqlite"
    index_collection(_jsonl(tmp_path / "docs.jsonl", DOCS), index)
    run = tmp_path / "run"
    assert _run(run, f"env.search.index={index}") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "pipeline.warmstart_data" in err and f"env.search.index={index}" in err
    assert not (run / "warmstart").exists() and not (run / "world").exists()
    assert _run(tmp_path / "run2", f"pipeline.warmstart_data=[{tmp_path / 'nope.jsonl'}]") == 2
    assert "nope.jsonl: no such file" in capsys.readouterr().err


def test_an_eval_key_of_provrl_eval_is_refused_by_provrl_run_naming_the_one_it_reads(tmp_path, capsys):  # fmt: skip
    """env.eval is the `provrl eval` command's section: `provrl run` would ignore it, so it
    says so in one line, before any work, and names the pipeline key its eval stage reads."""
    run = tmp_path / "run"
    assert _run(run, "env.eval.k=8") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "env.eval.k" in err and "pipeline.eval.k" in err
    assert not (run / "world").exists() and not (run / "warmstart").exists()
