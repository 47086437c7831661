"""The run data model's former place: it is ``tb_introspect.read``'s (``read/series.py``).
The old names work for a release and warn once (``aliases``)."""

from __future__ import annotations

from typing import Any

from tb_introspect import aliases, read

_MOVED = ("Aligned", "RunSeries", "Series", "TagInfo", "align", "probes_of")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return aliases.renamed(f"{__name__}.{name}", f"tb_introspect.read.{name}",
                               getattr(read, name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
