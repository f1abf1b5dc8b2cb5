"""Your own QA tasks, your own documents, a Search-R1-style retriever — end to end.

    python examples/own_tasks.py                       # the tiny random model (seconds)
    python examples/own_tasks.py --policy runs/d1/warmstart/ckpt

1. writes a few plain QA records ({question, answer | [answers], id?}) and documents
   ({id, title, text}) — stand-ins for your files;
2. indexes the documents (what `provrl index docs.jsonl` does: SQLite FTS5 BM25);
3. serves the index on 127.0.0.1 with the Search-R1 / FlashRAG /retrieve protocol (what
   `provrl serve-search --index docs.sqlite` does) — any such server works in its place;
4. evaluates the policy on the tasks against that URL (what `provrl eval --tasks plain.jsonl
   --search-url http://127.0.0.1:PORT/retrieve` does) and prints the summary.

docs/data.md explains each format and flag.
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import threading
import time
from pathlib import Path

DOCS = [
    {"id": "d1", "title": "Halvex Institute",
     "text": "The Halvex Institute is a research centre in Dunmere. It was founded in 1911."},
    {"id": "d2", "title": "Orlan Vesk", "text": "Orlan Vesk, a chemist, founded the Halvex Institute."},
    {"id": "d3", "title": "Tarsby", "text": "Tarsby is a port town. Its mayor is Ida Brenn."},
]  # fmt: skip
TASKS = [
    {"id": "q1", "question": "In which city is the Halvex Institute?", "answer": "Dunmere"},
    {"id": "q2", "question": "Who founded the Halvex Institute?", "answer": ["Orlan Vesk", "Vesk"]},
    {"id": "q3", "question": "Who is the mayor of Tarsby?", "answer": "Ida Brenn"},
]


def main() -> None:
    import uvicorn

    from provrl.env.collection import index_collection
    from provrl.env.config import AgentConfig, EnvConfig, EvalConfig, SearchConfig
    from provrl.env.http_search import make_app
    from provrl.env.sqlite_index import SqliteSearch
    from provrl.rollout.evaluate import evaluate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="tiny", help="model name or checkpoint directory")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: a temp dir)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="provrl-own-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    (out / "plain.jsonl").write_text("".join(json.dumps(t) + "\n" for t in TASKS))

    index = index_collection(out / "docs.jsonl")  # → out/docs.sqlite
    print(f"indexed {index['docs']} documents, {index['passages']} passages: {index['index']}")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = make_app(SqliteSearch(str(index["index"])), 3)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}/retrieve"
    try:
        cfg = EnvConfig(
            search=SearchConfig(backend="http", url=url, k=2),
            agent=AgentConfig(max_turns=4, max_new_tokens=48),
            eval=EvalConfig(k=2, concurrency=4),
        )
        summary = evaluate(
            args.policy, None, cfg, out / "eval", tasks_file=out / "plain.jsonl", progress=False
        )
    finally:
        server.should_exit = True
        thread.join(timeout=5)
    keys = ("policy", "n", "k", "accuracy", "pass@2", "mean_tool_calls", "mean_tokens")
    print(json.dumps({k: summary[k] for k in keys}, indent=2))
    print(f"trajectories: {summary['trajectories']}\nplot: {summary['plot']}")


if __name__ == "__main__":
    main()
