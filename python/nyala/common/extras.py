"""Optional dependencies: the extras of ``pyproject.toml`` and the error that names them.

``pip install nyala`` brings what the client and servers need; pandas and PySpark come with the
extras ``nyala[pandas]`` and ``nyala[spark]``. The code that needs one imports it through
``require``, so a user without it learns which extra to install instead of reading a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from nyala.errors import MissingDependencyError


def require(module: str, *, extra: str, needed_by: str) -> ModuleType:
    """Imports ``module`` and returns it. If it (or something it imports) cannot be imported,
    raises ``MissingDependencyError`` saying that ``needed_by`` needs the distribution (the
    top-level name of ``module``) and which extra brings it, e.g. "Scanner.to_pandas needs
    pandas: pip install 'nyala[pandas]' (No module named 'pandas')"."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        wanted = module.partition(".")[0]
        raise MissingDependencyError(
            f"{needed_by} needs {wanted}: pip install 'nyala[{extra}]' ({exc})",
            name=module,
            extra=extra,
        ) from exc
