"""Give pages of a CPU tensor back to the OS, so the KV cache's memory follows what it holds.

The KV cache is one zero-filled allocation of ``[layers, slots, H_kv, max_context, d]``
whose pages the OS commits on first write (:func:`provrl.engine.llama._lazy_zeros`). Without
help, a slot keeps every page it ever wrote: over a run each slot grows to the longest
context it once held, and resident memory approaches the whole allocation (SmolLM2, 33
slots × 1544 positions in float32: 2.3 GB) although the contexts alive at any time fill a
fraction of it. :func:`release` hands the whole pages inside byte ranges of a tensor back
with ``madvise(MADV_DONTNEED)``: the kernel drops them, later reads return zeros and the
next write commits a fresh page (the same contract as the calloc'd memory they came from).
It is the OS doing for the slot layout what a paged KV cache does by hand.

Linux only (the release is skipped elsewhere, and for tensors not on the CPU); only whole
pages strictly inside a range are released, so no neighbouring data is touched.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Iterable

import torch

__all__ = ["PAGE", "release"]

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # <sys/mman.h> on Linux
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def release(t: torch.Tensor, ranges: Iterable[tuple[int, int]]) -> int:
    """``madvise(MADV_DONTNEED)`` the whole pages inside each element range ``[a, b)`` of
    ``t``'s flat storage: elements on those pages read as zero afterwards; the partial pages at
    a range's ends keep their values. Returns the bytes given back (0 off Linux, or
    for a tensor that is not a contiguous CPU one)."""
    if _libc is None or t.device.type != "cpu" or not t.is_contiguous():
        return 0
    base, size = t.data_ptr(), t.element_size()
    freed = 0
    for a, b in ranges:
        lo = -(-(base + a * size) // PAGE) * PAGE  # first page boundary at or after a
        hi = (base + b * size) // PAGE * PAGE  # last page boundary at or before b
        if hi <= lo:
            continue
        if _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise(MADV_DONTNEED) of {hi - lo} bytes failed")
        freed += hi - lo
    return freed
