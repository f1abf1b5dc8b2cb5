"""Build a world directory: corpus, search index, tasks verified by the oracle; and open the
search tool a config names (:func:`search_backend`).

Layout::

    <dir>/world.json              settings, counts, corpus sha256
    <dir>/corpus.jsonl            one document per line
    <dir>/index-<key>.sqlite      the FTS5 index (cached; rebuilt if missing)
    <dir>/tasks/{train,dev,test}.jsonl
    <dir>/tasks/summary.json      counts per split / tier, oracle verification

The directory is assembled under a temporary name and renamed at the end, so a crash never
leaves a half-built world under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from provrl._sys import atomic_tmp_dir, cache_dir
from provrl.env.config import EnvConfig, SearchConfig, WorldConfig
from provrl.env.http_search import HttpSearch
from provrl.env.latency import LatencyModel, WithLatency
from provrl.env.oracle import run_oracle
from provrl.env.search import SearchBackend
from provrl.env.sqlite_index import SqliteSearch, cached_index
from provrl.env.taskgen import generate_tasks
from provrl.env.tasks import SPLITS, Task, load_tasks, save_tasks
from provrl.env.world import generate_world, save_world

TASKS_DIR = "tasks"


def world_key(cfg: WorldConfig) -> str:
    return hashlib.sha256(cfg.model_dump_json().encode()).hexdigest()[:10]


def default_world_dir(cfg: WorldConfig) -> Path:
    """``$PROVRL_CACHE/worlds/seed<S>-d<D>-<hash>`` for a world config."""
    return cache_dir() / "worlds" / f"seed{cfg.seed}-d{cfg.docs}-{world_key(cfg)}"


def build_world(
    cfg: WorldConfig,
    out_dir: str | os.PathLike[str],
    *,
    search: SearchConfig | None = None,
    progress: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Generate, index and verify a world into ``out_dir``; return its summary."""
    search = search or SearchConfig()
    final = Path(out_dir)
    if final.exists() and not overwrite:
        raise FileExistsError(f"{final}: exists (use --overwrite to replace it)")
    tmp = atomic_tmp_dir(final)
    try:
        t0 = time.perf_counter()
        world = generate_world(cfg)
        info = save_world(world, tmp)
        t_gen = time.perf_counter() - t0
        t0 = time.perf_counter()
        index_path = cached_index(tmp, progress=progress)
        t_index = time.perf_counter() - t0
        tasks = generate_tasks(world, cfg)
        backend = SqliteSearch(index_path, title_weight=search.title_weight)
        kept: list[Task] = []
        dropped: list[dict[str, Any]] = []
        it: Any = tasks
        if progress:
            from tqdm import tqdm

            it = tqdm(tasks, desc="oracle check", unit="task", leave=False)
        for t in it:
            r = run_oracle(t, backend, search.k)
            if r.solved:
                kept.append(t)
            else:
                dropped.append({"task_id": t.task_id, "problems": r.problems})
        backend.close()
        for split in SPLITS:
            save_tasks([t for t in kept if t.split == split], tmp / TASKS_DIR / f"{split}.jsonl")
        summary = {
            "world": info,
            "tasks": {
                "generated": len(tasks),
                "kept": len(kept),
                "dropped_by_oracle_check": len(dropped),
                "dropped_examples": dropped[:5],
                "oracle_k": search.k,
                "per_split": dict(Counter(t.split for t in kept)),
                "per_tier": {str(k): v for k, v in sorted(Counter(t.tier for t in kept).items())},
                "mean_min_searches": (
                    sum(t.min_searches for t in kept) / len(kept) if kept else 0.0
                ),
            },
            "seconds": {"generate": round(t_gen, 3), "index": round(t_index, 3)},
        }
        (tmp / TASKS_DIR / "summary.json").write_text(json.dumps(summary, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def ensure_world(cfg: WorldConfig, world_dir: str | os.PathLike[str] | None = None) -> Path:
    """A built world for ``cfg``: ``world_dir`` if given (must exist), else the cached
    default for ``cfg`` (built on first use)."""
    if world_dir is not None:
        p = Path(world_dir)
        if not (p / "world.json").is_file():
            raise FileNotFoundError(f"{p}: not a world directory (run `provrl world --out {p}`)")
        return p
    p = default_world_dir(cfg)
    if not (p / "world.json").is_file():
        with contextlib.suppress(FileExistsError):  # another process finished first
            build_world(cfg, p, progress=True)
    return p


def load_split(world_dir: str | os.PathLike[str], split: str) -> list[Task]:
    return load_tasks(Path(world_dir) / TASKS_DIR / f"{split}.jsonl", split=split)


def search_backend(world_dir: str | os.PathLike[str] | None, cfg: EnvConfig) -> SearchBackend:
    """The search tool ``cfg.search`` describes: the world's SQLite BM25 index, an index
    file of the user's own collection (``search.index``, built by ``provrl index``) or the
    HTTP client of a ``/retrieve`` service (``search.url``, with or without the trailing
    ``/retrieve``), wrapped in the simulated latency when ``cfg.search.latency`` asks."""
    backend: SearchBackend
    if cfg.search.backend == "http":
        url = cfg.search.url.rstrip("/").removesuffix("/retrieve")
        s = cfg.search
        backend = HttpSearch(
            url, cfg.agent.tool_timeout_s, retries=s.retries, backoff_s=s.retry_backoff_s
        )
    else:
        if cfg.search.index:
            index: Path = Path(cfg.search.index)
        elif world_dir is not None:
            index = cached_index(world_dir)
        else:
            raise ValueError(
                "search: no index — give search.index (a `provrl index` file), a world "
                "directory, or backend=http with search.url"
            )
        backend = SqliteSearch(
            index,
            title_weight=cfg.search.title_weight,
            snippet_words=cfg.search.snippet_words,
            open_words=cfg.search.open_words,
        )
    if cfg.search.latency.kind != "none":  # the simulated deadline dilates with the latency
        lat = cfg.search.latency
        backend = WithLatency(backend, LatencyModel(lat), cfg.agent.tool_timeout_s * lat.time_scale)
    return backend


def check_search(backend: SearchBackend) -> None:
    """The preflight of a built search tool: an HTTP service must answer
    (:meth:`~provrl.env.http_search.HttpSearch.check`, one :class:`SearchError` line if
    not); an index file opened when it was built."""
    inner = getattr(backend, "inner", backend)  # under a simulated latency
    if isinstance(inner, HttpSearch):
        inner.check()


def preflight_search(world_dir: str | os.PathLike[str] | None, cfg: EnvConfig) -> None:
    """Before any work: the search tool ``cfg.search`` names is there (:func:`check_search`),
    or one line says which and what to do. The world's own index (no ``world_dir`` yet) is
    built with the world and not checked. ``provrl run``, ``eval`` and ``probe`` call it
    first, so a dead retriever stops them before a model loads instead of turning every
    search into a "search failed" observation."""
    if cfg.search.backend == "sqlite" and not cfg.search.index and world_dir is None:
        return
    backend = search_backend(world_dir, cfg)
    try:
        check_search(backend)
    finally:
        close = getattr(backend, "close", None)  # not part of the SearchBackend protocol
        if close is not None:
            close()
