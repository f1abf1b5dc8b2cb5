"""The RL loop with the real engine: sample → train → hot-load → sample under the new version.

The engine (provrl.engine.LocalEngine) samples with its own fused Llama forward and records
log q per token; the trainer recomputes log π_θ teacher-forced with the HF model. After a
step, the trainer's state dict goes into the engine with a new version, and the next
trajectories must (a) carry that version and (b) be reproduced by the trainer's proximal
pass — the engine and the trainer agree on which policy generated each token.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from provrl.engine import EngineConfig, LocalEngine
from provrl.objectives.config import AdvantageConfig
from provrl.provenance import SamplingParams, Trajectory, TrajectoryBuilder
from provrl.train.config import RLConfig
from provrl.train.rl import RLTrainer, prepare_batch


def rollouts(engine, prompts, *, n: int, tokens: int, seed: int) -> list[Trajectory]:
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=seed + i) for i in range(n)
    ]
    futures = [
        (task_id, ids, i, engine.submit(ids, params[i], request_id=f"{task_id}-{seed}-{i}"))
        for task_id, ids in prompts
        for i in range(n)
    ]
    out = []
    for task_id, ids, i, fut in futures:
        turn = fut.result()
        engine.release(turn.request_id)
        b = TrajectoryBuilder(turn.request_id, task_id, sampling=params[i])
        b.add_prompt(ids)
        b.add_sampled(turn)
        actions = np.asarray(turn.token_ids)
        out.append(b.build(reward=float((actions % 2 == 0).mean())))
    return out


@pytest.fixture
def engine_and_model(tiny):
    lm = dataclasses.replace(tiny, model=copy.deepcopy(tiny.model))
    engine = LocalEngine(lm, EngineConfig(max_seqs=8, max_context=256, eos_stops=False))
    yield engine, lm.model
    engine.close()


def test_trainer_weights_hot_load_into_the_engine(tiny, prompts, engine_and_model):
    engine, model = engine_and_model
    pad = tiny.tokenizer.pad_token_id
    trainer = RLTrainer(model, RLConfig(lr=1e-3), pad_token_id=pad, version=engine.version)

    first = rollouts(engine, prompts[:2], n=4, tokens=5, seed=0)
    assert {int(v) for t in first for v in t.version[t.is_action]} == {0}
    result = trainer.step(first)
    # the engine's recorded logprobs and the trainer's π_θ agreed before the update
    assert result.metrics["kl_q_pi_k3_max"] < 1e-5 and result.metrics["ess_frac"] > 0.999

    report = engine.load_weights(result.state_dict, result.version, "keep")
    assert report.new_version == engine.version == trainer.version == 1

    second = rollouts(engine, prompts[:2], n=4, tokens=5, seed=100)
    assert {int(v) for t in second for v in t.version[t.is_action]} == {1}
    batch, _ = prepare_batch(second, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig())
    d = trainer.diagnostics(batch, trainer.proximal_pass(batch))
    assert d["lag_frac_0"] == 1.0
    assert d["kl_q_pi_k3_max"] < 1e-5 and d["ess_frac"] > 0.999  # the new weights sampled them
    # the old batch is now one version stale and measurably off-policy
    old_batch, _ = prepare_batch(first, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig())
    d_old = trainer.diagnostics(old_batch, trainer.proximal_pass(old_batch))
    assert d_old["lag_frac_1"] == 1.0 and d_old["kl_q_pi_k3"] > 1e-4
