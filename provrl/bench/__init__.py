"""The benchmarks: each measures provrl and its peer side by side in one run, prints JSON.

Every benchmark lives here (importable, typed, linted, tested); each script in
``benchmarks/`` is a thin launcher of one of them (``make bench`` runs them all), and
``provrl bench …`` runs the first four.

=====================  ===============================================  ========================
module                 what is measured                                 command / script
=====================  ===============================================  ========================
engine.py              LocalEngine vs HF generate: throughput,          provrl bench engine,
                       exactness, hot-load pause, KV staleness          benchmarks/engine.py
                       (docs/engine.md §9)
replay.py, workload.py recorded agent episodes replayed turn by turn:   provrl bench engine
                       engine vs HF generate floor (vs vLLM), tokens/s, --workload fixture
                       occupancy, cache share, matmul fraction
                       (docs/perf.md)
engine_profile.py      torch.profiler over one workload replay: per-op  benchmarks/engine_profile.py
                       table, time per engine phase and kind of work,
                       Python overhead per step (docs/perf.md)
search.py              SQLite FTS5 BM25 vs bm25s / rank_bm25: build     provrl bench search,
                       time, latency, QPS, recall@10 (docs/env.md)      benchmarks/search.py
log.py                 the trajectory log vs JSONL lists and Arrow IPC  provrl bench log,
                       (docs/provenance.md)                             benchmarks/provenance_log.py
logprobs.py            chunked vs full teacher-forced logprobs: time    provrl bench logprobs,
                       and peak memory (docs/objectives.md)             benchmarks/logprobs.py
async_vs_sync.py       async (hot-load) vs sync RL at equal samples     benchmarks/async_vs_sync.py
                       (docs/pipeline.md)
simulate.py            predicted async / sync wall ratio at scale: a    provrl bench simulate,
                       discrete-event simulation (docs/simulate.md)     benchmarks/simulate.py
sim_check.py           the simulator at a measured async_vs_sync point  check_against_simulator
agent_runs.py          an RL stage measured from outside the loop       (used by the above)
                       (engine counters, save / load s, kept weights)
replicas.py            one engine vs Ray replicas; hot-load schedules;  benchmarks/replicas.py
                       a replica killed (docs/distributed.md)
retrieve_load.py       ``/retrieve`` under load, clean and hostile      benchmarks/retrieve_load.py
                       (docs/env.md)
warmstart_spread.py    the spread of K after the warm start, per tier   benchmarks/warmstart_spread.py
trpo_agent.py          TRPO vs clipped GRPO on the async agent as       benchmarks/trpo_agent.py
                       max_lag grows: predicted vs realised gain, KL
                       (docs/objectives.md)
trpo_vs_sb3.py         provrl TRPO vs sb3-contrib TRPO on gymnasium     benchmarks/trpo_vs_sb3.py
                       control (docs/trpo.md)
trpo_pendulum_seeds.py the seed spread of TRPO on Pendulum-v1           benchmarks/trpo_pendulum_seeds.py
conformance.py         the false-alarm rate of provrl conformance       benchmarks/conformance_false_alarm.py
                       on provrl's engine (docs/conformance.md)
attribution.py         exact recorded q vs pi_v_start, per-token        benchmarks/attribution.py
                       pi_v_t, on-policy on a run's trajectories
                       (docs/conformance.md)
=====================  ===============================================  ========================

The room sits above the pipeline (the end-to-end benchmarks run it) and only the command line
imports it. Settings of ``provrl bench …``: the ``bench`` section of the run config
(:mod:`provrl.run_config.bench`); its command line is :mod:`provrl.cli.bench`. The other
benchmarks take their own ``--help`` flags. Names load on first use.
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    "run_engine_benchmark": "provrl.bench.engine",
    "run_search_benchmark": "provrl.bench.search",
    "run_log_benchmark": "provrl.bench.log",
    "run_logprob_benchmark": "provrl.bench.logprobs",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
