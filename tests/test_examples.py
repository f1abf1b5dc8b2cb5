"""Every script in examples/ runs end to end on the tiny model, as a user would run it."""

from __future__ import annotations

import json
import shutil
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
    "grpo_trainer.py": lambda tmp, world: [],  # README's example as it is: runs in a temp dir
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


README_BLOCK = ("# --- README: From Python ---\n", "# --- end ---")
"""The markers of README's "From Python" example in examples/grpo_trainer.py."""


def test_the_readme_example_is_the_script():
    script = (EXAMPLES / "grpo_trainer.py").read_text()
    code = script.split(README_BLOCK[0], 1)[1].split(README_BLOCK[1], 1)[0].rstrip()
    readme = (EXAMPLES.parent / "README.md").read_text().split("## From Python", 1)[1]
    assert f"```python\n{code}\n```" in readme


@pytest.mark.parametrize("name", sorted(ARGS))
def test_example_runs(name, tmp_path, small_world):
    # every example runs from a scratch directory holding examples/data (what the README
    # example reads, relative to the repository root), so nothing is written in the tree
    shutil.copytree(EXAMPLES / "data", tmp_path / "examples" / "data")
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *ARGS[name](tmp_path / "out", small_world)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    if name == "grpo_trainer.py":
        run = tmp_path / "runs" / "grpo-demo"
        assert res.stdout.strip().splitlines()[-1] == str(Path("runs/grpo-demo/rl/ckpt-v2"))
        assert json.loads((run / "rl" / "done.json").read_text())["steps"] == 2
        return
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
