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

    def __init__(self, max_entries: int = 32) -> None:
        self._max = max_entries
        self._entries: collections.OrderedDict[Hashable, tuple[Hashable, Any]] = (
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
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                hit = self._entries.get(key)
                if hit is not None and hit[0] == fingerprint:
                    self._entries.move_to_end(key)
                    return hit[1]
            value = compute()
            with self._lock:
                self._entries[key] = (fingerprint, value)
                self._entries.move_to_end(key)
                while len(self._entries) > self._max:
                    old, _ = self._entries.popitem(last=False)
                    self._key_locks.pop(old, None)
            return value

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
