"""The one place an agent environment and its engine are built from a config.

The warm start, the probe, eval and both RL modes all come here::

    tools  = agent_tools(world_dir, env_cfg)     search tool (env.search), its identity, and
                                                 the worked examples (env.agent.shots)
    engine = make_engine(lm, engine_cfg or engine_config(env_cfg, dtype), version=v)
    env    = build_env(engine, lm, world_dir, env_cfg, tools=tools)       an AgentEnv

:func:`open_policy_env` does all three for a policy name or checkpoint directory and closes
the engine on exit. ``make_engine`` is the run's engine factory
(:class:`~provrl.engine.api.EngineFactory`); the default is the in-process one,
:func:`provrl.engine.make_engine`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from provrl.engine.api import Engine, EngineFactory
from provrl.engine.config import EngineConfig, for_stage
from provrl.engine.factory import make_engine as local_engine
from provrl.env.build import check_search, load_split, search_backend
from provrl.env.config import EnvConfig
from provrl.env.oracle import run_oracle
from provrl.env.prompts import Message, question_message
from provrl.env.search import SearchBackend
from provrl.env.tasks import Task
from provrl.provenance import Identity
from provrl.rollout.agent import AgentEnv, tools_identity

if TYPE_CHECKING:  # models.loading imports torch; load_model is imported where it runs
    from provrl.models.loading import LoadedModel

SHOT_TIERS = (1, 2, 3, 4)
"""Tiers of the worked examples, in turn (a fifth shot is tier 1 again)."""


def engine_config(env_cfg: EnvConfig, *, dtype: str = "float32") -> EngineConfig:
    """The engine an environment runs on when the caller names none (a library call without
    a run config): the default :class:`EngineConfig` in ``dtype`` for ``eval.concurrency``
    agent loops and the eval seed, by the one rule :func:`provrl.engine.config.for_stage`."""
    base = EngineConfig(dtype=dtype)  # type: ignore[arg-type]
    return for_stage(base, env_cfg.eval.concurrency, seed=env_cfg.eval.seed)


@dataclass(frozen=True)
class AgentTools:
    """What the agent is given besides the policy: the search tool, the identity of the tool
    configuration (what trajectories and probe manifests record) and the worked examples."""

    backend: SearchBackend
    identity: Identity
    shots: Sequence[Sequence[Message]] = ()


def agent_tools(
    world_dir: str | os.PathLike[str] | None,
    env_cfg: EnvConfig,
    *,
    exclude_answers: Iterable[str] = (),
    shots: bool = True,
) -> AgentTools:
    """The search tool ``env_cfg.search`` names (:func:`provrl.env.build.search_backend`), its
    identity, and ``env_cfg.agent.shots`` worked examples — never on a task whose answer is in
    ``exclude_answers`` (``shots=False``: none, for callers that show no prompt)."""
    a = env_cfg.agent
    own = world_dir is None or env_cfg.search.backend != "sqlite" or env_cfg.search.index
    if shots and a.shots and own:
        raise ValueError(
            f"shots={a.shots}: worked examples are oracle dialogues on the built-in world's "
            "train tasks and its index; use shots=0 with your own tasks or search backend"
        )
    backend = search_backend(world_dir, env_cfg)
    check_search(backend)  # a dead retriever: one line now, not "search failed" per call
    tools = tools_identity(backend, env_cfg.search, a)
    examples: list[list[Message]] = []
    if shots and a.shots and world_dir is not None:
        examples = worked_examples(
            load_split(world_dir, "train"), a.shots, backend, env_cfg, set(exclude_answers)
        )
    return AgentTools(backend, tools, examples)


def worked_examples(
    train: Sequence[Task], shots: int, backend: Any, cfg: EnvConfig, exclude: set[str]
) -> list[list[Message]]:
    """``shots`` oracle dialogues on train tasks (tiers 1, 2, 3, 4, 1, …), never one whose
    answer entity is in ``exclude`` (splits are disjoint anyway)."""
    rng = np.random.default_rng([cfg.eval.seed, 17])
    out: list[list[Message]] = []
    for j in range(shots):
        tier = SHOT_TIERS[j % len(SHOT_TIERS)]
        pool = [t for t in train if t.tier == tier and t.answer_entity not in exclude]
        if not pool:
            raise ValueError(f"no train task of tier {tier} for a worked example")
        t = pool[int(rng.integers(len(pool)))]
        r = run_oracle(t, backend, cfg.search.k, cfg.agent.protocol, reasoning=cfg.agent.reasoning)
        if not r.solved:
            raise ValueError(
                f"worked example {t.task_id} is not solved by the oracle: {r.problems}"
            )
        out.append(r.messages(question_message(t.question)))
    return out


def env_policy_identity(lm: LoadedModel, **extra: Any) -> Identity:
    """The policy identity an environment's trajectories record for ``lm``: name, weights'
    fingerprint, dtype and tokenizer (:func:`provrl.models.policy_identity`), plus ``extra``."""
    from provrl.models.loading import policy_identity

    return policy_identity(lm, dtype=str(lm.model.dtype).removeprefix("torch."), **extra)


def build_env(
    engine: Engine,
    lm: LoadedModel,
    world_dir: str | os.PathLike[str] | None,
    env_cfg: EnvConfig,
    *,
    exclude_answers: Iterable[str] = (),
    extra: dict[str, Any] | None = None,
    tools: AgentTools | None = None,
) -> AgentEnv:
    """The agent environment for ``lm`` on ``engine``: the tools (:func:`agent_tools`, unless
    given) and the policy identity (``extra`` added to its config)."""
    if tools is None:
        tools = agent_tools(world_dir, env_cfg, exclude_answers=exclude_answers)
    policy = env_policy_identity(lm, **(extra or {}))
    return AgentEnv(
        engine,
        lm.tokenizer,
        tools.backend,
        env_cfg.agent,
        env_cfg.search,
        policy,
        tools.identity,
        tools.shots,
    )


@contextlib.contextmanager
def open_engine(
    lm: LoadedModel,
    env_cfg: EnvConfig,
    *,
    engine_cfg: EngineConfig | None = None,
    dtype: str = "float32",
    version: int = 0,
    make_engine: EngineFactory | None = None,
) -> Iterator[Engine]:
    """An engine serving ``lm`` — ``make_engine(lm, engine_cfg, version=v)``, by default the
    in-process one; ``engine_cfg`` defaults to :func:`engine_config` — closed on exit."""
    build: EngineFactory = make_engine or local_engine
    engine = build(lm, engine_cfg or engine_config(env_cfg, dtype=dtype), version=version)
    try:
        yield engine
    finally:
        engine.close()


@contextlib.contextmanager
def open_policy_env(
    policy: str,
    world_dir: str | Path,
    env_cfg: EnvConfig,
    *,
    engine_cfg: EngineConfig | None = None,
    dtype: str = "float32",
    exclude_answers: Iterable[str] = (),
    version: int = 0,
    make_engine: EngineFactory | None = None,
) -> Iterator[tuple[AgentEnv, LoadedModel]]:
    """Load ``policy`` (a model name or checkpoint dir), start an engine on it
    (:func:`open_engine`) and build its environment (:func:`build_env`); yield
    ``(env, loaded_model)`` and close the engine on exit."""
    from provrl.models.loading import load_model

    lm = load_model(policy, dtype=dtype)
    with open_engine(
        lm, env_cfg, engine_cfg=engine_cfg, dtype=dtype, version=version, make_engine=make_engine
    ) as engine:
        yield build_env(engine, lm, world_dir, env_cfg, exclude_answers=exclude_answers), lm
