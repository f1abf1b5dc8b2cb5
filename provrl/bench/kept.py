"""Finished pieces of a long benchmark, kept where they outlive the machine.

``provrl bench learning`` takes longer than one session of a 2-core machine (its shared stages,
two evaluations of the warm start, then per RL seed the RL stage and two evaluations), and a
machine may come back fresh: no ``runs/``. Checkpoints (hundreds of MB) cannot be kept in git,
but what the record is made of can: each finished piece (the warm start's evaluations, a
seed's row) as a small JSON file in a folder under ``results/`` that is committed::

    KEEP/warmstart.json         {"identity": …, "value": {…}, "commit": …, "date": …, "machine": …}
    KEEP/world2-warmstart.json
    KEEP/seed-0.json
    KEEP/shared-probe.tar.gz    the probe's and the filter's directories (+ .json: identity)

A rerun on a fresh machine puts the kept probe and filter back (:func:`restore_dirs`: their
stage markers say done, so the run does not probe again, and its freshness check refuses them
if the rebuilt warm start is not the one they probed), rebuilds the world and the warm start,
checks that they are the ones the pieces were measured from
(:func:`shared_identity`: the world and the warm start's weights), reads the
pieces back instead of rerunning them and goes on with what is missing. A piece measured from
another build is refused in one line, never overwritten: the record's paired comparisons are
only valid against one warm start.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from provrl._sys import file_sha256, write_json
from provrl.bench.results import run_record
from provrl.models.loading import policy_fingerprint


def shared_identity(shared: Path) -> dict[str, str]:
    """What the kept pieces of ``shared`` (a run directory) were measured from: the world (its
    cache directory's name: generator seed and config digest) and the warm start's weights
    (sha256 of its safetensors). Two builds agree when the world generator and SFT are
    deterministic on the machine (a fixed seed, data order and thread count on one CPU
    model). The probe's pools are not part of it (:func:`pools_digest`): the probe samples
    from the warm start, and a rebuilt probe may differ by a round-off-flipped token; each
    seed's row records the pools it trained on."""
    world = json.loads((shared / "world" / "done.json").read_text())["world_dir"]
    warm = json.loads((shared / "warmstart" / "done.json").read_text())["checkpoint"]
    return {"world": Path(world).name, "warmstart": policy_fingerprint(str(warm))}


def pools_digest(shared: Path) -> str:
    """sha256 of the filter's task files (kept / unsolved / solved, by name): the tasks an RL
    seed of ``shared`` trains on."""
    h = hashlib.sha256()
    for p in sorted((shared / "filter").glob("*.jsonl")):
        h.update(f"{p.name}:{file_sha256(p)};".encode())
    return "sha256:" + h.hexdigest()


def settings_digest(settings: Mapping[str, Any]) -> str:
    """sha256 of a benchmark's settings (JSON, keys sorted): with it in the identity, a piece
    measured under other flags is refused instead of mixed in."""
    blob = json.dumps(dict(settings), sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


class Kept:
    """The pieces kept in ``folder`` for the shared stages of ``identity`` (``folder`` None:
    nothing is kept, :meth:`get` finds nothing and :meth:`put` writes nothing)."""

    def __init__(self, folder: str | os.PathLike[str] | None, identity: dict[str, str]) -> None:
        self.folder = Path(folder) if folder else None
        self.identity = identity
        self.read: list[str] = []  # the pieces :meth:`get` returned, in order

    def path(self, name: str) -> Path | None:
        return self.folder / f"{name}.json" if self.folder is not None else None

    def get(self, name: str) -> Any | None:
        """The kept value of ``name``, or None. ValueError (one line, naming the file) when
        it was measured from other shared stages than these."""
        path = self.path(name)
        if path is None or not path.is_file():
            return None
        try:
            piece = json.loads(path.read_text())
            kept_identity, value = piece["identity"], piece["value"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a kept piece ({e})") from None
        for key, now in self.identity.items():
            if kept_identity.get(key) != now:
                raise ValueError(
                    f"{path}: measured from another build of the shared stages ({key} "
                    f"{kept_identity.get(key)} here {now}: another CPU kind, or another compute "
                    f"dtype, see the piece's machine.cpu_bf16 and PROVRL_CPU_BF16); move "
                    f"{self.folder} aside to start over"
                )
        self.read.append(name)
        return value

    def put(self, name: str, value: Any) -> None:
        """Keep ``value`` as ``name`` (atomically), with the identity and a results file's
        provenance (:func:`~provrl.bench.results.run_record`)."""
        path = self.path(name)
        if path is None:
            return
        # the provenance every results file carries (commit, date, machine: the CPU kind a
        # rebuild must match), beside the identity and the value
        piece = run_record(f"kept {name}", {"identity": self.identity, "value": value},
                           config={"folder": str(self.folder)}, seeds=[])  # fmt: skip
        write_json(path, piece)

    def put_dirs(self, name: str, root: Path, dirs: Sequence[str]) -> None:
        """Keep the directories ``dirs`` of ``root`` as ``name.tar.gz`` (gzip), with the
        identity, commit and date as the piece ``name`` (its value: the directories)."""
        path = self.path(name)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        final = archive_path(path.parent, name)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        with tarfile.open(tmp, "w:gz", compresslevel=9) as tar:
            for d in dirs:
                tar.add(root / d, arcname=d)
        os.replace(tmp, final)
        self.put(name, {"dirs": list(dirs)})

    def summary(self) -> dict[str, Any]:
        """For the record: the folder, the identity and which pieces were read back."""
        return {
            "folder": str(self.folder) if self.folder is not None else None,
            "identity": self.identity,
            "read": list(self.read),
        }


def archive_path(folder: Path, name: str) -> Path:
    """Where :meth:`Kept.put_dirs` keeps the directories of ``name``."""
    return folder / f"{name}.tar.gz"


def restore_dirs(folder: str | os.PathLike[str] | None, name: str, root: Path) -> list[str]:
    """Put the directories kept as ``folder/name.tar.gz`` (:meth:`Kept.put_dirs`) back into
    ``root``, unless ``root`` already holds one of them (a run that kept its own: nothing is
    overwritten). The directories restored (none without an archive)."""
    if not folder:
        return []
    archive = archive_path(Path(folder), name)
    if not archive.is_file():
        return []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tops = sorted({m.name.split("/", 1)[0] for m in tar.getmembers()})
            if any((root / d).exists() for d in tops):
                return []
            root.mkdir(parents=True, exist_ok=True)
            tar.extractall(root, filter="data")  # no links out of root, no absolute paths
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ValueError(f"{archive}: not a kept archive ({e})") from None
    return tops
