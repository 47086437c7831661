"""Public names kept for one release after a rename: each warns once, then works."""

from __future__ import annotations

import warnings
from typing import Any

_said: set[str] = set()


def renamed(old: str, new: str, value: Any) -> Any:
    """``value``, under its ``old`` name: a ``FutureWarning`` the first time it is used."""
    if old not in _said:
        _said.add(old)
        warnings.warn(f"{old} is renamed {new}; the old name goes in the next release",
                      FutureWarning, stacklevel=3)
    return value
