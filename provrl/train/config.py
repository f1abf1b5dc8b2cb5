"""Typed config of the LLM RL trainer (``provrl.train.rl``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from provrl.config import Section
from provrl.objectives.config import AdvantageConfig, ObjectiveConfig
from provrl.objectives.trpo import TRPOConfig


class RLConfig(Section):
    """One RL update per batch of trajectories: advantages → correction + loss → optimizer."""

    objective: ObjectiveConfig = Field(
        default_factory=ObjectiveConfig, description="Correction, PPO clip, aggregation, KL."
    )
    advantages: AdvantageConfig = Field(
        default_factory=AdvantageConfig, description="GRPO / RLOO baseline and normalisation."
    )
    optimizer: Literal["adamw", "trpo"] = Field(
        "adamw",
        description="adamw: clipped-surrogate SGD epochs; trpo: one natural-gradient step "
        "with line search on the token surrogate (objective.clip_* ignored).",
    )
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate (after warmup).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (β₁, β₂).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW ε.")
    warmup_steps: int = Field(
        0, ge=0, description="Linear learning-rate warmup over this many optimizer steps."
    )
    max_grad_norm: float | None = Field(
        1.0, gt=0, description="Clip the global gradient norm to this (None: no clipping)."
    )
    epochs: int = Field(1, ge=1, description="Passes over each batch of trajectories.")
    minibatches: int = Field(
        1, ge=1, description="Optimizer steps per epoch (the batch is split into this many)."
    )
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="Trajectories per forward/backward; gradients accumulate exactly over a "
        "minibatch. Bounds activation memory.",
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Positions per LM-head chunk: peak logit memory is chunk · vocab floats.",
    )
    trpo: TRPOConfig = Field(
        default_factory=TRPOConfig, description="TRPO step (optimizer = trpo)."
    )
    support_diagnostic: bool = Field(
        True,
        description="Compute π_θ's mass outside each trajectory's top-k/top-p support "
        "(sorts the vocabulary per action token; skipped when nothing was truncated).",
    )
    entropy: bool = Field(True, description="Log the mean entropy of π_θ on action tokens.")
    lag_buckets: int = Field(
        4, ge=1, description="Version lags 0..n−1 get their own metric; the rest are lumped."
    )
    seed: int = Field(0, description="Seed of minibatch shuffling and FVP subsampling.")
    progress: bool = Field(False, description="Show a progress bar over micro-batches.")

    @model_validator(mode="after")
    def _check(self) -> RLConfig:
        if self.optimizer == "trpo" and (self.epochs != 1 or self.minibatches != 1):
            raise ValueError("optimizer trpo takes one step per batch: set epochs=1, minibatches=1")
        return self
