"""The floating-point dtype a run computes in, with ``auto`` resolved for the device at hand.

bfloat16 halves the bytes every weight and activation moves and, where the hardware has bf16
matrix units, multiplies matmul throughput: a CUDA GPU, or an x86 CPU with AMX tiles
(Sapphire Rapids and later). Whether a CPU *without* AMX but with AVX512-BF16 runs bf16 fast
cannot be read from its flags: on a 2-core Xeon that reports AVX512-BF16,
``results/dtype_cpu.json`` measured float32 at 1.7× bf16's matmul rate at SmolLM2's shapes
and 1.5× the RL trainer step's tokens/s, while an AMD EPYC (Zen 4) that reports the same flag
runs bf16 matmuls several times faster than float32 (``results/dtype_cpu_epyc.json``).

``auto`` (:func:`resolve_dtype`) is bfloat16 where :func:`bf16_is_fast`, else float32. On a CPU
the verdict (:func:`cpu_bf16_verdict`) is: AMX tiles, fast; no AVX512-BF16, slow (torch then
emulates bf16); otherwise **measured** once — bf16 against float32 matmuls at SmolLM2's MLP
shape, fast when bf16 reaches :data:`BF16_FAST_RATIO` × float32's rate — and kept per CPU model
and torch version in ``$PROVRL_CACHE/cpu_bf16.json``, so every later run on that machine
resolves alike. ``PROVRL_CPU_BF16=1`` / ``0`` forces the verdict. ``auto`` is resolved where the
dtype is used, for the device it is used on, so a run resumed on another machine computes in
that machine's fast dtype; each session's record says which it had (``provrl._sys.machine``:
``cpu_amx``, ``cpu_bf16``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from typing import Any, Literal

import torch

from provrl._sys import cache_dir, cpu_model, write_json

ComputeDtype = Literal["auto", "float32", "bfloat16"]
"""A compute dtype a config may name (``auto``: :func:`resolve_dtype`)."""

BF16_FAST_RATIO = 1.3
"""bf16 is the fast dtype of a CPU without AMX when its matmul rate is at least this multiple
of float32's (a margin: the two CPUs measured so far gave 0.6 and several times 1)."""

PROBE_SHAPE = (1024, 576, 1536)
"""(m, k, n) of the probe's matmul: SmolLM2-135M's MLP up-projection on 1,024 tokens."""


def bf16_is_fast(device: str | torch.device = "cpu") -> bool:
    """Whether bfloat16 matmuls outrun float32 on ``device``: a CUDA device that supports
    bf16, or a CPU whose :func:`cpu_bf16_verdict` says so."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if dev.type == "cpu":
        return bool(cpu_bf16_verdict()["fast"])
    return False


def _flag(name: str) -> bool:
    return bool(getattr(torch.cpu, name, lambda: False)())


@functools.cache
def cpu_bf16_verdict() -> dict[str, Any]:
    """Whether bf16 is this CPU's fast dtype, and why (module docstring): ``fast``, ``how``
    (``env``, ``amx``, ``no-avx512-bf16``, ``measured`` or ``kept``: measured by an earlier
    process) and, when measured, ``ratio`` (bf16 rate / float32 rate)."""
    forced = os.environ.get("PROVRL_CPU_BF16")
    if forced in ("0", "1"):
        return {"fast": forced == "1", "how": "env"}
    if _flag("_is_amx_tile_supported"):
        return {"fast": True, "how": "amx"}
    if not _flag("_is_avx512_bf16_supported"):
        return {"fast": False, "how": "no-avx512-bf16"}
    key = f"{cpu_model()} | torch {torch.__version__}"
    path = cache_dir() / "cpu_bf16.json"
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    if isinstance(kept.get(key), dict) and "ratio" in kept[key]:
        ratio = float(kept[key]["ratio"])
        return {"fast": ratio >= BF16_FAST_RATIO, "how": "kept", "ratio": ratio}
    ratio = measure_bf16_ratio()
    kept[key] = {"ratio": round(ratio, 3), "threads": torch.get_num_threads(),
                 "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}  # fmt: skip
    with contextlib.suppress(OSError):  # a read-only cache: measured again by the next process
        write_json(path, kept)
    return {"fast": ratio >= BF16_FAST_RATIO, "how": "measured", "ratio": round(ratio, 3)}


def measure_bf16_ratio(repeats: int = 5) -> float:
    """bf16's matmul rate over float32's at :data:`PROBE_SHAPE` on the current threads: the
    best of ``repeats`` timed calls per dtype, interleaved after a warm-up (a fraction of a
    second)."""
    m, k, n = PROBE_SHAPE
    gen = torch.Generator().manual_seed(0)
    mats = {
        dt: (torch.randn(m, k, generator=gen).to(dt), torch.randn(k, n, generator=gen).to(dt))
        for dt in (torch.float32, torch.bfloat16)
    }
    best = dict.fromkeys(mats, float("inf"))
    for rep in range(repeats + 1):
        for dt, (a, b) in mats.items():
            t0 = time.perf_counter()
            torch.mm(a, b)
            if rep:  # the first round warms the kernels up
                best[dt] = min(best[dt], time.perf_counter() - t0)
    return best[torch.float32] / best[torch.bfloat16]


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> str:
    """``name``, with ``auto`` → ``bfloat16`` if :func:`bf16_is_fast` on ``device`` else
    ``float32``; any other name unchanged."""
    if name != "auto":
        return name
    return "bfloat16" if bf16_is_fast(device) else "float32"


def autocast(name: str, device: str | torch.device) -> Any:
    """``torch.autocast`` to bfloat16, enabled when ``name`` resolves to it on ``device``
    (disabled for float32, so it also switches off an enclosing bf16 context)."""
    dev = torch.device(device)
    return torch.autocast(dev.type, torch.bfloat16, enabled=resolve_dtype(name, dev) == "bfloat16")
