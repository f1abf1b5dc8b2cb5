"""Checkpoints as safetensors in HF layout (loadable by ``from_pretrained``).

Never unpickle untrusted files: ``.safetensors`` is read with safetensors; a ``.pt`` / ``.bin``
state dict only with ``torch.load(weights_only=True)``.

A checkpoint the RL stage resumes from carries ``checksums.json`` (:data:`MANIFEST`): the
size and CRC-32 of every file in it, written last before the checkpoint is declared
complete (:func:`write_manifest`), so :func:`damaged_files` can tell a truncated or altered
file from a good one before anything is loaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from provrl._sys import atomic_tmp_dir, writing
from provrl.models.chat import tokenizer_identity

METADATA_FILE = "provrl.json"
MANIFEST = "checksums.json"
"""Inside a checkpoint: ``{"files": {name: {"bytes": n, "crc32": c}}}`` of every other file."""


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt; the message names the file."""


def save_checkpoint(
    model: Any,
    tokenizer: Any,
    path: str | os.PathLike[str],
    *,
    state_dict: dict[str, Any] | None = None,
    **metadata: Any,
) -> Path:
    """Write ``model`` (its weights, or ``state_dict`` in their place: a LoRA policy's
    merged weights) (+ tokenizer, + ``provrl.json`` with ``metadata`` and the tokenizer's
    identity) to ``path``, loadable by transformers 4.x and 5.x, with normal permissions.

    Written to a temporary sibling directory first and renamed, so a crash never leaves a
    half-written checkpoint under the final name. A write that fails for want of space or
    permission (safetensors', the tokenizer's or ours) removes the temporary directory and
    raises :class:`~provrl._sys.WriteError` naming the checkpoint."""
    import shutil

    final = Path(path)
    with writing(final):
        tmp = atomic_tmp_dir(final)
    try:
        with writing(final, tmp):
            model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
            portable_config(tmp / "config.json")
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
                portable_tokenizer_config(tmp / "tokenizer_config.json")
                metadata.setdefault("tokenizer", tokenizer_identity(tokenizer))
            meta = json.dumps(metadata, indent=2, sort_keys=True, default=str)
            (tmp / METADATA_FILE).write_text(meta)
            normal_permissions(tmp)
            if final.exists():
                shutil.rmtree(final)
            tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # give the space back
        raise
    return final


LEGACY_TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""What a checkpoint's ``tokenizer_config.json`` declares instead of transformers 5's
``TokenizersBackend``: the class that reads ``tokenizer.json`` in transformers 4.x and 5.x."""


def portable_tokenizer_config(path: Path) -> None:
    """Make ``tokenizer_config.json`` loadable by transformers 4.x as well as 5.x: declare
    :data:`LEGACY_TOKENIZER_CLASS` where 5.x wrote ``TokenizersBackend`` (a class 4.x does not
    have), and inline the chat template (4.x before 4.43 reads it only from here)."""
    if not path.is_file():
        return
    cfg = json.loads(path.read_text())
    if cfg.get("tokenizer_class") in (None, "TokenizersBackend"):
        cfg["tokenizer_class"] = LEGACY_TOKENIZER_CLASS
    template = path.parent / "chat_template.jinja"
    if "chat_template" not in cfg and template.is_file():
        cfg["chat_template"] = template.read_text()
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def portable_config(path: Path) -> None:
    """Add transformers 4.x's names next to 5.x's in ``config.json`` so both read the same
    model: ``rope_theta`` / ``rope_scaling`` from ``rope_parameters`` (4.x ignores the latter
    and would silently fall back to θ = 10000) and ``torch_dtype`` from ``dtype``."""
    if not path.is_file():
        return
    cfg = json.loads(path.read_text())
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling.get("rope_type", "default") != "default":
            cfg.setdefault("rope_scaling", scaling)
    if "dtype" in cfg:
        cfg.setdefault("torch_dtype", cfg["dtype"])
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True))


def normal_permissions(root: Path) -> None:
    """Directories 0777 and files 0666, less the process umask (755 / 644 by default):
    ``mkdtemp`` creates 0700 and safetensors writes 0600, which other users — a serving
    process, a colleague — could not read."""
    umask = os.umask(0)
    os.umask(umask)
    root.chmod(0o777 & ~umask)
    for p in root.rglob("*"):
        p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


@contextlib.contextmanager
def removed_unless_complete(path: Path) -> Iterator[None]:
    """A checkpoint directory filled in place (weights, then optimizer, state, checksums,
    the completion marker): if the block raises — a full disk, say — the directory is
    removed, giving its space back. It had no completion marker, so no resume would have
    used it."""
    import shutil

    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def file_crc32(path: Path, chunk: int = 1 << 24) -> int:
    """CRC-32 of a file's bytes, read ``chunk`` bytes at a time."""
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def write_manifest(ckpt: Path, skip: tuple[str, ...] = ()) -> None:
    """Write :data:`MANIFEST` into ``ckpt``: size and CRC-32 of every file in it (but
    ``skip``, e.g. the completion marker written after it), atomically."""
    from provrl._sys import write_json

    files = {
        str(p.relative_to(ckpt)): {"bytes": p.stat().st_size, "crc32": file_crc32(p)}
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and p.name != MANIFEST and p.name not in skip and ".tmp-" not in p.name
    }
    write_json(ckpt / MANIFEST, {"files": files})


def damaged_files(ckpt: Path) -> dict[str, str] | None:
    """The files of ``ckpt`` that do not match its :data:`MANIFEST` → what is wrong
    (missing, size, checksum; the manifest itself unreadable is ``{MANIFEST: why}``), ``{}``
    when all match; None when the checkpoint has no manifest (written before there were
    any: check it with :func:`check_checkpoint_dir`)."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text())["files"]
        assert isinstance(files, dict)
    except (ValueError, KeyError, TypeError, AssertionError) as e:
        return {MANIFEST: f"unreadable ({type(e).__name__})"}
    bad: dict[str, str] = {}
    for name, want in files.items():
        f = ckpt / name
        if not f.is_file():
            bad[name] = "missing"
        elif (size := f.stat().st_size) != want["bytes"]:
            bad[name] = f"{size} bytes, {want['bytes']} written"
        elif file_crc32(f) != want["crc32"]:
            bad[name] = "checksum differs from the one written"
    return bad


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
