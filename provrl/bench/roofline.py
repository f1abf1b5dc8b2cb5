"""The matmul roofline: how many FLOP/s this device reaches on one matmul shape.

A benchmark's "fraction of the hardware" divides its own FLOP/s by a matmul rate measured in
the same run. A rate from a handful of calls is noisy in one direction only: a call slowed by
another process, a sleeping thread pool or a frequency step is slower, never faster, than the
hardware allows. So :func:`matmul_rates` times calls for a fixed span of wall time (after two
warm-up calls) rather than a fixed count, and :func:`roofline` summarises them by their
median and by a high quantile, the ``peak``: the rate the device sustained on its better
calls, the denominator a fraction should use. For one call of ``2·m·k·n`` FLOPs taking
``t`` seconds the rate is ``2·m·k·n / t``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

PEAK_QUANTILE = 0.9
"""The quantile of the per-call rates reported as the device's peak."""


def matmul_call_seconds(
    m: int,
    k: int,
    n: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    min_s: float = 0.3,
    min_calls: int = 5,
    max_s: float = 3.0,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, list[tuple[float, float]]]:
    """``(FLOPs of one call, [(wall seconds, clock seconds) of each timed call])`` of
    ``[m, k] @ [k, n]`` in ``dtype`` on this thread's torch threads: two warm-up calls, then
    calls until both ``min_s`` wall seconds and ``min_calls`` calls are done, or ``max_s``
    seconds are (at least one call: a dtype without a fast path costs ~1 s a call on a CPU
    without bf16 units). ``clock`` times each call a second way (``time.process_time``: the
    CPU seconds of this process)."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if a.is_cuda else (lambda: None)
    start = time.perf_counter()
    for _ in range(2):
        a @ b
        sync()
        if time.perf_counter() - start > max_s:  # a slow path: one warm-up is enough
            break
    calls: list[tuple[float, float]] = []
    start = time.perf_counter()
    while True:
        t, c = time.perf_counter(), clock()
        a @ b
        sync()
        calls.append((time.perf_counter() - t, clock() - c))
        spent = time.perf_counter() - start
        if spent >= max_s or (spent >= min_s and len(calls) >= min_calls):
            return 2.0 * m * k * n, calls


def gflops(flop: float, seconds: float) -> float:
    """GFLOP/s of ``flop`` in ``seconds`` (a coarse clock may read 0: floored at 1 ns)."""
    return flop / max(seconds, 1e-9) / 1e9


def matmul_rates(
    m: int,
    k: int,
    n: int,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    min_s: float = 0.3,
    min_calls: int = 5,
    max_s: float = 3.0,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """GFLOP/s of each timed call of :func:`matmul_call_seconds` (same arguments), by
    ``clock`` (wall seconds; ``time.process_time`` gives the rate per CPU second of this
    process); the span is always wall time."""
    flop, calls = matmul_call_seconds(m, k, n, dtype, device, min_s, min_calls, max_s, clock)
    return [gflops(flop, c) for _, c in calls]


def roofline(rates: list[float]) -> dict[str, Any]:
    """``{"median", "peak", "calls"}`` of per-call GFLOP/s; ``peak`` is the
    :data:`PEAK_QUANTILE` quantile (the module docstring says why not the median)."""
    r = np.asarray(rates, dtype=float)
    return {
        "median": float(np.median(r)),
        "peak": float(np.quantile(r, PEAK_QUANTILE)),
        "calls": len(rates),
    }
