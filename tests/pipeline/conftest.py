"""The base run of the crash tests, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from crashrun import RUN, killed


@pytest.fixture(scope="session")
def crash_base(tmp_path_factory) -> Path:
    """A quick run (``crashrun.FAST``) killed right after its filter stage: world, warm
    start, probe and filter done, RL not begun. Copy it (``crashrun.copy_of``) to use it."""
    d = tmp_path_factory.mktemp("crash-base")
    killed(d, "filter.done", resume=False)
    assert (d / RUN / "filter" / "done.json").is_file() and not (d / RUN / "rl").exists()
    return d
