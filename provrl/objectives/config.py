"""Typed configs for the objective: advantages, the off-policy correction, the loss, the
TRPO step. Torch-free, so CLI modules can build their options from them without importing
torch (``provrl --help`` stays fast); the functions they configure live next door."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from provrl.config import Section, peer_names

VERL_ACTOR = "actor_rollout_ref.actor."

CorrectionName = Literal[
    "on_policy", "token_is", "tis", "icepop", "seq_tis", "seq_mis", "geo_mask", "decoupled", "gspo"
]
"""The off-policy corrections of :mod:`provrl.objectives.corrections`."""
KLEstimator = Literal["k1", "k2", "k3"]
"""The per-token KL estimators of :mod:`provrl.objectives.kl`."""
LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_sum_norm"]
AGGREGATION_NAMES = {
    "token-mean": "token_mean",  # verl loss_agg_mode
    "seq-mean-token-mean": "seq_mean_token_mean",
    "seq-mean-token-sum-norm": "seq_sum_norm",
    "grpo": "seq_mean_token_mean",  # TRL loss_type
    "bnpo": "token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_sum_norm",
}
"""TRL's ``loss_type`` and verl's ``loss_agg_mode`` values → the aggregation they compute."""


class AdvantageConfig(Section):
    """How one scalar reward per trajectory becomes an advantage (broadcast to its tokens)."""

    estimator: Literal["grpo", "rloo"] = Field(
        "grpo",
        description="grpo: r_i − group mean (optionally / group std); "
        "rloo: r_i − mean of the other rewards in the group (leave-one-out).",
        **peer_names("estimator", verl="algorithm.adv_estimator"),
    )
    std_normalise: bool = Field(
        True,
        description="grpo only: divide by the group's reward std (GRPO). False = Dr. GRPO. "
        "TRL's scale_rewards 'group' / 'none' mean True / False.",
        **peer_names(
            "std_normalise", trl="scale_rewards", verl="algorithm.norm_adv_by_std_in_grpo"
        ),
    )
    batch_norm: Literal["none", "scale", "whiten"] = Field(
        "none",
        description="After the group baseline: none; scale (divide by the batch std, keeps "
        "zero-signal groups at 0); whiten (subtract the batch mean too).",
    )
    eps: float = Field(1e-6, gt=0, description="ε added to standard deviations.")

    @field_validator("std_normalise", mode="before")
    @classmethod
    def _trl_scale_rewards(cls, v: object) -> object:
        """TRL's ``scale_rewards``: 'group' (GRPO) → True, 'none' (Dr. GRPO) → False."""
        if v == "batch":
            raise ValueError("scale_rewards='batch': use batch_norm='scale' (group std off)")
        return {"group": True, "none": False}.get(v, v) if isinstance(v, str) else v


class ObjectiveConfig(Section):
    """The policy loss: one correction, an optional PPO clip, an aggregation, optional KL."""

    correction: CorrectionName = Field(
        "tis",
        description="Off-policy correction: on_policy, token_is, tis, icepop, seq_tis, "
        "seq_mis, geo_mask, decoupled, gspo (docs/objectives.md has each equation).",
    )
    clip_eps_low: float | None = Field(
        0.2,
        ge=0,
        description="PPO clip ε_low: ratio floor 1 − ε_low (None: no clip).",
        **peer_names("clip_eps_low", trl="epsilon", verl=VERL_ACTOR + "clip_ratio_low"),
    )
    clip_eps_high: float | None = Field(
        0.28,
        ge=0,
        description="PPO clip ε_high: ratio ceiling 1 + ε_high (DAPO's clip-higher; None: no "
        "clip).",
        **peer_names("clip_eps_high", trl="epsilon_high", verl=VERL_ACTOR + "clip_ratio_high"),
    )
    dual_clip: float | None = Field(
        None,
        gt=1,
        description="Dual-clip PPO constant c > 1 (Ye et al. 2020): for A < 0 the surrogate "
        "is max(PPO surrogate, c·A), bounding the loss of a token whose ratio exploded. "
        "None: off (verl's default is 3).",
        **peer_names("dual_clip", verl=VERL_ACTOR + "clip_ratio_c"),
    )
    is_cap: float | None = Field(
        2.0,
        gt=0,
        description="C: truncation cap of the behaviour weight (tis, seq_tis) or drop "
        "threshold (decoupled). None: untruncated.",
        **peer_names("is_cap", trl="vllm_importance_sampling_cap"),
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
        "trajectories of their token mean; seq_sum_norm: Dr. GRPO, sum / (N · norm_tokens). "
        "TRL's loss_type and verl's loss_agg_mode values are read too (AGGREGATION_NAMES).",
        **peer_names("aggregation", trl="loss_type", verl=VERL_ACTOR + "loss_agg_mode"),
    )
    norm_tokens: int | None = Field(
        None,
        gt=0,
        description="Constant L of seq_sum_norm (typically the generation budget in tokens); "
        "required for that aggregation.",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="β of the KL(π_θ‖π_ref) penalty to the initial policy (0: off).",
        **peer_names("kl_coef", trl="beta", verl=VERL_ACTOR + "kl_loss_coef"),
    )
    kl_estimator: KLEstimator = Field(
        "k3",
        description="Per-token KL estimator for the penalty: k1, k2 or k3 (verl's kl, mse, "
        "low_var_kl are read as k1, k2, k3).",
        **peer_names("kl_estimator", verl=VERL_ACTOR + "kl_loss_type"),
    )
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="c_H of the entropy bonus: the loss subtracts c_H · H̄, the entropy of π_θ "
        "on action tokens aggregated like the policy term (0: off; costs a [tokens, vocab] "
        "softmax with grad per chunk).",
        **peer_names("entropy_coef", verl=VERL_ACTOR + "entropy_coeff"),
    )
    log_ratio_clamp: float = Field(
        20.0, gt=0, description="|log ratio| is clamped to this before exp (overflow guard)."
    )

    @field_validator("aggregation", mode="before")
    @classmethod
    def _peer_aggregation(cls, v: object) -> object:
        return AGGREGATION_NAMES.get(v, v) if isinstance(v, str) else v

    @field_validator("kl_estimator", mode="before")
    @classmethod
    def _peer_kl(cls, v: object) -> object:
        return {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}.get(v, v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check(self) -> ObjectiveConfig:
        if self.aggregation == "seq_sum_norm" and self.norm_tokens is None:
            raise ValueError("aggregation seq_sum_norm needs norm_tokens (the constant L)")
        if self.mask_low >= self.mask_high:
            raise ValueError(f"mask_low {self.mask_low} must be < mask_high {self.mask_high}")
        return self


class TRPOConfig(Section):
    """Hyperparameters of one TRPO / NPG step (names from the paper and Spinning Up)."""

    delta: float = Field(
        0.01, gt=0, description="Trust-region radius δ: the largest accepted mean KL(π_old‖π_θ)."
    )
    cg_iters: int = Field(
        10, ge=1, description="Conjugate-gradient iterations for s ≈ F⁻¹ g (F = Fisher matrix)."
    )
    cg_damping: float = Field(
        0.1, ge=0, description="Damping λ added to the Fisher: CG solves (F + λI) s = g."
    )
    cg_residual_tol: float = Field(
        1e-10, ge=0, description="Stop CG early once the squared residual ‖r‖² is below this."
    )
    backtrack_coeff: float = Field(
        0.8, gt=0, lt=1, description="Line-search shrink factor α: try steps α^j β s, j = 0, 1, …"
    )
    backtrack_iters: int = Field(
        10, ge=1, description="Maximum number of line-search trials before rejecting the step."
    )
    accept_ratio: float = Field(
        0.0,
        ge=0,
        description="Also require actual/expected surrogate improvement ≥ this (0 = off).",
    )
    fvp_subsample: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Fraction of samples whose mean KL defines the Fisher-vector product "
        "(the caller builds that KL, see subsample_index; 1 = all).",
    )
    line_search: bool = Field(
        True,
        description="True = TRPO (backtracking line search); False = NPG: take the full step "
        "β s without checking the KL or the surrogate.",
    )
