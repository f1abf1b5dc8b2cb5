"""The learner role: save / restore resumes the update sequence exactly, and the trainer as a
Ray actor computes the same update as the trainer in this process — weights, metrics and
checkpoint — while its weights reach the caller only as an object-store reference."""

from __future__ import annotations

import copy
import dataclasses
import os

import pytest
import torch
from conftest import even_fraction, sample_group

from provrl.models import load_model
from provrl.report.metrics import MetricsWriter, read_metrics
from provrl.train.config import RLConfig
from provrl.train.learner import OPTIMIZER_FILE, LocalLearner

CFG = RLConfig(lr=1e-3)


def batch(model, prompts, seed: int):
    out = []
    for j, (task_id, ids) in enumerate(prompts[:2]):
        out += sample_group(
            model, ids, task_id=task_id, n=4, max_new_tokens=6, reward=even_fraction, seed=seed + j
        )
    return out


def own(tiny):
    """A LoadedModel over a copy of the session's tiny weights (the learner trains it)."""
    return dataclasses.replace(tiny, model=copy.deepcopy(tiny.model))


@pytest.fixture(scope="module")
def batches(tiny, prompts):
    return [batch(tiny.model, prompts, seed) for seed in (0, 10)]


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_restored_learner_continues_exactly_where_the_saved_one_was(tiny, batches, tmp_path):
    a = LocalLearner(own(tiny), CFG, version=0)
    a.step(batches[0])
    a.save(tmp_path / "ckpt", kind="rl", version=1)
    assert (tmp_path / "ckpt" / OPTIMIZER_FILE).is_file()
    second = a.step(batches[1])

    b = LocalLearner(load_model(str(tmp_path / "ckpt")), CFG, version=1, optimizer_state=tmp_path / "ckpt")  # fmt: skip
    again = b.step(batches[1])
    assert again.version == second.version == 2
    assert same_weights(again.weights, second.weights)  # AdamW moments and step count restored


def test_an_unreadable_optimizer_state_names_the_file(tiny, tmp_path):
    (tmp_path / OPTIMIZER_FILE).write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match=f"{OPTIMIZER_FILE}: unreadable optimizer state"):
        LocalLearner(own(tiny), CFG, version=0, optimizer_state=tmp_path)


def test_the_trainer_actor_computes_the_in_process_update(tiny, batches, tmp_path):
    ray = pytest.importorskip("ray")
    from provrl.distributed.config import RayConfig
    from provrl.distributed.trainer import RayLearner
    from provrl.distributed.weights import Published, unpack_state_dict

    local = LocalLearner(own(tiny), CFG, version=0)
    expected = [local.step(b) for b in batches]

    metrics = MetricsWriter(tmp_path / "m", tensorboard=False)
    learner = RayLearner(
        tiny, CFG, RayConfig(num_cpus=1, object_store_mb=128), version=0, seed=0, threads=1,
        metrics=metrics,
    )  # fmt: skip
    try:
        info = learner.info()
        assert info["where"] == "ray-actor" and info["pid"] != os.getpid() and info["threads"] == 1
        got = [learner.step(b) for b in batches]
        assert learner.version == 2
        for g, e in zip(got, expected, strict=True):
            assert isinstance(g.weights, Published) and g.version == e.version
            assert same_weights(unpack_state_dict(ray.get(g.weights.ref)), e.weights)
            assert g.metrics["loss"] == e.metrics["loss"]
        learner.save(tmp_path / "ckpt", kind="rl", version=2)
    finally:
        learner.close()
    metrics.close()
    rows = read_metrics(tmp_path / "m" / "metrics.jsonl")  # replayed from the actor
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["rl/loss"] for r in rows] == [e.metrics["loss"] for e in expected]
    saved = load_model(str(tmp_path / "ckpt")).model.state_dict()
    assert same_weights(saved, expected[-1].weights) and (tmp_path / "ckpt" / OPTIMIZER_FILE).is_file()  # fmt: skip


def test_a_nan_gradient_is_refused_and_leaves_the_learner_as_it_was(tiny, batches, monkeypatch):
    """An injected NaN gradient (``PROVRL_FAULT=rl.nan_grad``): the step publishes nothing,
    keeps the version, and the next step is exactly the step an untouched learner takes."""
    from provrl import failpoints

    clean = LocalLearner(own(tiny), CFG, version=0)
    expected = clean.step(batches[0])

    a = LocalLearner(own(tiny), CFG, version=0)
    before = {k: v.clone() for k, v in a.lm.model.state_dict().items()}
    failpoints.reset()
    monkeypatch.setenv("PROVRL_FAULT", "rl.nan_grad:1")
    refused = a.step(batches[0])
    assert refused.skipped == "grad_norm is nan"
    assert refused.weights is None and refused.version == a.version == 0
    assert same_weights(a.lm.model.state_dict(), before)
    again = a.step(batches[0])  # the fault fired once
    assert again.skipped is None and again.version == 1
    assert same_weights(again.weights, expected.weights)


def test_a_refused_step_after_an_optimizer_step_rolls_back_to_the_saved_copy(
    tiny, batches, tmp_path, monkeypatch
):
    """Two minibatches, the second's gradient NaN: the first optimizer step already moved
    the weights, so the learner puts back the last saved weights and optimizer state."""
    from provrl import failpoints

    cfg = RLConfig(lr=1e-3, minibatches=2)
    a = LocalLearner(own(tiny), cfg, version=0)
    a.step(batches[0])
    a.save(tmp_path / "ckpt", kind="rl", version=1)
    saved = {k: v.clone() for k, v in a.lm.model.state_dict().items()}
    expected = LocalLearner(load_model(str(tmp_path / "ckpt")), cfg, version=1, optimizer_state=tmp_path / "ckpt").step(batches[1])  # fmt: skip

    failpoints.reset()
    monkeypatch.setenv("PROVRL_FAULT", "rl.nan_grad:2")  # the second minibatch of the step
    refused = a.step(batches[1])
    assert refused.skipped is not None and refused.version == 1
    assert same_weights(a.lm.model.state_dict(), saved)
    again = a.step(batches[1])
    assert again.version == 2 and same_weights(again.weights, expected.weights)


def test_the_guard_counts_refused_steps_and_stops_after_the_limit():
    import warnings

    from provrl.train.learner import NonFiniteError, NonFiniteGuard, NonFiniteWarning, Update

    guard = NonFiniteGuard(limit=2)
    bad = Update(0, None, {}, skipped="grad_norm is nan")
    with pytest.warns(NonFiniteWarning, match="rl step 1: update not finite"):
        guard.skipped(bad, 1)
    assert guard.since_last_step() == 1 and guard.since_last_step() == 0  # a step was taken
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NonFiniteWarning)
        guard.skipped(bad, 2)
    with pytest.raises(NonFiniteError, match=r"rl step 2: 2 updates in a row were not finite") as e:
        guard.skipped(bad, 2)
    assert "\n" not in str(e.value) and guard.total == 3


def test_a_resumed_learner_keeps_the_start_policy_as_its_kl_reference(tmp_path):
    """With a KL penalty, π_ref is the run's start policy: at version 0 the learner copies
    the model it starts from; resumed (version > 0) from a checkpoint with other weights, it
    loads the start policy instead of copying the checkpoint — and refuses to guess."""
    from provrl.objectives.config import ObjectiveConfig

    start, resumed = load_model("tiny", seed=0), load_model("tiny", seed=1)
    start_dir = tmp_path / "start"
    start.model.save_pretrained(start_dir)
    start.tokenizer.save_pretrained(start_dir)
    rl = RLConfig(objective=ObjectiveConfig(kl_coef=0.1))

    def same(a, b) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))

    fresh = LocalLearner(start, rl, version=0)
    assert same(fresh.trainer.ref_model, start.model)
    later = LocalLearner(resumed, rl, version=3, reference=start_dir)
    assert same(later.trainer.ref_model, start.model)
    assert not same(later.trainer.ref_model, resumed.model)
    assert not any(p.requires_grad for p in later.trainer.ref_model.parameters())
    with pytest.raises(ValueError, match="KL reference"):
        LocalLearner(load_model("tiny", seed=1), rl, version=3)
