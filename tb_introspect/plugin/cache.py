"""The plugin's one cache: read series, rendered documents and tag listings.

Entries are keyed by (experiment, run) and tagged with a fingerprint, for
data the run's: every tag's last step and wall time as the data provider
lists them. New points change the fingerprint, so a reload shows them;
unchanged runs are served without reading or recomputing anything. Tag
listings, which the fingerprint is made from, instead expire after a few
seconds (``ttl_s``).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class FingerprintCache:
    """A small thread-safe LRU of values that are valid for one fingerprint (and ``ttl_s``)."""

    def __init__(
        self,
        max_entries: int = 32,
        max_bytes: int | None = None,
        weigh: Callable[[Any], int] = len,
        ttl_s: float | None = None,
        ttl_per_cost: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """At most ``max_entries`` values and, if given, ``max_bytes`` by ``weigh``.

        ``ttl_s``: values also expire this many seconds after they were stored,
        or ``ttl_per_cost`` times as long as they took to compute when that is
        longer (a value that costs seconds is not recomputed every second).
        ``clock``: seconds, for the stored times and the costs; an attribute, so that a
        test can step a fake one past ``ttl_s`` instead of waiting.
        """
        self._max = max_entries
        self._max_bytes = max_bytes
        self._weigh = weigh
        self.ttl_s = ttl_s
        self.ttl_per_cost = ttl_per_cost
        self.clock = clock
        self._bytes = 0
        # key -> (fingerprint, value, weight, time stored, seconds valid or None)
        self._entries: collections.OrderedDict[
            Hashable, tuple[Hashable, Any, int, float, float | None]
        ] = collections.OrderedDict()
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
                if self._valid(hit, fingerprint):
                    self._entries.move_to_end(key)
                    return hit[1]
            started = self.clock()
            value = compute()
            self.put(key, fingerprint, value, cost_s=self.clock() - started)
            return value

    def put(self, key: Hashable, fingerprint: Hashable, value: Any, cost_s: float = 0.0) -> None:
        """Stores ``value`` for ``key`` (e.g. a listing of one run found in a listing of all).

        ``cost_s``: what computing it took (see ``ttl_per_cost``).
        """
        weight = self._weigh(value) if self._max_bytes is not None else 0
        ttl = None if self.ttl_s is None else max(self.ttl_s, self.ttl_per_cost * cost_s)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[2]
            self._entries[key] = (fingerprint, value, weight, self.clock(), ttl)
            self._bytes += weight
            # The newest entry stays even when it alone exceeds the budget.
            while len(self._entries) > 1 and (
                len(self._entries) > self._max
                or (self._max_bytes is not None and self._bytes > self._max_bytes)
            ):
                gone, (_, _, w, _, _) = self._entries.popitem(last=False)
                self._bytes -= w
                self._key_locks.pop(gone, None)

    def peek(self, key: Hashable, fingerprint: Hashable) -> Any | None:
        """The cached value for ``key`` if it is valid, else None (never computes)."""
        with self._lock:
            hit = self._entries.get(key)
            return hit[1] if self._valid(hit, fingerprint) else None

    def _valid(self, hit: tuple | None, fingerprint: Hashable) -> bool:
        return hit is not None and hit[0] == fingerprint and (
            hit[4] is None or self.clock() - hit[3] < hit[4]
        )
