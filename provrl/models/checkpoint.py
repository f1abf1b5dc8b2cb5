"""Checkpoints as safetensors in HF layout (loadable by ``from_pretrained``).

Never unpickle untrusted files: ``.safetensors`` is read with safetensors; a ``.pt`` / ``.bin``
state dict only with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

METADATA_FILE = "provrl.json"


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


def atomic_tmp_dir(final: Path) -> Path:
    """A fresh sibling of ``final`` to write into and then rename to ``final``, so a crash
    never leaves a half-written directory under the final name."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))


def save_checkpoint(
    model: Any, tokenizer: Any, path: str | os.PathLike[str], **metadata: Any
) -> Path:
    """Write ``model`` (+ tokenizer, + ``provrl.json`` with ``metadata``) to ``path``.

    Written to a temporary sibling directory first and renamed, so a crash never leaves a
    half-written checkpoint under the final name."""
    import shutil

    final = Path(path)
    tmp = atomic_tmp_dir(final)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    (tmp / METADATA_FILE).write_text(json.dumps(metadata, indent=2, sort_keys=True, default=str))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    p = Path(path) / METADATA_FILE
    if not p.exists():
        return {}
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{p}: invalid JSON at line {e.lineno}: {e.msg}") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{p}: expected a JSON object")
    return data


def check_checkpoint_dir(path: Path) -> None:
    """Fail early, naming the file, if a model directory is incomplete or corrupt."""
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json — not a model directory")
    weights = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
    if not weights:
        raise CheckpointError(f"{path}: no *.safetensors weights")
    from safetensors import safe_open

    for w in path.glob("*.safetensors"):
        try:
            with safe_open(str(w), framework="pt") as f:
                f.keys()
        except Exception as e:  # safetensors raises its own error types
            raise CheckpointError(f"{w}: corrupt safetensors file ({e})") from e


def load_state_dict(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """A state dict from ``.safetensors`` (preferred) or ``.pt``/``.bin`` (weights only)."""
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such file")
    if p.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(p))
        except Exception as e:
            raise CheckpointError(f"{p}: corrupt safetensors file ({e})") from e
    try:
        sd = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{p}: cannot load as a weights-only state dict ({e})") from e
    if not isinstance(sd, dict):
        raise CheckpointError(f"{p}: expected a state dict, got {type(sd).__name__}")
    return sd
