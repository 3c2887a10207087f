"""Log a recurring condition once per key: a bounded set of keys already reported.

A client that sends the same ignorable thing on every request (Codex declares a hosted
``web_search`` tool in each one) should not fill the log with one WARNING per request.
:class:`FirstSeen` answers "is this the first time for this key?" over the most recent
``max_keys`` keys (least recently seen are forgotten first, so memory stays bounded; a
forgotten key is reported again, which is harmless).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["FirstSeen"]


class FirstSeen:
    """A bounded LRU set: :meth:`first` is True the first time a key is seen (or after its eviction)."""

    def __init__(self, max_keys: int = 1024) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be positive")
        self.max_keys = max_keys
        self._keys: OrderedDict[Hashable, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def first(self, key: Hashable) -> bool:
        """Record ``key``; True when it was not already held."""
        with self._lock:
            if key in self._keys:
                self._keys.move_to_end(key)
                return False
            self._keys[key] = None
            if len(self._keys) > self.max_keys:
                self._keys.popitem(last=False)
            return True
