"""The run's config, pinned: once a stage has started, ``RUN/config.yaml`` belongs to the run.

* ``RUN/config.yaml`` starts with a header line carrying the sha256 of the YAML below it, and
  the run keeps its own copy, ``RUN/.config.yaml`` (both written atomically, the copy first).
* On every later start in the same directory (``--resume RUN`` or the same command again),
  :func:`pin_config` refuses a ``config.yaml`` whose YAML no longer matches its hash — an
  edit made behind the run's back — naming the keys that changed against the copy, and
  refuses a config that differs from the run's in any key but the execution-only
  :data:`RESUMABLE` knobs (those are taken, and the change is written to ``resume.log``).
* A first attempt that failed before any stage started (a bad task file, say) pins
  nothing: the corrected command simply replaces its ``config.yaml``.
* A ``config.yaml`` without a header and without a copy was written before config hashes;
  it is compared key by key as before.
"""

from __future__ import annotations

import copy
import hashlib
import re
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from provrl._sys import write_atomic
from provrl.appendlog import AppendLog
from provrl.config import ConfigError, dump_config, load_config, old_name
from provrl.pipeline.rundir import RunDir

RESUMABLE = (
    "logging",
    "rl.micro_batch_size",
    "rl.logprob_chunk_tokens",
    "sft.micro_batch_tokens",
    "pipeline.eval.concurrency",
    "pipeline.eval.policies",
)
"""Keys that change how a run executes but not what it computes: a resume may change them.
``pipeline.eval.policies`` names which policies the eval stage evaluates: a resume may ask
for another (the shared stages of ``provrl bench learning`` are built first and their warm
start evaluated later); one already evaluated keeps its result."""
CONFIG = "config.yaml"
COPY = ".config.yaml"
"""The run's own copy of its config, beside ``config.yaml`` (names the keys of an edit)."""
_HEADER = re.compile(r"# provrl run config, sha256 ([0-9a-f]{64})\b[^\n]*\n")
MAX_NAMED = 6
"""Most changed keys one error names (then "and N more")."""


def config_text(cfg: BaseModel) -> str:
    """``config.yaml`` for ``cfg``: a header with the sha256 of the YAML that follows."""
    body = dump_config(cfg)
    return (
        f"# provrl run config, sha256 {_sha256(body)} — the run's own record: a resume refuses an "
        "edit (start a new run directory to change the config)\n" + body
    )


def pin_config(run: RunDir, cfg: BaseModel) -> None:
    """Write ``cfg`` as the run's config, after checking it against the config the run was
    started with (see the module docstring); errors are :class:`ConfigError` naming the
    file and the keys."""
    path = run.root / CONFIG
    if path.is_file() and run.started():
        pinned = check_untouched(path, type(cfg))
        new = yaml.safe_load(dump_config(cfg))
        changed = diffs(_without(pinned, RESUMABLE), _without(new, RESUMABLE))
        if changed:
            raise ConfigError(
                f"{path}: the run was started with a different config "
                f"({named_changes(type(cfg), changed)}); use a new run directory, or the same config "
                "to resume"
            )
        if pinned != new:  # only execution knobs changed: keep the new values, and say so
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            with AppendLog(run.root / "resume.log") as log:
                log.append(f"{stamp} {'; '.join(diffs(pinned, new))}\n".encode())
    text = config_text(cfg).encode()
    write_atomic(run.root / COPY, text)
    write_atomic(path, text)


def check_untouched(path: Path, cls: type[BaseModel]) -> dict[str, Any]:
    """The config a pinned run directory holds, as a tree (read through ``cls``: a field
    added since is at its default, an old key under its new name). Raises
    :class:`ConfigError` naming the changed keys if ``path`` was edited since it was
    written (its YAML no longer matches the sha256 in its header)."""
    text = path.read_text()
    header = _HEADER.match(text)
    own = path.with_name(COPY)
    intact = header is not None and header.group(1) == _sha256(text[header.end() :])
    # no header and no copy: written before config hashes, nothing to check against
    edited = not intact and (header is not None or own.is_file())
    now = _tree(cls, path)
    if not edited:
        return now
    if not own.is_file():
        raise ConfigError(
            f"{path}: edited since the run started (its YAML no longer matches the sha256 in "
            "its first line); put it back, or start a new run directory"
        )
    was = _tree(cls, own)
    changed = diffs(was, now)
    if not changed:  # comments or layout only
        return was
    raise ConfigError(
        f"{path}: edited since the run started ({named_changes(cls, changed)}); the run keeps the "
        f"config it started with ({own.name} beside it): put the file back, or start a new "
        "run directory"
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _tree(cls: type[BaseModel], path: Path) -> dict[str, Any]:
    out: dict[str, Any] = yaml.safe_load(dump_config(load_config(cls, path)))
    return out


def diffs(a: Any, b: Any, path: str = "") -> list[str]:
    """Every leaf where the trees ``a`` and ``b`` differ, as ``key: old → new``, key order."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += diffs(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        return out
    return [] if a == b else [f"{path}: {a!r} → {b!r}"]


def resumable(key: str) -> bool:
    """Whether the dotted ``key`` is one of the execution-only :data:`RESUMABLE` knobs."""
    return any(key == r or key.startswith(r + ".") for r in RESUMABLE)


def named_changes(cls: type[BaseModel], changed: list[str]) -> str:
    """The first :data:`MAX_NAMED` changes of :func:`diffs`, each with the key's old name if
    one of its sections was renamed."""
    out = []
    for d in changed[:MAX_NAMED]:
        was = old_name(cls, d.split(":", 1)[0])
        out.append(d + (f" ({was} before it was renamed)" if was else ""))
    more = len(changed) - MAX_NAMED
    return "; ".join(out) + (f"; and {more} more" if more > 0 else "")


def _without(tree: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    out = copy.deepcopy(tree)
    for key in keys:
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.get(part, {})
        if isinstance(node, dict):
            node.pop(last, None)
    return out
