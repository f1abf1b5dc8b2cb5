"""``provrl.SFTTrainer``: TRL's SFT front door onto :func:`provrl.train.sft.run_sft`.

::

    from provrl import SFTConfig, SFTTrainer

    SFTTrainer("smollm2-135m", args=SFTConfig(output_dir="runs/sft", learning_rate=1e-4,
               num_train_epochs=2), train_dataset="chat.jsonl").train()
    # → runs/sft/ckpt: a checkpoint GRPOTrainer(model="runs/sft/ckpt", …) starts from

The dataset is chat JSONL (``{"messages": [...]}`` per line: the assistant turns are the
targets), provrl trajectory logs (a run's ``trajectories.jsonl`` or its directory: the
action tokens are the targets), a list of rows (``messages``, or TRL's ``prompt`` and
``completion``), or a ``datasets.Dataset`` of such rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import Field, ValidationError

from provrl.config import ConfigError, _format_errors
from provrl.train.config import SFTConfig as SFTSection
from provrl.trainers.data import model_name

SFTData = str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | Iterable[Mapping[str, Any]]
"""What ``SFTTrainer``'s ``train_dataset`` may be."""


class SFTConfig(SFTSection):
    """TRL's ``SFTConfig``: provrl's SFT section (``sft`` in the run config; TRL's names
    ``learning_rate``, ``num_train_epochs``, ``lr_scheduler_type``, ``warmup_steps`` are read
    as its fields) and where to write. Unknown names are one line."""

    output_dir: str = Field("runs/sft", description="Where the run writes: OUTPUT/ckpt, logs.")
    dtype: str = Field("float32", description="Parameter dtype the model is loaded in.")

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(_format_errors(e, "SFTConfig").replace("\n", "; ")) from None


class SFTTrainer:
    """Supervised fine-tuning on conversations or trajectories, TRL's way::

        SFTTrainer(model, args=SFTConfig(...), train_dataset=...).train()

    ``model`` as :class:`~provrl.trainers.grpo.GRPOTrainer` takes it; the checkpoint is
    written to ``OUTPUT/ckpt``."""

    def __init__(
        self,
        model: Any,
        args: SFTConfig | None = None,
        train_dataset: SFTData | None = None,
        processing_class: Any = None,
    ) -> None:
        self.args = args or SFTConfig()
        if train_dataset is None:
            raise ConfigError("SFTTrainer: train_dataset is required (chat rows or files)")
        out = Path(self.args.output_dir)
        self.model_name = model_name(model, processing_class, out / "initial")
        self.logs, self.chats = _sft_files(train_dataset, out / "data" / "train.jsonl")
        self.summary: dict[str, Any] | None = None

    def train(self) -> dict[str, Any]:
        """Train and save ``OUTPUT/ckpt``; returns the summary (``sft.json``)."""
        from provrl.train.sft import run_sft

        out = Path(self.args.output_dir)
        section = SFTSection(**self.args.model_dump(exclude={"output_dir", "dtype"}))
        self.summary = run_sft(
            self.logs,
            self.model_name,
            out / "ckpt",
            section,
            run_dir=out,
            dtype=self.args.dtype,
            data=self.chats,
        )
        return self.summary


def _sft_files(data: SFTData, out: Path) -> tuple[list[Path], list[Path]]:
    """(trajectory logs, chat JSONL files) of ``data``; rows are written to ``out`` as chat."""
    from provrl.pipeline.run import warmstart_files

    if isinstance(data, str | os.PathLike):
        data = [data]
    rows = list(data)
    if rows and all(isinstance(r, str | os.PathLike) for r in rows):
        return warmstart_files(tuple(os.fspath(r) for r in rows))  # type: ignore[arg-type]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise ConfigError(f"train_dataset row {i}: {type(row).__name__}, not a row")
            f.write(orjson.dumps({"messages": _messages(row, i)}) + b"\n")
    return [], [out]


def _messages(row: Mapping[str, Any], i: int) -> Any:
    """A row's conversation: ``messages``, or TRL's ``prompt`` + ``completion`` (strings:
    a user and an assistant turn; lists: messages)."""
    if "messages" in row:
        return row["messages"]
    if "prompt" in row and "completion" in row:
        p, c = row["prompt"], row["completion"]
        p = [{"role": "user", "content": p}] if isinstance(p, str) else list(p)
        c = [{"role": "assistant", "content": c}] if isinstance(c, str) else list(c)
        return [*p, *c]
    raise ConfigError(f"train_dataset row {i}: expected 'messages', or 'prompt' and 'completion'")
