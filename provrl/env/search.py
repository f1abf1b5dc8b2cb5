"""The search interface every backend provides, and the query tokenizer they share.

    search(query, k) -> [Hit(doc_id, title, snippet, score, passage)]   (best first)
    open(doc_id)     -> the whole document as text, or None if unknown

Backends: :mod:`provrl.env.sqlite_index` (embedded SQLite FTS5 BM25, the default),
:mod:`provrl.env.http_search` (a client for ``/retrieve`` services) and
:class:`provrl.env.latency.WithLatency` (adds simulated network latency to any backend).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

# Function words dropped from queries (documents keep them). Matches the spirit of the
# Lucene / bm25s English stop lists; small on purpose.
STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "for",
        "from",
        "has",
        "have",
        "he",
        "her",
        "his",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "she",
        "that",
        "the",
        "their",
        "they",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "how",
        "did",
        "does",
        "do",
    ]
)
_WORD = re.compile(r"\w+", re.UNICODE)


def query_terms(query: str) -> list[str]:
    """Lower-cased word tokens of ``query`` without stopwords, duplicates removed in order."""
    seen: dict[str, None] = {}
    for t in _WORD.findall(query.lower()):
        if t not in STOPWORDS:
            seen.setdefault(t, None)
    return list(seen)


@dataclass(frozen=True)
class Hit:
    """One search result: a passage of a document."""

    doc_id: str
    title: str
    snippet: str
    score: float
    passage: int = 0
    """Paragraph index of the passage inside its document."""

    @property
    def passage_id(self) -> str:
        return f"{self.doc_id}#{self.passage}"


class SearchError(RuntimeError):
    """The backend could not answer (service down, bad response, closed index)."""


@runtime_checkable
class SearchBackend(Protocol):
    """What the agent loop, the oracle and the HTTP service need from a backend."""

    name: str

    def search(self, query: str, k: int) -> list[Hit]: ...

    def open(self, doc_id: str) -> str | None: ...

    def fingerprint(self) -> str:
        """Content hash of the index and the settings that change results."""
        ...


def truncate_words(text: str, n: int) -> str:
    """``text`` cut to ``n`` words (an ellipsis marks the cut)."""
    words = text.split()
    return text if len(words) <= n else " ".join(words[:n]) + " …"
