"""Process and file-system helpers every room may use (the ground floor: the stdlib and psutil,
no provrl import).

* :func:`write_json` and :func:`atomic_tmp_dir` — a file or a directory written under a
  temporary name and renamed, so a ``kill -9`` leaves the old or the new one, never half;
* :func:`writing` — the one place a failed write becomes an expected error: disk full, a
  read-only file system or no permission, whether the write was Python's, safetensors',
  torch's or the tokenizer's, is :class:`WriteError`, one line naming the path;
* :func:`file_sha256` — a file's content hash, read in chunks; :func:`cache_dir`, where
  converted models and generated worlds are kept;
* :func:`release_memory` and :func:`rss_mb` — give freed heap back to the OS, and measure
  what this process holds; :func:`pin_mmap_threshold` — fix glibc's mmap threshold so a
  measured peak does not depend on the allocator's history.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import hashlib
import json
import math
import numbers
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

RESOURCE_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO}
)
"""What a write can fail with that is the machine's state, not a bug: no space, over quota,
file too large, a read-only file system, no permission, an I/O error."""
_BY_STRERROR = {os.strerror(c): c for c in RESOURCE_ERRNOS}
_OS_ERROR = re.compile(r"os error (\d+)|\[Errno (\d+)\]")
"""An errno in a message: Rust's ``(os error 28)`` (safetensors, tokenizers — whose errors
are plain ``Exception``) or Python's ``[Errno 28]`` re-raised as another type."""
_TORCH_WRITER = ("inline_container.cc", "PytorchStreamWriter", "file write failed")


class WriteError(OSError):
    """A write failed for want of a resource (space, quota, permission, a writable file
    system): one line naming the file, e.g.
    ``RUN/rl/ckpt-v2: cannot write: No space left on device (ENOSPC)``."""

    def __str__(self) -> str:
        code = errno.errorcode.get(self.errno or 0, "?")
        return f"{self.filename}: cannot write: {self.strerror} ({code})"


def resource_errno(e: BaseException, path: str | os.PathLike[str]) -> int | None:
    """The errno of :data:`RESOURCE_ERRNOS` behind a failed write to ``path``, or None if
    ``e`` is not such a failure. Python's ``OSError`` carries it; any other exception whose
    message names it (:data:`_OS_ERROR`: safetensors', the tokenizer's ``Exception: No space
    left on device (os error 28)``) is read from the message; torch's zip writer often says
    only "unexpected pos", so then the file system ``path`` is on is asked (read-only?
    writable? space left?)."""
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno if e.errno in RESOURCE_ERRNOS else None
    msg = str(e)
    if m := _OS_ERROR.search(msg):
        code = int(m.group(1) or m.group(2))
        return code if code in RESOURCE_ERRNOS else None
    if isinstance(e, RuntimeError) and any(s in msg for s in _TORCH_WRITER):
        for text, code in _BY_STRERROR.items():
            if text in msg:
                return code
        return _diagnose(Path(path))
    return None


def _diagnose(path: Path) -> int:
    """Why a write under ``path`` could have failed, asked of its file system."""
    d = path
    while not d.exists() and d != d.parent:
        d = d.parent
    d = d if d.is_dir() else d.parent
    with contextlib.suppress(OSError):
        st = os.statvfs(d)
        if st.f_flag & os.ST_RDONLY:
            return errno.EROFS
        if not os.access(d, os.W_OK):
            return errno.EACCES
        if st.f_bavail * st.f_frsize < 1 << 20:
            return errno.ENOSPC
    return errno.EIO


@contextlib.contextmanager
def writing(
    path: str | os.PathLike[str], staging: str | os.PathLike[str] | None = None
) -> Iterator[None]:
    """Writes to ``path`` (a file, or a directory being filled) inside this block that fail
    for want of a resource (:func:`resource_errno`) raise :class:`WriteError` naming the file
    — Python's own ``filename`` if it has one, else ``path``; ``staging``: the temporary name
    ``path`` is written under, named as ``path``. Other errors pass unchanged. Blocks may
    nest: the innermost, most precise name wins."""
    try:
        yield
    except WriteError:
        raise
    except Exception as e:
        code = resource_errno(e, staging or path)
        if code is None:
            raise
        name = str(getattr(e, "filename", None) or os.fspath(path))
        if staging is not None and name.startswith(os.fspath(staging)):
            name = os.fspath(path) + name[len(os.fspath(staging)) :]
        raise WriteError(code, os.strerror(code), name) from e


def finite_json(obj: Any) -> Any:
    """``obj`` with every non-finite float (NaN, ±inf, numpy's too) as ``None``, in dicts,
    lists and tuples at any depth: what strict JSON (RFC 8259) can hold. A statistic that
    does not exist — tool calls per solved task when nothing was solved — is ``null``, not
    ``NaN``, which ``JSON.parse``, ``jq`` and most parsers outside Python refuse."""
    if isinstance(obj, numbers.Integral) and not isinstance(obj, bool):
        return int(obj)  # numpy's integers too
    if isinstance(obj, numbers.Real) and not isinstance(obj, numbers.Integral):
        return float(obj) if math.isfinite(obj) else None  # numpy's floats are Reals too
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_json(v) for v in obj]
    return obj


def strict_dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` of :func:`finite_json` (``obj``) with ``allow_nan=False``: strict JSON."""
    return json.dumps(finite_json(obj), allow_nan=False, **kw)


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as strict JSON (:func:`strict_dumps`: NaN and ±inf as ``null``) to
    ``path`` atomically (temp file + fsync + rename); a failed write removes the temporary
    file and raises :class:`WriteError` naming ``path``."""
    write_atomic(path, strict_dumps(obj, indent=2, default=str).encode())


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename): a ``kill -9``
    leaves the old or the new file; a failed write, the old one and :class:`WriteError`."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with writing(path, tmp):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


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


MMAP_THRESHOLD = 128 * 1024
"""glibc's initial ``M_MMAP_THRESHOLD`` (bytes): blocks this large or larger are mmapped and
unmapped on free."""


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` at ``nbytes`` (``mallopt``), which also turns off its
    dynamic raise: by default, freeing an mmapped block raises the threshold to that block's
    size (up to 32 MiB), so later blocks of that size come from the heap and stay there,
    fragmented. Whether that happens during a measured step depends on the order in which
    earlier tensors were freed, so the same step's peak RSS varied from run to run (enough to
    break tests/bench/test_trainer_bench.py's 10 % memory bound in CI); pinned, it repeats.
    The trainer benchmark pins it in each side's process so the peak is a property of the
    step. True when set; False where libc has no ``mallopt``."""
    with contextlib.suppress(OSError, AttributeError):
        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, int(nbytes)))  # M_MMAP_THRESHOLD
    return False


def rss_mb() -> float:
    """Resident memory of this process in MiB (a leak across RL steps shows here)."""
    return float(psutil.Process().memory_info().rss) / 2**20


# ------------------------------------------------------------------ what ran it
CODE_PATHS = ("provrl", "benchmarks", "configs", "pyproject.toml")
"""What a measurement depends on: ``dirty`` means one of these differs from the commit
(edited docs do not make a measurement dirty)."""


def git_state(cwd: str | os.PathLike[str] | None = None) -> tuple[str, bool]:
    """(HEAD's commit, whether tracked files under :data:`CODE_PATHS` differ from it);
    ("unknown", False) outside a git checkout."""
    where = Path(cwd) if cwd else Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where,
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                 *CODE_PATHS], cwd=top, capture_output=True, text=True,
                                check=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False
    return head, bool(status.strip())


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    """What ran it: CPUs (count and model), memory, the 1-minute load average, platform,
    Python, and — when torch is loaded — its version, threads, whether the CPU has AMX tiles,
    whether bf16 is its fast dtype (what ``auto`` dtypes resolve by,
    :mod:`provrl.models.precision`) and CUDA devices."""
    out: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "load_average_1m": os.getloadavg()[0],
        "platform": platform.platform(),
        "python": platform.python_version(),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
        out["torch_threads"] = torch.get_num_threads()
        # AMX tiles make bf16 matmuls the fast path on a CPU; without them ``auto`` dtypes
        # follow a measured verdict (provrl.models.precision.cpu_bf16_verdict)
        amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
        out["cpu_amx"] = bool(amx()) if amx is not None else None
        precision = sys.modules.get("provrl.models.precision")  # loaded where a dtype resolved
        if precision is not None:
            out["cpu_bf16"] = precision.cpu_bf16_verdict()
        if torch.cuda.is_available():
            out["gpus"] = [
                f"{torch.cuda.get_device_name(i)} "
                f"({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
                for i in range(torch.cuda.device_count())
            ]
    return out


def session_record(command: list[str] | None = None) -> dict[str, Any]:
    """Who is running now: commit (and ``dirty``), date, machine and command line."""
    commit, dirty = git_state()
    return {
        "commit": commit,
        "dirty": dirty,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "command": list(command if command is not None else sys.argv),
    }
