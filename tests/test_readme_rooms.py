"""README's rooms table matches the tree: every module and package of provrl/ is in a room,
and every path a room names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def room_paths() -> list[Path]:
    text = (ROOT / "README.md").read_text()
    table = text.split("## The rooms", 1)[1].split("\n## ", 1)[0]
    paths = []
    for line in table.splitlines():
        if not line.startswith("| `"):
            continue
        for token in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            p = ROOT / token if (ROOT / token).exists() else ROOT / "provrl" / token
            paths.append(p)
    return paths


def test_every_named_path_exists():
    missing = [str(p.relative_to(ROOT)) for p in room_paths() if not p.exists()]
    assert not missing, missing


def test_every_module_and_package_is_in_a_room():
    named = room_paths()
    entries = [
        p for p in (ROOT / "provrl").iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()
    ]
    lost = [p.name for p in entries if not any(p == n or n in p.parents for n in named)]
    assert not lost, f"not in README's rooms table: {lost}"
