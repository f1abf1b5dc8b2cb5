"""A dead retriever is one line before any work: `provrl run`, `eval` and `probe` check the
search backend (HTTP /health, or one /retrieve for a server without it) first, so a closed
port never becomes a run of "search failed" observations."""

from __future__ import annotations

import socket

import pytest

from provrl.cli.entry import main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the block ends


@pytest.mark.parametrize("command", ["run", "eval", "probe"])
def test_a_dead_retriever_is_one_line_before_any_work(tmp_path, capsys, command):
    url = f"http://127.0.0.1:{_closed_port()}"
    dead = ["--set", "env.search.backend=http", "--set", f"env.search.url={url}",
            "--set", "env.search.retries=0"]  # fmt: skip
    out = tmp_path / "out"
    args = {
        "run": ["run", "--preset", "quick", "--no-progress", "--set", f"logging.run_dir={out}"],
        "eval": ["eval", "--policy", "tiny", "--run-dir", str(out), "--json"],
        "probe": ["probe", "--out", str(out), "--preset", "quick", "--policy", "tiny"],
    }[command]
    assert main([*args, *dead]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"search backend {url} does not answer" in err and "env.search.url" in err
    assert not out.exists() or not any(p.is_dir() for p in out.iterdir())  # no stage began
