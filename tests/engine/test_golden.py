"""The engine's outputs pinned (issue 33: speed work must not change what is sampled): the
tiny model, fixed prompts and seeds, top-k 5 at temperature 1 and top-k 20 with top-p 0.9 at 0.7, chunked prefill, the prefix
cache and a batch of concurrent requests — the sampled tokens must equal the recorded ones and
each token's log q the recorded value within float32 round-off (``TOL``; the recording was made
on one machine, and another CPU's kernels sum in another order).

A change that is *meant* to change the samples (a new sampling rule, another seed derivation)
re-records them: ``PROVRL_REGEN_GOLDEN=1 pytest tests/engine/test_golden.py`` — and says why
in its commit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from provrl.bench.engine import bench_prompts
from provrl.provenance import SamplingParams

GOLDEN = Path(__file__).parent / "data" / "golden_tiny.json"
TOL = 1e-4
CASES = {"t1-k5": {"temperature": 1.0, "top_k": 5}, "t07-k20-p09": {"temperature": 0.7, "top_k": 20, "top_p": 0.9}}  # fmt: skip
"""Top-k keeps the recording portable: the random tiny model's full distribution is nearly
uniform over 49,152 tokens (bins of ~2e-5, where another CPU's round-off could move a sampled
token across a boundary); its top 5-20 logits are ~1e-3 apart and their bins ~0.1 wide."""


def sample_all(make_engine, tiny) -> dict[str, list[dict[str, list]]]:
    """Every case: 6 prompts submitted together (sharing the chat template's prefix), 16
    tokens each, request i seeded with i."""
    eng = make_engine(
        max_seqs=8, max_context=256, eos_stops=False, prefill_chunk=16, dtype="float32"
    )
    prompts = bench_prompts(tiny.tokenizer, 6)
    out: dict[str, list[dict[str, list]]] = {}
    for name, p in CASES.items():
        futs = [eng.submit(ids, SamplingParams(max_new_tokens=16, seed=i, **p))  # type: ignore[arg-type]
                for i, ids in enumerate(prompts)]  # fmt: skip
        res = [f.result() for f in futs]
        for r in res:
            eng.release(r.request_id)
        out[name] = [
            {
                "tokens": list(map(int, r.token_ids)),
                "logprobs": [round(float(x), 6) for x in r.logprob],
            }
            for r in res
        ]
    return out


def test_the_engine_samples_what_it_sampled_when_recorded(make_engine, tiny):
    got = sample_all(make_engine, tiny)
    if os.environ.get("PROVRL_REGEN_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n")
        pytest.skip(f"re-recorded {GOLDEN}")
    want = json.loads(GOLDEN.read_text())
    assert set(got) == set(want)
    for name in want:
        for i, (g, w) in enumerate(zip(got[name], want[name], strict=True)):
            assert g["tokens"] == w["tokens"], f"{name}, request {i}: other tokens sampled"
            worst = max(abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"], strict=True))
            assert worst <= TOL, f"{name}, request {i}: log q moved by {worst:.1e}"
