"""Give pages of a CPU tensor back to the OS, so the KV cache's memory follows what it holds.

The KV cache is one zero-filled allocation of ``[layers, slots, H_kv, max_context, d]``
whose pages the OS commits on first write (:func:`zeros`: a fresh anonymous mapping, never
recycled heap that calloc would have to clear, and so commit, in full). Without
help, a slot keeps every page it ever wrote: over a run each slot grows to the longest
context it once held, and resident memory approaches the whole allocation (SmolLM2, 33
slots × 1544 positions in float32: 2.3 GB) although the contexts alive at any time fill a
fraction of it. :func:`release` hands the whole pages inside byte ranges of a tensor back
with ``madvise(MADV_DONTNEED)``: the kernel drops them, later reads return zeros and the
next write commits a fresh page (the same contract as the fresh mapping they came from).
It is the OS doing for the slot layout what a paged KV cache does by hand.

**Small pages.** The kernel may back a large mapping with transparent huge pages (2 MiB; NumPy
asks for them on every large array, and so did the cache when NumPy allocated it). For the
slot layout that is the wrong size: a slot's positions
of one (layer, head) are a row of ``max_context · d`` elements (395 KB for SmolLM2 in
float32), so the first write of a short context commits a 2 MiB page per row it touches, which
the kernel must zero first — a prefix-cache copy of 400 positions wrote 9 MB and committed and
zeroed several times that. :func:`page_size` asks for 4 KiB pages on the KV cache
(``madvise(MADV_NOHUGEPAGE)``), so a write commits only what it writes and :func:`release` gives
back whole pages without splitting huge ones (``engine.kv_huge_pages`` asks for huge pages
instead, for comparison).

Linux only (both are skipped elsewhere, and for tensors not on the CPU); only whole
pages strictly inside a range are released, so no neighbouring data is touched.
"""

from __future__ import annotations

import ctypes
import errno
import math
import mmap
import sys
from collections.abc import Iterable

import torch

__all__ = ["PAGE", "page_size", "release", "zeros"]

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4  # <sys/mman.h> on Linux
_MADV_HUGEPAGE = 14
_MADV_NOHUGEPAGE = 15
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu",
          huge: bool = False) -> torch.Tensor:  # fmt: skip
    """Zeros whose pages the OS commits only when written: on the CPU a fresh anonymous
    mapping (``mmap``; whatever the allocator holds free, and page-aligned) advised to base
    pages, or to huge pages with ``huge`` (:func:`page_size`); elsewhere ``torch.zeros``."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device != "cpu" or nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # (Windows)
        return torch.zeros(shape, dtype=dtype, device=device)
    # private anonymous memory (mmap's default for -1 is shared, which MADV_DONTNEED cannot
    # free); zero-filled; the tensor keeps the mapping alive
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    t = torch.frombuffer(buf, dtype=dtype).view(shape)
    page_size(t, huge)
    return t


def _madvise(t: torch.Tensor, ranges: Iterable[tuple[int, int]], advice: int, name: str) -> int:
    """``madvise(advice)`` the whole pages inside each element range ``[a, b)`` of ``t``'s flat
    storage; the bytes advised (0 off Linux, or for a tensor that is not a contiguous CPU one)."""
    if _libc is None or t.device.type != "cpu" or not t.is_contiguous():
        return 0
    base, size = t.data_ptr(), t.element_size()
    done = 0
    for a, b in ranges:
        lo = -(-(base + a * size) // PAGE) * PAGE  # first page boundary at or after a
        hi = (base + b * size) // PAGE * PAGE  # last page boundary at or before b
        if hi <= lo:
            continue
        if _libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), advice) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"madvise({name}) of {hi - lo} bytes failed")
        done += hi - lo
    return done


def release(t: torch.Tensor, ranges: Iterable[tuple[int, int]]) -> int:
    """``madvise(MADV_DONTNEED)`` the whole pages inside each element range ``[a, b)`` of
    ``t``'s flat storage: elements on those pages read as zero afterwards; the partial pages at
    a range's ends keep their values. Returns the bytes given back (0 off Linux, or
    for a tensor that is not a contiguous CPU one)."""
    return _madvise(t, ranges, _MADV_DONTNEED, "MADV_DONTNEED")


def page_size(t: torch.Tensor, huge: bool) -> int:
    """Ask for ``t``'s storage to be backed by base pages (``madvise(MADV_NOHUGEPAGE)``: a first
    write commits and zeroes 4 KiB) or by transparent huge pages (``MADV_HUGEPAGE``: 2 MiB at
    a time, as NumPy asks for its large arrays), before anything is written. Returns the bytes
    advised (0 off Linux or CPU, or where the kernel has no huge pages to choose between)."""
    advice, name = (
        (_MADV_HUGEPAGE, "MADV_HUGEPAGE") if huge else (_MADV_NOHUGEPAGE, "MADV_NOHUGEPAGE")
    )
    try:
        return _madvise(t, [(0, t.numel())], advice, name)
    except OSError as e:  # a kernel built without transparent huge pages: base pages anyway
        if e.errno == errno.EINVAL:
            return 0
        raise
