"""Typed config of the LLM RL trainer (``provrl.train.rl``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from provrl.config import Section, peer_names
from provrl.objectives.config import VERL_ACTOR, AdvantageConfig, ObjectiveConfig, TRPOConfig

Schedule = Literal["cosine", "linear", "constant"]
Packing = Literal["trie", "rows", "none"]
TRUNCATED_FINISHES = ("token_budget", "max_turns")
"""Episode endings that cut a completion short (the token budget or the turn limit ran out
before an answer): what ``mask_truncated`` drops from the loss."""


class LoraConfig(Section):
    """Low-rank adapters (peft) on the policy: W' = W + (alpha / r)·B·A, B zero at init.
    Only A and B get gradients and optimizer state; engines are sent the merged W'."""

    enabled: bool = Field(
        False,
        description="Train LoRA adapters instead of every weight.",
        **peer_names("enabled", trl="use_peft"),
    )
    r: int = Field(16, ge=1, description="Adapter rank r.", **peer_names("r", trl="lora_r"))
    alpha: int = Field(
        32,
        gt=0,
        description="Adapter scale numerator: the update is (alpha / r)·B·A.",
        **peer_names("alpha", trl="lora_alpha"),
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapter input (0 keeps training logprobs deterministic).",
        **peer_names("dropout", trl="lora_dropout"),
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="Names of the Linear modules that get adapters (peft target_modules).",
        **peer_names("target_modules", trl="lora_target_modules"),
    )


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
    lr: float = Field(
        1e-6,
        gt=0,
        description="AdamW learning rate (after warmup).",
        **peer_names("lr", trl="learning_rate", verl=VERL_ACTOR + "optim.lr"),
    )
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW (β₁, β₂).")
    weight_decay: float = Field(
        0.0,
        ge=0,
        description="AdamW decoupled weight decay.",
        **peer_names("weight_decay", trl="weight_decay", verl=VERL_ACTOR + "optim.weight_decay"),
    )
    adam_eps: float = Field(
        1e-8, gt=0, description="AdamW ε.", **peer_names("adam_eps", trl="adam_epsilon")
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="Linear learning-rate warmup over this many optimizer steps.",
        **peer_names("warmup_steps", trl="warmup_steps", verl=VERL_ACTOR + "optim.lr_warmup_steps"),
    )
    lr_schedule: Schedule = Field(
        "constant",
        description="Learning-rate decay after warmup, from lr to min_lr_ratio · lr over "
        "lr_decay_steps optimizer steps: constant, linear or cosine (provrl.train.schedule).",
        **peer_names(
            "lr_schedule", trl="lr_scheduler_type", verl=VERL_ACTOR + "optim.warmup_style"
        ),
    )
    min_lr_ratio: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Learning rate at the end of the decay, as a fraction of lr.",
        **peer_names("min_lr_ratio", verl=VERL_ACTOR + "optim.min_lr_ratio"),
    )
    lr_decay_steps: int = Field(
        0,
        ge=0,
        description="Optimizer steps the decay spans (warmup included; the learning rate stays "
        "at min_lr_ratio · lr after). Required by a linear or cosine schedule.",
    )
    max_grad_norm: float | None = Field(
        1.0,
        gt=0,
        description="Clip the global gradient norm to this (None: no clipping).",
        **peer_names("max_grad_norm", trl="max_grad_norm", verl=VERL_ACTOR + "grad_clip"),
    )
    epochs: int = Field(
        1,
        ge=1,
        description="Passes over each batch of trajectories.",
        **peer_names("epochs", trl="num_iterations", verl=VERL_ACTOR + "ppo_epochs"),
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="Optimizer steps per epoch (the batch is split into this many). A count: "
        "verl's ppo_mini_batch_size is a size (trajectories per step), so it is not an alias.",
        **peer_names("minibatches", trl="steps_per_generation"),
    )
    micro_batch_size: int = Field(
        8,
        ge=1,
        description="Trajectories per forward/backward; gradients accumulate exactly over a "
        "minibatch. Bounds activation memory.",
        **peer_names("micro_batch_size", verl=VERL_ACTOR + "ppo_micro_batch_size_per_gpu"),
    )
    packing: Packing = Field(
        "trie",
        description="How a micro-batch is laid out (provrl.train.packing; the same logprobs "
        "and gradients every way). trie: one row without padding, every prefix several "
        "trajectories share (the system prompt, a group's question, identical samples) "
        "computed once; rows: one row without padding, nothing shared; none: right-padded "
        "micro-batches of micro_batch_size rows.",
    )
    micro_batch_tokens: int = Field(
        4096,
        ge=64,
        description="packing trie / rows: most packed tokens per forward/backward (a group's prefix "
        "counted once); bounds activation memory. A longer group is split.",
    )
    proximal: Literal["reuse", "pass"] = Field(
        "reuse",
        description="Where π_prox comes from. reuse: the training forward's own detached "
        "π_θ wherever it runs at the pre-update weights (the first minibatch of the first "
        "epoch — with minibatches = epochs = 1 there is no other forward); a no-grad pass "
        "only for the other rows. pass: one no-grad pass over the whole batch first. Both "
        "are exact; TRPO always runs the pass (it needs the full log-softmax).",
    )
    mask_truncated: bool = Field(
        False,
        description="Drop trajectories cut short (TRUNCATED_FINISHES: token budget or turn "
        "limit hit before an answer) from the loss; they still count in their group's "
        "baseline.",
        **peer_names("mask_truncated", trl="mask_truncated_completions"),
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Positions per LM-head chunk: peak logit memory is chunk · vocab floats.",
    )
    autocast: Literal["auto", "float32", "bfloat16"] = Field(
        "float32",
        description="Compute dtype of the trainer's forward/backward (torch.autocast); weights, "
        "gradients and AdamW state stay float32. bfloat16 is several times faster where the "
        "hardware has bf16 matrix units (a GPU, a CPU with AMX, some CPUs with AVX512-BF16) "
        "and slower on others with AVX512-BF16; auto picks per device, measuring where the "
        "flags cannot tell (provrl/models/precision.py). In bf16 π_θ differs from "
        "a float32 engine's q by bf16 rounding, which the diagnostics (kl_q_pi_k3 at lag 0) "
        "show; π_θ/π_prox ratios stay consistent.",
    )
    trpo: TRPOConfig = Field(
        default_factory=TRPOConfig, description="TRPO step (optimizer = trpo)."
    )
    support_diagnostic: bool = Field(
        True,
        description="Compute π_θ's mass outside each trajectory's top-k/top-p support "
        "(sorts the vocabulary per action token of a truncated row; skipped when nothing was truncated).",
    )
    entropy: bool = Field(True, description="Log the mean entropy of π_θ on action tokens.")
    lag_buckets: int = Field(
        4, ge=1, description="Version lags 0..n−1 get their own metric; the rest are lumped."
    )
    seed: int = Field(0, description="Seed of minibatch shuffling and FVP subsampling.")
    nonfinite_limit: int = Field(
        3,
        ge=1,
        description="Stop the run after this many RL steps in a row whose loss, gradient or "
        "new weights were not finite. Each such step is skipped: rolled back, counted in "
        "the next step record (nonfinite_skipped), never saved or hot-loaded; its batch is "
        "not trained.",
    )
    progress: bool = Field(False, description="Show a progress bar over micro-batches.")
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward instead of "
        "holding them (HF gradient_checkpointing_enable, non-reentrant): less memory, "
        "one more forward per layer.",
        **peer_names("gradient_checkpointing", trl="gradient_checkpointing"),
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="LoRA adapters instead of a full fine-tune (engines get merged weights).",
    )

    @model_validator(mode="after")
    def _check(self) -> RLConfig:
        if self.optimizer == "trpo" and (self.epochs != 1 or self.minibatches != 1):
            raise ValueError("optimizer trpo takes one step per batch: set epochs=1, minibatches=1")
        if self.lr_schedule != "constant" and self.lr_decay_steps <= self.warmup_steps:
            raise ValueError(
                f"lr_schedule={self.lr_schedule} needs lr_decay_steps > warmup_steps "
                f"(got {self.lr_decay_steps} and {self.warmup_steps})"
            )
        return self


class SFTConfig(Section):
    """Supervised fine-tuning (warm start) on trajectories: imitate their action tokens.

    Loss per optimizer step: the mean negative log-likelihood of the step's action tokens,
    L(θ) = −(1/N) Σ_i Σ_{t ∈ actions(i)} log π_θ(x_{i,t} | x_{i,<t}) (``provrl.train.sft``).
    """

    selection: Literal["all", "successful", "fewest_tool_calls"] = Field(
        "successful",
        description="Which traces to imitate: all; successful (reward ≥ min_reward); "
        "fewest_tool_calls (successful, and per task only those with the fewest tool calls).",
    )
    min_reward: float = Field(
        1.0, description="A trace is successful when its reward is at least this."
    )
    max_per_task: int = Field(
        0,
        ge=0,
        description="Keep at most this many traces per task (fewest tool calls, then fewest "
        "tokens, first); 0 = no cap.",
    )
    max_traces: int = Field(
        0, ge=0, description="After selection, a seeded random subset of this size (0 = all)."
    )
    epochs: int = Field(
        1,
        ge=1,
        description="Passes over the selected traces.",
        **peer_names("epochs", trl="num_train_epochs", verl="trainer.total_epochs"),
    )
    batch_size: int = Field(
        8, ge=1, description="Trajectories per optimizer step (the last step may have fewer)."
    )
    micro_batch_tokens: int = Field(
        2048,
        ge=1,
        description="Tokens per forward/backward — the rows' summed length when packing, "
        "else padded (rows × longest row); gradients accumulate exactly over a step. A "
        "longer trajectory runs alone.",
    )
    packing: Packing = Field(
        "trie",
        description="How a micro-batch is laid out: trie (one row, no padding, the prefix "
        "the traces share — the system prompt — computed once), rows (one row, no padding) "
        "or none (padded rows); provrl.train.packing, the same logprobs and gradients.",
    )
    lr: float = Field(
        5e-5,
        gt=0,
        description="Peak AdamW learning rate η (after warmup).",
        **peer_names("lr", trl="learning_rate", verl="optim.lr"),
    )
    schedule: Schedule = Field(
        "cosine",
        description="Learning-rate decay after warmup, from η to min_lr_ratio · η.",
        **peer_names("schedule", trl="lr_scheduler_type"),
    )
    warmup_steps: int = Field(
        10,
        ge=0,
        description="Linear warmup from η/W to η over the first W optimizer steps.",
        **peer_names("warmup_steps", trl="warmup_steps", verl="optim.lr_warmup_steps"),
    )
    min_lr_ratio: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Learning rate at the last step, as a fraction of η.",
        **peer_names("min_lr_ratio", verl="optim.min_lr_ratio"),
    )
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW (β₁, β₂).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay.")
    adam_eps: float = Field(1e-8, gt=0, description="AdamW ε.")
    max_grad_norm: float | None = Field(
        1.0,
        gt=0,
        description="Clip the global gradient norm to this (None or 0: no clipping). 0.5-1 is "
        "typical; leave it unless the loss spikes.",
    )
    autocast: Literal["auto", "float32", "bfloat16"] = Field(
        "float32",
        description="Compute dtype of forward/backward (torch.autocast); weights, gradients "
        "and AdamW state stay float32. bfloat16 is several times faster with bf16 matrix units "
        "(a GPU, a CPU with AMX, some CPUs with AVX512-BF16), slower on others with "
        "AVX512-BF16; auto picks per device, measuring where the flags cannot tell "
        "(provrl/models/precision.py).",
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=1,
        description="Positions per LM-head chunk: peak logit memory is chunk · vocab floats.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in backward instead of "
        "holding them (HF gradient_checkpointing_enable, non-reentrant): the same gradients, "
        "less memory, one more forward per layer.",
        **peer_names("gradient_checkpointing", trl="gradient_checkpointing"),
    )
    seed: int = Field(0, description="Seed of the trace subset and of the per-epoch shuffle.")
    progress: bool = Field(True, description="Show a progress bar (with ETA) over steps.")

    @field_validator("max_grad_norm", mode="before")
    @classmethod
    def _zero_is_no_clipping(cls, v: object) -> object:
        """``provrl sft --max-grad-norm 0`` has always meant no clipping."""
        return None if v == 0 else v
