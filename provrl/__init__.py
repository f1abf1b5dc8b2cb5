"""provrl — RL post-training of tool-using LLM agents with exact per-token provenance.

The names a custom loop needs (examples/custom_loop.py uses them top to bottom)::

    from provrl import load_model, LocalEngine, EngineConfig, Collector, build_env
    from provrl import RLTrainer, RLConfig, load_config, RunConfig

    lm      = load_model("tiny")                                  # models
    engine  = LocalEngine(lm, EngineConfig(max_seqs=8))           # rollout engine
    env     = build_env(engine, lm, world_dir, cfg.env)           # agent environment
    groups  = Collector(env, concurrency=8, seed=0).run(tasks, k=4)   # GRPO groups
    result  = RLTrainer(lm.model, cfg.rl, pad_token_id=0).step(trajectories)
    engine.load_weights(result.state_dict, result.version)       # hot-load, repeat

=================  ==========================================================================
models             :func:`load_model`, :class:`LoadedModel`, :func:`save_checkpoint`
engine             :class:`LocalEngine`, :class:`EngineConfig`, :class:`Engine` (the protocol),
                   :class:`TurnOutput`, :func:`generate`
environment        :class:`Task`, :func:`read_task_file`, :func:`ensure_world`, :func:`load_split`,
                   :func:`reward`, :class:`EnvConfig`
rollouts           :class:`AgentEnv`, :func:`run_episode`, :class:`Collector`, :class:`Group`,
                   :func:`build_env`
training           :class:`RLTrainer`, :class:`RLConfig`, :func:`run_sft`, :class:`SFTConfig`
trajectories       :class:`Trajectory`, :class:`SamplingParams`, :class:`TrajectoryWriter`,
                   :func:`read_trajectories`
configuration      :class:`RunConfig`, :func:`load_config`
TRL's front doors  :class:`GRPOTrainer`, :class:`GRPOConfig` (the whole ``provrl run`` on your
                   QA data and reward functions), :class:`SFTTrainer`, :class:`SFTConfig`
                   (provrl's SFT section, TRL's names, plus ``output_dir``)
metrics            :class:`MetricsWriter`
=================  ==========================================================================

Names load on first use (``import provrl`` does not import torch). Each room's own
package exports the rest of its public names: ``provrl.engine``, ``provrl.env``,
``provrl.rollout``, ``provrl.objectives``, ``provrl.train``, ``provrl.models``,
``provrl.report``; the whole job is ``provrl run`` (``provrl.pipeline.run.run_pipeline``).
"""

from provrl._lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "load_model": "provrl.models",
    "LoadedModel": "provrl.models",
    "save_checkpoint": "provrl.models",
    "LocalEngine": "provrl.engine",
    "EngineConfig": "provrl.engine",
    "Engine": "provrl.engine",
    "TurnOutput": "provrl.engine",
    "generate": "provrl.engine",
    "AgentEnv": "provrl.rollout",
    "run_episode": "provrl.rollout",
    "Task": "provrl.env",
    "read_task_file": "provrl.env",
    "ensure_world": "provrl.env",
    "load_split": "provrl.env",
    "reward": "provrl.env",
    "EnvConfig": "provrl.env",
    "Collector": "provrl.rollout",
    "Group": "provrl.rollout",
    "build_env": "provrl.rollout",
    "RLTrainer": "provrl.train",
    "RLConfig": "provrl.train",
    "run_sft": "provrl.train",
    "SFTConfig": "provrl.trainers",
    "GRPOTrainer": "provrl.trainers",
    "GRPOConfig": "provrl.trainers",
    "SFTTrainer": "provrl.trainers",
    "Trajectory": "provrl.provenance",
    "SamplingParams": "provrl.provenance",
    "TrajectoryWriter": "provrl.trajlog",
    "read_trajectories": "provrl.trajlog",
    "RunConfig": "provrl.run_config",
    "load_config": "provrl.config",
    "MetricsWriter": "provrl.report",
}
__all__ = ["__version__", *_EXPORTS]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
