"""benchmarks/replicas.py (provrl/bench/replicas.py): the in-process peer is taken at its
best thread count, and the machine's load is summarised (no Ray needed)."""

from __future__ import annotations

import pytest

from provrl.bench.replicas import best_threads, load_summary


def test_the_peer_is_the_in_process_engine_at_its_best_thread_count():
    # a loaded machine: 2 threads fight other tenants, 1 thread does better
    assert best_threads({1: [210.0, 190.0, 205.0], 2: [150.0, 230.0, 120.0]}) == 1
    assert best_threads({1: [150.0, 160.0, 155.0], 2: [234.0, 240.0, 228.0]}) == 2
    assert best_threads({1: [200.0], 2: [200.0]}) == 1  # a tie: fewer threads
    with pytest.raises(ValueError, match="no thread count"):
        best_threads({})


def test_machine_load_is_reported_with_the_figures():
    s = load_summary([1.2, 3.4, 2.0])
    assert (s["load_1m_min"], s["load_1m_median"], s["load_1m_max"]) == (1.2, 2.0, 3.4)
    assert s["load_1m_all"] == [1.2, 3.4, 2.0]
