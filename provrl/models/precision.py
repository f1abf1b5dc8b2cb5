"""The floating-point dtype a run computes in, with ``auto`` resolved for the device at hand.

bfloat16 halves the bytes every weight and activation moves and, where the hardware has bf16
matrix units, multiplies matmul throughput: a CUDA GPU, or an x86 CPU with AMX tiles
(Sapphire Rapids and later). Without AMX, torch's CPU kernels ran bf16 slower than float32
even on a CPU that reports AVX512-BF16: on such a 2-core Xeon, ``results/dtype_cpu.json``
measured float32 at 1.7× bf16's matmul rate at SmolLM2's shapes and 1.5× the RL trainer step's
tokens/s; the engine on the replayed workload was no slower in float32 (1.03×).

``auto`` (:func:`resolve_dtype`) is bfloat16 where :func:`bf16_is_fast`, else float32. It is
resolved where the dtype is used, for the device it is used on, so a run resumed on another
machine computes in that machine's fast dtype; each session's record says which it had
(``provrl._sys.machine``: ``cpu_amx``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch

ComputeDtype = Literal["auto", "float32", "bfloat16"]
"""A compute dtype a config may name (``auto``: :func:`resolve_dtype`)."""


def bf16_is_fast(device: str | torch.device = "cpu") -> bool:
    """Whether bfloat16 matmuls outrun float32 on ``device``: a CUDA device that supports
    bf16, or a CPU with AMX tiles (AVX512-BF16 alone is not enough, see the module doc)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if dev.type == "cpu":
        return bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    return False


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
