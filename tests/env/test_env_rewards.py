"""Rewards: normalisation, exact match with aliases, token F1, format penalty."""

from __future__ import annotations

import pytest

from provrl.env.rewards import contains_answer, exact_match, normalize_answer, reward, token_f1


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
