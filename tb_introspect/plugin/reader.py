"""The read side's former place: ``read_run``, ``read_logdir`` and the data model are
``tb_introspect.read``'s. The old names work for a release and warn once (``aliases``)."""

from __future__ import annotations

from typing import Any

from tb_introspect import aliases, read

_MOVED = ("RunSeries", "Series", "TagInfo", "read_logdir", "read_run")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return aliases.renamed(f"{__name__}.{name}", f"tb_introspect.read.{name}",
                               getattr(read, name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
