"""RL trainer knobs: learning-rate decay, masking truncated completions, the entropy bonus
and the tokenizer check, on real trajectories of the tiny model."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import even_fraction, sample_group

from provrl.objectives.config import AdvantageConfig
from provrl.provenance import Identity, ProvenanceError
from provrl.train.config import RLConfig
from provrl.train.rl import RLTrainer, prepare_batch
from provrl.train.schedule import lr_at


@pytest.fixture(scope="module")
def group(tiny, prompts):
    return sample_group(tiny.model, prompts[0][1], task_id="t0", n=4, max_new_tokens=5,
                        reward=even_fraction, seed=0)  # fmt: skip


def test_lr_schedule_hand_values():
    assert [lr_at(s, 10, 1.0, 2, "linear", 0.0) for s in (0, 1, 2, 9, 20)] == [
        0.5, 1.0, 1.0, 0.0, 0.0
    ]  # fmt: skip
    assert lr_at(2, 10, 1.0, 2, "cosine", 0.2) == pytest.approx(1.0)
    assert lr_at(9, 10, 1.0, 2, "cosine", 0.2) == pytest.approx(0.2)
    assert lr_at(5, 10, 1.0, 0, "constant", 0.2) == 1.0
    with pytest.raises(ValueError, match="lr_decay_steps > warmup_steps"):
        RLConfig(lr_schedule="linear")


def test_rl_learning_rate_decays_over_the_optimizer_steps(tiny, group):
    cfg = RLConfig(lr=1e-4, lr_schedule="linear", lr_decay_steps=3, min_lr_ratio=0.0)
    tr = RLTrainer(copy.deepcopy(tiny.model), cfg, pad_token_id=tiny.tokenizer.pad_token_id)
    lrs = [tr.step(group).metrics["lr"] for _ in range(4)]
    assert lrs == pytest.approx([1e-4, 5e-5, 0.0, 0.0])


def test_truncated_trajectories_count_in_the_baseline_but_not_the_loss(tiny, group):
    trajs = copy.deepcopy(group)
    trajs[0].meta["finish"] = "token_budget"
    trajs[1].meta["finish"] = "answer"
    pad = tiny.tokenizer.pad_token_id
    kept, m = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig(),
                            mask_truncated=True)  # fmt: skip
    every, _ = prepare_batch(trajs, pad_token_id=pad, vocab_size=49152, cfg=AdvantageConfig())
    torch.testing.assert_close(kept.advantages, every.advantages)  # same group baseline
    assert m["truncated_frac"] == 0.25
    assert not kept.loss_mask[0].any() and torch.equal(kept.loss_mask[1:], every.mask[1:])
    # and the update ignores row 0 entirely: changing one of its actions changes nothing
    cfg = RLConfig(lr=1e-3, mask_truncated=True, advantages=AdvantageConfig(std_normalise=False))
    other = copy.deepcopy(trajs)
    other[0].token_id[-1] = (int(other[0].token_id[-1]) + 1) % 1000  # a different action

    def update(ts):
        tr = RLTrainer(copy.deepcopy(tiny.model), cfg, pad_token_id=pad)
        return tr.step(ts).state_dict["model.norm.weight"]

    torch.testing.assert_close(update(trajs), update(other), atol=0, rtol=0)


def test_entropy_bonus_in_the_trainer_raises_the_entropy(tiny, group):
    """With all rewards equal (A = 0) the only force is the bonus: entropy goes up."""
    flat = copy.deepcopy(group)
    for t in flat:
        t.reward = 1.0
    pad = tiny.tokenizer.pad_token_id
    cfg = RLConfig(lr=3e-3, objective={"entropy_coef": 1.0})  # type: ignore[arg-type]
    tr = RLTrainer(copy.deepcopy(tiny.model), cfg, pad_token_id=pad)
    before = tr.step(flat).metrics
    after = tr.step(flat).metrics
    assert before["entropy_bonus"] > 0 and after["entropy"] > before["entropy"]


def test_the_trainer_refuses_another_tokenizers_trajectories(tiny, group):
    trajs = copy.deepcopy(group)
    trajs[2].policy = Identity("m", "f", {"tokenizer": {"name": "qwen", "sha256": "sha256:ab"}})
    tr = RLTrainer(copy.deepcopy(tiny.model), RLConfig(), pad_token_id=0,
                   tokenizer=tiny.tokenizer_identity)  # fmt: skip
    with pytest.raises(ProvenanceError, match=r"RL step: trajectory .* was tokenized by 'qwen'"):
        tr.step(trajs)
