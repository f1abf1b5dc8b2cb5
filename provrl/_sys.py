"""Process and file-system helpers every room may use (the ground floor: the stdlib and psutil,
no provrl import).

* :func:`write_json` and :func:`atomic_tmp_dir` — a file or a directory written under a
  temporary name and renamed, so a ``kill -9`` leaves the old or the new one, never half;
* :func:`file_sha256` — a file's content hash, read in chunks; :func:`cache_dir`, where
  converted models and generated worlds are kept;
* :func:`release_memory` and :func:`rss_mb` — give freed heap back to the OS, and measure
  what this process holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import psutil


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temp file + fsync + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_tmp_dir(final: Path) -> Path:
    """A fresh sibling of ``final`` to write into and then rename to ``final``, so a crash
    never leaves a half-written directory under the final name."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))


def cache_dir() -> Path:
    """``$PROVRL_CACHE`` or ``~/.cache/provrl``: converted models, generated worlds."""
    return Path(os.environ.get("PROVRL_CACHE", Path.home() / ".cache" / "provrl"))


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 24) -> str:
    """The sha256 hex digest of the file's bytes, read ``chunk`` bytes at a time (a model's
    weights are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def release_memory() -> None:
    """Return freed heap to the OS: between stages (each loads its own model, optimizer and
    KV cache) and after every RL step (each frees a state-dict copy and the backward pass's
    activations, of sizes that change with the batch, on threads with their own malloc
    arenas). glibc keeps freed pages otherwise: run d3 grew ≈ 420 MB a step until the OOM
    killer stopped it (docs/pipeline.md). A no-op where libc has no ``malloc_trim``."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_mb() -> float:
    """Resident memory of this process in MiB (a leak across RL steps shows here)."""
    return float(psutil.Process().memory_info().rss) / 2**20
