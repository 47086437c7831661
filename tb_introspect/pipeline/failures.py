"""What an instrumentation failure switches off, and the one warning it gives.

The project's rule: an instrumentation failure never ends the user's training. The part
that failed (one tensor of one view, a whole view, or one of the host's parts: metrics,
statistics, writing) is switched off for the rest of training with one warning line, and
everything else goes on. Every framework front-end reports its failures here.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from tb_introspect import slots

#: The host's parts: what a failure between training steps switches off.
METRICS, STATISTICS, WRITING = "metrics", "statistics", "writing"


class Part(NamedTuple):
    """One tensor of one view, or (``name`` None) the whole view or host part."""

    view: str
    name: str | None = None

    def __str__(self) -> str:
        if self.name is not None:
            return f"{self.view} {self.name}"
        return f"{self.view} view" if self.view in slots.VIEWS else self.view


def warn(message: str) -> None:
    """One user-visible warning line (a ``RuntimeWarning``, prefixed ``tb_introspect:``)."""
    warnings.warn(f"tb_introspect: {message}", RuntimeWarning, stacklevel=3)


class Failures:
    """The parts switched off so far and the warnings already given."""

    def __init__(self) -> None:
        self.off: set[Part] = set()
        self._warned: set[str] = set()

    def is_off(self, view: str, name: str | None = None) -> bool:
        """Whether ``view`` (or its tensor ``name``) is off."""
        return Part(view) in self.off or (name is not None and Part(view, name) in self.off)

    def switch_off(self, part: Part) -> None:
        """Stop ``part`` quietly (the caller has said why)."""
        self.off.add(part)

    def warn_once(self, key: str, message: str) -> None:
        """``warn(message)`` the first time ``key`` is seen (traces and steps repeat)."""
        if key not in self._warned:
            self._warned.add(key)
            warn(message)

    def fail(self, parts: Part | Iterable[Part], error: BaseException) -> None:
        """Switch ``parts`` off. One warning for the first of the tensors of one view that
        fail the same way: a model's 50 layers failing alike are one cause."""
        parts = [parts] if isinstance(parts, Part) else list(parts)
        self.off.update(parts)
        what = ", ".join(str(p) for p in parts)
        kind = parts[0].view if parts else "instrumentation"
        detail = f"{type(error).__name__}: {short_error(error)}"
        self.warn_once(f"{kind} {detail}",
                       f"{what}: instrumentation failed ({detail}); it is off for the rest of"
                       f" training, as is any other {kind} failing the same way; training"
                       " goes on")

    def guard(self, part: str, fn: Callable[..., Any], *args: Any,
              on_write_error: Callable[[BaseException], bool] | None = None) -> Any:
        """Run ``fn(*args)``; on an error switch host ``part`` off with one warning and
        return None (training goes on). ``on_write_error(e)`` first: True when the error
        was the event file's, which stops all writing with its own warning."""
        if Part(part) in self.off:
            return None
        try:
            return fn(*args)
        except Exception as e:
            if on_write_error is not None and on_write_error(e):
                return None
            self.off.add(Part(part))
            warn(f"{part} failed ({type(e).__name__}: {short_error(e)}); {part} is off for"
                 " the rest of training, training goes on")
            return None


def short_error(error: BaseException) -> str:
    """One line of an error: TensorFlow's graph-execution tracebacks left out."""
    text = getattr(error, "message", None) or str(error)
    lines = [ln.strip() for ln in str(text).splitlines()]
    lines = [re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", ln) for ln in lines
             if ln and not ln.startswith(("File \"", "Detected at node", "Graph execution error",
                                          "[[{{node", "[Op:"))]
    short = " ".join(lines[:2]) or type(error).__name__
    return short if len(short) <= 300 else short[:297] + "..."
