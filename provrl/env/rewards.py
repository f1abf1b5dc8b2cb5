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

import importlib
import math
import numbers
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from provrl.env.prompts import Message
from provrl.env.tasks import Task

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


def call_cost_at(cost: float, warmup: int, version: int) -> float:
    """The per-call cost of an episode whose first action was sampled under ``version``:

        c(v) = c · min(1, v / W)   (W = ``warmup``; W = 0: c from the start),

    a cost that rises over the first W policy versions (``env.agent.tool_call_cost_warmup``)."""
    if warmup <= 0:
        return cost
    return cost * min(1.0, max(0, version) / warmup)


def contains_answer(text: str, answers: Iterable[str]) -> bool:
    """Whether any normalised answer occurs as whole words in the normalised ``text``."""
    t = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(a)} " in t for a in answers if normalize_answer(a))


# ----------------------------------------------------------------------------- reward functions
# ``env.agent.rewards`` replaces the formula above with a weighted sum of named functions:
#
#     reward(episode) = Σ_i w_i · r_i(episode)          (w = env.agent.reward_weights, or all 1)
#
# Each r_i is a built-in (em, f1, format, outcome), a function registered in this process
# (register_reward; what provrl.GRPOTrainer does with the callables it is given), or an
# importable ``module:function`` with TRL's reward signature. Every r_i(episode) is also
# recorded in the trajectory's metrics as ``reward/<name>``.


@dataclass(frozen=True)
class Episode:
    """A finished episode, as a reward function sees it."""

    task: Task
    """The task: question, answers, and ``columns`` (the dataset row it was read from)."""
    prediction: str | None
    """The answer the agent gave (None: it gave none)."""
    prompt: list[Message]
    """The chat messages of the prompt: instructions, worked examples, the question."""
    completion: list[Message]
    """What followed, in order: assistant turns and tool results (role
    ``env.agent.observation_role``); it always ends with an assistant turn."""
    completion_ids: list[int]
    """Every token id after the prompt (sampled and tool-result ids alike)."""
    format_ok: bool
    """A well-formed answer and no malformed call."""
    tool_calls: int
    """Search and open calls that ran."""


EpisodeReward = Callable[[Episode], float | None]
"""One reward function: a finished episode → a score (None: no opinion, counts as 0)."""

TRLReward = Callable[..., Sequence[float | None]]
"""A reward function with TRL's signature: ``fn(prompts=[...], completions=[...],
completion_ids=[...], **columns) -> [float | None, ...]``, one score per completion; every
argument is a list (here of one item: provrl scores each episode as it finishes).
``completions[i]`` is the episode's messages after the prompt (TRL's conversational
format); the dataset's columns (``question``, ``answer``, any other) are keyword
arguments."""


class RewardError(ValueError):
    """A reward function is unknown, or returned something that is not a finite score."""


def trl_reward(fn: TRLReward, name: str | None = None) -> EpisodeReward:
    """``fn`` (TRL's signature, :data:`TRLReward`) as an :data:`EpisodeReward`: called with
    one-item lists of the episode's prompt, completion, completion ids and its dataset
    columns (``task.columns``; a world task's record without its oracle plan)."""
    label: str = name or str(getattr(fn, "__name__", repr(fn)))

    def score(e: Episode) -> float | None:
        row = e.task.columns or {
            k: v for k, v in e.task.to_json().items() if k not in ("oracle", "columns")
        }
        clash = {"prompts", "completions", "completion_ids"} & set(row)
        if clash:
            raise RewardError(
                f"reward {label!r}: the dataset column {sorted(clash)[0]!r} has the name of "
                "an argument TRL's reward functions receive; rename the column"
            )
        got = fn(
            prompts=[e.prompt],
            completions=[e.completion],
            completion_ids=[e.completion_ids],
            **{k: [v] for k, v in row.items()},
        )
        if not isinstance(got, Sequence) or isinstance(got, str) or len(got) != 1:
            raise RewardError(
                f"reward {label!r} returned {str(got)[:60]!r}; a TRL reward function returns "
                "a list with one float (or None) per completion"
            )
        return got[0]

    score.__name__ = label
    return score


def _em(e: Episode) -> float:
    return exact_match(e.prediction, e.task.answers)


def _f1(e: Episode) -> float:
    return token_f1(e.prediction, e.task.answers)


def _format(e: Episode) -> float:
    return float(e.format_ok)


BUILTIN_REWARDS: dict[str, EpisodeReward] = {"em": _em, "f1": _f1, "format": _format}
"""em: exact match with aliases; f1: token F1; format: 1 for a well-formed answer and no
malformed call, else 0. (``outcome``, env.agent's own formula, is built from the config.)"""

_REGISTERED: dict[str, EpisodeReward] = {}


def register_reward(name: str, fn: EpisodeReward) -> None:
    """Make ``fn`` the reward function ``name`` in this process (``env.agent.rewards``
    names it). A built-in name is refused; registering a name again replaces it."""
    if name in BUILTIN_REWARDS or name == "outcome":
        raise RewardError(f"reward name {name!r} is a built-in; register it under another name")
    if not name or ":" in name or "/" in name:
        raise RewardError(f"reward name {name!r}: a non-empty name without ':' or '/'")
    _REGISTERED[name] = fn


def reward_label(name: str) -> str:
    """The metric name of reward ``name``: ``reward/<function>`` (a ``module:function``
    is labelled by its function)."""
    return "reward/" + name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def reward_function(name: str, outcome: EpisodeReward) -> EpisodeReward:
    """The function ``name`` stands for: a built-in, ``outcome`` (given: it depends on the
    agent config), a registered name, or ``module:function`` (TRL's signature)."""
    if name == "outcome":
        return outcome
    if name in BUILTIN_REWARDS:
        return BUILTIN_REWARDS[name]
    if name in _REGISTERED:
        return _REGISTERED[name]
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise RewardError(f"reward {name!r}: cannot import it ({e})") from None
        return trl_reward(fn, name)
    known = ", ".join([*BUILTIN_REWARDS, "outcome", *_REGISTERED])
    raise RewardError(
        f"reward {name!r} is not a built-in or registered in this process (known: {known}); "
        "name an importable function as 'module:function', or give the callable to "
        "provrl.GRPOTrainer again"
    )


@dataclass(frozen=True)
class RewardSum:
    """reward(episode) = Σ_i w_i · r_i(episode), with every r_i(episode) kept for the
    trajectory's metrics (``reward/<name>``; a None score counts 0 and is not recorded)."""

    names: tuple[str, ...]
    functions: tuple[EpisodeReward, ...]
    weights: tuple[float, ...]

    def __call__(self, e: Episode) -> tuple[float, dict[str, float]]:
        total, parts = 0.0, dict[str, float]()
        for name, fn, w in zip(self.names, self.functions, self.weights, strict=True):
            r = fn(e)
            if r is None:
                continue
            if isinstance(r, bool) or not isinstance(r, numbers.Real) or not math.isfinite(r):
                raise RewardError(
                    f"reward {name!r} returned {r!r} for task {e.task.task_id}; a finite "
                    "float (or None) is expected"
                )
            parts[reward_label(name)] = float(r)
            total += w * float(r)
        return total, parts


def reward_sum(names: Sequence[str], weights: Sequence[float], outcome: EpisodeReward) -> RewardSum:
    """The :class:`RewardSum` of ``names`` (each resolved by :func:`reward_function`) with
    ``weights`` (empty: all 1)."""
    if weights and len(weights) != len(names):
        raise RewardError(
            f"reward_weights has {len(weights)} weights for {len(names)} reward functions"
        )
    fns = tuple(reward_function(n, outcome) for n in names)
    return RewardSum(tuple(names), fns, tuple(weights) or (1.0,) * len(names))
