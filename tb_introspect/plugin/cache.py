"""Per-run cache of read series and rendered overviews.

Entries are keyed by (experiment, run) and tagged with the run's fingerprint:
every tag's last step and wall time as the data provider lists them. New
points change the fingerprint, so a reload shows them; unchanged runs are
served without reading or recomputing anything.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class FingerprintCache:
    """A small thread-safe LRU of values that are valid for one fingerprint."""

    def __init__(
        self,
        max_entries: int = 32,
        max_bytes: int | None = None,
        weigh: Callable[[Any], int] = len,
    ) -> None:
        """At most ``max_entries`` values and, if given, ``max_bytes`` by ``weigh``."""
        self._max = max_entries
        self._max_bytes = max_bytes
        self._weigh = weigh
        self._bytes = 0
        self._entries: collections.OrderedDict[Hashable, tuple[Hashable, Any, int]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()
        self._key_locks: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, fingerprint: Hashable, compute: Callable[[], T]) -> T:
        """The cached value for ``key`` if its fingerprint matches, else ``compute()``.

        Concurrent callers for the same key wait for one computation instead
        of repeating a full read of the run.
        """
        with self._lock:
            if len(self._key_locks) > 4 * self._max + 16:
                # Keys whose computation failed leave their lock behind; drop idle ones.
                self._key_locks = {
                    k: v for k, v in self._key_locks.items() if k in self._entries or v.locked()
                }
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None and hit[0] == fingerprint:
                    self._entries.move_to_end(key)
                    return hit[1]
            value = compute()
            weight = self._weigh(value) if self._max_bytes is not None else 0
            with self._lock:
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old[2]
                self._entries[key] = (fingerprint, value, weight)
                self._bytes += weight
                # The newest entry stays even when it alone exceeds the budget.
                while len(self._entries) > 1 and (
                    len(self._entries) > self._max
                    or (self._max_bytes is not None and self._bytes > self._max_bytes)
                ):
                    gone, (_, _, w) = self._entries.popitem(last=False)
                    self._bytes -= w
                    self._key_locks.pop(gone, None)
            return value

    def peek(self, key: Hashable, fingerprint: Hashable) -> Any | None:
        """The cached value for ``key`` if its fingerprint matches, else None (never computes)."""
        with self._lock:
            hit = self._entries.get(key)
            return hit[1] if hit is not None and hit[0] == fingerprint else None

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0
