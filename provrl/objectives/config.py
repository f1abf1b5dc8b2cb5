"""Typed configs for the objective: advantages, the off-policy correction, the loss."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from provrl.config import Section
from provrl.objectives.corrections import CorrectionName
from provrl.objectives.kl import KLEstimator

LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_sum_norm"]


class AdvantageConfig(Section):
    """How one scalar reward per trajectory becomes an advantage (broadcast to its tokens)."""

    estimator: Literal["grpo", "rloo"] = Field(
        "grpo",
        description="grpo: r_i − group mean (optionally / group std); "
        "rloo: r_i − mean of the other rewards in the group (leave-one-out).",
    )
    std_normalise: bool = Field(
        True,
        description="grpo only: divide by the group's reward std (GRPO). False = Dr. GRPO.",
    )
    batch_norm: Literal["none", "scale", "whiten"] = Field(
        "none",
        description="After the group baseline: none; scale (divide by the batch std, keeps "
        "zero-signal groups at 0); whiten (subtract the batch mean too).",
    )
    eps: float = Field(1e-6, gt=0, description="ε added to standard deviations.")


class ObjectiveConfig(Section):
    """The policy loss: one correction, an optional PPO clip, an aggregation, optional KL."""

    correction: CorrectionName = Field(
        "tis",
        description="Off-policy correction: on_policy, token_is, tis, icepop, seq_tis, "
        "seq_mis, geo_mask, decoupled, gspo (docs/objectives.md has each equation).",
    )
    clip_eps_low: float | None = Field(
        0.2, ge=0, description="PPO clip ε_low: ratio floor 1 − ε_low (None: no clip)."
    )
    clip_eps_high: float | None = Field(
        0.28,
        ge=0,
        description="PPO clip ε_high: ratio ceiling 1 + ε_high (DAPO's clip-higher; None: no "
        "clip).",
    )
    is_cap: float | None = Field(
        2.0,
        gt=0,
        description="C: truncation cap of the behaviour weight (tis, seq_tis) or drop "
        "threshold (decoupled). None: untruncated.",
    )
    mask_low: float = Field(
        0.5, ge=0, description="α: lower edge of the kept ratio band (icepop, seq_mis, geo_mask)."
    )
    mask_high: float = Field(
        2.0, gt=0, description="β: upper edge of the kept ratio band (icepop, seq_mis, geo_mask)."
    )
    aggregation: LossAggregation = Field(
        "token_mean",
        description="token_mean: mean over all action tokens; seq_mean_token_mean: mean over "
        "trajectories of their token mean; seq_sum_norm: Dr. GRPO, sum / (N · norm_tokens).",
    )
    norm_tokens: int | None = Field(
        None,
        gt=0,
        description="Constant L of seq_sum_norm (typically the generation budget in tokens); "
        "required for that aggregation.",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="β of the KL(π_θ‖π_ref) penalty to the initial policy (0: off)."
    )
    kl_estimator: KLEstimator = Field(
        "k3", description="Per-token KL estimator for the penalty: k1, k2 or k3."
    )
    log_ratio_clamp: float = Field(
        20.0, gt=0, description="|log ratio| is clamped to this before exp (overflow guard)."
    )

    @model_validator(mode="after")
    def _check(self) -> ObjectiveConfig:
        if self.aggregation == "seq_sum_norm" and self.norm_tokens is None:
            raise ValueError("aggregation seq_sum_norm needs norm_tokens (the constant L)")
        if self.mask_low >= self.mask_high:
            raise ValueError(f"mask_low {self.mask_low} must be < mask_high {self.mask_high}")
        return self
