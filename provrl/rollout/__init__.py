"""Rollouts: the agent loop, the collector, the one place an environment is built, evaluation.

``from provrl.rollout import build_env, Collector, evaluate`` — see docs/pipeline.md (the
collector) and docs/env.md (the agent loop, ``provrl eval``). The agent loop plays an
:class:`~provrl.engine.Engine` against the world of :mod:`provrl.env`; the collector turns
tasks into GRPO groups; :mod:`provrl.rollout.setup` builds the environment (search tool,
tools identity, worked examples, policy identity) and its engine from a config, for the warm
start, the probe, eval and both RL modes. Names load on first use.
"""

from provrl._lazy import lazy_exports

_EXPORTS = {
    # the agent loop
    "AgentEnv": "provrl.rollout.agent",
    "EpisodeCounts": "provrl.rollout.agent",
    "run_episode": "provrl.rollout.agent",
    "oracle_trajectory": "provrl.rollout.agent",
    "tools_identity": "provrl.rollout.agent",
    # the collector
    "Collector": "provrl.rollout.collector",
    "Group": "provrl.rollout.collector",
    # building the environment and its engine
    "build_env": "provrl.rollout.setup",
    "open_policy_env": "provrl.rollout.setup",
    "worked_examples": "provrl.rollout.setup",
    # evaluation
    "evaluate": "provrl.rollout.evaluate",
    "pass_at_k": "provrl.rollout.evaluate",
    "select_tasks": "provrl.rollout.evaluate",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
