"""Embedded search: SQLite FTS5 with BM25 ranking (Python stdlib, zero setup).

One FTS5 row per passage (paragraph) with two columns, ``title`` and ``body``; the title
is indexed with a page's opening paragraph only (its lead), so a name query ranks the
opening first instead of the page's shortest paragraph. A query is
split into word terms (stopwords dropped) and matched as ``t1 OR t2 OR ...``; passages are
ranked by FTS5's BM25 (k1 = 1.2, b = 0.75) over column-weighted term frequencies:

    score(q, p) = Σ_{t ∈ q} IDF(t) · g(t, p)·(k1 + 1) / (g(t, p) + k1·(1 − b + b·|p| / avgdl))
    g(t, p)     = w_title · f(t, p.title) + w_body · f(t, p.body)
    IDF(t)      = max(log((N − n(t) + 0.5) / (n(t) + 0.5)), 1e-6)

(N passages, n(t) passages containing t, |p| tokens in title + body, avgdl their mean.)

**Exact top-k with common terms, fast.** FTS5 scores *every* passage that matches any
term, so a query with a common word ("people born in X") scores most of the index. The
index stores the few *common* terms (n(t) > ``COMMON_DF``) with their n(t). A query with
both kinds is answered in two steps, still exactly:

1. candidates C = the top-|C| passages by FTS5 BM25 over the rare terms R only;
2. add the common terms' part of the score in Python (same formula, same N, avgdl, |p|
   read from FTS5's own tables) and sort.

Since 0 ≤ part_common(p) < B = (k1 + 1)·Σ_{t common} IDF(t) (the tf factor is below
k1 + 1), a passage outside C scores below max(B, r_min + B), where r_min is the lowest
rare-term score in C (only if C was cut at |C|; otherwise every passage matching a rare
term is in C). If the k-th best score in C is at least that bound, the top-k is exact;
otherwise |C| grows ×8 and, past 4096, the plain FTS5 query is run. This is the
safe-pruning idea of WAND / max-score (Broder et al. 2003; Turtle & Flood 1995).

The index is built once per corpus and cached on disk next to it as
``index-<key>.sqlite`` (the key hashes the corpus sha256, tokenizer and schema); it is
written to a temporary file and renamed, so a crash never leaves a half-built index under
the final name. Connections are per thread and read-only; a thread's connection is closed
once the thread has exited (when the next thread opens one), so a server whose worker pool
recycles threads does not accumulate connections and their page caches.

**Bounded work per query.** A query is cut off before index work if it is longer than
``max_query_chars`` or has more than ``max_terms`` distinct terms
(:func:`provrl.env.search.bounded_query_terms`), and SQLite aborts any statement still
running after ``time_budget_s`` of *CPU time of the querying thread* (a progress handler
checks the per-thread deadline every few thousand VM steps) — a bound on work, not on wall
time, so a loaded machine (32 agent loops, an engine and a trainer on two cores) does not
turn ordinary queries into errors and make results depend on load; each raises :class:`~provrl.env.search.QueryError`, so no query can
pin a core after its client is gone.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import sqlite3
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import orjson

from provrl.env.search import (
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    Hit,
    QueryError,
    SearchError,
    bounded_query_terms,
    truncate_words,
)
from provrl.env.world import Document, iter_corpus, read_world_info

SCHEMA_VERSION = 3
K1, B = 1.2, 0.75  # FTS5 bm25() constants
COMMON_DF = 1000
"""Terms in more passages than this are *common*: scored in Python on candidates."""
COMMON_TOP = 1024
"""Length of the cached BM25 ranking over a query's common terms alone."""
QUERY_TIME_BUDGET_S = 2.0
"""Default CPU-time budget of one query's SQL, in seconds of the querying thread's CPU
(typical queries take milliseconds)."""
_PROGRESS_STEPS = 4000
"""SQLite VM instructions between two deadline checks (~0.1 ms)."""
_TOKEN = re.compile(r"[^\W_]+")
TOKENIZER = "unicode61 remove_diacritics 2"


def index_key(corpus_sha256: str) -> str:
    h = hashlib.sha256(f"{corpus_sha256}|{TOKENIZER}|v{SCHEMA_VERSION}".encode())
    return h.hexdigest()[:16]


def build_index(
    docs: Iterable[Document],
    path: str | os.PathLike[str],
    *,
    corpus_sha256: str = "",
    progress: bool = False,
    total: int | None = None,
) -> Path:
    """Write an FTS5 index of ``docs`` to ``path`` (atomically). Returns the path."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    try:
        con.executescript(
            f"""
            PRAGMA journal_mode = OFF;
            PRAGMA synchronous = OFF;
            CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE docs(id INTEGER PRIMARY KEY, doc_id TEXT UNIQUE, title TEXT,
                              kind TEXT, paragraphs BLOB);
            CREATE VIRTUAL TABLE passages USING fts5(title, body, tokenize = '{TOKENIZER}');
            """
        )
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total, desc="index", unit="doc", leave=False)
        doc_rows: list[tuple[int, str, str, str, bytes]] = []
        pas_rows: list[tuple[int, str, str]] = []
        n = 0

        def flush() -> None:
            con.executemany("INSERT INTO docs VALUES (?, ?, ?, ?, ?)", doc_rows)
            con.executemany("INSERT INTO passages(rowid, title, body) VALUES (?, ?, ?)", pas_rows)
            doc_rows.clear()
            pas_rows.clear()

        for d in docs:
            doc_rows.append((n, d.doc_id, d.title, d.kind, orjson.dumps(d.paragraphs)))
            for j, para in enumerate(d.paragraphs):
                # rowid encodes (document, paragraph): doc number * 4096 + paragraph; the
                # title is indexed with the opening paragraph only (the page's lead)
                pas_rows.append((n * 4096 + j, d.title if j == 0 else "", para))
            if len(d.paragraphs) >= 4096:
                raise ValueError(f"document {d.doc_id}: more than 4095 paragraphs")
            n += 1
            if len(pas_rows) >= 50_000:
                flush()
            if bar is not None:
                bar.update(1)
        flush()
        con.execute("INSERT INTO passages(passages) VALUES ('optimize')")
        con.executescript(
            f"""
            CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, passages, row);
            CREATE TABLE common_terms(term TEXT PRIMARY KEY, df INTEGER) WITHOUT ROWID;
            INSERT INTO common_terms SELECT term, doc FROM temp.vocab WHERE doc > {COMMON_DF};
            """
        )
        con.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [
                ("corpus_sha256", corpus_sha256),
                ("tokenizer", TOKENIZER),
                ("schema", str(SCHEMA_VERSION)),
                ("docs", str(n)),
            ],
        )
        con.commit()
        if bar is not None:
            bar.close()
    finally:
        con.close()
    tmp.replace(final)
    return final


def cached_index(world_dir: str | os.PathLike[str], *, progress: bool = False) -> Path:
    """The index of a saved world, built on first use and reused after."""
    info = read_world_info(world_dir)
    sha = info["corpus_sha256"]
    path = Path(world_dir) / f"index-{index_key(sha)}.sqlite"
    if not path.exists():
        build_index(
            iter_corpus(world_dir),
            path,
            corpus_sha256=sha,
            progress=progress,
            total=int(info["counts"]["docs"]),
        )
    return path


def _varints(blob: bytes) -> list[int]:
    """Decode SQLite/FTS5 varints (7 bits per byte, big-endian; the 9th byte has 8)."""
    out, i = [], 0
    while i < len(blob):
        v = 0
        for j in range(9):
            c = blob[i]
            i += 1
            if j == 8:
                v = (v << 8) | c
                break
            v = (v << 7) | (c & 0x7F)
            if not c & 0x80:
                break
        out.append(v)
    return out


class SqliteSearch:
    """BM25 search over an FTS5 index file (thread-safe: one connection per thread)."""

    name = "sqlite-fts5-bm25"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        title_weight: float = 2.0,
        body_weight: float = 1.0,
        snippet_words: int = 48,
        open_words: int = 160,
        max_query_chars: int = MAX_QUERY_CHARS,
        max_terms: int = MAX_QUERY_TERMS,
        time_budget_s: float = QUERY_TIME_BUDGET_S,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise SearchError(f"{self.path}: no such index")
        self.title_weight, self.body_weight = float(title_weight), float(body_weight)
        self.snippet_words, self.open_words = snippet_words, open_words
        self.max_query_chars, self.max_terms = max_query_chars, max_terms
        self.time_budget_s = float(time_budget_s)
        self._local = threading.local()
        self._all: dict[threading.Thread, sqlite3.Connection] = {}
        self._lock = threading.Lock()
        con = self._con()
        meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
        self.corpus_sha256 = meta.get("corpus_sha256", "")
        self.num_docs = int(meta.get("docs", "0"))
        if meta.get("schema") != str(SCHEMA_VERSION):
            raise SearchError(
                f"{self.path}: index schema {meta.get('schema')}, expected {SCHEMA_VERSION}"
            )
        avg = _varints(con.execute("SELECT block FROM passages_data WHERE id = 1").fetchone()[0])
        self.n_rows = avg[0]
        self.avgdl = sum(avg[1:]) / max(1, self.n_rows)
        self.common: dict[str, int] = dict(con.execute("SELECT term, df FROM common_terms"))
        self.fallbacks = 0
        """Queries that needed the plain (slow) FTS5 path."""
        self._common_cache: dict[frozenset[str], tuple[list[tuple[int, float]], bool]] = {}
        self.common_cache_misses = 0
        self._sql = (
            "SELECT rowid, title, body, bm25(passages, ?, ?) AS s FROM passages "
            "WHERE passages MATCH ? ORDER BY s LIMIT ?"
        )

    def _con(self) -> sqlite3.Connection:
        con: sqlite3.Connection | None = getattr(self._local, "con", None)
        if con is None:
            con = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            con.execute("PRAGMA cache_size = -65536")
            con.set_progress_handler(self._over_budget, _PROGRESS_STEPS)
            self._local.con = con
            with self._lock:
                # close the connections of threads that have exited (a server's worker
                # pool recycles threads; each kept connection would keep its page cache)
                for th in [th for th in self._all if not th.is_alive()]:
                    self._all.pop(th).close()
                self._all[threading.current_thread()] = con
        return con

    @property
    def num_connections(self) -> int:
        """Open per-thread connections (at most the live threads that searched, plus one)."""
        with self._lock:
            return len(self._all)

    def _over_budget(self) -> int:
        """SQLite progress handler: nonzero aborts the running statement (this thread's)."""
        deadline = getattr(self._local, "deadline", None)
        return int(deadline is not None and time.thread_time() > deadline)

    def _check_budget(self) -> None:
        deadline = getattr(self._local, "deadline", None)
        if deadline is not None and time.thread_time() > deadline:
            raise QueryError(f"query exceeded its time budget of {self.time_budget_s:g} s of CPU")

    def fingerprint(self) -> str:
        return f"sqlite:{self.corpus_sha256[:16]}:tw{self.title_weight:g}:bw{self.body_weight:g}"

    def idf(self, df: int) -> float:
        """IDF(t) exactly as FTS5's bm25() computes it."""
        v = math.log((self.n_rows - df + 0.5) / (df + 0.5))
        return v if v > 0 else 1e-6

    def _fts(self, terms: list[str], limit: int) -> list[tuple[int, str, str, float]]:
        """Top ``limit`` passages by FTS5 BM25 over ``terms``: (rowid, title, body, score)."""
        match = " OR ".join('"' + t.replace('"', '""') + '"' for t in terms)
        try:
            rows = (
                self._con()
                .execute(self._sql, (self.title_weight, self.body_weight, match, int(limit)))
                .fetchall()
            )
        except sqlite3.Error as e:
            self._check_budget()  # "interrupted" by the progress handler: over budget
            raise SearchError(f"{self.path}: query {terms[:8]!r} failed ({e})") from e
        return [(r, t, b, -float(s)) for r, t, b, s in rows]

    def _common_part(
        self, rows: list[tuple[int, str, str, float]], common: list[str]
    ) -> list[float]:
        """Σ_{t common} IDF(t)·g(k1+1)/(g + k1(1 − b + b|p|/avgdl)) for each row."""
        marks = ",".join("?" * len(rows))
        sizes = dict(
            self._con()
            .execute(
                f"SELECT id, sz FROM passages_docsize WHERE id IN ({marks})",
                tuple(r[0] for r in rows),
            )
            .fetchall()
        )
        idf = [self.idf(self.common[t]) for t in common]
        out = []
        for rowid, title, body, _ in rows:
            length = sum(_varints(sizes[rowid]))
            norm = K1 * (1 - B + B * length / self.avgdl)
            tt = _TOKEN.findall(title.lower())
            bt = _TOKEN.findall(body.lower())
            part = 0.0
            for t, w in zip(common, idf, strict=True):
                g = self.title_weight * tt.count(t) + self.body_weight * bt.count(t)
                if g:
                    part += w * g * (K1 + 1) / (g + norm)
            out.append(part)
        return out

    def _common_top(self, common: list[str]) -> tuple[list[tuple[int, float]], bool]:
        """Top ``COMMON_TOP`` passages by BM25 over the common terms alone, and whether the
        list is cut (cached per set of common terms: queries reuse a few templates)."""
        key = frozenset(common)
        with self._lock:
            hit = self._common_cache.get(key)
        if hit is None:
            rows = self._fts(sorted(key), COMMON_TOP)
            hit = ([(r[0], r[3]) for r in rows], len(rows) == COMMON_TOP)
            with self._lock:
                if len(self._common_cache) >= 1024:
                    self._common_cache.pop(next(iter(self._common_cache)))
                self._common_cache[key] = hit
                self.common_cache_misses += 1
        return hit

    def ranked(self, query: str, k: int) -> list[tuple[int, str, str, float]]:
        """Exact BM25 top-k rows (rowid, title, body, score); see the module docstring.
        Raises :class:`QueryError` for a query out of bounds or over its time budget."""
        terms = bounded_query_terms(query, self.max_query_chars, self.max_terms)
        self._check_budget()
        if not terms or k <= 0:
            return []
        common = [t for t in terms if t in self.common]
        rare = [t for t in terms if t not in self.common]
        if not common:
            return self._fts(rare, k)
        if not rare:
            top_common, common_cut = self._common_top(common)
            if k <= len(top_common) or not common_cut:
                return self._with_text(top_common[:k])
            self.fallbacks += 1
            return self._fts(terms, k)
        b_max = (K1 + 1) * sum(self.idf(self.common[t]) for t in common)
        size = max(64, 4 * k)
        while size <= 4096:
            self._check_budget()
            rows = self._fts(rare, size)
            cut = len(rows) == size
            full = {
                r[0]: r[3] + c for r, c in zip(rows, self._common_part(rows, common), strict=True)
            }
            text = {r[0]: r for r in rows}
            r_min = rows[-1][3] if cut and rows else 0.0
            best = sorted(full.items(), key=lambda kv: -kv[1])[:k]
            # 1) cheap bound: a passage outside C scores below r_min + B
            if len(best) == k and best[-1][1] >= r_min + b_max:
                return self._with_text(best, text)
            # 2) tighter: the cached ranking over the common terms alone. Passages in it
            #    but not in C have an exact common score and a rare score of 0 (C holds
            #    every rare match) or at most r_min (C was cut).
            top_common, common_cut = self._common_top(common)
            c_min = top_common[-1][1] if common_cut and top_common else 0.0
            extra = {rid: sc for rid, sc in top_common if rid not in full}
            if not cut:
                full.update(extra)
                bound = c_min
            else:
                bound = r_min + max([c_min, *extra.values()])
            best = sorted(full.items(), key=lambda kv: -kv[1])[:k]
            if (len(best) == k and best[-1][1] >= bound) or (
                len(best) < k and not cut and not common_cut
            ):
                return self._with_text(best, text)
            if not cut:
                break
            size *= 8
        self.fallbacks += 1
        return self._fts(terms, k)

    def _with_text(
        self,
        scored: list[tuple[int, float]],
        known: dict[int, tuple[int, str, str, float]] | None = None,
    ) -> list[tuple[int, str, str, float]]:
        known = known or {}
        need = [rid for rid, _ in scored if rid not in known]
        text = {rid: (t, b) for rid, t, b, _ in known.values()}
        if need:
            marks = ",".join("?" * len(need))
            for rid, t, b in (
                self._con()
                .execute(f"SELECT rowid, title, body FROM passages WHERE rowid IN ({marks})", need)
                .fetchall()
            ):
                text[rid] = (t, b)
        return [(rid, *text[rid], sc) for rid, sc in scored]

    def search(self, query: str, k: int) -> list[Hit]:
        self._local.deadline = time.thread_time() + self.time_budget_s
        try:
            rows = self.ranked(query, k)
        finally:
            self._local.deadline = None
        if not rows:
            return []
        con = self._con()
        ids = {r[0] >> 12 for r in rows}
        marks = ",".join("?" * len(ids))
        docs = {
            i: (d, t)
            for i, d, t in con.execute(
                f"SELECT id, doc_id, title FROM docs WHERE id IN ({marks})", tuple(ids)
            ).fetchall()
        }
        return [
            Hit(
                *docs[rowid >> 12],
                truncate_words(body, self.snippet_words),
                s,
                rowid & 4095,
            )
            for rowid, _title, body, s in rows
        ]

    def open(self, doc_id: str) -> str | None:
        row = (
            self._con()
            .execute("SELECT title, paragraphs FROM docs WHERE doc_id = ?", (doc_id.strip(),))
            .fetchone()
        )
        if row is None:
            return None
        title, paras = row[0], orjson.loads(row[1])
        return truncate_words(f"{title}\n" + "\n".join(paras), self.open_words)

    def close(self) -> None:
        with self._lock:
            for con in self._all.values():
                con.close()
            self._all.clear()
        self._local = threading.local()
