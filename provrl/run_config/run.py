"""The whole run's configuration: one typed section per room (presets in ``configs/``),
and the two sections that belong to no room (``model``, ``logging``).

>>> from provrl.config import load_config
>>> cfg = load_config(RunConfig, "quick", ["rl.lr=1e-5"])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, model_validator

from provrl.classic.config import ClassicTRPOConfig
from provrl.config import Section, TorchDevice, peer_names
from provrl.distributed.config import RayConfig
from provrl.engine.config import EngineConfig
from provrl.env.config import EnvConfig
from provrl.run_config.bench import BenchConfig
from provrl.run_config.pipeline import PipelineConfig
from provrl.theory.config import TheoryConfig
from provrl.train.config import RLConfig, SFTConfig


class ModelConfig(Section):
    name: str = Field("smollm2-135m", description="Model name (smollm2-135m, tiny) or HF path.")
    dtype: str = Field("float32", description="Parameter dtype: float32, bfloat16 or float16.")
    device: TorchDevice = Field("cpu", description="torch device: cpu, cuda, cuda:1, …")
    seed: int = Field(0, description="Seed for random initialisation (the tiny model).")


class LoggingConfig(Section):
    run_dir: str = Field(
        "runs/default",
        description="Directory for logs, metrics, plots.",
        **peer_names("run_dir", trl="output_dir", verl="trainer.default_local_dir"),
    )
    tensorboard: bool = Field(True, description="Also write TensorBoard event files.")
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=list,
        description="Trackers that also receive every metric, through their own libraries "
        "(wandb, mlflow: pip install 'provrl[tracking]'; WANDB_MODE / MLFLOW_TRACKING_URI "
        "are honoured).",
        **peer_names("report_to", trl="report_to", verl="trainer.logger"),
    )
    project: str = Field(
        "provrl",
        description="W&B project / MLflow experiment name.",
        **peer_names("project", verl="trainer.project_name"),
    )
    progress: bool = Field(True, description="Show progress bars (rich/tqdm).")


class RunConfig(Section):
    """The whole run: one section per room. Presets live in ``configs/*.yaml``."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="Rollout engine.")
    ray: RayConfig = Field(
        default_factory=RayConfig,
        description="The Ray backend: cluster address, replicas, threads per replica, "
        "hot-load schedule, restarts.",
    )
    env: EnvConfig = Field(default_factory=EnvConfig, description="Search-agent environment.")
    rl: RLConfig = Field(default_factory=RLConfig, description="RL trainer (GRPO/PPO/TRPO).")
    sft: SFTConfig = Field(
        default_factory=SFTConfig, description="SFT trainer (warm start and self-SFT stages)."
    )
    pipeline: PipelineConfig = Field(
        default_factory=PipelineConfig, description="`provrl run`: stages, slices, RL loop."
    )
    theory: TheoryConfig = Field(
        default_factory=TheoryConfig, description="`provrl theory …`: the theory lab."
    )
    classic: ClassicTRPOConfig = Field(
        default_factory=ClassicTRPOConfig,
        description="`provrl trpo --config FILE`: TRPO on gymnasium control (the keys the file "
        "sets apply over the --env preset).",
    )
    bench: BenchConfig = Field(
        default_factory=BenchConfig, description="`provrl bench …`: the benchmarks."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Outputs.")
    seed: int = Field(0, description="Global seed (python, numpy, torch).")

    peers_not_flat: ClassVar[tuple[str, ...]] = ("sft",)
    """TRL's flat names are GRPOConfig's (the RL stage); SFTConfig's are read under ``sft``."""
    peers_refused: ClassVar[dict[str, str]] = {
        "max_completion_length": "an episode has several turns: env.agent.max_new_tokens "
        "bounds one turn, env.agent.max_total_tokens the whole episode",
        "max_prompt_length": "env.agent.max_total_tokens bounds prompt and turns together",
        "save_steps": "every RL step is checkpointed before its weights are hot-loaded",
        "bf16": "set model.dtype=bfloat16 (the trainer) and engine.dtype=bfloat16 (rollouts)",
        "fp16": "set model.dtype=float16 and engine.dtype=float16",
        "per_device_train_batch_size": "rl.micro_batch_size is trajectories per "
        "forward/backward; a step's batch is pipeline.loop.groups_per_step x pipeline.loop.k",
        "gradient_accumulation_steps": "a step's batch is pipeline.loop.groups_per_step x "
        "pipeline.loop.k, accumulated over micro-batches of rl.micro_batch_size",
        "eval_steps": "no held-out eval during RL yet; pipeline.eval runs after the RL stage",
        "importance_sampling_level": "rl.objective.correction chooses the ratio: token_is "
        "per token, gspo per sequence (TRL's 'sequence'), and the other corrections",
        "num_train_epochs": "the RL stage runs max_steps (pipeline.loop.steps) steps and the "
        "curriculum picks each next task, not epochs (sft.num_train_epochs is the SFT stages')",
        "logging_steps": "every RL step is logged (RUN/rl/metrics.jsonl, TensorBoard, "
        "logging.report_to)",
        "trainer.test_freq": "no held-out eval during RL yet; pipeline.eval runs after RL",
        "trainer.save_freq": "every RL step is checkpointed before its weights are hot-loaded",
    }
    """TRL / verl names without a provrl field, and what to use instead."""

    OLD_KEYS: ClassVar[dict[str, str]] = {
        "backend": "engine.backend (backend: ray is engine.backend: ray; backend: local keeps "
        "the in-process engine engine.backend names)"
    }
    """Keys of older configs that are still read, and what they map to (docs/config.md)."""

    @model_validator(mode="before")
    @classmethod
    def _old_backend_key(cls, data: Any) -> Any:
        """``backend`` (the old top-level switch, local | ray) → ``engine.backend``, the one
        switch now: ``ray`` sets ``engine.backend: ray`` (a vLLM engine it named moves to
        ``ray.engine``, what each replica runs); ``local`` keeps the in-process engine."""
        if not isinstance(data, Mapping) or "backend" not in data:
            return data
        data = dict(data)
        old = data.pop("backend")
        if old not in ("local", "ray"):
            raise ValueError(
                f"backend: {old!r} is not 'local' or 'ray' (backend is the old name of "
                "engine.backend: local | vllm | ray)"
            )
        engine, ray = _as_dict(data.get("engine")), _as_dict(data.get("ray"))
        if engine is None or ray is None:
            return data  # not a mapping: the field's own validation says so
        kind = engine.get("backend", "local")
        if old == "ray" and kind != "ray":
            engine["backend"] = "ray"
            if kind != "local":
                ray["engine"] = kind
        elif old == "local" and kind == "ray":
            engine["backend"] = ray.get("engine", "local")
        data["engine"], data["ray"] = engine, ray
        return data

    @property
    def backend(self) -> Literal["local", "ray"]:
        """The old top-level switch, read-only: ``ray`` when ``engine.backend`` is ray, else
        ``local``."""
        return "ray" if self.engine.backend == "ray" else "local"


def _as_dict(section: Any) -> dict[str, Any] | None:
    """A section given as a mapping or a model, as a dict of the keys it sets (None: neither)."""
    if section is None:
        return {}
    if isinstance(section, BaseModel):
        return section.model_dump(exclude_unset=True)
    return dict(section) if isinstance(section, Mapping) else None
