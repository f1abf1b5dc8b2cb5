"""Packed teacher forcing (provrl.train.packing): the same per-token logprobs and gradients as
the plain padded forward, whatever the lengths, with each group's shared prefix laid out once."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from provrl.train.logprobs import token_logprobs, token_logprobs_chunked
from provrl.train.packing import (
    common_prefix,
    cut_rows,
    pack,
    plan_micro_batches,
    use_packed_attention,
)


def _batch(lengths, prefixes, groups, seed=0, vocab=49152):  # -> ids, attn, act, lengths
    """Right-padded rows: rows of a group share their first ``prefixes[group]`` ids; each
    row's second half is actions (with a non-action gap, like a tool result)."""
    g = torch.Generator().manual_seed(seed)
    B, T = len(lengths), max(lengths)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    shared = {gr: torch.randint(0, vocab, (p,), generator=g) for gr, p in prefixes.items()}
    act = torch.zeros(B, T, dtype=torch.bool)
    for b, (n, gr) in enumerate(zip(lengths, groups, strict=True)):
        p = prefixes[gr]
        ids[b, :p] = shared[gr]
        ids[b, n:] = 0
        act[b, max(p, n // 2) : n] = True
        act[b, (3 * n) // 4 : (3 * n) // 4 + 2] = False  # an observation inside the turn
        act[b, n - 1] = True
    attn = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    return ids, attn, act, torch.tensor(lengths)


@pytest.fixture(scope="module")
def packed_model(tiny):
    m = copy.deepcopy(tiny.model).float()
    use_packed_attention(m)
    return m


CASES = {
    # very different lengths, two groups sharing prompts, and a lone row
    "ragged": ([40, 7, 23, 31, 12, 58], {0: 5, 1: 9, 2: 0}, [0, 0, 1, 1, 1, 2]),
    # a whole row inside the group's common prefix but its last action; a row of no actions
    "short": ([10, 10, 30, 6], {0: 8, 1: 0}, [0, 0, 0, 1]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("share", [True, False])
def test_packed_logprobs_equal_the_padded_forward(packed_model, case, share):
    lengths, prefixes, groups = CASES[case]
    ids, attn, act, lens = _batch(lengths, prefixes, groups)
    if case == "short":
        act[3] = False
    layout = pack(ids, lens, act, range(len(lengths)), share_prefix=share, min_shared=4)
    with torch.no_grad():
        plain = token_logprobs(packed_model, ids, attn, temperature=0.8)
        out = token_logprobs_chunked(
            packed_model, ids, attn, positions=act, temperature=0.8, chunk_tokens=7, layout=layout
        )
    # every action token is computed: none lost, whatever its length or place
    assert torch.equal(out.logprobs != 0, act & (plain != 0))
    torch.testing.assert_close(out.logprobs[act], plain[act], atol=1e-5, rtol=0)
    if share:  # each group's prefix once: fewer tokens than the rows hold
        assert layout.tokens < int(lens.sum())


def test_packed_gradients_equal_the_padded_forward(packed_model):
    lengths, prefixes, groups = CASES["ragged"]
    ids, attn, act, lens = _batch(lengths, prefixes, groups, seed=3)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    grads = []
    for layout in (None, pack(ids, lens, act, range(len(lengths)), min_shared=4)):
        packed_model.zero_grad(set_to_none=True)
        if layout is None:
            lp = token_logprobs(packed_model, ids, attn)
        else:
            lp = token_logprobs_chunked(
                packed_model, ids, attn, positions=act, chunk_tokens=5, layout=layout
            ).logprobs
        (lp * weights * act).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in packed_model.parameters()]))
    rel = (grads[0] - grads[1]).norm() / grads[0].norm()
    assert float(rel) <= 1e-4


def test_the_trie_shares_each_common_prefix_once():
    # three rows share 6 ids, two of them 12; a fourth row shares nothing
    ids, _, act, lens = _batch([30, 30, 30, 15], {0: 6, 1: 0}, [0, 0, 0, 1])
    ids[1, 6:12] = ids[0, 6:12]
    layout = pack(ids, lens, act, range(4), min_shared=4)
    cuts = [int(np.flatnonzero(act[r].numpy())[-1]) for r in range(4)]
    assert layout.tokens == 12 + (cuts[0] - 12) + (cuts[1] - 12) + (cuts[2] - 6) + cuts[3]
    for r in range(4):  # each row reads its own tokens at its own positions
        idx = layout.index[r, : cuts[r]]
        assert torch.equal(layout.input_ids[0, idx], ids[r, : cuts[r]])
        assert layout.position_ids[0, idx].tolist() == list(range(cuts[r]))
        assert bool((layout.index[r, cuts[r] :] == -1).all())
    for n in layout.nodes:  # ancestors come first and end where the node starts
        ctx = sum(layout.nodes[a].length for a in n.ancestors)
        assert ctx == n.context and all(layout.nodes[a].start < n.start for a in n.ancestors)
    # spans shorter than min_shared are repeated, not shared
    assert pack(ids, lens, act, range(4), min_shared=64).tokens == sum(cuts)


def test_common_prefix():
    a, b = np.array([1, 2, 3, 4]), np.array([1, 2, 9, 4])
    assert common_prefix([a, b], 10) == 2
    assert common_prefix([a, a], 3) == 3
    assert common_prefix([a], 4) == 0
    assert common_prefix([a, a, b], 4) == 2


def test_unpacked_forwards_of_the_switched_model_are_sdpa(tiny, packed_model):
    ids = torch.randint(0, 49152, (2, 9), generator=torch.Generator().manual_seed(0))
    attn = torch.ones(2, 9, dtype=torch.bool)
    attn[1, 6:] = False
    with torch.no_grad():
        a = token_logprobs(tiny.model.float(), ids, attn)
        b = token_logprobs(packed_model, ids, attn)
    torch.testing.assert_close(a[attn], b[attn], atol=1e-6, rtol=0)


def test_planned_micro_batches_hold_at_most_the_budget_of_layout_tokens():
    lengths = [40, 7, 23, 31, 12, 58, 40, 40]
    ids, _, act, lens = _batch(lengths, {0: 5, 1: 20, 2: 0}, [0, 0, 1, 1, 1, 2, 1, 1])
    seqs = cut_rows(ids, lens, act)
    whole = plan_micro_batches(range(8), seqs, 10**6, min_shared=4)
    assert whole == [list(range(8))]  # the plan's cost is the trie's exact size
    for budget in (30, 60, 100):
        plan = plan_micro_batches(range(8), seqs, budget, min_shared=4)
        assert sorted(r for g in plan for r in g) == list(range(8))
        for g in plan:
            tokens = pack(ids, lens, act, g, min_shared=4).tokens
            assert tokens <= budget or len(g) == 1
