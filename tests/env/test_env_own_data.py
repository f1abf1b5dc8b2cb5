"""Bring your own data: plain QA task files, a user's document collection (`provrl index`),
and `provrl eval --tasks … --search-url …/retrieve` against Search-R1-style servers."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from typer.testing import CliRunner

from provrl.env.collection import CollectionError, index_collection, iter_collection, passages_of
from provrl.env.config import EnvConfig, SearchConfig
from provrl.env.tasks import PLAIN_KIND, TaskFileError, read_task_file

DOCS = [
    {"id": "d1", "title": "Halvex Institute", "text": "The Halvex Institute is a research "
     "centre in Dunmere.\n\nIt was founded in 1911 by Orlan Vesk."},
    {"id": "d2", "contents": '"Orlan Vesk"\nOrlan Vesk was a chemist born in Tarsby.'},
    {"title": "Tarsby", "paragraphs": ["Tarsby is a port town.", "Its mayor is Ida Brenn."]},
]  # fmt: skip
TASKS = [
    {"id": "q1", "question": "Where is the Halvex Institute?", "answer": "Dunmere"},
    {"question": "Who founded the Halvex Institute?", "answer": ["Orlan Vesk", "Vesk"]},
    {"id": 7, "question": "Who is the mayor of Tarsby?", "golden_answers": ["Ida Brenn"]},
]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def own(tmp_path):
    docs = write_jsonl(tmp_path / "docs.jsonl", DOCS)
    tasks = write_jsonl(tmp_path / "plain.jsonl", TASKS)
    return tmp_path, docs, tasks


def test_plain_records_become_tasks(own):
    _, _, tasks = own
    ts = read_task_file(tasks, "test")
    assert [t.task_id for t in ts] == ["q1", "q000002", "7"]
    assert ts[1].answers == ["Orlan Vesk", "Vesk"] and ts[2].answers == ["Ida Brenn"]
    assert {(t.kind, t.tier, t.split, t.min_searches) for t in ts} == {(PLAIN_KIND, 0, "test", 0)}


def test_plain_tasks_round_trip_through_a_stage_file(own, tmp_path):
    """A probe's tasks.jsonl and the filter pools are re-read strictly: tier 0 (a user task)
    and an empty oracle plan are valid there."""
    from provrl.env.tasks import load_tasks, save_tasks

    _, _, tasks = own
    ts = read_task_file(tasks, "train")
    save_tasks(ts, tmp_path / "stage.jsonl")
    assert load_tasks(tmp_path / "stage.jsonl", split="train") == ts
    read_back = read_task_file(tmp_path / "stage.jsonl")  # a pool given back as --tasks
    assert read_back == ts


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ('{"answer": "x"}', r"plain.jsonl:2: field 'question' must be a non-empty string"),
        ('{"question": "q?"}', r"plain.jsonl:2: field 'answer' is missing"),
        ('{"question": "q?", "answer": []}', r"plain.jsonl:2: field 'answer' must be"),
        ('{"question": "q?", "answer": 3}', r"plain.jsonl:2: field 'answer' must be"),
        ('{"id": "a", "question": "q?", "answer": "x"}', r"plain.jsonl:2: field 'id' 'a' repeats"),
        ("{oops", r"plain.jsonl:2: invalid JSON"),
    ],
)
def test_bad_plain_records_name_file_line_and_field(tmp_path, line, match):
    p = tmp_path / "plain.jsonl"
    p.write_text('{"id": "a", "question": "q?", "answer": "x"}\n' + line + "\n")
    with pytest.raises(TaskFileError, match=match):
        read_task_file(p)


def test_provrl_task_files_are_still_read_with_their_schema(small_world):
    ts = read_task_file(small_world / "tasks" / "dev.jsonl")
    assert ts and all(t.oracle and t.tier in (1, 2, 3, 4) for t in ts)


def test_collection_shapes_and_passages(own):
    _, docs, _ = own
    got = list(iter_collection(docs))
    assert [(d.doc_id, d.title, len(d.paragraphs)) for d in got] == [
        ("d1", "Halvex Institute", 2),
        ("d2", "Orlan Vesk", 1),
        ("doc3", "Tarsby", 2),
    ]
    assert passages_of("a b c d e", 2) == ["a b", "c d", "e"]
    bad = write_jsonl(docs.parent / "bad.jsonl", [DOCS[0], {"id": "x", "body": "?"}])
    with pytest.raises(CollectionError, match=r"bad.jsonl:2: no document text"):
        index_collection(bad)
    assert not list(docs.parent.glob("bad.sqlite*"))  # nothing half-built left behind


def test_provrl_index_builds_a_bm25_index_of_the_collection(own):
    from provrl.env.build import search_backend

    _, docs, _ = own
    summary = index_collection(docs)
    assert summary["docs"] == 3 and summary["passages"] == 5
    cfg = EnvConfig(search=SearchConfig(index=summary["index"]))
    backend = search_backend(None, cfg)
    hits = backend.search("mayor of Tarsby", 2)
    assert hits[0].doc_id == "doc3" and "Ida Brenn" in hits[0].snippet
    assert backend.fingerprint().startswith(f"sqlite:{str(summary['sha256'])[:16]}")
    assert "Dunmere" in (backend.open("d1") or "")


# ----------------------------------------------------------------------------- Search-R1
def search_r1_app(docs: list[dict]) -> object:
    """A server shaped like Search-R1's ``retrieval_server.py``: only ``POST /retrieve``,
    documents as ``{"id", "contents"}``, ranked here by shared words (not provrl code)."""
    from fastapi import FastAPI

    app = FastAPI()
    corpus = [{"id": str(i), "contents": f'"{d["title"]}"\n{d["text"]}'}
              for i, d in enumerate(docs)]  # fmt: skip

    @app.post("/retrieve")
    def retrieve(req: dict) -> dict:
        out = []
        for q in req["queries"]:
            words = set(q.lower().split())
            ranked = sorted(corpus, key=lambda d: -len(words & set(d["contents"].lower().split())))
            top = ranked[: req.get("topk", 3)]
            if req.get("return_scores"):
                out.append([{"document": d, "score": 1.0 / (j + 1)} for j, d in enumerate(top)])
            else:
                out.append(top)
        return {"result": out}

    return app


def serve_in_thread(app: object):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    for _ in range(250):
        if srv.started:
            break
        time.sleep(0.02)
    return srv, th, f"http://127.0.0.1:{port}/retrieve"


@pytest.fixture
def search_r1():
    docs = [{"title": "Tarsby", "text": "Tarsby is a port town whose mayor is Ida Brenn."},
            {"title": "Dunmere", "text": "Dunmere hosts the Halvex Institute."}]  # fmt: skip
    srv, th, url = serve_in_thread(search_r1_app(docs))
    yield url
    srv.should_exit = True
    th.join(timeout=5)


def test_the_agents_search_tool_talks_to_a_search_r1_server(search_r1):
    from provrl.env.build import search_backend
    from provrl.env.protocol import Call
    from provrl.rollout.agent import run_tool

    cfg = EnvConfig(search=SearchConfig(backend="http", url=search_r1, k=1))
    backend = search_backend(None, cfg)  # the URL may end in /retrieve
    env = type("Env", (), {"backend": backend, "search": cfg.search})()
    obs, call = run_tool(env, Call("search", "mayor of Tarsby"))  # type: ignore[arg-type]
    assert call.ok and "Ida Brenn" in obs and "[1] Tarsby (0)" in obs
    obs, call = run_tool(env, Call("open", "0"))  # type: ignore[arg-type]
    assert "No document" in obs  # Search-R1 has no /documents: a clean miss, not a crash


def test_cli_eval_own_tasks_against_a_search_r1_server(own, search_r1):
    from provrl.cli import app

    tmp, _, tasks = own
    args = ["eval", "--policy", "tiny", "--tasks", str(tasks), "--search-url", search_r1,
            "--max-new-tokens", "8", "--max-turns", "2", "--run-dir", str(tmp / "ev"), "--json"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert summary["n"] == 3 and summary["tasks_file"] == str(tasks)
    assert summary["search"] == {"backend": "http-retrieve", "url": search_r1, "index": None}
    assert summary["world"] is None  # no world was built or read
    assert summary["tool_errors"] == 0 and summary["tool_error_rate"] == 0.0  # counted, none
    assert summary["split"] is None and list(summary["per_tier"]) == ["0"]  # user tasks only
    assert summary["per_tier"]["0"]["tasks"] == 3
    assert summary["plot"] == str(tmp / "ev" / "eval.png")
    assert (tmp / "ev" / "eval.png").stat().st_size > 5000
    from provrl.trajlog import read_all

    trajs = read_all(tmp / "ev" / "trajectories.jsonl")
    assert sorted(t.task_id for t in trajs) == ["7", "q000002", "q1"]
    assert trajs[0].tools.config["backend"] == "http-retrieve"
    assert trajs[0].policy.config["tokenizer"]["sha256"].startswith("sha256:")


def test_cli_index_then_eval_with_it(own):
    from provrl.cli import app

    tmp, docs, tasks = own
    r = CliRunner().invoke(app, ["index", str(docs), "--out", str(tmp / "my.sqlite"), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["passages"] == 5
    args = ["eval", "--policy", "tiny", "--tasks", str(tasks), "--index", str(tmp / "my.sqlite"),
            "--max-new-tokens", "4", "--max-turns", "1", "--run-dir", str(tmp / "ev2"), "--json"]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["search"]["index"] == str(
        tmp / "my.sqlite"
    )


def test_oracle_and_shots_need_the_world(own, small_world, tmp_path):
    from provrl.rollout.evaluate import evaluate

    _, _, tasks = own
    with pytest.raises(ValueError, match="oracle needs provrl world tasks"):
        evaluate("oracle", small_world, EnvConfig(), tmp_path / "a", tasks_file=tasks)
    cfg = EnvConfig.model_validate({"agent": {"shots": 1}, "search": {"backend": "http"}})
    with pytest.raises(ValueError, match="shots=1: worked examples"):
        evaluate("tiny", small_world, cfg, tmp_path / "b", tasks_file=tasks)
