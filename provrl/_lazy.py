"""Lazy re-exports for package ``__init__`` files: names load on first access.

``import provrl`` (and with it ``provrl --help``) must not import torch; the public names of
a package are nevertheless importable from it and listed by ``dir()`` and ``help()``::

    __getattr__, __dir__ = lazy_exports(__name__, {"load_model": "provrl.models", ...})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Module ``__getattr__`` and ``__dir__`` for ``package`` that import ``name`` from
    ``names[name]`` (a module path) when it is first asked for, and cache it."""
    module = importlib.import_module(package)

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(names))

    return __getattr__, __dir__
