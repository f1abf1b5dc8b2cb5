"""Every script in examples/ runs end to end on the tiny model, as a user would run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

ARGS = {
    "custom_loop.py": lambda tmp, world: [
        "--world", str(world), "--steps", "1", "--groups", "1", "--k", "2", "--out", str(tmp),
    ],
    "custom_reward.py": lambda tmp, world: ["--k", "2", "--out", str(tmp)],
    "own_tasks.py": lambda tmp, world: ["--out", str(tmp)],
}  # fmt: skip
"""The fast arguments of each example (a new example must be added here)."""


def test_every_example_is_run_here():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(ARGS)


def _last_json(stdout: str) -> dict:
    """The last JSON object the script printed (one line, or an indented block)."""
    lines = stdout.strip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            for j in range(len(lines), i, -1):
                try:
                    return json.loads("\n".join(lines[i:j]))
                except json.JSONDecodeError:
                    continue
    raise AssertionError(f"no JSON in the output:\n{stdout}")


@pytest.mark.parametrize("name", sorted(ARGS))
def test_example_runs(name, tmp_path, small_world):
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *ARGS[name](tmp_path / "out", small_world)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = _last_json(res.stdout)
    if name == "custom_loop.py":
        assert out["step"] == 0 and out["version"] == 1 and out["action_tokens"] > 0
        log = tmp_path / "out" / "trajectories.jsonl"
        assert len(log.read_text().splitlines()) == 2  # 1 group × k = 2, provenance log
    elif name == "custom_reward.py":
        assert out["samples"] == 4 and out["new_version"] == 1
        assert out["mean_my_reward"] <= 1.0
    else:
        assert out["n"] == 3 and out["k"] == 2 and 0.0 <= out["accuracy"] <= 1.0
