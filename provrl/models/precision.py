"""The floating-point dtype a run computes in, with ``auto`` resolved for the device at hand.

bfloat16 halves the bytes every weight and activation moves and, where the hardware has bf16
matrix units, multiplies matmul throughput: a CUDA GPU, or an x86 CPU with AMX tiles
(Sapphire Rapids and later). A CPU with AVX512-BF16 but no AMX widens bf16 to float32 inside
its FMA loops, and there float32 is the faster path: on a 2-core Xeon without AMX a bf16
``[1024, 576] @ [576, 1536]`` matmul ran 161 GFLOP/s against float32's 209, an SFT step 1.5×
slower and the engine on the replayed workload 1.3× slower (``results/dtype_cpu.json``).

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
