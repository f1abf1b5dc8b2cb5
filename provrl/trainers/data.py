"""A trainer's model, datasets and tools as ``provrl run`` reads them: a model name, a task
file and a search configuration.

    train_dataset   JSONL path (read as is) | parquet path | list of dicts | datasets.Dataset
                    → a plain-QA task file (``pipeline.tasks.file``; provrl.env.tasks)
    tools           None (the built-in world's index) | http(s)://…/retrieve | an index file
                    (.sqlite, from `provrl index`) | a documents JSONL (indexed here)
                    → ``env.search.*`` overrides

A row needs ``question`` (or TRL's ``prompt``: a string, or chat messages whose last user
turn is the question) and ``answer`` (or ``answers`` / ``golden_answers``); every column is
kept for the reward functions (:attr:`provrl.env.tasks.Task.columns`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from provrl.config import ConfigError
from provrl.env.tasks import TaskFileError, read_task_file

Dataset = str | os.PathLike[str] | Iterable[Mapping[str, Any]]
"""What ``train_dataset`` may be (a ``datasets.Dataset`` iterates over its rows as dicts)."""


def task_file(data: Dataset, out: Path, *, name: str = "train_dataset") -> Path:
    """``data`` as a task file provrl reads (:func:`~provrl.env.tasks.read_task_file`,
    checked here): a JSONL path as it is, anything else written to ``out`` as plain QA
    records. Errors are one line naming ``name`` (the argument) and the file, row or field."""
    if isinstance(data, str | os.PathLike):
        path = Path(data)
        if not path.is_file():
            raise ConfigError(f"{name}: {path}: no such file")
        if path.suffix == ".parquet":
            rows = _parquet_rows(path, name)
        else:
            _check(path, name)  # a bad line: one line now, not mid-run
            return path
    elif isinstance(data, Mapping):
        raise ConfigError(
            f"{name}: a mapping (a DatasetDict?); give one split, e.g. dataset['train']"
        )
    else:
        rows = [dict(r) for r in data]
    if not rows:
        raise ConfigError(f"{name}: no rows")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:
        for i, row in enumerate(rows):
            f.write(
                orjson.dumps(_qa_row(row, f"{name} row {i}"), option=orjson.OPT_SERIALIZE_NUMPY)
                + b"\n"
            )
    tmp.replace(out)
    _check(out, name)
    return out


def _check(path: Path, name: str) -> None:
    """Read ``path`` as the run will; a bad record is one line (file, line, field)."""
    try:
        read_task_file(path, split="train")
    except TaskFileError as e:
        raise ConfigError(f"{name}: {e}") from None


def _parquet_rows(path: Path, name: str) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{name}: {path}: reading parquet needs pyarrow") from None
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def _qa_row(row: dict[str, Any], where: str) -> dict[str, Any]:
    """TRL's ``prompt`` column as provrl's ``question`` (chat messages: the last user turn),
    unless the row has a question already; every column kept."""
    if "question" in row or "prompt" not in row:
        return row
    prompt = row["prompt"]
    if isinstance(prompt, list):
        users = [
            m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"
        ]
        if not users:
            raise ConfigError(f"{where}: 'prompt' has no user message")
        prompt = users[-1]
    return {**row, "question": prompt}


def search_overrides(tools: str | os.PathLike[str] | None, out: Path) -> list[str]:
    """``env.search`` overrides for ``tools``: a URL → the HTTP ``/retrieve`` client; an
    index file → that index; a documents JSONL ({id, title, text} per line) → indexed at
    ``out`` (SQLite FTS5 BM25, what `provrl index` does) unless it is newer than them; None → nothing (the
    built-in world's index)."""
    if tools is None:
        return []
    if not isinstance(tools, str | os.PathLike):
        raise ConfigError(
            f"tools: {type(tools).__name__}; give a /retrieve URL, an index file (provrl "
            "index) or a documents JSONL"
        )
    text = os.fspath(tools)
    if text.startswith(("http://", "https://")):
        return ["env.search.backend=http", f"env.search.url={text}"]
    path = Path(text)
    if not path.is_file():
        raise ConfigError(f"tools: {path}: no such file (a URL, an index file or documents)")
    if path.suffix in (".jsonl", ".json"):
        from provrl.env.collection import index_collection

        if not out.is_file() or out.stat().st_mtime < path.stat().st_mtime:
            index_collection(path, out)
        path = out
    return ["env.search.backend=sqlite", f"env.search.index={path}"]


def model_name(model: Any, processing_class: Any, where: Path) -> str:
    """``model`` as ``model.name``: a name or directory as is; a loaded model saved to
    ``where`` (with its tokenizer) first."""
    if isinstance(model, str | os.PathLike):
        return os.fspath(model)
    from provrl.models import LoadedModel, save_checkpoint

    if isinstance(model, LoadedModel):
        model, processing_class = model.model, model.tokenizer
    if processing_class is None:
        raise ConfigError(
            "GRPOTrainer: a loaded model needs its tokenizer (processing_class=...), or pass "
            "a name or a checkpoint directory"
        )
    return str(save_checkpoint(model, processing_class, where, source="GRPOTrainer"))
