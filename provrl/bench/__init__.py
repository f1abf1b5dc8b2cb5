"""The benchmarks: each measures provrl and its peer side by side in one run, prints JSON.

=============  ===================================================  ==========================
module         what is measured                                     command / script
=============  ===================================================  ==========================
engine.py      LocalEngine vs HF generate: throughput, exactness,   provrl bench engine,
               hot-load pause, KV staleness (docs/engine.md §9)     benchmarks/engine.py
search.py      SQLite FTS5 BM25 vs bm25s / rank_bm25: build time,   provrl bench search,
               latency, QPS, recall@10 (docs/env.md)                benchmarks/search.py
log.py         the trajectory log vs JSONL lists and Arrow IPC      provrl bench log,
               (docs/provenance.md)                                 benchmarks/provenance_log.py
logprobs.py    chunked vs full teacher-forced logprobs: time and    provrl bench logprobs,
               peak memory (docs/objectives.md)                     benchmarks/logprobs.py
=============  ===================================================  ==========================

Settings: the ``bench`` section of the run config (:mod:`provrl.run_config.bench`); the
command line is :mod:`provrl.cli.bench`. The end-to-end benchmarks that run the whole job
(``benchmarks/async_vs_sync.py``, ``warmstart_spread.py``, ``retrieve_load.py``,
``trpo_vs_sb3.py``, …) stay scripts in ``benchmarks/``.
"""
