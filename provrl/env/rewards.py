"""Outcome rewards: exact match and token F1 after SQuAD-style normalisation.

normalise(s) = collapse_spaces(remove_articles(remove_punctuation(lower(s))))

    EM(â, A)  = max_{a ∈ A} 1[normalise(â) = normalise(a)]
    F1(â, A)  = max_{a ∈ A} 2·P·R / (P + R),  P = |â ∩ a| / |â|,  R = |â ∩ a| / |a|

with â, a as bags of normalised tokens and A = {answer} ∪ aliases. Punctuation is removed
(so ``48,213`` = ``48213``) and a, an, the are dropped (``the Halvex Institute`` =
``Halvex Institute``).

    reward = score · (1 − c · calls) − format_penalty · 1[no well-formed answer, or any malformed call]

where score is EM or F1 (``AgentConfig.reward``) and c is ``AgentConfig.tool_call_cost``
(the search budget lever: among correct episodes, fewer tool calls score higher).
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation + "‘’“”–—")


def normalize_answer(s: str) -> str:
    """Lower-case, strip accents and punctuation, drop articles, collapse whitespace."""
    s = unicodedata.normalize("NFKD", s)
    s = "".join(ch for ch in s if not unicodedata.combining(ch))
    s = s.lower().translate(_PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str | None, answers: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised answer, else 0.0."""
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(a) for a in answers))


def token_f1(prediction: str | None, answers: Iterable[str]) -> float:
    """Best token-level F1 of the prediction against any answer."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for a in answers:
        gold = normalize_answer(a).split()
        if not pred or not gold:
            best = max(best, float(pred == gold))
            continue
        common = sum((Counter(pred) & Counter(gold)).values())
        if common == 0:
            continue
        p, r = common / len(pred), common / len(gold)
        best = max(best, 2 * p * r / (p + r))
    return best


def reward(
    prediction: str | None,
    answers: Iterable[str],
    *,
    kind: str = "em",
    format_ok: bool = True,
    format_penalty: float = 0.0,
    tool_calls: int = 0,
    tool_call_cost: float = 0.0,
) -> float:
    """score · (1 − tool_call_cost · tool_calls) − format_penalty · 1[not format_ok]; score
    is EM (``kind='em'``) or F1. The tool-call cost scales the score, so it only ever
    applies to (partly) correct answers: a failure is never made cheaper."""
    answers = list(answers)
    score = exact_match(prediction, answers) if kind == "em" else token_f1(prediction, answers)
    score *= 1.0 - tool_call_cost * tool_calls
    return score - (0.0 if format_ok else format_penalty)


def contains_answer(text: str, answers: Iterable[str]) -> bool:
    """Whether any normalised answer occurs as whole words in the normalised ``text``."""
    t = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(a)} " in t for a in answers if normalize_answer(a))
