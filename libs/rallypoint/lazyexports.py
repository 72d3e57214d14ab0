"""A package's public names imported on first use (PEP 562), for packages whose parts run alone.

Importing ``pkg.part`` runs ``pkg/__init__.py`` first; when that imports every part, a small process that
needs one part (the rank wrapper, once per rank) pays for all of them. Standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, homes: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: each name of ``homes`` (name -> the
    relative module that defines it) is imported when first read, then kept in ``namespace`` (the
    package's globals) so later reads do not come back here."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
