"""The search interface every backend provides, and the query tokenizer they share.

    search(query, k) -> [Hit(doc_id, title, snippet, score, passage)]   (best first)
    open(doc_id)     -> the whole document as text, or None if unknown

Backends: :mod:`provrl.env.sqlite_index` (embedded SQLite FTS5 BM25, the default),
:mod:`provrl.env.http_search` (a client for ``/retrieve`` services) and
:class:`provrl.env.latency.WithLatency` (adds simulated network latency to any backend).

A query is untrusted input (a model wrote it, or an HTTP client sent it), so it is bounded
before any index work: at most :data:`MAX_QUERY_CHARS` characters and
:data:`MAX_QUERY_TERMS` distinct terms (BM25 work grows with the terms; 4,096 common terms
took 2 s, 128k terms longer). A query out of bounds raises :class:`QueryError`, which the
agent shows the model as a failed call and the HTTP service answers with 422.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic import Field

from provrl.config import Section

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
MAX_QUERY_CHARS = 4096
"""Longest query a backend accepts, in characters."""
MAX_QUERY_TERMS = 64
"""Most distinct (non-stopword) terms in one query."""


def query_terms(query: str) -> list[str]:
    """Lower-cased word tokens of ``query`` without stopwords, duplicates removed in order."""
    seen: dict[str, None] = {}
    for t in _WORD.findall(query.lower()):
        if t not in STOPWORDS:
            seen.setdefault(t, None)
    return list(seen)


def bounded_query_terms(
    query: str, max_chars: int = MAX_QUERY_CHARS, max_terms: int = MAX_QUERY_TERMS
) -> list[str]:
    """:func:`query_terms` of a query within bounds, else :class:`QueryError` saying which
    bound it broke (the length is checked before any tokenizing)."""
    if len(query) > max_chars:
        raise QueryError(f"query has {len(query)} characters; at most {max_chars} are accepted")
    terms = query_terms(query)
    if len(terms) > max_terms:
        raise QueryError(f"query has {len(terms)} distinct terms; at most {max_terms} are accepted")
    return terms


class RetrieveLimits(Section):
    """What one ``/retrieve`` request may ask of the server (:mod:`provrl.env.http_search`;
    each field is a ``provrl serve-search`` option)."""

    max_body_bytes: int = Field(
        4 << 20, ge=1024, description="Largest request body (bytes); larger ones get 413."
    )
    max_queries: int = Field(4096, ge=1, description="Most queries in one request; more get 422.")
    max_topk: int = Field(
        1000,
        ge=1,
        description="Largest topk a request may ask for (Search-R1 configs may ask for more "
        "than 100); larger ones get 422.",
    )
    max_results: int = Field(
        50_000, ge=1, description="Most results one request may ask for (queries × topk)."
    )
    max_query_chars: int = Field(
        MAX_QUERY_CHARS, ge=1, description="Longest query (characters); longer ones get 422."
    )
    time_budget_s: float = Field(
        30.0,
        gt=0,
        description="Wall-clock budget of one request; past it the request stops (503). "
        "Leave it unless clients send very large batches on purpose.",
    )
    body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest a request body may take to arrive (s); a slower one gets 408 "
        "and its connection is closed, so a body that never finishes holds nothing.",
    )


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


class QueryError(SearchError):
    """The query itself is out of bounds: too long, too many terms, or over its time
    budget. The caller's input is at fault, not the backend (HTTP 422)."""


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
