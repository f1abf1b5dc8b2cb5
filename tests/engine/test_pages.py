"""The KV cache gives freed pages back to the OS, and nothing the engine computes changes."""

from __future__ import annotations

import ctypes
import os
import sys

import pytest
import torch

from provrl.engine import pages
from provrl.engine.llama import KVCache, LlamaShape
from provrl.provenance import SamplingParams

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise / mincore: Linux")

SHAPE = LlamaShape(vocab_size=100, hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64,
                   intermediate=16, eps=1e-5, tied=True)  # fmt: skip


def resident_pages(t: torch.Tensor) -> int:
    """Pages of ``t``'s storage in RAM now (``mincore``): what the process really holds."""
    libc = ctypes.CDLL(None, use_errno=True)
    lo = t.data_ptr() // pages.PAGE * pages.PAGE
    hi = -(-(t.data_ptr() + t.numel() * t.element_size()) // pages.PAGE) * pages.PAGE
    vec = (ctypes.c_ubyte * ((hi - lo) // pages.PAGE))()
    assert libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) == 0
    return sum(b & 1 for b in vec)


@linux
def test_release_drops_whole_pages_only_and_they_read_zero():
    per_page = pages.PAGE // 4
    t = pages.zeros((66 * per_page,), torch.float32)
    t = t[(-t.data_ptr() % pages.PAGE) // 4 :][: 64 * per_page]  # from a page boundary on
    t.fill_(1.0)
    before = resident_pages(t)
    a, b = 10 * per_page + 3, 40 * per_page + 5  # not page-aligned at either end
    freed = pages.release(t, [(a, b)])
    assert freed == 29 * pages.PAGE  # pages 11 … 39: the partial pages 10 and 40 stay
    assert resident_pages(t) == before - 29
    lo, hi = 11 * per_page, 40 * per_page
    t[lo] = 2.0  # writing commits a fresh page (reading maps the shared zero page)
    assert resident_pages(t) == before - 28
    assert float(t[lo]) == 2.0 and bool((t[lo + 1 : hi] == 0).all())
    assert bool((t[:lo] == 1).all()) and bool((t[hi:] == 1).all())


@linux
def test_trim_keeps_the_slots_prefix_and_every_other_slot():
    kv = KVCache(SHAPE, n_slots=3, max_context=256, device="cpu", dtype=torch.float32)
    for t in (kv.k, kv.v):
        t.copy_(torch.arange(t.numel(), dtype=torch.float32).view(t.shape) + 1)
    ref_k, ref_v = kv.k.clone(), kv.v.clone()
    before = resident_pages(kv.k) + resident_pages(kv.v)
    # one position of one head is 64 floats = 256 bytes, 16 positions per page: keeping 100
    # of 256 positions frees at least the 8 whole pages from position 128 on, per head
    freed = kv.trim(1, 100)
    assert freed >= 2 * 2 * 2 * 8 * pages.PAGE  # k, v × layers × heads × pages
    assert resident_pages(kv.k) + resident_pages(kv.v) == before - freed // pages.PAGE
    for t, ref in ((kv.k, ref_k), (kv.v, ref_v)):
        assert torch.equal(t[:, [0, 2]], ref[:, [0, 2]])  # other slots untouched
        assert torch.equal(t[:, 1, :, :100], ref[:, 1, :, :100])  # the kept prefix
    zeros = int((kv.k[:, 1, :, 100:] == 0).sum() + (kv.v[:, 1, :, 100:] == 0).sum())
    assert zeros * 4 == freed  # exactly the released pages read zero, nothing else
    assert kv.trim(1, 0) >= freed + 2 * 2 * 6 * pages.PAGE  # and the kept 100 positions
    assert torch.equal(kv.k[:, [0, 2]], ref_k[:, [0, 2]])


def vm_flags(t: torch.Tensor) -> set[str]:
    """The kernel's VmFlags of the mapping holding ``t`` (/proc/self/smaps): ``hg`` after
    MADV_HUGEPAGE, ``nh`` after MADV_NOHUGEPAGE."""
    addr, inside = t.data_ptr(), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise AssertionError("no mapping holds the tensor")


@linux
@pytest.mark.parametrize("huge", [False, True])
def test_the_cache_is_a_fresh_mapping_with_the_page_size_asked(huge):
    """64 MiB per tensor, nothing resident before the first write (a fresh mapping, whatever
    the allocator holds free), and the mapping advised as asked; with small pages, writing
    one element commits one 4 KiB page (with huge pages the kernel may commit 2 MiB)."""
    shape = LlamaShape(vocab_size=100, hidden=64, n_layers=4, n_heads=4, n_kv_heads=2,
                       head_dim=64, intermediate=16, eps=1e-5, tied=True)  # fmt: skip
    kv = KVCache(shape, n_slots=8, max_context=4096, device="cpu", dtype=torch.float32,
                 huge_pages=huge)  # fmt: skip
    assert kv.k.numel() * 4 == 64 * 2**20
    assert resident_pages(kv.k) == 0 and kv.k.data_ptr() % pages.PAGE == 0
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):  # a kernel with THP
        flag = "hg" if huge else "nh"
        assert flag in vm_flags(kv.k) and flag in vm_flags(kv.v)
    kv.k[2, 4, 1, 1000] = 1.0  # a page in the middle of the allocation
    assert resident_pages(kv.k) >= 1
    if not huge:
        assert resident_pages(kv.k) == 1


def test_a_kernel_without_huge_pages_is_no_error_but_a_failed_release_is(monkeypatch):
    """madvise(MADV_[NO]HUGEPAGE) fails with EINVAL on a kernel built without transparent huge
    pages: the cache has base pages anyway, so the engine still starts; a failed release is an
    error that names the call."""
    import errno

    class NoTHP:
        def madvise(self, addr, size, advice):
            ctypes.set_errno(errno.EINVAL)
            return -1

    monkeypatch.setattr(pages, "_libc", NoTHP())
    t = pages.zeros((4 * pages.PAGE,), torch.float32)
    assert pages.page_size(t, huge=False) == 0 and pages.page_size(t, huge=True) == 0
    with pytest.raises(OSError, match="MADV_DONTNEED"):
        pages.release(t, [(0, t.numel())])


def test_trim_is_a_no_op_off_the_cpu_layout():
    kv = KVCache(SHAPE, n_slots=2, max_context=64, device="cpu", dtype=torch.float32)
    assert kv.trim(0, 64) == 0  # nothing past the context
    t = torch.ones(8, 1024).t()  # not contiguous: not released
    assert pages.release(t, [(0, t.numel())]) == 0 and bool((t == 1).all())


@linux
def test_engine_releases_freed_slots_and_samples_the_same(make_engine, prompts, monkeypatch):
    """Two slots, six conversations (evictions, swaps, continuations): the engine gives the
    evicted slots' pages back, and every token and logprob equals a run that never trims."""
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)

    def run():
        eng = make_engine(max_seqs=2, max_context=256)
        outs = [eng.submit(p, params).result(timeout=60) for p in prompts[:6]]
        more = eng.submit_continue(outs[1].request_id, [13, 14], params).result(timeout=60)
        assert eng.stats()["evictions"] >= 4
        return [(o.token_ids, list(o.logprob)) for o in [*outs, more]]

    freed: list[int] = []
    trim = KVCache.trim

    def spy(self, slot, n):
        freed.append(trim(self, slot, n))
        return freed[-1]

    monkeypatch.setattr(KVCache, "trim", spy)
    trimmed = run()
    assert sum(freed) > 0
    monkeypatch.setattr(KVCache, "trim", lambda self, slot, n: 0)
    assert run() == trimmed
