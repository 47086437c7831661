"""Typed keys of what an instrumentation failure switches off."""

from __future__ import annotations

from typing import NamedTuple


class Part(NamedTuple):
    """One tensor of one view, or (``name`` None) the whole view."""

    view: str
    name: str | None = None

    def __str__(self) -> str:
        return f"{self.view} {self.name}" if self.name is not None else f"{self.view} view"
