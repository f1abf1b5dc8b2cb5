"""A user's own document collection as a search index (``provrl index docs.jsonl``).

One document per line, in any of the shapes retrieval corpora ship in::

    {"id": "d1", "title": "Halvex Institute", "text": "The Halvex Institute is ..."}
    {"id": "0", "contents": "\\"Halvex Institute\\"\\nThe Halvex Institute is ..."}   # FlashRAG / Search-R1
    {"id": "d2", "title": "...", "paragraphs": ["...", "..."]}

``id`` defaults to ``doc<line>``, ``title`` to the first line of ``contents`` (FlashRAG's
``"<title>"\\n<text>`` convention) or "". The text is cut into passages — at blank lines,
then into pieces of at most ``passage_words`` words — and indexed by the same SQLite FTS5
BM25 index as the built-in world (:func:`provrl.env.sqlite_index.build_index`: one row per
passage, the title with the first passage). The index records the sha256 of the file and
the passage settings, so the tool identity of every trajectory names the collection.

Serve it to anything that speaks Search-R1's ``/retrieve`` with ``provrl serve-search
--index FILE``, or use it directly with ``provrl eval --index FILE``.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

from provrl.env.jsonl import iter_records
from provrl.env.sqlite_index import build_index
from provrl.env.world import Document

_BLANK = re.compile(r"\n\s*\n")


class CollectionError(ValueError):
    """A document file is malformed; the message names the file, the line and the field."""


def passages_of(text: str, passage_words: int) -> list[str]:
    """``text`` cut at blank lines, then into pieces of at most ``passage_words`` words
    (whitespace inside a piece is collapsed). Empty pieces are dropped."""
    out: list[str] = []
    for block in _BLANK.split(text):
        words = block.split()
        out.extend(
            " ".join(words[i : i + passage_words]) for i in range(0, len(words), passage_words)
        )
    return out


def document_from_json(d: object, where: str, lineno: int, passage_words: int) -> Document:
    """One decoded line → a :class:`Document`; errors name ``where`` and the field."""
    if not isinstance(d, dict):
        raise CollectionError(f"{where}: expected a JSON object, got {type(d).__name__}")
    doc_id = d.get("id", d.get("doc_id", f"doc{lineno}"))
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool) or not str(doc_id).strip():
        raise CollectionError(f"{where}: field 'id' must be a non-empty string or an integer")
    title = d.get("title")
    if "paragraphs" in d:
        paras = d["paragraphs"]
        if not isinstance(paras, list) or not all(isinstance(p, str) for p in paras):
            raise CollectionError(f"{where}: field 'paragraphs' must be a list of strings")
        text = "\n\n".join(paras)
    elif "text" in d:
        text = d["text"]
    elif "contents" in d:
        text = d["contents"]
        if title is None and isinstance(text, str):
            first, sep, rest = text.partition("\n")
            if sep:
                title, text = first.strip().strip('"'), rest
    else:
        raise CollectionError(
            f"{where}: no document text: expected field 'text', 'contents' or 'paragraphs'"
        )
    if not isinstance(text, str):
        raise CollectionError(f"{where}: the document text must be a string")
    if title is not None and not isinstance(title, str):
        raise CollectionError(f"{where}: field 'title' must be a string")
    passages = passages_of(text, passage_words)
    if not passages:
        raise CollectionError(f"{where}: document {doc_id!r} has no text")
    if len(passages) >= 4096:
        raise CollectionError(
            f"{where}: document {doc_id!r} has {len(passages)} passages (at most 4095; "
            f"split it or raise passage_words)"
        )
    return Document(str(doc_id).strip(), title or "", "document", passages)


def iter_collection(path: str | os.PathLike[str], passage_words: int = 128) -> Iterator[Document]:
    """Stream the documents of a JSONL collection (blank lines skipped); repeated ids and
    malformed lines raise :class:`CollectionError` naming file and line."""
    p = Path(path)
    seen: dict[str, int] = {}
    for lineno, d in iter_records(p, CollectionError, "document file"):
        where = f"{p}:{lineno}"
        doc = document_from_json(d, where, lineno, passage_words)
        if doc.doc_id in seen:
            raise CollectionError(
                f"{where}: field 'id' {doc.doc_id!r} repeats line {seen[doc.doc_id]}"
            )
        seen[doc.doc_id] = lineno
        yield doc


def collection_sha256(path: str | os.PathLike[str], passage_words: int) -> str:
    """sha256 of the file's bytes and the passage setting: the collection's identity."""
    h = hashlib.sha256(f"collection|passage_words={passage_words}|".encode())
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def index_collection(
    docs: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    passage_words: int = 128,
    progress: bool = False,
) -> dict[str, object]:
    """Build the FTS5 BM25 index of ``docs`` at ``out`` (default ``docs`` with suffix
    ``.sqlite``), atomically. Returns a summary: path, documents, passages, sha256."""
    src = Path(docs)
    if passage_words < 8:
        raise CollectionError(f"passage_words={passage_words}: must be at least 8")
    target = Path(out) if out is not None else src.with_suffix(".sqlite")
    sha = collection_sha256(src, passage_words) if src.is_file() else ""
    counts = {"docs": 0, "passages": 0}

    def counted() -> Iterator[Document]:
        for d in iter_collection(src, passage_words):
            counts["docs"] += 1
            counts["passages"] += len(d.paragraphs)
            yield d

    try:
        build_index(counted(), target, corpus_sha256=sha, progress=progress)
    except CollectionError:
        for tmp in target.parent.glob(f"{target.name}.tmp-{os.getpid()}-*"):
            tmp.unlink(missing_ok=True)  # build_index's temporary file: nothing half-built stays
        raise
    if counts["docs"] == 0:
        target.unlink(missing_ok=True)
        raise CollectionError(f"{src}: no documents (the file is empty)")
    return {"index": str(target), "source": str(src), "sha256": sha, **counts}
