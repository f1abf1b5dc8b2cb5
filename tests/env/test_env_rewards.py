"""Rewards: normalisation, exact match with aliases, token F1, format penalty."""

from __future__ import annotations

import pytest

from provrl.env.config import AgentConfig
from provrl.env.rewards import (
    call_cost_at,
    contains_answer,
    exact_match,
    normalize_answer,
    reward,
    token_f1,
)
from provrl.provenance import TrajectoryBuilder


def test_normalize():
    assert normalize_answer("  The Halvex   Institute! ") == "halvex institute"
    assert normalize_answer("48,213") == "48213"
    assert normalize_answer("Dûnmère") == "dunmere"


def test_exact_match_with_aliases():
    assert exact_match("the Nerith region", ["Nerith", "Nerith region"]) == 1.0
    assert exact_match("Nerith.", ["Nerith"]) == 1.0
    assert exact_match("Nerit", ["Nerith"]) == 0.0
    assert exact_match(None, ["x"]) == 0.0


def test_token_f1_hand_values():
    # pred {orlan, vesk, jr}, gold {orlan, vesk}: P = 2/3, R = 1 → F1 = 0.8
    assert token_f1("Orlan Vesk Jr", ["Orlan Vesk"]) == pytest.approx(0.8)
    assert token_f1("Vesk", ["Orlan Vesk"]) == pytest.approx(2 / 3)
    assert token_f1("nothing", ["Orlan Vesk"]) == 0.0
    assert token_f1("x", ["y", "x"]) == 1.0


def test_reward_and_penalty():
    assert reward("1971", ["1971"]) == 1.0
    assert reward("1971", ["1971"], format_ok=False, format_penalty=0.2) == pytest.approx(0.8)
    assert reward("Orlan", ["Orlan Vesk"], kind="f1") == pytest.approx(2 / 3)


def test_contains_answer_whole_words():
    assert contains_answer("born in 1971 in Dunmere", ["1971"])
    assert not contains_answer("born in the 1970s", ["1971"])
    assert not contains_answer("Dunmeres", ["Dunmere"])


# ----------------------------------------------------------------------------- reward functions
def _episode(prediction="Dunmere", columns=None, format_ok=True):
    from provrl.env.rewards import Episode
    from provrl.env.tasks import plain_task_from_json

    row = columns or {"question": "Where is Halvex?", "answer": ["Dunmere", "Dunmere City"]}
    task = plain_task_from_json(row, "x:1", 1, "train")
    completion = [{"role": "assistant", "content": f"<answer>{prediction}</answer>"}]
    return Episode(task, prediction, [], completion, [1, 2, 3], format_ok, 2)


def test_a_trl_reward_gets_the_episode_and_the_dataset_columns():
    from provrl.env.rewards import trl_reward

    seen = {}

    def correct(completions, answer, difficulty, **kwargs):
        seen.update(kwargs, answer=answer, difficulty=difficulty)
        return [float(answer[0][0] in completions[0][-1]["content"])]

    row = {"question": "Where is Halvex?", "answer": "Dunmere", "difficulty": 3}
    assert trl_reward(correct)(_episode(columns=row)) == 1.0
    assert seen["difficulty"] == [3] and seen["question"] == ["Where is Halvex?"]
    assert seen["completion_ids"] == [[1, 2, 3]] and seen["prompts"] == [[]]


def test_a_reward_sum_weighs_each_function_and_records_it():
    from provrl.env.rewards import register_reward, reward_sum, trl_reward

    register_reward("short", trl_reward(lambda completions, **kw: [-0.1 * len(completions[0])]))
    total, parts = reward_sum(["em", "short", "format"], [1.0, 2.0, 0.5], lambda e: 0.0)(_episode())
    assert parts == {"reward/em": 1.0, "reward/short": -0.1, "reward/format": 1.0}
    assert total == pytest.approx(1.0 - 0.2 + 0.5)
    total, parts = reward_sum(["f1", "outcome"], [], lambda e: 7.0)(_episode("Dunmere Town"))
    assert parts == {"reward/f1": pytest.approx(2 / 3), "reward/outcome": 7.0}  # P ½, R 1
    assert total == pytest.approx(7 + 2 / 3)


@pytest.mark.parametrize(
    ("fn", "match"),
    [
        (lambda completions, **kw: 1.0, "returns a list with one float"),
        (lambda completions, **kw: [float("nan")], "a finite float"),
        (lambda completions, **kw: ["yes"], "a finite float"),
    ],
)
def test_a_reward_that_returns_no_score_is_one_line(fn, match):
    from provrl.env.rewards import RewardError, register_reward, reward_sum, trl_reward

    register_reward("bad", trl_reward(fn, "bad"))
    with pytest.raises(RewardError, match=match) as e:
        reward_sum(["bad"], [], lambda e: 0.0)(_episode())
    assert "\n" not in str(e.value) and "'bad'" in str(e.value)


def test_a_none_score_counts_zero_and_is_not_recorded():
    from provrl.env.rewards import register_reward, reward_sum, trl_reward

    register_reward("abstain", trl_reward(lambda completions, **kw: [None]))
    assert reward_sum(["abstain", "em"], [], lambda e: 0.0)(_episode()) == (
        1.0,
        {"reward/em": 1.0},
    )


def test_unknown_and_imported_reward_names():
    from provrl.env.rewards import RewardError, reward_function

    with pytest.raises(RewardError, match="not a built-in or registered"):
        reward_function("nope", lambda e: 0.0)
    with pytest.raises(RewardError, match="cannot import it"):
        reward_function("no_such_module_x:f", lambda e: 0.0)
    fn = reward_function("reward_fixture:one_per_turn", lambda e: 0.0)
    assert fn(_episode()) == 1.0


def test_the_call_cost_rises_over_its_warmup_versions():
    """c(v) = c · min(1, v / W): nothing at version 0, half at W / 2, all from W on; W = 0 is
    the full cost from the start."""
    assert [call_cost_at(0.2, 4, v) for v in (0, 2, 4, 9)] == pytest.approx([0, 0.1, 0.2, 0.2])
    assert call_cost_at(0.2, 0, 0) == 0.2
    # a correct answer after two calls, at version 1 of a 4-version warmup
    assert reward("x", ["x"], tool_calls=2, tool_call_cost=call_cost_at(0.2, 4, 1)) == 0.9


def test_the_first_action_version_is_the_episodes_start():
    b = TrajectoryBuilder("t", "task")
    assert b.first_action_version is None
    b.add_prompt([1, 2])
    b.add_actions([3], logprob=[-0.1], kept_mass=[1.0], version=[5], kv_min=[5], kv_max=[5], replica=0)  # fmt: skip
    b.add_actions([4], logprob=[-0.1], kept_mass=[1.0], version=[6], kv_min=[5], kv_max=[6], replica=0)  # fmt: skip
    assert b.first_action_version == 5


def test_a_cost_warmup_needs_the_built_in_reward():
    with pytest.raises(ValueError, match="tool_call_cost_warmup"):
        AgentConfig(tool_call_cost=0.1, tool_call_cost_warmup=5, rewards=("em",))
