"""The attribution table on the tiny model: rollouts that span two versions (a keep-mode
hot-load between the turns of one live request), each method recomputed."""

from __future__ import annotations

import numpy as np
import pytest

from provrl.conformance.attribution import METHODS, Rollout, recompute, table
from provrl.conformance.reference import new_version
from provrl.models import chat_ids
from provrl.provenance import SamplingParams


def test_attribution_on_mixed_version_rollouts(tiny, engine_on):
    engine = engine_on()
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=6)
    prompts = [
        chat_ids(tiny.tokenizer, [{"role": "user", "content": q}])
        for q in ("Who wrote Hamlet?", "Which ocean is the largest?")
    ]
    firsts = [engine.submit(p, params).result() for p in prompts]
    v1 = new_version(tiny, 1, 0.5, 0)
    engine.load_weights(v1, 1, "keep")
    rollouts = []
    for p, o1 in zip(prompts, firsts, strict=True):
        extra = p[-4:]
        o2 = engine.submit_continue(o1.request_id, extra, params).result()
        engine.release(o1.request_id)
        ids = p + o1.token_ids + extra + o2.token_ids
        act = np.zeros(len(ids), bool)
        act[len(p) : len(p) + len(o1.token_ids)] = True
        act[len(ids) - len(o2.token_ids) :] = True
        version = np.full(len(ids), -1)
        version[act] = np.concatenate([o1.version, o2.version])
        lp = np.full(len(ids), np.nan)
        lp[act] = np.concatenate([o1.logprob, o2.logprob])
        assert int(o2.kv_min.min()) == 0 < int(o2.version.min())  # stale KV under v1
        rollouts.append(Rollout(np.array(ids), act, version, lp, params))
    weights = {0: tiny.model.state_dict(), 1: v1}
    rec = recompute(rollouts, tiny, weights.__getitem__, target_version=1)
    rows = table(rec)
    assert set(rows) == set(METHODS)
    assert rows["exact"]["token_abs_err_max"] == 0.0
    # per-token versions on a fresh KV: exact on the turn-1 tokens (their KV was fresh), off
    # by the KV staleness on the turn-2 tokens
    mask = rec.mask
    v_tok_err = (rec.logb["exact"] - rec.logb["v_token"]).abs()
    turn1 = [(i, np.flatnonzero(r.is_action)[:6]) for i, r in enumerate(rollouts)]
    assert max(float(v_tok_err[i, t].max()) for i, t in turn1) < 1e-3
    assert rows["v_token"]["token_abs_err_max"] > 1e-3
    # one version per rollout (v_start = 0): exact on turn 1, blind to the swap on turn 2
    # (which of v_start and v_token errs more is an empirical question: the table's)
    v_start_err = (rec.logb["exact"] - rec.logb["v_start"]).abs()
    assert max(float(v_start_err[i, t].max()) for i, t in turn1) < 1e-3
    assert rows["v_start"]["token_abs_err_max"] > 1e-3
    # on-policy: behaviour = target, so every weight is 1
    assert rows["on_policy"]["ess_frac"] == pytest.approx(1.0)
    assert rows["on_policy"]["clip_share_token"] == 0.0
    assert int(mask.sum()) == rows["exact"]["tokens"] == 24


def test_reference_logits_of_chosen_rows_equal_the_full_forward(tiny):
    """``Reference.logits(ids, rows)`` runs the LM head on those rows only: the same values as
    the full forward's rows (what recompute reads at the action positions)."""
    from provrl.conformance.reference import Reference

    ref = Reference(tiny)
    ids = chat_ids(tiny.tokenizer, [{"role": "user", "content": "Which ocean is the largest?"}])
    rows = [0, 3, len(ids) - 1]
    full = ref.logits(ids)
    some = ref.logits(ids, rows=rows)
    assert some.shape == (len(rows), full.shape[1])
    assert np.allclose(some.numpy(), full[rows].numpy(), atol=1e-5)
