"""Typed configuration of the local rollout engine (one replica)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from provrl.config import Section, TorchDevice


class EngineConfig(Section):
    """Settings of one :class:`provrl.engine.LocalEngine` replica.

    The KV cache is slotted: ``max_seqs`` slots of ``max_context`` positions each, allocated
    once (zero pages, committed by the OS only when written, so unused capacity costs no
    resident memory on CPU)."""

    max_seqs: int = Field(
        64,
        ge=1,
        description="KV slots = most requests holding a KV cache at once (generating or "
        "waiting between turns); more requests queue, idle caches are evicted LRU.",
    )
    max_context: int = Field(
        2048,
        ge=2,
        description="Longest context per request (prompt + all turns), in tokens; a request "
        "that would not fit is rejected, a turn that reaches it ends with finish_reason "
        "'context'.",
    )
    prefill_chunk: int = Field(
        512,
        ge=1,
        description="Most prompt/tool tokens prefilled per scheduler step, batched together "
        "with the decode rows of running requests (chunked prefill).",
    )
    prefix_cache: bool = Field(
        True,
        description="Copy the KV of the longest shared prefix from a resident request "
        "instead of recomputing it (GRPO groups and agent prompts share long prefixes).",
    )
    prefix_cache_min_tokens: int = Field(
        8, ge=1, description="Shortest shared prefix worth copying from another slot."
    )
    device: TorchDevice = Field(
        "cpu", description="torch device of the engine's weights and KV cache."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the engine's weights and KV cache (logits are fp32)."
    )
    seed: int = Field(
        0, description="Seeds the sampler of requests whose SamplingParams.seed is None."
    )
    eos_stops: bool = Field(
        True,
        description="Add the tokenizer's EOS and <|im_end|> ids to every request's stop ids "
        "(False only for benchmarks that must generate a fixed number of tokens).",
    )
    audit_fraction: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Fraction of finished turns with stale KV (sampled after a keep-mode "
        "hot-load) whose logprobs are recomputed from scratch: the KV-staleness audit.",
    )
    audit_max_tokens: int = Field(
        64, ge=1, description="Most tokens of one turn compared by the KV-staleness audit."
    )
    compile: bool = Field(
        False,
        description="torch.compile the MLP block of every layer (dynamic shapes). Off by "
        "default: on this CPU the ~35 s warm-up bought no speed (docs/engine.md).",
    )
    threads: int = Field(
        0,
        ge=0,
        description="torch intra-op threads of the engine's scheduler thread, which runs every "
        "forward (0 = torch's default). Per thread: the caller's threads keep their own count, "
        "so an engine and a trainer in one process can each take one core of two.",
    )
