"""``provrl bench search``: SQLite FTS5 BM25 vs peer BM25 libraries, same corpus, same run.

For a world of ``docs`` documents (one passage per paragraph) it measures, per backend:

* index build time (from the same in-memory passages; SQLite writes a fresh file);
* query latency p50 / p99 and queries/s over the *oracle queries* of every task (what an
  agent sends: names, "people born in X", ...) and over the raw *questions* (long, full of
  common words), in ``repeats`` rounds interleaved across backends. Each round times a
  **cold** pass — every SQLite backend freshly opened, so its per-template cache of
  common-term rankings (``SqliteSearch._common_cache``) starts empty, as an agent's queries
  do — then a **warm** pass over the same queries on the same objects (SQLite's cache now
  holds every template; the peers keep no cache, so their two passes measure the same
  work). Figures are medians over rounds, cold and warm apart; the **ratios headline cold**
  (``ratios``), the warm ones are ``ratios_warm``;
* recall@10 of the gold evidence: for an oracle query, whether its gold document is in the
  top 10; for a question, the fraction of the task's evidence documents in the top 10.

Peers: ``bm25s`` (sparse-matrix BM25, its defaults except k1 = 1.2 to match FTS5; one
query per call like an agent, plus ``batched_qps``: all queries in one call, its best case) and
``rank_bm25`` (BM25Okapi; pure Python scoring, so it runs on a subset of queries — the JSON
says how many). Peers index ``title + body`` as one text; SQLite weights the title ×2 (its
default) and, as ``sqlite_tw1``, ×1.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from provrl.env.build import build_world, default_world_dir, load_split
from provrl.env.config import SearchConfig, WorldConfig
from provrl.env.search import STOPWORDS
from provrl.env.sqlite_index import SqliteSearch, build_index
from provrl.env.tasks import SPLITS, Task
from provrl.env.world import iter_corpus

Searcher = Callable[[str, int], list[str]]
"""query, k -> doc ids of the top-k passages (best first)."""


def _world(docs: int, seed: int, tasks: int, progress: bool) -> Path:
    cfg = WorldConfig(seed=seed, entities=max(50, int(docs * 0.4)), docs=docs, tasks=tasks)
    d = default_world_dir(cfg)
    if not (d / "world.json").is_file():
        build_world(cfg, d, search=SearchConfig(), progress=progress)
    return d


def _percentiles(lat: Sequence[float]) -> dict[str, float]:
    a = np.asarray(lat)
    return {
        "p50_ms": float(np.percentile(a, 50) * 1e3),
        "p99_ms": float(np.percentile(a, 99) * 1e3),
        "mean_ms": float(a.mean() * 1e3),
        "qps": float(len(a) / a.sum()),
    }


def _median_stats(passes: list[dict[str, float]]) -> dict[str, float]:
    return {key: float(np.median([p[key] for p in passes])) for key in passes[0]}


def _recall(found: Sequence[list[str]], gold: Sequence[set[str]], k: int = 10) -> float:
    """Mean over queries of |top-k ∩ gold| / |gold|."""
    got = [len(set(f[:k]) & g) / len(g) for f, g in zip(found, gold, strict=True)]
    return round(float(np.mean(got)), 4) if got else float("nan")


def peer_ratios(results: dict[str, Any], sets: Sequence[str], temp: str) -> dict[str, Any]:
    """Peer / SQLite latency ratios (and SQLite / peer QPS) of the ``temp`` passes
    (``cold`` or ``warm``), per query set."""
    sq = results["sqlite"]["latency"]
    out: dict[str, Any] = {}
    for peer in ("bm25s", "rank_bm25"):
        if peer in results:
            pl = results[peer]["latency"]
            out[f"{peer}_over_sqlite"] = {
                s: {
                    "p50": round(pl[s][temp]["p50_ms"] / sq[s][temp]["p50_ms"], 2),
                    "p99": round(pl[s][temp]["p99_ms"] / sq[s][temp]["p99_ms"], 2),
                    "qps_sqlite_over_peer": round(sq[s][temp]["qps"] / pl[s][temp]["qps"], 2),
                }
                for s in sets
            }
    return out


def run_search_benchmark(
    docs: int = 100_000,
    *,
    seed: int = 0,
    k: int = 10,
    repeats: int = 3,
    tasks: int = 2000,
    peers: Sequence[str] = ("bm25s", "rank_bm25"),
    rank_bm25_queries: int = 100,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the benchmark and return the JSON-able result (see module docstring)."""
    t0 = time.perf_counter()
    world_dir = _world(docs, seed, tasks, progress)
    world_s = time.perf_counter() - t0
    all_tasks: list[Task] = [t for s in SPLITS for t in load_split(world_dir, s)]
    oracle_q = [st.query for t in all_tasks for st in t.oracle]
    oracle_gold = [{st.passage.split("#")[0]} for t in all_tasks for st in t.oracle]
    question_q = [t.question for t in all_tasks]
    question_gold = [set(t.evidence) for t in all_tasks]

    corpus = list(iter_corpus(world_dir))
    passage_doc: list[str] = []
    passage_text: list[str] = []
    for d in corpus:
        for para in d.paragraphs:
            passage_doc.append(d.doc_id)
            passage_text.append(f"{d.title} {para}")

    backends: dict[str, Searcher] = {}
    build_s: dict[str, float] = {}
    closers: list[Callable[[], None]] = []
    tmpdir = tempfile.TemporaryDirectory(prefix="provrl-bench-")
    index_path = Path(tmpdir.name) / "index.sqlite"
    t0 = time.perf_counter()
    build_index(corpus, index_path, progress=progress, total=len(corpus))
    build_s["sqlite"] = time.perf_counter() - t0
    build_s["sqlite_tw1"] = build_s["sqlite"]
    sqlite_weights = {"sqlite": SearchConfig().title_weight, "sqlite_tw1": 1.0}
    opened: dict[str, SqliteSearch] = {}

    def reopen_sqlite() -> None:
        """Fresh SQLite backends: empty ranking caches, so the next pass is cold."""
        for name, tw in sqlite_weights.items():
            if name in opened:
                opened[name].close()
            opened[name] = SqliteSearch(index_path, title_weight=tw)

    def sqlite_search(name: str) -> Searcher:
        def search(q: str, kk: int) -> list[str]:
            return [h.doc_id for h in opened[name].search(q, kk)]

        return search

    reopen_sqlite()
    for name in sqlite_weights:
        backends[name] = sqlite_search(name)

    def close_sqlite() -> None:
        for o in opened.values():
            o.close()

    closers.append(close_sqlite)
    sqlite_default = SqliteSearch(index_path)  # counters for the default configuration
    closers.append(sqlite_default.close)

    stop = sorted(STOPWORDS)
    if "bm25s" in peers:
        import bm25s

        t0 = time.perf_counter()
        corpus_tokens = bm25s.tokenize(passage_text, stopwords=stop, show_progress=False)
        retriever = bm25s.BM25(k1=1.2, b=0.75)
        retriever.index(corpus_tokens, show_progress=False)
        build_s["bm25s"] = time.perf_counter() - t0
        del corpus_tokens
        vocab = retriever.vocab_dict

        def bm25s_search(q: str, kk: int) -> list[str]:
            toks = bm25s.tokenize(q, stopwords=stop, return_ids=False, show_progress=False)
            toks = [[t for t in toks[0] if t in vocab]]
            if not toks[0]:
                return []
            ids, _ = retriever.retrieve(toks, k=kk, show_progress=False, n_threads=0)
            return [passage_doc[int(i)] for i in ids[0]]

        backends["bm25s"] = bm25s_search
    if "rank_bm25" in peers:
        import re

        from rank_bm25 import BM25Okapi

        tok = re.compile(r"[^\W_]+")
        stopset = set(stop)

        def split(text: str) -> list[str]:
            return [t for t in tok.findall(text.lower()) if t not in stopset]

        t0 = time.perf_counter()
        okapi = BM25Okapi([split(t) for t in passage_text], k1=1.2, b=0.75)
        build_s["rank_bm25"] = time.perf_counter() - t0

        def okapi_search(q: str, kk: int) -> list[str]:
            scores = okapi.get_scores(split(q))
            top = np.argpartition(-scores, kk)[:kk]
            top = top[np.argsort(-scores[top])]
            return [passage_doc[int(i)] for i in top]

        backends["rank_bm25"] = okapi_search
    gc.collect()

    sets = {"oracle_queries": (oracle_q, oracle_gold), "questions": (question_q, question_gold)}
    rng = np.random.default_rng(seed)
    subset = {
        name: np.sort(rng.permutation(len(q))[: min(len(q), rank_bm25_queries)])
        for name, (q, _) in sets.items()
    }
    rkey = f"recall@{k}"
    results: dict[str, Any] = {
        name: {"build_s": round(build_s[name], 3), "latency": {}, rkey: {}} for name in backends
    }
    # latency: rounds interleaved across backends so shared-CPU noise hits all of them; each
    # round a cold pass (SQLite reopened: empty caches) then a warm one; recall@10 from the
    # first cold pass's results
    passes: dict[str, dict[str, dict[str, list[dict[str, float]]]]] = {
        b: {s: {"cold": [], "warm": []} for s in sets} for b in backends
    }
    cache_misses: dict[str, list[int]] = {"cold": [], "warm": []}
    for r in range(repeats):
        reopen_sqlite()
        for temp in ("cold", "warm"):
            before = opened["sqlite"].common_cache_misses
            for set_name, (queries, gold) in sets.items():
                for name, fn in backends.items():
                    idx = subset[set_name] if name == "rank_bm25" else np.arange(len(queries))
                    lat, found = [], []
                    for i in idx:
                        t = time.perf_counter()
                        docs_found = fn(queries[int(i)], k)
                        lat.append(time.perf_counter() - t)
                        found.append(docs_found)
                    passes[name][set_name][temp].append(_percentiles(lat))
                    if r == 0 and temp == "cold":
                        g = [gold[int(i)] for i in idx]
                        results[name][rkey][set_name] = _recall(found, g, k)
                        if "rank_bm25" in backends:
                            sub = {int(i) for i in subset[set_name]}
                            pairs = [
                                (f, gg)
                                for i, f, gg in zip(idx, found, g, strict=True)
                                if int(i) in sub
                            ]
                            results[name][rkey].setdefault("rank_bm25_subset", {})[set_name] = (
                                _recall([p[0] for p in pairs], [p[1] for p in pairs], k)
                            )
            cache_misses[temp].append(opened["sqlite"].common_cache_misses - before)
    for name in backends:
        for set_name in sets:
            ps = passes[name][set_name]
            n_queries = len(subset[set_name]) if name == "rank_bm25" else len(sets[set_name][0])
            results[name]["latency"][set_name] = {
                temp: {key: round(v, 4) for key, v in _median_stats(ps[temp]).items()}
                for temp in ("cold", "warm")
            } | {"queries": n_queries, "raw": {t: ps[t] for t in ("cold", "warm")}}
    if "bm25s" in backends:
        # bm25s is built for batches: its best-case throughput, all queries in one call
        batched: dict[str, float] = {}
        for set_name, (queries, _) in sets.items():
            toks = bm25s.tokenize(
                list(queries), stopwords=stop, return_ids=False, show_progress=False
            )
            toks = [[t for t in q if t in vocab] for q in toks]
            toks = [q for q in toks if q]
            t = time.perf_counter()
            retriever.retrieve(toks, k=k, show_progress=False, n_threads=0)
            batched[set_name] = round(len(toks) / (time.perf_counter() - t), 2)
        results["bm25s"]["batched_qps"] = batched
    for q in oracle_q + question_q:
        sqlite_default.search(q, k)
    ratios = {temp: peer_ratios(results, list(sets), temp) for temp in ("cold", "warm")}
    for close in closers:
        close()
    tmpdir.cleanup()
    return {
        "benchmark": "search",
        "docs": len(corpus),
        "passages": len(passage_text),
        "tasks": len(all_tasks),
        "k": k,
        "repeats": repeats,
        "world_dir": str(world_dir),
        "world_build_s": round(world_s, 3),
        "cpu_count": os.cpu_count(),
        "sqlite_common_terms": len(sqlite_default.common),
        "sqlite_exact_fallbacks": sqlite_default.fallbacks,
        "sqlite_common_cache_misses_one_pass": sqlite_default.common_cache_misses,
        "sqlite_common_cache_misses": cache_misses,
        "backends": results,
        "ratios": ratios["cold"],
        "ratios_warm": ratios["warm"],
        "notes": (
            "latency figures are medians over rounds, cold (SQLite freshly opened: empty "
            "ranking cache) and warm (the same queries again) apart; ratios are cold, "
            "ratios_warm warm; raw holds every pass. "
            "rank_bm25 runs on a random subset of queries (see 'queries'). "
            f"recall@{k}: oracle_queries = gold document of each oracle search in the top {k}; "
            f"questions = fraction of each task's evidence documents in the top {k}."
        ),
    }
