"""Typed configuration of one rollout-engine replica (local or vLLM backend)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from provrl.config import Section, TorchDevice

VLLM_IGNORES = {
    "device": "vLLM places its weights and KV cache itself (its build picks the device)",
    "prefix_cache_min_tokens": "vLLM's prefix cache shares whole KV blocks, with no minimum",
    "kv_release": "vLLM pages its own KV cache in blocks",
    "kv_huge_pages": "vLLM allocates its own KV cache",
}
"""EngineConfig fields the vLLM backend cannot honour: set to anything but their default
with ``backend: vllm`` they are refused, not silently ignored."""


class VLLMOptions(Section):
    """Settings only the vLLM backend reads (``engine.backend: vllm``, docs/engine.md §10)."""

    kv_cache_gb: int = Field(
        2,
        ge=1,
        description="CPU build: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE). Ignored on GPU.",
    )
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="GPU build: fraction of GPU memory vLLM may take (weights + KV cache); "
        "the rest is left to the trainer. Ignored on CPU.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "WARNING", description="vLLM's own log level (VLLM_LOGGING_LEVEL)."
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other vllm AsyncEngineArgs fields, passed through as given (e.g. "
        "tensor_parallel_size); provrl's own settings (logprobs_mode, max_model_len, …) "
        "cannot be overridden here.",
    )


class EngineConfig(Section):
    """Settings of one rollout-engine replica: a :class:`provrl.engine.LocalEngine`
    (``backend: local``) or a :class:`provrl.engine.vllm_backend.VLLMEngine`
    (``backend: vllm``), built by :func:`provrl.engine.make_engine`; with ``backend: ray``
    each Ray replica runs one of those (``ray.engine``) with these settings.

    The local KV cache is slotted: ``max_seqs`` slots of ``max_context`` positions each,
    allocated once (zero pages, committed by the OS only when written, so unused capacity
    costs no resident memory on CPU)."""

    backend: Literal["local", "vllm", "ray"] = Field(
        "local",
        description="Rollout backend, the one switch: 'local' (provrl's PyTorch engine in this "
        "process, exact kept mass and KV versions), 'vllm' (needs `pip install provrl[vllm]`; "
        "what it records exactly: docs/engine.md §10) or 'ray' (ray.replicas engine replicas "
        "as Ray actors, each running ray.engine, and the trainer as an actor; `pip install "
        "'provrl[ray]'`, docs/distributed.md). The old top-level key `backend: ray` means "
        "engine.backend: ray.",
    )
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
        8,
        ge=1,
        description="Shortest shared prefix worth copying from another slot (local backend; "
        "refused with backend vllm).",
    )
    kv_release: bool = Field(
        True,
        description="Give the OS back the KV pages of a slot that is freed or holds a shorter "
        "context after a swap (madvise; local backend on a Linux CPU, else nothing): resident "
        "memory follows the live contexts instead of each slot's longest one "
        "(provrl/engine/pages.py).",
    )
    kv_huge_pages: bool = Field(
        False,
        description="Ask the kernel to back the KV cache with 2 MiB transparent huge pages, as "
        "NumPy does for large arrays; false: 4 KiB pages, so a slot's first write commits and "
        "zeroes only what it writes (local backend on a Linux CPU; provrl/engine/pages.py).",
    )
    device: TorchDevice = Field(
        "cpu",
        description="torch device of the engine's weights and KV cache (local backend; "
        "refused with backend vllm, whose build picks the device).",
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32",
        description="dtype of the engine's weights and KV cache (logits are fp32); auto: "
        "bfloat16 where it is the device's fast dtype (a GPU; a CPU with AMX, or with "
        "AVX512-BF16 measured fast once per CPU model), else float32 (provrl/models/precision.py).",
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
        "default: on this CPU the ~35 s warm-up bought no speed (docs/engine.md). vllm: "
        "False runs eager (enforce_eager, no torch.compile: faster start), True lets vLLM "
        "compile (and capture CUDA graphs on GPU).",
    )
    threads: int = Field(
        0,
        ge=0,
        description="torch intra-op threads of the engine's scheduler thread, which runs every "
        "forward (0 = torch's default). Per thread: the caller's threads keep their own count, "
        "so an engine and a trainer in one process can each take one core of two. vllm on "
        "CPU: OpenMP threads of its engine process (0 = vLLM's own binding).",
    )
    vllm: VLLMOptions = Field(
        default_factory=VLLMOptions, description="Settings of the vLLM backend only."
    )

    @field_validator(*VLLM_IGNORES)
    @classmethod
    def _vllm_reads_it(cls, value: Any, info: ValidationInfo) -> Any:
        """A field the vLLM backend ignores, given with ``backend: vllm``, is refused."""
        default = cls.model_fields[str(info.field_name)].default
        if info.data.get("backend") == "vllm" and value != default:
            raise ValueError(
                f"the vLLM backend ignores it: {VLLM_IGNORES[str(info.field_name)]}; "
                f"leave it at {default!r} or use backend: local"
            )
        return value


def for_stage(
    base: EngineConfig, concurrency: int, *, seed: int | None = None, threads: int | None = None
) -> EngineConfig:
    """The engine settings of one stage: ``base`` (the run's ``engine`` section) with a KV
    slot for each of the stage's ``concurrency`` agent loops in flight (``max_seqs`` ≥
    concurrency) and, where given, the stage's sampler ``seed`` and scheduler ``threads``.
    Everything else (context length, dtype, device, prefix cache, …) is ``base``'s, so every
    command serves a policy with the same engine (:func:`provrl.pipeline.engines.
    stage_engine_config` applies it to a run config)."""
    update: dict[str, Any] = {"max_seqs": max(base.max_seqs, concurrency)}
    if seed is not None:
        update["seed"] = seed
    if threads is not None:
        update["threads"] = threads
    return base.model_copy(update=update)
