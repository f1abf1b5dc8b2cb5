"""``provrl.GRPOTrainer``: TRL's front door onto ``provrl run``.

::

    from provrl import GRPOConfig, GRPOTrainer

    trainer = GRPOTrainer(
        model="smollm2-135m",                       # a provrl name, a checkpoint directory
        reward_funcs=[correct, "format"],           # TRL's signature, or built-in names
        args=GRPOConfig(output_dir="runs/grpo", max_steps=20, num_generations=8,
                        learning_rate=2e-5, reward_weights=[1.0, 0.2]),
        train_dataset="qa.jsonl",                   # {"question", "answer"} per line
        tools="docs.jsonl",                         # documents to search, or a /retrieve URL
    )
    trainer.train()

:meth:`GRPOTrainer.train` builds a :class:`~provrl.run_config.RunConfig` — the preset, then
each :class:`GRPOConfig` field under its TRL name (the peer table of
:func:`provrl.config.peer_tables` maps it to provrl's key), then ``overrides`` — and runs
:func:`provrl.pipeline.run.run_pipeline` on it: the same stages, async loop, per-token
provenance, corrections and resumable run directory as ``provrl run``. The reward functions
are registered in this process (:func:`provrl.env.rewards.register_reward`) and named in
``env.agent.rewards``, so the run's ``config.yaml`` records which rewards, with which weights.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from provrl.config import ConfigError, load_config
from provrl.env.rewards import (
    BUILTIN_REWARDS,
    TRLReward,
    register_reward,
    reward_function,
    trl_reward,
)
from provrl.run_config.run import RunConfig
from provrl.trainers.data import Dataset, model_name, search_overrides, task_file

OWN_FIELDS = (
    "preset",
    "overrides",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "bf16",
)
"""GRPOConfig fields the trainer maps itself; every other field is passed to the run config
under its own (TRL's) name."""


@dataclass(kw_only=True)
class GRPOConfig:
    """TRL's ``GRPOConfig`` names, mapped onto provrl's run config. A field left ``None``
    keeps the preset's value; the provrl key each one sets is named after the arrow. A TRL
    field provrl has no equivalent for is refused with one line naming what to use."""

    output_dir: str = "runs/grpo"
    """→ logging.run_dir: the run directory (config, logs, checkpoints, report); a second
    ``train()`` with the same config resumes it."""
    max_steps: int | None = None
    """→ pipeline.loop.steps: RL optimizer steps (= new policy versions)."""
    num_generations: int | None = None
    """→ pipeline.loop.k: completions per prompt (GRPO group size); the probe takes as many."""
    per_device_train_batch_size: int | None = None
    """Completions per optimizer step (× gradient_accumulation_steps): provrl trains whole
    groups, so → pipeline.loop.groups_per_step = this × accumulation / num_generations (a
    whole number), and rl.micro_batch_size = this."""
    gradient_accumulation_steps: int | None = None
    """Micro-batches per optimizer step (see per_device_train_batch_size)."""
    learning_rate: float | None = None
    """→ rl.lr: peak AdamW learning rate."""
    lr_scheduler_type: str | None = None
    """→ rl.lr_schedule: constant, linear or cosine."""
    warmup_steps: int | None = None
    """→ rl.warmup_steps."""
    weight_decay: float | None = None
    """→ rl.weight_decay."""
    adam_epsilon: float | None = None
    """→ rl.adam_eps."""
    max_grad_norm: float | None = None
    """→ rl.max_grad_norm."""
    beta: float | None = None
    """→ rl.objective.kl_coef: KL penalty to the reference policy."""
    epsilon: float | None = None
    """→ rl.objective.clip_eps_low: lower clip of the importance ratio."""
    epsilon_high: float | None = None
    """→ rl.objective.clip_eps_high: upper clip (DAPO's clip-higher)."""
    loss_type: str | None = None
    """→ rl.objective.aggregation: how token losses are averaged (grpo, dr_grpo, dapo, …)."""
    scale_rewards: bool | None = None
    """→ rl.advantages.std_normalise: divide advantages by the group's std."""
    num_iterations: int | None = None
    """→ rl.epochs: passes over each batch."""
    steps_per_generation: int | None = None
    """→ rl.minibatches."""
    mask_truncated_completions: bool | None = None
    """→ rl.mask_truncated: no loss on episodes cut by the token budget."""
    vllm_importance_sampling_cap: float | None = None
    """→ rl.objective.is_cap."""
    max_staleness: int | None = None
    """→ pipeline.loop.max_lag: async; the most versions a trained token may lag."""
    temperature: float | None = None
    """→ env.agent.temperature: sampling temperature of the rollouts."""
    top_p: float | None = None
    """→ env.agent.top_p."""
    top_k: int | None = None
    """→ env.agent.top_k (0 or -1: off)."""
    reward_weights: list[float] | None = None
    """→ env.agent.reward_weights: one weight per reward function (None: all 1)."""
    save_total_limit: int | None = None
    """→ pipeline.loop.save_total_limit: RL checkpoints kept (every step is saved)."""
    seed: int | None = None
    """→ seed: python, numpy and torch."""
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] | None = None
    """→ logging.report_to: trackers that also receive every metric."""
    bf16: bool = False
    """Mixed precision as TRL's: → rl.autocast=bfloat16 (weights, gradients and AdamW state
    stay float32) and engine.dtype=bfloat16 (rollouts)."""
    preset: str = "default"
    """The provrl preset the fields apply over (configs/*.yaml or a YAML path): default
    (SmolLM2-135M's recipe), quick (the tiny model, seconds)."""
    overrides: list[str] = field(default_factory=list)
    """Any other provrl key, as ``provrl run --set`` takes it:
    ``["env.agent.max_turns=4", "pipeline.loop.mode=sync"]`` (docs/config.md)."""

    def __post_init__(self) -> None:
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ConfigError(f"GRPOConfig: {name}={v} must be at least 1")

    def run_config(self, extra: Sequence[str] = ()) -> RunConfig:
        """The run config: the preset, then ``extra`` (what the trainer derives: task file,
        tools, rewards), then every field that is set, then :attr:`overrides`."""
        sets = [*extra]
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in OWN_FIELDS or value is None:
                continue
            sets.append(f"{f.name}={json.dumps(value)}")
        if self.bf16:
            sets += ["rl.autocast=bfloat16", "engine.dtype=bfloat16"]
        cfg = load_config(RunConfig, self.preset, [*sets, *self.overrides])
        b, g = self.per_device_train_batch_size, self.gradient_accumulation_steps or 1
        if b is not None:
            k = cfg.pipeline.loop.k
            if (b * g) % k:
                raise ConfigError(
                    f"GRPOConfig: per_device_train_batch_size={b} × gradient_accumulation_steps="
                    f"{g} is not a multiple of num_generations={k}: provrl trains whole groups "
                    "(pipeline.loop.groups_per_step = batch / num_generations)"
                )
            cfg.pipeline.loop.groups_per_step = b * g // k
            cfg.rl.micro_batch_size = b
        elif self.gradient_accumulation_steps is not None:
            raise ConfigError(
                "GRPOConfig: gradient_accumulation_steps needs per_device_train_batch_size "
                "(the step's batch is their product)"
            )
        return cfg


def _checked_init(init: Callable[..., None]) -> Callable[..., None]:
    """GRPOConfig's ``__init__``, refusing a name it does not have with one line: TRL's
    fields provrl has no equivalent for name what to use instead (``RunConfig.peers_refused``),
    near misses get "did you mean"."""

    @functools.wraps(init)
    def __init__(self: GRPOConfig, **kwargs: Any) -> None:
        known = {f.name for f in fields(GRPOConfig)}
        for key in kwargs:
            if key in known:
                continue
            if key in RunConfig.peers_refused:
                raise ConfigError(
                    f"GRPOConfig: {key!r} has no provrl field: {RunConfig.peers_refused[key]} "
                    "(set a provrl key with overrides=['key=value'])"
                )
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"GRPOConfig: unknown field {key!r} ({hint}provrl's own keys go in "
                "overrides=['section.key=value'], docs/config.md)"
            )
        init(self, **kwargs)

    return __init__


GRPOConfig.__init__ = _checked_init(GRPOConfig.__init__)  # type: ignore[method-assign]

RewardFunc = str | TRLReward
"""A reward function: a built-in name (em, f1, format, outcome), ``module:function``, or a
callable with TRL's signature (:data:`provrl.env.rewards.TRLReward`)."""


def _eval_overrides(eval_dataset: Dataset | None, out: Path) -> list[str]:
    """The eval stage: the base model and the trained policy on ``eval_dataset`` after the RL
    stage (TRL evaluates during training; provrl before and after it), or no eval stage
    (the world's test split is not the user's task)."""
    if eval_dataset is None:
        return ["pipeline.eval.policies=[]"]
    f = task_file(eval_dataset, out, name="eval_dataset")
    return ["pipeline.eval.policies=[base, rl]", f"pipeline.eval.file={json.dumps(str(f))}"]


def reward_names(reward_funcs: RewardFunc | Sequence[RewardFunc]) -> list[str]:
    """The ``env.agent.rewards`` names of ``reward_funcs``: a callable is registered in this
    process under its ``__name__`` (made unique, never a built-in's); a name is checked."""
    funcs = [reward_funcs] if isinstance(reward_funcs, str) or callable(reward_funcs) else list(reward_funcs)  # fmt: skip
    if not funcs:
        raise ConfigError("reward_funcs: give at least one reward function")
    names: list[str] = []
    for i, fn in enumerate(funcs):
        if isinstance(fn, str):
            if fn not in BUILTIN_REWARDS and fn != "outcome" and ":" not in fn:
                raise ConfigError(
                    f"reward_funcs[{i}]={fn!r}: not a built-in reward ({', '.join(BUILTIN_REWARDS)}"
                    ", outcome) or 'module:function'; provrl takes no reward models (TRL's "
                    "model-id rewards): pass a callable"
                )
            reward_function(fn, lambda e: 0.0)  # a name that cannot be imported: one line now
            names.append(fn)
            continue
        if not callable(fn):
            raise ConfigError(f"reward_funcs[{i}]: {type(fn).__name__} is not callable")
        base = getattr(fn, "__name__", "")
        base = base if base.isidentifier() else f"reward{i}"
        name = base
        while name in names or name in BUILTIN_REWARDS or name == "outcome":
            name = f"{base}_{i}"
            base = name
        register_reward(name, trl_reward(fn, name))
        names.append(name)
    return names


class GRPOTrainer:
    """GRPO (and its PPO-style corrections) on a tool-using agent, TRL's way::

        GRPOTrainer(model, reward_funcs, args=GRPOConfig(...), train_dataset=...,
                    tools=...).train()

    model: a provrl name (``tiny``, ``smollm2-135m``), a checkpoint directory (an HF model
    with its tokenizer), or a loaded model — a :class:`~provrl.models.LoadedModel`, or an HF
    model with its tokenizer as ``processing_class`` — saved to ``OUTPUT/initial`` first.
    reward_funcs: one or a list of :data:`RewardFunc`; their weighted sum
    (``args.reward_weights``) is each episode's reward, and each one's score is in the
    trajectory metrics (``reward/<name>``). train_dataset: :data:`~provrl.trainers.data.Dataset`.
    eval_dataset: as train_dataset, disjoint from it; the base model and the trained policy
    are evaluated on it after the RL stage (``summary["eval"]``: accuracy = exact match, k =
    ``pipeline.eval.k`` samples per task). tools: the search tool
    (:func:`~provrl.trainers.data.search_overrides`).
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: RewardFunc | Sequence[RewardFunc],
        args: GRPOConfig | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | None = None,
        processing_class: Any = None,
        tools: str | os.PathLike[str] | None = None,
    ) -> None:
        self.args = args or GRPOConfig()
        if train_dataset is None:
            raise ConfigError("GRPOTrainer: train_dataset is required (QA rows or a JSONL path)")
        out = Path(self.args.output_dir)
        self.model_name = model_name(model, processing_class, out / "initial")
        data = task_file(train_dataset, out / "data" / "train.jsonl")
        extra = [
            f"model.name={json.dumps(self.model_name)}",
            f"pipeline.tasks.file={json.dumps(str(data))}",
            "pipeline.warmstart=false",  # a TRL run starts from the model it is given
            *_eval_overrides(eval_dataset, out / "data" / "eval.jsonl"),
            f"env.agent.rewards={json.dumps(reward_names(reward_funcs))}",
            *search_overrides(tools, out / "data" / "docs.sqlite"),
        ]
        self.config = self.args.run_config(extra)
        """The run config :meth:`train` runs (``provrl run``'s), built now so a bad field
        is one line before any work."""
        self.summary: dict[str, Any] | None = None

    def train(self) -> dict[str, Any]:
        """Run (or resume) the pipeline in ``args.output_dir``: probe the tasks k times, the
        RL stage, the report. Returns the run's summary (``summary["rl"]["checkpoint"]``:
        the trained policy)."""
        from provrl.pipeline.run import run_pipeline

        cfg = self.config
        self.summary = run_pipeline(cfg, cfg.logging.run_dir, progress=cfg.logging.progress)
        return self.summary

    def save_model(self, output_dir: str | os.PathLike[str] | None = None) -> Path:
        """Copy the trained policy (an HF checkpoint directory) to ``output_dir`` (default
        ``args.output_dir/final``); :meth:`train` first."""
        if self.summary is None:
            raise RuntimeError("GRPOTrainer.save_model: call train() first")
        target = Path(output_dir or Path(self.args.output_dir) / "final")
        shutil.copytree(self.summary["rl"]["checkpoint"], target, dirs_exist_ok=True)
        return target
