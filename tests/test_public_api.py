"""The front door: ``import provrl`` is light, and every name it and the rooms export exists."""

from __future__ import annotations

import importlib
import pydoc
import subprocess
import sys

import pytest

PACKAGES = ["provrl", "provrl.engine", "provrl.env", "provrl.models", "provrl.objectives",
            "provrl.report", "provrl.train"]  # fmt: skip


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_resolves(package):
    mod = importlib.import_module(package)
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert not missing, missing


def test_import_provrl_does_not_import_torch():
    code = "import sys, provrl; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_help_lists_the_public_api():
    import provrl

    assert set(provrl.__all__) <= set(dir(provrl))
    text = pydoc.render_doc(provrl, renderer=pydoc.plaintext)
    for name in ("load_model", "LocalEngine", "Collector", "RLTrainer", "load_config"):
        assert f"class {name}" in text or f"{name}(" in text, name
